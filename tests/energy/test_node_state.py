"""One lease per GPU per machine whatever the homes, one default home, and journals that cannot be forged into harm.

The wrappers here are real ``carbonflow run`` processes on the FAKE NVML node (``fake_pynvml``); the node directory
of each test is its own (tests/conftest.py sets ``CARBONFLOW_NODE_DIR``), standing in for ``/var/lib/carbonflow``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow import settings
from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.energy.lease import safe_name
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import applied_power_limit, gpu_journal_path, restore_from_journal
from carbonflow.settings import NodeDirsSplit, home_dir, node_dirs, node_state_dir
from tests.fakes.node import wait_for

REPO = Path(__file__).resolve().parents[2]
FAKE_DIR = Path(__file__).parent / "fake_pynvml"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def default_dirs(monkeypatch) -> Path:  # type: ignore[no-untyped-def]
    """Default lease and journal settings (no CARBONFLOW_GPU_LEASE_DIR / _POWER_JOURNAL_DIR); returns the node dir."""
    monkeypatch.delenv("CARBONFLOW_GPU_LEASE_DIR", raising=False)
    monkeypatch.delenv("CARBONFLOW_POWER_JOURNAL_DIR", raising=False)
    return Path(os.environ["CARBONFLOW_NODE_DIR"])


def _wrapper(fake_nvml, run_dir: Path, limit_w: float, command: list[str], **env_extra: str) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """``carbonflow run`` as a worker starts it, with that worker's own environment (``env_extra``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    job = JobSpec(name=run_dir.name, command=["true"], steps=1, region="GB")
    plan = Plan(job=job.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
                predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
                forecast_provider="test", reason="node-state test")  # fmt: skip
    (run_dir / "job.json").write_text(job.model_dump_json())
    (run_dir / "plan.json").write_text(plan.model_dump_json())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env["FAKE_PYNVML_STATE"] = str(fake_nvml.path)
    for name in ("CUDA_VISIBLE_DEVICES", "ZEUSD_SOCK_PATH"):
        env.pop(name, None)
    env.update(env_extra)
    with (run_dir / "stderr").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(run_dir / "job.json"), "--plan",
             str(run_dir / "plan.json"), "--result", str(run_dir / "result.json"), "--", *command],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


def _stderr(proc: subprocess.Popen) -> str:
    return (Path(proc.args[5]).parent / "stderr").read_text()


def _sleeper(marker: Path) -> list[str]:
    return [sys.executable, "-c", f"import time; open({str(marker)!r}, 'w').write('up'); time.sleep(60)"]


