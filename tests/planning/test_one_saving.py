"""carbonflow's one saving figure: the same number in the plan's reason, the MLflow metric, the demo table and
the Carbon page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from carbonflow.accounting.run import to_run_result
from carbonflow.accounting.saving import format_saving, saving_fraction
from carbonflow.carbon.windows import mean_intensity_gco2_per_kwh
from carbonflow.demo import saving_cell
from carbonflow.domain import DeviceEnergy
from carbonflow.execution.wrapper import WrappedRun
from carbonflow.planning import plan_job
from carbonflow.tracking import schema
from carbonflow.web.app import _runs_table
from carbonflow.web.data import RunRow
from tests.planning.planning_factories import NOW, make_forecast, make_profile, make_spec


def test_saving_fraction_by_hand():
    assert saving_fraction(80.0, 100.0) == pytest.approx(0.2)
    assert saving_fraction(120.0, 100.0) == pytest.approx(-0.2)
    assert saving_fraction(1.0, None) is None
    assert format_saving(0.1234) == "12.3 %" and format_saving(-0.04) == "−4.0 %" and format_saving(None) == "–"


def test_one_runs_saving_is_the_same_number_in_reason_mlflow_demo_table_and_carbon_page():
    forecast = make_forecast([300.0] * 4 + [100.0] * 8 + [300.0] * 36)
    plan = plan_job(make_spec(hours=12, max_slowdown=0.3, objective="zeus:0.5"), make_profile(), forecast, NOW)
    # the run realises exactly what was predicted, on the forecast's intensity
    run = WrappedRun(
        job=plan.job, config_key=plan.config.key(), started_at=plan.start,
        ended_at=plan.start + timedelta(seconds=plan.predicted_duration_s), duration_s=plan.predicted_duration_s,
        exit_code=0,
        devices=[DeviceEnergy(device_id="gpu0", device_model="V100", kind="gpu", energy_j=plan.predicted_energy_j,
                              label="simulated")],
    )  # fmt: skip
    run_now = mean_intensity_gco2_per_kwh(
        forecast.points, NOW, NOW + timedelta(seconds=plan.baseline.predicted_duration_s)
    )
    ratio = plan.baseline.predicted_energy_j / plan.predicted_energy_j
    result = to_run_result(
        run, plan, list(forecast.points), baseline_energy_ratio=ratio, baseline_intensity_gco2_per_kwh=run_now
    )
    shown = format_saving(result.saving_fraction)
    assert shown != "–"
    # the plan's reason names the objective and shows the same figure
    assert f"saving {shown} carbon" in plan.reason and "objective zeus:0.5" in plan.reason
    # MLflow logs result.saving_fraction under saving_fraction; the demo table and the Carbon page read that metric
    assert schema.M_SAVING_FRACTION == "saving_fraction"
    metric = result.saving_fraction
    assert shown in saving_cell(result.saving_g, metric, plan.objective) and "objective zeus:0.5" in saving_cell(
        result.saving_g, metric, plan.objective
    )
    row = RunRow(
        run_id="r1", experiment_id="1", job=plan.job, started_at=datetime(2024, 3, 1, tzinfo=UTC), status="FINISHED",
        config_key=plan.config.key(), power_limit_w="", containers="1", planned_start="", region="GB",
        forecast_provider="test", duration_s=result.duration_s, energy_total_j=result.energy_total_j,
        emissions_g=result.emissions_g, intensity_gco2_per_kwh=None, test_accuracy=None, saving_g=result.saving_g,
        saving_fraction=metric, energy_labels="simulated", replay=False,
    )  # fmt: skip
    assert f"<td>{shown}</td>" in _runs_table([row])
