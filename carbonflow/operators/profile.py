"""EnergyProfileOperator: profile a job under candidate configurations, or reuse a fresh profile.

On a backend whose runs outlive the task (Kubernetes pods: ``supports_deferral``), the task starts one profiling
run at a time and defers on :class:`~carbonflow.operators.triggers.BackendRunTrigger` while it runs, holding no
worker slot; it resumes (on any worker) to collect the run, then starts the next container count's or returns
the profile. The sweep so far travels with the trigger as a :class:`~carbonflow.profiling.profiler.SweepState`.
Locally (the run is the worker's child) it profiles in the task, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from carbonflow.domain import JobSpec, Profile, parse_job, utcnow
from carbonflow.energy.lease import safe_name
from carbonflow.execution.backend import Backend, RunHandle
from carbonflow.operators.common import home, with_connection_env
from carbonflow.operators.kubernetes import DEFAULT_CONN_ID, operator_backend
from carbonflow.operators.triggers import BackendRunTrigger
from carbonflow.session.early_stop import stops_early
from carbonflow.session.profile import log_measured_profile, reusable_profile, with_batch_size_probes

if TYPE_CHECKING:
    from carbonflow.energy.device import Device
    from carbonflow.profiling.profiler import ProfileSweep


class EnergyProfileOperator(BaseOperator):
    """Run ``job`` briefly under candidate configurations (power limits × container counts).

    The profile goes to MLflow and to XCom (as JSON). For a recurring job on the same hardware
    and code version, a profile younger than ``job.profile_max_age_s`` is read back from MLflow
    instead of profiling again.

    :param deferrable: on a backend whose runs outlive the task (Kubernetes), defer while each profiling run
        runs (the default) instead of waiting for it in the worker.
    :param poll_s: while deferred, how often the triggerer polls the run through the backend's ``poll``.
    :param kubernetes_conn_id: on ``backend="kubernetes"``, the Airflow connection (type ``kubernetes``) of the
        cluster: the provider's ``KubernetesHook`` makes the client (``kubernetes`` may override it: ``conn_id``).
    :param probe: profile the highest power limit only (a short probe to plan the first run from); the job's first
        training run then sweeps the limits inside itself and keeps that work (in-run profiling, the local
        backend), and logs the full profile the next night reads. Off: the separate sweep, whose work is thrown
        away.
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
        kubernetes_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = True,
        poll_s: float = 10.0,
        probe: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.probe = probe
        if poll_s <= 0:
            raise ValueError(f"poll_s={poll_s} is not allowed; it must be > 0 seconds")
        self.deferrable = deferrable
        self.poll_s = poll_s
        self.backend = backend
        self.kubernetes = kubernetes
        self.kubernetes_conn_id = kubernetes_conn_id
        self.job = job.model_dump(mode="json") if isinstance(job, JobSpec) else job
        self.step_w = step_w
        self.reuse_profiles = reuse_profiles
        self.tracking_uri = tracking_uri
        self._backend: Any = None

    def execute(self, context: Any) -> dict[str, Any]:
        from carbonflow.execution.commands import samples_per_epoch
        from carbonflow.profiling.profiler import profile_job

        spec = parse_job(self.job)
        devices = _devices(spec)
        gpus = [d for d in devices if d.kind == "gpu"]
        device_model = gpus[0].model if gpus else next(d.model for d in devices if d.kind == "cpu")
        if self.reuse_profiles:
            fresh = reusable_profile(spec, device_model, utcnow(), self.tracking_uri, self.log)
            if fresh is not None:
                return self._probed(context, spec, devices, fresh).model_dump(mode="json")
        self._backend = self._make_backend(context, spec)
        self.log.info("profiling %s on %s", spec.name, ", ".join(d.describe() for d in devices))
        if self.deferrable and self._backend.supports_deferral:
            return self._start_next(self._sweep(spec, devices), self._backend)
        profile = profile_job(
            with_connection_env(spec), self._backend, devices, samples_per_epoch=samples_per_epoch(spec),
            step_w=self.step_w, on_progress=self._progress, probe=self.probe,
        )  # fmt: skip
        self._log_profile(spec, profile)
        return self._probed(context, spec, devices, profile).model_dump(mode="json")

    def _probed(self, context: Any, spec: JobSpec, devices: list[Device], profile: Profile) -> Profile:
        """The profile with the batch sizes the job's explorer asks for probed (the session decides; each probe is
        one short single-limit run through this task's backend, waited for here, and the merged profile is logged)."""
        if not stops_early(spec):  # no explorer: no probes, no backend made for them
            return profile
        if self._backend is None:
            self._backend = self._make_backend(context, spec)
        return with_batch_size_probes(with_connection_env(spec), profile, self._backend, devices, self.tracking_uri,
                                      self.log)  # fmt: skip

    def execute_run_ended(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """A profiling run ended (the trigger fired): collect it here, on whichever worker resumed, then start the
        next container count's run (deferring again) or return the profile."""
        from carbonflow.profiling.profiler import SweepState

        spec = parse_job(self.job)
        backend = self._backend = self._make_backend(context, spec)
        (handle,) = event["handles"]
        self.log.info("profiling run %s ended (%s)", handle.get("run_id"), event.get("message"))
        sweep = self._sweep(spec, _devices(spec), SweepState.model_validate(event["state"]))
        sweep.add(backend.collect(RunHandle.model_validate(handle)))  # type: ignore[arg-type]
        return self._start_next(sweep, backend)

    def _start_next(self, sweep: ProfileSweep, backend: Backend) -> dict[str, Any]:
        """Start the sweep's next run and defer until it ended; or, when every run ended, log and return the profile."""
        planned = sweep.next_run()
        if planned is None:
            profile = sweep.profile()
            self._log_profile(sweep.spec, profile)
            return self._probed(None, sweep.spec, sweep.devices, profile).model_dump(mode="json")
        plan, options = planned
        handle = backend.start(with_connection_env(sweep.spec), plan, options)
        self.log.info("profiling %s with %s as run %s; waiting for it without holding a worker", sweep.spec.name,
                      plan.config.key(), handle.run_id)  # fmt: skip
        self.defer(
            trigger=BackendRunTrigger(handle.backend, [handle.model_dump(mode="json")], backend.rebuild_options(),
                                      state=sweep.state.model_dump(mode="json"), poll_s=self.poll_s),
            method_name="execute_run_ended",
        )  # fmt: skip
        raise AssertionError("defer() returned")  # pragma: no cover  (defer raises TaskDeferred)

    def _make_backend(self, context: Any, spec: JobSpec) -> Backend:
        run_id = context["run_id"] if context and "run_id" in context else utcnow().strftime("%Y%m%dT%H%M%S")
        workdir = home() / "runs" / safe_name(run_id) / spec.name
        return operator_backend(self.backend, workdir, self.kubernetes, conn_id=self.kubernetes_conn_id)

    def _sweep(self, spec: JobSpec, devices: list[Device], state: Any = None) -> ProfileSweep:
        from carbonflow.execution.commands import samples_per_epoch
        from carbonflow.profiling.profiler import ProfileSweep

        return ProfileSweep(spec, devices, samples_per_epoch=samples_per_epoch(spec), step_w=self.step_w,
                            on_progress=self._progress, state=state, probe=self.probe)  # fmt: skip

    def _progress(self, key: str, done: int, planned: int) -> None:
        self.log.info("profiled %s (%d of at most %d configurations)", key, done, planned)

    def _log_profile(self, spec: JobSpec, profile: Profile) -> None:
        log_measured_profile(spec, profile, self.tracking_uri, self.log)

    def on_kill(self) -> None:
        if self._backend is not None:
            self._backend.kill()


def _devices(spec: JobSpec) -> list[Device]:
    """The devices the profile is made for, as this worker finds them (a job's simulated GPU, else this host's);
    found again when the task resumes after a deferral."""
    from carbonflow.energy.discovery import discover_devices

    return discover_devices(spec.simulated_gpu, include_cpu=True)
