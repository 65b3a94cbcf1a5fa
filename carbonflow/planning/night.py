"""Planning a night's batch: each job's solo plan, then the pairs that share a GPU where that saves more.

Pure and deterministic. Co-location is chosen only when the predicted slowdown of *each* job stays inside its
``max_slowdown`` and both deadlines hold, and only when it saves on the jobs' objectives, scored by the selectors
their solo plans are chosen by (:func:`carbonflow.planning.pairs.pair_option`); after launch the early-observation
check (:func:`carbonflow.planning.early_observation.separate_if_slow`) separates a pair whose measured slowdown
breaks a bound. A pair's timeline, energy, score and plans: :mod:`carbonflow.planning.pairs`. Fitting the night
onto its GPUs: :mod:`carbonflow.planning.night_gpus`.

API others call::

    plan_night(specs, profiles, forecasts, now, pair_profiles=None, history=None, early_stop=False,
               intensity_history=None) -> list[Plan]
    choose_colocation_pairs(jobs, max_slowdowns, pair_slowdowns, savings) -> list[tuple[str, str]]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime

from carbonflow.domain import Forecast, ForecastPoint, JobSpec, Plan, Profile
from carbonflow.objectives import Reference
from carbonflow.planning.batch_size import batch_size_explorer, batch_size_of
from carbonflow.planning.candidate import Candidate
from carbonflow.planning.learning import JobHistory
from carbonflow.planning.optimizer import DeadlineError, plan_job
from carbonflow.planning.pairs import PairOption, PairProfile, lookup_pair, pair_option, pair_plans


def choose_colocation_pairs(
    jobs: Sequence[str],
    max_slowdowns: Mapping[str, float],
    pair_slowdowns: Mapping[tuple[str, str], tuple[float, float] | None],
    savings: Mapping[tuple[str, str], float],
) -> list[tuple[str, str]]:
    """Greedy matching: pairs with positive saving whose both slowdowns stay inside the bounds, best first.

    ``pair_slowdowns[(a, b)] = (slowdown of a, slowdown of b)``; ``savings[(a, b)]`` in the objective's units.
    Each job is in at most one pair. Deterministic (ties by names). O(P log P) for P candidate pairs.
    """
    order = {job: i for i, job in enumerate(jobs)}
    scored = []
    for (a, b), slow in pair_slowdowns.items():
        if slow is None or a not in order or b not in order or a == b:
            continue
        saving = savings.get((a, b), 0.0)
        if saving <= 0:
            continue
        if slow[0] > max_slowdowns.get(a, 0.0) + 1e-12 or slow[1] > max_slowdowns.get(b, 0.0) + 1e-12:
            continue
        scored.append((-saving, a, b))
    scored.sort()
    used: set[str] = set()
    chosen = []
    for _, a, b in scored:
        if a in used or b in used:
            continue
        used.update((a, b))
        chosen.append((a, b))
    return chosen


def _explores(spec: JobSpec, profile: Profile, history: JobHistory | None, plan: Plan) -> bool:
    """The job's solo plan tries a batch size that has not reached the target yet (an exploratory run).

    Such a job is not co-located: a pair runs at the reference batch size, and a pair chosen because the
    exploratory run is predicted dearer tonight would keep the explorer from ever learning.
    """
    explorer = batch_size_explorer(spec, profile, history)
    if explorer is None:
        return False
    bs = batch_size_of(plan.config, spec)
    return bs != spec.batch_size and bs in explorer.arms and not explorer.arms[bs].costs


def plan_night(
    specs: Sequence[JobSpec],
    profiles: Mapping[str, Profile],
    forecasts: Mapping[str, Forecast | None],
    now: datetime,
    pair_profiles: Sequence[PairProfile] | None = None,
    history: JobHistory | None = None,
    early_stop: bool = False,
    intensity_history: Mapping[str, Sequence[ForecastPoint]] | None = None,
) -> list[Plan]:
    """Plans for a night's batch: each job's joint plan, then guarded co-location where it saves more.

    ``profiles`` maps job name → Profile; ``forecasts`` maps region → Forecast (None: no forecast). Pairs
    are considered only between jobs of the same region with a pair profile (or history) for them, both
    single-container, both slowdowns within their bounds and both deadlines met, neither trying an untried batch
    size tonight (an exploratory run is never traded for a pair at the reference); the pairs chosen are those
    of :func:`choose_colocation_pairs` on the pair's saving against the two solo plans, both scored by the jobs'
    own objectives (the selectors of :func:`~carbonflow.objectives.objective_for`): a pair of ``carbon``
    and ``energy`` jobs on summed carbon when both are ``carbon`` and a forecast exists, else on summed energy (as
    before); two jobs of one other objective on the sum of their figures; two different objectives each on its
    own, neither job worse (:func:`carbonflow.planning.pairs._score_on_own_objectives` says why). A co-located job
    runs at its reference configuration (pair profiles are measured there). ``early_stop`` is handed to
    :func:`plan_job`. Output order = input order.
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"specs: job names must be unique in a night's batch; got {names}")
    by_name = {s.name: s for s in specs}
    for name in names:
        if name not in profiles:
            raise ValueError(f"profiles has no entry for job {name!r}; profile it before planning the night")
    solo = {
        s.name: plan_job(
            s,
            profiles[s.name],
            forecasts.get(s.region),
            now,
            history,
            on_infeasible="fastest",
            early_stop=early_stop,
            intensity_history=(intensity_history or {}).get(s.region),
        )
        for s in specs
    }
    if not pair_profiles and history is None:
        return [solo[n] for n in names]

    options = _pair_options(specs, profiles, solo, forecasts, now, pair_profiles, history, intensity_history)
    slowdowns: dict[tuple[str, str], tuple[float, float] | None] = {k: o.slowdowns for k, o in options.items()}
    savings = {k: o.saving for k, o in options.items()}
    chosen = choose_colocation_pairs(names, {s.name: s.max_slowdown for s in specs}, slowdowns, savings)
    plans = dict(solo)
    for a, b in chosen:
        plans.update(pair_plans(options[(a, b)], solo, by_name, profiles, pair_profiles, now, history))
    return [plans[n] for n in names]


