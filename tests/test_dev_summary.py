"""Issue 25 findings on the ``dags test`` summary: it cut the "why" with "…", and showed two different "saving"
figures (17.8 % and 23.4 %) with no explanation. The reason is shown whole, wrapped; the run's measured saving is
the one saving figure (the same in the summary, the task log, MLflow and the Carbon page) and the plan's figure
is named as its prediction."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console

from carbonflow.accounting.saving import format_saving
from carbonflow.dag_test import SAVING_CAPTION, predicted_saving_named, print_runs
from carbonflow.tracking import schema as s
from carbonflow.tracking.logger import saving_line

REASON = (
    "2 containers × 175 W, start 02:30 UTC: saving 23.4 % carbon vs start now at 250 W (objective carbon); 12 % "
    "slower, finishes 03:41 before 06:00 (the forecast's lowest window; recent actuals agree; the profile is 3 days "
    "old, within profile_max_age_s; wide-batch configurations were left out by min_accuracy)"
)
MEASURED = 0.178


def _run() -> dict:
    metrics = {s.M_ENERGY_TOTAL_J: 1234.5, s.M_PREDICTED_ENERGY_TOTAL_J: 1100.0, s.M_EMISSIONS_G: 0.0645,
               s.M_SAVING_FRACTION: MEASURED, s.M_SAVING_G: 0.014, s.M_TEST_ACCURACY: 0.944}  # fmt: skip
    params = {s.P_CONTAINERS: "2", s.P_POWER_LIMIT_W: "175", s.P_PLANNED_START: "2023-03-15T02:30:00+00:00",
              s.P_PLAN_REASON: REASON}  # fmt: skip
    tags = {s.T_ENERGY_LABELS: "simulated", s.T_OBSERVE_ONLY: "false"}
    return {"run_id": "r-1", "job": "night-job", "params": params, "metrics": metrics, "tags": tags}


def _summary() -> str:
    console = Console(record=True, width=100)
    print_runs(console, [_run()], replayed=True)
    return console.export_text()


def test_dags_test_summary_shows_the_why_whole_and_wrapped_not_cut_with_an_ellipsis() -> None:
    text = _summary()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 100
    start = text.index("night-job: planned — ")
    shown = " ".join(text[start:].split())
    assert predicted_saving_named(REASON) in shown  # every word of the reason, in order


def test_dags_test_summary_has_one_saving_figure_and_names_the_plans_as_predicted() -> None:
    text = " ".join(_summary().split())
    assert "predicted saving 23.4 % carbon vs start now at 250 W" in text
    assert " saving 23.4 %" not in text.replace("predicted saving 23.4 %", "")  # the plan's figure only named so
    assert format_saving(MEASURED).removesuffix(" %") in text  # the table's saving (%) is the measured one
    assert " ".join(SAVING_CAPTION.split()) in text


def test_the_one_saving_figure_is_the_same_in_the_task_log_mlflow_and_the_carbon_page() -> None:
    from carbonflow.web.app import _runs_table
    from carbonflow.web.data import RunRow

    line = saving_line("night-job", MEASURED)
    assert f"measured saving {format_saving(MEASURED)} carbon vs start now" in line and "saving_fraction" in line
    row = RunRow(run_id="a" * 32, experiment_id="1", job="night-job", started_at=datetime(2023, 3, 15, tzinfo=UTC),
                 status="FINISHED", config_key="c2-pl175", power_limit_w="175", containers="2", planned_start="",
                 region="GB", forecast_provider="replay", duration_s=1, energy_total_j=1, emissions_g=0.0645,
                 intensity_gco2_per_kwh=150, test_accuracy=0.9, saving_g=0.014, saving_fraction=MEASURED,
                 energy_labels="simulated", replay=True)  # fmt: skip
    assert f"<td>{format_saving(MEASURED)}</td>" in _runs_table([row])


def test_predicted_saving_named_leaves_other_words_alone() -> None:
    assert predicted_saving_named("saving −4.0 % energy vs x") == "predicted saving −4.0 % energy vs x"
    assert predicted_saving_named("predicted saving 1.0 %") == "predicted saving 1.0 %"
    assert predicted_saving_named("no saving window") == "no saving window"
