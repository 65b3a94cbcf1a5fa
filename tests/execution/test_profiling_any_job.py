"""Profiling measures any job, and says what is wrong with one it cannot measure (issue 13 findings).

Before: a script that reports no progress ran in full once per container count before "measured nothing"
(which never pointed at its log); a script with fast steps was "measured" over 0.012 s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from carbonflow.domain import JobSpec
from carbonflow.execution.local import LocalBackend
from carbonflow.profiling.profiler import ProfilingError, profile_job

FAST_STEPS = (
    "import json, os, time\n"
    "from carbonflow import training\n"
    "step = 0\n"
    "while not training.should_stop():\n"
    "    step += 1\n"
    "    time.sleep(0.001)\n"
    "    training.report(step, 8 * step)\n"
)
SILENT = "import time, sys\ntime.sleep(float(sys.argv[1]))\nprint('trained without telling anyone')\n"


class CountingBackend(LocalBackend):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.runs = 0

    def execute(self, spec, plan, options=None, **fields):  # type: ignore[no-untyped-def]
        self.runs += 1
        return super().execute(spec, plan, options, **fields)


def _job(tmp_path: Path, code: str, *args: str, **kw) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text(code)
    return JobSpec(name="own-job", command=[sys.executable, str(script), *args], steps=100000, region="GB",
                   device_kind="cpu", **kw)  # fmt: skip


def test_silent_job_fails_after_one_profiling_attempt_with_its_log_path(tmp_path):
    spec = _job(tmp_path, SILENT, "0.5", max_containers=3)
    backend = CountingBackend(tmp_path / "runs")
    with pytest.raises(ProfilingError) as info:
        profile_job(spec, backend, [])
    assert backend.runs == 1  # not once per container count
    message = str(info.value)
    assert "reported no progress" in message and "carbonflow.training.report(step, samples)" in message
    log_path = Path(message.rsplit("The training's log: ", 1)[1])
    assert log_path.is_file() and "trained without telling anyone" in log_path.read_text()


def test_profiling_stops_a_training_that_never_reports(tmp_path):
    spec = _job(tmp_path, SILENT, "120", profile_report_timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(ProfilingError, match="measured nothing"):
        profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    assert time.monotonic() - t0 < 60  # not the script's 120 s


def test_fast_steps_are_measured_over_a_minimum_wall_time(tmp_path):
    spec = _job(tmp_path, FAST_STEPS, profile_steps=5, profile_warmup_steps=1, profile_min_window_s=0.5)
    profile = profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    (point,) = profile.points
    assert point.duration_s >= 0.5  # was 5 steps × 1 ms
    assert point.samples > 5 * 8


def test_a_training_that_fails_before_reporting_is_told_as_a_failure_with_its_log_tail(tmp_path):
    spec = _job(tmp_path, "import sys\nprint('loading /mnt/data')\nsys.exit('data not found: /mnt/data')\n")
    with pytest.raises(ProfilingError) as info:
        profile_job(spec, CountingBackend(tmp_path / "runs"), [])
    message = str(info.value)
    assert "failed (exit code 1) before reporting any progress" in message
    assert "data not found: /mnt/data" in message and "training.log" in message


SHORT = """
import sys, time
from carbonflow import training
for step in range(1, 13):  # fewer steps than the profile asks for (warm-up 5 + 30)
    time.sleep(0.02)
    training.report(step, step * 8)
"""


def test_a_job_shorter_than_the_profile_budget_is_still_measured_from_its_own_reports(tmp_path):
    """Finding (own-job trial): a short, fast CPU job "measured nothing" because its whole run fitted between
    two polls of the wrapper. The window now starts at the training's own first report after warm-up."""
    spec = _job(tmp_path, SHORT)
    profile = profile_job(spec, CountingBackend(tmp_path / "runs"), [])
    [point] = profile.points
    assert point.samples > 0 and point.duration_s > 0
    assert 8 / 0.02 * 0.3 < point.throughput_samples_per_s < 8 / 0.02 * 1.1  # ~400 samples/s, the script's pace
    # Second user trial: the "kept, shorter than asked" note was only in the run's result.json. The profile says it.
    from carbonflow.execution.wrapper import SHORT_WINDOW

    assert any(note.startswith(SHORT_WINDOW) for note in profile.notes), profile.notes
