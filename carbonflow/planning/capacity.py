"""Capacity-aware decisions for a shared cluster: when slowing, sharing or deferring a job costs others time.

On one machine a slower or later job costs only itself. In a cluster with a queue, a GPU held longer by a
power-capped job is a GPU a waiting job does not get, and jobs deferred into the same low-carbon hour meet
each other there as congestion. These helpers turn the cluster's state into bounds for the planner's
decisions; they decide from the numbers they are handed and do no I/O.

API::

    ClusterLoad(queued_jobs, free_gpus, total_gpus)
    power_limit_under_load(capped_limit_w, default_limit_w, load, headroom_gpus=0) -> float
    waiting_slowdown_bound(predicted_run_s, expected_wait_s, max_slowdown) -> float
    partner_slowdown_bound(remaining_s, elapsed_s, predicted_total_s, max_slowdown, time_to_deadline_s,
                           congestion_slowdown=0.0) -> float
    deferral_budget_s(predicted_run_s, max_jct_increase, expected_queue_s=0.0) -> float
    CapacityLedger(total_gpus, slot_s, horizon_s).add / remove / peak_gpus / fits
    power_limit_with_delay_cost(power_limits_w, slowdowns, powers_w, gpus, delay_cost_w, max_slowdown,
                                load=None, queue_cost_w_per_gpu=inf) -> float

Units: seconds, watts, GPUs, grams CO2e.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClusterLoad:
    """What the cluster's scheduler shows at a decision: jobs waiting, GPUs free, GPUs in all."""

    queued_jobs: int
    free_gpus: int
    total_gpus: int

    def __post_init__(self) -> None:
        if self.queued_jobs < 0 or self.free_gpus < 0 or self.total_gpus < 1 or self.free_gpus > self.total_gpus:
            raise ValueError(
                f"ClusterLoad(queued_jobs={self.queued_jobs}, free_gpus={self.free_gpus}, "
                f"total_gpus={self.total_gpus}) is not allowed; counts must be >= 0 and free <= total >= 1"
            )


def power_limit_under_load(
    capped_limit_w: float, default_limit_w: float, load: ClusterLoad, headroom_gpus: int = 0
) -> float:
    """The power limit to run at now: the planner's capped limit only while nobody waits.

    With a queue (or fewer than ``headroom_gpus`` free GPUs) the slowdown of a capped job turns into waiting
    for the jobs behind it, so the job runs at ``default_limit_w``; an idle cluster lets it run capped.
    """
    if headroom_gpus < 0:
        raise ValueError(f"headroom_gpus={headroom_gpus} is not allowed; it must be >= 0")
    if load.queued_jobs > 0 or load.free_gpus < headroom_gpus:
        return default_limit_w
    return capped_limit_w


def waiting_slowdown_bound(predicted_run_s: float, expected_wait_s: float, max_slowdown: float) -> float:
    """Slowdown a job may take by sharing a GPU *now* instead of waiting ``expected_wait_s`` for one of its own.

    Its completion time must stay within ``(1 + max_slowdown)`` × what waiting would give:
    ``(1 + max_slowdown) · (wait + run) / run − 1``. With no wait this is ``max_slowdown``.
    """
    if predicted_run_s <= 0:
        raise ValueError(f"predicted_run_s={predicted_run_s} is not allowed; it must be > 0")
    if expected_wait_s < 0 or max_slowdown < 0:
        raise ValueError(
            f"expected_wait_s={expected_wait_s}, max_slowdown={max_slowdown} are not allowed; both must be >= 0"
        )
    return (1 + max_slowdown) * (expected_wait_s + predicted_run_s) / predicted_run_s - 1


def partner_slowdown_bound(
    remaining_s: float,
    elapsed_s: float,
    predicted_total_s: float,
    max_slowdown: float,
    time_to_deadline_s: float,
    congestion_slowdown: float = 0.0,
) -> float:
    """Slowdown of the remaining work a running job may take when a newcomer joins its GPU.

    Its whole run must stay within ``(1 + max_slowdown + congestion_slowdown)`` × its predicted run time
    (``congestion_slowdown`` > 0 only while others wait, when sharing turns their waiting into progress) and
    it must still finish before its deadline. ``remaining_s`` is its predicted remaining time alone.
    """
    if remaining_s <= 0:
        raise ValueError(f"remaining_s={remaining_s} is not allowed; it must be > 0")
    if min(elapsed_s, predicted_total_s, max_slowdown, congestion_slowdown) < 0:
        raise ValueError("elapsed_s, predicted_total_s, max_slowdown and congestion_slowdown must be >= 0")
    budget = ((1 + max_slowdown + congestion_slowdown) * predicted_total_s - elapsed_s) / remaining_s - 1
    deadline = time_to_deadline_s / remaining_s - 1
    return min(budget, deadline)


