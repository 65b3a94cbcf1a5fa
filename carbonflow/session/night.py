"""The night's batch, without Airflow: which pairs to profile together, then one joint plan of every job.

:func:`pairs_to_profile` chooses the pairs of recurring jobs worth running together briefly tonight;
:func:`plan_night_batch` plans the whole batch with :func:`carbonflow.planning.night.plan_night`
(power limit, containers, start and guarded co-location, jointly), fits it onto the night's GPUs and
returns a typed :class:`~carbonflow.session.state.NightPlan`. The operators
(:mod:`carbonflow.operators.night`) only pull profiles from XCom, call these and push the answer back.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from carbonflow.domain import Forecast, JobSpec, Plan, Profile
from carbonflow.session.clock import DEFAULT_DEADLINE_TIME_UTC, next_deadline
from carbonflow.session.source import CarbonSource
from carbonflow.session.state import NightPair, NightPlan

_LOG = logging.getLogger(__name__)


def can_share(a: JobSpec, b: JobSpec) -> str | None:
    """Why two jobs can never share a GPU here, or None when they could."""
    from carbonflow.session.run import observe_only

    if observe_only(a) or observe_only(b):
        return "an observe-only job trains alone, as it would without carbonflow"
    if a.progress_pattern or b.progress_pattern:
        return "a job whose progress is read from its printed lines (progress_pattern) trains alone"
    if a.region != b.region:
        return f"different regions ({a.region}, {b.region})"
    if a.min_containers != 1 or b.min_containers != 1:
        return "a job needs more than one container"
    sims = (a.simulated_gpu, b.simulated_gpu)
    if (sims[0] is None) != (sims[1] is None):
        return "one job simulates its GPU and the other does not"
    if sims[0] is not None and sims[1] is not None:
        if sims[0].gpu_model != sims[1].gpu_model:
            return f"different simulated GPUs ({sims[0].gpu_model}, {sims[1].gpu_model})"
        if not (sims[0].pair_type and sims[1].pair_type):
            return "simulated_gpu.pair_type is not set for both (no measured pair speeds to replay)"
    return None


# ---- which pairs to profile tonight ------------------------------------------------------------
def pairs_to_profile(
    specs: Sequence[JobSpec],
    profiles: Mapping[str, Profile],
    history: Any,
    *,
    max_pairs: int | None = None,
    max_pair_gpu_s: float | None = None,
    pair_profile_gpu_s: float = 60.0,
    log: logging.Logger | logging.LoggerAdapter = _LOG,  # type: ignore[type-arg]
) -> list[tuple[str, str]]:
    """Unknown pairs that could share a GPU; within the budget (if set), the most promising by prediction."""
    unknown = _unknown_pairs(specs, history, log)
    if max_pairs is None and max_pair_gpu_s is None:
        return unknown
    from carbonflow.planning.pairs import choose_pairs

    chosen = choose_pairs(
        unknown, profiles, _history_outcomes(specs, history),
        max_pairs=len(unknown) if max_pairs is None else max_pairs,
        max_gpu_s=float("inf") if max_pair_gpu_s is None else max_pair_gpu_s,
        pair_profile_gpu_s=pair_profile_gpu_s,
    )  # fmt: skip
    log.info("%d unknown pairs could share a GPU; profiling the %d most promising within the budget "
             "(max_pairs=%s, max_pair_gpu_s=%s); the early-observation guard settles the rest",
             len(unknown), len(chosen), max_pairs, max_pair_gpu_s)  # fmt: skip
    return [(c.job_a, c.job_b) for c in chosen]


def _unknown_pairs(specs: Sequence[JobSpec], history: Any, log: Any) -> list[tuple[str, str]]:
    """Pairs that could share a GPU and never ran together (a pair with history is predicted from it)."""
    unknown = []
    for a, b in itertools.combinations(specs, 2):
        why_not = can_share(a, b)
        if why_not:
            log.info("not pairing %s and %s: %s", a.name, b.name, why_not)
        elif history is not None and history.pair_slowdown(a.name, b.name) is not None:
            log.info("%s and %s ran together before: the planner predicts from that history", a.name, b.name)
        else:
            unknown.append((a.name, b.name))
    return unknown


def _history_outcomes(specs: Sequence[JobSpec], history: Any) -> list:
    """Pairs that shared a GPU before, as kept speeds both ways (what the pair predictor learns from)."""
    from carbonflow.planning.learning import kept_speed_from_slowdown
    from carbonflow.planning.pairs import PairOutcome

    out = []
    for a, b in itertools.combinations([s.name for s in specs], 2):
        slow = (history.pair_slowdown(a, b), history.pair_slowdown(b, a)) if history is not None else (None, None)
        if slow[0] is not None and slow[1] is not None:
            out.append(PairOutcome(a, b, kept_speed_from_slowdown(max(slow[0], 0.0)),
                                   kept_speed_from_slowdown(max(slow[1], 0.0))))  # fmt: skip
    return out


# ---- the night's joint plan --------------------------------------------------------------------
def plan_night_batch(
    specs: Sequence[JobSpec],
    profiles: Mapping[str, Profile],
    source: CarbonSource,
    now: datetime,
    *,
    deadline_time_utc: str = DEFAULT_DEADLINE_TIME_UTC,
    pair_profiles: Sequence[Any] = (),
    history: Any = None,
    gpus: int | None = None,
    log: logging.Logger | logging.LoggerAdapter = _LOG,  # type: ignore[type-arg]
    early_stop: bool = True,
) -> NightPlan:
    """Plan the night's batch jointly (power limit, containers, start, co-location) from its profiles.

    A job without ``finish_by`` must finish by the next ``deadline_time_utc``. ``pair_profiles`` are the
    pairs measured together tonight (:class:`~carbonflow.planning.pairs.PairProfile`); ``history`` the
    jobs' MLflow history (None: plan from the profiles alone); ``gpus`` the GPUs the batch shares (plans
    are fitted onto them, :func:`carbonflow.planning.night_gpus.fit_plans_to_gpus`; None: one per job).
    ``early_stop``: a solo run of a job that explores batch sizes towards a target is stopped at the explorer's
    threshold and rerun at the best known batch size (``RunSession`` on the local backend), so its plan reserves the
    rerun (``plan_job(..., early_stop=True)``; on Kubernetes, where runs are not stopped yet, that room is spare).
    """
    from carbonflow.planning.night import plan_night

    if gpus is not None and gpus < 1:
        raise ValueError(f"gpus={gpus} is not allowed; give the number of GPUs the night may use (>= 1)")
    specs = _with_deadlines(specs, now, deadline_time_utc)
    forecasts = _forecasts(source, specs, now)
    recent = {region: source.recent_actuals(region, now) for region in forecasts}
    plans = plan_night(
        specs, profiles, forecasts, now, pair_profiles=pair_profiles, history=history, intensity_history=recent,
        early_stop=early_stop,
    )  # fmt: skip
    by_name = {s.name: s for s in specs}
    if gpus is not None:
        plans = _fit_to_gpus(plans, gpus, now, forecasts, by_name, profiles, history)
    notes = _explain(plans, forecasts, by_name, profiles, pair_profiles, history, log)
    return NightPlan(
        now=now, groups=gpu_groups(plans), jobs=by_name, plans={p.job: p for p in plans}, profiles=dict(profiles),
        forecasts=forecasts, min_kept_speed=_pair_guards(plans, by_name, profiles, pair_profiles, history),
        notes=notes, pairs=[NightPair(**dataclasses.asdict(p)) for p in pair_profiles],
    )  # fmt: skip


def _with_deadlines(specs: Sequence[JobSpec], now: datetime, deadline_time_utc: str) -> list[JobSpec]:
    """The specs with a missing ``finish_by`` set to the next deadline; a finish-by in the past is refused."""
    if not specs:
        raise ValueError("jobs=[] is not allowed; plan a night of at least one job")
    deadline = next_deadline(now, deadline_time_utc)
    out = [s if s.finish_by is not None else s.model_copy(update={"finish_by": deadline}) for s in specs]
    late = [s for s in out if s.finish_by is not None and s.finish_by <= now]
    if late:
        raise ValueError(f"finish_by={late[0].finish_by.isoformat()} of job {late[0].name} is in the past")  # type: ignore[union-attr]
    return out


def _forecasts(source: CarbonSource, specs: Sequence[JobSpec], now: datetime) -> dict[str, Forecast]:
    """Each region's forecast, from now until the latest finish-by of its jobs."""
    forecasts = {}
    for region in sorted({s.region for s in specs}):
        until = max(s.finish_by for s in specs if s.region == region)  # type: ignore[type-var]
        forecasts[region] = source.forecast(region, now, until)  # type: ignore[arg-type]
    return forecasts


