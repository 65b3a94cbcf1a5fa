"""Power limits are applied to every GPU of a run and always restored (in-process and across processes)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.errors import PowerLimitRestoreFailed
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import applied_power_limit, restore_from_journal
from carbonflow.energy.simulated import SimulatedGpu

REPO = Path(__file__).resolve().parents[2]
FAKE_DIR = Path(__file__).parent / "fake_pynvml"
DRIVER = Path(__file__).parent / "power_limit_driver.py"

FOUR_GPUS = [{"limit_mw": 300000}, {"limit_mw": 280000}, {"limit_mw": 250000}, {"limit_mw": 300000}]


def test_normal_exit_restores_every_gpu(fake_nvml, journal_dir):
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    gpus = nvml_devices()
    with applied_power_limit(gpus, 175) as outcome:
        assert outcome.applied
        assert fake_nvml.limits_mw() == [175000] * 4
        journals = [json.loads(Path(p).read_text()) for p in outcome.journal_paths]
        assert {j["gpu_uuid"]: j["previous_w"] for j in journals} == {
            g.id: b / 1000 for g, b in zip(gpus, before, strict=True)
        }
        assert {j["format_version"] for j in journals} == {2}
        assert [Path(p).name for p in outcome.journal_paths] == [f"{g.id}.json" for g in gpus]
    assert fake_nvml.limits_mw() == before
    assert outcome.restored is True
    assert not any(Path(p).exists() for p in outcome.journal_paths)


def test_exception_restores(fake_nvml, journal_dir):
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    with pytest.raises(RuntimeError, match="boom"), applied_power_limit(nvml_devices(), 150):
        assert fake_nvml.limits_mw() == [150000] * 4
        raise RuntimeError("boom")
    assert fake_nvml.limits_mw() == before


def test_out_of_range_rejected_before_any_change(fake_nvml, journal_dir):
    fake_nvml.setup([{}, {"min_limit_mw": 150000}])
    with (
        pytest.raises(ValueError, match=r"power_limit_w=120 .*150 W to 300 W"),
        applied_power_limit(nvml_devices(), 120),
    ):
        pass
    assert fake_nvml.state()["set_calls"] == []
    assert not list(journal_dir.glob("*.json")) if journal_dir.exists() else True


def test_none_limit_changes_nothing(fake_nvml, journal_dir):
    fake_nvml.setup([{}])
    with applied_power_limit(nvml_devices(), None) as outcome:
        assert not outcome.applied and "no power limit requested" in outcome.notes[0]
    assert fake_nvml.state()["set_calls"] == []


def test_sigterm_in_process_restores_then_exits(fake_nvml, journal_dir):
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    # As in a fresh wrapper process: no SIGTERM handler yet (earlier tests in this pytest process,
    # e.g. Airflow's task runner, may have installed one).
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(SystemExit) as info, applied_power_limit(nvml_devices(), 200):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
        assert info.value.code == 128 + signal.SIGTERM
        assert fake_nvml.limits_mw() == before
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigint_in_process_restores_and_chains_to_previous_handler(fake_nvml, journal_dir):
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    seen: list[list[int]] = []

    def previous(signum, frame):  # e.g. the wrapper's own handler: forwards to the child, records
        seen.append(fake_nvml.limits_mw())

    old = signal.signal(signal.SIGINT, previous)
    try:
        with applied_power_limit(nvml_devices(), 200):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert seen == [before]  # restored before the previous handler ran
    finally:
        signal.signal(signal.SIGINT, old)
    assert fake_nvml.limits_mw() == before


def test_signal_while_applying_never_leaves_a_gpu_lowered(journal_dir):
    """SIGTERM lands in the middle of setting the limits and the wrapper's own handler just records it."""

    class SignalOnSet(SimulatedGpu):
        def set_power_limit_w(self, limit_w: float) -> None:
            if limit_w < self.default_power_limit_w():
                os.kill(os.getpid(), signal.SIGTERM)  # arrives before this GPU is lowered
            super().set_power_limit_w(limit_w)

    received: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        gpus = [SimulatedGpu(SimulatedGpuSpec(), index=0), SignalOnSet(SimulatedGpuSpec(), index=1)]
        gpus.append(SimulatedGpu(SimulatedGpuSpec(), index=2))
        lowered_after_signal = []
        with applied_power_limit(gpus, 150) as outcome:
            lowered_after_signal = [g.power_limit_w() for g in gpus]
        assert received == [signal.SIGTERM]
        assert not outcome.applied and "stopped while it was being set" in outcome.notes[-1]
        assert lowered_after_signal[2] == 250  # the GPU after the signal was never lowered
        assert [g.power_limit_w() for g in gpus] == [250, 250, 250]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_failed_restore_is_retried(fake_nvml, journal_dir):
    fake_nvml.setup([{}, {}])
    before = fake_nvml.limits_mw()
    with applied_power_limit(nvml_devices(), 200, retry_delay_s=0.01) as outcome:
        fake_nvml.update(1, set_failures=2)
    assert outcome.restored is True
    assert fake_nvml.limits_mw() == before
    failed = [c for c in fake_nvml.state()["set_calls"] if c[3] == "failed"]
    assert len(failed) == 2


