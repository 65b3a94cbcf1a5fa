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
      .pair_slowdown(job, other) -> float | None         # worst observed slowdown of job next to other
    BatchSizeExplorer(batch_sizes, default_batch_size, prior_cost_per_epoch, ...)  # see class doc
      .choose(rng) -> int; .stop_threshold(batch_size) -> float; .observe(batch_size, cost, reached, epochs)
      .unprofiled() -> list[int]; .add_profile(batch_size, cost_per_epoch)   # lazy profiling
      .budget() -> float; .charge(cost)                                      # conservative exploration

Prediction (what the planner uses): :class:`RunCostModel`, a per-run fixed part (start-up, data loading,
evaluation) plus a per-sample factor on the profile's figures, for time and energy, learned per job from its
realised solo runs against what the *profile* predicts for them (:func:`fit_fixed_and_rate`) and applied alike to
every configuration of the job.

Per-configuration ratio (``correction``, kept for reports): realised/predicted duration and energy, per job
and configuration, over the last ``drift_window`` runs (median, robust to one odd night); when a configuration has
no runs,
the job-wide ratio is used (shrunk toward 1 by the number of runs). A data drift shows up as a moving ratio
and the window forgets older nights.

Batch-size exploration (Zeus's problem, NSDI'23 §4): epochs-to-target per batch size is random and unknown;
cost per epoch per batch size is known from the profile (a short profiling window per batch size).
:class:`BatchSizeExplorer`

1. starts from the default batch size;
2. predicts an untried batch size's cost to target as profile cost per epoch × epochs predicted from the
   batch sizes seen so far (log-log interpolation, or extrapolation with the observed slope; a larger size
   than any seen is assumed to need ``b ** prior_epoch_exponent`` more epochs until two sizes are known, a
   smaller one no fewer) and tries the cheapest-predicted neighbour of a batch size known to converge — not
   Zeus's fixed "down, then up, twice" order; an untried size is only profiled once it becomes such a
   neighbour (:meth:`BatchSizeExplorer.unprofiled`);
3. tries it only if its optimistic predicted cost (``optimism`` × the prediction from the fewest epochs each
   seen size needed, so one unlucky run does not close a direction) is below the best mean seen and, when
   the job's number of recurrences is known, only if that saving over the remaining recurrences covers the
   worst loss of one exploratory run. When the cost per epoch of the job's default configuration is given,
   a size the profile does not promise a saving on (predicted cost from the mean epochs not below the best
   mean: only optimism makes it worth a try) is tried only while the saving banked over that default plus
   the incumbent's saving over the remaining recurrences covers its worst loss, and known sizes costlier
   than the incumbent are only drawn while that budget covers their extra cost — a conservative bandit: a
   guess the profile does not back cannot take the job's cumulative cost above its default's;
4. stops an exploratory run early once it has spent ``explore_beta`` × the best mean cost (at most that
   budget when the profile promised nothing), a run of a known batch size at ``beta`` × it, as Zeus;
