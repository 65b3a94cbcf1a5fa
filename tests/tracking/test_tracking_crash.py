"""Issue 25 findings: a script that crashed mid-training gave a raw Python dict of logging details and no exception
text; its failed MLflow run had no error tag, yet still logged a "saving". A real crashing script runs through the
local backend and the `carbonflow run` wrapper; its outcome is logged to a real (embedded) MLflow store."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow.accounting.run import to_run_result
from carbonflow.domain import Config, JobSpec, Plan, PlanAlternative
from carbonflow.execution.local import LocalBackend
from carbonflow.session.crash import crash_report, exit_status_text, last_output_lines
from carbonflow.session.run import JobOutcome
from carbonflow.tracking import schema
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.store import client_for

CRASHING = r"""
import json, os, sys, time
with open(os.environ["CARBONFLOW_PROGRESS_FILE"], "a") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "samples": step * 32, "t_s": time.monotonic()}) + "\n")
print("epoch 1/3 loss 0.9", flush=True)
def load_batch(i):
    return 10 / (i - i)
load_batch(3)
"""


@pytest.fixture
def crashed(tmp_path: Path):  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(CRASHING)
    job = JobSpec(name="crashy", command=[sys.executable, str(script)], steps=10, batch_size=32, region="GB",
                  device_kind="cpu")  # fmt: skip
    now = datetime.now(UTC)
    baseline = PlanAlternative(config=Config(containers=1), start=now, predicted_duration_s=1, predicted_energy_j=2,
                               predicted_emissions_g=1, cost=1)  # fmt: skip
    plan = Plan(job=job.name, config=Config(containers=1), start=now, predicted_duration_s=1, predicted_energy_j=1,
                predicted_emissions_g=0.5, region="GB", forecast_provider="test", reason="test",
                baseline=baseline)  # fmt: skip
    wrapped = LocalBackend(tmp_path / "work").execute(job, plan, run_name="train")
    result = to_run_result(wrapped, plan, [], fallback_gco2_per_kwh=200, baseline_energy_ratio=2.0,
                           baseline_intensity_gco2_per_kwh=200)  # fmt: skip
    assert result.exit_code == 1 and result.saving_fraction is not None  # accounted as any run is
    return job, plan, result


def test_a_crashed_training_shows_its_exception_and_exit_status_not_a_dict(home: Path, crashed) -> None:  # type: ignore[no-untyped-def]
    job, plan, result = crashed
    tracking = log_training_run(job, plan, result, error=crash_report(job.name, result)).model_dump(mode="json")
    failure = JobOutcome(plan=plan, result=result, tracking=tracking).failure
    assert failure is not None
    assert failure.startswith("training of crashy failed with exit status 1; its last output lines:")
    assert "ZeroDivisionError: division by zero" in failure and "load_batch(3)" in failure
    assert "{" not in failure and "idempotency_key" not in failure and "tracking_uri" not in failure
    assert f"MLflow run {tracking['run_id']}" in failure


def test_a_crashed_trainings_mlflow_run_has_the_error_tag_and_no_saving(home: Path, crashed) -> None:  # type: ignore[no-untyped-def]
    job, plan, result = crashed
    outcome = log_training_run(job, plan, result, error=crash_report(job.name, result))
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    error = run.data.tags[schema.T_ERROR]
    assert "exit status 1" in error and "ZeroDivisionError: division by zero" in error
    assert run.data.tags[schema.T_NOTE].startswith("FAILED: training of crashy failed with exit status 1")
    for saving in (schema.M_SAVING_G, schema.M_SAVING_FRACTION, schema.M_EMISSIONS_RUN_NOW_DEFAULT_G):
        assert saving not in run.data.metrics
    assert run.data.metrics[schema.M_EMISSIONS_G] == pytest.approx(result.emissions_g)  # what it did cost, kept


def test_a_succeeded_training_has_no_error_tag_and_keeps_its_saving(home: Path) -> None:
    import tracking_factories as f

    outcome = log_training_run(f.job_spec(), f.plan(), f.result())
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    assert schema.T_ERROR not in run.data.tags
    assert run.data.metrics[schema.M_SAVING_FRACTION] == pytest.approx(f.result().saving_fraction)


def test_a_failed_run_without_a_log_still_gets_an_error_tag_with_its_exit_status(home: Path) -> None:
    import tracking_factories as f

    outcome = log_training_run(f.job_spec(), f.plan(), f.result(exit_code=137))
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    assert run.data.tags[schema.T_ERROR] == "training exited with code 137"
    assert schema.M_SAVING_G not in run.data.metrics


def test_exit_status_names_a_signal_and_the_tail_leaves_out_the_wrappers_lines(tmp_path: Path) -> None:
    assert exit_status_text(1) == "exit status 1"
    assert exit_status_text(137) == "exit status 137 (killed by SIGKILL)"
    assert exit_status_text(-9) == "exit status -9 (killed by SIGKILL)"
    log = tmp_path / "training.log"
    log.write_text("carbonflow run: python train.py (in /x)\n" + "".join(f"line {i}\n" for i in range(30)) +
                   "\ncarbonflow run: power limits restored\n")  # fmt: skip
    assert last_output_lines(log) == [f"line {i}" for i in range(20, 30)]


def test_the_task_log_gets_the_runs_one_saving_figure_and_a_crashed_run_none(home: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 25: one saving figure, the same in the summary, the task log, MLflow and the Carbon page."""
    import logging

    import tracking_factories as f

    from carbonflow.accounting.saving import format_saving

    with caplog.at_level(logging.INFO, logger="carbonflow.tracking.logger"):
        outcome = log_training_run(f.job_spec(), f.plan(), f.result())
        log_training_run(f.job_spec(), f.plan(), f.result(exit_code=1))
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    shown = format_saving(run.data.metrics[schema.M_SAVING_FRACTION])
    lines = [r.getMessage() for r in caplog.records if "saving" in r.getMessage()]
    assert lines == [f"digits: measured saving {shown} carbon vs start now at the default configuration (this run's "
                     "emissions against the predicted emissions of that baseline; MLflow saving_fraction)"]  # fmt: skip
