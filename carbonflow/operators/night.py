"""The night's batch: pair profiles for co-location across recurring jobs, then one joint plan.

``PairProfileOperator`` runs each pair of the night's jobs that could share a GPU together briefly
(same region, one-container reference configuration, a GPU both can share) and records the speed
each keeps and the GPU's power. Pairs that already ran together on earlier nights are predicted from
that history instead. ``NightPlanOperator`` plans the whole batch with
:func:`carbonflow.planning.colocation.plan_night` (power limit, containers, start and guarded
co-location, jointly) and hands each job's plan to its :class:`CarbonAwareTrainingOperator`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import BaseOperator, task

from carbonflow.energy.lease import safe_name
from carbonflow.execution.backend import make_backend
from carbonflow.models import JobSpec, Profile, parse_job, utcnow
from carbonflow.operators.common import carbon_source, home, with_connection_env
from carbonflow.session.clock import DEFAULT_DEADLINE_TIME_UTC
from carbonflow.session.run import planning_history
from carbonflow.session.source import session_clock


def _jobs(jobs: Mapping[str, Any]) -> list[JobSpec]:
    if not jobs:
        raise ValueError("jobs={} is not allowed; map at least two job names to their JobSpecs")
    return [parse_job(job) for job in jobs.values()]


def _profiles(context: Any, profile_task_ids: Mapping[str, str] | str, specs: Sequence[JobSpec]) -> dict[str, Profile]:
    """Each job's profile: from its own task (name → task id), or from one mapped task (every map index)."""
    if isinstance(profile_task_ids, str):
        pulled = context["ti"].xcom_pull(task_ids=[profile_task_ids]) or []
        by_job = {p.job: p for p in (Profile.model_validate(raw) for raw in pulled if raw)}
        missing = [s.name for s in specs if s.name not in by_job]
        if missing:
            raise ValueError(f"no profile for {missing} in the mapped task {profile_task_ids!r}")
        return {s.name: by_job[s.name] for s in specs}
    out = {}
    for spec in specs:
        task_id = profile_task_ids.get(spec.name)
        if task_id is None:
            raise ValueError(f"profile_task_ids has no task for job {spec.name!r}; allowed keys: job names")
        raw = context["ti"].xcom_pull(task_ids=task_id)
        if raw is None:
            raise ValueError(f"no profile in XCom of task {task_id!r} (job {spec.name})")
        out[spec.name] = Profile.model_validate(raw)
    return out


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


