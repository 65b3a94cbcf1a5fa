"""The event-driven cluster simulator: a heap of completion/release events over a pool of GPUs.

Jobs arrive in trace order, may be held back by the policy (carbon shifting), then wait in one strict
FIFO queue ordered by submission time (a deferred job keeps its place). A multi-GPU job runs
exclusively on ``num_gpus`` GPUs (Gavel never measured multi-GPU sharing; ``colocate_multi_gpu``
extrapolates it as a sensitivity study). A single-GPU job either takes a free GPU or, when the policy
co-locates, joins a GPU that already runs one single-GPU job; the two then progress at the fractions
of their solo speed that Gavel measured for that pair, and at the GPU's power limit. When one leaves,
the other speeds back up. Work is counted in seconds of the trace's run time (exclusive, default
power limit), so a job alone at the default limit finishes exactly when the trace says.

Energy is integrated per GPU between changes of what runs on it; emissions integrate the same power
against the replayed grid (:class:`carbonflow.simulation.grid.CarbonGrid`). Idle GPUs are not
counted (assumed powered down or outside the energy boundary); the GPU allocations are kept in the
result so that :mod:`carbonflow.simulation.nodes` can add servers' host and idle power as a second,
labelled accounting. A policy with ``retune_power`` is asked for the power limit of every job running
alone each time the queue turns empty or non-empty (capacity-aware capping). Cost: O(jobs · log jobs)
for exclusive policies; co-location adds O(job types) per placement.

The engine decides nothing itself: release times, power limits, partners and whether an observed
pair stays together all come from the :class:`Policy`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.families import Families
from carbonflow.simulation.grid import CarbonGrid
from carbonflow.simulation.interference import PairTable
from carbonflow.simulation.trace import JobTrace
from carbonflow.units import kwh_from_j

_FINISH = 0
_RELEASE = 1


class SimulationError(ValueError):
    """Inputs the simulator cannot use."""


@dataclass(frozen=True)
class ClusterSpec:
    """The simulated cluster and the service level its jobs ask for."""

    gpus: int
    max_slowdown: float = 0.10
    deadline_slack_s: float = 8 * 3600.0
    colocate_multi_gpu: bool = False
    """Let two jobs with the same GPU count share their GPUs, each GPU at the single-GPU pair's measured
    speeds. Gavel measured single-GPU pairs only, so this is an extrapolation (a sensitivity study)."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise SimulationError(f"gpus={self.gpus} is not allowed; the cluster needs at least 1 GPU")
        if not 0 <= self.max_slowdown <= 10:
            raise SimulationError(f"max_slowdown={self.max_slowdown} is not allowed; use 0..10 (a fraction)")
        if self.deadline_slack_s < 0:
            raise SimulationError(f"deadline_slack_s={self.deadline_slack_s} is not allowed; it must be >= 0")


@dataclass
class SimJobs:
    """Per-job inputs of one simulation as Python lists (fast scalar access in the event loop)."""

    submit_s: list[float]
    duration_s: list[float]
    num_gpus: list[int]
    family: list[int]
    recurrence: list[int]
    job_type: list[int]
    deadline_s: list[float]
    label: str

    def __len__(self) -> int:
        return len(self.submit_s)

    @classmethod
    def build(cls, trace: JobTrace, families: Families, job_type: np.ndarray, cluster: ClusterSpec) -> SimJobs:
        if len(families.family) != len(trace) or len(job_type) != len(trace):
            raise SimulationError("families and job types must have one entry per trace job")
        deadline = trace.submit_s + trace.duration_s * (1 + cluster.max_slowdown) + cluster.deadline_slack_s
        return cls(
            submit_s=trace.submit_s.tolist(),
            duration_s=trace.duration_s.tolist(),
            num_gpus=trace.num_gpus.tolist(),
            family=families.family.tolist(),
            recurrence=families.recurrence.tolist(),
            job_type=np.asarray(job_type).tolist(),
            deadline_s=deadline.tolist(),
            label=trace.label,
        )


