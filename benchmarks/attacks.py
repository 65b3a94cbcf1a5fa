"""Attack injection: try every attack of the trust model through the interfaces an attacker really has.

``python benchmarks/attacks.py`` (``--per-kind N``, ``--kinds …``, ``--seed S``) writes
``benchmarks/results/attacks.json``: ``attacks_tried``, ``by_kind`` (tried / succeeded, the interface used and
what a success would have meant), ``attacks_succeeded`` (must be 0), ``ran_as_root``, and each success's detail.
It exits non-zero when any attack succeeded.

The interfaces (docs/security.md names the role behind each):

- **a UI/REST triggerer**: a DAG run's ``conf``, run through the real ``retrain_on_demand`` DAG with Airflow's
  ``dag.test`` (the Params form's validation and the ``validate`` task, as a REST trigger reaches them);
- **a job-file author of the registry** (not trusted with the node): files in a registry folder, loaded by
  the registry loader the registry DAG calls, in a child process whose memory is measured;
- **a training's own code**: the real ``carbonflow run`` wrapper, guard and lease on a **fake** NVML node (the
  GPU driver is the only fake), with ``CARBONFLOW_TRAINING_UID`` where the defence needs it (named per kind);
- **an XCom row**: a ``held_runs`` record delivered by the real delivery code to a real MLflow store (SQLite);
- **the network**: the ports and secrets ``docker-compose.yml`` publishes (read from the file: no Docker
  engine here);
- **a page visitor**: the Carbon page's forecast cache and its shown tracking URI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
UNPRIVILEGED_UID = 65534
"""nobody: the training's user where a kind needs ``CARBONFLOW_TRAINING_UID``."""
TRAINING_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
"""The attacker's interpreter: the system one, which ``nobody`` can run (a venv under /root it cannot)."""


EXAMPLES_PER_KIND = 4
"""What the product answered, for the first attempts of each kind (the JSON keeps them for a reader)."""


@dataclass
class Attempt:
    succeeded: bool
    detail: str = ""


@dataclass
class Kind:
    interface: str
    success_would_mean: str
    attempt: Callable[[random.Random, Path], Attempt]
    setting: str = "default settings"


@dataclass
class Tally:
    tried: int = 0
    succeeded: int = 0
    details: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)


# --- a triggerer: conf of a DAG run --------------------------------------------------------------------------
_DAG_CACHE: dict[str, object] = {}


def _on_demand_dag():  # type: ignore[no-untyped-def]
    if "dag" not in _DAG_CACHE:
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(REPO / "dags" / "retrain_on_demand.py"))
        if bag.import_errors:
            raise RuntimeError(f"retrain_on_demand does not import: {bag.import_errors}")
        _DAG_CACHE["dag"] = bag.get_dag("retrain_on_demand")
    return _DAG_CACHE["dag"]


def _trigger(conf: dict, run_tasks: str) -> tuple[dict[str, str | None], dict | None]:
    """Run retrain_on_demand with ``conf``; tasks outside ``run_tasks`` are marked success, not run.

    Returns the task states and the JobSpec the ``validate`` task handed on (None when it handed none on).
    """
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = _on_demand_dag()
    not_run = "|".join(t for t in dag.task_ids if t not in run_tasks.split("|"))
    try:
        run = dag.test(run_conf=conf, mark_success_pattern=f"^({not_run})$" if not_run else None)
    except ValueError as err:  # refused by the Params form (ParamValidationError) before any task was created
        return {"params": f"refused: {type(err).__name__}"}, None
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids="validate")).all()
    handed = [XComModel.deserialize_value(row) for row in rows if row.key == "requested"]
    spec = json.loads(handed[0]) if handed and isinstance(handed[0], str) else (handed[0] if handed else None)
    return states, spec


def _control_trigger() -> None:
    """Once: a request a trigger may make passes ``validate`` (else every refusal below would mean nothing)."""
    if "control" not in _DAG_CACHE:
        states, spec = _trigger({"job": "digits-cnn", "epochs": 1}, "validate")
        if states.get("validate") != "success" or spec is None:
            raise HarnessError(f"a request a trigger may make did not pass validate: {states}")
        _DAG_CACHE["control"] = True


def _marker_command(marker: Path) -> list[str]:
    return ["sh", "-c", f"touch {marker}; id; env"]


def trigger_runs_a_command(rng: random.Random, root: Path) -> Attempt:
    _control_trigger()
    marker = root / "pwned"
    job = {"name": f"evil-{rng.randint(0, 9999)}", "command": _marker_command(marker), "steps": 5, "region": "GB"}
    conf = rng.choice([
        {"job_spec": job},
        {"job": "digits-cnn", "command": _marker_command(marker)},
        {"job_spec": json.dumps(job)},
        {"job": "digits-cnn", "job_spec": {**job, "name": "digits-cnn"}},
    ])  # fmt: skip
    states, spec = _trigger(conf, "validate|profile")
    ran = marker.exists()
    took = spec is not None and spec.get("command") == job["command"]
    return Attempt(ran or took, f"conf keys {sorted(conf)}: states {states}, command ran={ran}")


