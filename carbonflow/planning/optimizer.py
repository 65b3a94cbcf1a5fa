"""The joint optimiser: configuration (containers, power limit, batch size) and start time, for one job.

Pure and deterministic: the same inputs give the same Plan (``created_at`` is set to ``now``).

API others call::

    plan_job(spec: JobSpec, profile: Profile, forecast: Forecast | None, now: datetime,
             history: JobHistory | None = None, *, on_infeasible: "raise" | "fastest" = "raise",
             alternatives_per_config: int = 3, early_stop: bool = False,
             intensity_history: Sequence[ForecastPoint] | None = None) -> Plan
    predict_candidates(spec, profile, history=None) -> (list[Candidate], reference Candidate, Reference)
    work_samples(spec, profile, batch_size=None, history=None) -> float

(The batch size learned across recurrences and its deadline margins: :mod:`carbonflow.planning.batch_size`.)

How a plan is made
------------------
* **Work.** ``epochs × profile.samples_per_epoch`` when the job gives epochs (for a job trained to a target
  metric, the epochs the history says this batch size needs — their mean over its last 40 runs — capped at
  ``epochs``); otherwise
  ``steps × spec.batch_size`` samples, the same number of samples whatever batch size is chosen.
* **Batch size** (opt-in: ``batch_sizes`` and ``target_metric`` set, history given): tonight's batch size
  comes from :func:`choose_batch_size` (exploration across recurrences); the other knobs are chosen for it.
* **Per configuration** (each profile point whose batch size / containers / power limit the JobSpec allows):
  duration = fixed + factor × work / throughput, energy = fixed + factor × power × profile duration (power =
  the sum over devices); the fixed parts (start-up, data loading, evaluation) and factors are the job's
  :class:`~carbonflow.planning.learning.RunCostModel`, learned from its realised runs against what the profile
  predicts for them and the same for every configuration (none before the first run).
* **Reference** ("default configuration", also the ``baseline``): the job's default container count
  (``min_containers``), the profile's default power limit (else the highest profiled one) and the job's own
  batch size, started now. The slowdown bound is ``duration ≤ (1 + max_slowdown) × reference duration``;
  EDS(k), "energy gain − time loss" and Zeus's MAXPOWER use it.
* **Starts** lie in ``[now, finish_by − duration]`` (without finish_by: up to the forecast's end). As the
  forecast is a step function, the best window of fixed length starts at ``now``, the latest start, a slot
  boundary, or ends at one; exactly those starts are evaluated, O(configurations × slots), vectorised.
* **Choice**: minimum of the objective (``carbon``, ``energy``, ``time``, ``edp``, ``eds:k``, ``zeus:η``);
  ties — e.g. every start under the ``energy`` objective — go to less carbon, then less energy, shorter,
  earlier, then the configuration key. With no forecast, the job starts now and the ``carbon`` objective
  falls back to ``energy`` (at any fixed intensity carbon is proportional to energy); the reason says so.
* **Deadline margin for a job trained to a target** (``target_metric`` set, history given): epochs to target
  vary from run to run, so the latest start is computed for :func:`deadline_epochs` — the most epochs a
  recent run at this batch size needed × :func:`~carbonflow.planning.batch_size.deadline_margin` (1.5 up to 30
  runs, learned tighter as runs accumulate, 1.1 from 150), at most ``spec.epochs`` (the job's epoch budget; the
  budget itself until ``DEADLINE_MIN_RUNS`` runs at this batch size reached the target) — not for the expected
  epochs the cost is computed with (:func:`~carbonflow.planning.batch_size.expected_epochs`, the mean of the last
  40 runs); with ``early_stop=True`` (the caller stops a run at the
  explorer's threshold) at most that threshold, and for an untried batch size plus the time to rerun at the
  best known one. Configurations without that room are left
  out while one has it; a learned batch size none of whose configurations has it falls back to the best
  known one (else the job's own); when no configuration has it at all, the start is now.
* **Deadline.** If even the fastest configuration started now cannot finish by ``finish_by``,
  ``on_infeasible="raise"`` (default) raises :class:`DeadlineError` (a ValueError naming ``finish_by``) and
  ``on_infeasible="fastest"`` returns the fastest configuration starting now with a reason that begins
  ``DEADLINE AT RISK``. A deadline is never missed silently.
* **One start search.** Starts come from :func:`carbonflow.carbon.windows.search_starts` (asked through
  :mod:`carbonflow.planning.start_search`, as a co-located pair asks it), the same search
  ``choose_start``, ``plan_night`` and the benchmarks use. Robustness has one meaning: given
  ``intensity_history`` (recent actuals), each forecast slot is shrunk toward the recent daily profile by its
  lead-time error variance before ranking; without it the forecast is taken at face value. Reported emissions
  are always the forecast's own numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import numpy as np

from carbonflow.accounting.saving import saving_fraction, saving_phrase
from carbonflow.carbon.windows import StartSearch
from carbonflow.domain import (
    PROFILE_NOISE,
    Config,
    Forecast,
    ForecastPoint,
    JobSpec,
    Plan,
    PlanAlternative,
    Profile,
    ProfilePoint,
    parse_objective,
)
from carbonflow.objectives import objective_for
from carbonflow.planning.batch_size import (
    batch_size_explorer,
    batch_size_of,
    deadline_margins,
    expected_epochs,
    point_power_w,
)
from carbonflow.planning.candidate import Candidate
from carbonflow.planning.costs import (
    Reference,
    pareto_front,
)
from carbonflow.planning.learning import JobHistory, RealisedRun, RunCostModel
from carbonflow.planning.start_search import latest_starts, plan_starts, run_now_ci
from carbonflow.units import emissions_g_from, nearest_minute

_EPS = 1e-9


class DeadlineError(ValueError):
    """finish_by cannot be met even by the fastest configuration starting now."""


def _utc(name: str, value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{name}={value.isoformat()} has no time zone; give it in UTC")
    return value


def work_samples(
    spec: JobSpec, profile: Profile, batch_size: int | None = None, history: JobHistory | None = None
) -> float:
    """Samples to process: epochs × samples_per_epoch, or steps × the job's batch size (see module doc)."""
    if spec.epochs is not None:
        if not profile.samples_per_epoch:
            raise ValueError(
                f"profile.samples_per_epoch={profile.samples_per_epoch!r}: job {spec.name!r} gives its work in "
                "epochs, so its profile must say how many samples one epoch holds (or give steps instead)"
            )
        epochs = float(spec.epochs)
        if history is not None and spec.target_metric is not None:
            bs = batch_size if batch_size is not None else spec.batch_size
            learned = expected_epochs(history, spec.name, bs)
            if learned is None and batch_size is None:  # runs recorded without a batch size
                learned = expected_epochs(history, spec.name, None)
            if learned is not None:
                epochs = min(epochs, learned)
        return epochs * profile.samples_per_epoch
    assert spec.steps is not None
    return float(spec.steps * spec.batch_size)


