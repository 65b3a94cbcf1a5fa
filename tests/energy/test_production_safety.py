"""Regression tests for the production-safety review (issue 12), each named after its finding.

Everything runs through the real ``carbonflow run`` wrapper process and ``python -m
carbonflow.energy.power_limit restore`` on a fake NVML node (tests/energy/fake_pynvml: several GPUs with
UUIDs, per-process privilege, container views) with a fake zeusd acting on the same driver state.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import applied_power_limit, gpu_journal_path
from carbonflow.energy.zeusd import ZeusdClient
from tests.fakes.fake_zeusd import serve_fake_zeusd
from tests.fakes.node import wait_for as _wait_for

REPO = Path(__file__).resolve().parents[2]
FAKE_DIR = Path(__file__).parent / "fake_pynvml"


def _write_run_files(tmp: Path, name: str, limit_w: float | None, containers: int = 1) -> tuple[Path, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    job = JobSpec(name=name, command=["true"], steps=1, region="GB", max_containers=max(containers, 1))
    plan = Plan(
        job=name, config=Config(containers=containers, power_limit_w=limit_w), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
        forecast_provider="test", signal_kind="average-direct", reason="production-safety test",
    )  # fmt: skip
    (tmp / "job.json").write_text(job.model_dump_json())
    (tmp / "plan.json").write_text(plan.model_dump_json())
    return tmp / "job.json", tmp / "plan.json"


def _node_env(fake_nvml, journal_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env["FAKE_PYNVML_STATE"] = str(fake_nvml.path)
    env["CARBONFLOW_POWER_JOURNAL_DIR"] = str(journal_dir)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("ZEUSD_SOCK_PATH", None)
    env.update(extra)
    return env


def _wrapper(fake_nvml, journal_dir, tmp: Path, limit_w, command: list[str], **extra) -> subprocess.Popen:
    """The wrapper as a backend starts it; its output goes to files (a training's children may keep pipes open)."""
    job, plan = _write_run_files(tmp, tmp.name, limit_w)
    with (tmp / "stdout").open("w") as out, (tmp / "stderr").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(job), "--plan", str(plan),
             "--result", str(tmp / "result.json"), "--", *command],
            env=_node_env(fake_nvml, journal_dir, **extra), stdout=out, stderr=err,
        )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str]:
    """Wait for a wrapper; (exit status, its stderr)."""
    code = proc.wait(timeout=timeout_s)
    return code, (Path(proc.args[5]).parent / "stderr").read_text()