class PairProfileOperator(BaseOperator):
    """Run each pair of recurring jobs that could share a GPU together briefly; XCom: the pair profiles.

    :param jobs: job name → JobSpec (model, dict or JSON; templated, e.g. pulled from the validate task).
    :param profile_task_ids: job name → its EnergyProfileOperator task (solo speeds to compare with), or the
        task id of one EnergyProfileOperator mapped over the jobs.
    :param max_pairs: / ``max_pair_gpu_s``: the night's pair-profiling budget (pair count, GPU-seconds at
        ``pair_profile_gpu_s`` each). Within it the most promising unknown pairs are profiled, ranked by the pair
        predictor (:mod:`carbonflow.planning.pair_prediction`); the early-observation guard settles the rest.
        None for both: every unknown pair.
    :param profile_steps: steps measured together (default: the smaller of the two jobs' ``profile_steps``).
    """

    template_fields: Sequence[str] = ("jobs",)
    ui_color = "#e1f5e1"

    def __init__(
        self,
        *,
        jobs: Mapping[str, Any],
        profile_task_ids: Mapping[str, str] | str,
        profile_steps: int | None = None,
        tracking_uri: str | None = None,
        backend: str = "local",
        max_pairs: int | None = None,
        max_pair_gpu_s: float | None = None,
        pair_profile_gpu_s: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("max_pairs", max_pairs), ("max_pair_gpu_s", max_pair_gpu_s)):
            if value is not None and value < 0:
                raise ValueError(f"{name}={value} is not allowed; use 0 or more (None: profile every unknown pair)")
        self.max_pairs = max_pairs
        self.max_pair_gpu_s = max_pair_gpu_s
        self.pair_profile_gpu_s = pair_profile_gpu_s
        self.jobs = dict(jobs)
        self.profile_task_ids = profile_task_ids if isinstance(profile_task_ids, str) else dict(profile_task_ids)
        self.profile_steps = profile_steps
        self.tracking_uri = tracking_uri
        self.backend = backend
        self._backend: Any = None
        if profile_steps is not None and profile_steps <= 0:
            raise ValueError(f"profile_steps={profile_steps} is not allowed; use a positive number of steps")

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from carbonflow.profiling.profiler import profile_pair

        specs = _jobs(self.jobs)
        profiles = _profiles(context, self.profile_task_ids, specs)
        history = planning_history([s.name for s in specs], self.tracking_uri, self.log)
        run_id = str(context["run_id"]) if context and "run_id" in context else utcnow().strftime("%Y%m%dT%H%M%S")
        pairs: list[dict[str, Any]] = []
        by_name = {s.name: s for s in specs}
        for name_a, name_b in self._pairs_tonight(specs, profiles, history):
            a, b = by_name[name_a], by_name[name_b]
            if self._backend is None:
                workdir = home() / "runs" / safe_name(run_id) / "pairs"
                self._backend = make_backend(self.backend, workdir)
                if not self._backend.supports_shared:
                    self.log.warning("backend %r cannot run pair profiles; no co-location tonight", self.backend)
                    return []
            try:
                pair = profile_pair(with_connection_env(a), with_connection_env(b), profiles[a.name],
                                    profiles[b.name], self._backend,
                                    profile_steps=self.profile_steps)  # fmt: skip
            except Exception as err:  # an unknown pair is simply never co-located
                self.log.warning("pair profile of %s + %s failed (%s); they won't share a GPU", a.name, b.name, err)
                continue
            self.log.info(
                "pair %s + %s: keeps %.2f / %.2f of solo speed, %.0f W together (%s)", a.name, b.name, pair.speed_a,
                pair.speed_b, pair.power_w, pair.label,
            )  # fmt: skip
            pairs.append(dataclasses.asdict(pair))
        return pairs

    def _pairs_tonight(self, specs: Sequence[JobSpec], profiles: Mapping[str, Profile], history: Any) -> list:
        """Unknown pairs that could share a GPU; within the budget (if set), the most promising by prediction."""
        unknown = []
        for a, b in itertools.combinations(specs, 2):
            why_not = can_share(a, b)
            if why_not:
                self.log.info("not pairing %s and %s: %s", a.name, b.name, why_not)
            elif history is not None and history.pair_slowdown(a.name, b.name) is not None:
                self.log.info("%s and %s ran together before: the planner predicts from that history", a.name, b.name)
            else:
                unknown.append((a.name, b.name))
        if self.max_pairs is None and self.max_pair_gpu_s is None:
            return unknown
        from carbonflow.planning.pair_prediction import choose_pairs

        chosen = choose_pairs(
            unknown, profiles, _history_outcomes(specs, history),
            max_pairs=len(unknown) if self.max_pairs is None else self.max_pairs,
            max_gpu_s=float("inf") if self.max_pair_gpu_s is None else self.max_pair_gpu_s,
            pair_profile_gpu_s=self.pair_profile_gpu_s,
        )  # fmt: skip
        self.log.info("%d unknown pairs could share a GPU; profiling the %d most promising within the budget "
                      "(max_pairs=%s, max_pair_gpu_s=%s); the early-observation guard settles the rest",
                      len(unknown), len(chosen), self.max_pairs, self.max_pair_gpu_s)  # fmt: skip
        return [(c.job_a, c.job_b) for c in chosen]

    def on_kill(self) -> None:
        if self._backend is not None:
            self._backend.kill()


def _history_outcomes(specs: Sequence[JobSpec], history: Any) -> list:
    """Pairs that shared a GPU before, as kept speeds both ways (what the pair predictor learns from)."""
    from carbonflow.planning.learning import kept_speed_from_slowdown
    from carbonflow.planning.pair_prediction import PairOutcome

    out = []
    for a, b in itertools.combinations([s.name for s in specs], 2):
        slow = (history.pair_slowdown(a, b), history.pair_slowdown(b, a)) if history is not None else (None, None)
        if slow[0] is not None and slow[1] is not None:
            out.append(PairOutcome(a, b, kept_speed_from_slowdown(max(slow[0], 0.0)),
                                   kept_speed_from_slowdown(max(slow[1], 0.0))))  # fmt: skip
    return out


