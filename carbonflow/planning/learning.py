"""Learning across recurrences: prediction correction, batch-size exploration, early stopping.

Pure and deterministic (randomness only through a seeded ``numpy.random.Generator`` handed in).
The tracking layer turns MLflow runs into :class:`RealisedRun` objects (the planner's view of a run; the MLflow
record itself is the tracking layer's ``RunRecord``); the planner reads them through a :class:`JobHistory`.

API others call::

    RealisedRun(job, config_key, finished_at, predicted_duration_s, realised_duration_s,
              predicted_energy_j, realised_energy_j, batch_size=None, power_limit_w=None, containers=1,
              epochs=None, reached_target=None, cost=None, colocated_with=(), observed_slowdown=None)
    RealisedRun.from_result(result: RunResult, plan: Plan, epochs=None, reached_target=None) -> RealisedRun
    JobHistory(records, drift_window=10)
      .correction(job, config_key) -> Correction(time_factor, energy_factor, runs)   # per config (reports)
      .run_cost_model(job, profile_prediction) -> RunCostModel   # what the planner predicts with
      .epochs_to_target(job, batch_size) -> float | None
      .epochs_reached(job, batch_size, last, default_batch_size=None) -> list[float]
      .pair_slowdown(job, other) -> float | None         # worst observed slowdown of job next to other
    fit_fixed_and_rate(profile_figures, realised) -> (fixed, factor)
    cap_fixed_energy(profile_pairs, realised_j, fixed_s, (fixed_j, factor)) -> (fixed_j, factor)
    slowdown_from_kept_speed(kept) -> float              # the one formula: 1 / kept − 1
    kept_speed_from_slowdown(slowdown) -> float          # its inverse: 1 / (1 + slowdown)
    (the batch-size explorer: carbonflow.planning.batch_size)

Prediction (what the planner uses): :class:`RunCostModel`, a per-run fixed part (start-up, data loading,
evaluation) plus a per-sample factor on the profile's figures, for time and energy, learned per job from its
realised solo runs against what the *profile* predicts for them (:func:`fit_fixed_and_rate`) and applied alike to
every configuration of the job. The fixed energy is at most the fixed time at the training's power
(:func:`cap_fixed_energy`): what is beyond it scales with tonight's work.

Per-configuration ratio (``correction``, kept for reports): realised/predicted duration and energy, per job
and configuration, over the last ``drift_window`` runs (median, robust to one odd night); when a configuration has
no runs, the job-wide ratio is used (shrunk toward 1 by the number of runs). A data drift shows up as a moving ratio
and the window forgets older nights.

Batch-size exploration lives in :mod:`carbonflow.planning.batch_size`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from carbonflow.domain import key_without_group


def slowdown_from_kept_speed(kept: float) -> float:
    """How much slower a job runs while it keeps ``kept`` of its solo speed: ``1 / kept − 1`` (0.75 → 0.33).

    The one formula from a kept speed (co-location) to a slowdown, wherever one is printed or compared. A
    whole run's extension (overlap, then the tail alone) is a different figure and is worded as such.
    """
    if not kept > 0:
        raise ValueError(f"kept={kept} is not allowed; a kept fraction of solo speed is > 0")
    return 1.0 / kept - 1.0


def kept_speed_from_slowdown(slowdown: float) -> float:
    """The kept speed a slowdown stands for: ``1 / (1 + slowdown)``, the inverse of :func:`slowdown_from_kept_speed`."""
    if not slowdown > -1:
        raise ValueError(f"slowdown={slowdown} is not allowed; a slowdown is > -1")
    return 1.0 / (1.0 + slowdown)


@dataclass(frozen=True)
class RealisedRun:
    """One realised run of a recurring job next to what was predicted for it."""

    job: str
    config_key: str
    finished_at: datetime
    predicted_duration_s: float
    realised_duration_s: float
    predicted_energy_j: float
    realised_energy_j: float
    batch_size: int | None = None
    power_limit_w: float | None = None
    containers: int = 1
    epochs: float | None = None
    reached_target: bool | None = None
    cost: float | None = None
    colocated_with: tuple[str, ...] = ()
    observed_slowdown: float | None = None
    samples: float | None = None
    """The work the run did (samples reported): what its cost is compared at, whatever tonight's work is."""
    sharing_lost_s: float | None = None
    """Co-located: the time the run lost because it shared its GPU ((1 − kept speed) × time both worked), as the
    pair's wrapper measured it; None when not known (the run then says nothing about the job alone)."""
    sharing_energy_j: float | None = None
    """Co-located: energy charged while both worked − what the same work costs alone (negative: sharing saved)."""

    def __post_init__(self) -> None:
        if self.finished_at.tzinfo is None:
            raise ValueError(f"finished_at={self.finished_at.isoformat()} has no time zone; give it in UTC")
        for name in ("predicted_duration_s", "realised_duration_s", "predicted_energy_j", "realised_energy_j"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name}={value} is not allowed; it must be a finite number >= 0")

    def alone(self) -> RealisedRun | None:
        """What this run says about the job alone: itself when it ran alone; a co-located run with its sharing
        figures taken out (measured duration − ``sharing_lost_s``, energy − ``sharing_energy_j``), at its
        configuration without the co-location group; None for a co-located run without them."""
        if not self.colocated_with:
            return self
        if self.sharing_lost_s is None or self.sharing_energy_j is None:
            return None
        return replace(
            self,
            config_key=key_without_group(self.config_key),
            realised_duration_s=max(self.realised_duration_s - self.sharing_lost_s, 0.0),
            realised_energy_j=max(self.realised_energy_j - self.sharing_energy_j, 0.0),
            colocated_with=(),
            sharing_lost_s=None,
            sharing_energy_j=None,
        )


