"""Regression tests for the trust-boundary review (issue 21), each named after its finding.

1. "Trainings get secrets": the training's environment started from the wrapper's whole environment, so a
   training launched by an Airflow worker saw ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` and the Fernet key.
2. "A job's env reaches the root guard": ``PYTHONPATH`` / ``LD_PRELOAD`` were not refused, and the guard (root)
   ran with the training's environment, importing the job's ``sitecustomize.py`` before dropping privileges.
3. "torchrun ranks escape the guard": a process that leaves the training's session (``setsid``) survived the
   wrapper's SIGKILL, and the next run took the GPU while it still trained.

Everything runs through the real ``carbonflow run`` wrapper and guard on the fake NVML node
(``tests/fakes/node.py``); dropping to another user needs root (as in CI here), and is skipped otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakes.node import FakeNode, alive, started, wait_for
from pydantic import ValidationError

from carbonflow.contract import protected_env_problem, training_base_env
from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.gpus import start_child

SYSTEM_PYTHON = "/usr/bin/python3"  # world-executable, as in a container image (the venv's lives under /root)
SECRETS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:db-secret-1@db/airflow",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-secret-2",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://u:conn-secret-3@wh/db",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-secret-4",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-5",
    "GITHUB_TOKEN": "token-secret-6",
    "DB_PASSWORD": "password-secret-7",
}


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "node", gpus=1)


def _wrapper(node: FakeNode, name: str, command: list[str], *, env: dict[str, str] | None = None,
             working_dir: str | None = None, **extra: str) -> subprocess.Popen:  # fmt: skip
    """``carbonflow run`` for a job with its own ``env`` / ``working_dir`` (FakeNode.wrapper's job has neither)."""
    run_dir = node.root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    job = JobSpec(name=f"job-{name}", command=["true"], steps=1, region="GB", env=env or {}, working_dir=working_dir)
    plan = Plan(
        job=job.name, config=Config(containers=1, power_limit_w=200), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
        forecast_provider="trust-boundary", reason="trust-boundary test",
    )  # fmt: skip
    (run_dir / "job.json").write_text(job.model_dump_json())
    (run_dir / "plan.json").write_text(plan.model_dump_json())
    with (run_dir / "stdout").open("w") as out, (run_dir / "stderr").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(run_dir / "job.json"),
             "--plan", str(run_dir / "plan.json"), "--result", str(run_dir / "result.json"), "--", *command],
            env=node.env(**extra), stdout=out, stderr=err,
        )  # fmt: skip


def _result(node: FakeNode, name: str) -> dict:
    return json.loads((node.root / name / "result.json").read_text())


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


# --- finding 1: trainings get no secrets ---------------------------------------------------------------
DUMP_ENV = """
import json, os, sys
guard = open(f"/proc/{os.getppid()}/environ", "rb").read().decode(errors="replace")
out = os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "env.json")
json.dump({"env": dict(os.environ), "guard_environ": guard, "cwd": os.getcwd()}, open(out, "w"))
"""


def test_training_env_holds_no_airflow_secrets(node: FakeNode) -> None:
    """A worker full of credentials (Airflow's DB and Fernet key, a connection, MLflow, AWS, tokens) and a
    preloaded library: the training sees the allow-list, its job's env and carbonflow's contract, nothing else;
    its guard sees nothing at all."""
    proc = _wrapper(node, "secrets", [sys.executable, "-c", DUMP_ENV], env={"MY_SETTING": "job-value"},
                    **SECRETS, LD_PRELOAD="/nonexistent/libpreload.so", LANG="C.UTF-8", LC_ALL="C.UTF-8",
                    OPENBLAS_CORETYPE="Haswell")  # fmt: skip
    code, stderr = node.finish(proc)
    assert code == 0, stderr
    seen = json.loads((Path(_result(node, "secrets")["output_dir"]) / "env.json").read_text())
    env = seen["env"]
    for name, value in SECRETS.items():
        assert name not in env, f"{name} reached the training"
        assert not any(value in v for v in env.values()), f"the value of {name} reached the training"
    for name in ("LD_PRELOAD", "PYTHONPATH", "FAKE_PYNVML_STATE", "CARBONFLOW_POWER_JOURNAL_DIR",
                 "CARBONFLOW_GPU_LEASE_DIR"):  # fmt: skip
        assert name not in env, f"{name} reached the training"
    assert env["MY_SETTING"] == "job-value"  # the job's own env
    assert env["CUDA_VISIBLE_DEVICES"] == node.uuids()[0]  # pinned by carbonflow
    assert env["CARBONFLOW_PROGRESS_FILE"] and env["CARBONFLOW_MODE"] == "train"  # the contract
    assert env["LANG"] == env["LC_ALL"] == "C.UTF-8" and env["PATH"] and env["HOME"]  # the allow-list
    assert env["OPENBLAS_CORETYPE"] == "Haswell"
    assert seen["guard_environ"] == "", "the guard starts with an empty environment"
    assert seen["cwd"] == os.getcwd(), "no working_dir: the training starts where the wrapper runs (not the guard's /)"