SECRETISH = {
    "env": {"LD_PRELOAD": "/tmp/evil.so"},
    "working_dir": "/etc",
    "image": "evil.example/miner:latest",
    "backend": "kubernetes",
    "env_from_connections": {"DB": "airflow_db"},
    "device_kind": "cpu",
}


def trigger_sets_an_author_field(rng: random.Random, root: Path) -> Attempt:
    _control_trigger()
    name = rng.choice(sorted(SECRETISH))
    conf = {"job": "digits-cnn", name: SECRETISH[name]}
    states, spec = _trigger(conf, "validate")
    took = spec is not None and spec.get(name) == SECRETISH[name]
    accepted = states.get("validate") == "success"
    return Attempt(took or (accepted and name == "backend"), f"{name}: states {states}")


def trigger_asks_unbounded_work(rng: random.Random, root: Path) -> Attempt:
    _control_trigger()
    far = datetime(2099, 1, 1, tzinfo=UTC).isoformat()
    name, value = rng.choice([
        ("epochs", 10**12), ("epochs", 10**6), ("steps", 10**12), ("batch_size", 10**9), ("epochs", 0),
        ("finish_by", far), ("max_slowdown", 1e300), ("epochs", "NaN"),
    ])  # fmt: skip
    states, spec = _trigger({"job": "digits-cnn", name: value}, "validate")
    took = spec is not None and str(spec.get(name)) in (str(value), far)
    return Attempt(took, f"{name}={value!r}: states {states}")


# --- a job-file author of the registry ------------------------------------------------------------------------
MEASURE_LOAD = textwrap.dedent(
    """
    import json, resource, sys, time
    t0 = time.monotonic()
    from carbonflow.registry import load_registry
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        jobs = load_registry(sys.argv[1]); outcome = "accepted " + ",".join(sorted(jobs))
    except MemoryError:
        outcome = "MemoryError"
    except Exception as err:
        outcome = "refused: " + str(err)[:300]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"outcome": outcome, "extra_kib": peak, "s": time.monotonic() - t0}))
    """
)
LOAD_MEMORY_BUDGET_KIB = 64 * 1024
LOAD_TIME_BUDGET_S = 5.0


def _load_registry_in_child(folder: Path) -> dict:
    """Load ``folder`` as the registry DAG does, in a child capped at 4 GiB of address space."""

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    done = subprocess.run([sys.executable, "-c", MEASURE_LOAD, str(folder)], capture_output=True, text=True,
                          timeout=120, preexec_fn=cap, cwd=REPO)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"outcome": f"crashed: exit {done.returncode}: {done.stderr[-300:]}", "extra_kib": 0, "s": 0.0}
    return json.loads(lines[-1])


def _alias_bomb(depth: int, width: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, depth):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return 'name: bomb\nsteps: 1\nregion: GB\ncommand: ["true"]\n' + "\n".join(lines) + "\n"


def job_file_exhausts_the_parser(rng: random.Random, root: Path) -> Attempt:
    folder = root / "jobs"
    folder.mkdir()
    shape = rng.choice(["aliases", "aliases", "huge", "deep"])
    if shape == "aliases":
        text = _alias_bomb(depth=rng.randint(6, 9), width=9)
    elif shape == "huge":
        text = 'name: huge\nsteps: 1\nregion: GB\ncommand: ["true"]\ndescription: ' + "x" * (8 << 20) + "\n"
    else:
        text = 'name: deep\nsteps: 1\nregion: GB\ncommand: ["true"]\nx: ' + "[" * 5000 + "]" * 5000 + "\n"
    (folder / "job.yaml").write_text(text)
    seen = _load_registry_in_child(folder)
    costly = seen["extra_kib"] > LOAD_MEMORY_BUDGET_KIB or seen["s"] > LOAD_TIME_BUDGET_S
    accepted = str(seen["outcome"]).startswith(("accepted", "MemoryError", "crashed"))
    return Attempt(accepted or costly, f"{shape} ({len(text)} B): {seen}")


HOSTILE_ENV = ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT",
               "CUDA_VISIBLE_DEVICES", "CARBONFLOW_POWER_JOURNAL_DIR", "CARBONFLOW_GPU_LEASE_DIR",
               "ZEUSD_SOCK_PATH", "PYTHONINSPECT", "PYTHONUSERBASE"]  # fmt: skip
HOSTILE_VALUES = [("epochs", 10**12), ("steps", 10**15), ("target_value", float("nan")),
                  ("profile_report_timeout_s", float("inf")), ("max_slowdown", float("inf")),
                  ("samples_per_epoch", 10**18), ("command", ["x"] * 100000)]  # fmt: skip


def job_file_reaches_the_node(rng: random.Random, root: Path) -> Attempt:
    folder = root / "jobs"
    folder.mkdir()
    job: dict = {"name": "nodejob", "command": ["python", "train.py"], "steps": 10, "region": "GB"}
    if rng.random() < 0.5:
        var = rng.choice(HOSTILE_ENV)
        job["env"] = {var: str(root)}
        what = f"env {var}"
    else:
        name, value = rng.choice(HOSTILE_VALUES)
        job[name] = value
        what = f"{name}={str(value)[:20]}"
    (folder / "job.json").write_text(json.dumps(job))  # json.dumps writes NaN / Infinity, as a hostile file would
    seen = _load_registry_in_child(folder)
    return Attempt(str(seen["outcome"]).startswith(("accepted", "crashed")), f"{what}: {str(seen['outcome'])[:160]}")


