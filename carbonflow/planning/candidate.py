"""One configuration's predicted run, before a start time is chosen: what the optimiser ranks and the
batch-size explorer's deadline logic reads.

Its own module so that :mod:`carbonflow.planning.optimizer` and :mod:`carbonflow.planning.batch_size` both
import it and neither imports the other back (they used to meet in an import circle).
"""

from __future__ import annotations

from dataclasses import dataclass

from carbonflow.domain import Config, ProfilePoint


@dataclass(frozen=True)
class Candidate:
    """One configuration's predicted run (before a start time is chosen)."""

    point: ProfilePoint
    duration_s: float
    energy_j: float
    slowdown: float
    within_slowdown: bool
    fixed_s: float = 0.0
    """The per-run fixed part of ``duration_s`` (start-up, data loading, evaluation), learned from past runs."""
    fixed_j: float = 0.0
    """The per-run fixed part of ``energy_j``, learned alike."""

    @property
    def config(self) -> Config:
        return self.point.config

    @property
    def power_w(self) -> float:
        return self.energy_j / self.duration_s if self.duration_s > 0 else 0.0