def _allowed_points(spec: JobSpec, profile: Profile) -> list[ProfilePoint]:
    allowed_bs = set(spec.batch_sizes or []) | {spec.batch_size}
    points = []
    for p in profile.points:
        bs = batch_size_of(p.config, spec)
        if spec.batch_sizes is None and bs != spec.batch_size:
            continue
        if bs not in allowed_bs:
            continue
        if not spec.min_containers <= p.config.containers <= spec.max_containers:
            continue
        if spec.power_limit_w is not None and p.config.power_limit_w not in (None, spec.power_limit_w):
            continue
        if p.config.colocation_group:
            continue
        points.append(p)
    if not points:
        raise ValueError(
            f"profile.points: none of the {len(profile.points)} profiled configurations of job {profile.job!r} "
            f"matches the JobSpec (batch_size={spec.batch_size}, batch_sizes={spec.batch_sizes}, containers "
            f"{spec.min_containers}..{spec.max_containers}, power_limit_w={spec.power_limit_w}); profile it first"
        )
    return points


def default_point(spec: JobSpec, points: Sequence[ProfilePoint], profile: Profile) -> ProfilePoint:
    """The reference configuration: default containers, default (else highest) power limit, the job's batch size."""

    def bs(p: ProfilePoint) -> int:
        return batch_size_of(p.config, spec)

    same_bs = [p for p in points if bs(p) == spec.batch_size] or list(points)
    by_containers = [p for p in same_bs if p.config.containers == spec.min_containers] or same_bs
    default_pl = profile.default_power_limit_w
    for p in by_containers:
        if p.config.power_limit_w is None or (default_pl is not None and p.config.power_limit_w == default_pl):
            return p
    return max(by_containers, key=lambda p: (p.config.power_limit_w or 0.0, p.throughput_samples_per_s))