def test_restore_failure_is_loud_and_journal_allows_later_restore(fake_nvml, journal_dir, caplog, capsys):
    fake_nvml.setup([{}, {}])
    before = fake_nvml.limits_mw()
    with caplog.at_level(logging.CRITICAL), applied_power_limit(nvml_devices(), 200, retry_delay_s=0.01) as outcome:
        fake_nvml.update(0, set_failures=10)
    assert outcome.restored is False
    assert "POWER LIMIT NOT RESTORED" in caplog.text
    assert "POWER LIMIT NOT RESTORED" in capsys.readouterr().err
    assert fake_nvml.limits_mw() == [200000, 300000]
    [entry] = outcome.not_restored  # typed: the GPU, the limit wanted and the one it is at; GPU 1 was restored
    assert entry.startswith(nvml_devices()[0].describe()) and f"wanted {before[0] / 1000:g} W, is at 200 W" in entry
    journals = [Path(p) for p in outcome.journal_paths]
    assert all(j.exists() for j in journals)
    fake_nvml.update(0, set_failures=0)
    restored = {k: v for j in journals for k, v in restore_from_journal(j, nvml_devices()).items()}
    assert fake_nvml.limits_mw() == before
    assert len(restored) == 2 and not any(j.exists() for j in journals)


def test_restore_from_journal_missing_gpu_raises(fake_nvml, tmp_path):
    fake_nvml.setup([{}])
    path = tmp_path / "j.json"
    path.write_text(json.dumps({"pid": 1, "devices": [{"id": "GPU-gone", "previous_w": 250}]}))
    with pytest.raises(PowerLimitRestoreFailed, match="GPU-gone not found"):
        restore_from_journal(path, nvml_devices())
    assert path.exists()


def test_next_run_repairs_what_a_crashed_0_1_0_run_left(fake_nvml, journal_dir):
    fake_nvml.setup([{}, {}, {"limit_mw": 250000}])
    gpus = nvml_devices()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    journal_dir.mkdir(parents=True)
    stale = journal_dir / f"power-limit-journal-{dead.pid}-deadbeef.json"
    entries = [{"id": g.id, "previous_w": w} for g, w in zip(gpus, (300, 300, 250), strict=True)]
    entries.append({"id": "GPU-on-another-run", "previous_w": 200})
    stale.write_text(json.dumps({"pid": dead.pid, "devices": entries}))
    for g in gpus:  # what the crashed run left: lowered limits
        g.set_power_limit_w(150)
    with applied_power_limit(gpus[:2], 200) as outcome:
        assert outcome.previous_w == {gpus[0].id: 300.0, gpus[1].id: 300.0}
        assert sum("crashed run" in n for n in outcome.notes) == 2
    assert fake_nvml.limits_mw() == [300000, 300000, 150000]
    left = json.loads(stale.read_text())["devices"]  # entries for GPUs not in this run are kept
    assert [e["id"] for e in left] == [gpus[2].id, "GPU-on-another-run"]