def _explain(
    plans: Sequence[Plan], forecasts: Mapping[str, Forecast], specs: Mapping[str, JobSpec],
    profiles: Mapping[str, Profile], pair_profiles: Sequence[Any], history: Any, log: Any,
) -> dict[str, str]:  # fmt: skip
    """Mark each plan replayed or live, add to a lone job's reason why it runs alone; those notes by job."""
    notes: dict[str, str] = {}
    for plan in plans:
        plan.replay = forecasts[plan.region].replay
        if not plan.colocated_with:
            notes[plan.job] = _why_alone(plan.job, specs, profiles, pair_profiles, history)
            plan.reason += notes[plan.job]
        log.info("%s: %s", plan.job, plan.reason)
    return notes


def _pair_guards(
    plans: Sequence[Plan], specs: Mapping[str, JobSpec], profiles: Mapping[str, Profile],
    pair_profiles: Sequence[Any], history: Any,
) -> dict[str, float]:  # fmt: skip
    """Each measured pair's early-observation guard: below this kept speed a member is separated."""
    from carbonflow.planning.early_observation import min_kept_speeds
    from carbonflow.planning.optimizer import predict_candidates

    guards: dict[str, float] = {}
    for plan in plans:
        partner = plan.colocated_with[0] if plan.colocated_with else None
        if partner is None or plan.job > partner:
            continue
        pair = next((p for p in pair_profiles if p.speeds(plan.job, partner) is not None), None)
        if pair is None:  # predicted from history alone: no speeds to guard against
            continue
        me, other = specs[plan.job], specs[partner]
        solo_me = predict_candidates(me, profiles[me.name], history)[1].duration_s
        solo_other = predict_candidates(other, profiles[other.name], history)[1].duration_s
        speeds = pair.speeds(me.name, other.name)
        assert speeds is not None  # the pair is about these two jobs
        guard = min_kept_speeds(solo_me, solo_other, min(speeds[0], 1.0), min(speeds[1], 1.0),
                                me.max_slowdown, other.max_slowdown)  # fmt: skip
        guards[me.name], guards[other.name] = guard
    return guards


