"""Fault injection on a fake GPU node: does carbonflow ever leave a GPU power-limited, double-book one, or
lose or duplicate a run?

Each injection runs the real ``carbonflow run`` wrapper (and ``python -m carbonflow.energy.power_limit
restore``) on a **fake** NVML node — tests/energy/fake_pynvml, several GPUs with UUIDs, per-process
privilege — with a **fake** zeusd acting on the same driver state (tests/fakes). Node size, power limits
and the moment of each fault are drawn at random (``--seed``). After each fault the node is left as
production would leave it, and **only what a node runs repairs it**: the next wrapper on the GPU, the node
agent's ``python -m carbonflow.energy.power_limit restore``, or on Kubernetes the restore pod (or the command
the run's error names) — after a wrapper SIGKILL one of them, drawn at random, never both and never a repair
function called by this harness.

Counted per injection:

* ``power_limits_left_lowered`` — GPUs not back at the limit they had before carbonflow touched them;
* ``gpus_double_booked`` — pairs of trainings (of different runs or co-location groups) alive on one GPU at
  the same time, from the spans and heartbeats the trainings write; measured in the kinds listed under
  ``double_booking_measured_in``: racing wrappers sharing one lease folder, racing wrappers of separate
  ``CARBONFLOW_HOME``s with the default lease settings (``CARBONFLOW_NODE_DIR``: one temporary folder per
  simulated node), a rank that left the training's session (forked, or started torchrun-like) outliving a
  SIGKILLed wrapper while the retry trains, and two Kubernetes co-located pairs on one time-sliced GPU;
* ``runs_lost`` — a run the fault did not target that ended without its result;
* ``runs_duplicated`` — a training still alive when its retry started, a retry that trained again, or a run
  logged to MLflow twice.

The run-record kinds log a training run the way the session does (``log_training_run`` with the Airflow
run's idempotency key) while MLflow refuses connections or hangs (then the spool is replayed with
``replay_spool``, what ``carbonflow spool replay`` runs, into the store that stands for the recovered server),
after the worker that trained is gone (the record delivered from XCom with ``deliver_held``, what the delivery
task runs), on a task retry (the session's ``already_logged`` decides whether the retry trains again) and on
a DAG run cleared with Airflow's own clear and run again (benchmarks/faults_cleared_dag.py), into one real
MLflow store (SQLite, shared by the injections): a run that never arrives is lost, one trained or logged twice
is duplicated.

The report also gives ``faults_injected``, ``distinct_paths`` (distinct kind × variant pairs exercised, defined
in the report), ``ran_as_root`` (the journal attacks by the pod's own user need root) and, per counter, the
kinds where it rose above 0.

Run: ``python benchmarks/faults.py [--per-kind 20] [--seed 0] [--kinds ...] [--sample N]`` →
benchmarks/results/faults.json. tests/energy/test_faults_benchmark.py runs small samples and, for each counter,
breaks the guarantee it measures (a lease that always succeeds, a restore that does nothing, a dropped spool
write, a broken ``completed_run``, a key blind to the clear number) to show the counter rises above 0. The
Kubernetes kinds run the **fake** Kubernetes API (tests/kubernetes: pods terminate over their grace period) on a
**fake** GPU node whose training pods run the real wrapper on a random host GPU (seen as GPU 0 in the pod) and
whose restore pods run the real restore script and command through the fake zeusd.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from tests.fakes.fake_zeusd import serve_fake_zeusd  # noqa: E402
from tests.fakes.node import FakeNode, alive, started, training, wait_for  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


COUNTERS = ("power_limits_left_lowered", "gpus_double_booked", "runs_lost", "runs_duplicated")


@dataclass
class FaultOutcome:
    power_limits_left_lowered: int = 0
    gpus_double_booked: int = 0
    runs_lost: int = 0
    runs_duplicated: int = 0
    variant: str = ""  # the branch this injection took (see DISTINCT_PATHS); "" for a kind with one path
    detail: str = ""  # why a counter rose (e.g. the end of a failed wrapper's stderr), for the report

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}

    def add(self, other: FaultOutcome) -> None:
        for name, value in other.counts().items():
            setattr(self, name, getattr(self, name) + value)


def _node(rng: random.Random, root: Path) -> FakeNode:
    return FakeNode(root, gpus=rng.randint(1, 4), limit_mw=rng.choice([250000, 280000, 300000]))


def _limit(rng: random.Random) -> float:
    return float(rng.choice([150, 175, 200, 225]))


def _kill_all(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _signal_wrapper(sig: int) -> Callable[[random.Random, Path], FaultOutcome]:
    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        node = _node(rng, root)
        proc = node.wrapper("w", _limit(rng), training(root / "t"))
        child = started(root / "t")
        time.sleep(rng.uniform(0.0, 0.5))
        proc.send_signal(sig)
        proc.wait(timeout=60)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not alive(child), timeout_s=15)
        out = FaultOutcome(runs_duplicated=int(alive(child)))
        _kill_all(child)
        if sig == signal.SIGKILL:  # uncatchable: ONE of what a node runs next repairs it, never the harness
            out.variant = rng.choice(REPAIRS_AFTER_SIGKILL)
            _node_repairs(node, out.variant)
        out.power_limits_left_lowered = node.lowered()
        return out

    return inject


REPAIRS_AFTER_SIGKILL = ("next_wrapper_on_the_gpu", "restore_cli_of_the_node_agent")


def _node_repairs(node: FakeNode, how: str) -> None:
    """What a node runs after a wrapper died by SIGKILL: the next ``carbonflow run`` (asking for no limit), or
    the node agent's ``python -m carbonflow.energy.power_limit restore`` — each alone, so each is measured."""
    if how == "next_wrapper_on_the_gpu":
        node.finish(node.wrapper("next", None, ["true"]))
    else:
        node.restore_cli()