def test_the_training_allow_list_is_short_and_named() -> None:
    """The allow-list itself: what a worker typically holds is dropped, the named runtime set is kept."""
    worker = {**SECRETS, "PATH": "/usr/bin", "HOME": "/root", "LC_TIME": "C", "TZ": "UTC", "TMPDIR": "/tmp",
              "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "CUDA_HOME": "/usr/local/cuda", "RANK": "1",
              "PYTHONPATH": "/opt/airflow/dags", "LD_PRELOAD": "/x.so", "CARBONFLOW_WATTTIME_PASSWORD": "w",
              "CARBONFLOW_ELECTRICITYMAPS_TOKEN": "t", "ZEUSD_SOCK_PATH": "/run/zeusd.sock", "KUBECONFIG": "/k",
              "CARBONFLOW_LR": "0.01"}  # fmt: skip
    assert set(training_base_env(worker)) == {"PATH", "HOME", "LC_TIME", "TZ", "TMPDIR", "LD_LIBRARY_PATH",
                                              "CUDA_HOME", "RANK", "CARBONFLOW_LR"}  # fmt: skip


# --- finding 2: a job's env never reaches the root guard -----------------------------------------------
def test_pythonpath_and_ld_preload_are_refused_in_job_env() -> None:
    """Refused by name or prefix, each with its reason; harmless PYTHON* settings stay allowed."""
    refused = ["PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONWARNINGS",
               "PYTHONBREAKPOINT", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES",
               "BASH_ENV", "ENV", "BASH_FUNC_ls%%", "GCONV_PATH", "GLIBC_TUNABLES", "PERL5OPT", "NODE_OPTIONS",
               "JAVA_TOOL_OPTIONS", "CUDA_INJECTION64_PATH", "OPENSSL_CONF", "OMP_TOOL_LIBRARIES",
               "pythonpath", "ld_preload"]  # fmt: skip
    for name in refused:
        assert protected_env_problem(name), f"{name} is not refused"
        with pytest.raises(ValidationError, match=f"env.{name}"):
            JobSpec(name="j", command=["true"], steps=1, region="GB", env={name: "/tmp/x"})
    with pytest.raises(ValidationError) as err:
        JobSpec(name="j", command=["true"], steps=1, region="GB", env={"PYTHONPATH": "/a", "LD_PRELOAD": "/b.so"})
    assert "env.LD_PRELOAD" in str(err.value) and "env.PYTHONPATH" in str(err.value)
    for name in ("PYTHONUNBUFFERED", "PYTHONHASHSEED", "SSL_CERT_FILE", "MALLOC_ARENA_MAX", "PATH", "HF_HOME"):
        assert protected_env_problem(name) is None, f"{name} loads no code and should stay allowed"
    JobSpec(name="j", command=["true"], steps=1, region="GB", env={"PYTHONUNBUFFERED": "1"})


SITECUSTOMIZE = """
import os, sys
with open({marker!r}, "a") as handle:
    handle.write(f"{{os.getuid()}} {{os.getpid()}} {{__name__}} {{sys.argv!r}}\\n")
"""