def predict_candidates(
    spec: JobSpec, profile: Profile, history: JobHistory | None = None
) -> tuple[list[Candidate], Candidate, Reference]:
    """Every allowed configuration's predicted duration, energy and slowdown, the reference and its metrics."""
    points = _allowed_points(spec, profile)
    ref_point = default_point(spec, points, profile)
    works: dict[int | None, float] = {}
    explorer = batch_size_explorer(spec, profile, history) if spec.epochs is not None else None

    def work_of(bs: int | None) -> float:
        if bs not in works:
            works[bs] = work_samples(spec, profile, bs, history)
            b = bs if bs is not None else spec.batch_size
            if explorer is not None and history is not None and expected_epochs(history, spec.name, b) is None:
                # An untried batch size: the epochs the explorer predicts from the sizes seen, within the budget.
                guess = explorer.predicted_epochs(b) if b in explorer.arms else float("inf")
                if np.isfinite(guess) and guess > 0 and profile.samples_per_epoch:
                    works[bs] = min(works[bs], guess * profile.samples_per_epoch)
        return works[bs]

    by_key = {p.config.key(): p for p in profile.points}

    def profile_prediction(r: RealisedRun) -> tuple[float, float] | None:
        """What the profile alone predicts for a realised run: its configuration, the work *it* did (its epochs,
        else the samples it reported; tonight's work only for a record that says neither)."""
        p = by_key.get(r.config_key)
        if p is None or p.throughput_samples_per_s <= 0:
            return None
        work = r.epochs * profile.samples_per_epoch if r.epochs and profile.samples_per_epoch else r.samples
        duration = (work if work else work_of(p.config.batch_size)) / p.throughput_samples_per_s
        return duration, point_power_w(p) * duration

    model = history.run_cost_model(spec.name, profile_prediction) if history is not None else RunCostModel()

    def predict(p: ProfilePoint) -> tuple[float, float]:
        duration = work_of(p.config.batch_size) / p.throughput_samples_per_s
        return model.duration_s(duration), model.energy_j(point_power_w(p) * duration)

    ref_duration, ref_energy = predict(ref_point)
    bound = ref_duration * (1 + spec.max_slowdown)
    candidates = []
    ref_candidate: Candidate | None = None
    for p in points:
        duration, energy = predict(p)
        c = Candidate(p, duration, energy, duration / ref_duration - 1, duration <= bound * (1 + _EPS), model.fixed_s,
                      model.fixed_j)  # fmt: skip
        candidates.append(c)
        if p is ref_point:
            ref_candidate = c
    assert ref_candidate is not None
    max_pl = (
        profile.max_power_w or max((p.config.power_limit_w or 0.0) for p in profile.points) or point_power_w(ref_point)
    )
    ref = Reference(energy_j=ref_energy, time_s=ref_duration, max_power_w=max_pl * ref_point.config.containers)
    return candidates, ref_candidate, ref


def _fmt_w(config: Config) -> str:
    return "default power limit" if config.power_limit_w is None else f"{config.power_limit_w:g} W"