def _signal_child(sig: int, grandchild: bool = False) -> Callable[[random.Random, Path], FaultOutcome]:
    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        node = _node(rng, root)
        proc = node.wrapper("w", _limit(rng), training(root / "t", grandchild=grandchild))
        child = started(root / "t")
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(child, sig)
        node.finish(proc)
        lost = int(not (root / "w" / "result.json").exists())  # the wrapper must report the killed training
        return FaultOutcome(power_limits_left_lowered=node.lowered(), runs_lost=lost)

    return inject


def wrapper_sigkill_with_grandchild(rng: random.Random, root: Path) -> FaultOutcome:
    """kill -9 of the wrapper while its training has a worker process; then the retry runs."""
    node = _node(rng, root)
    first = node.wrapper("first", _limit(rng), training(root / "t", grandchild=True))
    child = started(root / "t")
    grandchild = int((root / "t.grandchild").read_text())
    time.sleep(rng.uniform(0.0, 0.5))
    first.kill()
    first.wait(timeout=10)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not alive(child) and not alive(grandchild), timeout_s=15)
    duplicated = int(alive(child) or alive(grandchild))
    retry = node.wrapper("retry", _limit(rng), training(root / "r", seconds=0.2))
    code, err = node.finish(retry)
    _kill_all(child, grandchild)
    return FaultOutcome(power_limits_left_lowered=node.lowered(), runs_duplicated=duplicated, runs_lost=int(code != 0),
                        detail=_failed(code, err))  # fmt: skip


def _failed(code: int, stderr: str) -> str:
    """A failed wrapper's exit code and the end of its stderr ('' when it succeeded)."""
    return "" if code == 0 else f"exit {code}: {stderr.strip()[-400:]}"


def two_wrappers_racing(rng: random.Random, root: Path) -> FaultOutcome:
    """Runs started together on a node with fewer free GPUs than runs (one lease folder): none may share a GPU."""
    node = FakeNode(root, gpus=rng.randint(1, 2))
    return _race(rng, node, root, homes=False)


class DefaultLeaseNode(FakeNode):
    """A node whose wrappers keep carbonflow's default lease and journal places: neither
    ``CARBONFLOW_GPU_LEASE_DIR`` nor ``CARBONFLOW_POWER_JOURNAL_DIR`` is set, only ``CARBONFLOW_NODE_DIR`` — one
    temporary folder per simulated node (never a home), standing in for the node's fixed default."""

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env()
        for name in ("CARBONFLOW_GPU_LEASE_DIR", "CARBONFLOW_POWER_JOURNAL_DIR"):
            env.pop(name, None)
        env["CARBONFLOW_NODE_DIR"] = str(self.root / "node")
        env.update(extra)
        return env


def separate_homes_racing(rng: random.Random, root: Path) -> FaultOutcome:
    """Two workers of one node, each with its own CARBONFLOW_HOME and the default lease settings, start runs
    together on fewer free GPUs than runs: none may share a GPU (nor leave one lowered)."""
    node = DefaultLeaseNode(root, gpus=rng.randint(1, 2))
    return _race(rng, node, root, homes=True)


def _race(rng: random.Random, node: FakeNode, root: Path, *, homes: bool) -> FaultOutcome:
    n = len(node.uuids()) + 1
    procs = []
    for i in range(n):
        home = {"CARBONFLOW_HOME": str(root / f"home{i}")} if homes else {}
        procs.append(node.wrapper(f"r{i}", _limit(rng), training(root / f"t{i}", seconds=0.6),
                                  CARBONFLOW_GPU_WAIT_S="30", **home))  # fmt: skip
    ends = [node.finish(p, timeout_s=120) for p in procs]
    codes = [code for code, _ in ends]
    spans = [_spans(root / f"t{i}.span") for i in range(n)]
    booked = sum(
        1
        for i in range(n)
        for j in range(i + 1, n)
        if spans[i] and spans[j] and spans[i][0] == spans[j][0] and _overlap(spans[i][1], spans[j][1])
    )
    return FaultOutcome(power_limits_left_lowered=node.lowered(), gpus_double_booked=booked,
                        runs_lost=sum(c != 0 for c in codes), variant=f"{n} runs on {n - 1} GPU(s)",
                        detail=" | ".join(_failed(code, err) for code, err in ends if code != 0))  # fmt: skip