@pytest.fixture
def planted(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A working_dir and a PYTHONPATH folder, each with a sitecustomize.py and a usercustomize.py that write a
    marker line (uid, pid) when imported; folders every user can read, a marker file every user can write."""
    base = Path(tempfile.mkdtemp(prefix="carbonflow-planted-"))
    base.chmod(0o755)
    marker = base / "imported.txt"
    marker.touch()
    marker.chmod(0o666)
    folders = [base / "working_dir", base / "pythonpath"]
    for folder in folders:
        folder.mkdir()
        folder.chmod(0o755)
        for module in ("sitecustomize", "usercustomize"):
            path = folder / f"{module}.py"
            path.write_text(SITECUSTOMIZE.format(marker=str(marker)))
            path.chmod(0o644)
    try:
        yield folders[0], folders[1], marker
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the training drops to another user only under a root wrapper")
def test_guard_never_imports_a_jobs_sitecustomize(planted, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The training's environment asks for PYTHONPATH and LD_PRELOAD and it starts in a folder holding a
    sitecustomize.py: the guard (root) imports none of it and has none of it in its environment; only the
    training's own interpreter, as the training's user, may import the PYTHONPATH one."""
    working_dir, pythonpath, marker = planted
    monkeypatch.setenv("CARBONFLOW_TRAINING_UID", "65534")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(pythonpath), "LD_PRELOAD": "/nonexistent/libx.so"}
    training = [SYSTEM_PYTHON, "-c", "import time; time.sleep(1.5)"]
    child = start_child(training, env, None, cwd=str(working_dir))
    try:
        wait_for(lambda: "process_guard.py" in Path(f"/proc/{child.pid}/cmdline").read_text(errors="replace"), 10)
        guard_env = _environ(child.pid)
        assert child.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert guard_env == {}, f"the guard's environment: {guard_env}"
    lines = [line.split() for line in marker.read_text().splitlines()]
    assert all(int(uid) == 65534 for uid, *_ in lines), f"imported as root: {lines}"
    assert all(int(pid) != child.pid for _, pid, *_ in lines), f"imported by the guard: {lines}"
    assert lines, "the training's own interpreter honours its PYTHONPATH: the plant works, the guard ignored it"


# --- finding 3: every descendant is tracked ------------------------------------------------------------
def _escaping_training(pid_file: Path, sleep_s: float, *, ignore_sigterm: bool = False) -> list[str]:
    """A training whose forked child leaves its session (``setsid``), closes every inherited fd (the GPU
    lease included) and trains on; the training itself sleeps ``sleep_s`` (0: exits at once)."""
    code = textwrap.dedent(f"""
        import os, signal, time
        if {ignore_sigterm!r}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.closerange(0, 65536)
            open({str(pid_file)!r} + ".tmp", "w").write(str(os.getpid()))
            os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
            time.sleep(120)
            os._exit(0)
        while not os.path.exists({str(pid_file)!r}):
            time.sleep(0.01)
        time.sleep({sleep_s})
    """)
    return [sys.executable, "-c", code]


