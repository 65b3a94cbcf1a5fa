"""The wrapper's energy budget (``RunOptions.stop_above_energy_j``): once a run's measured energy passes it, the
training is asked to stop (``carbonflow.training.should_stop()``) and, when it does not, stopped after a grace
period; the note and ``WrappedRun.stopped_at_energy_budget_j`` say so. Real wrapper processes on the simulated GPU
through the local backend; bad budgets are refused naming the field."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, Plan, SimulatedGpuSpec, utcnow
from carbonflow.execution.backend import RunOptions
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.wrapper import ENERGY_BUDGET_STOP, run_wrapped

STEPS, BATCH = 20_000, 8  # ~100 s of host time each: far past the budget, which stops them within a few seconds
BUDGET_J = 150.0
COOPERATIVE = """
import time
from carbonflow import training
for step in range(1, 20_001):
    if training.should_stop():
        raise SystemExit(0)
    time.sleep(0.005)
    training.report(step, 8 * step)
"""
PLAIN = """
import json, os, time
path = os.environ["CARBONFLOW_PROGRESS_FILE"]  # no carbonflow.training: it never reads should_stop()
for step in range(1, 20_001):
    time.sleep(0.005)
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": step, "samples": 8 * step, "t_s": time.monotonic()}) + "\\n")
"""


def _job(tmp_path: Path, name: str, code: str) -> JobSpec:
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    return JobSpec(name=name, command=[sys.executable, str(script)], steps=STEPS, batch_size=BATCH, region="GB",
                   simulated_gpu=SimulatedGpuSpec())  # fmt: skip


def _plan(spec: JobSpec) -> Plan:
    return Plan(
        job=spec.name, config=Config(containers=1, power_limit_w=250), start=utcnow(), predicted_duration_s=0,
        predicted_energy_j=0, predicted_emissions_g=0, region=spec.region, forecast_provider="none", reason="test",
    )  # fmt: skip


ENDINGS = [("cooperative", COOPERATIVE, "and stopped"), ("plain", PLAIN, "did not stop within 1 s and was stopped")]


@pytest.mark.parametrize(("name", "code", "how"), ENDINGS)
def test_the_energy_budget_stops_a_training_that_reads_should_stop_and_one_that_ignores_it(
    tmp_path: Path, name: str, code: str, how: str
) -> None:
    spec = _job(tmp_path, name, code)
    options = RunOptions(trace=False, stop_above_energy_j=BUDGET_J, stop_grace_s=1.0)
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), options)
    energy_j = sum(d.energy_j for d in run.devices)
    # without the budget the training would run its 20 000 steps: the budget ended it, soon after it passed
    assert run.stopped_at_energy_budget_j == BUDGET_J
    assert 0 < run.steps < STEPS / 4, run.notes
    assert BUDGET_J < energy_j < 3 * BUDGET_J
    assert run.exit_code == 0  # a planned end, however the training ended
    [note] = [n for n in run.notes if n.startswith(ENERGY_BUDGET_STOP)]
    assert f"more than stop_above_energy_j={BUDGET_J:g} J" in note and note.endswith(how), note


def test_a_run_within_its_budget_is_not_stopped(tmp_path: Path) -> None:
    spec = _job(tmp_path, "short", COOPERATIVE.replace("20_001", "41"))
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), RunOptions(trace=False, stop_above_energy_j=1e6))
    assert run.exit_code == 0 and run.steps == 40
    assert run.stopped_at_energy_budget_j is None
    assert not any(n.startswith(ENERGY_BUDGET_STOP) for n in run.notes)


@pytest.mark.parametrize("value", [-1.0, 0.0, math.nan, math.inf])
def test_a_bad_energy_budget_is_refused_naming_the_field(tmp_path: Path, value: float) -> None:
    with pytest.raises(ValidationError, match=r"stop_above_energy_j=.* is not allowed; give a finite number > 0"):
        RunOptions(stop_above_energy_j=value)
    with pytest.raises(ValidationError, match=r"stop_grace_s=.* is not allowed; give a finite number > 0"):
        RunOptions(stop_above_energy_j=10, stop_grace_s=value)
    spec = _job(tmp_path, "refused", COOPERATIVE)
    with pytest.raises(ValueError, match=r"stop_above_energy_j=.* is not allowed"):  # the wrapper's own entry too
        run_wrapped(spec, _plan(spec), [sys.executable, "-c", "pass"], stop_above_energy_j=value)