def test_live_process_journal_is_left_alone(fake_nvml, journal_dir):
    fake_nvml.setup([{}])
    (gpu,) = nvml_devices()
    journal_dir.mkdir(parents=True)
    live = journal_dir / f"power-limit-journal-{os.getppid()}-00000000.json"
    live.write_text(json.dumps({"pid": os.getppid(), "devices": [{"id": gpu.id, "previous_w": 120}]}))
    with applied_power_limit([gpu], 200) as outcome:
        assert outcome.previous_w == {gpu.id: 300.0}
    assert live.exists() and fake_nvml.limits_mw() == [300000]


def test_simulated_gpus_restored(journal_dir):
    gpus = [SimulatedGpu(SimulatedGpuSpec(gpu_model="A40"), index=i) for i in range(2)]
    with applied_power_limit(gpus, 150) as outcome:
        assert [g.power_limit_w() for g in gpus] == [150, 150]
        assert gpus[0].slowdown_factor() > 1
    assert outcome.applied and [g.power_limit_w() for g in gpus] == [300, 300]
    assert outcome.journal_paths == []  # nothing outlives the process for a simulated GPU


# ---- across processes: the wrapper-like driver with the fake driver state shared through a file ----


def _env(fake_nvml, journal_dir) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env["FAKE_PYNVML_STATE"] = str(fake_nvml.path)
    env["CARBONFLOW_POWER_JOURNAL_DIR"] = str(journal_dir)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _start(fake_nvml, journal_dir, mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), "160", mode],
        env=_env(fake_nvml, journal_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("APPLIED"), line + proc.stderr.read()
    child_pid = int(line.split("child=")[1].split()[0])
    return proc, child_pid


@pytest.mark.parametrize("fault", ["exception", "sigterm", "sigint", "child_sigkill"])
def test_fault_injection_across_processes(fake_nvml, journal_dir, fault):
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    proc, child_pid = _start(fake_nvml, journal_dir, "exception" if fault == "exception" else "wait")
    if fault != "exception":
        assert fake_nvml.limits_mw() == [160000] * 4
    if fault == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif fault == "sigint":
        proc.send_signal(signal.SIGINT)
    elif fault == "child_sigkill":
        os.kill(child_pid, signal.SIGKILL)
    proc.wait(timeout=30)
    out, err = proc.communicate()
    assert fake_nvml.limits_mw() == before, err
    assert not list(journal_dir.glob("*.json"))
    if fault == "child_sigkill":
        assert "CHILD EXITED -9" in out and proc.returncode == 0
    elif fault == "sigterm":
        assert proc.returncode == 128 + signal.SIGTERM
    else:
        assert proc.returncode != 0


def test_wrapper_killed_then_restored_from_journal(fake_nvml, journal_dir):
    """SIGKILL of the wrapper itself cannot be caught: the journal lets a later process restore."""
    fake_nvml.setup(FOUR_GPUS)
    before = fake_nvml.limits_mw()
    proc, child_pid = _start(fake_nvml, journal_dir, "wait")
    proc.kill()
    os.kill(child_pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert fake_nvml.limits_mw() == [160000] * 4
    assert len(list(journal_dir.glob("*.json"))) == 4  # one per GPU
    done = subprocess.run(
        [sys.executable, "-m", "carbonflow.energy.power_limit", "restore"],
        env=_env(fake_nvml, journal_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert fake_nvml.limits_mw() == before
    assert not list(journal_dir.glob("*.json"))


def test_the_restore_command_runs_without_a_double_import_warning():
    """Before: ``python -m carbonflow.energy.power_limit`` warned (RuntimeWarning) in every restore pod's log,
    because the package imported the module before runpy ran it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "carbonflow.energy.power_limit",
                           "--help"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr
