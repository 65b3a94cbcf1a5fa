"""Fault injection through the real ``carbonflow run`` wrapper process on a 4-GPU (fake NVML) node.

After each of: an exception in the wrapper, SIGTERM or SIGINT to the wrapper, SIGKILL of the
training child, every GPU's power limit equals what it was before the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Plan
from tests.fakes.node import wait_for as _wait_for

REPO = Path(__file__).resolve().parents[2]
FAKE_DIR = Path(__file__).parent / "fake_pynvml"
GPUS = [{"limit_mw": 300000}, {"limit_mw": 280000}, {"limit_mw": 250000}, {"limit_mw": 300000}]


def _files(tmp_path: Path, command: list[str]) -> tuple[Path, Path, Path]:
    job = JobSpec(name="fault-test", command=command, steps=1, region="GB", max_containers=4)
    plan = Plan(
        job=job.name,
        config=Config(containers=4, power_limit_w=160),  # one GPU per container: all 4 GPUs
        start=datetime.now(UTC),
        predicted_duration_s=1,
        predicted_energy_j=1,
        predicted_emissions_g=1,
        region="GB",
        forecast_provider="test",
        signal_kind="average-direct",
        reason="fault-injection test",
    )
    job_path, plan_path = tmp_path / "job.json", tmp_path / "plan.json"
    job_path.write_text(job.model_dump_json())
    plan_path.write_text(plan.model_dump_json())
    return job_path, plan_path, tmp_path / "result.json"


def _start(fake_nvml, journal_dir, tmp_path, command: list[str]) -> subprocess.Popen:
    job, plan, result = _files(tmp_path, command)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env["FAKE_PYNVML_STATE"] = str(fake_nvml.path)
    env["CARBONFLOW_POWER_JOURNAL_DIR"] = str(journal_dir)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen(
        [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(job), "--plan", str(plan),
         "--result", str(result), "--", *command],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _child_command(pid_file: Path) -> list[str]:
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    return [sys.executable, "-c", code]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["sigterm", "sigint", "child_sigkill"])
def test_wrapper_restores_limits_after_fault(fake_nvml, journal_dir, tmp_path, fault):
    fake_nvml.setup(GPUS)
    before = fake_nvml.limits_mw()
    pid_file = tmp_path / "child.pid"
    proc = _start(fake_nvml, journal_dir, tmp_path, _child_command(pid_file))
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        assert fake_nvml.limits_mw() == [160000] * 4
        if fault == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif fault == "sigint":
            proc.send_signal(signal.SIGINT)
        else:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert fake_nvml.limits_mw() == before, err
    assert not list(journal_dir.glob("*.json"))
    if fault == "child_sigkill":
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["power_limit_applied"] is True
        assert result["exit_code"] == -signal.SIGKILL
        assert {d["label"] for d in result["devices"]} == {"measured", "estimated"}
    else:
        assert proc.returncode == 128 + (signal.SIGTERM if fault == "sigterm" else signal.SIGINT), err


@pytest.mark.slow
def test_wrapper_restores_limits_after_exception(fake_nvml, journal_dir, tmp_path):
    """The command cannot be started (an exception inside the wrapper while limits are lowered)."""
    fake_nvml.setup(GPUS)
    before = fake_nvml.limits_mw()
    proc = _start(fake_nvml, journal_dir, tmp_path, [str(tmp_path / "no-such-training-binary")])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    calls = fake_nvml.state()["set_calls"]
    assert [c[1] for c in calls[:4]] == [160000] * 4  # the limit really was applied before the failure
    assert fake_nvml.limits_mw() == before, err
    assert not list(journal_dir.glob("*.json"))


@pytest.mark.slow
def test_a_failed_restore_travels_as_a_typed_field_of_the_result(fake_nvml, journal_dir, tmp_path):
    """The training makes GPU 0 refuse every later set (the fake driver's ``set_failures``): the wrapper cannot put
    its limit back, and the result names that GPU, the limit wanted and the one it is at, in
    ``power_limits_not_restored`` (the note says it in words too); the other GPUs are restored and not named."""
    fake_nvml.setup(GPUS)
    code = (
        f"import sys; sys.path.insert(0, {str(FAKE_DIR)!r}); import pynvml; "
        f"pynvml.update_device({str(fake_nvml.path)!r}, 0, set_failures=100)"
    )
    proc = _start(fake_nvml, journal_dir, tmp_path, [sys.executable, "-c", code])
    _out, err = proc.communicate(timeout=120)
    result = json.loads((tmp_path / "result.json").read_text())
    gpu0 = fake_nvml.state()["devices"][0]
    assert fake_nvml.limits_mw() == [160000, 280000, 250000, 300000], err
    [entry] = result["power_limits_not_restored"]
    assert entry.startswith(f"gpu {gpu0['uuid']} (") and "wanted 300 W, is at 160 W" in entry, entry
    assert any(n.startswith("POWER LIMIT NOT RESTORED") for n in result["notes"])
    assert list(journal_dir.glob("*.json")), "the journal of the GPU left lowered is kept"