# --- a training's own code, on a fake NVML node ----------------------------------------------------------------
def _node(root: Path, gpus: int = 2):  # type: ignore[no-untyped-def]
    from tests.fakes.node import FakeNode

    return FakeNode(root / "node", gpus=gpus)


def _wrapper(
    node,
    root: Path,
    name: str,
    code: str,
    *,
    limit_w: float | None = 200.0,
    env: dict | None = None,
    job: dict | None = None,
) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """The real ``carbonflow run`` as a backend starts it, training ``python -c code``."""
    from carbonflow.domain import Config, JobSpec, Plan

    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = JobSpec(**{"name": f"atk-{name}", "command": ["true"], "steps": 1, "region": "GB", **(job or {})})
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
                predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
                forecast_provider="attack-injection", reason="attack injection")  # fmt: skip
    (run_dir / "job.json").write_text(spec.model_dump_json())
    (run_dir / "plan.json").write_text(plan.model_dump_json())
    seen = run_dir / "seen"
    seen.mkdir(mode=0o777)
    seen.chmod(0o777)
    script = run_dir / "train.py"
    script.write_text(f"open({str(seen / 'started')!r}, 'w').close()\n" + code)
    script.chmod(0o755)
    os.chmod(run_dir, 0o755)
    with (run_dir / "stdout").open("w") as out, (run_dir / "stderr").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(run_dir / "job.json"), "--plan",
             str(run_dir / "plan.json"), "--result", str(run_dir / "result.json"), "--",
             TRAINING_PYTHON, str(script)],
            env=node.env(**(env or {})), stdout=out, stderr=err, cwd=run_dir,
        )  # fmt: skip


class HarnessError(RuntimeError):
    """The attack never reached the product (the harness broke): counted apart, never as a defended attack."""


def _ran(root: Path, name: str) -> None:
    """Raise HarnessError unless the training of run ``name`` really started."""
    if not (root / name / "seen" / "started").exists():
        stderr = (root / name / "stderr").read_text()[-400:] if (root / name / "stderr").exists() else ""
        raise HarnessError(f"the training of {name!r} never started: {stderr}")


def _as_nobody() -> dict[str, str]:
    return {"CARBONFLOW_TRAINING_UID": str(UNPRIVILEGED_UID), "CARBONFLOW_TRAINING_GID": str(UNPRIVILEGED_UID)}


def _loot(root: Path) -> Path:
    loot = root / "loot"
    loot.mkdir(exist_ok=True)
    os.chmod(loot, 0o777)
    return loot


def training_reads_secrets(rng: random.Random, root: Path) -> Attempt:
    """Secrets in the worker's environment; the training looks in its own env and in other processes' envs."""
    planted = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql://airflow:{secrets.token_hex(8)}@db/airflow",
        "AIRFLOW__CORE__FERNET_KEY": secrets.token_urlsafe(24),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(12),
        "MLFLOW_TRACKING_PASSWORD": secrets.token_hex(8),
        "AWS_SECRET_ACCESS_KEY": secrets.token_hex(16),
        "AIRFLOW_CONN_WAREHOUSE": f"postgres://u:{secrets.token_hex(8)}@h/db",
    }
    where = rng.choice(["own-env", "other-processes"])
    loot = _loot(root)
    code = textwrap.dedent(f"""
        import glob, os
        found = [v for v in os.environ.values()]
        if {where == "other-processes"!r}:
            for path in glob.glob('/proc/[0-9]*/environ'):
                try:
                    found += open(path, 'rb').read().decode(errors='replace').split(chr(0))
                except OSError:
                    pass
        open({str(loot / "env")!r}, 'w').write(chr(10).join(found))
    """)
    node = _node(root)
    env = {**planted, **(_as_nobody() if where == "other-processes" else {})}
    node.finish(_wrapper(node, root, "t", code, env=env))
    _ran(root, "t")
    seen = (loot / "env").read_text() if (loot / "env").exists() else ""
    leaked = sorted(name for name, value in planted.items() if value in seen)
    return Attempt(bool(leaked), f"{where}: leaked {leaked}")


FORGED_ACCURACY = 0.999


STEAL_KEY = """
import glob, hashlib, hmac, os


def _ancestors():
    pid, seen = os.getppid(), []
    while pid > 1 and pid not in seen:
        seen.append(pid)
        try:
            pid = int(open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def signed_with_a_stolen_key(forged):
    \"\"\"The forged result signed with the run key this process can read in its wrapper's environment (its
    ancestors first: another run's key would not match), else in any process's.\"\"\"
    paths = ['/proc/%d/environ' % pid for pid in _ancestors()] + glob.glob('/proc/[0-9]*/environ')
    for path in paths:
        try:
            env = open(path, 'rb').read().decode(errors='replace').split(chr(0))
        except OSError:
            continue
        for item in env:
            if item.startswith('CARBONFLOW_RESULT_KEY='):
                mac = hmac.new(item.split('=', 1)[1].encode(), forged.encode(), hashlib.sha256).hexdigest()
                return 'hmac-sha256=' + mac + ' ' + forged
    return forged
"""
"""What a training that wants to forge a signed result runs first: look for the wrapper's key in /proc."""


