"""Predict how fast two jobs run when they share one GPU, from their solo profiles and any pair history.

Profiling every pair of jobs that could share a GPU does not scale: fifty new jobs make 1,225 pairs.
EaCO avoids exhaustive pairing with history and early observation; Gavel and Lucid predict
interference from solo measurements. This module is carbonflow's small model of that kind:

* **Solo part.** ``keep(a | b)``, the fraction of its solo speed job ``a`` keeps next to ``b``, is a
  linear function of what the two solo profiles measured: each job's GPU load (its average power as
  a fraction of the power limit) and the log of its step time. The coefficients are fitted by least
  squares on every pair outcome carbonflow has recorded, whichever jobs they were.
* **History part.** A job that has shared a GPU before carries two learned offsets: how much more
  (or less) it suffers than the solo part predicts (*sensitivity*), and how much more it slows its
  partners (*pressure*). Each offset is the mean residual of that job's recorded outcomes, shrunk
  toward zero by ``n / (n + shrinkage)`` so one odd night does not dominate.

Prediction error is measured by leave-one-pair-out on Gavel's measured V100 pairs
(``benchmarks/pair_prediction.py``); the planner profiles only the most promising unknown pairs
within a nightly budget (:func:`pairs_to_profile`) and lets the early-observation guard settle the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from carbonflow.domain import Profile

MIN_KEPT_SPEED = 0.05
"""Predictions are clipped to [MIN_KEPT_SPEED, 1]: a job never runs faster next to another than alone."""


@dataclass(frozen=True)
class SoloFeatures:
    """What one job's solo profile says about how hard it works the GPU."""

    job: str
    gpu_load: float
    """Average power alone at the reference limit, as a fraction of that limit (0–1)."""
    step_time_s: float
    """Seconds per training step alone at the reference limit."""

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_load <= 1.5:
            raise ValueError(f"gpu_load={self.gpu_load} for job {self.job!r} must be in (0, 1.5]")
        if not self.step_time_s > 0.0:
            raise ValueError(f"step_time_s={self.step_time_s} for job {self.job!r} must be > 0")


@dataclass(frozen=True)
class PairOutcome:
    """A measured co-location: the fraction of solo speed each job kept while sharing one GPU."""

    job_a: str
    job_b: str
    kept_speed_a: float
    kept_speed_b: float


@dataclass(frozen=True)
class PairPrediction:
    job_a: str
    job_b: str
    kept_speed_a: float
    kept_speed_b: float
    from_history: bool
    """True when either job's own pair history shaped the prediction (not only the solo profiles)."""

    @property
    def combined_speed(self) -> float:
        """Sum of kept speeds: above 1 the pair does more work per GPU-second than running one after the other."""
        return self.kept_speed_a + self.kept_speed_b


def _design_row(victim: SoloFeatures, partner: SoloFeatures) -> list[float]:
    return [1.0, victim.gpu_load, partner.gpu_load, np.log(victim.step_time_s), np.log(partner.step_time_s)]


@dataclass
class PairPredictor:
    """Fitted solo-part coefficients plus per-job history offsets; see the module docstring."""

    coefficients: np.ndarray
    sensitivity: dict[str, float] = field(default_factory=dict)
    pressure: dict[str, float] = field(default_factory=dict)
    outcomes_seen: int = 0

    def kept_speed(self, victim: SoloFeatures, partner: SoloFeatures) -> float:
        base = float(np.dot(self.coefficients, _design_row(victim, partner)))
        adjusted = base + self.sensitivity.get(victim.job, 0.0) + self.pressure.get(partner.job, 0.0)
        return float(np.clip(adjusted, MIN_KEPT_SPEED, 1.0))

    def predict(self, a: SoloFeatures, b: SoloFeatures) -> PairPrediction:
        from_history = any(j in self.sensitivity or j in self.pressure for j in (a.job, b.job))
        return PairPrediction(a.job, b.job, self.kept_speed(a, b), self.kept_speed(b, a), from_history)


def _directed(outcomes: Iterable[PairOutcome]) -> list[tuple[str, str, float]]:
    """(victim, partner, kept speed of the victim) for both directions of every outcome."""
    rows = []
    for o in outcomes:
        rows.append((o.job_a, o.job_b, o.kept_speed_a))
        rows.append((o.job_b, o.job_a, o.kept_speed_b))
    return rows


def _shrunk_mean(values: list[float], shrinkage: float) -> float:
    return float(np.sum(values) / (len(values) + shrinkage))


