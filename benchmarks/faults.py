"""Fault injection on a fake GPU node: does carbonflow ever leave a GPU power-limited, double-book one, or
lose or duplicate a run?

Each injection runs the real ``carbonflow run`` wrapper (and ``python -m carbonflow.energy.power_limit
restore``) on a **fake** NVML node — tests/energy/fake_pynvml, several GPUs with UUIDs, per-process
privilege — with a **fake** zeusd acting on the same driver state (tests/fakes). Node size, power limits
and the moment of each fault are drawn at random (``--seed``). After each fault the node is left as
production would leave it: the next run on the GPU, or the restore command a node agent runs.

Counted per injection:

* ``power_limits_left_lowered`` — GPUs not back at the limit they had before carbonflow touched them;
* ``gpus_double_booked`` — two trainings alive on one GPU at the same time;
* ``runs_lost`` — a run the fault did not target that ended without its result;
* ``runs_duplicated`` — a training still alive when its retry started, or a run logged to MLflow twice.

The run-record kinds log a training run the way the session does (``log_training_run`` with the Airflow
run's idempotency key) while MLflow refuses connections or hangs, after the worker that trained is gone
(the record delivered from XCom), on a task retry and on a cleared DAG run, into one real MLflow store
(SQLite, shared by the injections): a run that never arrives is lost, one that arrives twice is duplicated.

Run: ``python benchmarks/faults.py [--per-kind 20] [--seed 0]`` → benchmarks/results/faults.json.
A test runs ``--per-kind 1`` of every kind and checks that a deliberately broken restore, delivery or
restore pod is caught. The Kubernetes kinds run the **fake** Kubernetes API (tests/kubernetes: pods terminate
over their grace period) on a **fake** GPU node whose training pods run the real wrapper on a random host GPU
(seen as GPU 0 in the pod) and whose restore pods run the real restore script and command through the fake zeusd.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes.fake_zeusd import serve_fake_zeusd  # noqa: E402
from tests.fakes.node import FakeNode, alive, started, training, wait_for  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


@dataclass
class FaultOutcome:
    power_limits_left_lowered: int = 0
    gpus_double_booked: int = 0
    runs_lost: int = 0
    runs_duplicated: int = 0

    def add(self, other: FaultOutcome) -> None:
        for name, value in asdict(other).items():
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
        if sig == signal.SIGKILL:  # uncatchable: the next run on the GPU, or the node agent's restore, repairs it
            node.finish(node.wrapper("next", None, ["true"]))
            node.restore_cli()
        out.power_limits_left_lowered = node.lowered()
        return out

    return inject


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
    code, _ = node.finish(retry)
    _kill_all(child, grandchild)
    return FaultOutcome(power_limits_left_lowered=node.lowered(), runs_duplicated=duplicated, runs_lost=int(code != 0))


def two_wrappers_racing(rng: random.Random, root: Path) -> FaultOutcome:
    """Two runs started together on a node with fewer free GPUs than runs: none may share a GPU."""
    node = FakeNode(root, gpus=rng.randint(1, 2))
    n = len(node.uuids()) + 1
    procs = [node.wrapper(f"r{i}", _limit(rng), training(root / f"t{i}", seconds=0.6), CARBONFLOW_GPU_WAIT_S="30")
             for i in range(n)]  # fmt: skip
    codes = [node.finish(p, timeout_s=120)[0] for p in procs]
    spans = [_spans(root / f"t{i}.span") for i in range(n)]
    booked = sum(
        1
        for i in range(n)
        for j in range(i + 1, n)
        if spans[i] and spans[j] and spans[i][0] == spans[j][0] and _overlap(spans[i][1], spans[j][1])
    )
    return FaultOutcome(power_limits_left_lowered=node.lowered(), gpus_double_booked=booked,
                        runs_lost=sum(c != 0 for c in codes))  # fmt: skip


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
        code, _ = node.finish(node.wrapper("next", None, ["true"]))
        return FaultOutcome(power_limits_left_lowered=node.lowered(), runs_lost=int(code != 0))

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
    """The task logged its run, then died before Airflow heard: the retry finds the run and trains nothing."""
    from carbonflow.tracking.store import completed_run

    job, store = f"retry-{rng.getrandbits(32):08x}", _store()
    _log(job, _key(job), store, root / "spool", root)
    if completed_run(job, _key(job), store) is None:  # what the session asks before training again
        _log(job, _key(job), store, root / "spool", root)
    return _counted(store, job, [_key(job)])


def dag_run_cleared(rng: random.Random, root: Path) -> FaultOutcome:
    """A cleared DAG run is a new run: a new key, one new run, the old one kept; neither duplicated."""
    job, store = f"cleared-{rng.getrandbits(32):08x}", _store()
    clears = rng.randint(1, 3)
    for clear in range(clears + 1):
        _log(job, _key(job, clear), store, root / "spool", root)
    return _counted(store, job, [_key(job, clear) for clear in range(clears + 1)])


sys.path.insert(0, str(REPO / "tests" / "kubernetes"))  # the fake Kubernetes API and fake GPU node


@contextlib.contextmanager
def _cluster(rng: random.Random):  # type: ignore[no-untyped-def]
    """A fake GPU node of 1–4 GPUs at a random limit, whose device plugin gives the pod one random host GPU, its
    fake zeusd, and the fake Kubernetes API (pods terminate over their grace period) with the real backend.
    Yields (node, zeusd, api, backend, host GPU index)."""
    from fake_gpu_node import FakeGpuNode
    from fake_kube_api import FakeKubeApi

    from carbonflow.execution.k8s_manifests import KubernetesSettings
    from carbonflow.execution.kubernetes import KubernetesBackend

    gpus = rng.randint(1, 4)
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

    from carbonflow.models import Config, JobSpec, Plan

    command = command or ["python", "-c", "import time\nwhile True:\n    time.sleep(0.2)\n"]
    spec = JobSpec(name="pod-fault", command=command, steps=100, region="GB")
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
                predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1, region="GB",
                forecast_provider="fault-injection", reason="fault injection")  # fmt: skip
    return spec, plan


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
attack = sys.argv[1]
journal_dir = os.environ["CARBONFLOW_POWER_JOURNAL_DIR"]
for path in glob.glob(os.path.join(journal_dir, "*.json")):
    try:
        if attack == "rename":
            os.rename(path, path + ".moved")
        elif attack == "remove":
            os.remove(path)
        elif attack == "overwrite":
            open(path, "w").write('{"format_version": 2, "gpu_uuid": "GPU-elsewhere", "previous_w": 100}')
        elif attack == "move_dir":
            os.rename(journal_dir, journal_dir + ".moved")
    except OSError:
        pass
while True:
    time.sleep(0.2)
"""


