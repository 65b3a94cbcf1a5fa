"""CarbonAwareTrainingOperator: plan → wait (deferred) → re-plan → launch → account → log.

The work is :class:`carbonflow.session.RunSession`'s; this operator only turns its answers into Airflow:
it defers through :class:`~carbonflow.operators.triggers.CarbonWindowTrigger` with the session's typed
:class:`~carbonflow.session.WaitState` (no worker slot is held while it waits), resumes it, and returns
the outcome as XCom. A run whose MLflow record could not be written is also pushed to XCom
(``held_runs``) so the ``DeliverHeldRunsOperator`` can log it even if this worker is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow import settings
from carbonflow.domain import JobSpec, Profile, parse_job
from carbonflow.energy.lease import safe_name
from carbonflow.operators.common import WarningCallback, carbon_source, home, state_with_connection_env, tell
from carbonflow.operators.kubernetes import DEFAULT_CONN_ID, operator_backend
from carbonflow.operators.triggers import BackendRunTrigger, CarbonWindowTrigger
from carbonflow.session import CarbonSource, RunSession, SessionClock, WaitState
from carbonflow.session.clock import DEFAULT_DEADLINE_TIME_UTC, next_deadline
from carbonflow.session.source import finish_by_on_clock, session_clock
from carbonflow.session.state import NightPlan
from carbonflow.tracking.held import HELD_RUNS_XCOM_KEY, hold_runs


class TrainingFailed(RuntimeError):
    """The training process exited non-zero (its run is still logged)."""


class CarbonAwareTrainingOperator(BaseOperator):
    """Train a job (or a GPU group of the night plan) at the configuration and time that minimise its objective.

    :param job: the JobSpec (model, dict or JSON); a missing ``finish_by`` means the next
        ``deadline_time_utc`` after the planning time.
    :param profile_task_id: the EnergyProfileOperator task whose XCom holds the job's profile.
    :param night_plan_task_id: a NightPlanOperator task: start from the night's joint plan (co-location
        across jobs) instead of planning this job alone.
    :param gpu_group: with ``night_plan_task_id``: the names of one GPU group of the night plan (one job,
        or a pair sharing one GPU). Map over the plan's groups, one task per group, and the pair is
        launched once, by its one task, which logs both runs::

            CarbonAwareTrainingOperator.partial(task_id="train", night_plan_task_id="plan_night",
                                                map_index_template="{{ task.gpu_group | join('+') }}",
                                                ).expand(gpu_group=night_gpu_groups(plan_night.output))
    :param replay: replay recorded carbon data (the demo) instead of live providers;
        default ``$CARBONFLOW_REPLAY``.
    :param replay_start: the replayed date the run starts at (ISO, UTC); default: an evening
        inside the shipped NESO GB replay.
    :param replay_speedup: in replay, how much faster than real time waiting passes.
    :param replay_min_wait_s: in replay, the shortest real wait of a deferral (default
        ``$CARBONFLOW_REPLAY_MIN_WAIT_S`` or 15 s: Airflow's scheduler races triggers that fire at once).
    :param max_replans: how often a re-plan on waking may move the start.
    :param replan_interval_s: wake at least this often while waiting to re-check the forecast.
    :param conn_ids: Airflow connection ids per keyed provider (electricitymaps, watttime, carbon_aware_sdk).
    :param on_warning_callback: called as ``callback(context, message)`` (one, or a list) for what an operator
        should hear although the task succeeds: a run that ended after its finish-by, a run record held because
        MLflow was unreachable. A power limit that could not be restored fails the task (``on_failure_callback``).
    :param pod_poll_s: on a backend whose runs outlive the task (Kubernetes), how often the triggerer polls the
        run (``BackendRunTrigger``, through the backend's ``poll``) while the task is deferred.
    :param backend: ``local`` (processes on the worker) or ``kubernetes`` (pods/jobs; settings in ``kubernetes``:
        KubernetesSettings fields, and ``conn_id``, ``config_file``, ``context`` or ``in_cluster`` to override
        ``kubernetes_conn_id`` or its fields).
    :param kubernetes_conn_id: the Airflow connection (type ``kubernetes``) of the cluster; the provider's
        ``KubernetesHook`` makes the backend's client from it (:mod:`carbonflow.operators.kubernetes`).
    """

    template_fields: Sequence[str] = ("job", "gpu_group", "replay_start", "backend")
    ui_color = "#b3e5fc"

    def __init__(
        self,
        *,
        job: JobSpec | dict[str, Any] | str | None = None,
        gpu_group: list[str] | None = None,
        profile_task_id: str | None = None,
        night_plan_task_id: str | None = None,
        deadline_time_utc: str = DEFAULT_DEADLINE_TIME_UTC,
        replay: bool | None = None,
        replay_start: str | None = None,
        replay_speedup: float = 3600.0,
        replay_min_wait_s: float | None = None,
        max_replans: int = 3,
        replan_interval_s: float = 3 * 3600.0,
        deferrable: bool = True,
        tracking_uri: str | None = None,
        conn_ids: dict[str, str] | None = None,
        backend: str = "local",
        kubernetes: dict[str, Any] | None = None,
        kubernetes_conn_id: str = DEFAULT_CONN_ID,
        on_warning_callback: WarningCallback | list[WarningCallback] | None = None,
        pod_poll_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pod_poll_s = pod_poll_s
        self.on_warning_callback = on_warning_callback
        self.backend = backend
        self.kubernetes = kubernetes
        self.kubernetes_conn_id = kubernetes_conn_id
        self.job = job.model_dump(mode="json") if isinstance(job, JobSpec) else job
        self.profile_task_id = profile_task_id
        self.night_plan_task_id = night_plan_task_id
        self.deadline_time_utc = deadline_time_utc
        self.replay = replay
        self.replay_start = replay_start
        self.replay_speedup = replay_speedup
        if replay_min_wait_s is None:
            replay_min_wait_s = settings.replay_min_wait_s()
        self.replay_min_wait_s = replay_min_wait_s
        self.max_replans = max_replans
        self.replan_interval_s = replan_interval_s
        self.deferrable = deferrable
        self.tracking_uri = tracking_uri
        self.conn_ids = conn_ids
        self.gpu_group = gpu_group
        self._running: RunSession | None = None
        if (job is None) == (gpu_group is None):
            raise ValueError("give either job= (one job) or gpu_group= (a group of the night plan), not both")
        if gpu_group is not None and not night_plan_task_id:
            raise ValueError(f"gpu_group={gpu_group!r} needs night_plan_task_id= (the night plan that made the group)")
        if max_replans < 0:
            raise ValueError(f"max_replans={max_replans} is not allowed; use 0 or more")
        if replan_interval_s <= 0 or replay_speedup <= 0:
            raise ValueError(
                f"replan_interval_s={replan_interval_s} and replay_speedup={replay_speedup} must be positive"
            )
        next_deadline(datetime.now(UTC), deadline_time_utc)  # validate at DAG parse time

    # ---- inputs -------------------------------------------------------------------------
    def _session(self, context: Any, source: CarbonSource) -> RunSession:
        return RunSession(
            source=source, workdir=home() / "runs" / safe_name(_run_id(context)), backend=self.backend,
            kubernetes=self.kubernetes, tracking_uri=self.tracking_uri,
            identity=lambda job: _run_identity(context, job), log=self.log,
            backend_factory=partial(operator_backend, conn_id=self.kubernetes_conn_id),
        )  # fmt: skip

    def _profile(self, context: Any) -> Profile:
        if not self.profile_task_id:
            raise ValueError("profile_task_id is not set; point it at the job's EnergyProfileOperator task")
        raw = context["ti"].xcom_pull(task_ids=self.profile_task_id)
        if raw is None:
            raise ValueError(f"no profile in XCom of task {self.profile_task_id!r}")
        return Profile.model_validate(raw)

    def _night(self, context: Any) -> NightPlan | None:
        """The night plan this task trains a group of (pulled once: it holds every job's profile), or None.

        What XCom holds is read by :meth:`NightPlan.from_xcom`: this version, or carbonflow 0.1.0's dict.
        """
        if not self.night_plan_task_id:
            return None
        night = context["ti"].xcom_pull(task_ids=self.night_plan_task_id)
        if not night:
            raise ValueError(f"no night plan in XCom of task {self.night_plan_task_id!r}")
        return NightPlan.from_xcom(night)

    def _initial_state(
        self, context: Any, session: RunSession, clock: SessionClock, night: NightPlan | None
    ) -> WaitState:
        if night is not None:
            group = self.gpu_group or [parse_job(self.job).name]  # type: ignore[arg-type]
            _refuse_split_pair(night, group)
            return session.from_night_plan(night, group)
        spec = parse_job(self.job)  # type: ignore[arg-type]
        now = clock.now()
        finish_by = finish_by_on_clock(spec.finish_by, clock, session.source, spec.region)
        if finish_by is None:
            finish_by = next_deadline(now, self.deadline_time_utc)
        elif finish_by != spec.finish_by:
            self.log.info("replay: finish_by %s (wall clock) is %s on the replayed clock",
                          spec.finish_by.isoformat(), finish_by.isoformat())  # type: ignore[union-attr]  # fmt: skip
        if finish_by <= now:
            raise ValueError(f"finish_by={finish_by.isoformat()} is in the past (now {now.isoformat()})")
        return session.plan_alone(spec.model_copy(update={"finish_by": finish_by}), self._profile(context), now)

    # ---- flow ---------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        source = carbon_source(self.replay, self.conn_ids)
        session = self._session(context, source)
        night = self._night(context)
        clock = session_clock(source, self._region(night), self.replay_start)
        state = self._initial_state(context, session, clock, night)
        context["gpu_group"] = state.label
        return self._wait_or_launch(context, session, state, clock)

    def execute_complete(self, context: Any, event: dict[str, Any], state: dict[str, Any] | None = None) -> Any:
        """Woken by the trigger: re-plan if allowed, then wait again or launch."""
        raw = state or event.get("state")
        if not raw:
            raise ValueError("resumed without the waiting state (neither next_kwargs nor the trigger event had it)")
        wait_state = WaitState.read(raw)
        session = self._session(context, carbon_source(self.replay, self.conn_ids))
        clock = SessionClock(float(event.get("clock_offset_s", 0.0)))
        if any(m.profile is None for m in wait_state.members):  # written by 0.1.0: the profile is in XCom
            wait_state.members[0].profile = self._profile(context)
        self.log.info("woke at %s (planned start %s)", clock.now().isoformat(), wait_state.start.isoformat())
        wait_state = session.replan(wait_state, clock.now(), self.max_replans)
        return self._wait_or_launch(context, session, wait_state, clock)

    def _wait_or_launch(self, context: Any, session: RunSession, state: WaitState, clock: SessionClock) -> Any:
        wake = session.next_wake(state, clock.now(), self.replan_interval_s)
        if wake is None:
            return self._launch(context, session, state, clock)
        speedup = self.replay_speedup if session.source.replay else 1.0
        if self.deferrable:
            self.log.info("deferring until %s%s", wake.isoformat(), f" (replay ×{speedup:g})" if clock.replay else "")
            self.defer(
                trigger=CarbonWindowTrigger(
                    wake.isoformat(), clock.offset_s, speedup, reason=f"start of {state.label}",
                    state=state.model_dump(mode="json"),
                    min_real_wait_s=self.replay_min_wait_s if session.source.replay else 0.0,
                ),
                method_name="execute_complete",
            )  # fmt: skip
        import time as _time

        _time.sleep(max((wake - clock.now()).total_seconds(), 0.0) / speedup)
        if session.source.replay:
            clock = SessionClock(clock.offset_s + (wake - clock.now()).total_seconds())
        return self.execute_complete(context, {"clock_offset_s": clock.offset_s}, state.model_dump(mode="json"))

    def _launch(self, context: Any, session: RunSession, state: WaitState, clock: SessionClock) -> Any:
        self._running = session
        launched = state_with_connection_env(state)  # the training's declared secrets: launched, never stored
        handles = session.start_deferred(launched) if self.deferrable else None
        if handles:  # the runs outlive this process (pods): wait for them in the triggerer, not in a worker slot
            self.defer(
                trigger=BackendRunTrigger(handles[0].backend, [h.model_dump(mode="json") for h in handles],
                                          session.backend_options(), state=state.model_dump(mode="json"),
                                          clock_offset_s=clock.offset_s, poll_s=self.pod_poll_s),
                method_name="execute_run_ended",
            )  # fmt: skip
        return self._report(context, session.launch(launched, clock))

    def execute_run_ended(self, context: Any, event: dict[str, Any]) -> Any:
        """The run (a pod or Job) ended: collect its measurements here, on whichever worker resumed, and log them."""
        state = WaitState.read(event["state"])
        session = self._session(context, carbon_source(self.replay, self.conn_ids))
        self.log.info("%s ended (%s)", state.label, event.get("message"))
        outcome = session.finish(state, event["handles"], SessionClock(float(event.get("clock_offset_s", 0.0))))
        return self._report(context, outcome)

    def _report(self, context: Any, outcome: Any) -> Any:
        held, not_held = hold_runs(outcome.held)  # a run too big for XCom stays in the spool: told, not failed
        if held:  # MLflow down: the records also wait in the metadata DB, for the deliver task
            context["ti"].xcom_push(key=HELD_RUNS_XCOM_KEY, value=held)
        outcome.raise_if_power_limits_not_restored()  # PowerLimitNotRestored: on_failure_callback hears it
        if outcome.failures:  # on_failure_callback hears these
            raise TrainingFailed("; ".join(outcome.failures))
        tell(self, context, [*outcome.warnings, *not_held])
        if self.gpu_group is None:  # one job: the outcome of that job, as before
            return outcome.jobs[0].to_json()
        return outcome.to_json()

    def _region(self, night: NightPlan | None) -> str:
        if self.job is not None:
            return parse_job(self.job).region
        jobs = night.jobs if night is not None else {}
        name = next((n for n in self.gpu_group or [] if n in jobs), None)
        return jobs[name].region if name else "GB"

    def on_kill(self) -> None:
        """Stop the training; the wrapper restores the power limits on SIGTERM."""
        if self._running is not None:
            self._running.cancel()


def _refuse_split_pair(night: NightPlan, group: list[str]) -> None:
    """A task given one job of a co-located pair would train it apart from its partner: say how to wire it."""
    plan = night.plans.get(group[0]) if len(group) == 1 else None
    if plan is not None and plan.colocated_with:
        raise ValueError(
            f"the night plan puts {group[0]} on one GPU with {plan.colocated_with[0]}: train the night's "
            "GPU groups with CarbonAwareTrainingOperator.partial(...)"
            ".expand(gpu_group=night_gpu_groups(plan_night.output))"
        )


def _run_identity(context: Any, job: str) -> dict[str, Any]:
    """The run's deterministic idempotency key and its Airflow provenance tags.

    A retry of this task reuses the key (it finds the run its earlier try logged); a cleared DAG run gets a
    new one (``clear_number``), so it logs a new run instead of returning the old outcome.
    """
    from carbonflow.tracking import schema
    from carbonflow.tracking.spool import run_idempotency_key

    ti = context.get("ti") if context else None
    if getattr(ti, "dag_id", None) is None or getattr(ti, "task_id", None) is None:
        return {}  # not run by Airflow (a test's stand-in context): a fresh key per run
    dag_run = context.get("dag_run")
    dag_run_id = str(context.get("run_id", getattr(dag_run, "run_id", "manual")))
    clear_number = int(getattr(dag_run, "clear_number", 0) or 0)
    run_type = str(getattr(dag_run, "run_type", "") or "")
    key = run_idempotency_key(ti.dag_id, dag_run_id, clear_number, ti.task_id, int(getattr(ti, "map_index", -1)), job)
    provenance = {
        schema.T_DAG_ID: ti.dag_id, schema.T_DAG_RUN_ID: dag_run_id, schema.T_TASK_ID: ti.task_id,
        schema.T_RUN_KIND: "nightly" if run_type.lower().endswith("scheduled") else "on_demand",
    }  # fmt: skip
    return {"idempotency_key": key, "provenance": provenance}


def _run_id(context: Any) -> str:
    return str(context["run_id"]) if context and "run_id" in context else "manual"