RANK_LIVE_S = 4.0
RANK_TRAINING = """
import os, subprocess, sys, time
beats, how, live_s = sys.argv[1], sys.argv[2], float(sys.argv[3])


def rank():
    end = time.time() + live_s
    while time.time() < end:
        with open(beats, "a") as f:
            f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "") + " " + repr(time.time()) + chr(10))
        time.sleep(0.05)


if how == "rank":  # started by the agent below, torchrun-like
    rank()
    sys.exit(0)
if how == "fork":  # os.fork, then os.setsid: the rank keeps every descriptor of the agent
    pid = os.fork()
    if pid == 0:
        os.setsid()
        rank()
        os._exit(0)
else:  # as torchrun starts its ranks: subprocess in a new session, descriptors closed
    pid = subprocess.Popen([sys.executable, __file__, beats, "rank", str(live_s)], start_new_session=True).pid
open(beats + ".pid", "w").write(str(pid))
while True:
    time.sleep(0.2)
"""


def _rank_in_own_session(how: str) -> Callable[[random.Random, Path], FaultOutcome]:
    """A torchrun-like training whose rank leaves the training's session (``setsid``) and keeps training on the
    GPU; the wrapper is SIGKILLed and the retry starts at once. Double-booked when the retry trains on the GPU
    while the rank still lives (the rank's heartbeats fall inside the retry's training)."""

    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        node = FakeNode(root, gpus=rng.randint(1, 2))
        script, beats = root / "agent.py", root / "rank.beats"
        script.write_text(RANK_TRAINING)
        first = node.wrapper("first", _limit(rng), [sys.executable, str(script), str(beats), how, str(RANK_LIVE_S)])
        rank = started(Path(f"{beats}.pid"))
        wait_for(beats.exists)
        time.sleep(rng.uniform(0.0, 0.3))
        first.kill()
        first.wait(timeout=10)
        retry = node.wrapper("retry", _limit(rng), training(root / "r", seconds=0.5), CARBONFLOW_GPU_WAIT_S="30")
        code, err = node.finish(retry, timeout_s=90)
        booked = _beats_inside(beats, _spans(root / "r.span"))
        _kill_all(rank)
        return FaultOutcome(power_limits_left_lowered=node.lowered(), gpus_double_booked=booked,
                            runs_lost=int(code != 0), variant=how, detail=_failed(code, err))  # fmt: skip

    return inject


def _beats_inside(beats: Path, span: tuple[str, tuple[float, float]] | None) -> int:
    """1 when a heartbeat of the rank on the span's GPU falls inside the span (both trained at once), else 0."""
    if span is None or not beats.exists():
        return 0
    gpu, (start, end) = span
    for line in beats.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == gpu and start <= float(parts[1]) <= end:
            return 1
    return 0


def _spans(path: Path) -> tuple[str, tuple[float, float]] | None:
    if not path.exists():
        return None
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return lines[0][0], (float(lines[0][1]), float(lines[-1][1]))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _restore(through_zeusd: bool) -> Callable[[random.Random, Path], FaultOutcome]:
    """A crashed run's journal on an unprivileged node: restore with zeusd works; without it must fail loudly."""

    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        node = _node(rng, root)
        index = rng.randrange(len(node.uuids()))
        node.leave_lowered(index, int(_limit(rng) * 1000))
        if not through_zeusd:
            refused = node.restore_cli(FAKE_NVML_UNPRIVILEGED="1")
            silent = refused.returncode == 0  # a refused restore that reports success would hide a low limit
            node.restore_cli()  # the journal was kept: a privileged restore (the node agent) repairs it
            return FaultOutcome(power_limits_left_lowered=node.lowered() + int(silent))
        sock = root / "zeusd.sock"
        with serve_fake_zeusd(node.state_path, sock):
            node.restore_cli(FAKE_NVML_UNPRIVILEGED="1", ZEUSD_SOCK_PATH=str(sock))
        return FaultOutcome(power_limits_left_lowered=node.lowered())

    return inject


def _stale_journal(format_version: int) -> Callable[[random.Random, Path], FaultOutcome]:
    """A crashed run's journal (this format or 0.1.0's); the next run on the GPU asks for no limit at all."""

    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        node = FakeNode(root, gpus=1)
        node.leave_lowered(0, int(_limit(rng) * 1000), format_version=format_version)
        code, err = node.finish(node.wrapper("next", None, ["true"]))
        return FaultOutcome(power_limits_left_lowered=node.lowered(), runs_lost=int(code != 0),
                            detail=_failed(code, err))  # fmt: skip

    return inject


_STORE: dict[str, str] = {}


def _store() -> str:
    """One real MLflow store for every run-record injection (each injection uses its own job name)."""
    if "uri" not in _STORE:
        folder = Path(tempfile.mkdtemp(prefix="faults-mlflow-"))
        _STORE["uri"] = f"sqlite:///{folder / 'mlflow.db'}"
    return _STORE["uri"]


def _runs_with_key(uri: str, job: str, key: str) -> int:
    from carbonflow.tracking import schema
    from carbonflow.tracking.store import client_for, search_all_runs, tag_filter

    client = client_for(uri)
    experiment = client.get_experiment_by_name(schema.experiment_name(job))
    if experiment is None:
        return 0
    return len(search_all_runs(client, [experiment.experiment_id], tag_filter(schema.T_IDEMPOTENCY_KEY, key)))


def _counted(uri: str, job: str, keys: list[str]) -> FaultOutcome:
    counts = [_runs_with_key(uri, job, key) for key in keys]
    return FaultOutcome(runs_lost=sum(c == 0 for c in counts), runs_duplicated=sum(c > 1 for c in counts))


