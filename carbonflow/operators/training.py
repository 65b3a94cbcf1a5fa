"""CarbonAwareTrainingOperator: plan → wait (deferred) → re-plan → launch → account → log.

The operator plans the job from its profile, the region's carbon-intensity forecast and MLflow
history; defers through :class:`~carbonflow.operators.triggers.CarbonWindowTrigger` so no worker
slot is held while it waits; on waking fetches the forecast again and moves the start only if the
new plan still meets finish-by (at most ``max_replans`` moves); then runs the plan through a
backend, accounts energy and emissions, and logs everything to MLflow (spooled if MLflow is down).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow.models import Forecast, JobSpec, Plan, Profile, RunResult
from carbonflow.operators.common import (
    CarbonSource,
    carbon_source,
    group_result_path,
    home,
    make_backend,
    operator_clock,
    parse_job,
    planning_history,
    safe_name,
)
from carbonflow.operators.triggers import CarbonWindowTrigger, GroupResultTrigger, OperatorClock

LAUNCH_TOLERANCE_S = 60.0
FOLLOW_GRACE_S = 3600.0
"""A co-located member waits this long (real time) past finish-by for its pair's launcher to report."""


class TrainingFailed(RuntimeError):
    """The training process exited non-zero (its run is still logged)."""


def next_deadline(now: datetime, deadline_time_utc: str) -> datetime:
    """The next occurrence of ``HH:MM`` UTC strictly after ``now``."""
    try:
        at = time.fromisoformat(deadline_time_utc)
    except ValueError:
        raise ValueError(f"deadline_time_utc={deadline_time_utc!r} is not a time of day; use 'HH:MM' (UTC)") from None
    candidate = datetime.combine(now.date(), at, tzinfo=UTC)
    return candidate if candidate > now else candidate + timedelta(days=1)