def _fmt_config(config: Config) -> str:
    parts = [_fmt_w(config), f"{config.containers} container{'s' if config.containers != 1 else ''}"]
    if config.batch_size is not None:
        parts.append(f"batch {config.batch_size}")
    return ", ".join(parts)


def _hm(when: datetime) -> str:
    return nearest_minute(when).strftime("%H:%M")


@dataclass
class _Tonight:
    """What plan_job works on: tonight's candidate configurations and everything known about them."""

    candidates: list[Candidate]
    ref_c: Candidate
    ref: Reference
    margin: np.ndarray | None
    notes: list[str]

    @property
    def durations(self) -> np.ndarray:
        return _durations(self.candidates)

    @property
    def energies(self) -> np.ndarray:
        return np.array([c.energy_j for c in self.candidates], dtype=float)

    @property
    def within(self) -> np.ndarray:
        return np.array([c.within_slowdown for c in self.candidates], dtype=bool)


@dataclass
class _Choice:
    """The ranked (configuration, start) candidates and the chosen one."""

    cfg_idx: np.ndarray
    start_s: np.ndarray
    em: np.ndarray
    cost: np.ndarray
    feasible: np.ndarray
    order: np.ndarray

    @property
    def best(self) -> int:
        return int(self.order[0])


def plan_job(
    spec: JobSpec,
    profile: Profile,
    forecast: Forecast | None,
    now: datetime,
    history: JobHistory | None = None,
    *,
    on_infeasible: Literal["raise", "fastest"] = "raise",
    alternatives_per_config: int = 3,
    early_stop: bool = False,
    intensity_history: Sequence[ForecastPoint] | None = None,
    starts_now_because: str | None = None,
) -> Plan:
    """Choose configuration and start jointly for one job (see the module docstring): candidates →
    predictions → start search → choice → reason.

    ``early_stop=True``: the caller stops a run of a target-trained job once it has spent the batch-size
    explorer's :meth:`~carbonflow.planning.learning.BatchSizeExplorer.stop_threshold` and reruns it at once at
    the best known batch size; the deadline margin then counts on that stop and reserves time for the rerun.
    ``intensity_history``: recent actual intensity, which makes the start search robust (see module doc).
    ``starts_now_because``: the caller starts the run now whatever the forecast (give ``forecast=None``); the
    reason says this instead of "no forecast".
    """
    _utc("now", now)
    if on_infeasible not in ("raise", "fastest"):
        raise ValueError(f"on_infeasible={on_infeasible!r} is not allowed; use 'raise' or 'fastest'")
    if spec.finish_by is not None and spec.finish_by <= now:
        raise DeadlineError(f"finish_by={spec.finish_by.isoformat()} is not after now={now.isoformat()}")
    if forecast is not None and not forecast.points:
        forecast = None
    objective, notes = _objective_tonight(spec, forecast, starts_now_because)
    profile = decidable_profile(profile, notes)
    tonight = _candidates_tonight(spec, profile, history, now, early_stop, notes)  # candidates + predictions
    latest, squeezed = latest_starts(spec, forecast, now, tonight.durations, tonight.within, tonight.margin)
    found = plan_starts(forecast, now, tonight.durations, latest, intensity_history, tonight.notes)  # the one search
    choice = _choose(spec, forecast, now, tonight, latest, found, objective, on_infeasible)
    chosen = tonight.candidates[int(choice.cfg_idx[choice.best])]
    start = now + timedelta(seconds=float(choice.start_s[choice.best]))
    if forecast is not None and float(choice.start_s[choice.best]) + chosen.duration_s > found.horizon_end_s + _EPS:
        notes.append("run ends after the forecast horizon: its last value is held")
    alternatives = _alternatives(
        spec, forecast, now, tonight, latest, squeezed, choice, objective, alternatives_per_config
    )
    baseline = _baseline(spec, forecast, now, tonight, objective)
    why = _why_not_better(spec, chosen, float(choice.em[choice.best]), alternatives, found.shrunk_slots > 0)
    if why:
        notes.append(why)
    em_best = float(choice.em[choice.best])
    held = _why_not_later(spec, choice, now) if forecast is not None else None
    if held:
        notes.append(held)
    capped = _at_epochs_cap(spec, history)
    if capped:
        notes.append(capped)
    reason = _reason(
        spec, chosen, start, em_best, baseline.predicted_emissions_g, tonight.ref_c, now, forecast is not None, notes
    )
    return Plan(
        job=spec.name,
        config=chosen.config,
        start=start,
        finish_by=spec.finish_by,
        predicted_duration_s=float(chosen.duration_s),
        predicted_energy_j=float(chosen.energy_j),
        predicted_emissions_g=em_best,
        objective=spec.objective,
        region=forecast.region if forecast is not None else spec.region,
        forecast_provider=forecast.provider if forecast is not None else "none",
        signal_kind=forecast.signal_kind if forecast is not None else None,
        replay=forecast.replay if forecast is not None else False,
        baseline=baseline,
        alternatives=alternatives,
        reason=reason,
        created_at=now,
    )


