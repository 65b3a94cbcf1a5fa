"""Issue #21, trust boundary, on the local backend and the co-located pair runner: a run's result comes from its
wrapper, signed with a per-run key the training never sees; what the training prints or writes is ignored, and a
dead wrapper is a failed run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.backend import RunHandle, RunOptions, wait
from carbonflow.execution.errors import RunFailed
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.pair_wrapper import SharedMember, SharedRequest
from carbonflow.execution.signing import NOT_SIGNED, RESULT_KEY_ENV, new_result_key, sign_result, verified_payload
from carbonflow.workloads.catalog import DIGITS_CNN

CNN = DIGITS_CNN["simulated_gpu"]

pytestmark = pytest.mark.timeout(120)

# Reports a few steps, then forges: prints a result line, writes result.json where the wrapper writes its own
# (the run folder, the parent of its output folder), and says whether it could see the key. Then it idles
# (argv[2] == "stay") or ends.
FORGER = (
    "import json, os, sys, time, pathlib\n"
    "progress = os.environ['CARBONFLOW_PROGRESS_FILE']\n"
    "for step in range(1, 4):\n"
    "    with open(progress, 'a') as f:\n"
    "        f.write(json.dumps({'step': step, 'samples': 8 * step, 'metrics': {'test_accuracy': 0.5}}) + '\\n')\n"
    "forged = pathlib.Path(sys.argv[1]).read_text()\n"
    "print('CARBONFLOW_RESULT ' + forged, flush=True)\n"
    "run_dir = pathlib.Path(os.environ['CARBONFLOW_OUTPUT_DIR']).parent\n"
    "try:\n"
    "    (run_dir / 'result.json').write_text(forged)\n"
    "    wrote = 'yes'\n"
    "except OSError as err:\n"
    "    wrote = type(err).__name__\n"
    "seen = {'key_in_env': os.environ.get('CARBONFLOW_RESULT_KEY'), 'wrote': wrote}\n"
    "pathlib.Path(sys.argv[3]).write_text(json.dumps(seen))\n"
)
IDLE = "while sys.argv[2] == 'stay':\n    time.sleep(0.1)\n"
# For the other-user test: which ancestors' environments (the guard's, the wrapper's) it could read, and whether
# they held the key.
ANCESTORS = """
found, pid = {}, os.getppid()
while pid > 1:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            found[pid] = "CARBONFLOW_RESULT_KEY=" in handle.read().decode(errors="replace")
    except OSError as err:
        found[pid] = type(err).__name__
    with open(f"/proc/{pid}/stat") as handle:
        pid = int(handle.read().rsplit(")", 1)[1].split()[1])
pathlib.Path(sys.argv[3]).with_name("ancestors.json").write_text(json.dumps(found))
"""


def _forged(job: str) -> str:
    now = datetime.now(UTC).isoformat()
    return json.dumps({"job": job, "config_key": Config().key(), "started_at": now, "ended_at": now,
                       "duration_s": 1.0, "exit_code": 0, "metrics": {"test_accuracy": 0.999}, "steps": 3,
                       "devices": [{"device_id": "cpu", "device_model": "x", "kind": "cpu", "energy_j": 1.0,
                                    "label": "measured"}]})  # fmt: skip


def _job(tmp_path: Path, stay: bool, name: str = "forger", **job: object) -> tuple[JobSpec, Plan, Path]:
    script, forged, seen = tmp_path / "forger.py", tmp_path / f"{name}.forged.json", tmp_path / f"{name}.seen.json"
    script.write_text(FORGER + IDLE)
    forged.write_text(_forged(name))
    command = [sys.executable, str(script), str(forged), "stay" if stay else "end", str(seen)]
    spec = JobSpec(**{"name": name, "command": command, "steps": 3, "region": "GB", "device_kind": "cpu", **job})
    plan = Plan(job=name, config=Config(), start=datetime.now(UTC), predicted_duration_s=1, predicted_energy_j=1,
                predicted_emissions_g=1, region="GB", forecast_provider="t", reason="t")  # fmt: skip
    return spec, plan, seen


def _wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def test_a_local_training_cannot_forge_its_result_by_printing_or_writing_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The training prints a forged result line and writes a forged result.json, then ends: the result is the
    wrapper's (signed; the training's steps, not its claimed 1 J at accuracy 0.999)."""
    backend = LocalBackend(tmp_path / "runs")
    spec, plan, seen = _job(tmp_path, stay=False)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    wait(backend, handle, timeout_s=60)
    run = backend.collect(handle)
    assert json.loads(seen.read_text())["key_in_env"] is None, "the training never saw the key"
    assert run.exit_code == 0 and run.metrics["test_accuracy"] == 0.5
    assert [d.energy_j for d in run.devices] != [1.0]
    stored = (Path(handle.details["run_dir"]) / "result.json").read_text()
    assert verified_payload(stored, handle.details["result_key"])  # the wrapper's file replaced the forgery


