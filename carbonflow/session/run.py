"""One GPU group's training: plan it, say when to wake, re-plan on waking, launch, account, log.

:class:`RunSession` knows nothing of Airflow: the operator hands it a carbon source, a clock, the run
identity of each job (idempotency key and provenance tags) and a logger, and turns its answers into
deferrals and XCom. A group is one job alone or a pair the night plan put on one GPU; the pair is
launched once, by the one task that holds the group, so nothing needs coordinating between tasks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from carbonflow import settings
from carbonflow.domain import Config, Forecast, JobSpec, Plan, Profile, RunResult
from carbonflow.energy.lease import safe_name
from carbonflow.session.clock import SessionClock
from carbonflow.session.source import CarbonSource
from carbonflow.session.state import GroupMember, NightPlan, WaitState
from carbonflow.units import format_emissions_g, format_energy_j

LAUNCH_TOLERANCE_S = 60.0
"""A start this close (clock seconds) counts as now."""

RunIdentity = Callable[[str], dict[str, Any]]
"""Job name → ``{"idempotency_key": …, "provenance": {…}}`` (``{}`` outside Airflow: a fresh key per run)."""
BackendFactory = Callable[[str, Path, "dict[str, Any] | None"], Any]
"""Makes the backend by name, workdir and options (default :func:`carbonflow.execution.backend.make_backend`; an
operator gives its own, whose Kubernetes client comes from an Airflow connection)."""


@dataclass
class JobOutcome:
    """What one job's training came to: the plan it ran, what it measured, where it was logged."""

    plan: Plan
    tracking: dict[str, Any]
    result: RunResult | None = None
    reused: bool = field(default=False, metadata={"doc": "an earlier try of this task had trained and logged it"})
    profile: Profile | None = field(
        default=None,
        metadata={"doc": "what the training measured of its power limits inside itself (in-run profiling)"},
    )
    stopped: JobOutcome | None = field(
        default=None,
        metadata={"doc": "the attempt stopped at its energy budget that this rerun follows (its own MLflow run)"},
    )
    stopped_at_energy_budget_j: float | None = field(
        default=None, metadata={"doc": "this run was stopped at this energy budget (J) short of its target"}
    )

    @property
    def attempts(self) -> list[JobOutcome]:
        """Every run of the job tonight, in order: the stopped attempt (if any), then this one."""
        return [*(self.stopped.attempts if self.stopped is not None else []), self]

    @property
    def failure(self) -> str | None:
        """Why the task must fail: a training failed, or a GPU's power limit could not be put back (either run)."""
        reasons = [f for f in (a._own_failure() for a in self.attempts) if f]
        return "\n".join(reasons) or None

    @property
    def night_energy_total_j(self) -> float | None:
        """The job's energy tonight, every attempt's (None: an earlier try's attempt is known only to MLflow)."""
        results = [a.result for a in self.attempts]
        return None if any(r is None for r in results) else sum(r.energy_total_j for r in results)  # type: ignore[union-attr]

    @property
    def night_emissions_g(self) -> float | None:
        """The job's emissions tonight, every attempt's (None as for :attr:`night_energy_total_j`)."""
        results = [a.result for a in self.attempts]
        return None if any(r is None for r in results) else sum(r.emissions_g for r in results)  # type: ignore[union-attr]

    def _own_failure(self) -> str | None:
        if self.result is None:
            return None
        reasons = []
        if self.result.power_limits_not_restored:
            reasons.append(f"{self.plan.job}: power limit not restored on "
                           + "; ".join(self.result.power_limits_not_restored))  # fmt: skip
        if not self.result.succeeded:
            from carbonflow.session.crash import crash_report

            reasons.append(f"{crash_report(self.plan.job, self.result)}\n{_where_logged(self.tracking)}")
        return "\n".join(reasons) or None

    def warnings(self, finish_by: Any) -> list[str]:
        """What an operator should hear about although the task succeeds: a missed finish-by, a held record."""
        out = []
        if self.result is not None and finish_by is not None:
            ended = self.result.ended_at  # on the session's clock, as finish-by is
            if ended > finish_by:
                late_min = (ended - finish_by).total_seconds() / 60
                out.append(f"{self.plan.job} finished {late_min:.0f} min after its finish-by {finish_by.isoformat()}")
        if self.result is not None:
            out += [f"{self.plan.job}: {n}" for n in self.result.notes if n.startswith(MORE_WORK)]
        if self.tracking.get("spooled"):
            out.append(f"{self.plan.job}: MLflow was unreachable; its run is held and will be logged late "
                       f"({self.tracking.get('reason')})")  # fmt: skip
        return [*(self.stopped.warnings(finish_by) if self.stopped is not None else []), *out]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plan": self.plan.model_dump(mode="json"),
            "result": self.result.model_dump(mode="json") if self.result else None,
            "tracking": self.tracking,
            "reused": self.reused,
        }
        if self.profile is not None:
            out["profile"] = self.profile.model_dump(mode="json")
        if self.stopped is not None:
            out["stopped_attempt"] = self.stopped.to_json()
            out["night_energy_total_j"] = self.night_energy_total_j
            out["night_emissions_g"] = self.night_emissions_g
        return out