def _gone(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_setsid_rank_dies_with_the_wrapper(node: FakeNode, tmp_path: Path) -> None:
    """SIGKILL of the wrapper: the rank that left the training's session (and closed its lease fds) is killed
    by the guard within seconds, and the next wrapper gets the GPU only once it is gone."""
    rank_file = tmp_path / "rank.pid"
    first = _wrapper(node, "first", _escaping_training(rank_file, 120))
    rank = started(rank_file)
    try:
        first.kill()
        first.wait(timeout=10)
        check = textwrap.dedent(f"""
            def alive(pid):
                try:
                    return open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
                except OSError:
                    return False
            open({str(tmp_path / "seen")!r}, "w").write(str(alive({rank})))
        """)
        retry = _wrapper(node, "retry", [sys.executable, "-c", check], CARBONFLOW_GPU_WAIT_S="30")
        wait_for(lambda: not alive(rank), timeout_s=5)
        code, stderr = node.finish(retry)
    finally:
        _gone(rank)
    assert code == 0, stderr
    assert (tmp_path / "seen").read_text() == "False", "the retry trained while the escaped rank still ran"
    assert node.lowered() == 0  # the retry repaired the SIGKILLed run's limit


def test_the_lease_is_held_until_every_descendant_is_gone(node: FakeNode, tmp_path: Path) -> None:
    """The training exits leaving a setsid'd daemon behind: the run ends only once the daemon is killed, says
    so, and the GPU's lease is free afterwards (not while the daemon sleeps out its 120 s)."""
    from carbonflow.energy.lease import lease_is_held

    daemon_file = tmp_path / "daemon.pid"
    start = time.monotonic()
    proc = _wrapper(node, "daemon", _escaping_training(daemon_file, 0))
    try:
        code, stderr = node.finish(proc)
        daemon = int(daemon_file.read_text())
        assert not alive(daemon), "the wrapper ended while the training's daemon still ran"
    finally:
        if daemon_file.exists():
            _gone(int(daemon_file.read_text()))
    assert code == 0, stderr
    assert time.monotonic() - start < 60
    notes = _result(node, "daemon")["notes"]
    assert "killed 1 process the training left behind" in notes, notes
    assert not lease_is_held(node.uuids()[0], node.lease_dir)
    assert node.lowered() == 0


def test_a_stop_whose_grace_runs_out_kills_the_escaped_rank_too(node: FakeNode, tmp_path: Path) -> None:
    """SIGTERM to the wrapper; the training ignores it and its rank left the session: when the grace period runs
    out the guard kills both (before: SIGKILL of the process group, which the rank is not in)."""
    from carbonflow.energy.lease import lease_is_held

    rank_file = tmp_path / "rank.pid"
    proc = _wrapper(node, "stubborn", _escaping_training(rank_file, 120, ignore_sigterm=True))
    rank = started(rank_file)
    try:
        proc.send_signal(signal.SIGTERM)
        code, stderr = node.finish(proc, timeout_s=60)
        assert not alive(rank), "the wrapper ended while the escaped rank still ran"
    finally:
        _gone(rank)
    assert code == 128 + signal.SIGTERM, stderr
    assert not lease_is_held(node.uuids()[0], node.lease_dir)
    assert node.lowered() == 0


def test_a_training_that_exits_at_once_keeps_its_exit_status() -> None:
    """The guard reaps every child itself (it is a subreaper): a training that ended before the guard looked must
    not be reaped behind its back (a dropped Popen reaps its child in ``__del__``), or its status is lost (-1)."""
    codes = [start_child(["/bin/sh", "-c", f"exit {i % 3}"], {"PATH": "/usr/bin:/bin"}, None).wait(timeout=30)
             for i in range(24)]  # fmt: skip
    assert codes == [i % 3 for i in range(24)]


def test_torchrun_ranks_die_with_the_wrapper(node: FakeNode, tmp_path: Path) -> None:
    """The finding's own case: ``torchrun`` (as carbonflow starts several containers locally) runs each rank in
    a session of its own; SIGKILL of the wrapper still takes every rank down, and the GPU's lease with them."""
    from carbonflow.energy.lease import lease_is_held

    rank = "import os, sys, time; open(sys.argv[1] + os.environ['LOCAL_RANK'], 'w').write(f'{os.getpid()} " \
           "{os.getsid(0)}'); time.sleep(120)"  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "--no-python", sys.executable, "-c", rank, str(tmp_path / "rank")]  # fmt: skip
    proc = _wrapper(node, "torchrun", torchrun)
    files = [tmp_path / "rank0", tmp_path / "rank1"]
    wait_for(lambda: all(f.exists() and f.read_text().strip() for f in files), timeout_s=90)
    ranks = [tuple(int(x) for x in f.read_text().split()) for f in files]
    assert all(sid == pid for pid, sid in ranks), "each rank leads a session of its own (what let it escape)"
    try:
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: not any(alive(pid) for pid, _ in ranks), timeout_s=10)
    finally:
        for pid, _ in ranks:
            _gone(pid)
    wait_for(lambda: not lease_is_held(node.uuids()[0], node.lease_dir), timeout_s=10)