def test_a_local_training_whose_wrapper_is_killed_is_a_failed_run_not_its_forged_result(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The training forges a result.json, then its wrapper is SIGKILLed: the forged file is refused (unsigned)
    and the run fails, naming why."""
    backend = LocalBackend(tmp_path / "runs")
    spec, plan, seen = _job(tmp_path, stay=True)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    _wait_for(seen)
    os.kill(int(handle.details["pid"]), signal.SIGKILL)
    wait(backend, handle, timeout_s=60)
    with pytest.raises(RunFailed, match=NOT_SIGNED):
        backend.collect(handle)


def test_a_local_result_signed_with_another_key_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A result file signed with another run's key (or one made up) is refused: a failed run."""
    backend = LocalBackend(tmp_path / "runs")
    spec, plan, _ = _job(tmp_path, stay=False)
    handle = backend.start(spec, plan, RunOptions(trace=False))
    wait(backend, handle, timeout_s=60)
    result = Path(handle.details["run_dir"]) / "result.json"
    result.write_text(sign_result(_forged("forger"), new_result_key()))
    with pytest.raises(RunFailed, match="does not match this run's key"):
        backend.collect(handle)
    rebuilt = RunHandle.model_validate_json(handle.model_dump_json())  # another process holds the same key
    with pytest.raises(RunFailed, match="does not match this run's key"):
        LocalBackend(tmp_path / "runs").collect(rebuilt)


def test_a_colocated_pair_result_is_signed_and_a_forged_one_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`carbonflow run-shared` signs its SharedRun with the run's key as `carbonflow run` does."""
    backend = LocalBackend(tmp_path / "runs")
    members = []
    for name in ("pair-a", "pair-b"):
        spec, plan, _ = _job(tmp_path, stay=False, name=name, device_kind="gpu", simulated_gpu=CNN)
        members.append(SharedMember(job=spec, plan=plan, command=["(filled in by the backend)"]))
    handle = backend.start_shared(SharedRequest(members=members), RunOptions(run_name="pair", trace=False))
    wait(backend, handle, timeout_s=90)
    pair = backend.collect(handle)
    assert [m.job for m in pair.members] == ["pair-a", "pair-b"]
    assert all(m.metrics.get("test_accuracy") == 0.5 for m in pair.members)
    result = Path(handle.details["run_dir"]) / "result.json"
    result.write_text(pair.model_dump_json())  # the same numbers, unsigned: not the wrapper's
    with pytest.raises(RunFailed, match="carries no signature"):
        backend.collect(handle)


def test_the_wrapper_takes_its_key_out_of_its_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from carbonflow.execution.signing import take_result_key

    monkeypatch.setenv(RESULT_KEY_ENV, "k" * 64)
    assert take_result_key() == "k" * 64 and RESULT_KEY_ENV not in os.environ


SYSTEM_PYTHON = "/usr/bin/python3"  # world-executable, as in an image (the venv's lives under /root)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the training to another user needs root")
def test_a_training_run_as_another_user_can_neither_write_the_result_nor_read_the_key(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With ``CARBONFLOW_TRAINING_UID`` the training cannot create the run folder's result.json (the wrapper's)
    nor read the key from the wrapper's ``/proc/<pid>/environ``; killed, its wrapper leaves a failed run."""
    base = Path(tempfile.mkdtemp(prefix="carbonflow-trust-"))
    try:
        base.chmod(0o755)
        out = base / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        spec, plan, seen = _job(out, stay=True)
        script = base / "forger.py"
        script.write_text(FORGER + ANCESTORS + IDLE)
        script.chmod(0o644)
        (out / "forger.forged.json").chmod(0o644)
        spec = spec.model_copy(update={"command": [SYSTEM_PYTHON, str(script), *spec.command[2:]]})
        monkeypatch.setenv("CARBONFLOW_TRAINING_UID", "65534")
        backend = LocalBackend(base / "runs")
        handle = backend.start(spec, plan, RunOptions(trace=False))
        _wait_for(out / "ancestors.json")
        assert json.loads(seen.read_text()) == {"key_in_env": None, "wrote": "PermissionError"}
        ancestors = json.loads((out / "ancestors.json").read_text())
        assert True not in ancestors.values() and "PermissionError" in ancestors.values(), ancestors
        os.kill(int(handle.details["pid"]), signal.SIGKILL)
        wait(backend, handle, timeout_s=60)
        with pytest.raises(RunFailed, match="wrote no result"):
            backend.collect(handle)
    finally:
        shutil.rmtree(base, ignore_errors=True)
