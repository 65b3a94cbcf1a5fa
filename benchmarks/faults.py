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
* ``runs_duplicated`` — a training still alive when its retry started.

Run: ``python benchmarks/faults.py [--per-kind 20] [--seed 0]`` → benchmarks/results/faults.json.
A test runs ``--per-kind 1`` of every kind and checks a deliberately broken restore is caught.
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
        "label": "fault injection on a fake NVML node and fake zeusd (the wrapper and restore are the real code)",
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