5. confirms a promising single observation once (the observation shrunk halfway toward what the profile and
   the other sizes predict, so one unlucky run does not drop a size the profile favours), then exploits by
   Gaussian Thompson sampling whose spread never falls below the run-to-run variation seen on well-observed
   sizes and, when the number of recurrences is known, shrinks as √(remaining / horizon) (information is
   worth less as fewer recurrences remain).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from carbonflow.models import Plan, RunResult


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

    def __post_init__(self) -> None:
        if self.finished_at.tzinfo is None:
            raise ValueError(f"finished_at={self.finished_at.isoformat()} has no time zone; give it in UTC")
        for name in ("predicted_duration_s", "realised_duration_s", "predicted_energy_j", "realised_energy_j"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name}={value} is not allowed; it must be a finite number >= 0")

    @classmethod
    def from_result(
        cls,
        result: RunResult,
        plan: Plan,
        epochs: float | None = None,
        reached_target: bool | None = None,
        observed_slowdown: float | None = None,
    ) -> RealisedRun:
        """The record of a finished run against the plan that launched it."""
        return cls(
            job=result.job,
            config_key=plan.config.key(),
            finished_at=result.ended_at,
            predicted_duration_s=plan.predicted_duration_s,
            realised_duration_s=result.duration_s,
            predicted_energy_j=plan.predicted_energy_j,
            realised_energy_j=result.energy_total_j,
            batch_size=plan.config.batch_size,
            power_limit_w=plan.config.power_limit_w,
            containers=plan.config.containers,
            epochs=epochs,
            reached_target=reached_target,
            colocated_with=tuple(plan.colocated_with),
            observed_slowdown=observed_slowdown,
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
        """The job's fixed + per-sample model from its last ``drift_window`` solo runs.

        ``profile_prediction(record)`` gives what the current profile predicts for that run's configuration
        and work, without any correction (duration s, energy J), or None when it cannot (the run is skipped).
        """
        seen = []
        for r in [r for r in self.for_job(job) if not r.colocated_with][-self.drift_window :]:
            base = profile_prediction(r)
            if base is not None and r.realised_duration_s > 0 and r.realised_energy_j > 0:
                seen.append((base, (r.realised_duration_s, r.realised_energy_j)))
        if not seen:
            return RunCostModel()
        fixed_s, time_factor = fit_fixed_and_rate([b[0] for b, _ in seen], [real[0] for _, real in seen])
        fixed_j, energy_factor = fit_fixed_and_rate([b[1] for b, _ in seen], [real[1] for _, real in seen])
        return RunCostModel(fixed_s, fixed_j, time_factor, energy_factor, len(seen))

    def epochs_to_target(self, job: str, batch_size: int | None) -> float | None:
        """Mean epochs the job needed to reach its target at this batch size (recent window), or None."""
        runs = [
            r
            for r in self.for_job(job)
            if r.batch_size == batch_size and r.reached_target and r.epochs is not None and r.epochs > 0
        ][-self.drift_window :]
        if not runs:
            return None
        return float(np.mean([r.epochs for r in runs if r.epochs is not None]))

    def pair_slowdown(self, job: str, other: str) -> float | None:
        """The worst slowdown ``job`` showed while co-located with ``other`` (recent window), or None."""
        seen = [
            r.observed_slowdown
            for r in self.for_job(job)
            if other in r.colocated_with and r.observed_slowdown is not None
        ][-self.drift_window :]
        return max(seen) if seen else None


# ---------------------------------------------------------------------------------------------------------
# Batch-size exploration with profile-ordered Gaussian Thompson sampling and early stopping.


@dataclass
class _Arm:
    costs: list[float] = field(default_factory=list)
    failures: int = 0

    def mean(self) -> float:
        return float(np.mean(self.costs)) if self.costs else math.inf


@dataclass
class BatchSizeExplorer:
    """Choose a batch size per recurrence of a job trained to a target metric (see the module docstring).

    ``prior_cost_per_epoch`` maps candidate batch sizes to the cost of one epoch at their best power limit
    (from the profile, in the units of the objective, e.g. Zeus's cost in J); the default batch size must be
    there, the others may be profiled lazily: :meth:`unprofiled` lists those the explorer would weigh next,
    the caller profiles them and hands the result to :meth:`add_profile`. The caller runs the chosen batch
    size, stops it at :meth:`stop_threshold`, and reports the outcome with :meth:`observe`. Deterministic
    given the ``numpy.random.Generator`` handed to :meth:`choose`.
    """

    batch_sizes: Sequence[int]
    default_batch_size: int
    prior_cost_per_epoch: Mapping[int, float]
    beta: float = 2.0
    explore_beta: float = 1.5
    prior_cv: float = 0.15
    optimism: float = 0.9
    prior_epoch_exponent: float = 0.5
    """Before two batch sizes converged: epochs to target of a larger batch size assumed ∝ batch_size ** this
    (between perfect scaling, 0, and none, 1) and of a smaller one equal; replaced by the log-log slope
    observed as soon as two batch sizes converged."""
    max_failures: int = 2
    explore_budget: int | None = None
    """At most this many exploratory runs (None: unbounded; pruning keeps it small)."""
    horizon: int | None = None
    """Expected number of recurrences of the job (None: unknown, treated as unbounded)."""
    default_cost_per_epoch: float | None = None
    """Cost of one epoch of what the job runs without carbonflow (its default batch size at the GPU's maximum
    power limit), from the profile. When given, exploration is conservative: a run that may lose money is only
    made while the worst it can lose is covered by what was saved over that default so far plus what the
    incumbent will save over the remaining recurrences (see :meth:`budget`) — unless the profile itself
    promises a saving (see :meth:`explore_limit`)."""

    def __post_init__(self) -> None:
        if self.default_batch_size not in self.batch_sizes:
            raise ValueError(
                f"default_batch_size={self.default_batch_size} is not among batch_sizes={list(self.batch_sizes)}"
            )
        if self.default_batch_size not in self.prior_cost_per_epoch:
            raise ValueError(f"prior_cost_per_epoch has no entry for the default batch size {self.default_batch_size}")
        self.prior_cost_per_epoch = dict(self.prior_cost_per_epoch)
        self.arms: dict[int, _Arm] = {b: _Arm() for b in sorted(self.batch_sizes)}
        self.epochs_seen: dict[int, list[float]] = {b: [] for b in self.batch_sizes}
        self.explored = 0
        self.runs = 0
        self.completed = 0
        """Runs that reached the target (one per recurrence)."""
        self.spent = 0.0
        """Cost of every run observed (reached or not) plus the overheads given to :meth:`charge`."""

    # -- beliefs ------------------------------------------------------------------------------------------
    def best_mean(self) -> tuple[int, float]:
        """The batch size with the lowest mean observed cost to target (ties: smaller batch size)."""
        tried = [(arm.mean(), b) for b, arm in self.arms.items() if arm.costs]
        if not tried:
            return self.default_batch_size, math.inf
        cost, b = min(tried)
        return b, cost

    def _alive(self, b: int) -> bool:
        return self.arms[b].failures < self.max_failures

    def _failed(self, b: int) -> bool:
        """Tried and never reached the target."""
        return self.arms[b].failures > 0 and not self.arms[b].costs

    def default_cost(self) -> float | None:
        """Expected cost to target of the default configuration (None: not known, or not given)."""
        epochs = self.epochs_seen[self.default_batch_size]
        if self.default_cost_per_epoch is None or not epochs:
            return None
        return self.default_cost_per_epoch * float(np.mean(epochs))

    def budget(self) -> float:
        """What exploration may still lose with the job's cumulative cost staying below its default's.

        Saved so far over the default (runs completed × the default's expected cost − everything spent) plus
        what the incumbent saves over the default in each recurrence still to come (the current one included;
        none when the horizon is unknown). Unbounded without ``default_cost_per_epoch`` or before the default
        batch size reached the target (then the default's cost is not known).
        """
        default = self.default_cost()
        if default is None:
            return math.inf
        _, best = self.best_mean()
        remaining = 0 if self.horizon is None else max(0, self.horizon - self.completed)
        return self.completed * default - self.spent + remaining * (default - best)

    def charge(self, cost: float) -> None:
        """Count a cost that trained nothing (e.g. a profiling pass) against the exploration budget."""
        self.spent += cost

    def predicted_epochs(self, b: int, optimistic: bool = False, own: bool = True) -> float:
        """Epochs to target predicted for batch size ``b`` from the ones observed (see the class doc).

        Its own mean if ``b`` was seen (and ``own``); else from the other batch sizes, with ``optimistic`` from
        the fewest epochs each needed (one unlucky run must not close a direction), else from their means.
        """
        if self.epochs_seen[b] and own:
            return float(np.mean(self.epochs_seen[b]))
        summary = min if optimistic else np.mean
        seen = {x: float(summary(e)) for x, e in self.epochs_seen.items() if e and x != b}
        if not seen:
            return math.inf
        lo, hi = min(seen), max(seen)
        if any(self._failed(f) and hi < f <= b for f in self.arms):
            return math.inf  # at or beyond a larger batch size that never converged: assume none larger does
        if any(self._failed(f) and b <= f < lo for f in self.arms):
            return math.inf  # the same downwards
        xs = sorted(seen)
        lx = [math.log(x) for x in xs]
        ly = [math.log(seen[x]) for x in xs]
        if xs[0] < b < xs[-1]:
            return float(math.exp(np.interp(math.log(b), lx, ly)))
        if len(xs) == 1:  # one point: larger batches assumed to need more epochs, smaller ones no fewer
            slope = self.prior_epoch_exponent if b > xs[0] else 0.0
        elif b < xs[0]:
            slope = (ly[1] - ly[0]) / (lx[1] - lx[0])
        else:
            slope = (ly[-1] - ly[-2]) / (lx[-1] - lx[-2])
        slope = min(max(slope, 0.0), 2.0)  # more samples per step never need fewer epochs (within reason)
        if b < xs[0]:  # epochs do not fall with batch size: the fewest seen is an optimistic anchor (noise)
            return float(min(seen.values()) * math.exp(slope * (math.log(b) - lx[0])))
        return float(math.exp(ly[-1] + slope * (math.log(b) - lx[-1])))

    def predicted_cost(self, b: int, optimistic: bool = False) -> float:
        """Profile cost per epoch × predicted epochs to target (inf: not profiled)."""
        if b not in self.prior_cost_per_epoch:
            return math.inf
        return self.prior_cost_per_epoch[b] * self.predicted_epochs(b, optimistic)

    def _weighable(self) -> list[int]:
        """Untried batch sizes next to one known to converge (all untried ones while none is known)."""
        sizes = sorted(self.arms)
        converged = {i for i, b in enumerate(sizes) if self.arms[b].costs}
        return [
            b
            for i, b in enumerate(sizes)
            if not self.arms[b].costs
            and not self.arms[b].failures
            and (not converged or {i - 1, i + 1} & converged)  # no long extrapolations
        ]

    def unprofiled(self) -> list[int]:
        """Batch sizes the explorer would weigh next but has no profile of (profile them, then :meth:`add_profile`).

        Empty until the default batch size has run: only neighbours of a batch size known to converge count.
        """
        if not self.runs:
            return []
        return [b for b in self._weighable() if b not in self.prior_cost_per_epoch]

    def add_profile(self, batch_size: int, cost_per_epoch: float) -> None:
        """The profiled cost of one epoch at ``batch_size`` (at its best power limit)."""
        if batch_size not in self.arms:
            raise ValueError(f"batch_size={batch_size} is not among {list(self.arms)}")
        self.prior_cost_per_epoch[batch_size] = cost_per_epoch

    def untried_order(self) -> list[int]:
        """Untried, still plausible batch sizes, most promising first (by predicted cost to target).

        Only neighbours (in the sorted candidate list) of a batch size that reached the target, and only when
        their predicted cost, times ``optimism``, is below the best mean cost seen.
        """
        _, best = self.best_mean()
        scored = []
        for b in self._weighable():
            if b not in self.prior_cost_per_epoch:
                continue  # not profiled (yet)
            cost = self.predicted_cost(b, optimistic=True)
            if cost * self.optimism >= best:
                continue
            worst_loss = self.explore_limit(b)
            if worst_loss < best:
                continue  # a run stopped before it spent the incumbent's cost could not show it is better
            if self.horizon is not None and math.isfinite(best):
                remaining = max(0, self.horizon - self.completed)
                # Exploration never costs more than it saves: the optimistic saving over the remaining
                # recurrences must cover the worst loss of one exploratory run.
                if not exploration_pays_off(best - cost * self.optimism, worst_loss, remaining):
                    continue
            scored.append((cost, b))
        return [b for _, b in sorted(scored)]

    # -- decisions ----------------------------------------------------------------------------------------
    def choose(self, rng: np.random.Generator) -> int:
        """The batch size for the next recurrence."""
        if not self.arms[self.default_batch_size].costs and self._alive(self.default_batch_size):
            return self.default_batch_size
        budget_left = self.explore_budget is None or self.explored < self.explore_budget
        untried = self.untried_order()
        if untried and budget_left:
            return untried[0]
        _, best = self.best_mean()
        candidates = [b for b, arm in self.arms.items() if arm.costs and self._alive(b)]
        if not candidates:
            return self.default_batch_size
        # Conservative: an arm whose expected extra cost over the incumbent is more than the budget is not run.
        budget = self.budget()
        candidates = [b for b in candidates if self.arms[b].mean() - best <= max(budget, 0.0)] or candidates
        # Confirmation: an arm seen once and within 2 pooled CVs of the best is run once more before it
        # enters Thompson sampling; an arm seen once and worse than that is dropped.
        margin = 2 * self.pooled_cv()
        confirm = [
            (self.arms[b].mean(), b)
            for b in candidates
            if len(self.arms[b].costs) == 1 and self._one_run_estimate(b) <= best * (1 + margin)
        ]
        if confirm and budget_left and any(len(self.arms[b].costs) >= 2 for b in candidates):
            return min(confirm)[1]
        pool = [b for b in candidates if len(self.arms[b].costs) >= 2] or candidates
        cv = self.pooled_cv()
        # Finite horizon: what a draw can still teach is worth less as fewer recurrences remain.
        decay = 1.0 if self.horizon is None else math.sqrt(max(0, self.horizon - self.runs) / self.horizon)
        draws = []
        for b in pool:
            costs = self.arms[b].costs
            mean = float(np.mean(costs))
            sample_std = float(np.std(costs, ddof=1)) if len(costs) >= 2 else 0.0
            floor = max(cv, self.prior_cv) if len(costs) < 3 else cv
            std = max(sample_std, floor * mean) / math.sqrt(len(costs)) * decay
            draws.append((float(rng.normal(mean, max(std, 1e-12))), b))
        return min(draws)[1]

    def _one_run_estimate(self, b: int) -> float:
        """A batch size's cost seen once, shrunk halfway toward what the profile and the other sizes predict.

        One unlucky run (epochs to target vary run to run) must not drop a batch size the profile favours.
        """
        seen = self.arms[b].mean()
        predicted = self.prior_cost_per_epoch[b] * self.predicted_epochs(b, optimistic=True, own=False)
        return min(seen, (seen + predicted) / 2) if math.isfinite(predicted) else seen

    def pooled_cv(self) -> float:
        """Coefficient of variation of the cost to target, pooled over arms seen at least 3 times.

        Two similar observations of an arm must not make its posterior narrow: the run-to-run spread seen on
        well-observed arms is a floor (``prior_cv`` until some arm has 3 observations).
        """
        cvs = [
            float(np.std(arm.costs, ddof=1) / np.mean(arm.costs))
            for arm in self.arms.values()
            if len(arm.costs) >= 3 and np.mean(arm.costs) > 0
        ]
        return float(np.median(cvs)) if cvs else self.prior_cv

    def stop_threshold(self, batch_size: int | None = None) -> float:
        """Early-stop a run once its spent cost passes this (inf before any run reached the target).

        ``beta`` × the best mean cost for a batch size already known to converge; ``explore_beta`` × it for
        an exploratory run of an untried batch size: a run that has spent more than the best option costs
        on average cannot show that its batch size is better, so it is abandoned early.
        """
        _, best = self.best_mean()
        if batch_size is not None and not self.arms[batch_size].costs:
            return self.explore_limit(batch_size)
        return self.beta * best

    def explore_limit(self, batch_size: int) -> float:
        """Where an exploratory run of an untried batch size stops.

        ``explore_beta`` × the best mean cost when the profile promises a saving (predicted cost below the best
        mean); otherwise, when only optimism makes it worth a try, also at most the :meth:`budget`.
        """
        _, best = self.best_mean()
        limit = self.explore_beta * best
        if self.predicted_cost(batch_size) < best:
            return limit
        return min(limit, max(self.budget(), 0.0))

    def observe(self, batch_size: int, cost: float, reached: bool, epochs: float | None = None) -> None:
        """Record a finished (or early-stopped) run."""
        if batch_size not in self.arms:
            raise ValueError(f"batch_size={batch_size} is not among {list(self.arms)}")
        arm = self.arms[batch_size]
        self.runs += 1
        self.spent += cost
        self.completed += bool(reached)
        if batch_size != self.default_batch_size and not arm.costs and arm.failures == 0:
            self.explored += 1
        if reached:
            arm.costs.append(cost)
            if epochs is not None:
                self.epochs_seen[batch_size].append(epochs)
        else:
            arm.failures += 1


def exploration_pays_off(expected_gain_per_run: float, exploration_cost: float, remaining_runs: int) -> bool:
    """Explore only when the expected saving over the remaining recurrences covers the exploration's cost."""
    return expected_gain_per_run * remaining_runs > exploration_cost


def records_for(records: Iterable[RealisedRun], job: str) -> list[RealisedRun]:
    """The records of one job, oldest first."""
    return sorted((r for r in records if r.job == job), key=lambda r: r.finished_at)