def _forge_code(result_hint: Path, how: str) -> str:
    forged = {"job": "atk-t", "config_key": "c1-pl200", "started_at": "2026-01-01T00:00:00Z",
              "ended_at": "2026-01-01T00:00:01Z", "duration_s": 1.0, "exit_code": 0, "devices": [],
              "metrics": {"accuracy": FORGED_ACCURACY, "test_accuracy": FORGED_ACCURACY}}  # fmt: skip
    return STEAL_KEY + textwrap.dedent(f"""
        import json, os, signal, time
        open({str(result_hint.parent.parent.parent / "seen" / "started")!r}, 'w').close()
        forged = {json.dumps(forged)!r}
        print('CARBONFLOW_RESULT ' + forged, flush=True)
        if {how!r} == 'steal-key':
            forged = signed_with_a_stolen_key(forged)
        if {how!r} in ('write-result', 'kill-wrapper', 'steal-key'):
            try:
                open({str(result_hint)!r}, 'w').write(forged)
            except OSError:
                pass
        if {how!r} in ('kill-wrapper', 'steal-key'):
            ppid = os.getppid()
            for pid in (ppid, int(open('/proc/%d/stat' % ppid).read().split()[3])):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(1)
    """)


def training_forges_its_result(rng: random.Random, root: Path) -> Attempt:
    """The local backend's reading of a run whose training prints, writes or kills its way to a forged result."""
    from carbonflow.domain import Config, JobSpec, Plan
    from carbonflow.execution.errors import RunFailed
    from carbonflow.execution.local import LocalBackend

    how = rng.choice(["print", "write-result", "kill-wrapper", "steal-key"])
    # As the worker's own user a training is inside the boundary (it could read the key as it could ptrace the
    # wrapper; docs/security.md): stealing the key is tried where the guarantee is made, as another user.
    as_user = "CARBONFLOW_TRAINING_UID" if how == "steal-key" else rng.choice(["default", "CARBONFLOW_TRAINING_UID"])
    workdir = root / "runs"
    workdir.mkdir()
    os.chmod(workdir, 0o755)
    (root / "seen").mkdir(mode=0o777)
    (root / "seen").chmod(0o777)
    script = root / "forge.py"
    script.write_text(_forge_code(workdir / "forge" / "result.json", how))
    os.chmod(script, 0o644)
    spec = JobSpec(
        name="atk-t", command=[TRAINING_PYTHON, str(script)], steps=1, region="GB", simulated_gpu={"gpu_model": "V100"}
    )
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=None), start=datetime.now(UTC),
                predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
                forecast_provider="attack-injection", reason="attack injection")  # fmt: skip
    saved = dict(os.environ)
    os.environ.update(_as_nobody() if as_user != "default" else {})
    try:
        run = LocalBackend(workdir).execute(spec, plan, run_name="forge")
    except RunFailed as err:
        _ran(root, ".")
        return Attempt(False, f"{how} ({as_user}): refused ({str(err).splitlines()[0][:120]})")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    forged = run.metrics.get("accuracy") == FORGED_ACCURACY or run.duration_s == 1.0
    return Attempt(forged, f"{how} ({as_user}): accuracy {run.metrics.get('accuracy')}, {run.duration_s:.2f} s")


K8S_FORGER = (
    STEAL_KEY
    + """
import os, sys, time
forged = signed_with_a_stolen_key(open(sys.argv[1]).read().strip())
print('CARBONFLOW_RESULT ' + forged, flush=True)
open(sys.argv[2], 'w').write('forged')
while True:
    time.sleep(0.2)
"""
)


def training_forges_its_result_on_kubernetes(rng: random.Random, root: Path) -> Attempt:
    """On the fake cluster: the pod's training prints a forged (and, if it can, signed) result; its wrapper is then
    SIGKILLed (the OOM killer's way) or the training exits after printing it."""
    sys.path.insert(0, str(REPO / "tests" / "kubernetes"))
    from fake_gpu_node import fake_cluster

    from carbonflow.domain import Config, JobSpec, Plan
    from tests.fakes.node import wait_for

    limit_w, how = 150, rng.choice(["oom-kill", "oom-kill", "print-and-exit"])
    now = datetime.now(UTC)
    forged = _forged_wrapped_run(limit_w, now)
    with fake_cluster(root, gpus=2, gpus_for=lambda pod: [1]) as (gpu_node, _, api, backend):
        script, forged_file, marker = gpu_node.base / "forger.py", gpu_node.base / "forged.json", root / "printed"
        code = K8S_FORGER if how == "oom-kill" else K8S_FORGER.replace("while True:\n    time.sleep(0.2)", "")
        script.write_text(code)
        forged_file.write_text(forged)
        for path in (script, forged_file):
            path.chmod(0o644)
        os.chmod(root, 0o777)
        spec = JobSpec(name="forger", command=["python", str(script), str(forged_file), str(marker)], steps=100,
                       region="GB")  # fmt: skip
        plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=limit_w), start=now,
                    predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1, region="GB",
                    forecast_provider="attack-injection", reason="attack injection")  # fmt: skip
        handle = backend.start(spec, plan)
        if how == "oom-kill":
            wait_for(lambda: backend.poll(handle).state == "running" and marker.exists(), timeout_s=60)
            api.kill_container(handle.details["pod"])
        wait_for(lambda: backend.poll(handle).state == "finished", timeout_s=60)
        if not marker.exists():
            raise HarnessError(f"{how}: the pod's training never ran")
        try:
            run = backend.collect(handle)
        except Exception as err:  # refused: a failed run
            lowered = gpu_node.node.lowered() > 0
            return Attempt(lowered, f"{how}: refused ({str(err).splitlines()[0][:100]}); GPU left lowered={lowered}")
        believed = run.metrics.get("test_accuracy") == FORGED_ACCURACY or any(d.energy_j == 1.0 for d in run.devices)
        return Attempt(believed, f"{how}: collected accuracy {run.metrics.get('test_accuracy')}")