def _log(job: str, key: str, uri: str, spool: Path, files: Path) -> object:
    """Log one training run as the session does, with the Airflow run's idempotency key."""
    from carbonflow.tracking.logger import log_training_run
    from tests.tracking import tracking_factories as f

    trace = files / "trace.csv"
    trace.write_text("time_s,device,power_w\n0.0,GPU-0aa1,151.2\n1.0,GPU-0aa1,183.9\n")
    return log_training_run(f.job_spec(job), f.plan(job), f.result(job), power_trace_csv=trace, tracking_uri=uri,
                            spool_dir=spool, idempotency_key=key)  # fmt: skip


def _key(job: str, clear_number: int = 0) -> str:
    from carbonflow.tracking.spool import run_idempotency_key

    return run_idempotency_key("nightly_retrain", "scheduled__2026-11-24T19:00:00+00:00", clear_number, "train", 0, job)


def _refusing_uri() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed again: connections are refused


@contextlib.contextmanager
def _hanging_uri():  # type: ignore[no-untyped-def]
    """An HTTP 'server' that accepts connections and never answers."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def _outage(hanging: bool) -> Callable[[random.Random, Path], FaultOutcome]:
    """MLflow refuses connections (or hangs) while the run is logged; later the spool is replayed to it."""

    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        from carbonflow.tracking.spool import replay_spool

        job, store = f"outage-{rng.getrandbits(32):08x}", _store()
        with _hanging_uri() if hanging else contextlib.nullcontext(_refusing_uri()) as down:
            outcome = _log(job, _key(job), down, root / "spool", root)
        if not getattr(outcome, "spooled", False):
            return FaultOutcome(runs_lost=1)
        replay_spool(store, root=root / "spool", all_targets=True)
        replay_spool(store, root=root / "spool", all_targets=True)  # a second replay must not duplicate
        return _counted(store, job, [_key(job)])

    return inject


def trainer_gone_before_logging(rng: random.Random, root: Path) -> FaultOutcome:
    """MLflow down, then the worker that trained is gone with its spool: the record held in XCom is delivered."""
    import shutil

    from carbonflow.tracking.held import deliver_held, hold_run

    job, store = f"gone-{rng.getrandbits(32):08x}", _store()
    outcome = _log(job, _key(job), _refusing_uri(), root / "spool", root)
    held = json.loads(json.dumps(hold_run(outcome.model_dump(mode="json"))))  # type: ignore[attr-defined]
    shutil.rmtree(root / "spool")
    deliver_held(held, store)
    if rng.random() < 0.5:
        deliver_held(held, store)  # the delivering task retried after a lost reply
    return _counted(store, job, [_key(job)])


def task_retried_after_logging(rng: random.Random, root: Path) -> FaultOutcome:
    """The task trained and logged its run, then died before Airflow heard; Airflow retries it. The retry asks
    what the session asks before training (``RunSession.already_logged``, through ``completed_run``) and trains
    again only when told the run is not there: a second training, or a second MLflow run, is a duplicate."""
    from carbonflow.session.run import RunSession
    from carbonflow.session.source import CarbonSource

    job, store = f"retry-{rng.getrandbits(32):08x}", _store()
    key = _key(job)
    trainings = 1  # the first try trained, logged, and died before Airflow heard of it
    _log(job, key, store, root / "spool", root)
    retry = RunSession(source=CarbonSource(replay=True), workdir=root / "retry", tracking_uri=store,
                       identity=lambda name: {"idempotency_key": key})  # fmt: skip
    if retry.already_logged(_wait_state(job)) is None:
        trainings += 1  # the retry trains again, and logs what it trained
        _log(job, key, store, root / "spool", root)
    out = _counted(store, job, [key])
    out.runs_duplicated = max(out.runs_duplicated, int(trainings > 1))
    return out


def _wait_state(job: str) -> object:
    """The retried task's group: the job alone, as its wait state holds it."""
    from carbonflow.domain import utcnow
    from carbonflow.session.state import GroupMember, WaitState
    from tests.tracking import tracking_factories as f

    return WaitState(members=[GroupMember(job=f.job_spec(job), plan=f.plan(job))], first_now=utcnow())


_AIRFLOW: dict[str, dict[str, str]] = {}


def _airflow_env() -> dict[str, str]:
    """An Airflow of the benchmark's own for the cleared-DAG-run kind: a temporary AIRFLOW_HOME whose DAGs folder
    holds only benchmarks/faults_cleared_dag.py's DAG, with a SQLite metadata DB migrated once per benchmark run."""
    if "env" not in _AIRFLOW:
        from faults_cleared_dag import write_dag

        home = Path(tempfile.mkdtemp(prefix="faults-airflow-"))
        write_dag(home / "dags")
        env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        airflow = Path(sys.executable).with_name("airflow")
        done = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed: {done.stderr[-2000:]}")
        _AIRFLOW["env"] = env
    return _AIRFLOW["env"]


