"""The batch-size explorer of a job trained to a target metric, and its deadline logic, in one module.

Batch-size exploration (Zeus's problem, NSDI'23 §4): epochs to target per batch size are random and unknown; the
cost of one epoch at each batch size is known from its profile (a short probe, then the first run's in-run sweep).
:class:`BatchSizeExplorer`

1. starts from the default batch size;
2. believes epochs to target per batch size through :class:`~carbonflow.planning.epochs_curve.EpochsCurve` (a
   Gaussian process over log epochs against log batch size, fed by every run: those that reached the target and,
   censored, those that stopped short), so one run at a batch size also tells of its neighbours;
3. chooses each recurrence's batch size by the online knowledge gradient over the job's finite horizon (Ryzhov,
   Powell & Frazier 2012): the batch size with the least ``expected cost − (recurrences left − 1) × the expected
   saving that learning from its run buys every later recurrence``, the saving being the fall in the least
   expected cost after one (or a few) more runs there. A batch size barely better on paper is not re-run once
   what it could teach is worth less than what it costs, and nothing is explored near the horizon's end;
4. is conservative when the cost per epoch of the job's default configuration is given: a batch size whose
   expected extra cost over the incumbent is more than the saving banked over that default plus what the
   incumbent saves over the remaining recurrences (:meth:`BatchSizeExplorer.budget`) is not run, and an
   exploratory run the curve does not back (its pessimistic cost, one standard deviation up, is not below the
   incumbent's) is stopped at that budget — so a guess cannot take the job's cumulative cost above its default's;
5. stops an exploratory run early once it has spent ``explore_beta`` × the incumbent's expected cost, a run of a
   known batch size at ``beta`` × it, as Zeus; the stopped run is a censored observation, and a batch size that
   stopped ``max_failures`` times without ever reaching the target is dropped, with every size beyond it;
6. asks for a profile only of the untried neighbours of a batch size known to converge
   (:meth:`BatchSizeExplorer.unprofiled`), while its budget covers one.

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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.planning.candidate import Candidate
from carbonflow.planning.epochs_curve import EpochsCurve
from carbonflow.planning.learning import JobHistory, RealisedRun

LOOKAHEAD_RUNS = (1, 2, 4, 8)
"""The knowledge gradient weighs what 1, 2, 4 or 8 more runs at a batch size would teach, per run, and takes the
most (KG*: one noisy run alone rarely changes the decision between near-equal batch sizes, a few may)."""
QUADRATURE_NODES = 20
"""Gauss-Hermite nodes over the outcome of those runs."""
PROBE_REACH = 1
"""An untried batch size is weighed (and probed) when it is at most this many places, in the sorted candidates,
from one known to converge."""
EXPLORE_CEILING = 2.0
"""An exploratory run stops at the latest once it spent this × the best mean cost."""
STOP_BISECTIONS = 40
"""Bisection steps of :meth:`BatchSizeExplorer.explore_limit` (the limit to within 2⁻⁴⁰ of its range)."""
ROLLING_HORIZON_RUNS = 60
"""When the job's number of recurrences is not known (a nightly job runs on): what one more run teaches is weighed
over this many later runs (two months of nights), whatever how many ran."""

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
    stopped_epochs: list[float] = field(default_factory=list)
    """Epochs of the runs that did not reach the target (censored observations of the epochs needed)."""

    def mean(self) -> float:
        return float(np.mean(self.costs)) if self.costs else math.inf


@dataclass
class BatchSizeExplorer:
    """Choose a batch size per recurrence of a job trained to a target metric (see the module docstring).

    ``prior_cost_per_epoch`` maps candidate batch sizes to the cost of one epoch at their best power limit
    (from the profile, in the units of the objective, e.g. Zeus's cost in J); the default batch size must be
    there, the others may be profiled lazily: :meth:`unprofiled` lists those the explorer would weigh next,
    the caller profiles them and hands the result to :meth:`add_profile`. The caller runs the chosen batch
    size, stops it at :meth:`stop_threshold`, and reports the outcome with :meth:`observe`. Deterministic.
    """

    batch_sizes: Sequence[int]
    default_batch_size: int
    prior_cost_per_epoch: Mapping[int, float]
    beta: float = 2.0
    max_failures: int = 2
    horizon: int | None = None
    """The job's number of recurrences in all (``JobSpec.recurrences``; None: unknown, weighed as a rolling
    ``ROLLING_HORIZON_RUNS`` more)."""
    default_cost_per_epoch: float | None = None
    """Cost of one epoch of what the job runs without carbonflow (its default batch size at the GPU's maximum
    power limit), from the profile. When given, exploration is conservative (see :meth:`budget`)."""

    def __post_init__(self) -> None:
        if self.default_batch_size not in self.batch_sizes:
            raise ValueError(
                f"default_batch_size={self.default_batch_size} is not among batch_sizes={list(self.batch_sizes)}"
            )
        if self.default_batch_size not in self.prior_cost_per_epoch:
            raise ValueError(f"prior_cost_per_epoch has no entry for the default batch size {self.default_batch_size}")
        if self.horizon is not None and self.horizon < 1:
            raise ValueError(f"horizon={self.horizon} is not allowed; give the number of recurrences (>= 1) or None")
        self.prior_cost_per_epoch = dict(self.prior_cost_per_epoch)
        self.arms: dict[int, _Arm] = {b: _Arm() for b in sorted(self.batch_sizes)}
        self.epochs_seen: dict[int, list[float]] = {b: [] for b in self.batch_sizes}
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

    def _dead(self, b: int) -> bool:
        """Stopped ``max_failures`` times without ever reaching the target."""
        return not self.arms[b].costs and self.arms[b].failures >= self.max_failures

    def curve(self) -> EpochsCurve:
        """The belief over epochs to target per batch size, from every run observed."""
        stopped = {b: arm.stopped_epochs for b, arm in self.arms.items() if arm.stopped_epochs}
        return EpochsCurve(self.default_batch_size, self.epochs_seen, stopped)

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
        ``ROLLING_HORIZON_RUNS`` when the horizon is unknown: then the cumulative cost stays below the default's
        over that window, not over a job whose end is not known). Unbounded without ``default_cost_per_epoch``
        or before the default batch size reached the target (then the default's cost is not known).
        """
        default = self.default_cost()
        if default is None:
            return math.inf
        _, best = self.best_mean()
        remaining = ROLLING_HORIZON_RUNS if self.horizon is None else max(0, self.horizon - self.completed)
        return self.completed * default - self.spent + remaining * (default - best)

    def charge(self, cost: float) -> None:
        """Count a cost that trained nothing (e.g. a profiling pass) against the exploration budget."""
        self.spent += cost

    def predicted_epochs(self, b: int, own: bool = True) -> float:
        """Epochs to target expected at batch size ``b``: its own mean if it reached the target (and ``own``),
        else what the curve of every run says (inf: no run reached the target yet, or ``b`` is beyond a batch size
        that never reached it)."""
        if self.epochs_seen[b] and own:
            return float(np.mean(self.epochs_seen[b]))
        if self._beyond_dead(b) or not any(self.epochs_seen.values()):
            return math.inf  # nothing reached the target yet: the curve has no level to stand on
        return self.curve().expected_epochs(b)

    def predicted_cost(self, b: int) -> float:
        """Profile cost per epoch × predicted epochs to target (inf: not profiled)."""
        if b not in self.prior_cost_per_epoch:
            return math.inf
        return self.prior_cost_per_epoch[b] * self.predicted_epochs(b)

    def _beyond_dead(self, b: int) -> bool:
        """At or beyond (away from every batch size that converged) one that was dropped."""
        converged = [x for x, arm in self.arms.items() if arm.costs]
        if not converged:
            return self._dead(b)
        lo, hi = min(converged), max(converged)
        return any(self._dead(f) and (hi < f <= b or b <= f < lo) for f in self.arms)

    def _weighable(self, within: Collection[int] | None = None) -> list[int]:
        """Untried batch sizes within ``PROBE_REACH`` places of one known to converge (all while none is known);
        ``within``: places counted among these batch sizes (and those that converged) only."""
        sizes = sorted(b for b, arm in self.arms.items() if within is None or b in within or arm.costs)
        converged = [i for i, b in enumerate(sizes) if self.arms[b].costs]
        return [
            b
            for i, b in enumerate(sizes)
            if not self.arms[b].costs
            and not self.arms[b].failures
            and (not converged or min(abs(i - j) for j in converged) <= PROBE_REACH)  # no long extrapolations
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

    # -- decisions ----------------------------------------------------------------------------------------
    def candidates(self, allowed: Collection[int] | None = None) -> list[int]:
        """The batch sizes tonight may run: profiled, not dropped, not beyond a dropped one, and either run
        already or next to one known to converge (no long jumps: a batch size skipped over is left a guess).
        ``allowed``: only these, "next to" counted among them (a neighbour that cannot run tonight is stepped
        over, not a wall)."""
        near = set(self._weighable(allowed))
        return [
            b
            for b, arm in sorted(self.arms.items())
            if b in self.prior_cost_per_epoch
            and (allowed is None or b in allowed)
            and not self._beyond_dead(b)
            and (arm.costs or arm.failures or b in near)
        ]

    def choose(self, rng: np.random.Generator | None = None, allowed: Collection[int] | None = None) -> int:
        """The batch size for the next recurrence (deterministic; ``rng`` is accepted and unused).

        ``allowed``: the batch sizes the caller can run tonight (e.g. those with a configuration inside the slowdown
        bound and finish-by); the choice is among them (the default batch size when none is a candidate)."""
        if not self.arms[self.default_batch_size].costs and not self._dead(self.default_batch_size):
            return self.default_batch_size
        sizes = self.candidates(allowed)
        if not sizes:
            return self.default_batch_size
        curve = self.curve()
        mean, cov = curve.posterior(sizes)
        per_epoch = np.array([self.prior_cost_per_epoch[b] for b in sizes])
        expected = per_epoch * np.exp(mean + (np.diag(cov) + curve.noise_var) / 2)
        least = float(expected.min())
        later = ROLLING_HORIZON_RUNS if self.horizon is None else max(0, self.horizon - self.completed - 1)
        budget = max(self.budget(), 0.0)
        scored = []
        for i, b in enumerate(sizes):
            if expected[i] - least > budget:
                continue  # conservative: its expected extra cost is more than exploration may lose
            if not self.arms[b].costs and self.explore_limit(b) < least:
                continue  # a run stopped before it spent the incumbent's cost could not show it is better
            gain = knowledge_gradient(per_epoch, mean, cov, curve.noise_var, i) if later else 0.0
            scored.append((expected[i] - later * gain, expected[i], b))
        if not scored:
            return sizes[int(np.argmin(expected))]
        return min(scored)[2]

    def stop_threshold(self, batch_size: int | None = None) -> float:
        """Early-stop a run once its spent cost passes this (inf before any run reached the target).

        ``beta`` × the best mean cost for a batch size already known to converge (Zeus's rule); for an
        exploratory run of an untried batch size, :meth:`explore_limit`.
        """
        _, best = self.best_mean()
        if batch_size is not None and not self.arms[batch_size].costs:
            return self.explore_limit(batch_size)
        return self.beta * best

    def explore_limit(self, batch_size: int) -> float:
        """Where an exploratory run of an untried batch size stops: once what it still needs would cost more than
        a fresh run at the best batch size — the cost per epoch there × the epochs the curve expects it to need
        beyond those it ran, given that it has not reached the target yet, passes the best mean cost.

        At least the best mean (a run stopped before it spent that could not show it is better), at most ``beta``
        × it; when its profile does not promise a saving (see :meth:`_promised`) and only the curve's
        uncertainty makes it worth a try, at most the :meth:`budget` too.
        """
        _, best = self.best_mean()
        if not math.isfinite(best) or batch_size not in self.prior_cost_per_epoch:
            return best
        ceiling = EXPLORE_CEILING * best
        if not self._promised(batch_size, best):
            ceiling = min(ceiling, max(self.budget(), 0.0))
        if ceiling <= best:
            return ceiling
        per_epoch = self.prior_cost_per_epoch[batch_size]
        curve = self.curve()
        mean, cov = curve.posterior([batch_size])
        epochs = LogNormal(float(mean[0]), math.sqrt(max(cov[0, 0], 0.0) + curve.noise_var))

        def still_pays(spent: float) -> bool:
            return per_epoch * epochs.mean_residual(spent / per_epoch) <= best

        if not still_pays(best):
            return best
        if still_pays(ceiling):
            return ceiling
        low, high = best, ceiling
        for _ in range(STOP_BISECTIONS):
            middle = (low + high) / 2
            low, high = (middle, high) if still_pays(middle) else (low, middle)
        return low

    def _promised(self, batch_size: int, best: float) -> bool:
        """The profile promises a saving at ``batch_size``: at the mean epochs of the nearest batch size that
        reached the target (in log batch size; ties: the smaller), its cost per epoch beats ``best``."""
        converged = [b for b, arm in self.arms.items() if arm.costs and self.epochs_seen[b]]
        if batch_size not in self.prior_cost_per_epoch or not converged:
            return False
        nearest = min(converged, key=lambda b: (abs(math.log2(b / batch_size)), b))
        return self.prior_cost_per_epoch[batch_size] * float(np.mean(self.epochs_seen[nearest])) < best

    def observe(self, batch_size: int, cost: float, reached: bool, epochs: float | None = None) -> None:
        """Record a finished (or early-stopped) run; ``epochs``: the epochs it needed (reached) or ran (not)."""
        if batch_size not in self.arms:
            raise ValueError(f"batch_size={batch_size} is not among {list(self.arms)}")
        if not math.isfinite(cost) or cost < 0:
            raise ValueError(f"cost={cost} is not allowed; give the run's cost, a finite number >= 0")
        arm = self.arms[batch_size]
        self.runs += 1
        self.spent += cost
        self.completed += bool(reached)
        if reached:
            arm.costs.append(cost)
            if epochs is not None:
                self.epochs_seen[batch_size].append(epochs)
        else:
            arm.failures += 1
            if epochs is not None and epochs > 0:
                arm.stopped_epochs.append(epochs)


@dataclass(frozen=True)
class LogNormal:
    """Epochs to target of the next run: ln(epochs) ~ N(``mu``, ``sigma``²)."""

    mu: float
    sigma: float

    def mean_residual(self, ran: float) -> float:
        """Expected epochs still needed by a run that has run ``ran`` epochs without reaching the target."""
        if ran <= 0:
            return math.exp(self.mu + self.sigma**2 / 2)
        if self.sigma <= 0:
            return max(math.exp(self.mu) - ran, 0.0)
        z = (math.log(ran) - self.mu) / self.sigma
        beyond = norm.sf(z)
        if beyond < 1e-12:
            return math.inf  # far past anything the curve expects: it will not be reached soon
        return math.exp(self.mu + self.sigma**2 / 2) * norm.sf(z - self.sigma) / beyond - ran


_NODES, _NODE_WEIGHTS = np.polynomial.hermite_e.hermegauss(QUADRATURE_NODES)
_NODE_WEIGHTS = _NODE_WEIGHTS / _NODE_WEIGHTS.sum()


def knowledge_gradient(
    cost_per_epoch: np.ndarray, mean: np.ndarray, cov: np.ndarray, noise_var: float, i: int
) -> float:
    """The expected fall of the least expected cost to target (cost per epoch × log-normal epochs) that runs at
    arm ``i`` buy, per run, the most over ``LOOKAHEAD_RUNS`` (their mean ln epochs updates every arm's posterior
    through the curve's covariance; the expectation is over that mean by Gauss-Hermite quadrature)."""
    var = np.diag(cov)
    least = float((cost_per_epoch * np.exp(mean + (var + noise_var) / 2)).min())
    best = 0.0
    for runs in LOOKAHEAD_RUNS:
        spread = var[i] + noise_var / runs
        if spread <= 0:
            continue
        outcomes = mean[i] + math.sqrt(spread) * _NODES
        shift = cov[:, i] / spread
        var_after = var - cov[:, i] ** 2 / spread
        after = mean[None, :] + shift[None, :] * (outcomes[:, None] - mean[i]) + (var_after[None, :] + noise_var) / 2
        least_after = (cost_per_epoch[None, :] * np.exp(after)).min(axis=1)
        best = max(best, (least - float(_NODE_WEIGHTS @ least_after)) / runs)
    return best


def batch_size_explorer(spec: JobSpec, profile: Profile, history: JobHistory | None) -> BatchSizeExplorer | None:
    """The batch-size explorer of a job trained to a target, with its history replayed (None: not opted in).

    Every candidate batch size is an arm; its prior is the profile's least energy per epoch there, for the batch
    sizes profiled (the others wait for a probe: :meth:`BatchSizeExplorer.unprofiled`). The history's runs
    (realised energy in J as the cost, whether the target was reached, the epochs run) are observed in time
    order. The caller may ask it for :meth:`BatchSizeExplorer.stop_threshold` (J).
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
    if spec.batch_size not in prior:
        return None
    # What the job costs per epoch without carbonflow (its batch size at the highest power limit profiled):
    # with it the explorer only risks a run that what it saved over that default covers.
    at_default = [p for p in profile.points if batch_size_of(p.config, spec) == spec.batch_size]
    top = max(at_default, key=lambda p: p.config.power_limit_w or math.inf)
    default_cost = _cost_per_epoch_j(top, spe)
    explorer = BatchSizeExplorer(
        sizes, spec.batch_size, prior, horizon=spec.recurrences, default_cost_per_epoch=default_cost
    )
    for r in history.for_job(spec.name):
        if r.batch_size in explorer.arms:
            explorer.observe(r.batch_size, _solo_cost_j(r, profile, spec, prior), bool(r.reached_target), r.epochs)
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
    if r.batch_size not in prior:
        return r.realised_energy_j  # never profiled alone: its measured share is all there is
    return prior[r.batch_size] * r.epochs


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