def test_two_workers_with_separate_homes_never_share_a_gpu(fake_nvml, default_dirs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding: leases lived under each worker's CARBONFLOW_HOME, so two workers of one node with their own homes
    both trained on GPU 0; it ended at 150 W with no journal and both runs exited 0."""
    fake_nvml.setup([{}])
    first = _wrapper(fake_nvml, tmp_path / "a", 200, _sleeper(tmp_path / "a.up"),
                     CARBONFLOW_HOME=str(tmp_path / "home-a"))  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "a.up").exists(), timeout_s=60)
        uuid = fake_nvml.state()["devices"][0]["uuid"]
        journal = gpu_journal_path(default_dirs / settings.JOURNALS_SUBDIR, uuid)
        assert fake_nvml.limits_mw() == [200000] and json.loads(journal.read_text())["previous_w"] == 300.0
        second = _wrapper(fake_nvml, tmp_path / "b", 150, ["true"], CARBONFLOW_HOME=str(tmp_path / "home-b"),
                          CARBONFLOW_GPU_WAIT_S="1")  # fmt: skip
        assert second.wait(timeout=60) == 69, _stderr(second)  # EX_UNAVAILABLE: the GPU is leased
        assert "leased by other carbonflow runs" in _stderr(second)
        assert str(default_dirs / settings.LEASES_SUBDIR) in _stderr(second), "one lease dir, on the node"
        assert fake_nvml.limits_mw() == [200000], "the second worker never touched the GPU"
        assert first.poll() is None, "the first still trains"
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        first.kill()
    assert fake_nvml.limits_mw() == [300000], "back at the GPU's default"
    assert not journal.exists(), "restored, journal removed"
    assert not (tmp_path / "home-a" / "gpu-leases").exists() and not (tmp_path / "home-b" / "gpu-leases").exists()


def test_a_lease_dir_inside_a_home_is_refused_at_wrapper_start(fake_nvml, default_dirs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding (the same split, configured): a lease directory under CARBONFLOW_HOME is per worker."""
    fake_nvml.setup([{}])
    home = tmp_path / "home"
    proc = _wrapper(fake_nvml, tmp_path / "a", 200, ["true"], CARBONFLOW_HOME=str(home),
                    CARBONFLOW_GPU_LEASE_DIR=str(home / "gpu-leases"))  # fmt: skip
    assert proc.wait(timeout=60) == 2
    err = _stderr(proc)
    assert "CARBONFLOW_GPU_LEASE_DIR" in err and f"inside CARBONFLOW_HOME={home}" in err, err
    assert fake_nvml.limits_mw() == [300000] and fake_nvml.state().get("set_calls", []) == []


def test_a_wrapper_whose_lease_dir_disagrees_with_the_nodes_is_refused_naming_both(
    fake_nvml, default_dirs, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Finding: two lease directories on one node let two runs take one GPU; the node registers its own on first
    use and a later wrapper with another is refused before it touches a GPU."""
    fake_nvml.setup([{}])
    first = _wrapper(fake_nvml, tmp_path / "a", 200, ["true"], CARBONFLOW_HOME=str(tmp_path / "home-a"))
    assert first.wait(timeout=60) == 0, _stderr(first)
    other = tmp_path / "elsewhere" / "leases"
    second = _wrapper(fake_nvml, tmp_path / "b", 150, ["true"], CARBONFLOW_HOME=str(tmp_path / "home-b"),
                      CARBONFLOW_GPU_LEASE_DIR=str(other))  # fmt: skip
    assert second.wait(timeout=60) == 2
    err = " ".join(_stderr(second).split())
    assert f"CARBONFLOW_GPU_LEASE_DIR resolves to {other}" in err, err
    assert str(default_dirs / settings.LEASES_SUBDIR) in err and str(default_dirs / "node.json") in err
    assert fake_nvml.limits_mw() == [300000] and not other.exists()


def test_one_default_home_for_operators_tracking_and_the_cli(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding: the default homes differed (./.carbonflow for operators, ~/.carbonflow for leases and journals)."""
    from carbonflow.operators.common import home as operators_home
    from carbonflow.tracking.uri import carbonflow_home

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CARBONFLOW_HOME")
    assert home_dir() == tmp_path / ".carbonflow" == carbonflow_home() == operators_home()
    monkeypatch.setenv("CARBONFLOW_HOME", str(tmp_path / "h"))
    assert home_dir() == tmp_path / "h" == carbonflow_home() == operators_home()


def test_the_default_node_dir_depends_on_neither_the_home_nor_the_user(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CARBONFLOW_NODE_DIR")
    monkeypatch.delenv("CARBONFLOW_GPU_LEASE_DIR", raising=False)
    monkeypatch.delenv("CARBONFLOW_POWER_JOURNAL_DIR", raising=False)
    seen = set()
    for who in ("a", "b"):
        monkeypatch.setenv("CARBONFLOW_HOME", str(tmp_path / who))
        monkeypatch.setenv("HOME", str(tmp_path / f"user-{who}"))
        seen.add(node_dirs(register=False))
    (dirs,) = seen
    assert dirs.node == node_state_dir() in (settings.SYSTEM_NODE_DIR, settings.SHARED_NODE_DIR)
    assert dirs.leases == dirs.node / "gpu-leases" and dirs.journals == dirs.node / "power-journal"


def test_the_shared_tmp_node_dir_is_sticky_and_a_planted_symlink_is_refused(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CARBONFLOW_NODE_DIR")
    monkeypatch.delenv("CARBONFLOW_GPU_LEASE_DIR", raising=False)
    monkeypatch.delenv("CARBONFLOW_POWER_JOURNAL_DIR", raising=False)
    monkeypatch.setattr(settings, "SYSTEM_NODE_DIR", tmp_path / "absent")
    shared = tmp_path / "carbonflow-node"
    monkeypatch.setattr(settings, "SHARED_NODE_DIR", shared)
    assert node_dirs().node == shared
    for folder in (shared, shared / "gpu-leases", shared / "power-journal"):  # any user adds, none removes another's
        assert oct(folder.stat().st_mode & 0o7777) == "0o1777", folder
    assert json.loads((shared / "node.json").read_text())["gpu_lease_dir"] == str(shared / "gpu-leases")
    (tmp_path / "attacker").mkdir()
    shutil.rmtree(shared)
    shared.symlink_to(tmp_path / "attacker")
    with pytest.raises(NodeDirsSplit, match="is not a directory"):
        node_dirs()
    shared.unlink()
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "gpu-leases").symlink_to(tmp_path / "attacker")  # planted inside the shared directory
    with pytest.raises(NodeDirsSplit, match="gpu-leases is not a directory"):
        node_dirs()


def test_another_users_journal_in_the_shared_dir_is_applied_and_ours_goes_beside_it(
    fake_nvml, journal_dir, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """In a sticky shared directory a wrapper cannot remove or replace another user's journal: it applies it (the
    GPU's limit before that crashed run), says so, and writes its own journal beside it; a later run applies the
    other one again, harmlessly."""
    fake_nvml.setup([{"limit_mw": 150000}])
    (gpu,) = nvml_devices()
    theirs = _forged(gpu_journal_path(journal_dir, gpu.id), gpu.id, 300.0)
    real_unlink = Path.unlink

    def sticky_unlink(self: Path, missing_ok: bool = False) -> None:
        if self == theirs:
            raise PermissionError(1, "Operation not permitted", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", sticky_unlink)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the journal is root's: another user's to this wrapper
    with applied_power_limit([gpu], 200) as outcome:
        ours = journal_dir / f"{theirs.stem}.uid-4242.json"
        assert json.loads(ours.read_text())["previous_w"] == 300.0 and fake_nvml.limits_mw() == [200000]
    assert fake_nvml.limits_mw() == [300000] and theirs.exists() and not ours.exists()
    assert any("restored" in n and "cannot be removed here" in n for n in outcome.notes), outcome.notes


def test_safe_name_never_returns_dot_dotdot_or_empty() -> None:
    """Finding: ``safe_name('..')`` was ``..``: a GPU 'UUID' or run id of '..' named the parent directory."""
    for text in ("", ".", ".."):
        name = safe_name(text)
        assert name not in ("", ".", "..") and "/" not in name, (text, name)
    assert safe_name("..") == "__" and safe_name("") == "_"
    assert safe_name("GPU-1a2b.x") == "GPU-1a2b.x" and safe_name("run:1+0/..") == "run_1_0_.."


def _forged(path: Path, uuid: str, previous_w: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format_version": 2, "gpu_uuid": uuid, "previous_w": previous_w, "pid": 999999}))
    return path


@pytest.mark.parametrize("previous_w", [5000.0, 1.0, float("nan")])
def test_a_forged_journal_outside_the_gpus_range_restores_its_default_instead(
    fake_nvml, journal_dir, caplog, previous_w
) -> None:  # type: ignore[no-untyped-def]
    """Finding: a journal's previous_w was applied without a range check (a journal is restore instructions applied
    with privilege). The restore command and the next wrapper's repair refuse it and put the default back."""
    fake_nvml.setup([{"limit_mw": 150000, "default_limit_mw": 250000}])
    (gpu,) = nvml_devices()
    path = _forged(gpu_journal_path(journal_dir, gpu.id), gpu.id, previous_w)
    with caplog.at_level(logging.CRITICAL):
        assert restore_from_journal(path, [gpu]) == {gpu.id: 250.0}
    assert fake_nvml.limits_mw() == [250000] and not path.exists()
    assert f"previous_w={previous_w:g} W is outside" in caplog.text and "[100, 300] W" in caplog.text
    assert "restoring the GPU's default limit 250 W" in caplog.text

    fake_nvml.update(0, limit_mw=150000)
    _forged(path, gpu.id, previous_w)
    with applied_power_limit([gpu], None) as outcome:  # the next run on the GPU repairs it
        pass
    assert fake_nvml.limits_mw() == [250000] and not path.exists()
    assert any("is outside" in note and "default limit 250 W" in note for note in outcome.notes), outcome.notes


def test_a_journal_inside_the_gpus_range_is_still_restored_exactly(fake_nvml, journal_dir) -> None:  # type: ignore[no-untyped-def]
    fake_nvml.setup([{"limit_mw": 150000, "default_limit_mw": 250000}])
    (gpu,) = nvml_devices()
    path = _forged(gpu_journal_path(journal_dir, gpu.id), gpu.id, 275.0)
    assert restore_from_journal(path, [gpu]) == {gpu.id: 275.0}
    assert fake_nvml.limits_mw() == [275000]


def test_the_restore_command_registers_nothing_so_it_can_be_pointed_at_each_pods_journals(
    fake_nvml, default_dirs, tmp_path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """The by-hand restore on a Kubernetes node names one pod's journal directory at a time: it must not register
    that directory as the node's (a second pod's would then be refused)."""
    from carbonflow.energy.power_limit import main as power_limit_main

    fake_nvml.setup([{"limit_mw": 150000}])
    (gpu,) = nvml_devices()
    for pod in ("pod-a", "pod-b"):
        _forged(gpu_journal_path(tmp_path / pod, gpu.id), gpu.id, 300.0 if pod == "pod-a" else 250.0)
        monkeypatch.setenv("CARBONFLOW_POWER_JOURNAL_DIR", str(tmp_path / pod))
        assert power_limit_main(["restore"]) == 0, capsys.readouterr().err
        fake_nvml.update(0, limit_mw=150000)
    assert not (default_dirs / "node.json").exists()
    assert not list(tmp_path.glob("pod-*/*.json")), "both replayed and removed"


def test_two_planned_pairs_never_share_one_gpus_lease(tmp_path):
    """Issue 21: two co-located pairs on one time-sliced GPU trained at once. A pair's members share the GPU's
    lease (its group); a member of another pair, and a run alone, wait until the last member is gone."""
    from carbonflow.energy.errors import GpuLeaseUnavailable
    from carbonflow.energy.lease import acquire_gpus

    leases = tmp_path / "leases"
    a0 = acquire_gpus(["GPU-1"], 1, directory=leases, group="pair-a")
    a1 = acquire_gpus(["GPU-1"], 1, directory=leases, group="pair-a")  # the pair's other pod joins
    for group in ("pair-b", None):
        with pytest.raises(GpuLeaseUnavailable):
            acquire_gpus(["GPU-1"], 1, directory=leases, group=group)
    a0.release()
    with pytest.raises(GpuLeaseUnavailable):  # one member still trains
        acquire_gpus(["GPU-1"], 1, directory=leases, group="pair-b")
    a1.release()
    b0 = acquire_gpus(["GPU-1"], 1, directory=leases, group="pair-b")
    with pytest.raises(GpuLeaseUnavailable):
        acquire_gpus(["GPU-1"], 1, directory=leases)
    b0.release()
    alone = acquire_gpus(["GPU-1"], 1, directory=leases)
    with pytest.raises(GpuLeaseUnavailable):
        acquire_gpus(["GPU-1"], 1, directory=leases, group="pair-b")
    alone.release()


_REGISTER = """
import sys, time
from carbonflow.settings import node_dirs
start = float(sys.argv[1])
while time.time() < start:
    pass
node_dirs()
"""


def test_wrappers_registering_the_node_at_once_never_read_a_half_written_registry(default_dirs, tmp_path):  # type: ignore[no-untyped-def]
    """The first wrapper of a machine writes node.json; one racing it used to read it empty ("unreadable: Expecting
    value") and fail its run. Eight processes register a fresh node dir at the same instant, six times over."""
    import time

    for attempt in range(6):
        node = tmp_path / f"node{attempt}"
        env = dict(os.environ, CARBONFLOW_NODE_DIR=str(node), PYTHONPATH=str(REPO))
        start = str(time.time() + 1.5)
        procs = [subprocess.Popen([sys.executable, "-c", _REGISTER, start], env=env, stderr=subprocess.PIPE,
                                  text=True) for _ in range(8)]  # fmt: skip
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 8, errors
        assert json.loads((node / settings.NODE_REGISTRY).read_text())["gpu_lease_dir"].startswith(str(node))
        assert not list(node.glob(".node-*")), "temporary registry files left behind"