def _pair_options(
    specs: Sequence[JobSpec],
    profiles: Mapping[str, Profile],
    solo: Mapping[str, Plan],
    forecasts: Mapping[str, Forecast | None],
    now: datetime,
    pair_profiles: Sequence[PairProfile] | None,
    history: JobHistory | None,
    intensity_history: Mapping[str, Sequence[ForecastPoint]] | None,
) -> dict[tuple[str, str], PairOption]:
    """Every pair that may share a GPU tonight (see :func:`plan_night`) with its best joint start and saving."""
    names = [s.name for s in specs]
    by_name = {s.name: s for s in specs}
    options: dict[tuple[str, str], PairOption] = {}
    refs: dict[str, tuple[Candidate, Reference]] = {}
    known = {(p.job_a, p.job_b) for p in pair_profiles or ()} | {(p.job_b, p.job_a) for p in pair_profiles or ()}
    exploring = {n for n in names if _explores(by_name[n], profiles[n], history, solo[n])}
    for a, b in itertools.combinations(names, 2):
        if (a, b) not in known or a in exploring or b in exploring:
            continue
        sa, sb = by_name[a], by_name[b]
        if sa.region != sb.region or "DEADLINE AT RISK" in solo[a].reason or "DEADLINE AT RISK" in solo[b].reason:
            continue
        pair = lookup_pair(a, b, pair_profiles)
        assert pair is not None
        region = sa.region
        try:
            opt = pair_option(sa, sb, profiles[a], profiles[b], solo[a], solo[b], pair, forecasts.get(region), now,
                              history, refs, (intensity_history or {}).get(region))  # fmt: skip
        except (DeadlineError, ValueError):
            continue
        if opt is not None:
            options[(a, b)] = opt
    return options
