"""A fake GPU node for fault injection: the fake NVML driver state, wrappers started as a backend starts them.

Used by the production-safety tests and ``benchmarks/faults.py``. Every wrapper is the real ``carbonflow
run`` process; only the GPU driver (``tests/energy/fake_pynvml``) and zeusd (``tests/fakes/fake_zeusd``) are
fakes, and they say so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.energy.power_limit import gpu_journal_path

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML_DIR = REPO / "tests" / "energy" / "fake_pynvml"


def _fake_pynvml():
    spec = importlib.util.spec_from_file_location("fake_pynvml_node", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeNode:
    """One node: its driver state file, its journal and lease directories, and the wrappers run on it."""

    def __init__(self, root: Path, gpus: int = 1, limit_mw: int = 300000) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_path = self.root / "nvml_state.json"
        self.journal_dir = self.root / "journal"
        self.lease_dir = self.root / "gpu-leases"
        self.nvml = _fake_pynvml()
        self.nvml.make_state(str(self.state_path), [{"limit_mw": limit_mw} for _ in range(gpus)])
        self.original_mw = self.limits_mw()
        self.runs = 0

    def state(self) -> dict:
        return self.nvml.read_state(str(self.state_path))

    def limits_mw(self) -> list[int]:
        return [d["limit_mw"] for d in self.state()["devices"]]

    def uuids(self) -> list[str]:
        return [d["uuid"] for d in self.state()["devices"]]

    def lowered(self) -> int:
        """GPUs not at the limit they had before carbonflow touched them."""
        return sum(now != before for now, before in zip(self.limits_mw(), self.original_mw, strict=True))

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(REPO), env.get("PYTHONPATH", "")])
        env["FAKE_PYNVML_STATE"] = str(self.state_path)
        env["CARBONFLOW_POWER_JOURNAL_DIR"] = str(self.journal_dir)
        env["CARBONFLOW_GPU_LEASE_DIR"] = str(self.lease_dir)
        env["CARBONFLOW_NODE_DIR"] = str(self.root / "node")  # one machine, one node directory
        for name in ("CUDA_VISIBLE_DEVICES", "ZEUSD_SOCK_PATH", "FAKE_NVML_CONTAINER_GPUS", "FAKE_NVML_UNPRIVILEGED"):
            env.pop(name, None)
        env.update(extra)
        return env

    def wrapper(self, name: str, limit_w: float | None, command: list[str], **extra: str) -> subprocess.Popen:
        """Start ``carbonflow run`` for one run; its output goes to files under ``<root>/<name>/``."""
        run_dir = self.root / name
        run_dir.mkdir(parents=True, exist_ok=True)
        job = JobSpec(name=f"job-{name}"[:63], command=["true"], steps=1, region="GB")
        plan = Plan(
            job=job.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
            predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
            forecast_provider="fault-injection", reason="fault injection",
        )  # fmt: skip
        (run_dir / "job.json").write_text(job.model_dump_json())
        (run_dir / "plan.json").write_text(plan.model_dump_json())
        self.runs += 1
        with (run_dir / "stdout").open("w") as out, (run_dir / "stderr").open("w") as err:
            return subprocess.Popen(
                [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(run_dir / "job.json"),
                 "--plan", str(run_dir / "plan.json"), "--result", str(run_dir / "result.json"), "--", *command],
                env=self.env(**extra), stdout=out, stderr=err,
            )  # fmt: skip

    def finish(self, proc: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str]:
        code = proc.wait(timeout=timeout_s)
        return code, (Path(proc.args[5]).parent / "stderr").read_text()

    def restore_cli(self, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "carbonflow.energy.power_limit", "restore"], env=self.env(**extra),
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    def leave_lowered(self, index: int, lowered_mw: int, *, format_version: int = 2) -> None:
        """What a wrapper SIGKILLed mid-run leaves: a lowered GPU and its journal (format 2, or 0.1.0's)."""
        dev = self.state()["devices"][index]
        self.nvml.update_device(str(self.state_path), index, limit_mw=lowered_mw)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        previous_w = dev["limit_mw"] / 1000
        if format_version == 2:
            entry = {"format_version": 2, "gpu_uuid": dev["uuid"], "previous_w": previous_w, "pid": 999999}
            gpu_journal_path(self.journal_dir, dev["uuid"]).write_text(json.dumps(entry))
        else:
            dead = subprocess.Popen([sys.executable, "-c", "pass"])
            dead.wait()
            path = self.journal_dir / f"power-limit-journal-{dead.pid}-deadbeef.json"
            path.write_text(
                json.dumps({"pid": dead.pid, "devices": [{"id": dev["uuid"], "previous_w": dev["limit_mw"] / 1000}]})
            )


def training(marker: Path, seconds: float = 60, grandchild: bool = False) -> list[str]:
    """A training that records its pid, its GPU pinning and its start/end in ``marker``-prefixed files."""
    spawn = (
        f"import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})']);"
        f" open({str(marker)!r} + '.grandchild', 'w').write(str(g.pid));"
        if grandchild
        else ""
    )
    record = (
        f"open({str(marker)!r} + '.span', 'a').write(os.environ.get('CUDA_VISIBLE_DEVICES', '') + ' ' + "
        f"str(time.time()) + chr(10))"
    )
    pid = f"open({str(marker)!r}, 'w').write(str(os.getpid()))"
    code = f"import os, time; {spawn} {record}; {pid}; time.sleep({seconds}); {record}"
    return [sys.executable, "-c", code]


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def started(marker: Path) -> int:
    wait_for(lambda: marker.exists() and marker.read_text().strip() != "")
    return int(marker.read_text())