def dag_run_cleared(rng: random.Random, root: Path) -> FaultOutcome:
    """A DAG run trains and logs its job, is cleared with Airflow's own clear and runs again, 1–2 times
    (benchmarks/faults_cleared_dag.py, real Airflow). Each clear is a new run: its own key, one new MLflow run,
    the earlier runs kept. A clear number whose run is missing is lost; a key trained or logged twice,
    duplicated."""
    from carbonflow.tracking.spool import run_idempotency_key

    job, store, clears = f"cleared-{rng.getrandbits(32):08x}", _store(), rng.randint(1, 2)
    env = {**_airflow_env(), "FAULTS_JOB": job, "FAULTS_STORE": store, "FAULTS_TRAININGS": str(root)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "faults_cleared_dag.py"), "--clears",
                           str(clears)], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"dag_id"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the cleared DAG run did not run (exit {done.returncode}): {done.stderr[-3000:]}")
    report = json.loads(lines[-1])
    run_id = report["runs"][0]["run_id"]
    keys = [run_idempotency_key(report["dag_id"], run_id, n, report["task_id"], -1, job) for n in range(clears + 1)]
    out = _counted(store, job, keys)
    trained = (root / "trainings").read_text().split() if (root / "trainings").exists() else []
    out.runs_duplicated = max(out.runs_duplicated, len(trained) - len(set(trained)))
    out.variant = f"cleared {clears} time(s)"
    return out


sys.path.insert(0, str(REPO / "tests" / "kubernetes"))  # the fake Kubernetes API and fake GPU node


@contextlib.contextmanager
def _cluster(rng: random.Random, max_gpus: int = 4):  # type: ignore[no-untyped-def]
    """A fake GPU node of 1–``max_gpus`` GPUs at a random limit, whose device plugin gives every GPU pod one random
    host GPU (the same one), its fake zeusd, and the fake Kubernetes API (pods terminate over their grace period)
    with the real backend. Yields (node, zeusd, api, backend, host GPU index)."""
    from fake_gpu_node import FakeGpuNode
    from fake_kube_api import FakeKubeApi

    from carbonflow.execution.k8s_manifests import KubernetesSettings
    from carbonflow.execution.kubernetes import KubernetesBackend

    gpus = rng.randint(1, max_gpus)
    host_gpu = rng.randrange(gpus)
    with (
        FakeGpuNode(gpus, gpus_for=lambda pod: [host_gpu], limit_mw=rng.choice([250000, 280000, 300000])) as node,
        node.zeusd() as zeusd,
        FakeKubeApi(node.training) as api,
    ):
        api.restore_behaviour = _restore_pod(node, node.journal_dir, node.socket)
        kubeconfig = api.write_kubeconfig(node.base / "kubeconfig.json")
        backend = KubernetesBackend(KubernetesSettings(namespace="ml"), config_file=str(kubeconfig),
                                    poll_interval_s=0.02, restore_timeout_s=60)  # fmt: skip
        yield node, zeusd, api, backend, host_gpu


def _restore_pod(node: object, host_dir: Path, sock: Path | None) -> Callable[..., object]:
    """The restore pod as the node runs it: the real script and restore command, through zeusd (replaceable, so
    that a test can show a restore pod that does nothing is counted)."""
    return node.restore  # type: ignore[attr-defined]


def _gpu_run(limit_w: float, command: list[str] | None = None) -> tuple[object, object]:
    """A one-pod GPU job running ``command`` (default: trains until stopped) and its plan at ``limit_w``."""
    from datetime import UTC, datetime

    from carbonflow.domain import Config, JobSpec, Plan

    command = command or ["python", "-c", "import time\nwhile True:\n    time.sleep(0.2)\n"]
    spec = JobSpec(name="pod-fault", command=command, steps=100, region="GB")
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
                predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1, region="GB",
                forecast_provider="fault-injection", reason="fault injection")  # fmt: skip
    return spec, plan


HEARTBEAT = """
import os, sys, time
beats, live_s = sys.argv[1], float(sys.argv[2])
end = time.time() + live_s
while time.time() < end:
    with open(beats, "a") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "") + " " + repr(time.time()) + chr(10))
    time.sleep(0.05)
"""


def k8s_time_sliced_pairs(rng: random.Random, root: Path) -> FaultOutcome:
    """Two co-located pairs — four pods asking for the time-sliced GPU resource, each pair planned as the session
    plans it (the first pod sets the pair's limit, the second runs at the GPU's) — land, as the NVIDIA device
    plugin's time-slicing allows, on one GPU of the node. Pods of different pairs must never train on it at once
    (a pod's heartbeats, on the GPU it trained on, give its span)."""
    with _cluster(rng, max_gpus=2) as (node, _, _api, backend, _host_gpu):
        beats = node.base / "beats"
        beats.mkdir(mode=0o777)
        beats.chmod(0o777)  # the training may run as the pod's own user
        script = node.base / "heartbeat.py"
        script.write_text(HEARTBEAT)
        script.chmod(0o644)
        started_runs = []
        for pair in ("a", "b"):
            limit_w = _limit(rng)
            for member in (0, 1):
                spec, plan = _gpu_run(limit_w if member == 0 else None,
                                      ["python", str(script), str(beats / f"{pair}{member}"), "1.0"])  # fmt: skip
                spec = spec.model_copy(update={"name": f"pair-{pair}-{member}"})
                plan = plan.model_copy(
                    update={
                        "job": spec.name,
                        "colocated_with": [f"pair-{pair}-{1 - member}"],
                        "config": plan.config.model_copy(update={"colocation_group": pair}),
                    }
                )
                started_runs.append((pair, backend.start(spec, plan)))  # fmt: skip
        lost = _all_collected_lost(backend, [handle for _, handle in started_runs])
        spans = {f"{pair}{m}": _spans(beats / f"{pair}{m}") for pair in ("a", "b") for m in (0, 1)}
        booked = sum(
            1
            for a in ("a0", "a1")
            for b in ("b0", "b1")
            if spans[a] and spans[b] and spans[a][0] == spans[b][0] and _overlap(spans[a][1], spans[b][1])
        )
        return FaultOutcome(power_limits_left_lowered=node.node.lowered(), gpus_double_booked=booked,
                            runs_lost=lost)  # fmt: skip


