"""Two jobs sharing one GPU: the pair's timeline, its slowdown, its energy and score, the pair's plans, and the
prediction of how fast two jobs run together from their solo profiles (for the pairs worth profiling).

Pure and deterministic. Two jobs share one device by time-slicing; each keeps a fraction of its solo speed
(``speed``, from a pair profile or the history). Which pairs share a night is chosen by
:func:`carbonflow.planning.night.plan_night`; the early-observation check after launch is
:mod:`carbonflow.planning.early_observation`.

API others call::

    PairProfile(job_a, job_b, speed_a, speed_b, power_w, label="measured", power_limit_w=None)
    pair_timeline(solo_a_s, solo_b_s, speed_a, speed_b) -> PairTimeline    # overlap and tail, per job
    predict_pair_slowdown(job_a, job_b, solo_a_s, solo_b_s, pair_profiles=None, history=None)
        -> tuple[float, float] | None                                     # None: nothing known, never pair
    pair_option(spec_a, spec_b, prof_a, prof_b, plan_a, plan_b, pair, forecast, now, history, refs,
                intensity_history) -> PairOption | None                   # best joint start and its saving
    pair_plans(option, solo, specs, profiles, pair_profiles, now, history) -> dict[str, Plan]
    choose_pairs(candidates, profiles, outcomes, *, max_pairs, max_gpu_s, pair_profile_gpu_s)
        -> list[PairToProfile]                                            # unknown pairs worth profiling

Timeline of a pair started together: both run at their kept speeds until the shorter one finishes, then the
other runs alone at full speed. With solo durations Da, Db and kept speeds sa, sb the first finishes at
``t1 = min(Da/sa, Db/sb)``; the other's total is ``t1 + (D − t1·s)``; each job's slowdown is its total over
its solo duration minus one. The device draws ``power_w`` (the pair profile) during the overlap and the
remaining job's solo power afterwards. Predicted energy learns as a solo prediction does: each job's steps cost
what its learned :class:`~carbonflow.planning.learning.RunCostModel` says they cost alone, plus what sharing
changes on the pair profile (``_shared_steps_energy_j``), the inverse of how a co-located run is learned from.
A co-located pair runs at its reference configuration (where pair profiles are measured), so it competes with
capped solo plans: on the nightly benchmark co-location rarely wins under a 10 % slowdown bound.

**Pair prediction.** Profiling every pair of jobs that could share a GPU does not scale: fifty new jobs make
1,225 pairs. EaCO avoids exhaustive pairing with history and early observation; Gavel and Lucid predict
interference from solo measurements. :func:`fit_pair_predictor` is carbonflow's small model of that kind:

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
from datetime import datetime, timedelta

import numpy as np

from carbonflow.carbon.windows import held_window_means
from carbonflow.domain import Config, EnergyLabel, Forecast, ForecastPoint, JobSpec, Plan, Profile, parse_objective
from carbonflow.objectives import Reference, objective_for
from carbonflow.planning.batch_size import deadline_epochs, point_power_w
from carbonflow.planning.candidate import Candidate
from carbonflow.planning.learning import JobHistory, slowdown_from_kept_speed
from carbonflow.planning.optimizer import predict_candidates
from carbonflow.planning.start_search import pair_starts
from carbonflow.units import emissions_g_from, g_per_j, kwh_from_j, nearest_minute


@dataclass(frozen=True)
class PairProfile:
    """Two jobs measured together on one device: fraction of solo speed each kept, and the device's power."""

    job_a: str
    job_b: str
    speed_a: float
    speed_b: float
    power_w: float
    label: EnergyLabel = "measured"
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        for name in ("speed_a", "speed_b"):
            value = getattr(self, name)
            if not 0 < value <= 2:
                raise ValueError(f"{name}={value} is not allowed; a kept fraction of solo speed is in (0, 2]")
        if not self.power_w > 0:
            raise ValueError(f"power_w={self.power_w} is not allowed; it must be > 0")

    def speeds(self, job_a: str, job_b: str) -> tuple[float, float] | None:
        """(speed of job_a, speed of job_b) if this profile is about that pair, in either order."""
        if (self.job_a, self.job_b) == (job_a, job_b):
            return self.speed_a, self.speed_b
        if (self.job_a, self.job_b) == (job_b, job_a):
            return self.speed_b, self.speed_a
        return None


