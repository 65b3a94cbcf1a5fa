"""The batch-size explorer of a job trained to a target metric, and its deadline logic, in one module.

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

An arm's cost is a run's realised energy; a run that shared its GPU counts at what its configuration costs
alone by the profile (its measured energy is a share of the pair's). Epochs to target per batch size are
predicted by :func:`expected_epochs`, the mean over the last ``EPOCHS_HISTORY_RUNS`` runs.

Deadline margin for a job trained to a target: epochs to target vary from run to run, so the latest start is
planned for :func:`deadline_epochs` — :func:`deadline_margin` × the most epochs one of the last
``DEADLINE_HISTORY_RUNS`` runs at this batch size needed, at most the job's epoch budget (the budget itself until
``DEADLINE_MIN_RUNS`` runs reached the target). The margin is learned tighter as the history grows: 1.5 × up to
30 runs, then its excess shrinking as 30/n to a floor of 1.1 × from 150 runs (the chance that the next run needs
more than all n seen is 1/(n+1)). When the caller stops exploratory runs early,
at most the explorer's threshold, plus the time to rerun at the best known batch size (:func:`deadline_margins`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.planning.candidate import Candidate
from carbonflow.planning.learning import JobHistory, RealisedRun

DEADLINE_EPOCH_MARGIN = 1.5
"""Latest start of a job trained to a target, with ``DEADLINE_MIN_RUNS`` runs seen at its batch size: for this ×
the most epochs one of them needed (see :func:`deadline_margin` for how it tightens as runs accumulate)."""
DEADLINE_MIN_RUNS = 3
"""Fewer runs that reached the target at a batch size than this: the deadline is planned for the whole budget."""
DEADLINE_MARGIN_FLOOR = 1.1
"""However long the history, the latest start keeps at least this × the most epochs seen."""
DEADLINE_STABLE_RUNS = 30
"""Up to this many runs at a batch size the margin stays ``DEADLINE_EPOCH_MARGIN``; beyond, its excess over 1
shrinks as ``DEADLINE_STABLE_RUNS / n`` — in proportion to the chance, 1/(n+1), that the next run needs more
epochs than every one of the n seen (see :func:`deadline_margin`)."""
DEADLINE_HISTORY_RUNS = 150
"""The most epochs seen is taken over this many latest runs at the batch size (far longer than the drift window
of the mean: a rare long run — a bimodal path, one seed in ten — must stay in view)."""
EPOCHS_HISTORY_RUNS = 40
"""Epochs to target at a batch size are predicted as their mean over this many latest runs that reached the
target there (:func:`expected_epochs`). Epochs to target vary run to run (often a discrete 4 or 5): the mean of
the history's 10-run drift window wanders, and a batch size left after an unlucky streak keeps that streak as
its prediction; 40 runs keep the standard error near a sixth of the run-to-run spread and still follow a drift
within weeks of nightly runs."""


def batch_size_of(config: Config, spec: JobSpec) -> int:
    """A configuration's batch size, else the job's own (the one expression for it)."""
    return config.batch_size if config.batch_size is not None else spec.batch_size


def point_power_w(point: ProfilePoint) -> float:
    """A profiled configuration's power: the sum over its devices (else energy per sample × throughput)."""
    total = point.power_total_w
    return total if total > 0 else point.energy_per_sample_j * point.throughput_samples_per_s


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

    def unprofiled(self, profile_cost: float = 0.0) -> list[int]:
        """Batch sizes the explorer would weigh next but has no profile of (profile them, then :meth:`add_profile`).

        Empty until the default batch size has run: only neighbours of a batch size known to converge count.
        ``profile_cost``: what profiling one batch size costs (the objective's units; trains nothing). A
        conservative explorer (``default_cost_per_epoch`` given) asks for no more profiles than its
        :meth:`budget` covers — profiling is exploration too, and where the default is already the best
        configuration nothing has been saved to pay for it.
        """
        if not self.runs:
            return []
        wanted = [b for b in self._weighable() if b not in self.prior_cost_per_epoch]
        if profile_cost > 0 and self.default_cost_per_epoch is not None:
            return wanted[: max(0, int(self.budget() // profile_cost))]
        return wanted

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


def batch_size_explorer(spec: JobSpec, profile: Profile, history: JobHistory | None) -> BatchSizeExplorer | None:
    """The batch-size explorer of a job trained to a target, with its history replayed (None: not opted in).

    Its prior is the profile's least energy per epoch at each candidate batch size; the history's runs
    (realised energy in J as the cost, whether the target was reached, epochs) are observed in time order.
    The caller may ask it for :meth:`~carbonflow.planning.learning.BatchSizeExplorer.stop_threshold` (J).
    """
    if not spec.batch_sizes or spec.target_metric is None or history is None:
        return None
    sizes = sorted(set(spec.batch_sizes) | {spec.batch_size})
    spe = profile.samples_per_epoch or spec.batch_size
    prior: dict[int, float] = {}
    for p in profile.points:
        bs = batch_size_of(p.config, spec)
        if bs in sizes:
            prior[bs] = min(prior.get(bs, float("inf")), _cost_per_epoch_j(p, spe))
    sizes = [b for b in sizes if b in prior]
    if spec.batch_size not in prior:
        return None
    # What the job costs per epoch without carbonflow (its batch size at the highest power limit profiled):
    # with it the explorer only risks a run that what it saved over that default covers.
    at_default = [p for p in profile.points if batch_size_of(p.config, spec) == spec.batch_size]
    top = max(at_default, key=lambda p: p.config.power_limit_w or math.inf)
    default_cost = _cost_per_epoch_j(top, spe)
    explorer = BatchSizeExplorer(sizes, spec.batch_size, prior, default_cost_per_epoch=default_cost)
    for r in history.for_job(spec.name):
        if r.batch_size in prior:
            explorer.observe(r.batch_size, _solo_cost_j(r, profile, spec, prior), bool(r.reached_target), r.epochs)  # type: ignore[arg-type]
    return explorer


def _solo_cost_j(r: RealisedRun, profile: Profile, spec: JobSpec, prior: Mapping[int, float]) -> float:
    """A run's cost as the explorer counts it: its realised energy, except for a run that shared its GPU, whose
    energy is a share of the pair's and says nothing about its batch size alone: the profile's energy per epoch
    at its configuration (else the batch size's least) × the epochs it ran."""
    if not r.colocated_with or not r.epochs or not profile.samples_per_epoch:
        return r.realised_energy_j
    spe = profile.samples_per_epoch
    for p in profile.points:
        if (
            batch_size_of(p.config, spec) == r.batch_size
            and p.config.power_limit_w == r.power_limit_w
            and p.throughput_samples_per_s > 0
            and not p.config.colocation_group
        ):
            return _cost_per_epoch_j(p, spe) * r.epochs
    return prior[r.batch_size] * r.epochs  # type: ignore[index]


def _cost_per_epoch_j(point: ProfilePoint, samples_per_epoch: int) -> float:
    """A profiled configuration's energy for one epoch (its power over its throughput, per sample, × samples)."""
    return point_power_w(point) / point.throughput_samples_per_s * samples_per_epoch


def choose_batch_size(spec: JobSpec, profile: Profile, history: JobHistory | None, seed: int = 0) -> int | None:
    """Tonight's batch size for a job trained to a target, learned across recurrences (None: not opted in).

    Asks :func:`batch_size_explorer`. Deterministic: the random stream is seeded by ``seed`` and the
    number of past runs.
    """
    explorer = batch_size_explorer(spec, profile, history)
    if explorer is None:
        return None
    return explorer.choose(np.random.default_rng([seed, explorer.runs]))


def expected_epochs(history: JobHistory, job: str, batch_size: int | None) -> float | None:
    """Mean epochs ``job`` needed to reach its target at ``batch_size`` over its last ``EPOCHS_HISTORY_RUNS``
    runs that reached it there (None: none did)."""
    return history.epochs_to_target(job, batch_size, last=EPOCHS_HISTORY_RUNS)


def deadline_margin(runs: int) -> float:
    """The factor over the most epochs seen that a target-trained job's latest start is planned for, given
    ``runs`` runs at the batch size that reached the target: ``DEADLINE_EPOCH_MARGIN`` up to
    ``DEADLINE_STABLE_RUNS`` runs, then ``1 + (DEADLINE_EPOCH_MARGIN − 1) · DEADLINE_STABLE_RUNS / runs``, at least
    ``DEADLINE_MARGIN_FLOOR`` (1.5 to 30 runs, 1.25 at 60, 1.15 at 100, the floor 1.1 from 150). The chance that
    the next run needs more epochs than all ``runs`` seen is 1/(runs + 1): the room kept for it shrinks alike."""
    if runs < 1:
        raise ValueError(f"runs={runs} is not allowed; give the number of runs seen (>= 1)")
    excess = (DEADLINE_EPOCH_MARGIN - 1.0) * min(1.0, DEADLINE_STABLE_RUNS / runs)
    return max(DEADLINE_MARGIN_FLOOR, 1.0 + excess)


def deadline_epochs(spec: JobSpec, history: JobHistory | None, batch_size: int | None) -> float | None:
    """Epochs a target-trained job's deadline is planned for at ``batch_size`` (None: not trained to a target).

    :func:`deadline_margin` (by the number of runs seen) × the most epochs one of the last
    ``DEADLINE_HISTORY_RUNS`` runs that reached the target at this batch size needed, at most ``spec.epochs``;
    ``spec.epochs`` while fewer than ``DEADLINE_MIN_RUNS`` runs did (epochs to target can be bimodal: ImageNet at
    batch 192 needs 20–22 or 31).
    """
    if spec.target_metric is None or spec.epochs is None or history is None:
        return None
    bs = batch_size if batch_size is not None else spec.batch_size
    seen = history.epochs_reached(spec.name, bs, DEADLINE_HISTORY_RUNS, default_batch_size=spec.batch_size)
    if len(seen) < DEADLINE_MIN_RUNS:
        return float(spec.epochs)
    return min(float(spec.epochs), deadline_margin(len(seen)) * max(seen))


def deadline_margins(
    spec: JobSpec,
    profile: Profile,
    history: JobHistory | None,
    candidates: Sequence[Candidate],
    explorer: BatchSizeExplorer | None,
) -> tuple[np.ndarray | None, dict[int, float]]:
    """Deadline margins of a job trained to a target (None when it is not), and time to reserve per batch size.

    Per candidate: the epochs its deadline is planned for (:func:`deadline_epochs`, at most the explorer's
    early-stop threshold in epochs) over its expected epochs, >= 1. Per untried batch size: the time to rerun
    at the best known batch size (its fastest configuration, for its deadline epochs) after an early stop.
    """
    if spec.target_metric is None or spec.epochs is None or history is None or not profile.samples_per_epoch:
        return None, {}
    out = np.ones(len(candidates))
    expected_by_bs: dict[int | None, float] = {}
    for i, c in enumerate(candidates):
        bs = c.config.batch_size
        if bs not in expected_by_bs:
            expected_by_bs[bs] = (
                (c.duration_s - c.fixed_s) * c.point.throughput_samples_per_s / profile.samples_per_epoch
            )
        expected = expected_by_bs[bs]
        most = deadline_epochs(spec, history, bs)
        if explorer is not None and batch_size_of(c.config, spec) in explorer.arms and expected > 0:
            stop_j = explorer.stop_threshold(batch_size_of(c.config, spec))
            if np.isfinite(stop_j) and c.energy_j > 0:
                most = min(most if most is not None else float("inf"), stop_j / (c.energy_j / expected))
        if most is not None and expected > 0:
            out[i] = max(1.0, most / expected)
    reserve: dict[int, float] = {}
    if explorer is not None:
        best, best_cost = explorer.best_mean()
        if np.isfinite(best_cost):
            rerun = [
                c.duration_s * m
                for c, m in zip(candidates, out, strict=True)
                if batch_size_of(c.config, spec) == best and c.within_slowdown
            ]
            for b, arm in explorer.arms.items():
                if not arm.costs and b != best:
                    reserve[b] = min(rerun, default=0.0)
    return out, reserve