class NightPlanOperator(BaseOperator):
    """Plan the night's batch jointly (power limit, containers, start, co-location); XCom: every job's plan.

    :param jobs: job name → JobSpec (templated); a job without ``finish_by`` must finish by the next
        ``deadline_time_utc``.
    :param profile_task_ids: job name → its EnergyProfileOperator task, or one mapped profile task's id.
    :param pair_profile_task_id: the PairProfileOperator task (None: no co-location).
    :param replay: / ``replay_start`` / ``conn_ids``: as for CarbonAwareTrainingOperator.
    :param gpus: the GPUs the night's batch shares (e.g. the ``carbonflow_gpu`` pool's slots). The plans are
        fitted onto them (:func:`carbonflow.planning.night_gpus.fit_plans_to_gpus`): starts that would find
        every GPU busy move to the next lowest-carbon start that fits before finish-by. None: one per job.
    """

    template_fields: Sequence[str] = ("jobs", "replay_start")
    ui_color = "#b3d9ff"

    def __init__(
        self,
        *,
        jobs: Mapping[str, Any],
        profile_task_ids: Mapping[str, str] | str,
        pair_profile_task_id: str | None = None,
        deadline_time_utc: str = DEFAULT_DEADLINE_TIME_UTC,
        replay: bool | None = None,
        replay_start: str | None = None,
        tracking_uri: str | None = None,
        conn_ids: dict[str, str] | None = None,
        gpus: int | None = None,
        **kwargs: Any,
    ) -> None:
        from carbonflow.session.clock import next_deadline

        super().__init__(**kwargs)
        if gpus is not None and gpus < 1:
            raise ValueError(f"gpus={gpus} is not allowed; give the number of GPUs the night may use (>= 1)")
        self.gpus = gpus
        self.jobs = dict(jobs)
        self.profile_task_ids = profile_task_ids if isinstance(profile_task_ids, str) else dict(profile_task_ids)
        self.pair_profile_task_id = pair_profile_task_id
        self.deadline_time_utc = deadline_time_utc
        self.replay = replay
        self.replay_start = replay_start
        self.tracking_uri = tracking_uri
        self.conn_ids = conn_ids
        next_deadline(datetime.now().astimezone(), deadline_time_utc)  # validate at DAG parse time

    def execute(self, context: Any) -> dict[str, Any]:
        from carbonflow.planning.colocation import PairProfile, plan_night
        from carbonflow.planning.guard import min_kept_speeds
        from carbonflow.planning.optimizer import predict_candidates
        from carbonflow.session.clock import next_deadline

        specs = _jobs(self.jobs)
        profiles = _profiles(context, self.profile_task_ids, specs)
        source = carbon_source(self.replay, self.conn_ids)
        now = session_clock(source, specs[0].region, self.replay_start).now()
        deadline = next_deadline(now, self.deadline_time_utc)
        specs = [s if s.finish_by is not None else s.model_copy(update={"finish_by": deadline}) for s in specs]
        late = [s for s in specs if s.finish_by is not None and s.finish_by <= now]
        if late:
            raise ValueError(f"finish_by={late[0].finish_by.isoformat()} of job {late[0].name} is in the past")  # type: ignore[union-attr]
        forecasts = {}
        for region in sorted({s.region for s in specs}):
            until = max(s.finish_by for s in specs if s.region == region)  # type: ignore[type-var]
            forecasts[region] = source.forecast(region, now, until)  # type: ignore[arg-type]
        raw_pairs = context["ti"].xcom_pull(task_ids=self.pair_profile_task_id) if self.pair_profile_task_id else None
        pair_profiles = [PairProfile(**p) for p in raw_pairs or []]
        history = planning_history([s.name for s in specs], self.tracking_uri, self.log)
        recent = {region: source.recent_actuals(region, now) for region in forecasts}
        plans = plan_night(
            specs, profiles, forecasts, now, pair_profiles=pair_profiles, history=history, intensity_history=recent
        )
        if self.gpus is not None:
            plans = _fit_to_gpus(plans, self.gpus, now, forecasts, {s.name: s for s in specs}, profiles, history)
        by_name = {s.name: s for s in specs}
        guards: dict[str, float] = {}
        notes: dict[str, str] = {}
        for plan in plans:
            plan.replay = forecasts[plan.region].replay
            if not plan.colocated_with:
                notes[plan.job] = _why_alone(plan.job, by_name, profiles, pair_profiles, history)
                plan.reason += notes[plan.job]
            self.log.info("%s: %s", plan.job, plan.reason)
            partner = plan.colocated_with[0] if plan.colocated_with else None
            if partner is None or plan.job > partner:
                continue
            pair = next((p for p in pair_profiles if p.speeds(plan.job, partner) is not None), None)
            if pair is None:  # predicted from history alone: no speeds to guard against
                continue
            me, other = by_name[plan.job], by_name[partner]
            solo_me = predict_candidates(me, profiles[me.name], history)[1].duration_s
            solo_other = predict_candidates(other, profiles[other.name], history)[1].duration_s
            speeds = pair.speeds(me.name, other.name)
            assert speeds is not None
            guard = min_kept_speeds(solo_me, solo_other, min(speeds[0], 1.0), min(speeds[1], 1.0),
                                    me.max_slowdown, other.max_slowdown)  # fmt: skip
            guards[me.name], guards[other.name] = guard
        groups = gpu_groups(plans)
        return {
            "now": now.isoformat(),
            "groups": groups,
            "jobs": {s.name: s.model_dump(mode="json") for s in specs},
            "plans": {p.job: p.model_dump(mode="json") for p in plans},
            "profiles": {name: p.model_dump(mode="json") for name, p in profiles.items()},
            "forecasts": {region: f.model_dump(mode="json") for region, f in forecasts.items()},
            "min_kept_speed": guards,
            "notes": notes,
            "pairs": [dataclasses.asdict(p) for p in pair_profiles],
        }


@task(task_id="gpu_groups")
def night_gpu_groups(night: dict[str, Any]) -> list[list[str]]:
    """The night plan's GPU groups, for the training tasks to map over (one task per group)::

    train = CarbonAwareTrainingOperator.partial(task_id="train", night_plan_task_id="plan_night",
                                                ).expand(gpu_group=night_gpu_groups(plan_night.output))
    """
    return night["groups"]


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
    from carbonflow.planning.colocation import predict_pair_slowdown
    from carbonflow.planning.optimizer import predict_candidates

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
