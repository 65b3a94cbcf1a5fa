"""Issue 25 finding: the Carbon page showed "5.2e-17 g". Its energy and emissions go through carbonflow.units."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from carbonflow.domain import Config, Plan
from carbonflow.web.app import render_page
from carbonflow.web.data import PageData, RunRow, UpcomingJob

START = datetime(2023, 3, 15, 2, tzinfo=UTC)


def _row(emissions_g: float, saving_g: float) -> RunRow:
    return RunRow(run_id="a" * 32, experiment_id="1", job="tiny", started_at=START, status="FINISHED",
                  config_key="c1-pl250", power_limit_w="250", containers="1", planned_start="", region="GB",
                  forecast_provider="replay:neso", duration_s=3.0, energy_total_j=0.5, emissions_g=emissions_g,
                  intensity_gco2_per_kwh=150, test_accuracy=0.9, saving_g=saving_g, saving_fraction=0.0,
                  energy_labels="estimated", replay=True)  # fmt: skip


def _plan(emissions_g: float) -> Plan:
    return Plan(job="tiny", config=Config(containers=1, power_limit_w=250), start=START, predicted_duration_s=3,
                predicted_energy_j=0.5, predicted_emissions_g=emissions_g, region="GB", forecast_provider="static",
                reason="test")  # fmt: skip


def test_carbon_page_shows_no_5_2e_17_g_units_go_through_units_py() -> None:
    page = PageData(forecast=None, upcoming=[UpcomingJob(plan=_plan(2.08e-5))],
                    runs=[_row(emissions_g=2.08e-5, saving_g=5.2e-17)], tracking_uri="sqlite:///x")  # fmt: skip
    html = render_page(page)
    cells = re.findall(r"<td>([^<]*)</td>", html)
    assert not [c for c in cells if re.search(r"\de[-+]?\d", c)], cells
    assert "0.0208 mg" in cells  # the run's emissions and the plan's predicted emissions, in mg
    assert "0 g" in cells  # the saving: floating-point noise reads 0
    assert "gCO2e</th>" not in html  # the unit is in the cell, chosen per value


def test_pareto_plot_axes_use_units_py_not_a_fixed_kj_and_g(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The run's Pareto PNG (MLflow artifact) labelled a CPU job's 0.5 J as 0.0005 kJ and 0.02 mg as 2e-05 g."""
    from matplotlib.figure import Figure

    from carbonflow.domain import PlanAlternative
    from carbonflow.tracking.plots import pareto_plot

    labels: list[str] = []
    original = Figure.savefig

    def capture(fig: Figure, *args: object, **kwargs: object) -> None:
        labels.extend(ax.get_ylabel() for ax in fig.axes)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    alternatives = [PlanAlternative(config=Config(containers=c, power_limit_w=250), start=START, predicted_duration_s=3,
                                    predicted_energy_j=0.5 * c, predicted_emissions_g=2.08e-5 * c, cost=c)
                    for c in (1, 2)]  # fmt: skip
    plan = _plan(2.08e-5).model_copy(update={"alternatives": alternatives})
    pareto_plot(tmp_path / "p.png", plan=plan)
    assert "predicted energy (J)" in labels and "predicted emissions (mg CO2e)" in labels, labels


def test_observe_only_reason_writes_emissions_through_units_py() -> None:
    """An observe-only run's reason (the summary's and the Carbon page's "why") wrote 2.08e-05 g CO2e."""
    from carbonflow.domain import JobSpec, PlanAlternative
    from carbonflow.session.run import observed
    from carbonflow.session.state import GroupMember

    baseline = PlanAlternative(config=Config(containers=1), start=START, predicted_duration_s=3,
                               predicted_energy_j=0.6, predicted_emissions_g=2.5e-5, cost=1)  # fmt: skip
    plan = _plan(2.08e-5).model_copy(update={"baseline": baseline})
    job = JobSpec(name="tiny", workload="digits_cnn", epochs=1, region="GB", observe_only=True)
    reason = observed(GroupMember(job=job, plan=plan), START).plan.reason
    assert "0.0208 mg CO2e predicted, against 0.025 mg for starting now" in reason, reason
    assert not re.search(r"\de-\d", reason), reason
