"""The night's batch: pair profiles for co-location across recurring jobs, then one joint plan.

``PairProfileOperator`` runs each pair of the night's jobs that could share a GPU together briefly
(same region, one-container reference configuration, a GPU both can share) and records the speed
each keeps and the GPU's power. Pairs that already ran together on earlier nights are predicted from
that history instead. ``NightPlanOperator`` plans the whole batch with
:func:`carbonflow.planning.night.plan_night` (power limit, containers, start and guarded
co-location, jointly) and hands each job's plan to its :class:`CarbonAwareTrainingOperator`.

The work is the session's (:mod:`carbonflow.session.night`: which pairs to profile, the joint plan as a
typed :class:`~carbonflow.session.state.NightPlan`); these operators only pull profiles from XCom and
push the answer back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import BaseOperator, task

from carbonflow.domain import JobSpec, Profile, parse_job, utcnow
from carbonflow.energy.lease import safe_name
from carbonflow.execution.backend import backend_class
from carbonflow.operators.common import carbon_source, home, with_connection_env
from carbonflow.operators.kubernetes import operator_backend
from carbonflow.session.clock import DEFAULT_DEADLINE_TIME_UTC
from carbonflow.session.night import can_share, gpu_groups, pairs_to_profile, plan_night_batch, sharing_words
from carbonflow.session.run import planning_history
from carbonflow.session.source import session_clock
from carbonflow.session.state import NightPlan

__all__ = [  # can_share, gpu_groups and sharing_words live in carbonflow.session.night; kept importable here
    "NightPlanOperator",
    "PairProfileOperator",
    "can_share",
    "gpu_groups",
    "night_gpu_groups",
    "sharing_words",
]


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


class PairProfileOperator(BaseOperator):
    """Run each pair of recurring jobs that could share a GPU together briefly; XCom: the pair profiles.

    :param jobs: job name → JobSpec (model, dict or JSON; templated, e.g. pulled from the validate task).
    :param profile_task_ids: job name → its EnergyProfileOperator task (solo speeds to compare with), or the
        task id of one EnergyProfileOperator mapped over the jobs.
    :param max_pairs: / ``max_pair_gpu_s``: the night's pair-profiling budget (pair count, GPU-seconds at
        ``pair_profile_gpu_s`` each). Within it the most promising unknown pairs are profiled, ranked by the pair
        predictor (:mod:`carbonflow.planning.pairs`); the early-observation guard settles the rest.
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
            if not backend_class(self.backend).supports_shared:  # asked of the class: no client made for nothing
                self.log.warning("backend %r cannot run pair profiles; no co-location tonight", self.backend)
                return []
            if self._backend is None:
                self._backend = operator_backend(self.backend, home() / "runs" / safe_name(run_id) / "pairs")
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
        """The pairs to profile tonight (:func:`carbonflow.session.night.pairs_to_profile`, within the budget)."""
        return pairs_to_profile(specs, profiles, history, max_pairs=self.max_pairs, max_pair_gpu_s=self.max_pair_gpu_s,
                                pair_profile_gpu_s=self.pair_profile_gpu_s, log=self.log)  # fmt: skip

    def on_kill(self) -> None:
        if self._backend is not None:
            self._backend.kill()


class NightPlanOperator(BaseOperator):
    """Plan the night's batch jointly (power limit, containers, start, co-location); XCom: the NightPlan.

    The planning is :func:`carbonflow.session.night.plan_night_batch`'s; XCom holds its
    :class:`~carbonflow.session.state.NightPlan` as JSON (every job's spec, plan and profile, the GPU groups).

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
        """Pull the profiles and pair profiles, plan the night in the session; XCom: the NightPlan as JSON."""
        from carbonflow.planning.pairs import PairProfile

        specs = _jobs(self.jobs)
        profiles = _profiles(context, self.profile_task_ids, specs)
        source = carbon_source(self.replay, self.conn_ids)
        now = session_clock(source, specs[0].region, self.replay_start).now()
        raw_pairs = context["ti"].xcom_pull(task_ids=self.pair_profile_task_id) if self.pair_profile_task_id else None
        night = plan_night_batch(
            specs, profiles, source, now, deadline_time_utc=self.deadline_time_utc,
            pair_profiles=[PairProfile(**p) for p in raw_pairs or []],
            history=planning_history([s.name for s in specs], self.tracking_uri, self.log),
            gpus=self.gpus, log=self.log,
        )  # fmt: skip
        return night.to_xcom()


@task(task_id="gpu_groups")
def night_gpu_groups(night: dict[str, Any]) -> list[list[str]]:
    """The night plan's GPU groups, for the training tasks to map over (one task per group)::

    train = CarbonAwareTrainingOperator.partial(task_id="train", night_plan_task_id="plan_night",
                                                ).expand(gpu_group=night_gpu_groups(plan_night.output))
    """
    return NightPlan.from_xcom(night).groups