def k8s_restore_pod_with_a_moved_journal(rng: random.Random, root: Path, attack: str | None = None) -> FaultOutcome:
    """The job tries to move its power journal where the restore pod will not find it — through its env
    (POD_NAME, the journal directory: refused before any pod starts) or, as the pod's user, by renaming,
    removing or overwriting it — then the pod is SIGKILLed: the restore pod must still put the GPU back."""
    from fake_gpu_node import CAN_DROP_USERS
    from pydantic import ValidationError

    from carbonflow.models import JobSpec

    attacks = ["env:POD_NAME", "env:CARBONFLOW_POWER_JOURNAL_DIR"]
    if CAN_DROP_USERS:  # the command runs as the pod's training user only when the wrapper can drop to it
        attacks += ["rename", "remove", "overwrite", "move_dir"]
    attack = attack or rng.choice(attacks)
    if attack.startswith("env:"):
        try:
            JobSpec(name="moved", command=["python", "train.py"], steps=10, region="GB", env={attack[4:]: "elsewhere"})
        except ValidationError:
            return FaultOutcome()
        return FaultOutcome(power_limits_left_lowered=1)  # accepted: the restore pod would miss its journal
    with _cluster(rng) as (node, _, api, backend, host_gpu):
        script = node.base / "move_journal.py"
        script.write_text(MOVE_JOURNAL)
        script.chmod(0o644)
        handle, _ = _pod_lowered_then_killed(rng, node, api, backend, host_gpu, _limit(rng),
                                             ["python", str(script), attack])  # fmt: skip
        with contextlib.suppress(Exception):
            backend.collect(handle)
        return FaultOutcome(power_limits_left_lowered=node.node.lowered())


KINDS: dict[str, Callable[[random.Random, Path], FaultOutcome]] = {
    "wrapper_sigterm": _signal_wrapper(signal.SIGTERM),
    "wrapper_sigint": _signal_wrapper(signal.SIGINT),
    "wrapper_sigkill": _signal_wrapper(signal.SIGKILL),
    "wrapper_sigkill_with_grandchild_then_retry": wrapper_sigkill_with_grandchild,
    "child_sigkill": _signal_child(signal.SIGKILL),
    "child_sigterm": _signal_child(signal.SIGTERM),
    "child_sigkill_leaving_a_worker": _signal_child(signal.SIGKILL, grandchild=True),
    "two_wrappers_racing_for_gpus": two_wrappers_racing,
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
}


def run(per_kind: int, seed: int, kinds: list[str] | None = None) -> dict:
    rng = random.Random(seed)
    total = FaultOutcome()
    by_kind: dict[str, int] = {}
    failures: dict[str, dict] = {}
    t0 = time.monotonic()
    for kind in kinds or list(KINDS):
        for i in range(per_kind):
            with tempfile.TemporaryDirectory(prefix=f"fault-{kind}-") as tmp:
                outcome = KINDS[kind](rng, Path(tmp))
            total.add(outcome)
            by_kind[kind] = by_kind.get(kind, 0) + 1
            if any(asdict(outcome).values()):
                failures[f"{kind}#{i}"] = asdict(outcome)
    return {
        "label": "fault injection on a fake NVML node and fake zeusd (the wrapper and restore are the real code) "
        "and on run records logged to a real MLflow store (SQLite) through the real logger, spool and held records",
        "seed": seed,
        "faults_injected": sum(by_kind.values()),
        "by_kind": by_kind,
        **asdict(total),
        "failures": failures,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=20, help="injections of each kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="only these kinds")
    ap.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = ap.parse_args(argv)
    result = run(args.per_kind, args.seed, args.kinds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "failures"}, indent=2))
    counters = ("power_limits_left_lowered", "gpus_double_booked", "runs_lost", "runs_duplicated")
    return 1 if any(result[c] for c in counters) else 0


if __name__ == "__main__":
    sys.exit(main())