@dataclass(frozen=True)
class PairTimeline:
    overlap_s: float
    total_a_s: float
    total_b_s: float
    tail_job: str  # "a", "b" or "" when both finish together
    tail_s: float

    @property
    def device_s(self) -> float:
        return self.overlap_s + self.tail_s


def pair_timeline(solo_a_s: float, solo_b_s: float, speed_a: float, speed_b: float) -> PairTimeline:
    """Start both together; see the module docstring."""
    if solo_a_s <= 0 or solo_b_s <= 0:
        raise ValueError(f"solo durations must be > 0; got solo_a_s={solo_a_s}, solo_b_s={solo_b_s}")
    ta, tb = solo_a_s / speed_a, solo_b_s / speed_b
    if ta <= tb:
        t1 = ta
        tail = max(0.0, solo_b_s - t1 * speed_b)
        return PairTimeline(t1, t1, t1 + tail, "b" if tail > 0 else "", tail)
    t1 = tb
    tail = max(0.0, solo_a_s - t1 * speed_a)
    return PairTimeline(t1, t1 + tail, t1, "a", tail)


def pair_timeline_with_fixed(
    solo_a_s: float, solo_b_s: float, fixed_a_s: float, fixed_b_s: float, speed_a: float, speed_b: float
) -> PairTimeline:
    """A pair's timeline when part of each solo run is fixed (start-up, data loading, evaluation): sharing the GPU
    slows only the per-sample parts (:func:`pair_timeline` over ``solo − fixed``); each job's fixed part is added
    to its own total, unslowed. ``overlap_s`` is then the time both jobs run, ``tail_s`` the rest. With no fixed
    part this is :func:`pair_timeline`."""
    if not 0 <= fixed_a_s < solo_a_s or not 0 <= fixed_b_s < solo_b_s:
        raise ValueError(
            f"fixed parts must be >= 0 and shorter than the runs; got fixed_a_s={fixed_a_s} of {solo_a_s}, "
            f"fixed_b_s={fixed_b_s} of {solo_b_s}"
        )
    steps = pair_timeline(solo_a_s - fixed_a_s, solo_b_s - fixed_b_s, speed_a, speed_b)
    if fixed_a_s == 0 and fixed_b_s == 0:
        return steps
    total_a, total_b = fixed_a_s + steps.total_a_s, fixed_b_s + steps.total_b_s
    first, last = min(total_a, total_b), max(total_a, total_b)
    tail_job = "" if last - first <= 1e-12 else ("a" if total_a > total_b else "b")
    return PairTimeline(first, total_a, total_b, tail_job, last - first)


def _lookup_speeds(job_a: str, job_b: str, pair_profiles: Sequence[PairProfile] | None) -> tuple[float, float] | None:
    for profile in pair_profiles or ():
        speeds = profile.speeds(job_a, job_b)
        if speeds is not None:
            return speeds
    return None


def lookup_pair(job_a: str, job_b: str, pair_profiles: Sequence[PairProfile] | None) -> PairProfile | None:
    for profile in pair_profiles or ():
        if profile.speeds(job_a, job_b) is not None:
            return profile
    return None