def _all_collected_lost(backend: object, handles: list[object], timeout_s: float = 180) -> int:
    """How many of the runs ended without their result. Every run is polled in turn (the fake kubelet moves a
    pod on when it is read), so that all of them start at once, as on a cluster."""
    deadline = time.monotonic() + timeout_s
    while not all([backend.poll(h).state == "finished" for h in handles]):  # type: ignore[attr-defined]  # every one read
        if time.monotonic() > deadline:
            return len(handles)
        time.sleep(0.05)
    lost = 0
    for handle in handles:
        try:
            backend.collect(handle)  # type: ignore[attr-defined]
        except Exception:
            lost += 1
    return lost


def _pod_lowered_then_killed(rng: random.Random, node: object, api: object, backend: object, host_gpu: int,
                             limit_w: float, command: list[str] | None = None) -> tuple[object, str]:  # fmt: skip
    """Start the pod (the real wrapper lowers its GPU through zeusd), let it train a random while, then SIGKILL
    its container (the OOM killer). Returns (handle, pod name)."""
    handle = backend.start(*_gpu_run(limit_w, command))  # type: ignore[attr-defined]
    pod = handle.details["pod"]
    wait_for(lambda: backend.poll(handle).state == "running"  # type: ignore[attr-defined]
             and node.node.limits_mw()[host_gpu] == int(limit_w * 1000))  # type: ignore[attr-defined]  # fmt: skip
    time.sleep(rng.uniform(0.0, 0.3))
    api.kill_container(pod)  # type: ignore[attr-defined]
    wait_for(lambda: backend.poll(handle).state == "finished")  # type: ignore[attr-defined]
    return handle, pod


def _k8s_kill(agent_down_during_restore: bool) -> Callable[[random.Random, Path], FaultOutcome]:
    """A training pod SIGKILLed (OOM) after its wrapper lowered its GPU — a random host GPU of a 1–4 GPU node,
    which the pod sees as GPU 0: the restore pod puts it back through zeusd, by its host index. With the node
    agent unreachable during the restore, the failure must be reported on the run's error with the command to
    run, which is run once the agent is back."""

    def inject(rng: random.Random, root: Path) -> FaultOutcome:
        with _cluster(rng) as (node, _, api, backend, host_gpu):
            handle, _ = _pod_lowered_then_killed(rng, node, api, backend, host_gpu, _limit(rng))
            notes: str | None = None
            with _agent_down(node) if agent_down_during_restore else contextlib.nullcontext():
                try:
                    backend.collect(handle)  # a killed pod has no result: collect must fail
                except Exception as err:
                    notes = " ".join(getattr(err, "__notes__", []))
            reported = notes is not None
            if agent_down_during_restore and notes is not None:  # the agent is back: run what the error says
                command = _by_hand_command(notes)
                reported = command is not None
                if command is not None:
                    _run_by_hand(node, command)
            left = node.node.lowered()
            others = {c[0] for c in node.node.state()["set_calls"]} - {node.node.uuids()[host_gpu]}
        return FaultOutcome(power_limits_left_lowered=left + len(others) + (0 if reported else 1))

    return inject


@contextlib.contextmanager
def _agent_down(node: object):  # type: ignore[no-untyped-def]
    """zeusd unreachable: its socket answers nobody (the daemon restarting)."""
    sock = node.socket  # type: ignore[attr-defined]
    aside = sock.with_name("zeusd.sock.down")
    os.rename(sock, aside)
    try:
        yield
    finally:
        os.rename(aside, sock)


def _by_hand_command(notes: str) -> str | None:
    """The restore command the run's error tells an operator to run on the node, or None."""
    marker = "with: "
    if "power-limit restore for" not in notes or marker not in notes:
        return None
    return notes.split(marker, 1)[1].split(" python -m carbonflow.energy.power_limit restore", 1)[0]


def _run_by_hand(node: object, assignments: str) -> None:
    """Run ``python -m carbonflow.energy.power_limit restore`` on the node as the error says (host paths)."""
    env = {}
    for part in assignments.split():
        name, value = part.split("=", 1)
        env[name] = str(node.host_path(value))  # type: ignore[attr-defined]
    node.node.restore_cli(FAKE_NVML_UNPRIVILEGED="1", **env)  # type: ignore[attr-defined]


