"""Putting a cluster experiment together: build the context, size the cluster, run and compare policies."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.engine import ClusterSpec, SimContext, SimJobs, SimResult, simulate
from carbonflow.simulation.families import Families, assign_job_types, derive_families
from carbonflow.simulation.grid import CarbonGrid
from carbonflow.simulation.interference import PairTable
from carbonflow.simulation.policies import FifoPolicy
from carbonflow.simulation.trace import JobTrace


@dataclass
class Experiment:
    """A trace with its families and job types, the pair table, devices, grid and cluster."""

    trace: JobTrace
    families: Families
    job_type: np.ndarray
    pairs: PairTable
    devices: DeviceModel
    grid: CarbonGrid
    cluster: ClusterSpec

    @classmethod
    def build(
        cls,
        trace: JobTrace,
        pairs: PairTable,
        devices: DeviceModel,
        grid: CarbonGrid,
        cluster: ClusterSpec,
        seed: int = 0,
        duration_ratio: float = 1.25,
    ) -> Experiment:
        families = derive_families(trace, duration_ratio)
        grid.align(trace.origin)
        return cls(trace, families, assign_job_types(families, len(pairs), seed), pairs, devices, grid, cluster)

    def context(self, cluster: ClusterSpec | None = None, devices: DeviceModel | None = None) -> SimContext:
        cl = cluster or self.cluster
        return SimContext(
            SimJobs.build(self.trace, self.families, self.job_type, cl),
            self.pairs,
            devices or self.devices,
            self.grid,
            cl,
        )

    def run(self, policy: FifoPolicy, cluster: ClusterSpec | None = None, devices: DeviceModel | None = None) -> Run:
        t0 = time.perf_counter()
        result = simulate(self.context(cluster, devices), policy)
        return Run(result, time.perf_counter() - t0)


@dataclass
class Run:
    result: SimResult
    seconds: float

    def summary(self) -> dict[str, float | int | str]:
        return {**self.result.summary(), "sim_seconds": self.seconds}


def relative_to(summary: dict, base: dict) -> dict[str, float]:
    """Reductions/increases of a policy against the baseline (fractions; positive = less / more)."""
    return {
        "energy_reduction_vs_fifo": 1 - summary["energy_j"] / base["energy_j"],
        "emissions_reduction_vs_fifo": 1 - summary["emissions_g"] / base["emissions_g"],
        "mean_jct_increase_vs_fifo": summary["mean_jct_s"] / base["mean_jct_s"] - 1,
        "p95_jct_increase_vs_fifo": summary["p95_jct_s"] / base["p95_jct_s"] - 1,
    }


def calibrate_gpus(
    exp: Experiment, target_queue_s: float, statistic: str = "mean", lo: int | None = None, hi: int = 20000
) -> int:
    """The smallest cluster whose FIFO baseline keeps the mean (or median) queueing delay <= the target.

    Bisection over the GPU count; used to size the simulated cluster so that its baseline queues like the
    real cluster did.
    """
    if target_queue_s < 0:
        raise ValueError(f"target_queue_s={target_queue_s} is not allowed; it must be >= 0")
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic={statistic!r} is not allowed; use 'mean' or 'median'")
    stat = np.mean if statistic == "mean" else np.median
    lo = max(int(exp.trace.num_gpus.max()), lo or 1)
    if lo >= hi:
        raise ValueError(f"hi={hi} must be above the largest job's GPU count {lo}")

    def queue_s(g: int) -> float:
        r = simulate(exp.context(replace(exp.cluster, gpus=g)), FifoPolicy())
        return float(stat(r.start_s - r.submit_s))

    if queue_s(hi) > target_queue_s:
        return hi
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if queue_s(mid) <= target_queue_s:
            hi = mid
        else:
            lo = mid
    return hi
