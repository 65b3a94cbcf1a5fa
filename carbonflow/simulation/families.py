"""Recurring-job families derived from a trace, and the job type each family trains.

Philly has no job names, so recurrence is inferred: jobs of the same virtual cluster with the same
GPU count and a similar run time (same bucket of ``log(duration)``, buckets ``ratio`` wide) form
one family, like the nightly retraining of one model. A family keeps one job type (Gavel model and
batch size) across its recurrences, so what the planner learns from one recurrence (a measured
pair slowdown, a profiled power limit) applies to the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from carbonflow.simulation.trace import JobTrace, TraceError


@dataclass
class Families:
    """Family id and recurrence index (0 = first seen) of every job, plus the family count."""

    family: np.ndarray
    recurrence: np.ndarray
    count: int
    duration_ratio: float

    @property
    def recurring_share(self) -> float:
        """Fraction of jobs that belong to a family seen more than once."""
        sizes = np.bincount(self.family, minlength=self.count)
        return float(np.mean(sizes[self.family] > 1)) if len(self.family) else 0.0


def derive_families(trace: JobTrace, duration_ratio: float = 1.25) -> Families:
    """Group jobs into recurring families: same VC, same GPU count, duration within one ``duration_ratio`` bucket."""
    if not duration_ratio > 1:
        raise TraceError(f"duration_ratio={duration_ratio} is not allowed; it must be > 1 (e.g. 1.25)")
    bucket = np.floor(np.log(np.maximum(trace.duration_s, 1.0)) / np.log(duration_ratio)).astype(np.int64)
    key = (trace.vc.astype(np.int64) * 1024 + np.minimum(trace.num_gpus, 1023)) * 4096 + bucket
    _, family = np.unique(key, return_inverse=True)
    family = family.astype(np.int64)
    count = int(family.max()) + 1 if len(family) else 0
    # recurrence index: rank of each job within its family in submission order (trace is sorted)
    order = np.argsort(family, kind="stable")
    fam_sorted = family[order]
    starts = np.flatnonzero(np.r_[True, fam_sorted[1:] != fam_sorted[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(fam_sorted)]))
    recurrence = np.empty_like(family)
    recurrence[order] = np.arange(len(fam_sorted)) - run_start
    return Families(family=family, recurrence=recurrence, count=count, duration_ratio=duration_ratio)


def assign_job_types(families: Families, n_types: int, seed: int = 0) -> np.ndarray:
    """A job type per job: each family draws one type uniformly (as Gavel does for Philly jobs).

    Returns an int array (index into the pair table's types), constant within a family.
    """
    if n_types <= 0:
        raise TraceError(f"n_types={n_types} is not allowed; it must be a positive integer")
    rng = np.random.default_rng(seed)
    family_type = rng.integers(0, n_types, size=max(families.count, 1))
    return family_type[families.family]