MOVE_JOURNAL = """
import glob, os, sys, time
attack, journal_root = sys.argv[1], sys.argv[2]  # the pod's journal mount, as /proc/mounts shows it in a pod
for path in glob.glob(os.path.join(journal_root, "**", "*.json"), recursive=True):
    try:
        if attack == "rename":
            os.rename(path, path + ".moved")
        elif attack == "remove":
            os.remove(path)
        elif attack == "overwrite":
            open(path, "w").write('{"format_version": 2, "gpu_uuid": "GPU-elsewhere", "previous_w": 100}')
        elif attack == "move_dir":
            os.rename(os.path.dirname(path), os.path.dirname(path) + ".moved")
    except OSError:
        pass
while True:
    time.sleep(0.2)
"""


def k8s_restore_pod_with_a_moved_journal(rng: random.Random, root: Path, attack: str | None = None) -> FaultOutcome:
    """The job tries to move its power journal where the restore pod will not find it — through its env
    (POD_NAME, the journal directory: refused by the job file's validation and, for a spec that skipped it, by
    the backend, see :func:`_env_attack`) or, as the pod's user, by renaming, removing or overwriting it — then
    the pod is SIGKILLed: the restore pod must still put the GPU back."""
    from fake_gpu_node import CAN_DROP_USERS

    attacks = ["env:POD_NAME", "env:CARBONFLOW_POWER_JOURNAL_DIR"]
    if CAN_DROP_USERS:  # the command runs as the pod's training user only when the wrapper can drop to it
        attacks += ["rename", "remove", "overwrite", "move_dir"]
    attack = attack or rng.choice(attacks)
    with _cluster(rng) as (node, _, api, backend, host_gpu):
        if attack.startswith("env:"):
            return _env_attack(rng, node, api, backend, host_gpu, attack[4:])
        script = node.base / "move_journal.py"
        script.write_text(MOVE_JOURNAL)
        script.chmod(0o644)
        handle, _ = _pod_lowered_then_killed(rng, node, api, backend, host_gpu, _limit(rng),
                                             ["python", str(script), attack, str(node.journal_dir)])  # fmt: skip
        with contextlib.suppress(Exception):
            backend.collect(handle)
        return FaultOutcome(power_limits_left_lowered=node.node.lowered(), variant=attack)


def _env_attack(rng: random.Random, node: object, api: object, backend: object, host_gpu: int,
                name: str) -> FaultOutcome:  # fmt: skip
    """The job's env names ``name`` (POD_NAME, the journal directory). Counted lowered when the job file's
    validation accepts it; then the same env is handed to the real backend in a JobSpec that skipped validation
    (a stale one, from an older release): the backend must refuse it, or the pod is started, lowers its GPU,
    is SIGKILLed, and the restore pod must still put the GPU back."""
    from pydantic import ValidationError

    from carbonflow.domain import JobSpec

    fields = {"name": "moved", "command": ["python", "train.py"], "steps": 10, "region": "GB",
              "env": {name: "elsewhere"}}  # fmt: skip
    try:
        JobSpec(**fields)
        accepted = 1  # the job file's validation let it through
    except ValidationError:
        accepted = 0
    spec, plan = _gpu_run(_limit(rng))
    stale = JobSpec.model_construct(**{**spec.model_dump(), "env": {name: "elsewhere"}})
    try:
        handle = backend.start(stale, plan)  # type: ignore[attr-defined]
    except Exception:  # refused before any pod started: nothing lowered
        return FaultOutcome(power_limits_left_lowered=accepted, variant=f"env:{name}, refused by the backend")
    wait_for(lambda: backend.poll(handle).state == "running")  # type: ignore[attr-defined]
    time.sleep(rng.uniform(0.2, 0.5))
    api.kill_container(handle.details["pod"])  # type: ignore[attr-defined]
    wait_for(lambda: backend.poll(handle).state == "finished")  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        backend.collect(handle)  # type: ignore[attr-defined]
    lowered = node.node.lowered()  # type: ignore[attr-defined]
    return FaultOutcome(power_limits_left_lowered=accepted + lowered, variant=f"env:{name}, started by the backend")


KINDS: dict[str, Callable[[random.Random, Path], FaultOutcome]] = {
    "wrapper_sigterm": _signal_wrapper(signal.SIGTERM),
    "wrapper_sigint": _signal_wrapper(signal.SIGINT),
    "wrapper_sigkill": _signal_wrapper(signal.SIGKILL),
    "wrapper_sigkill_with_grandchild_then_retry": wrapper_sigkill_with_grandchild,
    "child_sigkill": _signal_child(signal.SIGKILL),
    "child_sigterm": _signal_child(signal.SIGTERM),
    "child_sigkill_leaving_a_worker": _signal_child(signal.SIGKILL, grandchild=True),
    "two_wrappers_racing_for_gpus": two_wrappers_racing,
    "separate_homes_racing_for_gpus": separate_homes_racing,
    "rank_in_own_session_forked_then_wrapper_sigkill": _rank_in_own_session("fork"),
    "rank_in_own_session_torchrun_like_then_wrapper_sigkill": _rank_in_own_session("popen"),
    "restore_through_zeusd_unprivileged": _restore(through_zeusd=True),
    "restore_without_zeusd_unprivileged": _restore(through_zeusd=False),
    "stale_journal_then_run_without_limit": _stale_journal(2),
    "stale_0_1_0_journal_then_run_without_limit": _stale_journal(1),
    "mlflow_refusing_while_logging": _outage(hanging=False),
    "mlflow_hanging_while_logging": _outage(hanging=True),
    "trainer_gone_before_logging": trainer_gone_before_logging,
    "task_retried_after_logging": task_retried_after_logging,
    "dag_run_cleared": dag_run_cleared,
    "k8s_pod_sigkill": _k8s_kill(agent_down_during_restore=False),
    "k8s_node_agent_unreachable_during_restore": _k8s_kill(agent_down_during_restore=True),
    "k8s_restore_pod_with_a_moved_journal": k8s_restore_pod_with_a_moved_journal,
    "k8s_time_sliced_pairs_on_one_gpu": k8s_time_sliced_pairs,
}