def _forged_wrapped_run(limit_w: float, now: datetime) -> str:
    from carbonflow.domain import Config, DeviceEnergy
    from carbonflow.execution.wrapper import WrappedRun

    return WrappedRun(
        job="forger", config_key=Config(containers=1, power_limit_w=limit_w).key(), started_at=now, ended_at=now,
        duration_s=1, exit_code=0,
        devices=[DeviceEnergy(device_id="GPU-0", device_model="A100", kind="gpu", energy_j=1.0, label="measured")],
        metrics={"test_accuracy": FORGED_ACCURACY}, power_limit_w=limit_w,
    ).model_dump_json()  # fmt: skip


ESCAPE_CODE = """
import os, sys, time
beat = sys.argv[1] if len(sys.argv) > 1 else {beat!r}
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in range(3, 256):
            try:
                os.close(fd)
            except OSError:
                pass
        end = time.time() + 30
        while time.time() < end:
            open(beat, 'a').write(str(time.time()) + chr(10))
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep({train_s})
"""


def training_escapes_its_guard(rng: random.Random, root: Path) -> Attempt:
    """A rank in its own session (as torchrun starts them) outlives the wrapper: the GPU must stay leased."""
    from tests.fakes.node import training

    node = _node(root, gpus=1)
    beat = root / "beat"
    how = rng.choice(["wrapper-sigkill", "training-exits"])
    first = _wrapper(
        node, root, "first", ESCAPE_CODE.format(beat=str(beat), train_s=2 if how == "training-exits" else 30)
    )
    deadline = time.monotonic() + 30
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _ran(root, "first")
    if how == "wrapper-sigkill":
        time.sleep(0.3)
        first.kill()
    second = node.wrapper("second", 200.0, training(root / "s", seconds=0.3))
    node.finish(second, timeout_s=120)
    with contextlib.suppress(subprocess.TimeoutExpired):
        first.wait(timeout=60)
    spans = (root / "s.span").read_text().split() if (root / "s.span").exists() else []
    second_start = float(spans[1]) if len(spans) > 1 else float("inf")
    beats = [float(x) for x in beat.read_text().split()] if beat.exists() else []
    overlap = any(b >= second_start for b in beats)
    time.sleep(0.2)
    still = beats and (time.time() - float(beat.read_text().split()[-1])) < 0.15
    return Attempt(
        overlap or bool(still), f"{how}: rank beat after the next run started={overlap}, still alive={still}"
    )


SITECUSTOMIZE = """
import os, sys
with open({marker!r}, 'a') as out:
    out.write('%d %s\\n' % (os.geteuid(), ' '.join(sys.argv)[:200]))
"""


def training_code_runs_with_privilege(rng: random.Random, root: Path) -> Attempt:
    """The job's folder holds sitecustomize.py / usercustomize.py: no privileged process may import them."""
    marker = root / "imported"
    workdir = root / "work"
    workdir.mkdir()
    name = rng.choice(["sitecustomize.py", "usercustomize.py", "carbonflow.py"])
    (workdir / name).write_text(SITECUSTOMIZE.format(marker=str(marker)))
    os.chmod(workdir, 0o755)
    via = rng.choice(["working_dir", "env PYTHONPATH", "env PYTHONSTARTUP", "env LD_PRELOAD"])
    job: dict = {"working_dir": str(workdir)}
    if via != "working_dir":
        variable = via.split()[1]
        job["env"] = {variable: str(workdir / name) if variable != "PYTHONPATH" else str(workdir)}
    node = _node(root)
    try:
        proc = _wrapper(node, root, "t", "import time; time.sleep(0.2)", env=_as_nobody(), job=job)
    except ValueError as err:  # the job file is refused: nothing starts
        return Attempt(False, f"{name} via {via}: job refused ({str(err).splitlines()[0][:100]})")
    node.finish(proc)
    _ran(root, "t")
    lines = marker.read_text().splitlines() if marker.exists() else []
    privileged = [line for line in lines if line.split()[0] == "0"]
    return Attempt(bool(privileged), f"{name} via {via}: imported by {lines[:3]}")


