"""The local backend on the backend contract: start → a JSON handle, poll, collect, cancel (issue 12 shape)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

import pytest

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.backend import Backend, RunHandle, RunOptions, wait
from carbonflow.execution.errors import ExecutionError, RunFailed
from carbonflow.execution.local import LocalBackend

REPORTS = (
    "import json, os, sys, time, pathlib\n"
    "pathlib.Path(sys.argv[2]).touch()\n"
    "for step in range(1, int(sys.argv[1]) + 1):\n"
    "    time.sleep(0.05)\n"
    "    with open(os.environ['CARBONFLOW_PROGRESS_FILE'], 'a') as f:\n"
    "        f.write(json.dumps({'step': step, 'samples': 8 * step}) + '\\n')\n"
)


def _job(tmp_path, steps: int) -> tuple[JobSpec, Plan]:
    script = tmp_path / "train.py"
    script.write_text(REPORTS)
    command = [sys.executable, str(script), str(steps), str(tmp_path / "started")]
    spec = JobSpec(name="contract", command=command, steps=steps, region="GB", device_kind="cpu")
    plan = Plan(job="contract", config=Config(), start=datetime.now(UTC), predicted_duration_s=1,
                predicted_energy_j=1, predicted_emissions_g=1, region="GB", forecast_provider="t",
                reason="t")  # fmt: skip
    return spec, plan


def test_local_backend_satisfies_the_contract_and_its_handle_travels(tmp_path):
    backend = LocalBackend(tmp_path / "runs")
    assert isinstance(backend, Backend) and not backend.supports_deferral and backend.supports_shared
    spec, plan = _job(tmp_path, 20)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    assert backend.poll(handle).state == "running"
    # another process on this host rebuilds the handle from JSON (XCom) and waits on it
    again = RunHandle.model_validate_json(handle.model_dump_json())
    other = LocalBackend(tmp_path / "runs")
    assert wait(other, again, timeout_s=120).state == "finished"
    run = other.collect(again)
    assert run.exit_code == 0 and run.steps == 20


def test_cancel_stops_the_run_and_collect_says_so(tmp_path):
    backend = LocalBackend(tmp_path / "runs")
    spec, plan = _job(tmp_path, 100000)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    backend.cancel(handle)
    assert backend.poll(handle).state == "finished"
    run = backend.collect(handle)  # the wrapper wrote its result on the way out (SIGTERM: limits restored)
    assert run.exit_code != 0 and any("SIGTERM" in n for n in run.notes)


def test_a_run_without_a_result_raises_from_the_one_error_family(tmp_path):
    backend = LocalBackend(tmp_path / "runs")
    spec, plan = _job(tmp_path, 1)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    wait(backend, handle, timeout_s=60)
    (tmp_path / "runs" / "train" / "result.json").unlink()
    with pytest.raises(RunFailed, match="wrote no result") as info:
        backend.collect(handle)
    assert isinstance(info.value, ExecutionError)