def _sleeper(pid_file: Path, seconds: float = 60, grandchild: bool = False) -> list[str]:
    """A training that records its pid and its CUDA_VISIBLE_DEVICES, then sleeps (optionally via a grandchild)."""
    spawn = (
        f"import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})']);"
        f" open({str(pid_file)!r} + '.grandchild', 'w').write(str(g.pid));"
        if grandchild
        else ""
    )
    cuda = f"open({str(pid_file)!r} + '.cuda', 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', ''))"
    code = (
        f"import os, time; {spawn} {cuda}; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep({seconds})"
    )
    return [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead for our purpose
        return fh.read().split()[2] != "Z"


def _started(pid_file: Path) -> int:
    _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    return int(pid_file.read_text())


def _leave_lowered_with_journal(fake_nvml, journal_dir: Path, index: int, lowered_mw: int) -> str:
    """What a wrapper SIGKILLed mid-run leaves: a lowered GPU and its format-2 journal."""
    state = fake_nvml.state()["devices"][index]
    fake_nvml.update(index, limit_mw=lowered_mw)
    journal_dir.mkdir(parents=True, exist_ok=True)
    path = gpu_journal_path(journal_dir, state["uuid"])
    path.write_text(json.dumps({"format_version": 2, "gpu_uuid": state["uuid"], "previous_w": state["limit_mw"] / 1000,
                                "requested_w": lowered_mw / 1000, "pid": 999999}))  # fmt: skip
    return state["uuid"]


@pytest.mark.slow
def test_two_wrappers_on_one_gpu_never_leave_it_lowered(fake_nvml, journal_dir, tmp_path):
    """Before: A sets 300→200 W, B 150 W, A exits, B exits → 200 W and no journal. Now B waits for the lease."""
    fake_nvml.setup([{}])
    release = tmp_path / "a.release"  # A trains until B has been refused (a fixed sleep raced B's start-up under load)
    hold = f"import os, time\nopen({str(tmp_path / 'a.pid')!r}, 'w').write(str(os.getpid()))\nend = time.time() + 120\n"
    hold += f"while not os.path.exists({str(release)!r}) and time.time() < end:\n    time.sleep(0.05)\n"
    a = _wrapper(fake_nvml, journal_dir, tmp_path / "a", 200, [sys.executable, "-c", hold])
    try:
        _started(tmp_path / "a.pid")
        b = _wrapper(fake_nvml, journal_dir, tmp_path / "b", 150, ["true"], CARBONFLOW_GPU_WAIT_S="0.5")
        code, err = _finish(b)
        assert code == 69  # EX_UNAVAILABLE: retry later
        assert "leased by other carbonflow runs" in err and "never shared by accident" in err
        assert fake_nvml.limits_mw() == [200000]  # B never touched it
        release.write_text("")
        _finish(a)
    finally:
        a.kill()
    assert fake_nvml.limits_mw() == [300000]
    assert not list(journal_dir.glob("*.json"))
    assert {c[1] for c in fake_nvml.state()["set_calls"]} == {200000, 300000}


@pytest.mark.slow
def test_local_backend_no_longer_always_uses_the_first_gpus(fake_nvml, journal_dir, tmp_path):
    """Before: ``gpus = all_gpus[:containers]`` so two runs swept GPU 0 together. Now each leases a free GPU."""
    fake_nvml.setup([{}, {}])
    uuids = [d["uuid"] for d in fake_nvml.state()["devices"]]
    runs = [_wrapper(fake_nvml, journal_dir, tmp_path / n, 200, _sleeper(tmp_path / f"{n}.pid", 2)) for n in "ab"]
    try:
        for n in "ab":
            _started(tmp_path / f"{n}.pid")
        pinned = {(tmp_path / f"{n}.pid.cuda").read_text() for n in "ab"}
        assert pinned == set(uuids)  # each training pinned by UUID to its own GPU
        assert fake_nvml.limits_mw() == [200000, 200000]
        for r in runs:
            _finish(r)
    finally:
        for r in runs:
            r.kill()
    assert fake_nvml.limits_mw() == [300000, 300000]


@pytest.mark.slow
def test_restore_cli_goes_through_zeusd_when_nvml_refuses(fake_nvml, journal_dir, tmp_path):
    """Before: ``restore`` never used zeusd, so an unprivileged restore failed and the limit stayed low."""
    fake_nvml.setup([{}, {}])
    _leave_lowered_with_journal(fake_nvml, journal_dir, 1, 160000)
    env = _node_env(fake_nvml, journal_dir, FAKE_NVML_UNPRIVILEGED="1")
    restore = [sys.executable, "-m", "carbonflow.energy.power_limit", "restore"]
    refused = subprocess.run(restore, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "no permission" in refused.stderr
    assert fake_nvml.limits_mw() == [300000, 160000]
    with serve_fake_zeusd(fake_nvml.path, tmp_path / "zeusd.sock") as zeusd:
        done = subprocess.run(restore, env={**env, "ZEUSD_SOCK_PATH": str(tmp_path / "zeusd.sock")},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert fake_nvml.limits_mw() == [300000, 300000]
    assert ("POST", "/gpu/set_power_limit?gpu_ids=1&power_limit_mw=300000&block=true") in zeusd.requests
    assert not list(journal_dir.glob("*.json"))


@pytest.mark.slow
def test_run_without_a_limit_repairs_a_crashed_runs_journal_first(fake_nvml, journal_dir, tmp_path):
    """Before: a run asking for no limit returned before the repair and trained at the crashed run's limit."""
    fake_nvml.setup([{}])
    _leave_lowered_with_journal(fake_nvml, journal_dir, 0, 150000)
    run = _wrapper(fake_nvml, journal_dir, tmp_path / "r", None, ["true"])
    code, err = _finish(run)
    assert code == 0, err
    assert fake_nvml.limits_mw() == [300000]
    notes = json.loads((tmp_path / "r" / "result.json").read_text())["notes"]
    assert any("left lowered by a crashed run" in n for n in notes)
    assert not list(journal_dir.glob("*.json"))


@pytest.mark.slow
def test_sigkill_of_the_wrapper_ends_its_training_child(fake_nvml, journal_dir, tmp_path):
    """Before: the child ran in its own session and trained on at the lowered limit after ``kill -9``."""
    fake_nvml.setup([{}])
    wrapper = _wrapper(fake_nvml, journal_dir, tmp_path / "w", 180, _sleeper(tmp_path / "w.pid"))
    child = _started(tmp_path / "w.pid")
    wrapper.kill()
    wrapper.wait(timeout=10)
    _wait_for(lambda: not _alive(child), timeout_s=10)
    assert fake_nvml.limits_mw() == [180000]  # uncatchable: left to the journal...
    nxt = _wrapper(fake_nvml, journal_dir, tmp_path / "n", None, ["true"])
    _finish(nxt)
    assert fake_nvml.limits_mw() == [300000]  # ...which the next run on the GPU repairs at once


@pytest.mark.slow
def test_a_retry_never_runs_beside_a_living_training(fake_nvml, journal_dir, tmp_path):
    """SIGKILL of the wrapper takes down every process of its training (a grandchild too), so the retry that
    follows trains alone, repairs the lowered limit first, and leaves the GPU at its original limit."""
    fake_nvml.setup([{}])
    first = _wrapper(fake_nvml, journal_dir, tmp_path / "f", 180, _sleeper(tmp_path / "f.pid", grandchild=True))
    child = _started(tmp_path / "f.pid")
    grandchild = int((tmp_path / "f.pid.grandchild").read_text())
    first.kill()
    first.wait(timeout=10)
    try:
        _wait_for(lambda: not _alive(child) and not _alive(grandchild), timeout_s=10)
    finally:
        for pid in (child, grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    retry = _wrapper(fake_nvml, journal_dir, tmp_path / "r", 150, ["true"], CARBONFLOW_GPU_WAIT_S="5")
    code, err = _finish(retry)
    assert code == 0, err
    notes = json.loads((tmp_path / "r" / "result.json").read_text())["notes"]
    assert any("left lowered by a crashed run" in n for n in notes)
    assert fake_nvml.limits_mw() == [300000]


def test_job_env_setting_cuda_visible_devices_is_refused_by_name():
    """Before: ``env: {CUDA_VISIBLE_DEVICES: "3"}`` trained on GPU 3 while GPU 0 was capped and measured."""
    with pytest.raises(ValidationError, match="CUDA_VISIBLE_DEVICES"):
        JobSpec(name="j", command=["true"], steps=1, region="GB", env={"CUDA_VISIBLE_DEVICES": "3"})


def test_zeusd_is_told_the_host_index_not_the_container_index(fake_nvml, journal_dir, tmp_path, monkeypatch):
    """Before: a container given host GPU 1 saw it as 0 and zeusd lowered host GPU 0, another tenant's."""
    fake_nvml.setup([{}, {}])
    host_uuids = [d["uuid"] for d in fake_nvml.state()["devices"]]
    monkeypatch.setenv("FAKE_NVML_CONTAINER_GPUS", host_uuids[1])
    monkeypatch.setenv("FAKE_NVML_UNPRIVILEGED", "1")
    index_map = tmp_path / "gpu-index-map.json"
    index_map.write_text(json.dumps({u: i for i, u in enumerate(host_uuids)}))
    with serve_fake_zeusd(fake_nvml.path, tmp_path / "zeusd.sock"):
        client = ZeusdClient(str(tmp_path / "zeusd.sock"))
        (gpu,) = nvml_devices(zeusd=client)
        assert gpu.id == host_uuids[1] and gpu.index == 0  # the container's view
        with applied_power_limit([gpu], 175) as refused:  # no map: never a guess
            assert not refused.applied and "not zeusd's" in " ".join(refused.notes)
        monkeypatch.setenv("CARBONFLOW_GPU_INDEX_MAP", str(index_map))
        with applied_power_limit([gpu], 175) as outcome:
            assert outcome.applied
            assert fake_nvml.limits_mw() == [300000, 175000]  # host GPU 1 only
    assert fake_nvml.limits_mw() == [300000, 300000]


def test_a_limit_that_reads_back_wrong_is_put_back_and_the_run_is_told(fake_nvml, journal_dir, tmp_path, monkeypatch):
    """Before: a read-back that disagreed (zeusd acting on another GPU, or a driver that ignores the call)
    escaped the apply loop, restore found its own GPU unchanged and deleted the journal. Now the mismatch is
    caught: every GPU already touched is put back, the limit counts as not applied, and the notes say why."""
    fake_nvml.setup([{}, {}])
    host_uuids = [d["uuid"] for d in fake_nvml.state()["devices"]]
    monkeypatch.setenv("FAKE_NVML_UNPRIVILEGED", "1")
    with serve_fake_zeusd(fake_nvml.path, tmp_path / "zeusd.sock") as zeusd:
        zeusd.nvml.host_set_power_limit = lambda *args, **kwargs: None  # the call "succeeds" and changes nothing
        gpus = nvml_devices(zeusd=ZeusdClient(str(tmp_path / "zeusd.sock")))
        with applied_power_limit(gpus, 175, journal_dir=journal_dir) as outcome:
            assert not outcome.applied
            assert any("reads back 300 W" in note for note in outcome.notes), outcome.notes
    assert fake_nvml.limits_mw() == [300000, 300000]
    assert not any(journal_dir.glob("*.json")), "nothing lowered, nothing left to restore"
    assert [d["uuid"] for d in fake_nvml.state()["devices"]] == host_uuids


def test_staleness_is_judged_by_the_gpu_lease_not_by_a_pid(fake_nvml, journal_dir, tmp_path, monkeypatch):
    """Before: a journal was live while *some* process had its PID, so a recycled PID kept a GPU lowered forever.

    Now a format-2 journal is live only while its GPU's lease is held: a journal naming a living, unrelated
    PID (this test's own) is repaired; one whose GPU is leased is left to the wrapper that holds the lease.
    """
    from carbonflow.energy.lease import acquire_gpus
    from carbonflow.energy.power_limit import restore_stale_journals, stale_journals

    monkeypatch.setenv("CARBONFLOW_GPU_LEASE_DIR", str(tmp_path / "leases"))
    fake_nvml.setup([{}, {}])
    uuids = [_leave_lowered_with_journal(fake_nvml, journal_dir, i, 150000) for i in (0, 1)]
    for path in journal_dir.glob("*.json"):  # both journals name a living process: this one
        path.write_text(json.dumps({**json.loads(path.read_text()), "pid": os.getpid()}))
    with acquire_gpus([uuids[1]], 1):  # GPU 1 is leased by a run in progress
        assert [p.name for p in stale_journals(journal_dir)] == [gpu_journal_path(journal_dir, uuids[0]).name]
        restore_stale_journals(journal_dir, nvml_devices(all_devices=True))
        assert fake_nvml.limits_mw() == [300000, 150000], "the recycled PID's GPU is restored, the leased one kept"
    assert gpu_journal_path(journal_dir, uuids[1]).exists()


def test_the_journal_home_is_on_a_volume_in_docker_compose():
    """Before: the journal's default home was inside the container, so a restarted container forgot it.

    Every compose service that can set power limits (it reaches zeusd) keeps its journals and GPU leases
    in a named volume, where the restarted service finds and repairs them. Read from the file itself, so
    this holds without the docker-compose binary.
    """
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    named = set(compose.get("volumes") or {})
    setters = {n: s for n, s in compose["services"].items() if "ZEUSD_SOCK_PATH" in (s.get("environment") or {})}
    assert setters, "no compose service sets power limits through zeusd: the test would prove nothing"
    for name, service in setters.items():
        env = service["environment"]
        mounts = [v.split(":")[:2] for v in service.get("volumes", []) if isinstance(v, str)]
        for variable in ("CARBONFLOW_POWER_JOURNAL_DIR", "CARBONFLOW_GPU_LEASE_DIR"):
            assert variable in env, f"{name} does not set {variable}"
            on = [src for src, target in mounts if (env[variable] + "/").startswith(target.rstrip("/") + "/")]
            assert on and on[0] in named, f"{name}: {variable}={env[variable]} is not on a named volume ({mounts})"