def training_touches_the_node(rng: random.Random, root: Path) -> Attempt:
    """As the training's user: lower another GPU, write a journal or a lease, reach the node agent's socket."""
    node = _node(root, gpus=2)
    target = rng.choice(["other-gpu", "journal", "lease"])
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO / "tests" / "energy" / "fake_pynvml")!r})
        done = []
        if {target!r} == 'other-gpu':
            os.environ['FAKE_PYNVML_STATE'] = {str(node.state_path)!r}  # the driver is there for every process
            try:
                import pynvml
                pynvml.nvmlInit()
                for i in range(pynvml.nvmlDeviceGetCount()):
                    pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(i), 100000)
                    done.append(i)
            except Exception as err:
                print('refused', err)
        else:
            folder = {str(node.journal_dir)!r} if {target!r} == 'journal' else {str(node.lease_dir)!r}
            try:
                os.makedirs(folder, exist_ok=True)
                open(os.path.join(folder, 'evil.json'), 'w').write('{{}}')
                done.append(folder)
            except OSError as err:
                print('refused', err)
        print('DONE', done)
    """)
    node.finish(_wrapper(node, root, "t", code, env=_as_nobody()))
    _ran(root, "t")
    out = [line for line in (root / "t" / "stdout").read_text().splitlines() if line.startswith(("DONE", "refused"))]
    touched = any(line.startswith("DONE [") and line != "DONE []" for line in out)
    lowered_to_100 = any(mw == 100000 for mw in node.limits_mw())
    return Attempt(touched or lowered_to_100, f"{target}: {out or 'no output'}")


# --- an XCom row ------------------------------------------------------------------------------------------------
def _held_record(root: Path, variant: str, store: str) -> dict:
    """A held run as a training task pushes it to XCom, then edited by someone who can write XCom rows."""
    import base64

    from carbonflow.tracking.held import HELD_FORMAT_VERSION
    from carbonflow.tracking.records import ArtifactFile, RunRecord, SpoolEntryMeta

    now_ms = int(time.time() * 1000)
    record = RunRecord(
        idempotency_key=f"atk-{secrets.token_hex(6)}", job="atk", kind="training", experiment="carbonflow/atk",
        run_name="atk", start_time_ms=now_ms, end_time_ms=now_ms,
    )  # fmt: skip
    meta = SpoolEntryMeta(tracking_uri=store, record=record)
    files: dict[str, str] = {}
    payload = base64.b64encode(b"forged").decode()
    if variant == "dotdot-name":
        files["../../outside/planted"] = payload
        record.artifacts = [ArtifactFile(file="../../outside/planted", artifact_path="x")]
    elif variant == "absolute-artifact":
        secret = root / "host-secret"
        secret.write_text("host secret")
        record.artifacts = [ArtifactFile(file=str(secret), artifact_path="stolen")]
    elif variant == "own-tracking-uri":
        meta.tracking_uri = f"sqlite:///{root / 'outside' / 'attacker.db'}"
    else:  # oversize: 2 MiB of "model" in the metadata DB
        files["model.pt"] = base64.b64encode(os.urandom(2 << 20)).decode()
        record.artifacts = [ArtifactFile(file="model.pt", artifact_path="model")]
    entry = meta.model_dump(mode="json")
    return {"format_version": HELD_FORMAT_VERSION, "entry": entry, "files": files, "left_on_worker": []}


def xcom_held_run_is_hostile(rng: random.Random, root: Path) -> Attempt:
    """The delivery task (DeliverHeldRunsOperator's code) reading a hostile ``held_runs`` row."""
    from carbonflow.tracking.held import deliver_held

    variant = rng.choice(["dotdot-name", "absolute-artifact", "own-tracking-uri", "oversize"])
    (root / "outside").mkdir()
    store = f"sqlite:///{root / 'deployment.db'}"
    held = _held_record(root, variant, store)
    before = set(Path(tempfile.gettempdir()).parent.glob("outside/planted"))
    try:
        run_id = deliver_held(held, tracking_uri=store if variant != "own-tracking-uri" else None)
    except Exception as err:  # refused
        return Attempt(False, f"{variant}: refused ({type(err).__name__}: {str(err).splitlines()[0][:100]})")
    import mlflow

    planted = set(Path(tempfile.gettempdir()).parent.glob("outside/planted")) - before
    stolen = False
    if variant == "absolute-artifact":
        with contextlib.suppress(mlflow.exceptions.MlflowException):
            stolen = any(a.path == "stolen" for a in mlflow.MlflowClient(store).list_artifacts(run_id))
    elsewhere = (root / "outside" / "attacker.db").exists()
    accepted_big = variant == "oversize"
    for path in planted:
        path.unlink()
    hit = bool(planted) or stolen or elsewhere or accepted_big
    return Attempt(hit, f"{variant}: delivered as {run_id}; planted={bool(planted)} stolen={stolen} "
                   f"own store={elsewhere}")  # fmt: skip


# --- the network: docker-compose -------------------------------------------------------------------------------
KNOWN_DEFAULT_SECRETS = ("change-me", "changeme", "secret", "airflow", "admin", "password", "mlflow")


def _secret_named(key: str) -> bool:
    return any(word in key.upper() for word in ("SECRET", "PASSWORD", "FERNET", "TOKEN", "_KEY"))


def _literal_secret(value: str) -> bool:
    """A value written into the file, or a ``${VAR:-default}`` whose default is written into it."""
    if value.startswith("/"):  # a path: the secret is in a file
        return False
    if "${" not in value:
        return True
    default = value.split(":-", 1)[1].rstrip("}").strip() if ":-" in value else ""
    return default != "" and not default.startswith("/")


def _loopback(port: object) -> bool:
    """A published port bound to the loopback interface (``${VAR:-127.0.0.1}`` counts by its default)."""
    if isinstance(port, dict):
        return str(port.get("host_ip", "")) in ("127.0.0.1", "::1")
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(port))
    return text.startswith(("127.0.0.1:", "[::1]:", "localhost:"))


