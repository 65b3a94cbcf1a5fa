"""CarbonAwareTrainingOperator: plan → wait (deferred) → re-plan → launch → account → log.

The operator plans the job from its profile, the region's carbon-intensity forecast and MLflow
history; defers through :class:`~carbonflow.operators.triggers.CarbonWindowTrigger` so no worker
slot is held while it waits; on waking fetches the forecast again and moves the start only if the
new plan still meets finish-by (at most ``max_replans`` moves); then runs the plan through a
backend, accounts energy and emissions, and logs everything to MLflow (spooled if MLflow is down).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow.models import Forecast, JobSpec, Plan, Profile, RunResult
from carbonflow.operators.common import CarbonSource, home, make_backend, parse_job, replay_enabled, safe_name
from carbonflow.operators.triggers import CarbonWindowTrigger, OperatorClock

LAUNCH_TOLERANCE_S = 60.0
DEFAULT_REPLAY_EVENING_H = 6.0
"""Replay starts this many hours after the replay's first published forecast (an evening for NESO GB)."""


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
        replay = replay_enabled(self.replay)
        credentials = None
        if not replay:
            from carbonflow.operators.hooks import provider_credentials

            credentials = provider_credentials(self.conn_ids)
        return CarbonSource(replay=replay, credentials=credentials)

    def _clock(self, source: CarbonSource, region: str) -> OperatorClock:
        if not source.replay:
            return OperatorClock()
        if self.replay_start:
            start = datetime.fromisoformat(self.replay_start.replace("Z", "+00:00"))
            if start.tzinfo is None:
                raise ValueError(f"replay_start={self.replay_start!r} has no time zone; give it in UTC")
        else:
            start = source.replay_window(region)[0] + timedelta(hours=DEFAULT_REPLAY_EVENING_H)
        return OperatorClock.replaying(start)

    def _history(self, spec: JobSpec) -> Any:
        try:
            from carbonflow.tracking.history import job_history

            return job_history([spec.name], tracking_uri=self.tracking_uri)
        except Exception as err:  # tracking down: plan from the profile alone
            self.log.warning("MLflow history unavailable (%s); planning from the profile alone", err)
            return None

    def _plan(self, spec: JobSpec, profile: Profile, forecast: Forecast | None, now: datetime) -> Plan:
        from carbonflow.planning.optimizer import plan_job

        plan = plan_job(spec, profile, forecast, now, self._history(spec), on_infeasible="fastest")
        if forecast is not None:
            plan.replay = forecast.replay
        return plan

    # ---- flow ---------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        spec = self._spec()
        profile = self._profile(context)
        source = self._source()
        clock = self._clock(source, spec.region)
        now = clock.now()
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
        from carbonflow.execution.results import to_run_result

        spec = JobSpec.model_validate(state["job"])
        plan = Plan.model_validate(state["plan"])
        forecast = Forecast.model_validate(state["forecast"]) if state.get("forecast") else None
        run_id = str(context["run_id"]) if context and "run_id" in context else "manual"
        self._backend = make_backend(self.backend, home() / "runs" / safe_name(run_id) / spec.name, self.kubernetes)
        self.log.info("launching %s with %s", spec.name, plan.config.key())
        wrapped = self._backend.execute(spec, plan, run_name="train")
        started = wrapped.started_at + timedelta(seconds=clock.offset_s)
        ended = wrapped.ended_at + timedelta(seconds=clock.offset_s)
        points, intensity_source = source.intensity_for_accounting(spec.region, started, ended, forecast)
        self.log.info("accounting emissions with %s", intensity_source)
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
        tracking = self._log_run(spec, plan, result, forecast, points, context)
        if not result.succeeded:
            raise TrainingFailed(
                f"training of {spec.name} exited with code {result.exit_code}; the run is logged ({tracking})"
            )
        return {"plan": plan.model_dump(mode="json"), "result": result.model_dump(mode="json"), "tracking": tracking}

    def _log_run(
        self, spec: JobSpec, plan: Plan, result: RunResult, forecast: Forecast | None, points: list, context: Any
    ) -> dict[str, Any]:
        from pathlib import Path

        from carbonflow.tracking.logger import log_training_run

        profile = None
        try:
            profile = self._profile(context)
        except Exception as err:
            self.log.warning("profile not available for the MLflow run (%s)", err)
        output_dir = Path(result.artifacts.get("output_dir", ""))
        model_path = output_dir / "model.pt" if result.artifacts.get("output_dir") else None
        trace = result.artifacts.get("power_trace_csv")
        outcome = log_training_run(
            spec, plan, result, profile=profile, forecast=forecast, actual_points=points,
            power_trace_csv=Path(trace) if trace else None,
            model_path=model_path if model_path is not None and model_path.exists() else None,
            tracking_uri=self.tracking_uri,
        )  # fmt: skip
        info = outcome.model_dump(mode="json") if hasattr(outcome, "model_dump") else dict(outcome)
        if info.get("spooled"):
            self.log.warning("MLflow unreachable: the run is spooled locally and will be replayed (%s)", info)
        else:
            self.log.info("MLflow run: %s", info.get("run_id"))
        return info

    def on_kill(self) -> None:
        """Stop the training; the wrapper restores the power limits on SIGTERM."""
        if self._backend is not None:
            self._backend.kill()


def _is_fallback(forecast: Forecast) -> bool:
    return forecast.provider.split(":")[0] in {"static", "climatology"}