def gpu_groups(plans: Sequence[Any]) -> list[list[str]]:
    """The night's GPU groups, by start: each job alone, or a co-located pair (names in order), listed once."""
    groups = []
    for plan in sorted(plans, key=lambda p: (p.start, p.job)):
        members = sorted([plan.job, *plan.colocated_with[:1]])
        if members[0] == plan.job:
            groups.append(members)
    return groups


def _fit_to_gpus(plans, gpus, now, forecasts, specs, profiles, history):  # type: ignore[no-untyped-def]
    """The night's plans fitted onto ``gpus`` GPUs, region by region's forecast (one region: the common case)."""
    from carbonflow.planning.night_gpus import deadline_factors, fit_plans_to_gpus

    margin = deadline_factors(plans, specs, profiles, history)
    forecast = next(iter(forecasts.values())) if len(forecasts) == 1 else None
    return fit_plans_to_gpus(plans, gpus, now, forecast, margin)


def sharing_words(speeds: Sequence[float], label: str) -> str:
    """A pair's kept speeds and the slowdowns they mean (the one formula, 1 / kept − 1), e.g. for a plan's reason."""
    from carbonflow.planning.learning import slowdown_from_kept_speed

    slower = " / ".join(f"{slowdown_from_kept_speed(k) * 100:.0f} %" for k in speeds)
    kept = " / ".join(f"{k:.2f}" for k in speeds)
    return f"sharing, they keep {kept} of their solo speeds ({slower} slower while both run; {label})"


def _why_alone(
    job: str, specs: Mapping[str, JobSpec], profiles: Mapping[str, Profile], pair_profiles: Sequence[Any], history: Any
) -> str:
    """For a job that was measured with a partner but runs alone: the predicted slowdowns that kept them apart."""
    from carbonflow.planning.optimizer import predict_candidates
    from carbonflow.planning.pairs import predict_pair_slowdown

    notes = []
    for pair in pair_profiles:
        if job not in (pair.job_a, pair.job_b):
            continue
        other = pair.job_b if pair.job_a == job else pair.job_a
        refs = [predict_candidates(specs[n], profiles[n], history)[1] for n in (job, other)]
        slow = predict_pair_slowdown(job, other, refs[0].duration_s, refs[1].duration_s, pair_profiles, history,
                                     refs[0].fixed_s, refs[1].fixed_s)  # fmt: skip
        if slow is None:
            continue
        speeds = pair.speeds(job, other)
        assert speeds is not None  # the pair is about ``job`` and ``other``
        notes.append(
            f"; alone, not with {other}: {sharing_words(speeds, pair.label)}, so their runs would take "
            f"{slow[0] * 100:.0f} % / {slow[1] * 100:.0f} % longer (bounds {specs[job].max_slowdown * 100:.0f} % / "
            f"{specs[other].max_slowdown * 100:.0f} %)"
            if slow[0] > specs[job].max_slowdown or slow[1] > specs[other].max_slowdown
            else f"; alone, not with {other}: sharing a GPU would not save on the objective"
        )
    return "".join(notes)
