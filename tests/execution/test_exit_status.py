"""A training's exit reaches the caller as a shell would show it, and never as "no GPU"."""

from __future__ import annotations

import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.backend import RunOptions
from carbonflow.execution.errors import GPU_UNAVAILABLE_EXIT, shell_exit_status
from carbonflow.execution.local import LocalBackend

pytestmark = pytest.mark.timeout(120)


def _job(tmp_path: Path, code: str) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text(code)
    return JobSpec(name="exits", command=[sys.executable, str(script)], steps=1, batch_size=1, region="GB",
                   simulated_gpu={"gpu_model": "V100", "dataset": "cifar100", "network": "shufflenetv2"})  # fmt: skip


def _plan(job: JobSpec) -> Plan:
    return Plan(job=job.name, config=Config(containers=1, power_limit_w=None), start=datetime.now(UTC),
                predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=0, region="GB",
                forecast_provider="test", reason="test")  # fmt: skip


def _wrapper_status(backend: LocalBackend, job: JobSpec) -> tuple[int, object]:
    handle = backend.start(job, _plan(job), RunOptions(run_name="exit"))
    deadline = time.monotonic() + 90
    while backend.poll(handle).state == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    return backend._processes[handle.run_id].returncode, backend.collect(handle)


def test_shell_exit_status_maps_a_signal_to_128_plus_its_number():
    assert shell_exit_status(-signal.SIGKILL) == 137
    assert shell_exit_status(-signal.SIGTERM) == 143
    assert shell_exit_status(0) == 0 and shell_exit_status(3) == 3


def test_a_sigkilled_training_makes_the_wrapper_exit_137_not_247(tmp_path):
    job = _job(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    status, run = _wrapper_status(LocalBackend(tmp_path / "runs"), job)
    assert run.exit_code == -signal.SIGKILL
    assert status == 137


def test_a_training_exiting_69_is_a_failed_run_not_a_gpu_that_could_not_be_leased(tmp_path):
    """69 is the wrapper's own "no GPU, retry later" status; a script's exit 69 used to be taken for it (the run
    would have waited for a GPU it had)."""
    job = _job(tmp_path, f"import sys\nsys.exit({GPU_UNAVAILABLE_EXIT})\n")
    status, run = _wrapper_status(LocalBackend(tmp_path / "runs"), job)
    assert status == GPU_UNAVAILABLE_EXIT
    assert run.exit_code == GPU_UNAVAILABLE_EXIT
