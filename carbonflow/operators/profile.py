"""EnergyProfileOperator: profile a job under candidate configurations, or reuse a fresh profile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow.energy.lease import safe_name
from carbonflow.execution.backend import make_backend
from carbonflow.models import JobSpec, Profile, parse_job, utcnow
from carbonflow.operators.common import home, with_connection_env


class EnergyProfileOperator(BaseOperator):
    """Run ``job`` briefly under candidate configurations (power limits × container counts).

    The profile goes to MLflow and to XCom (as JSON). For a recurring job on the same hardware
    and code version, a profile younger than ``job.profile_max_age_s`` is read back from MLflow
    instead of profiling again.
    """

    template_fields: Sequence[str] = ("job", "backend")
    ui_color = "#d9f2d9"

    def __init__(
        self,
        *,
        job: JobSpec | dict[str, Any] | str,
        step_w: float = 25.0,
        reuse_profiles: bool = True,
        tracking_uri: str | None = None,
        backend: str = "local",
        kubernetes: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.backend = backend
        self.kubernetes = kubernetes
        self.job = job.model_dump(mode="json") if isinstance(job, JobSpec) else job
        self.step_w = step_w
        self.reuse_profiles = reuse_profiles
        self.tracking_uri = tracking_uri
        self._backend: Any = None

    def execute(self, context: Any) -> dict[str, Any]:
        from carbonflow.energy.discovery import discover_devices
        from carbonflow.execution.commands import samples_per_epoch
        from carbonflow.profiling.profiler import profile_job

        spec = parse_job(self.job)
        devices = discover_devices(spec.simulated_gpu, include_cpu=True)
        gpus = [d for d in devices if d.kind == "gpu"]
        device_model = gpus[0].model if gpus else next(d.model for d in devices if d.kind == "cpu")
        if self.reuse_profiles:
            fresh = self._fresh_profile(spec, device_model)
            drift = self._drift(spec) if fresh is not None else None
            if drift:
                self.log.info("profiling %s again: %s", spec.name, drift)
            elif fresh is not None:
                self.log.info(
                    "reusing the profile of %s measured at %s on %s (younger than %.0f s); not profiling again",
                    spec.name, fresh.measured_at.isoformat(), device_model, spec.profile_max_age_s,
                )  # fmt: skip
                return fresh.model_dump(mode="json")
        run_id = context["run_id"] if context and "run_id" in context else utcnow().strftime("%Y%m%dT%H%M%S")
        self._backend = make_backend(self.backend, home() / "runs" / safe_name(run_id) / spec.name, self.kubernetes)
        self.log.info("profiling %s on %s", spec.name, ", ".join(d.describe() for d in devices))

        def progress(key: str, done: int, planned: int) -> None:
            self.log.info("profiled %s (%d of at most %d configurations)", key, done, planned)

        profile = profile_job(
            with_connection_env(spec), self._backend, devices, samples_per_epoch=samples_per_epoch(spec),
            step_w=self.step_w, on_progress=progress,
        )  # fmt: skip
        self._log_profile(spec, profile)
        return profile.model_dump(mode="json")

    def _drift(self, spec: JobSpec) -> str | None:
        """Why the job's realised runs no longer match its profile (None: they do, or history is unreadable)."""
        from carbonflow.profiling.refresh import drift_reason
        from carbonflow.tracking.history import realised_vs_predicted

        try:
            rows = realised_vs_predicted(spec.name, tracking_uri=self.tracking_uri)
        except Exception as err:  # tracking down: reuse the profile rather than fail the DAG
            self.log.warning("could not read %s's runs from MLflow (%s)", spec.name, err)
            return None
        ratios = [r.energy_ratio for r in rows if r.energy_ratio is not None]
        return drift_reason(ratios)

    def _fresh_profile(self, spec: JobSpec, device_model: str) -> Profile | None:
        from carbonflow.tracking.history import latest_profile

        try:
            return latest_profile(
                spec.name,
                device_model,
                spec.code_version,
                spec.profile_max_age_s,
                utcnow(),
                tracking_uri=self.tracking_uri,
            )
        except Exception as err:  # tracking down must not fail the DAG: profile instead
            self.log.warning("could not read profile history from MLflow (%s); profiling again", err)
            return None

    def _log_profile(self, spec: JobSpec, profile: Profile) -> None:
        from carbonflow.tracking.logger import log_profile

        outcome = log_profile(spec, profile, tracking_uri=self.tracking_uri)
        if getattr(outcome, "spooled", False):
            self.log.warning("MLflow unreachable: profile spooled locally (%s)", getattr(outcome, "reason", ""))
        else:
            self.log.info("profile logged to MLflow run %s", getattr(outcome, "run_id", None))

    def on_kill(self) -> None:
        if self._backend is not None:
            self._backend.kill()