def predict_pair_slowdown(
    job_a: str,
    job_b: str,
    solo_a_s: float,
    solo_b_s: float,
    pair_profiles: Sequence[PairProfile] | None = None,
    history: JobHistory | None = None,
    fixed_a_s: float = 0.0,
    fixed_b_s: float = 0.0,
) -> tuple[float, float] | None:
    """Predicted slowdown (fraction) of each job's run when co-located; the worse of pair profile and history.

    ``fixed_*_s``: each job's fixed part of ``solo_*_s`` (start-up, data loading, evaluation), which sharing the
    GPU does not slow (:func:`pair_timeline_with_fixed`). None when neither a pair profile nor a past co-location
    of the two is known: such a pair is never co-located (EaCO co-locates only with experiment- or history-based
    predictions).
    """
    speeds = _lookup_speeds(job_a, job_b, pair_profiles)
    predicted: tuple[float, float] | None = None
    if speeds is not None:
        tl = pair_timeline_with_fixed(solo_a_s, solo_b_s, fixed_a_s, fixed_b_s, *speeds)
        predicted = (tl.total_a_s / solo_a_s - 1, tl.total_b_s / solo_b_s - 1)
    if history is not None:
        seen_a, seen_b = history.pair_slowdown(job_a, job_b), history.pair_slowdown(job_b, job_a)
        if seen_a is not None or seen_b is not None:
            base = predicted or (0.0, 0.0)
            predicted = (max(base[0], seen_a or 0.0), max(base[1], seen_b or 0.0))
            if speeds is None and (seen_a is None or seen_b is None):
                return None
    return predicted


@dataclass(frozen=True)
class PairOption:
    a: str
    b: str
    start_s: float
    emissions_a_g: float
    emissions_b_g: float
    energy_a_j: float
    energy_b_j: float
    total_a_s: float
    total_b_s: float
    saving: float
    slowdowns: tuple[float, float]
    unit: str


def _reference(
    spec: JobSpec, profile: Profile, history: JobHistory | None, refs: dict[str, tuple[Candidate, Reference]] | None
) -> tuple[Candidate, Reference]:
    """The job's reference configuration's prediction and the reference metrics its objective is scored against
    (remembered in ``refs`` when given)."""
    if refs is not None and spec.name in refs:
        return refs[spec.name]
    _, ref, metrics = predict_candidates(spec, profile, history)
    if refs is not None:
        refs[spec.name] = (ref, metrics)
    return ref, metrics