def _at_epochs_cap(spec: JobSpec, history: JobHistory | None) -> str | None:
    """The note of a target-trained job predicted at its ``epochs`` (the most a run may train, an upper bound):
    no run of it has reached the target yet, so neither its history nor the batch-size explorer (whose guesses
    for an untried batch size come from sizes that did) says how many it needs (see :func:`work_samples`)."""
    if spec.target_metric is None or spec.target_value is None or spec.epochs is None:
        return None
    if history is not None and any(r.reached_target for r in history.for_job(spec.name)):
        return None
    return (
        f"predicted for its most epochs ({spec.epochs}), an upper bound: no run has reached "
        f"{spec.target_metric} >= {spec.target_value:g} yet"
    )


def _objective_tonight(
    spec: JobSpec, forecast: Forecast | None, starts_now_because: str | None = None
) -> tuple[str, list[str]]:
    """The objective planned with (carbon falls back to energy without a forecast) and the notes saying so
    (``starts_now_because``: why the caller starts now without one, said instead of "no forecast")."""
    if forecast is not None:
        return spec.objective, []
    why = starts_now_because or "no forecast: starts now"
    if parse_objective(spec.objective)[0] == "carbon":
        return "energy", [f"{why}, carbon objective planned as energy"]
    return spec.objective, [why]


def decidable_profile(profile: Profile, notes: list[str] | None = None) -> Profile:
    """The profile the planner may choose from: a profile whose points its own noise cannot tell apart (the
    profiler says so in ``profile.notes``) keeps only its default-power-limit points, and the reason says why."""
    noisy = [n for n in profile.notes if PROFILE_NOISE in n]
    default = [p for p in profile.points if p.config.power_limit_w in (None, profile.default_power_limit_w)]
    if not noisy or not default:
        return profile
    if notes is not None:
        notes.append(noisy[0])
    return profile.model_copy(update={"points": default})


