"""Simulated GPUs of the cluster: power and speed per power limit from the Zeus measurements.

Each job type (a Gavel model) trains like the Zeus-measured workload mapped to it
(:data:`carbonflow.simulation.interference.GAVEL_TO_ZEUS`); its power and slowdown at a power limit
come from :class:`carbonflow.energy.simulated.ZeusPowerModel` (published measurements, replayed, so
every figure is *simulated*). A GPU shared by two jobs draws ``shared_power_factor`` times the
higher of the two jobs' solo powers, capped at its power limit: that is an assumption (Gavel measured
speed, not power), reported next to every result with a sensitivity row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carbonflow.energy.simulated import SHARED_POWER_FACTOR, ZeusPowerModel, shared_gpu_power_w
from carbonflow.simulation.interference import PairTable


@dataclass
class DeviceModel:
    """Power (W) and slowdown of every job type at every candidate power limit of one GPU model."""

    gpu_model: str
    power_limits_w: list[float]
    default_power_limit_w: float
    shared_power_factor: float
    zeus: list[ZeusPowerModel]
    _cache: dict[tuple[int, float], tuple[float, float]] = field(default_factory=dict, repr=False)

    @classmethod
    def for_pairs(
        cls, pairs: PairTable, gpu_model: str = "V100", shared_power_factor: float = SHARED_POWER_FACTOR
    ) -> DeviceModel:
        if not 1.0 <= shared_power_factor <= 2.0:
            raise ValueError(
                f"shared_power_factor={shared_power_factor} is not allowed; it must be between 1.0 "
                "(a shared GPU draws what its hungrier job draws alone) and 2.0 (the sum of both)"
            )
        by_workload: dict[tuple[str, str], ZeusPowerModel] = {}
        models = []
        for t in range(len(pairs)):
            key = pairs.zeus_workload(t)
            if key not in by_workload:
                by_workload[key] = ZeusPowerModel.load(gpu_model, key[0], key[1])
            models.append(by_workload[key])
        limits = sorted(set.intersection(*(set(m.power_limits_w) for m in by_workload.values())))
        if not limits:
            raise ValueError(f"gpu_model={gpu_model!r}: the mapped Zeus workloads share no measured power limit")
        return cls(
            gpu_model=gpu_model,
            power_limits_w=[float(x) for x in limits],
            default_power_limit_w=float(max(limits)),
            shared_power_factor=shared_power_factor,
            zeus=models,
        )

    def solo(self, job_type: int, limit_w: float) -> tuple[float, float]:
        """(average power W, slowdown vs the default limit) of one job of ``job_type`` alone at ``limit_w``."""
        key = (job_type, limit_w)
        hit = self._cache.get(key)
        if hit is None:
            m = self.zeus[job_type]
            slow = m.time_per_epoch_s(limit_w) / m.time_per_epoch_s(self.default_power_limit_w)
            hit = (m.average_power_w(limit_w), slow)
            self._cache[key] = hit
        return hit

    def shared_power_w(self, power_a_w: float, power_b_w: float, limit_w: float) -> float:
        """Power of a GPU running two jobs whose solo powers are ``power_a_w`` and ``power_b_w``."""
        return shared_gpu_power_w(power_a_w, power_b_w, limit_w, self.shared_power_factor)