def pair_option(
    spec_a: JobSpec,
    spec_b: JobSpec,
    prof_a: Profile,
    prof_b: Profile,
    plan_a: Plan,
    plan_b: Plan,
    pair: PairProfile,
    forecast: Forecast | None,
    now: datetime,
    history: JobHistory | None,
    refs: dict[str, tuple[Candidate, Reference]] | None = None,
    intensity_history: Sequence[ForecastPoint] | None = None,
) -> PairOption | None:
    """Best joint start of a co-located pair (each at its reference configuration) and its saving.

    ``refs`` remembers each job's reference prediction across the night's pairs. With ``intensity_history``
    the pair's starts are ranked, and the pair compared with the two solo plans, on the robust posterior the
    one start search ranks by (:func:`~carbonflow.carbon.windows.held_window_means` with ``history``): the
    solo plans were chosen on it, so a pair judged on the raw forecast would win exactly where the raw forecast
    is optimistic. The emissions reported are the forecast's own, as ``plan_job``'s are."""
    ref_a, metrics_a = _reference(spec_a, prof_a, history, refs)
    ref_b, metrics_b = _reference(spec_b, prof_b, history, refs)
    if ref_a.config.containers != 1 or ref_b.config.containers != 1:
        return None
    # Each job's fixed part (start-up, data loading, evaluation) is not slowed by sharing and draws no shared-GPU
    # power: the pair shares over the per-sample parts (``steps``); ``tl`` adds the fixed parts.
    fixed_s, fixed_j = (ref_a.fixed_s, ref_b.fixed_s), (ref_a.fixed_j, ref_b.fixed_j)
    slow = predict_pair_slowdown(
        spec_a.name, spec_b.name, ref_a.duration_s, ref_b.duration_s, [pair], history, *fixed_s
    )
    if slow is None:
        return None
    speeds = pair.speeds(spec_a.name, spec_b.name)
    assert speeds is not None
    steps = pair_timeline(ref_a.duration_s - fixed_s[0], ref_b.duration_s - fixed_s[1], *speeds)
    tl = pair_timeline_with_fixed(ref_a.duration_s, ref_b.duration_s, *fixed_s, *speeds)
    # Jobs trained to a target: the latest start is planned for their likely most epochs (as plan_job does).
    fa, fb = _deadline_factor(spec_a, prof_a, history, ref_a), _deadline_factor(spec_b, prof_b, history, ref_b)
    tl_deadline = (
        pair_timeline_with_fixed(
            fixed_s[0] + (ref_a.duration_s - fixed_s[0]) * fa, fixed_s[1] + (ref_b.duration_s - fixed_s[1]) * fb,
            *fixed_s, *speeds,
        )
        if fa * fb > 1
        else tl
    )  # fmt: skip
    latest = []
    for spec, total in ((spec_a, tl_deadline.total_a_s), (spec_b, tl_deadline.total_b_s)):
        if spec.finish_by is not None:
            latest.append((spec.finish_by - now).total_seconds() - total)
    hi = min(latest) if latest else 0.0
    if hi < 0:
        return None
    if forecast is not None and not latest:
        hi = max(0.0, (forecast.points[-1].end - now).total_seconds() - tl.device_s)
    s = pair_starts(forecast, now, tl.overlap_s, tl.device_s, hi)  # the one start search, two segments
    # Energy: both fixed parts, and each job's steps while both run (what they cost it alone, as learned, plus the
    # pair profile's sharing extra), then the tail job's steps alone at its learned per-sample power.
    shared_a_j, shared_b_j = _shared_steps_energy_j(ref_a, ref_b, pair, speeds, steps.overlap_s)
    overlap_e = shared_a_j + shared_b_j + fixed_j[0] + fixed_j[1]
    t = 1 if steps.tail_job == "b" else 0
    tail_e = _per_sample_power_w((ref_a, ref_b)[t]) * steps.tail_s
    first = (shared_a_j + fixed_j[0], shared_b_j + fixed_j[1])
    tails = (tail_e if steps.tail_job == "a" else 0.0, tail_e if steps.tail_job == "b" else 0.0)
    run = _PairRun(s, tl, first, tails, overlap_e, tail_e, (tl.total_a_s, tl.total_b_s), (metrics_a, metrics_b))
    texts = (_objective_tonight_text(spec_a, forecast), _objective_tonight_text(spec_b, forecast))
    if all(parse_objective(text)[0] in ("carbon", "energy") for text in texts):
        score = _score_on_carbon_or_energy(run, (plan_a, plan_b), forecast, now, intensity_history, texts)
    else:
        score = _score_on_own_objectives(run, (plan_a, plan_b), forecast, now, intensity_history, texts)
    best = score.best
    e_a, e_b = first[0] + tails[0], first[1] + tails[1]
    ci_1 = g_per_j(float(score.ci_overlap[best]))
    ci_2 = g_per_j(float(score.ci_tail[best]))
    g_a, g_b = first[0] * ci_1 + tails[0] * ci_2, first[1] * ci_1 + tails[1] * ci_2
    if forecast is None:
        g_a = g_b = 0.0
    return PairOption(
        spec_a.name,
        spec_b.name,
        float(s[best]),
        g_a,
        g_b,
        e_a,
        e_b,
        tl.total_a_s,
        tl.total_b_s,
        score.saving,
        slow,
        score.unit,
    )