def _candidates_tonight(
    spec: JobSpec, profile: Profile, history: JobHistory | None, now: datetime, early_stop: bool, notes: list[str]
) -> _Tonight:
    """Candidates and their predictions; for a job learning its batch size, only tonight's batch size's."""
    candidates, ref_c, ref = predict_candidates(spec, profile, history)
    explorer = batch_size_explorer(spec, profile, history)
    limit_s = (spec.finish_by - now).total_seconds() if spec.finish_by is not None else float("inf")
    margin_all, reserve_s = deadline_margins(spec, profile, history, candidates, explorer if early_stop else None)
    if explorer is None:
        return _Tonight(candidates, ref_c, ref, margin_all, notes)
    assert history is not None
    margins = margin_all if margin_all is not None else np.ones(len(candidates))

    def fits(bs: int) -> bool:
        """Some configuration of this batch size keeps the slowdown bound and, with its deadline margin
        (and, for an untried size, the time to rerun at the best known size after an early stop), finish_by."""
        return any(
            c.within_slowdown and c.duration_s * m + reserve_s.get(bs, 0.0) <= limit_s + _EPS
            for c, m in zip(candidates, margins, strict=True)
            if batch_size_of(c.config, spec) == bs
        )

    runs = len(history.for_job(spec.name))
    learned_bs = explorer.choose()
    if fits(learned_bs):
        plural = "" if runs == 1 else "s"
        notes.append(f"batch size {learned_bs} chosen by the explorer from the job's {runs} run{plural}")
    else:  # the explorer's choice among those that fit, else the best known, else the job's own
        fitting = [b for b in explorer.arms if b in explorer.prior_cost_per_epoch and fits(b)]
        fallback = explorer.choose(allowed=fitting) if fitting else explorer.best_mean()[0]
        if not fits(fallback):
            fallback = batch_size_of(ref_c.config, spec)
        notes.append(f"batch size {learned_bs} does not fit the slowdown bound or finish_by tonight: {fallback}")
        learned_bs = fallback
    keep = [i for i, c in enumerate(candidates) if batch_size_of(c.config, spec) == learned_bs]
    if keep:
        candidates = [candidates[i] for i in keep]
        if margin_all is not None:
            margin_all = margin_all[keep]
        extra_s = reserve_s.get(learned_bs, 0.0)
        if extra_s > 0 and margin_all is not None and np.all(_durations(candidates) > 0):
            # Reserve the rerun's time after an early-stopped exploratory run: fold it into the margin.
            margin_all = margin_all + extra_s / _durations(candidates)
    return _Tonight(candidates, ref_c, ref, margin_all, notes)


def _choose(
    spec: JobSpec,
    forecast: Forecast | None,
    now: datetime,
    tonight: _Tonight,
    latest: np.ndarray,
    found: StartSearch,
    objective: str,
    on_infeasible: str,
) -> _Choice:
    """Rank every (configuration, start) by feasibility, the objective, then the documented tie-breaks."""
    durations, energies, within = tonight.durations, tonight.energies, tonight.within
    if not found.run.size or not np.any(within & (latest >= -_EPS)):
        fastest = int(np.argmin(durations))
        need = timedelta(seconds=float(durations[fastest]))
        msg = (
            f"finish_by={spec.finish_by.isoformat() if spec.finish_by else None} cannot be met: the fastest "
            f"configuration ({_fmt_config(tonight.candidates[fastest].config)}) needs {need} from now={now.isoformat()}"
        )
        if on_infeasible == "raise":
            raise DeadlineError(msg)
        tonight.notes.insert(0, "DEADLINE AT RISK")
        cfg_idx, start_s = np.array([fastest]), np.array([0.0])
        mean_ci = score_ci = np.array([run_now_ci(forecast, now, float(durations[fastest]))])
        forced = True
    else:
        cfg_idx, start_s = found.run, found.start_s
        mean_ci, score_ci = found.mean_gco2_per_kwh, found.score_gco2_per_kwh
        forced = False
    dur, en = durations[cfg_idx], energies[cfg_idx]
    em = emissions_g_from(en, mean_ci)
    em_rank = emissions_g_from(en, score_ci)
    cost = objective_for(objective).cost(en, dur, em_rank, tonight.ref)
    feasible = within[cfg_idx] | forced
    key_rank = np.argsort(np.argsort(np.array([c.config.key() for c in tonight.candidates])))
    # Quantise costs so float noise never decides; then the documented tie-breaks.
    qcost = np.round(cost / max(float(np.max(np.abs(cost))), 1e-300), 9)
    em_q = np.round(em_rank / max(float(em_rank.max()), 1e-300), 9)
    order = np.lexsort((key_rank[cfg_idx], start_s, dur, en, em_q, qcost, ~feasible))
    return _Choice(cfg_idx, start_s, em, cost, feasible, order)