DOUBLE_BOOKING_KINDS = {
    "two_wrappers_racing_for_gpus": "racing wrappers, one lease folder (CARBONFLOW_GPU_LEASE_DIR)",
    "separate_homes_racing_for_gpus": "racing wrappers of separate CARBONFLOW_HOMEs, default lease settings",
    "rank_in_own_session_forked_then_wrapper_sigkill": "a forked rank in its own session outliving a SIGKILLed "
    "wrapper, against the retry",
    "rank_in_own_session_torchrun_like_then_wrapper_sigkill": "a torchrun-like rank (new session, descriptors "
    "closed) outliving a SIGKILLed wrapper, against the retry",
    "k8s_time_sliced_pairs_on_one_gpu": "two Kubernetes co-located pairs on one time-sliced GPU",
}

DISTINCT_PATHS = (
    "distinct (kind, variant) pairs exercised. A kind is one fault scenario; a variant is a discrete branch an "
    "injection took that sends the product down other code (which node repair ran after a SIGKILL, a rank "
    "started by fork or torchrun-like, which journal attack, a held record delivered once or twice, how many "
    "runs raced for how many GPUs). Random continuous draws (limits, delays, node sizes elsewhere) are not "
    "variants, so distinct_paths <= faults_injected and counts no path twice."
)


DEFAULT_PER_KIND = 20  # x 24 kinds: 480 faults in a full run


def _schedule(kinds: list[str], per_kind: int, sample: int | None) -> list[str]:
    """Every kind ``per_kind`` times; with ``sample``, only the first ``sample`` of them taken round-robin."""
    order = [kind for _ in range(per_kind) for kind in kinds]
    return order if sample is None else order[:sample]


def run(per_kind: int, seed: int, kinds: list[str] | None = None, sample: int | None = None) -> dict:
    rng = random.Random(seed)
    total = FaultOutcome()
    by_kind: dict[str, int] = {}
    paths: set[tuple[str, str]] = set()
    failures: dict[str, dict] = {}
    t0 = time.monotonic()
    seconds: dict[str, float] = {}
    for kind in _schedule(kinds or list(KINDS), per_kind, sample):
        i = by_kind.get(kind, 0)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"fault-{kind}-") as tmp:
            outcome = KINDS[kind](rng, Path(tmp))
        seconds[kind] = seconds.get(kind, 0.0) + time.monotonic() - start
        total.add(outcome)
        by_kind[kind] = i + 1
        paths.add((kind, outcome.variant))
        if any(outcome.counts().values()):
            failures[f"{kind}#{i}"] = asdict(outcome)
    result = _report(seed, by_kind, paths, total, failures, time.monotonic() - t0)
    result["elapsed_s_by_kind"] = {kind: round(value, 1) for kind, value in seconds.items()}
    return result


def _report(seed: int, by_kind: dict[str, int], paths: set[tuple[str, str]], total: FaultOutcome,
            failures: dict[str, dict], elapsed_s: float) -> dict:  # fmt: skip
    nonzero: dict[str, list[str]] = {}
    for name in failures:
        for counter, value in failures[name].items():
            if counter in COUNTERS and value:
                nonzero.setdefault(counter, [])
                if name.split("#")[0] not in nonzero[counter]:
                    nonzero[counter].append(name.split("#")[0])
    return {
        "label": "fault injection on a fake NVML node and fake zeusd (the wrapper and restore are the real code) "
        "and on run records logged to a real MLflow store (SQLite) through the real logger, spool and held records",
        "seed": seed,
        "ran_as_root": os.geteuid() == 0,
        "faults_injected": sum(by_kind.values()),
        "distinct_paths": len(paths),
        "distinct_paths_definition": DISTINCT_PATHS,
        "paths": sorted(f"{kind} [{variant}]" if variant else kind for kind, variant in paths),
        "by_kind": by_kind,
        "double_booking_measured_in": {k: v for k, v in DOUBLE_BOOKING_KINDS.items() if k in by_kind},
        **total.counts(),
        "counters_above_zero_in": nonzero,
        "failures": failures,
        "elapsed_s": round(elapsed_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=DEFAULT_PER_KIND, help="injections of each kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="only these kinds")
    ap.add_argument("--sample", type=int, default=None, help="only this many injections, the kinds taken in turn")
    ap.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = ap.parse_args(argv)
    result = run(args.per_kind, args.seed, args.kinds, args.sample)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("failures", "paths")}, indent=2))
    return 1 if any(result[c] for c in COUNTERS) else 0


if __name__ == "__main__":
    sys.exit(main())