@dataclass(frozen=True)
class Correction:
    """Multiply a profile's predicted duration and energy by these factors."""

    time_factor: float = 1.0
    energy_factor: float = 1.0
    runs: int = 0


@dataclass(frozen=True)
class RunCostModel:
    """A job's realised run = a per-run fixed part + a per-sample part, for time and for energy.

    ``duration = fixed_s + time_factor × profile duration`` and ``energy = fixed_j + energy_factor × profile
    energy``, the profile figures being work / throughput (and × power) of the configuration. The fixed part
    (process start-up, data loading, evaluation) is what a profile's steady-state window never sees; one model
    per job, the same for every configuration, so a configuration that ran is never made to look worse than
    the untried ones by its own run.
    """

    fixed_s: float = 0.0
    fixed_j: float = 0.0
    time_factor: float = 1.0
    energy_factor: float = 1.0
    runs: int = 0

    def duration_s(self, profile_s: float) -> float:
        return self.fixed_s + self.time_factor * profile_s

    def energy_j(self, profile_j: float) -> float:
        return self.fixed_j + self.energy_factor * profile_j


def fit_fixed_and_rate(profile: Sequence[float], realised: Sequence[float]) -> tuple[float, float]:
    """(fixed part, per-sample factor) with ``realised ≈ fixed + factor × profile`` (median-based, robust to one
    odd night). With one kind of run (profile figures within 5 % of each other) the factor cannot be told from
    the fixed part: the profile's per-sample rate is trusted (factor 1) and the fixed part is the median excess;
    a profile slower than reality (negative excess) is a factor instead. Otherwise a line through the medians
    of the shorter and longer halves, factor > 0 and fixed >= 0."""
    x = np.asarray(profile, dtype=float)
    y = np.asarray(realised, dtype=float)
    ok = (x > 0) & (y > 0)
    x, y = x[ok], y[ok]
    if x.size == 0:
        return 0.0, 1.0
    if x.max() <= 1.05 * x.min():
        excess = float(np.median(y - x))
        return (excess, 1.0) if excess >= 0 else (0.0, float(np.median(y / x)))
    order = np.argsort(x)
    lo, hi = order[: x.size // 2], order[x.size // 2 :]
    x0, y0, x1, y1 = np.median(x[lo]), np.median(y[lo]), np.median(x[hi]), np.median(y[hi])
    factor = float((y1 - y0) / (x1 - x0)) if x1 > x0 else 1.0
    if factor <= 0:
        return 0.0, float(np.median(y / x))
    fixed = float(np.median(y - factor * x))
    if fixed < 0:
        return 0.0, float(np.median(y / x))
    return fixed, factor


def cap_fixed_energy(
    profile: Sequence[tuple[float, float]], realised_j: Sequence[float], fixed_s: float, fit: tuple[float, float]
) -> tuple[float, float]:
    """The energy fit ``(fixed_j, factor)`` with its fixed part at most ``fixed_s`` × the training's power.

    Start-up, data loading and evaluation draw no more than training does, so a run's fixed energy is at most
    its fixed time at the power the profile predicts for its steps (median of ``profile`` (duration s, energy J)
    pairs). A larger excess is not fixed: the profile's energy per sample was low (a window too short, a busy
    host), and the excess scales with the work (the factor). Else a job trained nightly on one amount of work
    took its whole measured energy as "fixed", and a 2-epoch run was predicted at its 15 epochs' energy.
    """
    fixed_j = fit[0]
    powers = [j / s for s, j in profile if s > 0 and j > 0]
    if not powers or fixed_j <= 0:
        return fit
    cap_j = max(fixed_s, 0.0) * float(np.median(powers))
    if fixed_j <= cap_j * (1 + 1e-9):
        return fit
    ratios = [(y - cap_j) / j for (_, j), y in zip(profile, realised_j, strict=True) if j > 0 and y > cap_j]
    return (cap_j, float(np.median(ratios))) if ratios else fit


def _median_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    ratios = [real / pred for pred, real in pairs if pred > 0 and real > 0]
    return float(np.median(ratios)) if ratios else 1.0


@dataclass
class JobHistory:
    """Realised runs of recurring jobs, newest last after sorting; the planner's memory across nights."""

    records: list[RealisedRun] = field(default_factory=list)
    drift_window: int = 10
    shrink_runs: float = 2.0
    """Job-wide ratios are shrunk toward 1 as ``n / (n + shrink_runs)``; a config's own ratio is used as is."""

    def __post_init__(self) -> None:
        if self.drift_window < 1:
            raise ValueError(f"drift_window={self.drift_window} is not allowed; it must be >= 1")
        self.records = sorted(self.records, key=lambda r: (r.finished_at, r.job, r.config_key))
        self._by_job: dict[str, list[RealisedRun]] = {}
        for record in self.records:
            self._by_job.setdefault(record.job, []).append(record)

    def add(self, record: RealisedRun) -> None:
        """Append a newer record."""
        self.records.append(record)
        self._by_job.setdefault(record.job, []).append(record)

    def for_job(self, job: str) -> list[RealisedRun]:
        return self._by_job.get(job, [])

    def correction(self, job: str, config_key: str) -> Correction:
        """Prediction correction for a job's configuration from its last ``drift_window`` runs."""
        runs = self.for_job(job)
        own = [r for r in runs if r.config_key == config_key][-self.drift_window :]
        if own:
            return Correction(
                time_factor=_median_ratio([(r.predicted_duration_s, r.realised_duration_s) for r in own]),
                energy_factor=_median_ratio([(r.predicted_energy_j, r.realised_energy_j) for r in own]),
                runs=len(own),
            )
        recent = [r for r in runs if not r.colocated_with][-self.drift_window :]
        if not recent:
            return Correction()
        weight = len(recent) / (len(recent) + self.shrink_runs)
        time_ratio = _median_ratio([(r.predicted_duration_s, r.realised_duration_s) for r in recent])
        energy_ratio = _median_ratio([(r.predicted_energy_j, r.realised_energy_j) for r in recent])
        return Correction(
            time_factor=1 + weight * (time_ratio - 1),
            energy_factor=1 + weight * (energy_ratio - 1),
            runs=len(recent),
        )

    def run_cost_model(
        self, job: str, profile_prediction: Callable[[RealisedRun], tuple[float, float] | None]
    ) -> RunCostModel:
        """The job's fixed + per-sample model from its last ``drift_window`` runs as they say about it alone.

        A solo run counts as it is; a co-located run counts through :meth:`RealisedRun.alone` (its sharing
        figures taken out), so a night spent sharing a GPU still teaches the job's fixed costs; a co-located
        run without sharing figures is skipped. ``profile_prediction(record)`` gives what the current profile
        predicts for that run's configuration and work, without any correction (duration s, energy J), or None
        when it cannot (the run is skipped).
        """
        seen = []
        alone = [a for a in (r.alone() for r in self.for_job(job)) if a is not None]
        for r in alone[-self.drift_window :]:
            base = profile_prediction(r)
            if base is not None and r.realised_duration_s > 0 and r.realised_energy_j > 0:
                seen.append((base, (r.realised_duration_s, r.realised_energy_j)))
        if not seen:
            return RunCostModel()
        fixed_s, time_factor = fit_fixed_and_rate([b[0] for b, _ in seen], [real[0] for _, real in seen])
        energy_fit = fit_fixed_and_rate([b[1] for b, _ in seen], [real[1] for _, real in seen])
        fixed_j, energy_factor = cap_fixed_energy([b for b, _ in seen], [real[1] for _, real in seen], fixed_s,
                                                  energy_fit)  # fmt: skip
        return RunCostModel(fixed_s, fixed_j, time_factor, energy_factor, len(seen))

    def epochs_to_target(self, job: str, batch_size: int | None, last: int | None = None) -> float | None:
        """Mean epochs the job needed to reach its target at this batch size over its last ``last`` runs that
        reached it (default: the recent window), or None."""
        seen = self.epochs_reached(job, batch_size, self.drift_window if last is None else last)
        return float(np.mean(seen)) if seen else None

    def epochs_reached(
        self, job: str, batch_size: int | None, last: int, default_batch_size: int | None = None
    ) -> list[float]:
        """Epochs each of the job's last ``last`` runs that reached its target at ``batch_size`` needed, oldest
        first (a run recorded without a batch size counts as ``default_batch_size``)."""
        return [
            float(r.epochs)
            for r in self.for_job(job)
            if (r.batch_size if r.batch_size is not None else default_batch_size) == batch_size
            and r.reached_target
            and r.epochs is not None
            and r.epochs > 0
        ][-last:]

    def pair_slowdown(self, job: str, other: str) -> float | None:
        """The worst slowdown ``job`` showed while co-located with ``other`` (recent window), or None."""
        seen = [
            r.observed_slowdown
            for r in self.for_job(job)
            if other in r.colocated_with and r.observed_slowdown is not None
        ][-self.drift_window :]
        return max(seen) if seen else None