def _alternative(c: Candidate, start: datetime, em_g: float, cost: float, ok: bool, why: str | None) -> PlanAlternative:
    return PlanAlternative(
        config=c.config,
        start=start,
        predicted_duration_s=float(c.duration_s),
        predicted_energy_j=float(c.energy_j),
        predicted_emissions_g=float(em_g),
        cost=float(cost),
        feasible=ok,
        why_not=why,
    )


def _run_now_cost(forecast: Forecast | None, now: datetime, c: Candidate, objective: str, ref: Reference):
    """(emissions g, cost) of a candidate started now."""
    em = emissions_g_from(c.energy_j, run_now_ci(forecast, now, c.duration_s))
    cost = float(objective_for(objective).cost([c.energy_j], [c.duration_s], [em], ref)[0])
    return em, cost


def _alternatives(
    spec: JobSpec,
    forecast: Forecast | None,
    now: datetime,
    tonight: _Tonight,
    latest: np.ndarray,
    squeezed: np.ndarray,
    choice: _Choice,
    objective: str,
    per_config: int,
) -> list[PlanAlternative]:
    """The best few starts of every other configuration, and one entry per configuration that cannot finish."""
    out: list[PlanAlternative] = []
    taken: dict[int, int] = {}
    for j in choice.order.tolist():
        i = int(choice.cfg_idx[j])
        if j == choice.best or taken.get(i, 0) >= per_config:
            continue
        taken[i] = taken.get(i, 0) + 1
        c = tonight.candidates[i]
        ok = bool(choice.feasible[j])
        why = None if ok else f"slowdown {c.slowdown:+.1%} exceeds max_slowdown {spec.max_slowdown:.0%}"
        start = now + timedelta(seconds=float(choice.start_s[j]))
        out.append(_alternative(c, start, choice.em[j], choice.cost[j], ok, why))
    for i, c in enumerate(tonight.candidates):
        if latest[i] >= -_EPS:
            continue
        finish = now + timedelta(seconds=float(c.duration_s))
        why = f"finishes {finish.isoformat(timespec='minutes')} after finish_by even if started now"
        if squeezed[i]:
            why = "no room before finish_by for the most epochs it is likely to need (see deadline_epochs)"
        em, cost = _run_now_cost(forecast, now, c, objective, tonight.ref)
        out.append(_alternative(c, now, em, cost, False, why))
    return out


def _baseline(
    spec: JobSpec, forecast: Forecast | None, now: datetime, tonight: _Tonight, objective: str
) -> PlanAlternative:
    """The reference configuration started now: what "saving" is measured against."""
    ref_c = tonight.ref_c
    em, cost = _run_now_cost(forecast, now, ref_c, objective, tonight.ref)
    ok = spec.finish_by is None or ref_c.duration_s <= (spec.finish_by - now).total_seconds() + _EPS
    return _alternative(ref_c, now, em, cost, ok, None if ok else "misses finish_by")


def _durations(candidates: Sequence[Candidate]) -> np.ndarray:
    return np.array([c.duration_s for c in candidates], dtype=float)


def _why_not_better(
    spec: JobSpec, chosen: Candidate, em: float, alternatives: Sequence[PlanAlternative], robust: bool
) -> str | None:
    """Why a listed alternative that uses less energy *and* less carbon was not chosen (None: there is none)."""
    better = [
        a
        for a in alternatives
        if a.predicted_energy_j < chosen.energy_j * (1 - 1e-6) and a.predicted_emissions_g < em * (1 - 1e-6)
    ]
    if not better:
        return None
    a = min(better, key=lambda x: (x.predicted_emissions_g, x.predicted_energy_j))
    what = f"{_fmt_w(a.config)} would use less energy and carbon"
    if not a.feasible:
        return f"{what} but {a.why_not}"
    if parse_objective(spec.objective)[0] == "carbon" and robust:
        return f"{what} by the raw forecast, but the recent actuals make its window less likely to be low"
    return f"{what} but costs more under the objective {spec.objective}, which also weighs time"