def fit_pair_predictor(
    solo: Mapping[str, SoloFeatures], outcomes: Sequence[PairOutcome], *, shrinkage: float = 2.0, ridge: float = 1e-3
) -> PairPredictor:
    """Fit the solo part on ``outcomes`` (any jobs), then each job's history offsets from its residuals.

    With no outcomes at all the predictor says "no slowdown" (coefficients keep 1.0): the planner then
    relies on pair profiles and the early-observation guard alone.
    """
    missing = sorted({j for o in outcomes for j in (o.job_a, o.job_b)} - set(solo))
    if missing:
        raise ValueError(f"pair outcomes name jobs without a solo profile: {missing}")
    coefficients = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    rows = _directed(outcomes)
    if not rows:
        return PairPredictor(coefficients)
    x = np.array([_design_row(solo[v], solo[p]) for v, p, _ in rows])
    y = np.array([k for _, _, k in rows])
    coefficients = np.linalg.solve(x.T @ x + ridge * np.eye(x.shape[1]), x.T @ y)
    residual = y - x @ coefficients
    as_victim: dict[str, list[float]] = {}
    for (victim, _, _), r in zip(rows, residual, strict=True):
        as_victim.setdefault(victim, []).append(float(r))
    sensitivity = {j: _shrunk_mean(v, shrinkage) for j, v in as_victim.items()}
    as_partner: dict[str, list[float]] = {}
    for (victim, partner, _), r in zip(rows, residual, strict=True):
        as_partner.setdefault(partner, []).append(float(r) - sensitivity[victim])
    pressure = {j: _shrunk_mean(v, shrinkage) for j, v in as_partner.items()}
    return PairPredictor(coefficients, sensitivity, pressure, outcomes_seen=len(outcomes))


@dataclass(frozen=True)
class PairToProfile:
    job_a: str
    job_b: str
    predicted: PairPrediction
    profile_gpu_s: float


def pairs_to_profile(
    predictions: Sequence[PairPrediction],
    profile_gpu_s: Mapping[tuple[str, str], float],
    *,
    max_pairs: int,
    max_gpu_s: float,
    min_combined_speed: float = 1.0,
) -> list[PairToProfile]:
    """The unknown pairs worth profiling tonight: most promising first, within both budgets.

    A pair is promising when its predicted combined speed exceeds ``min_combined_speed`` (sharing does
    more work per GPU-second than running apart). Pairs are taken in order of predicted combined speed
    until ``max_pairs`` or ``max_gpu_s`` GPU-seconds of profiling would be exceeded; the rest are left
    to the early-observation guard during real runs.
    """
    if max_pairs < 0 or max_gpu_s < 0:
        raise ValueError(f"max_pairs={max_pairs} and max_gpu_s={max_gpu_s} must be >= 0")
    ranked = sorted((p for p in predictions if p.combined_speed > min_combined_speed), key=lambda p: -p.combined_speed)
    chosen: list[PairToProfile] = []
    spent_s = 0.0
    for p in ranked:
        cost_s = profile_gpu_s[(p.job_a, p.job_b)]
        if len(chosen) >= max_pairs or spent_s + cost_s > max_gpu_s:
            continue
        chosen.append(PairToProfile(p.job_a, p.job_b, p, cost_s))
        spent_s += cost_s
    return chosen


def solo_features(profile: Profile) -> SoloFeatures:
    """What the predictor reads from a solo profile: GPU load and step time at the default limit, smallest batch."""
    at_default = [p for p in profile.points if p.config.power_limit_w == profile.default_power_limit_w]
    point = min(at_default or profile.points, key=lambda p: p.config.batch_size or 0)
    limit_w = profile.default_power_limit_w or max(sum(point.power_per_device_w.values()), 1.0)
    load = min(max(sum(point.power_per_device_w.values()) / limit_w, 1e-3), 1.5)
    step_s = (point.config.batch_size or 1) / max(point.throughput_samples_per_s, 1e-9)
    return SoloFeatures(profile.job, load, step_s)


def choose_pairs(
    candidates: Sequence[tuple[str, str]],
    profiles: Mapping[str, Profile],
    outcomes: Sequence[PairOutcome],
    *,
    max_pairs: int,
    max_gpu_s: float,
    pair_profile_gpu_s: float,
) -> list[PairToProfile]:
    """Tonight's pairs to profile among ``candidates`` (unknown pairs that could share a GPU), most promising
    first, within ``max_pairs`` and ``max_gpu_s``; each pair profile costs ``pair_profile_gpu_s``."""
    solo = {name: solo_features(profile) for name, profile in profiles.items()}
    known = [o for o in outcomes if o.job_a in solo and o.job_b in solo]
    predictor = fit_pair_predictor(solo, known)
    predictions = [predictor.predict(solo[a], solo[b]) for a, b in candidates]
    cost = {(p.job_a, p.job_b): pair_profile_gpu_s for p in predictions}
    return pairs_to_profile(predictions, cost, max_pairs=max_pairs, max_gpu_s=max_gpu_s)