@dataclass
class GroupOutcome:
    """The outcome of every job of a group, in the group's order."""

    label: str
    jobs: list[JobOutcome]

    @property
    def failures(self) -> list[str]:
        return [f for f in (j.failure for j in self.jobs) if f]

    def raise_if_power_limits_not_restored(self) -> None:
        """Raise :class:`~carbonflow.execution.errors.PowerLimitNotRestored` when a GPU's limit could not be put
        back after a job (read from ``RunResult.power_limits_not_restored``): its message names each GPU with the
        wanted and the actual limit, and any other failure of the group. The task fails with it."""
        attempts = [a for j in self.jobs for a in j.attempts]
        if not any(a.result is not None and a.result.power_limits_not_restored for a in attempts):
            return
        from carbonflow.execution.errors import PowerLimitNotRestored

        raise PowerLimitNotRestored(
            "; ".join(self.failures) + ". Its journal is kept: on that node run `python -m "
            "carbonflow.energy.power_limit restore` (or the next run on that GPU restores it)"
        )

    finish_by: dict[str, Any] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        return [w for j in self.jobs for w in j.warnings(self.finish_by.get(j.plan.job))]

    @property
    def held(self) -> list[dict[str, Any]]:
        """Tracking outcomes of runs that wait for MLflow (spooled), with their spool entry."""
        return [a.tracking for j in self.jobs for a in j.attempts if a.tracking.get("spooled")]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.label, "runs": {j.plan.job: j.to_json() for j in self.jobs}}