def deferral_budget_s(predicted_run_s: float, max_jct_increase: float, expected_queue_s: float = 0.0) -> float:
    """The longest a job's start may be deferred: ``max_jct_increase`` of its expected completion time."""
    if predicted_run_s < 0 or max_jct_increase < 0 or expected_queue_s < 0:
        raise ValueError(
            f"predicted_run_s={predicted_run_s}, max_jct_increase={max_jct_increase}, "
            f"expected_queue_s={expected_queue_s} are not allowed; all must be >= 0"
        )
    return max_jct_increase * (predicted_run_s + expected_queue_s)


class CapacityLedger:
    """Projected GPU demand per time slot: running jobs until their predicted ends, deferred jobs at their starts.

    ``add``/``remove`` cost O(slots covered) (vectorised), ``peak_gpus`` the same. Demand past the horizon is
    clipped to the last slot, which therefore holds the demand of everything still running at the horizon.
    """

    def __init__(self, total_gpus: int, slot_s: float = 900.0, horizon_s: float = 90 * 86400.0) -> None:
        if total_gpus < 1 or slot_s <= 0 or horizon_s <= slot_s:
            raise ValueError(
                f"CapacityLedger(total_gpus={total_gpus}, slot_s={slot_s}, horizon_s={horizon_s}) is not allowed"
            )
        self.total_gpus = total_gpus
        self.slot_s = slot_s
        self.demand = np.zeros(math.ceil(horizon_s / slot_s) + 1, dtype=np.int64)

    def _slots(self, start_s: float, end_s: float) -> slice:
        last = len(self.demand) - 1
        a = min(max(int(start_s // self.slot_s), 0), last)
        b = min(max(math.ceil(end_s / self.slot_s), a + 1), last + 1)
        return slice(a, b)

    def add(self, start_s: float, end_s: float, gpus: int) -> None:
        """Book ``gpus`` from ``start_s`` to ``end_s`` (whole slots touched)."""
        self.demand[self._slots(start_s, end_s)] += gpus

    def remove(self, start_s: float, end_s: float, gpus: int) -> None:
        """Undo an ``add`` with the same arguments."""
        self.demand[self._slots(start_s, end_s)] -= gpus

    def peak_gpus(self, start_s: float, end_s: float) -> int:
        """The highest booked demand in any slot between ``start_s`` and ``end_s``."""
        return int(self.demand[self._slots(start_s, end_s)].max())

    def fits(self, start_s: float, end_s: float, gpus: int) -> bool:
        """Whether ``gpus`` more fit under the cluster's size in every slot of ``[start_s, end_s)``."""
        return self.peak_gpus(start_s, end_s) + gpus <= self.total_gpus


def power_limit_with_delay_cost(
    power_limits_w: list[float],
    slowdowns: list[float],
    powers_w: list[float],
    gpus: int,
    delay_cost_w: float,
    max_slowdown: float,
    load: ClusterLoad | None = None,
    queue_cost_w_per_gpu: float = math.inf,
) -> float:
    """The power limit minimising energy plus a price on time, per second of the job's default run time.

    cost(limit) = gpus · power · slowdown                       (the job's energy)
                + delay_cost_w · slowdown                       (its own completion time, J per s)
                + queue_cost_w_per_gpu · gpus · slowdown        (GPU-seconds held while others wait; only with
                                                                 a queue in ``load``)
    over the limits whose slowdown is within ``1 + max_slowdown``. The energy grows with the GPU count and the
    job's own delay does not, so one price on completion time caps a many-GPU job harder than a one-GPU job;
    the default ``queue_cost_w_per_gpu`` (infinite) runs at the fastest limit whenever anybody waits. Ties go
    to the faster limit. O(limits).
    """
    if not (len(power_limits_w) == len(slowdowns) == len(powers_w)) or not power_limits_w:
        raise ValueError("power_limits_w, slowdowns and powers_w must be non-empty and of equal length")
    if gpus < 1 or delay_cost_w < 0 or max_slowdown < 0 or queue_cost_w_per_gpu < 0:
        raise ValueError(
            f"gpus={gpus}, delay_cost_w={delay_cost_w}, max_slowdown={max_slowdown}, "
            f"queue_cost_w_per_gpu={queue_cost_w_per_gpu} are not allowed; gpus >= 1, the rest >= 0"
        )
    queued = load is not None and load.queued_jobs > 0
    fastest = min(range(len(slowdowns)), key=lambda i: (slowdowns[i], -power_limits_w[i]))
    if queued and math.isinf(queue_cost_w_per_gpu):
        return power_limits_w[fastest]
    queue_w = queue_cost_w_per_gpu * gpus if queued else 0.0
    best_i, best_cost = fastest, math.inf
    for i, (s, p) in enumerate(zip(slowdowns, powers_w, strict=True)):
        if s > 1 + max_slowdown + 1e-12:
            continue
        cost = gpus * p * s + delay_cost_w * s + queue_w * s
        if cost < best_cost - 1e-9 or (abs(cost - best_cost) <= 1e-9 and s < slowdowns[best_i]):
            best_i, best_cost = i, cost
    return power_limits_w[best_i]