def _why_not_later(spec: JobSpec, choice: _Choice, now: datetime) -> str | None:
    """Why the run starts now although the forecast shows a lower window for the same configuration: the
    window's gain is within the forecast's error at its lead (the safer-start rule, the recent actuals)."""
    if float(choice.start_s[choice.best]) > 0 or parse_objective(spec.objective)[0] != "carbon":
        return None
    em = float(choice.em[choice.best])
    later = (choice.cfg_idx == choice.cfg_idx[choice.best]) & choice.feasible & (choice.start_s > 0)
    if not np.any(later) or float(np.min(choice.em[later])) >= em * 0.99:
        return None
    k = np.flatnonzero(later)[int(np.argmin(choice.em[later]))]
    when = now + timedelta(seconds=float(choice.start_s[k]))
    gain = 1 - float(choice.em[k]) / em
    return (
        f"the forecast's lower window, start {_hm(when)} UTC, would save {gain * 100:.1f} % by the raw forecast, "
        f"within its error {float(choice.start_s[k]) / 3600:.0f} h ahead: starting now is the safer choice"
    )


def _reason(
    spec: JobSpec,
    chosen: Candidate,
    start: datetime,
    em: float,
    base_em: float,
    ref: Candidate,
    now: datetime,
    have_forecast: bool,
    notes: list[str],
) -> str:
    when = "start now" if start == now else f"start {_hm(start)} UTC"
    head = f"{_fmt_config(chosen.config)}, {when}"
    if have_forecast:
        vs = saving_phrase(saving_fraction(em, base_em), spec.objective, default=_fmt_w(ref.config))
    else:
        fraction = saving_fraction(chosen.energy_j, ref.energy_j)
        vs = saving_phrase(fraction, spec.objective, of="energy", default=_fmt_w(ref.config))
    slow = chosen.slowdown
    speed = f"{abs(slow) * 100:.0f} % {'slower' if slow > 0 else 'faster'}" if abs(slow) >= 0.005 else "same speed"
    finish = start + timedelta(seconds=chosen.duration_s)
    tail = f"finishes {_hm(finish)}"
    if spec.finish_by is not None:
        tail += f" {'before' if finish <= spec.finish_by else 'AFTER'} {_hm(spec.finish_by)}"
    text = f"{head}: {vs}; {speed}, {tail}"
    if notes:
        text = f"{'; '.join(notes)} — {text}" if notes[0] == "DEADLINE AT RISK" else f"{text} ({'; '.join(notes)})"
    return text


def pareto_alternatives(plan: Plan) -> list[PlanAlternative]:
    """The plan's choice and feasible alternatives not dominated in (duration, energy, emissions), cheapest first.

    For a UI or report: the trade-offs a person could still pick instead of the planner's choice.
    """
    chosen = PlanAlternative(
        config=plan.config,
        start=plan.start,
        predicted_duration_s=plan.predicted_duration_s,
        predicted_energy_j=plan.predicted_energy_j,
        predicted_emissions_g=plan.predicted_emissions_g,
        cost=min([a.cost for a in plan.alternatives if a.feasible], default=0.0),
        feasible=True,
    )
    options = [chosen, *(a for a in plan.alternatives if a.feasible)]
    # Values equal to 9 significant digits are one option (float noise of summing one window two ways never
    # dominates): the first of them (the choice comes first) stands for all.
    rounded: dict[tuple[float, ...], PlanAlternative] = {}
    for a in options:
        key = tuple(float(f"{v:.9g}") for v in (a.predicted_duration_s, a.predicted_energy_j, a.predicted_emissions_g))
        rounded.setdefault(key, a)
    options = list(rounded.values())
    keep = pareto_front(list(rounded))
    return sorted((options[i] for i in keep), key=lambda a: (a.predicted_emissions_g, a.predicted_energy_j))