class RunSession:
    """Plan, wait for, launch, account and log one GPU group (see the module docstring)."""

    def __init__(
        self,
        *,
        source: CarbonSource,
        workdir: Path,
        backend: str = "local",
        kubernetes: dict[str, Any] | None = None,
        tracking_uri: str | None = None,
        identity: RunIdentity | None = None,
        log: logging.Logger | None = None,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.source = source
        self.backend_factory = backend_factory
        self.workdir = workdir
        self.backend_name = backend
        self.kubernetes = kubernetes
        self.tracking_uri = tracking_uri
        self.identity: RunIdentity = identity or (lambda job: {})
        self.log = log or logging.getLogger(__name__)
        self._backend: Any = None

    # ---- planning -------------------------------------------------------------------------
    def history(self, jobs: list[str]) -> Any:
        """The planner's history of ``jobs`` from MLflow, or None (with a warning) when tracking is down."""
        return planning_history(jobs, self.tracking_uri, self.log)

    def plan(self, spec: JobSpec, profile: Profile, forecast: Forecast | None, now: datetime) -> Plan:
        """The job's plan alone on its GPU(s), from its profile, the forecast and its history."""
        from carbonflow.planning.optimizer import plan_job

        recent = self.source.recent_actuals(spec.region, now)  # the planner's check on the forecast
        plan = plan_job(spec, profile, forecast, now, self.history([spec.name]), on_infeasible="fastest",
                        intensity_history=recent, early_stop=self.stops_early(spec))  # fmt: skip
        if forecast is not None:
            plan.replay = forecast.replay
        return plan

    def stops_early(self, spec: JobSpec) -> bool:
        """Whether a solo run of ``spec`` is stopped at the batch-size explorer's threshold and rerun at the best
        known batch size (a job trained to a target that explores batch sizes, on a backend that honours an energy
        budget: the local one); its plan then reserves the rerun (``plan_job(..., early_stop=True)``)."""
        from carbonflow.execution.backend import backend_class
        from carbonflow.session.early_stop import stops_early

        return stops_early(spec) and getattr(backend_class(self.backend_name), "supports_energy_budget", False)

    def plan_alone(self, spec: JobSpec, profile: Profile, now: datetime) -> WaitState:
        """A job planned on its own (no night plan): its configuration and start before finish-by."""
        if spec.finish_by is None or spec.finish_by <= now:
            raise ValueError(f"finish_by={spec.finish_by} of job {spec.name} is not after now ({now.isoformat()})")
        forecast = self.source.forecast(spec.region, now, spec.finish_by)
        plan = self.plan(spec, profile, forecast, now)
        self.log.info("plan: %s", plan.reason)
        member = observed(GroupMember(job=spec, plan=plan, profile=profile), now)
        return WaitState(members=[member], first_now=now, forecast=forecast)

    def from_night_plan(self, night: NightPlan | Mapping[str, Any], group: Sequence[str]) -> WaitState:
        """The wait state of one GPU group of a night plan (the plan's ``groups`` name them).

        ``night``: a :class:`NightPlan`, or its XCom JSON (this version's or carbonflow 0.1.0's dict).
        """
        night = NightPlan.from_xcom(night)
        missing = [name for name in group if name not in night.plans]
        if missing or not 1 <= len(group) <= 2:
            known = ", ".join(sorted(night.plans))
            raise ValueError(f"group={list(group)!r} is not a GPU group of the night plan (its jobs: {known})")
        plans = [night.plans[name].model_copy(deep=True) for name in group]
        if len(plans) == 2 and plans[0].colocated_with != [plans[1].job]:
            raise ValueError(f"group={list(group)!r}: the night plan does not put these jobs on one GPU")
        guards = night.min_kept_speed if len(plans) == 2 else {}
        members = [
            GroupMember(
                job=night.jobs[p.job].model_copy(deep=True),
                plan=p,
                profile=night.profiles[p.job].model_copy(deep=True),
                min_kept_speed=guards.get(p.job),
                note=night.notes.get(p.job, ""),
            )
            for p in plans
        ]
        forecast = night.forecasts.get(plans[0].region)
        members = [observed(m, night.now) for m in members]
        for member in members:
            self.log.info("night plan of %s: %s", member.job.name, member.plan.reason)
        return WaitState(members=members, first_now=night.now, forecast=forecast)

    # ---- waiting --------------------------------------------------------------------------
    def next_wake(self, state: WaitState, now: datetime, replan_interval_s: float) -> datetime | None:
        """When to wake next (the start, or earlier to re-check the forecast); None: launch now."""
        if (state.start - now).total_seconds() <= LAUNCH_TOLERANCE_S:
            return None
        return min(state.start, now + timedelta(seconds=replan_interval_s))

    def replan(self, state: WaitState, now: datetime, max_replans: int) -> WaitState:
        """On waking: fetch the forecast again and move a job's start if the new plan still meets finish-by.

        A pair keeps the night plan's start (moving one member alone would split it); at most
        ``max_replans`` moves; a fallback forecast (static, climatology) never moves a start.
        """
        if state.shared or state.replans >= max_replans or state.members[0].would_have is not None:
            return state
        member = state.members[0]
        spec = member.job
        try:
            forecast = self.source.forecast(spec.region, now, spec.finish_by)  # type: ignore[arg-type]
        except Exception as err:  # the chain never should, but the run must not fail on it
            self.log.warning("forecast unreachable on waking (%s); keeping the plan", err)
            return state
        if not forecast.points or _is_fallback(forecast):
            self.log.warning("on waking only a fallback forecast (%s) was available; keeping the planned start",
                             forecast.provider)  # fmt: skip
            return state
        if member.profile is None:
            raise ValueError(f"the wait state of {spec.name} has no profile to re-plan from")
        new_plan = self.plan(spec, member.profile, forecast, now)
        new_plan.reason += member.note
        end = new_plan.start + timedelta(seconds=new_plan.predicted_duration_s)
        moved = abs((new_plan.start - member.plan.start).total_seconds()) >= LAUNCH_TOLERANCE_S
        changed = moved or new_plan.config != member.plan.config
        if not changed or (spec.finish_by is not None and end > spec.finish_by):
            return state
        new_plan.replans = member.plan.replans + 1
        self.log.info("re-planned: %s", new_plan.reason)
        return state.with_plan(new_plan, forecast)

    # ---- running --------------------------------------------------------------------------
    def already_logged(self, state: WaitState) -> GroupOutcome | None:
        """The group's outcome if an earlier try of this task trained and logged every job (a retry)."""
        from carbonflow.tracking.store import completed_run

        found: list[JobOutcome] = []
        for member in state.members:
            key = self.identity(member.job.name).get("idempotency_key")
            run = completed_run(member.job.name, key, self.tracking_uri) if key else None
            if run is None:
                return None
            found.append(JobOutcome(plan=member.plan, tracking=run, reused=True))
        self.log.info("%s was trained and logged by an earlier try of this task; not training it again", state.label)
        return _outcome(state, found)

    def launch(self, state: WaitState, clock: SessionClock) -> GroupOutcome:
        """Train the group now (once, however it is retried: see :meth:`already_logged`), account and log.

        A job alone that explores batch sizes towards a target is stopped at the explorer's threshold and rerun at
        the best known batch size on a backend that honours an energy budget (:mod:`carbonflow.session.early_stop`);
        a pair, and pods on Kubernetes, run to their end."""
        earlier = self.already_logged(state)
        if earlier is not None:
            return earlier
        self._backend = self._make_backend(state.label)
        if state.shared and not self._backend.supports_shared:  # a cluster: two pods on one time-sliced GPU
            return self._launch_pods(state, clock)
        if state.shared:
            return self._launch_pair(state, clock)
        return _outcome(state, [self._launch_solo(state.members[0], state, clock)])

    def _launch_solo(self, member: GroupMember, state: WaitState, clock: SessionClock) -> JobOutcome:
        """One job alone. A run that explores batch sizes towards a target has an energy budget (the explorer's
        threshold); stopped there short of its target, it is logged as not reached and the job reruns at once at
        the best known batch size (:mod:`carbonflow.session.early_stop`). A retried task whose earlier try logged
        the stopped attempt goes on with the rerun."""
        from carbonflow.session.early_stop import stops_early

        budgeted = (
            stops_early(member.job)
            and member.would_have is None
            and getattr(self._backend, "supports_energy_budget", False)
        )
        stopped = self._stopped_by_earlier_try(member) if budgeted else None
        if stopped is None:
            budget_j = self._energy_budget_j(member) if budgeted else None
            first = self._train_solo(member, member.plan, state, clock, budget_j=budget_j)
            if first.stopped_at_energy_budget_j is None:
                return first
            stopped = first
        return self._rerun_at_best(member, stopped, state, clock)

    def _energy_budget_j(self, member: GroupMember) -> float | None:
        """The energy the member's run may spend before it is stopped (None: it runs to its end)."""
        from carbonflow.session.early_stop import energy_budget_j

        budget_j = energy_budget_j(member.job, member.profile, member.plan, self.history([member.job.name]))
        if budget_j is not None:
            self.log.info("%s: this run may spend %s (the batch-size explorer's threshold); past it the training is "
                          "stopped and the job reruns at the best known batch size", member.job.name,
                          format_energy_j(budget_j))  # fmt: skip
        return budget_j

    def _stopped_by_earlier_try(self, member: GroupMember) -> JobOutcome | None:
        """The attempt an earlier try of this task stopped at its energy budget and logged (None: none did)."""
        from carbonflow.session.early_stop import STOPPED_KEY_SUFFIX
        from carbonflow.tracking.store import completed_run

        key = self.identity(member.job.name).get("idempotency_key")
        run = completed_run(member.job.name, f"{key}{STOPPED_KEY_SUFFIX}", self.tracking_uri) if key else None
        if run is None:
            return None
        self.log.info("%s: an earlier try of this task stopped its run at the energy budget and logged it; not "
                      "training it again, rerunning at the best known batch size", member.job.name)  # fmt: skip
        return JobOutcome(plan=member.plan, tracking=run, reused=True)

    def _train_solo(
        self,
        member: GroupMember,
        plan: Plan,
        state: WaitState,
        clock: SessionClock,
        *,
        budget_j: float | None = None,
        run_name: str = "train",
        follows: JobOutcome | None = None,
    ) -> JobOutcome:
        """Train ``plan`` alone (profiling its limits inside the run when its batch size has no profiled limits),
        stopped at ``budget_j`` when given; account and log it. ``follows``: the stopped attempt a rerun follows."""
        from carbonflow.profiling.profiler import IN_RUN_MIN_LIMITS
        from carbonflow.session.in_run import in_run_options_for, learn_profile, ran_as

        self.log.info("launching %s with %s", member.job.name, plan.config.key())
        in_run = in_run_options_for(member.job, member.profile, plan, self._backend,
                                    shadow=member.would_have is not None)  # fmt: skip
        if in_run is not None:
            self.log.info("%s: its batch size has fewer than %d profiled power limits (never profiled, or one "
                          "from a probe); the training sweeps them inside itself and keeps that work (in-run "
                          "profiling)", member.job.name, IN_RUN_MIN_LIMITS)  # fmt: skip
        try:
            if in_run is None and budget_j is None:
                wrapped = self._backend.execute(member.job, plan, run_name=run_name)
            else:
                wrapped = self._backend.execute(member.job, plan, _run_options(in_run, run_name, budget_j))
        finally:
            self._tell_training_log(run_name)
        learned = None
        if in_run is not None:
            learned = learn_profile(member.job, member.profile, plan, wrapped, self.tracking_uri, self.log)
            plan = ran_as(plan, wrapped, learned)
        outcome = self._account_and_log(member, plan, wrapped, state, clock, follows=follows)
        outcome.profile = learned
        return outcome

    def _rerun_at_best(
        self, member: GroupMember, stopped: JobOutcome, state: WaitState, clock: SessionClock
    ) -> JobOutcome:
        """Rerun the job now at the explorer's best known batch size, planned from its profile at that batch size;
        its MLflow run notes the stopped attempt it follows, and the outcome carries both."""
        from carbonflow.planning.optimizer import plan_job
        from carbonflow.session.early_stop import RERUN_RUN_NAME, best_known_batch_size, rerun_job

        profile = stopped.profile or _profile(member)
        history = self.history([member.job.name])
        best = best_known_batch_size(member.job, profile, history)
        if best is None:  # an earlier try's stopped attempt, and tonight's profile has no point at the best
            best = member.job.batch_size
            self.log.warning("%s: tonight's profile has no point at the best known batch size; rerunning at the "
                             "job's own batch size %d", member.job.name, best)  # fmt: skip
        now = clock.now()
        spec, at_best = rerun_job(member.job, profile, best, now)
        plan = plan_job(spec, at_best, None, now, history, on_infeasible="fastest", early_stop=True,
                        starts_now_because="a rerun starts at once, not at a cleaner hour")  # fmt: skip
        plan.replay = state.forecast.replay if state.forecast is not None else False
        plan.reason = (
            f"rerun at the best known batch size {best} after an attempt stopped at its energy budget; {plan.reason}"
        )
        self.log.warning("%s: the run was stopped at its energy budget short of its target; rerunning now at batch "
                         "size %d", member.job.name, best)  # fmt: skip
        rerun = member.model_copy(update={"profile": profile})
        outcome = self._train_solo(rerun, plan, state, clock, run_name=RERUN_RUN_NAME, follows=stopped)
        outcome.stopped = stopped
        return outcome

    def _tell_training_log(self, run_name: str) -> None:
        """Repeat the wrapper's first line (the command, its directory and interpreter) in the task log and say
        where the training's own log is: the training's output goes there, not to the task log. Only for a
        backend whose runs keep their log here (the local one); a pod's log is the pod's."""
        workdir = getattr(self._backend, "workdir", None)
        path = Path(workdir) / run_name / "training.log" if workdir is not None else None
        if path is None or not path.is_file():
            return
        with path.open(encoding="utf-8", errors="replace") as handle:
            for _, line in zip(range(50), handle, strict=False):
                if line.startswith("carbonflow run: "):
                    self.log.info("%s", line.rstrip())
                    break
        self.log.info("training log: %s", path)

    def start_deferred(self, state: WaitState) -> list[Any] | None:
        """Start runs that survive this process (Kubernetes pods) and return their handles: one per job, a pair
        as two pods on one time-sliced GPU. None when the backend cannot (then :meth:`launch` runs the group
        here), or when an earlier try already trained the group."""
        self._backend = self._make_backend(state.label)
        if not self._backend.supports_deferral or self.already_logged(state) is not None:
            return None  # launch() asks MLflow once, not twice, on a backend that cannot defer
        from carbonflow.execution.backend import RunOptions

        handles = []
        for member, plan in zip(state.members, _pod_plans(state), strict=True):
            self.log.info("starting %s with %s; waiting for it without holding a worker", member.job.name,
                          plan.config.key())  # fmt: skip
            handles.append(self._backend.start(member.job, plan, RunOptions()))
        return handles

    def backend_options(self) -> dict[str, Any]:
        """How another process rebuilds the started runs' backend (to cancel them when the task is killed)."""
        return self._backend.rebuild_options()

    def finish(self, state: WaitState, handles: list[Any], clock: SessionClock) -> GroupOutcome:
        """Collect runs started by :meth:`start_deferred` (on any worker), account and log each."""
        from carbonflow.execution.backend import RunHandle

        if self._backend is None:  # resumed on another worker; _launch_pods has one already
            self._backend = self._make_backend(state.label)
        outcomes, failure = [], None
        for member, plan, handle in zip(state.members, _pod_plans(state), handles, strict=True):
            try:
                wrapped = self._backend.collect(RunHandle.model_validate(handle))
            except Exception as err:  # collect every pod (each is deleted) before failing
                failure = failure or err
                continue
            note = f"co-located with {state.label} on one time-sliced GPU (own pod)" if state.shared else ""
            outcomes.append(self._account_and_log(member, plan, wrapped, state, clock, note=note))
        if failure is not None:
            raise failure
        return _outcome(state, outcomes)

    def cancel(self) -> None:
        """Stop a running launch; the wrapper restores the power limits on the way out."""
        if self._backend is not None:
            self._backend.kill()

    def _make_backend(self, label: str) -> Any:
        from carbonflow.execution.backend import make_backend

        factory = self.backend_factory or make_backend
        return factory(self.backend_name, self.workdir / safe_name(label), self.kubernetes)

    def _launch_pods(self, state: WaitState, clock: SessionClock) -> GroupOutcome:
        """A pair on a cluster, waited for here (the task may block): both pods started, awaited, collected."""
        from carbonflow.execution.backend import RunOptions, wait

        handles = [self._backend.start(m.job, plan, RunOptions()) for m, plan in zip(state.members, _pod_plans(state),
                                                                                      strict=True)]  # fmt: skip
        for handle in handles:
            wait(self._backend, handle)
        return self.finish(state, handles, clock)

    def _launch_pair(self, state: WaitState, clock: SessionClock) -> GroupOutcome:
        """Both jobs on one GPU under one lease; a job the early observation separates then runs alone."""
        from carbonflow.execution.pair_wrapper import SEPARATED_EXIT_CODE, SharedRequest
        from carbonflow.profiling.profiler import pair_member

        members = [pair_member(m.job, m.plan, _profile(m), m.min_kept_speed) for m in state.members]
        limits = [m.plan.config.power_limit_w for m in state.members if m.plan.config.power_limit_w is not None]
        self.log.info("launching %s on one GPU", state.label)
        shared = self._backend.execute_shared(
            SharedRequest(members=members, power_limit_w=min(limits) if limits else None), run_name="train"
        )
        outcomes = []
        for i, (member, wrapped) in enumerate(zip(state.members, shared.members, strict=True)):
            if wrapped.exit_code == SEPARATED_EXIT_CODE:
                outcomes.append(self._run_separated(member, wrapped, state, clock))
                continue
            other = state.members[1 - i].job.name
            note = (f"co-located with {other} on one GPU: kept {_fmt(shared.kept_speeds[i])} of its solo speed; "
                    f"charged {shared.shares[i]:.2f} of the GPU's energy while both worked")  # fmt: skip
            outcomes.append(self._account_and_log(member, member.plan, wrapped, state, clock, note=note))
        return _outcome(state, outcomes)

    def _run_separated(self, member: GroupMember, attempt: Any, state: WaitState, clock: SessionClock) -> JobOutcome:
        """The early observation separated this job from its pair: run it alone now, charging the attempt too."""
        plan = member.plan
        solo = plan.model_copy(update={
            "config": plan.config.model_copy(update={"colocation_group": None}), "colocated_with": [],
            "reason": f"separated from its pair after early observation, run alone (was: {plan.reason})",
        })  # fmt: skip
        self.log.warning("%s: %s", member.job.name, "; ".join(n for n in attempt.notes if "separated" in n))
        first, _ = self._account(member.job, plan, attempt, state, clock)
        wrapped = self._backend.execute(member.job, solo, run_name=f"train-{member.job.name}-alone")
        result, points = self._account(member.job, solo, wrapped, state, clock)
        for name in ("energy_gpu_j", "energy_cpu_j", "energy_total_j", "emissions_g"):
            setattr(result, name, getattr(result, name) + getattr(first, name))
        result.power_limits_not_restored = [*first.power_limits_not_restored, *result.power_limits_not_restored]
        cost = f"{format_energy_j(first.energy_total_j)}, {format_emissions_g(first.emissions_g)} CO2e"
        result.notes.append(f"includes the co-located attempt it was separated from: {cost}")
        return JobOutcome(plan=solo, result=result, tracking=self._log_run(member, solo, result, state, points))

    def _account_and_log(
        self,
        member: GroupMember,
        plan: Plan,
        wrapped: Any,
        state: WaitState,
        clock: SessionClock,
        note: str = "",
        follows: JobOutcome | None = None,
    ) -> JobOutcome:
        from carbonflow.session.early_stop import stopped_short

        result, points = self._account(member.job, plan, wrapped, state, clock)
        if note:
            result.notes.append(note)
        more_work = more_work_than_asked(member.job, plan, wrapped.samples, wrapped.steps)
        if more_work:
            self.log.warning("%s: %s", member.job.name, more_work)
            result.notes.append(more_work)
        _count_epochs(member.job, result)
        if stopped_short(member.job, wrapped):
            budget_j = wrapped.stopped_at_energy_budget_j
            tracking = self._log_stopped(member, plan, result, state, points, budget_j)
            return JobOutcome(plan=plan, result=result, tracking=tracking, stopped_at_energy_budget_j=budget_j)
        log_as = _following(member.job, follows, result) if follows is not None else {}
        tracking = self._log_run(member, plan, result, state, points, **log_as)
        return JobOutcome(plan=plan, result=result, tracking=tracking)

    def _log_stopped(
        self, member: GroupMember, plan: Plan, result: RunResult, state: WaitState, points: list, budget_j: float
    ) -> dict:
        """Log a run stopped at its energy budget short of its target as its own MLflow run: not reached, the epochs
        it ran, its energy; under the task's key with a suffix, so that a retried task does not train it again."""
        from carbonflow.session.early_stop import STOPPED_KEY_SUFFIX, stopped_note
        from carbonflow.tracking import schema

        result.notes.append(stopped_note(member.job, plan, budget_j))
        # it did not do the job's work: no saving against the same work at the default (a user trial saw a stopped
        # attempt credited 38 % saved); its energy is in the night's, beside the rerun's
        result.emissions_run_now_default_g = result.saving_g = result.saving_fraction = None
        result.notes.append("no saving figure: the attempt was stopped short of its target")
        self.log.warning("%s: %s", member.job.name, result.notes[-2])
        identity = dict(self.identity(member.job.name))
        if identity.get("idempotency_key"):
            identity["idempotency_key"] = f"{identity['idempotency_key']}{STOPPED_KEY_SUFFIX}"
        return self._log_run(member, plan, result, state, points, identity=identity, reached_target=False,
                             extra_tags={schema.T_STOPPED_AT_ENERGY_J: f"{budget_j:.6g}"}, model=False)  # fmt: skip

    def _account(
        self, spec: JobSpec, plan: Plan, wrapped: Any, state: WaitState, clock: SessionClock
    ) -> tuple[RunResult, list]:
        """Energy over time → emissions with the real intensity, and the predicted run-now-at-default counterfactual."""
        from carbonflow.accounting.run import to_run_result

        started, ended = clock.to_clock(wrapped.started_at), clock.to_clock(wrapped.ended_at)
        points, intensity_source = self.source.intensity_for_accounting(spec.region, started, ended, state.forecast)
        self.log.info("accounting emissions of %s with %s", spec.name, intensity_source)
        ratio, baseline_intensity = None, None
        if plan.baseline is not None:
            ratio = plan.baseline.predicted_energy_j / max(plan.predicted_energy_j, 1e-9)
            baseline_intensity = self._run_now_intensity(spec, plan, wrapped.duration_s, state)
        result = to_run_result(wrapped, plan, points, time_shift_s=clock.offset_s, baseline_energy_ratio=ratio,
                               baseline_intensity_gco2_per_kwh=baseline_intensity)  # fmt: skip
        result.notes.append(f"emissions accounted with {intensity_source}")
        return result, points

    def _run_now_intensity(self, spec: JobSpec, plan: Plan, duration_s: float, state: WaitState) -> float | None:
        """The mean intensity had the job started when it was first planned, at the default configuration."""
        from carbonflow.carbon.windows import mean_intensity_gco2_per_kwh

        assert plan.baseline is not None
        scale = plan.baseline.predicted_duration_s / max(plan.predicted_duration_s, 1e-9)
        end = state.first_now + timedelta(seconds=duration_s * scale)
        points, _ = self.source.intensity_for_accounting(spec.region, state.first_now, end, state.forecast)
        return mean_intensity_gco2_per_kwh(points, state.first_now, end) if points else None

    def _log_run(
        self,
        member: GroupMember,
        plan: Plan,
        result: RunResult,
        state: WaitState,
        points: list,
        *,
        identity: dict[str, Any] | None = None,
        model: bool = True,
        **fields: Any,
    ) -> dict:
        """Log one training run; ``identity`` (else the task's) its idempotency key and provenance, ``model``
        whether its saved model goes with it, ``fields`` further :func:`log_training_run` arguments."""
        from carbonflow.tracking.logger import log_training_run

        output_dir = result.artifacts.get("output_dir")
        model_path = Path(output_dir) / "model.pt" if output_dir and model else None
        trace = result.artifacts.get("power_trace_csv")
        outcome = log_training_run(
            member.job, plan, result, profile=member.profile, forecast=state.forecast, actual_points=points,
            power_trace_csv=Path(trace) if trace else None,
            model_path=model_path if model_path is not None and model_path.exists() else None,
            tracking_uri=self.tracking_uri, would_have=member.would_have, error=_crash(member.job.name, result),
            **(identity if identity is not None else self.identity(member.job.name)), **fields,
        )  # fmt: skip
        if outcome.spooled:
            self.log.warning("%s", outcome.message)
        else:
            self.log.info("MLflow run of %s: %s", member.job.name, outcome.run_id)
        return outcome.model_dump(mode="json")


def _run_options(in_run: Any, run_name: str, budget_j: float | None) -> Any:
    """The run's options: the in-run profile's (else the defaults), named ``run_name``, with the energy budget."""
    from carbonflow.execution.backend import RunOptions

    base = in_run.model_dump() if in_run is not None else {}
    return RunOptions.model_validate({**base, "run_name": run_name, "stop_above_energy_j": budget_j})


def _following(spec: JobSpec, stopped: JobOutcome, result: RunResult) -> dict[str, Any]:
    """How a rerun is logged: a note naming the stopped attempt and its cost, and a tag with its MLflow run."""
    from carbonflow.session.early_stop import follows_note
    from carbonflow.tracking import schema

    result.notes.append(follows_note(stopped, stopped.plan, spec))
    where = stopped.tracking.get("run_id") or stopped.tracking.get("idempotency_key") or "held"
    return {"extra_tags": {schema.T_FOLLOWS_STOPPED_RUN: str(where)}}


def _crash(job: str, result: RunResult) -> str | None:
    """A failed training's exit status and last output lines (the MLflow run's ``carbonflow.error``); None if it
    succeeded."""
    from carbonflow.session.crash import crash_report

    return None if result.succeeded else crash_report(job, result)


def _where_logged(tracking: dict[str, Any]) -> str:
    """Where a run's record went, in words (not the TrackingOutcome's fields)."""
    if tracking.get("spooled"):
        return f"its run is held for MLflow ({tracking.get('reason') or 'MLflow unreachable'})"
    run_id = tracking.get("run_id")
    return f"its MLflow run {run_id} has the tag carbonflow.error" if run_id else "its MLflow run was not logged"


OBSERVE_ONLY_ENV = settings.OBSERVE_ONLY_ENV


def observe_only(spec: JobSpec) -> bool:
    """The job runs in shadow: its own ``observe_only``, or ``$CARBONFLOW_OBSERVE_ONLY`` for the deployment."""
    return spec.observe_only or settings.observe_only_from_env()


def observed(member: GroupMember, now: datetime) -> GroupMember:
    """An observe-only member runs now, alone, at the GPU's current limit; its plan is kept as ``would_have``."""
    if not observe_only(member.job):
        return member
    plan = member.plan
    base = plan.baseline
    containers = base.config.containers if base is not None else plan.config.containers
    saving = (
        ""
        if base is None
        else (
            f": {format_emissions_g(plan.predicted_emissions_g)} CO2e predicted, against "
            f"{format_emissions_g(base.predicted_emissions_g)} for starting now at the default configuration"
        )
    )
    shadow = plan.model_copy(update={
        "config": Config(containers=containers, batch_size=plan.config.batch_size), "start": now,
        "colocated_with": [],
        "predicted_duration_s": base.predicted_duration_s if base else plan.predicted_duration_s,
        "predicted_energy_j": base.predicted_energy_j if base else plan.predicted_energy_j,
        "predicted_emissions_g": base.predicted_emissions_g if base else plan.predicted_emissions_g,
        "reason": f"observe-only: trained at once, alone, at the GPU's current limit; carbonflow would have run "
                  f"{plan.config.key()} from {plan.start:%Y-%m-%d %H:%M} UTC{saving} ({plan.reason})",
    })  # fmt: skip
    return member.model_copy(update={"plan": shadow, "would_have": plan, "min_kept_speed": None})


MORE_WORK_FACTOR = 1.3
"""A run that reports more than this × its job's work (epochs × samples per epoch) did work it was not given."""
MORE_WORK = "reported more samples than the job's work"


def more_work_than_asked(spec: JobSpec, plan: Plan, samples: int, steps: int = 0) -> str | None:
    """Why a run did clearly more than its job's work, ``epochs × samples_per_epoch`` (None: it did not, or the
    job gives its work in steps). Judged by the samples it reported and by its steps: ``steps × batch size ×
    containers`` samples went through the model whatever the script counted. With several containers the usual
    cause is ranks that each trained the whole data set (or counted samples × WORLD_SIZE twice); alone, a
    script that ignores its epochs."""
    from carbonflow.execution.commands import samples_per_epoch

    per_epoch = samples_per_epoch(spec) if spec.epochs else None
    if not per_epoch:
        return None
    asked = spec.epochs * per_epoch  # type: ignore[operator]
    containers, batch = plan.config.containers, plan.config.batch_size or spec.batch_size
    # Steps the asked work takes on one rank when the ranks share it (each rank's last batch may be partial).
    asked_steps = spec.epochs * math.ceil(math.ceil(per_epoch / containers) / batch)  # type: ignore[operator]
    if samples > MORE_WORK_FACTOR * asked:
        ratio, how = samples / asked, f"{samples} samples reported for {spec.epochs} epochs × {per_epoch} = {asked}"
    elif steps > MORE_WORK_FACTOR * asked_steps:
        ratio, how = (
            steps / asked_steps,
            (
                f"{steps} steps where {spec.epochs} epochs × {per_epoch} samples in "
                f"batches of {batch} on {containers} container(s) take {asked_steps}"
            ),
        )
    else:
        return None
    head = f"{MORE_WORK}: {how} ({ratio:.1f}×)"
    if containers > 1:
        return (f"{head} with {containers} containers: did each rank train the whole data set (shard it with a "
                "DistributedSampler), or count samples × WORLD_SIZE twice? The profile's speed and energy per "
                "sample are then wrong; see 'Several containers' in Bring your own job")  # fmt: skip
    return f"{head}: does the script read its epochs from {{epochs}} or $CARBONFLOW_EPOCHS?"


def _pod_plans(state: WaitState) -> list[Plan]:
    """Each member's plan as its own pod runs it: a pair's GPU limit is set once, by the first member's pod (two
    wrappers on one time-sliced GPU must not each set and restore it); the second runs at the GPU's limit."""
    plans = [m.plan for m in state.members]
    if not state.shared:
        return plans
    limits = [p.config.power_limit_w for p in plans if p.config.power_limit_w is not None]
    first = plans[0].model_copy(update={"config": plans[0].config.model_copy(
        update={"power_limit_w": min(limits) if limits else None})})  # fmt: skip
    second = plans[1].model_copy(update={"config": plans[1].config.model_copy(update={"power_limit_w": None})})
    return [first, second]


def _outcome(state: WaitState, jobs: list[JobOutcome]) -> GroupOutcome:
    return GroupOutcome(state.label, jobs, finish_by={m.job.name: m.job.finish_by for m in state.members})


def _count_epochs(spec: JobSpec, result: RunResult) -> None:
    """A run of a job trained to a target is logged with the epochs it ran (metric ``epochs``): its own last
    ``epochs`` report, else its samples over the job's samples per epoch. The next night's explorer reads them
    (without it, a run that reached its target early would count the job's whole epoch budget)."""
    from carbonflow.session.early_stop import epochs_run

    if spec.target_metric is None or "epochs" in result.metrics or result.samples <= 0:
        return
    epochs = epochs_run(spec, result.samples, result.metrics)
    if epochs is not None:
        result.metrics["epochs"] = epochs


def planning_history(jobs: list[str], tracking_uri: str | None, log: logging.Logger) -> Any:
    """The planner's history of ``jobs`` from MLflow, or None (with a warning) when tracking is down."""
    try:
        from carbonflow.tracking.history import job_history

        return job_history(jobs, tracking_uri=tracking_uri)
    except Exception as err:  # tracking down: plan from the profiles alone
        log.warning("MLflow history unavailable (%s); planning from the profiles alone", err)
        return None


def _is_fallback(forecast: Forecast) -> bool:
    return forecast.provider.split(":")[0] in {"static", "climatology"}


def _profile(member: GroupMember) -> Profile:
    if member.profile is None:
        raise ValueError(f"the wait state of {member.job.name} has no profile")
    return member.profile


def _fmt(value: float | None) -> str:
    return "an unmeasured fraction" if value is None else f"{value:.2f}"