@dataclass
class SimContext:
    """Everything a policy may read: the jobs, the pair table (ground truth), devices, grid, cluster."""

    jobs: SimJobs
    pairs: PairTable
    devices: DeviceModel
    grid: CarbonGrid
    cluster: ClusterSpec
    progress_s: Callable[[int, float], float] = field(default=lambda job, now_s: 0.0, repr=False)
    """Work a running job has done so far, in seconds of its trace run time (its progress reports)."""
    queued: Callable[[], int] = field(default=lambda: 0, repr=False)
    """Jobs waiting in the cluster queue right now (what the cluster's scheduler shows)."""
    free_gpus: Callable[[], int] = field(default=lambda: 0, repr=False)
    """GPUs with nothing running on them right now."""


class Policy(Protocol):
    """What the engine asks a scheduling policy. Implementations live in ``policies``."""

    name: str
    colocate: bool
    retune_power: bool
    """Ask ``power_limit_w`` again for every running job alone on its GPU(s) whenever the queue turns from
    empty to non-empty or back (a capacity-aware policy caps only while nobody waits)."""

    def bind(self, ctx: SimContext) -> None:
        """Called once before the run."""

    def release_s(self, job: int, now_s: float) -> float:
        """When an arriving job may enter the queue (>= now; later = carbon shifting)."""

    def power_limit_w(self, job: int, now_s: float) -> float:
        """Power limit of the GPU(s) a job starts on alone."""

    def choose_partner(self, job: int, candidates: dict[int, int], free_gpus: int, now_s: float) -> int | None:
        """A running single-GPU job to share a GPU with, or None (take a free GPU or wait).

        ``candidates`` maps each job type that runs alone on some GPU to one such running job.
        """

    def pair_power_limit_w(self, job: int, other: int, now_s: float) -> float:
        """Power limit of a GPU while ``job`` and ``other`` share it."""

    def pair_observed(self, job: int, other: int, keep_job: float, keep_other: float, now_s: float) -> bool:
        """Early observation of a new pair's speeds (NaN: could not run together); False splits it."""

    def job_started(self, job: int, now_s: float, power_limit_w: float) -> None:
        """A job started running (alone or next to another) at ``power_limit_w``."""

    def finished(self, job: int, now_s: float) -> None:
        """A job completed (history for the next recurrence)."""


@dataclass
class SimResult:
    """Outcome of one simulation: per-job times and cluster totals."""

    policy: str
    gpus: int
    submit_s: np.ndarray
    release_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    deadline_s: np.ndarray
    num_gpus: np.ndarray
    colocated: np.ndarray
    power_limit_w: np.ndarray
    energy_j: float
    emissions_g: float
    busy_gpu_s: float
    splits: int
    label: str
    notes: list[str] = field(default_factory=list)
    alloc_start_s: np.ndarray | None = None
    """GPU allocations (an exclusive job, or a GPU shared by up to two jobs): start, end and GPU count.
    The node accounting (:mod:`carbonflow.simulation.nodes`) reads these."""
    alloc_end_s: np.ndarray | None = None
    alloc_gpus: np.ndarray | None = None
    retunes: int = 0

    def summary(self) -> dict[str, float | int | str]:
        jct = self.end_s - self.submit_s
        queue = self.start_s - self.submit_s
        span = float(np.max(self.end_s) - np.min(self.submit_s)) if len(jct) else 0.0
        return {
            "policy": self.policy,
            "jobs": len(jct),
            "energy_j": self.energy_j,
            "energy_kwh": kwh_from_j(self.energy_j),
            "emissions_g": self.emissions_g,
            "mean_jct_s": float(np.mean(jct)),
            "p95_jct_s": float(np.percentile(jct, 95)),
            "mean_queue_s": float(np.mean(queue)),
            "p95_queue_s": float(np.percentile(queue, 95)),
            "mean_deferral_s": float(np.mean(self.release_s - self.submit_s)),
            "gpu_utilisation": self.busy_gpu_s / (self.gpus * span) if span > 0 else 0.0,
            "busy_gpu_hours": self.busy_gpu_s / 3600.0,
            "deadline_misses": int(np.sum(self.end_s > self.deadline_s + 1e-6)),
            "colocated_jobs": int(np.sum(self.colocated)),
            "pair_splits": self.splits,
            "power_retunes": self.retunes,
            "mean_power_limit_w": float(np.average(self.power_limit_w, weights=self.num_gpus)),
            "makespan_s": span,
            "label": self.label,
        }