@dataclass(frozen=True)
class _PairRun:
    """A pair's candidate joint starts (s after now) and what does not depend on the start: its timeline, each
    job's energy while both run (``first_j``; both: ``overlap_energy_j``) and alone after (``tail_j``; the tail job's:
    ``tail_energy_j``), each job's run time, and each job's
    reference metrics (what its objective is scored against, as for its solo plan)."""

    starts_s: np.ndarray
    timeline: PairTimeline
    first_j: tuple[float, float]
    tail_j: tuple[float, float]
    overlap_energy_j: float
    tail_energy_j: float
    total_s: tuple[float, float]
    metrics: tuple[Reference, Reference]

    @property
    def energy_j(self) -> tuple[float, float]:
        return self.first_j[0] + self.tail_j[0], self.first_j[1] + self.tail_j[1]


@dataclass(frozen=True)
class _PairScore:
    """The pair's best start (index into the starts), its saving against the two solo plans and the saving's
    unit, and the forecast's own intensities of its two windows at every start (for the emissions reported)."""

    best: int
    saving: float
    unit: str
    ci_overlap: np.ndarray
    ci_tail: np.ndarray


def _objective_tonight_text(spec: JobSpec, forecast: Forecast | None) -> str:
    """The objective the job's solo plan was chosen on tonight: ``carbon`` without a forecast is ``energy``
    (as :func:`~carbonflow.planning.optimizer.plan_job` plans it)."""
    if forecast is None and parse_objective(spec.objective)[0] == "carbon":
        return "energy"
    return spec.objective


def _score_on_carbon_or_energy(
    run: _PairRun,
    plans: tuple[Plan, Plan],
    forecast: Forecast | None,
    now: datetime,
    intensity_history: Sequence[ForecastPoint] | None,
    texts: tuple[str, str],
) -> _PairScore:
    """A pair of ``carbon`` and ``energy`` jobs, as before the other objectives were judged: on the two jobs'
    summed emissions when both are ``carbon`` (and a forecast exists), else on their summed energy; ties to the
    earliest start."""
    s, tl = run.starts_s, run.timeline
    plan_a, plan_b = plans
    overlap_e, tail_e = run.overlap_energy_j, run.tail_energy_j
    objective_is_carbon = texts == ("carbon", "carbon")
    solo = (
        plan_a.predicted_emissions_g + plan_b.predicted_emissions_g
        if objective_is_carbon
        else plan_a.predicted_energy_j + plan_b.predicted_energy_j
    )
    if forecast is not None:
        ci_overlap = held_window_means(forecast, now, s, tl.overlap_s)
        ci_tail = held_window_means(forecast, now, s + tl.overlap_s, tl.tail_s)
        rank_overlap, rank_tail = ci_overlap, ci_tail
        if intensity_history and objective_is_carbon:
            rank_overlap, rank_tail, solo_ci = _posterior(run, plans, forecast, now, intensity_history)
            solo = kwh_from_j(plan_a.predicted_energy_j * solo_ci[0] + plan_b.predicted_energy_j * solo_ci[1])
    else:
        ci_overlap = ci_tail = rank_overlap = rank_tail = np.ones(s.size)
    ranked = emissions_g_from(overlap_e, rank_overlap) + emissions_g_from(tail_e, rank_tail)
    total = ranked if objective_is_carbon else np.full(s.size, overlap_e + tail_e)
    best = int(np.lexsort((s, total))[0])
    unit = "g CO2e" if objective_is_carbon else "J"
    return _PairScore(best, solo - float(total[best]), unit, ci_overlap, ci_tail)