class CarbonAwareTrainingOperator(BaseOperator):
    """Train ``job`` at the configuration and time that minimise its objective before finish-by.

    :param job: the JobSpec (model, dict or JSON); a missing ``finish_by`` means the next
        ``deadline_time_utc`` after the planning time.
    :param profile_task_id: the EnergyProfileOperator task whose XCom holds the job's profile.
    :param night_plan_task_id: a NightPlanOperator task: start from the night's joint plan (co-location
        across jobs) instead of planning this job alone. Of a co-located pair, the first job by name
        launches both on one GPU and logs both runs; the other's task waits (deferred) for that outcome.
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
    :param backend: ``local`` (processes on the worker) or ``kubernetes`` (pods/jobs; settings in ``kubernetes``:
        KubernetesSettings fields plus ``config_file``, ``context``, ``in_cluster``).
    """

    template_fields: Sequence[str] = ("job", "replay_start", "backend")
    ui_color = "#b3e5fc"

    def __init__(
        self,
        *,
        job: JobSpec | dict[str, Any] | str,
        profile_task_id: str | None = None,
        night_plan_task_id: str | None = None,
        deadline_time_utc: str = "07:00",
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.backend = backend
        self.kubernetes = kubernetes
        self.job = job.model_dump(mode="json") if isinstance(job, JobSpec) else job
        self.profile_task_id = profile_task_id
        self.night_plan_task_id = night_plan_task_id
        self.deadline_time_utc = deadline_time_utc
        self.replay = replay
        self.replay_start = replay_start
        self.replay_speedup = replay_speedup
        if replay_min_wait_s is None:
            replay_min_wait_s = float(os.environ.get("CARBONFLOW_REPLAY_MIN_WAIT_S", "15"))
        self.replay_min_wait_s = replay_min_wait_s
        self.max_replans = max_replans
        self.replan_interval_s = replan_interval_s
        self.deferrable = deferrable
        self.tracking_uri = tracking_uri
        self.conn_ids = conn_ids
        self._backend: Any = None
        if max_replans < 0:
            raise ValueError(f"max_replans={max_replans} is not allowed; use 0 or more")
        if replan_interval_s <= 0 or replay_speedup <= 0:
            raise ValueError(
                f"replan_interval_s={replan_interval_s} and replay_speedup={replay_speedup} must be positive"
            )
        next_deadline(datetime.now(UTC), deadline_time_utc)  # validate at DAG parse time

    # ---- inputs -------------------------------------------------------------------------
    def _spec(self) -> JobSpec:
        return parse_job(self.job)

    def _profile(self, context: Any) -> Profile:
        if not self.profile_task_id:
            raise ValueError("profile_task_id is not set; point it at the job's EnergyProfileOperator task")
        raw = context["ti"].xcom_pull(task_ids=self.profile_task_id)
        if raw is None:
            raise ValueError(f"no profile in XCom of task {self.profile_task_id!r}")
        return Profile.model_validate(raw)

    def _source(self) -> CarbonSource:
        return carbon_source(self.replay, self.conn_ids)

    def _clock(self, source: CarbonSource, region: str) -> OperatorClock:
        return operator_clock(source, region, self.replay_start)

    def _history(self, spec: JobSpec) -> Any:
        return planning_history([spec.name], self.tracking_uri, self.log)

    def _plan(self, spec: JobSpec, profile: Profile, forecast: Forecast | None, now: datetime) -> Plan:
        from carbonflow.planning.optimizer import plan_job

        recent = self._source().recent_actuals(spec.region, now)  # the planner's check on the forecast
        plan = plan_job(
            spec, profile, forecast, now, self._history(spec), on_infeasible="fastest", intensity_history=recent
        )
        if forecast is not None:
            plan.replay = forecast.replay
        return plan

    # ---- flow ---------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        spec = self._spec()
        source = self._source()
        clock = self._clock(source, spec.region)
        now = clock.now()
        if self.night_plan_task_id:
            return self._execute_from_night_plan(context, spec, clock, source)
        profile = self._profile(context)
        if spec.finish_by is None:
            spec = spec.model_copy(update={"finish_by": next_deadline(now, self.deadline_time_utc)})
        elif spec.finish_by <= now:
            raise ValueError(f"finish_by={spec.finish_by.isoformat()} is in the past (now {now.isoformat()})")
        forecast = source.forecast(spec.region, now, spec.finish_by)  # type: ignore[arg-type]
        plan = self._plan(spec, profile, forecast, now)
        self.log.info("plan: %s", plan.reason)
        state = {
            "job": spec.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"),
            "first_now": now.isoformat(),
            "forecast": forecast.model_dump(mode="json"),
            "replans": 0,
        }
        return self._wait_or_launch(context, state, clock, source)

    def _execute_from_night_plan(
        self, context: Any, spec: JobSpec, clock: OperatorClock, source: CarbonSource
    ) -> dict[str, Any]:
        night = context["ti"].xcom_pull(task_ids=self.night_plan_task_id)
        if not night or spec.name not in night.get("plans", {}):
            raise ValueError(f"the night plan of task {self.night_plan_task_id!r} has no plan for job {spec.name!r}")
        spec = JobSpec.model_validate(night["jobs"][spec.name])
        plan = Plan.model_validate(night["plans"][spec.name])
        forecast = night.get("forecasts", {}).get(spec.region)
        self.log.info("night plan: %s", plan.reason)
        state: dict[str, Any] = {
            "job": spec.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"),
            "first_now": night["now"],
            "forecast": forecast,
            "replans": 0,
            "note": night.get("notes", {}).get(spec.name, ""),
        }
        if plan.colocated_with and self.backend != "local":
            self.log.info("co-located through the cluster's time-sliced GPU resource; each job launches its own pod")
        elif plan.colocated_with:
            partner = plan.colocated_with[0]
            claimed_by = _claimant(context, plan)
            if claimed_by is not None and claimed_by != self.task_id:
                return self._follow(context, spec, plan, claimed_by, clock, source)
            state["replans"] = self.max_replans  # the pair keeps the night plan's start
            state["partner"] = {
                "job": night["jobs"][partner],
                "plan": night["plans"][partner],
                "profile": night["profiles"][partner],
                "min_kept_speed": night.get("min_kept_speed", {}).get(partner),
            }
            state["min_kept_speed"] = night.get("min_kept_speed", {}).get(spec.name)
            state["profile"] = night["profiles"][spec.name]
            self.log.info(
                "%s and %s share one GPU from %s; the first of their tasks to reach the start launches both",
                spec.name, partner, plan.start.isoformat(),
            )  # fmt: skip
        return self._wait_or_launch(context, state, clock, source)

    def _follow(
        self, context: Any, spec: JobSpec, plan: Plan, leader: str, clock: OperatorClock, source: CarbonSource
    ) -> dict[str, Any]:
        """A co-located member: its partner's task (``leader``) launched both; wait for that outcome."""
        path = group_result_path(_run_id(context), plan.config.colocation_group or "", spec.name)
        speedup = self.replay_speedup if source.replay else 1.0
        finish_by = spec.finish_by or plan.start + timedelta(seconds=plan.predicted_duration_s)
        timeout_s = max((finish_by - clock.now()).total_seconds(), 0.0) / speedup + FOLLOW_GRACE_S
        self.log.info("co-located: task %s launched both jobs on one GPU; waiting for %s", leader, path)
        if self.deferrable:
            self.defer(
                trigger=GroupResultTrigger(str(path), timeout_s, reason=f"{spec.name} runs with {leader}"),
                method_name="execute_follow_complete",
            )
        import time as _time

        deadline = _time.monotonic() + timeout_s
        while not path.exists() and _time.monotonic() < deadline:
            _time.sleep(1.0)
        status = "done" if path.exists() else "timeout"
        return self.execute_follow_complete(context, {"status": status, "path": str(path)})

    def execute_follow_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """The pair's launcher reported (or never did): return this job's outcome, or fail with why."""
        path = Path(event["path"])
        if event.get("status") != "done" or not path.exists():
            raise TrainingFailed(f"the task launching this job's co-located pair never reported an outcome at {path}")
        outcome = json.loads(path.read_text(encoding="utf-8"))
        if outcome.get("error"):
            raise TrainingFailed(f"co-located run failed: {outcome['error']}")
        self.log.info("trained with its pair: %s", outcome.get("tracking"))
        return outcome

    def execute_complete(
        self, context: Any, event: dict[str, Any], state: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        state = state or event.get("state")
        if not state:
            raise ValueError("resumed without the waiting state (neither next_kwargs nor the trigger event had it)")
        clock = OperatorClock(float(event.get("clock_offset_s", 0.0)))
        source = self._source()
        spec = JobSpec.model_validate(state["job"])
        plan = Plan.model_validate(state["plan"])
        now = clock.now()
        self.log.info("woke at %s (planned start %s)", now.isoformat(), plan.start.isoformat())
        if state["replans"] < self.max_replans:
            try:
                forecast = source.forecast(spec.region, now, spec.finish_by)  # type: ignore[arg-type]
            except Exception as err:  # the chain never should, but the DAG must not fail on it
                forecast = None
                self.log.warning("forecast unreachable on waking (%s); keeping the plan", err)
            if forecast is not None and forecast.points and not _is_fallback(forecast):
                new_plan = self._plan(spec, self._profile(context), forecast, now)
                new_plan.reason += state.get("note", "")  # what the night plan knew (e.g. why it runs alone)
                finish_ok = (
                    spec.finish_by is None
                    or new_plan.start + timedelta(seconds=new_plan.predicted_duration_s) <= spec.finish_by
                )
                moved = abs((new_plan.start - plan.start).total_seconds()) >= LAUNCH_TOLERANCE_S
                if finish_ok and (moved or new_plan.config != plan.config):
                    new_plan.replans = plan.replans + 1
                    self.log.info("re-planned: %s", new_plan.reason)
                    plan = new_plan
                    state["replans"] += 1
                    state["forecast"] = forecast.model_dump(mode="json")
            elif forecast is not None:
                self.log.warning(
                    "on waking only a fallback forecast (%s) was available; keeping the planned start",
                    forecast.provider,
                )
        state["plan"] = plan.model_dump(mode="json")
        return self._wait_or_launch(context, state, clock, source)

    def _wait_or_launch(
        self, context: Any, state: dict[str, Any], clock: OperatorClock, source: CarbonSource
    ) -> dict[str, Any]:
        plan = Plan.model_validate(state["plan"])
        now = clock.now()
        wait_s = (plan.start - now).total_seconds()
        if wait_s > LAUNCH_TOLERANCE_S:
            wake = min(plan.start, now + timedelta(seconds=self.replan_interval_s))
            speedup = self.replay_speedup if source.replay else 1.0
            if self.deferrable:
                self.log.info(
                    "deferring until %s%s", wake.isoformat(), f" (replay ×{speedup:g})" if source.replay else ""
                )
                self.defer(
                    trigger=CarbonWindowTrigger(
                        wake.isoformat(),
                        clock.offset_s,
                        speedup,
                        reason=f"start of {plan.job}",
                        state=state,
                        min_real_wait_s=self.replay_min_wait_s if source.replay else 0.0,
                    ),
                    method_name="execute_complete",
                )
            import time as _time

            _time.sleep(max((wake - now).total_seconds(), 0.0) / speedup)
            if source.replay:
                clock = OperatorClock(clock.offset_s + (wake - clock.now()).total_seconds())
            return self.execute_complete(context, {"clock_offset_s": clock.offset_s}, state)
        return self._launch(context, state, clock, source)

    def _launch(
        self, context: Any, state: dict[str, Any], clock: OperatorClock, source: CarbonSource
    ) -> dict[str, Any]:
        spec = JobSpec.model_validate(state["job"])
        plan = Plan.model_validate(state["plan"])
        run_id = _run_id(context)
        if state.get("partner"):
            claimed_by = _claim(context, plan, self.task_id)
            if claimed_by != self.task_id:  # the partner's task got there first and runs this job too
                return self._follow(context, spec, plan, claimed_by, clock, source)
            return self._launch_pair(context, state, clock, source)
        self._backend = make_backend(self.backend, home() / "runs" / safe_name(run_id) / spec.name, self.kubernetes)
        self.log.info("launching %s with %s", spec.name, plan.config.key())
        wrapped = self._backend.execute(spec, plan, run_name="train")
        result, points, forecast = self._account(spec, plan, wrapped, state, clock, source)
        tracking = self._log_run(spec, plan, result, forecast, points, context, state.get("profile"))
        if not result.succeeded:
            raise TrainingFailed(
                f"training of {spec.name} exited with code {result.exit_code}; the run is logged ({tracking})"
            )
        return {"plan": plan.model_dump(mode="json"), "result": result.model_dump(mode="json"), "tracking": tracking}

    def _launch_pair(
        self, context: Any, state: dict[str, Any], clock: OperatorClock, source: CarbonSource
    ) -> dict[str, Any]:
        """Run this job and its partner on one GPU, account and log both, leave the partner's outcome for its task."""
        from carbonflow.execution.shared import SEPARATED_EXIT_CODE, SharedRequest
        from carbonflow.profiling.profiler import pair_member

        partner = state["partner"]
        specs = [JobSpec.model_validate(state["job"]), JobSpec.model_validate(partner["job"])]
        plans = [Plan.model_validate(state["plan"]), Plan.model_validate(partner["plan"])]
        profiles = [Profile.model_validate(state["profile"]), Profile.model_validate(partner["profile"])]
        guards = [state.get("min_kept_speed"), partner.get("min_kept_speed")]
        group = plans[0].config.colocation_group or "+".join(s.name for s in specs)
        partner_path = group_result_path(_run_id(context), group, specs[1].name)
        try:
            members = [pair_member(*job) for job in zip(specs, plans, profiles, guards, strict=True)]
            limits = [p.config.power_limit_w for p in plans if p.config.power_limit_w is not None]
            request = SharedRequest(members=members, power_limit_w=min(limits) if limits else None)
            workdir = home() / "runs" / safe_name(_run_id(context)) / safe_name(group)
            self._backend = make_backend(self.backend, workdir, self.kubernetes)
            if not self._backend.supports_shared:
                raise ValueError(f"backend={self.backend!r} cannot co-locate jobs on one GPU here; use backend 'local'")
            shared = self._backend.execute_shared(request, run_name="train")
            outcomes = []
            for i, wrapped in enumerate(shared.members):
                spec, plan = specs[i], plans[i]
                job_state = {**state, "job": spec.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}
                if wrapped.exit_code == SEPARATED_EXIT_CODE:
                    outcomes.append(self._run_separated(context, job_state, wrapped, clock, source, profiles[i]))
                    continue
                result, points, forecast = self._account(spec, plan, wrapped, job_state, clock, source)
                result.notes.append(
                    f"co-located with {specs[1 - i].name} on one GPU: kept {_fmt(shared.kept_speeds[i])} of its solo "
                    f"speed; charged {shared.shares[i]:.2f} of the GPU's energy while both worked"
                )
                tracking = self._log_run(spec, plan, result, forecast, points, context, profiles[i].model_dump())
                outcomes.append((plan, result, tracking))
        except Exception as err:
            _write_json(partner_path, {"error": f"the pair's launch in task {self.task_id} failed: {err}"})
            raise
        (p1, r1, t1) = outcomes[1]
        _write_json(partner_path, {
            "plan": p1.model_dump(mode="json"), "result": r1.model_dump(mode="json"), "tracking": t1,
            "error": None if r1.succeeded else f"training of {specs[1].name} exited with code {r1.exit_code}",
        })  # fmt: skip
        (p0, r0, t0) = outcomes[0]
        if not r0.succeeded:
            raise TrainingFailed(
                f"training of {specs[0].name} exited with code {r0.exit_code}; the run is logged ({t0})"
            )
        return {"plan": p0.model_dump(mode="json"), "result": r0.model_dump(mode="json"), "tracking": t0}

    def _run_separated(
        self, context: Any, state: dict[str, Any], attempt: Any, clock: OperatorClock, source: CarbonSource,
        profile: Profile,
    ) -> tuple[Plan, RunResult, dict[str, Any]]:  # fmt: skip
        """The early observation separated this job from its pair: run it alone now, charging the attempt too."""
        spec = JobSpec.model_validate(state["job"])
        plan = Plan.model_validate(state["plan"])
        solo = plan.model_copy(update={
            "config": plan.config.model_copy(update={"colocation_group": None}), "colocated_with": [],
            "reason": f"separated from its pair after early observation, run alone (was: {plan.reason})",
        })  # fmt: skip
        self.log.warning("%s: %s", spec.name, "; ".join(n for n in attempt.notes if "separated" in n))
        first, _, _ = self._account(spec, plan, attempt, state, clock, source)
        wrapped = self._backend.execute(spec, solo, run_name=f"train-{spec.name}-alone")
        solo_state = {**state, "plan": solo.model_dump(mode="json")}
        result, points, forecast = self._account(spec, solo, wrapped, solo_state, clock, source)
        result.energy_gpu_j += first.energy_gpu_j
        result.energy_cpu_j += first.energy_cpu_j
        result.energy_total_j += first.energy_total_j
        result.emissions_g += first.emissions_g
        result.notes.append(
            f"includes the co-located attempt it was separated from: {first.energy_total_j:.0f} J, "
            f"{first.emissions_g:.3g} g CO2e"
        )
        tracking = self._log_run(spec, solo, result, forecast, points, context, profile.model_dump())
        return solo, result, tracking

    def _account(
        self, spec: JobSpec, plan: Plan, wrapped: Any, state: dict[str, Any], clock: OperatorClock,
        source: CarbonSource,
    ) -> tuple[RunResult, list, Forecast | None]:  # fmt: skip
        """Energy over time → emissions with the real intensity, and the predicted run-now-at-default counterfactual."""
        from carbonflow.execution.results import to_run_result

        forecast = Forecast.model_validate(state["forecast"]) if state.get("forecast") else None
        started = wrapped.started_at + timedelta(seconds=clock.offset_s)
        ended = wrapped.ended_at + timedelta(seconds=clock.offset_s)
        points, intensity_source = source.intensity_for_accounting(spec.region, started, ended, forecast)
        self.log.info("accounting emissions of %s with %s", spec.name, intensity_source)
        ratio, baseline_intensity = None, None
        if plan.baseline is not None:
            ratio = plan.baseline.predicted_energy_j / max(plan.predicted_energy_j, 1e-9)
            first_now = datetime.fromisoformat(state["first_now"])
            run_now_end = first_now + timedelta(
                seconds=wrapped.duration_s * plan.baseline.predicted_duration_s / max(plan.predicted_duration_s, 1e-9)
            )
            base_points, _ = source.intensity_for_accounting(spec.region, first_now, run_now_end, forecast)
            if base_points:
                from carbonflow.carbon.windows import mean_intensity_gco2_per_kwh

                baseline_intensity = mean_intensity_gco2_per_kwh(base_points, first_now, run_now_end)
        result = to_run_result(
            wrapped, plan, points, time_shift_s=clock.offset_s, baseline_energy_ratio=ratio,
            baseline_intensity_gco2_per_kwh=baseline_intensity,
        )  # fmt: skip
        result.notes.append(f"emissions accounted with {intensity_source}")
        return result, points, forecast

    def _log_run(
        self, spec: JobSpec, plan: Plan, result: RunResult, forecast: Forecast | None, points: list, context: Any,
        profile_json: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        from carbonflow.tracking.logger import log_training_run

        profile = None
        try:
            profile = Profile.model_validate(profile_json) if profile_json else self._profile(context)
        except Exception as err:
            self.log.warning("profile not available for the MLflow run (%s)", err)
        output_dir = Path(result.artifacts.get("output_dir", ""))
        model_path = output_dir / "model.pt" if result.artifacts.get("output_dir") else None
        trace = result.artifacts.get("power_trace_csv")
        outcome = log_training_run(
            spec, plan, result, profile=profile, forecast=forecast, actual_points=points,
            power_trace_csv=Path(trace) if trace else None,
            model_path=model_path if model_path is not None and model_path.exists() else None,
            tracking_uri=self.tracking_uri, **_run_identity(context, spec.name),
        )  # fmt: skip
        info = outcome.model_dump(mode="json") if hasattr(outcome, "model_dump") else dict(outcome)
        if info.get("spooled"):
            self.log.warning("MLflow unreachable: the run is spooled locally and will be replayed (%s)", info)
        else:
            self.log.info("MLflow run of %s: %s", spec.name, info.get("run_id"))
        return info

    def on_kill(self) -> None:
        """Stop the training; the wrapper restores the power limits on SIGTERM."""
        if self._backend is not None:
            self._backend.kill()


def _is_fallback(forecast: Forecast) -> bool:
    return forecast.provider.split(":")[0] in {"static", "climatology"}


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


def _fmt(value: float | None) -> str:
    return "an unmeasured fraction" if value is None else f"{value:.2f}"


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically, so a waiting member never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    tmp.replace(path)


def _claim_path(context: Any, plan: Plan) -> Path:
    return group_result_path(_run_id(context), plan.config.colocation_group or plan.job, "launcher")


def _claimant(context: Any, plan: Plan) -> str | None:
    """The task that claimed the launch of this co-located pair in this DAG run, if any."""
    path = _claim_path(context, plan)
    if not path.exists():
        return None
    return path.read_text(encoding="utf-8").strip() or None


def _claim(context: Any, plan: Plan, task_id: str) -> str:
    """Claim the pair's launch (atomically: the first task to reach the start wins); returns the winner.

    A retry of the winning task claims again: it is the same task id.
    """
    path = _claim_path(context, plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = path.with_name(f".{safe_name(task_id)}.{os.getpid()}.claim")
    mine.write_text(task_id, encoding="utf-8")
    try:
        os.link(mine, path)  # atomic: fails if the claim exists, and a claim is never seen half-written
    except FileExistsError:
        pass
    finally:
        mine.unlink(missing_ok=True)
    return _claimant(context, plan) or task_id