def simulate(ctx: SimContext, policy: Policy) -> SimResult:
    """Run every job of ``ctx.jobs`` to completion under ``policy``."""
    jobs = ctx.jobs
    n = len(jobs)
    if n == 0:
        raise SimulationError("the trace has no jobs to simulate")
    big = [j for j in range(n) if jobs.num_gpus[j] > ctx.cluster.gpus]
    if big:
        raise SimulationError(
            f"job {big[0]} asks for num_gpus={jobs.num_gpus[big[0]]}; the cluster has gpus={ctx.cluster.gpus} "
            "(drop such jobs with max_gpus when loading the trace)"
        )

    def progress_s(j: int, t: float) -> float:
        return dur[j] - (rem[j] - (t - last[j]) * rate[j]) if start[j] == start[j] else 0.0

    ctx.progress_s = progress_s
    ctx.queued = lambda: len(queue)
    ctx.free_gpus = lambda: free
    policy.bind(ctx)
    submit, dur, gpus, jtype = jobs.submit_s, jobs.duration_s, jobs.num_gpus, jobs.job_type
    keep = ctx.pairs.keep.tolist()
    devices = ctx.devices
    solo = devices.solo
    grid_integral = ctx.grid.integral
    colocate = policy.colocate
    retune_power = getattr(policy, "retune_power", False)
    n_types = len(ctx.pairs)

    start = [math.nan] * n
    end = [math.nan] * n
    release = list(submit)
    limit_of = [devices.default_power_limit_w] * n
    colocated = [False] * n
    rem = [0.0] * n
    rate = [0.0] * n
    last = [0.0] * n
    ver = [0] * n
    pw = [0.0] * n
    sd = [1.0] * n
    host_of = [-1] * n
    seg0 = [0.0] * n  # start of an exclusive job's current power segment (its power changes on a retune)
    running: set[int] = set()
    host_opened: dict[int, float] = {}
    host_spans: list[tuple[float, float, int]] = []

    host_jobs: dict[int, list[int]] = {}
    host_t0: dict[int, float] = {}
    host_power: dict[int, float] = {}
    host_limit: dict[int, float] = {}
    host_g: dict[int, int] = {}
    share_multi = ctx.cluster.colocate_multi_gpu
    # open hosts (one job running, room for a partner), by GPU count then job type
    open_by: dict[int, list[set[int]]] = {1: [set() for _ in range(n_types)]}
    next_host = 0

    heap: list[tuple[float, int, int, int, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    seq = 0
    free = ctx.cluster.gpus
    queue: list[int] = []  # heap of job indices: FIFO by submission order (the trace is sorted)
    energy = 0.0
    carbon_int = 0.0  # Σ power · ∫intensity dt  (W · gCO2/kWh · s)
    busy = 0.0
    splits = 0
    state_ver = 0  # bumped whenever a job finishes (GPUs freed or a shared GPU opened)
    blocked = (-1, -1)

    def close(h: int, t: float) -> None:
        nonlocal energy, carbon_int, busy
        t0 = host_t0[h]
        if t > t0:
            g = host_g[h]
            p = host_power[h] * g
            energy += (t - t0) * p
            carbon_int += p * grid_integral(t0, t)
            busy += (t - t0) * g
        host_t0[h] = t

    def reschedule(j: int, t: float) -> None:
        nonlocal seq
        ver[j] += 1
        seq += 1
        heapq.heappush(heap, (t + max(rem[j], 0.0) / rate[j], seq, _FINISH, j, ver[j]))

    def set_rate(j: int, t: float, new_rate: float) -> None:
        rem[j] -= (t - last[j]) * rate[j]
        last[j] = t
        rate[j] = new_rate
        reschedule(j, t)

    def open_host(j: int, t: float) -> int:
        nonlocal next_host, free
        h = next_host
        next_host += 1
        lim = policy.power_limit_w(j, t)
        p, s = solo(jtype[j], lim)
        limit_of[j], pw[j], sd[j] = lim, p, s
        host_jobs[h] = [j]
        host_t0[h] = t
        host_power[h] = p
        host_limit[h] = lim
        g = gpus[j]
        host_g[h] = g
        host_opened[h] = t
        if g == 1 or share_multi:
            if g not in open_by:
                open_by[g] = [set() for _ in range(n_types)]
            open_by[g][jtype[j]].add(h)
        free -= g
        host_of[j] = h
        start[j] = t
        running.add(j)
        rem[j], last[j], rate[j] = dur[j], t, 1.0 / s
        reschedule(j, t)
        policy.job_started(j, t, limit_of[j])
        return h

    def join(j: int, h: int, t: float) -> bool:
        """Put job j next to the job on host h (same GPU count); False if the pair cannot run together."""
        nonlocal splits
        k = host_jobs[h][0]
        kj, kk = keep[jtype[j]][jtype[k]], keep[jtype[k]][jtype[j]]
        if not (kj == kj and kk == kk):  # NaN: Gavel could not run this pair (e.g. out of memory)
            policy.pair_observed(j, k, math.nan, math.nan, t)
            return False
        opens = open_by[host_g[h]]
        opens[jtype[k]].discard(h)
        close(h, t)
        lim = policy.pair_power_limit_w(j, k, t)
        host_limit[h] = lim
        p, s = solo(jtype[j], lim)
        limit_of[j], pw[j], sd[j] = lim, p, s
        pw[k], sd[k] = solo(jtype[k], lim)
        host_jobs[h].append(j)
        host_of[j] = h
        running.add(j)
        host_power[h] = devices.shared_power_w(p, pw[k], lim)
        start[j] = t
        colocated[j] = colocated[k] = True
        rem[j], last[j], rate[j] = dur[j], t, kj / s
        reschedule(j, t)
        set_rate(k, t, kk / sd[k])
        policy.job_started(j, t, limit_of[j])
        if not policy.pair_observed(j, k, kj, kk, t) and free >= gpus[j]:
            # early observation says the pair is too slow: the newcomer moves to free GPUs
            splits += 1
            close(h, t)
            host_jobs[h].remove(j)
            alone_again(k, h, t)
            opens[jtype[k]].add(h)
            open_host(j, t)
        return True

    def alone_again(k: int, h: int, t: float) -> None:
        """Job k runs alone on host h again: at the power limit the policy gives it, at its solo speed."""
        lim = policy.power_limit_w(k, t)
        host_limit[h] = lim
        pw[k], sd[k] = solo(jtype[k], lim)
        host_power[h] = pw[k]
        set_rate(k, t, 1.0 / sd[k])

    def try_start(t: float) -> None:
        nonlocal free, seq, blocked
        while queue:
            j = queue[0]
            g = gpus[j]
            if colocate and (g == 1 or share_multi):
                if blocked == (j, state_ver):
                    return  # nothing freed or opened since this head was last refused: same answer
                opens = open_by.get(g)
                candidates = {ty: host_jobs[next(iter(s))][0] for ty, s in enumerate(opens) if s} if opens else {}
                if candidates:
                    k = policy.choose_partner(j, candidates, free, t)
                    if k is not None:
                        h = host_of[k]
                        if h < 0 or len(host_jobs.get(h, ())) != 1 or host_g[h] != g:
                            raise SimulationError(f"policy {policy.name!r} chose job {k}, which runs on no open GPU")
                        if join(j, h, t):
                            heappop(queue)
                            continue
                if free >= g:
                    heappop(queue)
                    open_host(j, t)
                    continue
                blocked = (j, state_ver)
                return
            if free < g:
                return
            heappop(queue)
            free -= g
            lim = policy.power_limit_w(j, t)
            p, s = solo(jtype[j], lim)
            limit_of[j], pw[j], sd[j] = lim, p, s
            start[j] = seg0[j] = t
            if retune_power:
                running.add(j)
            rem[j], last[j], rate[j] = dur[j], t, 1.0 / s
            seq += 1
            heappush(heap, (t + dur[j] * s, seq, _FINISH, j, ver[j]))
            policy.job_started(j, t, lim)

    def finish(j: int, t: float) -> None:
        nonlocal free, state_ver
        state_ver += 1
        end[j] = t
        running.discard(j)
        h = host_of[j]
        if h < 0:  # exclusive: its energy and emissions are summed, vectorised, after the run
            free += gpus[j]
        else:
            close(h, t)
            members = host_jobs[h]
            members.remove(j)
            g = host_g[h]
            opens = open_by.get(g)
            if opens is not None:
                opens[jtype[j]].discard(h)
            if members:
                k = members[0]
                alone_again(k, h, t)
                if opens is not None:
                    opens[jtype[k]].add(h)
            else:
                host_spans.append((host_opened.pop(h), t, g))
                del host_jobs[h], host_t0[h], host_power[h], host_limit[h], host_g[h]
                free += g
        policy.finished(j, t)

    retunes = 0

    def retune(t: float) -> None:
        """The queue changed between empty and non-empty: ask the policy for each lone job's power limit."""
        nonlocal energy, carbon_int, retunes
        for k in list(running):
            h = host_of[k]
            if h >= 0 and len(host_jobs[h]) != 1:
                continue  # a shared GPU keeps the pair's limit
            lim = policy.power_limit_w(k, t)
            if lim == limit_of[k]:
                continue
            retunes += 1
            limit_of[k] = lim
            if h >= 0:
                close(h, t)
                host_limit[h] = lim
                pw[k], sd[k] = solo(jtype[k], lim)
                host_power[h] = pw[k]
                set_rate(k, t, 1.0 / sd[k])
            else:
                watts = gpus[k] * pw[k]
                energy += watts * (t - seg0[k])
                carbon_int += watts * grid_integral(seg0[k], t)
                seg0[k] = t
                pw[k], sd[k] = solo(jtype[k], lim)
                set_rate(k, t, 1.0 / sd[k])

    waiting = False
    ai = 0
    inf = math.inf
    while ai < n or heap:
        t_arr = submit[ai] if ai < n else inf
        if heap and heap[0][0] <= t_arr:
            t, _, kind, j, v = heappop(heap)
            if kind == _FINISH:
                if v != ver[j]:
                    continue
                finish(j, t)
            else:
                heapq.heappush(queue, j)  # a deferred job keeps its place by submission time
            try_start(t)
            if retune_power and waiting != (len(queue) > 0):
                waiting = not waiting
                retune(t)
        else:
            j = ai
            ai += 1
            r = policy.release_s(j, t_arr)
            if r > t_arr:
                release[j] = r
                seq += 1
                heapq.heappush(heap, (r, seq, _RELEASE, j, 0))
                continue
            heapq.heappush(queue, j)
            if len(queue) == 1:  # strict FIFO: a job behind a blocked head cannot start either
                try_start(t_arr)
            if retune_power and waiting != (len(queue) > 0):
                waiting = not waiting
                retune(t_arr)
    if queue:
        raise SimulationError(f"{len(queue)} jobs never started (policy {policy.name!r})")

    start_a, end_a, gpus_a = np.asarray(start), np.asarray(end), np.asarray(gpus, dtype=float)
    excl = np.asarray(host_of) < 0
    seg_a = np.asarray(seg0)
    if np.any(excl):
        watts = gpus_a[excl] * np.asarray(pw)[excl]
        energy += float(np.sum(watts * (end_a[excl] - seg_a[excl])))
        carbon_int += float(np.sum(watts * ctx.grid.integral_many(seg_a[excl], end_a[excl])))
        busy += float(np.sum(gpus_a[excl] * (end_a[excl] - start_a[excl])))
    spans = np.asarray(host_spans, dtype=float).reshape(-1, 3)

    return SimResult(
        policy=policy.name,
        gpus=ctx.cluster.gpus,
        submit_s=np.asarray(submit),
        release_s=np.asarray(release),
        start_s=start_a,
        end_s=end_a,
        deadline_s=np.asarray(jobs.deadline_s),
        num_gpus=np.asarray(gpus),
        colocated=np.asarray(colocated),
        power_limit_w=np.asarray(limit_of),
        energy_j=energy,
        emissions_g=kwh_from_j(carbon_int),  # J x g/kWh -> g
        busy_gpu_s=busy,
        splits=splits,
        label=f"simulated ({jobs.label} jobs)",
        alloc_start_s=np.concatenate([start_a[excl], spans[:, 0]]),
        alloc_end_s=np.concatenate([end_a[excl], spans[:, 1]]),
        alloc_gpus=np.concatenate([gpus_a[excl], spans[:, 2]]),
        retunes=retunes,
    )