def _posterior(
    run: _PairRun,
    plans: tuple[Plan, Plan],
    forecast: Forecast,
    now: datetime,
    intensity_history: Sequence[ForecastPoint],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The robust posterior intensity of the pair's two windows at every start and of the two solo plans' runs,
    in one call, so pair and solo windows share one posterior (its level is matched over the windows)."""
    s, tl = run.starts_s, run.timeline
    solo_s = [(p.start - now).total_seconds() for p in plans]
    solo_d = [p.predicted_duration_s for p in plans]
    post = held_window_means(
        forecast,
        now,
        np.concatenate([s, s + tl.overlap_s, solo_s]),
        np.concatenate([np.full(s.size, tl.overlap_s), np.full(s.size, tl.tail_s), solo_d]),
        history=intensity_history,
    )
    return post[: s.size], post[s.size : 2 * s.size], post[-2:]


_COST_UNITS = {"time": "s", "edp": "J·s", "eds": "(EDS cost, 1 = the default run)", "zeus": "J (Zeus cost)"}
RELATIVE_SAVING_UNIT = "% (each job's saving on its own objective, summed; neither job worse)"


def _score_on_own_objectives(
    run: _PairRun,
    plans: tuple[Plan, Plan],
    forecast: Forecast | None,
    now: datetime,
    intensity_history: Sequence[ForecastPoint] | None,
    texts: tuple[str, str],
) -> _PairScore:
    """A pair in which a job's objective is ``time``, ``edp``, ``eds:k`` or ``zeus:η``: each job's part of the pair
    and its solo plan are scored by the job's own selector (:func:`~carbonflow.objectives.objective_for`,
    the function its solo plan was chosen by, with the same reference run), at every joint start.

    * Same objective text for both jobs: the figures share a unit, so the pair's figure is the sum of the two
      jobs' (as ``carbon`` and ``energy`` pairs are summed), compared with the two solo plans' sum.
    * Different objectives: joules, seconds and EDS costs have no common unit, and any exchange rate between them
      would be one nobody set. So each job is compared with its own solo plan on its own objective, and a start is
      acceptable only when neither job is worse there (a Pareto improvement: a job never pays for its partner's
      objective). Acceptable starts are ranked by the two jobs' relative savings summed (dimensionless);
      the saving is that sum in percent, and negative (the worse job's loss) when no start is acceptable.

    Why two rules: one objective is one owner's measure, and its figures add up (the GPU's joules, the jobs'
    seconds), so the pair is judged on what that measure saves in total, as carbon and energy pairs always were;
    a job may then lose a little for a larger gain of its partner, within its ``max_slowdown`` and deadline. Two
    objectives are two measures: summing them would let the job with the larger numbers decide for both, so each
    keeps a veto. A pair of one ``carbon`` and one ``energy`` job stays on its former rule (summed energy,
    :func:`_score_on_carbon_or_energy`): their behaviour is kept exactly.

    Starts of equal cost go to less (robust) carbon, then the earliest, as a solo plan's ties do.
    """
    s = run.starts_s
    ci_overlap, ci_tail, rank_overlap, rank_tail, solo_g = _intensities(run, plans, forecast, now, intensity_history)
    pair_cost, solo_cost, pair_g = [], [], np.zeros(s.size)
    for i, (text, plan) in enumerate(zip(texts, plans, strict=True)):
        selector = objective_for(text)
        grams = kwh_from_j(run.first_j[i] * rank_overlap + run.tail_j[i] * rank_tail)  # J x g/kWh -> g
        pair_g = pair_g + grams
        energy, total = np.full(s.size, run.energy_j[i]), np.full(s.size, run.total_s[i])
        pair_cost.append(selector.cost(energy, total, grams, run.metrics[i]))
        solo_args = ([plan.predicted_energy_j], [plan.predicted_duration_s], [solo_g[i]], run.metrics[i])
        solo_cost.append(float(selector.cost(*solo_args)[0]))
    pair_g = _quantised(pair_g)
    if texts[0] == texts[1]:
        total_cost = pair_cost[0] + pair_cost[1]
        best = int(np.lexsort((s, pair_g, _quantised(total_cost)))[0])
        saving = solo_cost[0] + solo_cost[1] - float(total_cost[best])
        unit = f"{_COST_UNITS.get(parse_objective(texts[0])[0], '')} ({texts[0]})"
        return _PairScore(best, saving, unit, ci_overlap, ci_tail)
    worse = [(pair_cost[i] - solo_cost[i]) / (abs(solo_cost[i]) or 1.0) for i in (0, 1)]
    acceptable = np.maximum(worse[0], worse[1]) <= 1e-9
    score = worse[0] + worse[1]
    best = int(np.lexsort((s, pair_g, _quantised(score), ~acceptable))[0])
    saving = -100.0 * float(score[best] if acceptable[best] else max(worse[0][best], worse[1][best]))
    return _PairScore(best, saving, RELATIVE_SAVING_UNIT, ci_overlap, ci_tail)


def _quantised(values: np.ndarray) -> np.ndarray:
    """Values to 9 significant digits of their largest, so float noise never decides between starts (as in
    :func:`~carbonflow.planning.optimizer.plan_job`'s ranking)."""
    return np.round(values / max(float(np.max(np.abs(values))), 1e-300), 9)


def _intensities(
    run: _PairRun,
    plans: tuple[Plan, Plan],
    forecast: Forecast | None,
    now: datetime,
    intensity_history: Sequence[ForecastPoint] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[float, float]]:
    """The forecast's own intensity of the pair's two windows at every start (for the emissions reported), the
    intensities the starts are ranked on (the robust posterior with ``intensity_history``, as the solo plans
    were ranked), and the two solo plans' emissions on the same footing (g). No forecast: zero carbon."""
    s, tl = run.starts_s, run.timeline
    if forecast is None:
        zero = np.zeros(s.size)
        return zero, zero, zero, zero, (0.0, 0.0)
    ci_overlap = held_window_means(forecast, now, s, tl.overlap_s)
    ci_tail = held_window_means(forecast, now, s + tl.overlap_s, tl.tail_s)
    if intensity_history:
        rank_overlap, rank_tail, solo_ci = _posterior(run, plans, forecast, now, intensity_history)
        solo_g = [float(kwh_from_j(p.predicted_energy_j * ci)) for p, ci in zip(plans, solo_ci, strict=True)]
        return ci_overlap, ci_tail, rank_overlap, rank_tail, (solo_g[0], solo_g[1])
    return ci_overlap, ci_tail, ci_overlap, ci_tail, (plans[0].predicted_emissions_g, plans[1].predicted_emissions_g)


def _per_sample_power_w(ref: Candidate) -> float:
    """The job's learned energy per second of its per-sample part alone: (energy − fixed) / (duration − fixed)."""
    return (ref.energy_j - ref.fixed_j) / max(ref.duration_s - ref.fixed_s, 1e-12)


def _shared_steps_energy_j(
    ref_a: Candidate, ref_b: Candidate, pair: PairProfile, speeds: tuple[float, float], overlap_s: float
) -> tuple[float, float]:
    """Each job's predicted energy for its steps while both work: what that work costs it alone, as learned, plus
    its share of what sharing the GPU changes, from the pair profile.

    While both work for ``overlap_s`` job *i* does ``kept_i × overlap_s`` of its solo per-sample time. Alone, that
    costs its learned per-sample power (:func:`_per_sample_power_w`: the job's
    :class:`~carbonflow.planning.learning.RunCostModel` energy factor on the profile's power, so also what the
    profile never sees, such as the host's CPU) × that time. Sharing changes the GPU's draw: the pair profile's power,
    split as the pair's wrapper splits it (solo power × kept speed), minus the same work's solo power on the
    profile, ``(pair_w × share_i − P_i × kept_i) × overlap_s``. That is the wrapper's ``sharing_energy_j``, which
    :meth:`~carbonflow.planning.learning.RealisedRun.alone` takes out of a co-located run to learn the job's solo
    model: the prediction adds back exactly what learning took out, so a pair's second night is predicted with
    what its first night taught each job, as a solo run is. Chosen over a pair-level correction (realised /
    predicted of the pair's past nights): that needs a raw prediction of each past night to stay unbiased, and
    learns nothing for a pair not seen before, while each job's model is learned from every run it had, solo or
    shared. With nothing learned (factor 1, no fixed part) this is the pair profile's power × the overlap, split.
    """
    weight_a, weight_b = point_power_w(ref_a.point) * speeds[0], point_power_w(ref_b.point) * speeds[1]
    share_a = weight_a / (weight_a + weight_b) if weight_a + weight_b > 0 else speeds[0] / (speeds[0] + speeds[1])
    out = []
    for ref, kept, share in ((ref_a, speeds[0], share_a), (ref_b, speeds[1], 1.0 - share_a)):
        alone_j = _per_sample_power_w(ref) * kept * overlap_s
        sharing_j = (pair.power_w * share - point_power_w(ref.point) * kept) * overlap_s
        out.append(alone_j + sharing_j)
    return out[0], out[1]


def _deadline_factor(spec: JobSpec, profile: Profile, history: JobHistory | None, ref: Candidate) -> float:
    """Deadline epochs / expected epochs of a target-trained job at its reference configuration (>= 1)."""
    if not profile.samples_per_epoch or ref.duration_s <= 0:
        return 1.0
    most = deadline_epochs(spec, history, ref.config.batch_size)
    if most is None:
        return 1.0
    expected = ref.duration_s * ref.point.throughput_samples_per_s / profile.samples_per_epoch
    return max(1.0, most / expected) if expected > 0 else 1.0


def pair_plans(
    opt: PairOption,
    solo: Mapping[str, Plan],
    by_name: Mapping[str, JobSpec],
    profiles: Mapping[str, Profile],
    pair_profiles: Sequence[PairProfile] | None,
    now: datetime,
    history: JobHistory | None,
) -> dict[str, Plan]:
    """The two jobs' plans when they share one GPU as ``opt`` says: each its solo plan at its reference
    configuration in the pair's co-location group, started together, with the pair's predictions and a reason."""
    a, b = opt.a, opt.b
    plans: dict[str, Plan] = {}
    for me, other, total_s, energy_j, grams, slow in (
        (a, b, opt.total_a_s, opt.energy_a_j, opt.emissions_a_g, opt.slowdowns[0]),
        (b, a, opt.total_b_s, opt.energy_b_j, opt.emissions_b_g, opt.slowdowns[1]),
    ):
        base = solo[me]
        _, ref, _ = predict_candidates(by_name[me], profiles[me], history)
        start = now + timedelta(seconds=opt.start_s)
        finish = start + timedelta(seconds=total_s)
        pair = lookup_pair(me, other, pair_profiles)
        kept = pair.speeds(me, other) if pair is not None else None
        sharing = (
            ""
            if kept is None or pair is None
            else f"keeps {kept[0]:.2f} of its solo speed while both run "
            f"({slowdown_from_kept_speed(kept[0]) * 100:.0f} % slower; {pair.label}), "
        )
        reason = (
            f"co-located with {other} on one GPU at {_w(ref.config.power_limit_w)}, start "
            f"{'now' if opt.start_s == 0 else f'{nearest_minute(start):%H:%M} UTC'}: {sharing}predicted run "
            f"{slow * 100:.0f} % longer, within {by_name[me].max_slowdown * 100:.0f} %, pair's "
            f"predicted saving {opt.saving:.4g} {opt.unit} vs separate plans; finishes "
            f"{nearest_minute(finish).strftime('%H:%M')}"
        )
        plans[me] = base.model_copy(
            update={
                "config": Config(
                    containers=1,
                    power_limit_w=ref.config.power_limit_w,
                    batch_size=ref.config.batch_size,
                    colocation_group=f"{a}+{b}",
                ),
                "start": start,
                "predicted_duration_s": total_s,
                "predicted_energy_j": energy_j,
                "predicted_emissions_g": grams,
                "colocated_with": [other],
                "reason": reason,
            }
        )
    return plans


def _w(limit_w: float | None) -> str:
    return "the default power limit" if limit_w is None else f"{limit_w:g} W"


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