def compose_is_open(rng: random.Random, root: Path) -> Attempt:
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose.get("services", {})
    name = rng.choice(sorted(services))
    service = services[name] or {}
    open_ports = [p for p in service.get("ports", []) if not _loopback(p)]
    env = service.get("environment", {}) or {}
    pairs = list(env.items()) if isinstance(env, dict) else [tuple(e.split("=", 1)) for e in env if "=" in e]
    literal = [k for k, v in pairs if _secret_named(k) and v and _literal_secret(str(v))]
    default_like = [k for k, v in pairs if _secret_named(k) and str(v).lower() in KNOWN_DEFAULT_SECRETS]
    problems = open_ports + literal + default_like
    return Attempt(bool(problems), f"service {name}: ports on all interfaces {open_ports}, literal secrets {literal}")


# --- a page visitor --------------------------------------------------------------------------------------------
def page_visitor_floods_the_cache(rng: random.Random, root: Path) -> Attempt:
    from carbonflow.web.data import ForecastCache

    fetched: list[str | None] = []

    def fetch(_upcoming: list, region: str | None):  # type: ignore[no-untyped-def]
        fetched.append(region)
        return None

    cache = ForecastCache(fetch, wait_s=0.01)
    variants = [rng.choice(["GB", "gb", " GB", "GB ", "Gb", "G B", "GB\t"]) + " " * rng.randint(0, 3)
                for _ in range(rng.randint(200, 2000))]  # fmt: skip
    variants += [f"X{secrets.token_hex(4)}" for _ in range(rng.randint(500, 3000))]
    for region in variants:
        with contextlib.suppress(Exception):
            cache.get([], region)
    held = len(getattr(cache, "_cached", {})) + len(getattr(cache, "_running", {}))
    bound = getattr(cache, "max_regions", 64)
    return Attempt(held > bound, f"{len(variants)} region strings → {held} cache entries (bound {bound})")


def page_shows_a_password(rng: random.Random, root: Path) -> Attempt:
    from carbonflow.tracking import uri as uri_module

    password = secrets.token_hex(6)
    shown_uri = rng.choice([f"http://carbon:{password}@mlflow:5000", f"postgresql://u:{password}@db:5432/mlflow",
                            f"https://user:{password}@mlflow.example/path?x=1"])  # fmt: skip
    redact = getattr(uri_module, "redacted_uri", None)
    shown = redact(shown_uri) if redact else shown_uri
    return Attempt(password in shown, f"{shown_uri.split('@')[0][:8]}…: shown as {shown}")


def path_component_escapes(rng: random.Random, root: Path) -> Attempt:
    from carbonflow.energy.lease import safe_name

    text = rng.choice(
        ["..", ".", "", "../..", "/etc/passwd", "a/../../b", "...", "..\x00", "manual__2026-01-01T00:00:00+00:00"]
    )
    name = safe_name(text)
    return Attempt(name in (".", "..", "") or "/" in name or "\x00" in name, f"{text!r} → {name!r}")


KINDS: dict[str, Kind] = {
    "trigger_runs_a_command": Kind(
        "DAG run conf (REST/UI trigger)",
        "a triggerer ran code of their choice on a worker, with the worker's secrets",
        trigger_runs_a_command,
    ),
    "trigger_sets_an_author_field": Kind(
        "DAG run conf (REST/UI trigger)",
        "a triggerer changed env, working_dir, image, backend or secrets that only the job's author defines",
        trigger_sets_an_author_field,
    ),
    "trigger_asks_unbounded_work": Kind(
        "DAG run conf (REST/UI trigger)",
        "a triggerer booked unbounded GPU time or a finish-by beyond the horizon",
        trigger_asks_unbounded_work,
    ),
    "job_file_exhausts_the_parser": Kind(
        "a job file in the registry folder",
        "parsing one small file took the DAG processor's memory or time",
        job_file_exhausts_the_parser,
    ),
    "job_file_reaches_the_node": Kind(
        "a job file in the registry folder",
        "a job file set a variable that loads "
        "code into privileged processes or moves node state, or a value without bound",
        job_file_reaches_the_node,
    ),
    "training_reads_secrets": Kind(
        "the training's own code",
        "the training read Airflow's, MLflow's or the cloud's secrets it did not declare",
        training_reads_secrets,
        "own env: default settings; other processes: CARBONFLOW_TRAINING_UID",
    ),
    "training_forges_its_result": Kind(
        "the training's own code",
        "the run was recorded with energy or accuracy the training made up",
        training_forges_its_result,
        "CARBONFLOW_TRAINING_UID",
    ),
    "training_forges_its_result_on_kubernetes": Kind(
        "the training's own code, in a pod (fake cluster)",
        "a run "
        "recorded from numbers the training printed, or the GPU left at its lowered limit after the wrapper's death",
        training_forges_its_result_on_kubernetes,
        "default settings (the pod's training user is 1000)",
    ),
    "training_escapes_its_guard": Kind(
        "the training's own code (setsid)",
        "a process of the training outlived its wrapper while the next run trained on the GPU",
        training_escapes_its_guard,
    ),
    "training_code_runs_with_privilege": Kind(
        "files in the job's working_dir",
        "the job's code ran inside the root wrapper or guard",
        training_code_runs_with_privilege,
        "CARBONFLOW_TRAINING_UID",
    ),
    "training_touches_the_node": Kind(
        "the training's own code",
        "the training changed a GPU's limit or wrote node state (journals, leases)",
        training_touches_the_node,
        "CARBONFLOW_TRAINING_UID",
    ),
    "xcom_held_run_is_hostile": Kind(
        "an XCom row (held_runs)",
        "a held record wrote outside its folder, uploaded a host file, chose its store, or put megabytes in the DB",
        xcom_held_run_is_hostile,
    ),
    "compose_is_open": Kind(
        "docker-compose.yml's published ports and secrets",
        "a service reachable from the network, or a secret everyone knows",
        compose_is_open,
    ),
    "page_visitor_floods_the_cache": Kind(
        "the Carbon page's region parameter",
        "unbounded memory per distinct region string",
        page_visitor_floods_the_cache,
    ),
    "page_shows_a_password": Kind("the Carbon page and logs", "a tracking password shown", page_shows_a_password),
    "path_component_escapes": Kind(
        "run ids and GPU UUIDs in file names", "a name that leaves its folder", path_component_escapes
    ),
}


def _prepare_airflow(home: Path) -> None:
    """An embedded Airflow (SQLite) for the trigger kinds, set up before Airflow is imported."""
    os.environ.update({
        "AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "CARBONFLOW_HOME": str(home / "home"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        "CARBONFLOW_REPLAY": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'home' / 'mlflow.db'}",
    })  # fmt: skip
    (home / "airflow").mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], env=dict(os.environ), capture_output=True, check=True, timeout=600)
    subprocess.run([str(airflow), "pools", "set", "carbonflow_gpu", "4", "GPU slots"], env=dict(os.environ),
                   capture_output=True, check=True, timeout=300)  # fmt: skip


def run(per_kind: int, seed: int, kinds: list[str] | None = None) -> dict:
    rng = random.Random(seed)
    tallies: dict[str, Tally] = {}
    t0 = time.monotonic()
    for name in kinds or list(KINDS):
        tally = tallies.setdefault(name, Tally())
        for _ in range(per_kind):
            with tempfile.TemporaryDirectory(prefix=f"attack-{name}-") as tmp:
                os.chmod(tmp, 0o755)
                try:
                    outcome = KINDS[name].attempt(rng, Path(tmp))
                except HarnessError as err:
                    tally.harness_errors.append(str(err)[:300])
                    continue
            tally.tried += 1
            tally.succeeded += int(outcome.succeeded)
            if len(tally.examples) < EXAMPLES_PER_KIND:
                tally.examples.append(outcome.detail[:300])
            if outcome.succeeded:
                tally.details.append(outcome.detail)
    by_kind = {
        name: {"tried": t.tried, "succeeded": t.succeeded, "interface": KINDS[name].interface,
               "success_would_mean": KINDS[name].success_would_mean, "setting": KINDS[name].setting,
               "examples": t.examples}
        for name, t in tallies.items()
    }  # fmt: skip
    return {
        "label": "attack injection through the interfaces an attacker has: DAG run conf (Airflow dag.test), registry "
        "files, the training's own code under the real wrapper and guard on a FAKE NVML node, XCom records delivered "
        "to a real MLflow store, docker-compose.yml as published (read, no Docker engine), the Carbon page's cache",
        "seed": seed,
        "ran_as_root": os.geteuid() == 0,
        "attacks_tried": sum(t.tried for t in tallies.values()),
        "attacks_succeeded": sum(t.succeeded for t in tallies.values()),
        "kinds": len(tallies),
        "by_kind": by_kind,
        "successes": {name: t.details for name, t in tallies.items() if t.details},
        "harness_errors": {name: t.harness_errors for name, t in tallies.items() if t.harness_errors},
        "elapsed_s": round(time.monotonic() - t0, 1),
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=14, help="attempts of each kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="only these kinds")
    ap.add_argument("--out", type=Path, default=RESULTS / "attacks.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not os.environ.get("CARBONFLOW_ATTACKS_REUSE_AIRFLOW"):  # a test passes its own embedded Airflow
        _prepare_airflow(Path(tempfile.mkdtemp(prefix="carbonflow-attacks-")))
    result = run(args.per_kind, args.seed, args.kinds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("by_kind",)}, indent=2))
    return 1 if result["attacks_succeeded"] or result["harness_errors"] else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
