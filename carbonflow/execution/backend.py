"""The backend contract: how a plan is run, whatever runs it (local processes, Kubernetes pods).

Every backend takes the same requests and gives the same results, and can be waited on without
blocking a caller that must not block (an Airflow task that defers while pods train):

* :meth:`Backend.start` launches a run and returns a :class:`RunHandle` at once. The handle is a
  small pydantic model: it serialises to JSON (XCom, a trigger's kwargs) and another process, on
  another host, can rebuild it and :meth:`~Backend.poll`, :meth:`~Backend.collect` or
  :meth:`~Backend.cancel` the run through a backend built from the same settings.
* :meth:`Backend.poll` says, without waiting, whether the run is still going.
* :meth:`Backend.collect` returns what the finished run measured: a :class:`WrappedRun` for one job,
  a :class:`SharedRun` for a co-located pair. It raises :class:`ExecutionError` (or a subclass) when
  the run produced no result.
* :meth:`Backend.cancel` stops a run; the wrapper restores power limits on the way out.
* :meth:`Backend.rebuild_options` is what another process passes to :func:`make_backend` (with the backend's
  name) to rebuild this backend: the Airflow triggerer polls a deferred task's runs so
  (``carbonflow.operators.triggers.BackendRunTrigger``, one trigger for every backend that can defer).

:func:`run_to_completion` is the blocking form (start → wait → collect) for callers that may block,
such as a local training task that owns its worker's GPUs for the run's whole length.
``supports_deferral`` says whether a run survives its caller's process: a local run is a child of the
worker that started it (it is waited on there), a Kubernetes pod is not (its task can defer).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from carbonflow.domain import JobSpec, Plan, UtcDatetime, utcnow
from carbonflow.execution.errors import RunTimedOut
from carbonflow.execution.pair_wrapper import SharedRequest, SharedRun
from carbonflow.execution.wrapper import ENERGY_STOP_GRACE_S, WrappedRun, check_energy_budget

HANDLE_FORMAT_VERSION = 1


class RunOptions(BaseModel):
    """How to run one job (beyond its plan): profile mode, tracing, a time limit."""

    model_config = ConfigDict(extra="forbid")

    run_name: str = "train"
    profile_steps: int | None = Field(default=None, gt=0, description="profile mode: measure this many steps")
    warmup_steps: int = Field(default=0, ge=0)
    sweep_limits_w: list[float] | None = Field(default=None, description="profile mode: limits to sweep")
    stop_below_fraction: float | None = Field(default=None, ge=0, le=1)
    train_after_sweep: bool = Field(
        default=False,
        description="in-run profiling: the sweep is the training's first steps, which then trains on to its end at "
        "the best limit for the job's objective (needs profile_steps and sweep_limits_w)",
    )
    trace: bool = True
    timeout_s: float | None = Field(default=None, gt=0)
    stop_above_energy_j: float | None = Field(
        default=None,
        description="an energy budget (J): once the run's measured energy (GPUs and CPU, as it is accounted) passes "
        "it, the wrapper asks the training to stop (carbonflow.training.should_stop()) and stops it after "
        "stop_grace_s; None: no budget. Honoured where the backend says supports_energy_budget (the local one)",
    )
    stop_grace_s: float = Field(
        default=ENERGY_STOP_GRACE_S,
        description="how long a training asked to stop at its energy budget may take before it is stopped (s)",
    )

    @field_validator("stop_above_energy_j")
    @classmethod
    def _energy_budget(cls, value: float | None) -> float | None:
        return check_energy_budget("stop_above_energy_j", value)

    @field_validator("stop_grace_s")
    @classmethod
    def _grace(cls, value: float) -> float:
        return check_energy_budget("stop_grace_s", value, optional=False)  # type: ignore[return-value]


class RunHandle(BaseModel):
    """A started run, as JSON: enough for another process to poll, collect or cancel it."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = HANDLE_FORMAT_VERSION
    backend: str = Field(description="the backend's name: local or kubernetes")
    run_id: str = Field(description="unique per start (a retry gets a new one)")
    kind: Literal["solo", "shared"] = "solo"
    jobs: list[str] = Field(description="the job(s) this run trains")
    started_at: UtcDatetime = Field(default_factory=utcnow)
    details: dict[str, str] = Field(default_factory=dict, description="backend-specific: run dir, pid, pod names…")


class RunStatus(BaseModel):
    """What :meth:`Backend.poll` found."""

    state: Literal["pending", "running", "finished"]
    message: str = ""


@runtime_checkable
class Backend(Protocol):
    """What every execution backend provides (see the module docstring)."""

    name: str
    supports_deferral: bool
    supports_shared: bool

    def start(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None) -> RunHandle: ...

    def start_shared(self, request: SharedRequest, options: RunOptions | None = None) -> RunHandle: ...

    def poll(self, handle: RunHandle) -> RunStatus: ...

    def collect(self, handle: RunHandle) -> WrappedRun | SharedRun: ...

    def cancel(self, handle: RunHandle) -> None: ...

    def execute(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, **fields: Any) -> WrappedRun: ...

    def rebuild_options(self) -> dict[str, Any]: ...


def run_options(options: RunOptions | None, fields: dict[str, Any], **defaults: Any) -> RunOptions:
    """One :class:`RunOptions` from an options object or its fields as keywords (not both); unknown fields refused.

    ``execute(spec, plan, RunOptions(...))`` and ``execute(spec, plan, run_name="train")`` mean the same on every
    backend; ``defaults`` fill what neither gives (e.g. ``run_name="shared"``).
    """
    if options is not None and fields:
        raise TypeError(f"give the run's options as a RunOptions or as keywords, not both (got also {sorted(fields)})")
    if options is not None:
        return options
    unknown = sorted(set(fields) - set(RunOptions.model_fields))
    if unknown:
        allowed = ", ".join(RunOptions.model_fields)
        raise TypeError(f"run option(s) {', '.join(map(repr, unknown))} are not allowed; use some of {allowed}")
    return RunOptions(**{**defaults, **fields})


def wait(backend: Backend, handle: RunHandle, *, timeout_s: float | None = None, poll_s: float = 0.2) -> RunStatus:
    """Block until the run finished (cancelling it at ``timeout_s``: RunTimedOut)."""
    started = time.monotonic()
    while (status := backend.poll(handle)).state != "finished":
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            backend.cancel(handle)
            raise RunTimedOut(
                f"run {handle.run_id} of {'+'.join(handle.jobs)} exceeded its time limit of {timeout_s:g} s"
            )
        time.sleep(poll_s)
    return status


def run_to_completion(backend: Backend, spec: JobSpec, plan: Plan, options: RunOptions | None = None) -> WrappedRun:
    """Start one job, wait for it, return what it measured (the blocking form of the contract)."""
    options = options or RunOptions()
    handle = backend.start(spec, plan, options)
    wait(backend, handle, timeout_s=options.timeout_s)
    run = backend.collect(handle)
    assert isinstance(run, WrappedRun)
    return run


def run_shared_to_completion(backend: Backend, request: SharedRequest, options: RunOptions | None = None) -> SharedRun:
    """Start a co-located pair, wait for it, return what it measured."""
    options = options or RunOptions(run_name="shared")
    handle = backend.start_shared(request, options)
    wait(backend, handle, timeout_s=options.timeout_s)
    run = backend.collect(handle)
    assert isinstance(run, SharedRun)
    return run


BACKEND_CLASSES: dict[str, str] = {
    "local": "carbonflow.execution.local:LocalBackend",
    "kubernetes": "carbonflow.execution.kubernetes:KubernetesBackend",
}
"""Every backend by name, as ``module:Class``, imported only when asked for: the implementations import this
contract, so the contract names them instead of importing them (no import circle)."""
BACKENDS = tuple(BACKEND_CLASSES)
"""The built-in backends (:func:`register_backend` adds others to :data:`BACKEND_CLASSES`)."""
_KUBERNETES_SETTINGS = "carbonflow.execution.k8s_manifests:KubernetesSettings"


def _load(path: str) -> Any:
    """The object ``module:name`` names, its module imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register_backend(name: str, target: str | type) -> None:
    """Register a backend under ``name``: ``"module:Class"`` (imported when first asked for) or the class itself.

    One line makes a new backend (e.g. a Slurm one in its own module) known to :func:`make_backend`, and so to
    the session, the profiler and the poll trigger. The class is built as ``Class(workdir)`` and must satisfy
    :class:`Backend`. A name already taken by another backend is refused.
    """
    path = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
    if not name or ":" not in path:
        raise ValueError(f"register_backend({name!r}, {target!r}) is not allowed; give a name and 'module:Class'")
    known = BACKEND_CLASSES.get(name)
    if known is not None and known != path:
        raise ValueError(f"backend={name!r} is taken by {known}; choose another name")
    BACKEND_CLASSES[name] = path
    if not isinstance(target, str):
        _REGISTERED[path] = target  # a class defined outside an importable module (e.g. in a test) stays reachable


def unregister_backend(name: str) -> None:
    """Remove a registered backend (for tests that register a skeleton); the built-in ones stay."""
    if name in BACKENDS:
        raise ValueError(f"backend={name!r} is built in and cannot be unregistered")
    path = BACKEND_CLASSES.pop(name, None)
    _REGISTERED.pop(path or "", None)


_REGISTERED: dict[str, type] = {}


def backend_class(name: str) -> type:
    """The class of the backend called ``name`` (see :data:`BACKEND_CLASSES` and :func:`register_backend`)."""
    if name not in BACKEND_CLASSES:
        raise ValueError(f"backend={name!r} is not allowed; use one of {', '.join(BACKEND_CLASSES)}")
    path = BACKEND_CLASSES[name]
    return _REGISTERED[path] if path in _REGISTERED else _load(path)


def make_backend(
    name: str, workdir: Path, kubernetes: dict[str, Any] | None = None, *, api_client: Any | None = None
) -> Backend:
    """The execution backend called ``name``: ``local`` processes or ``kubernetes`` pods/jobs.

    ``kubernetes``: :class:`~carbonflow.execution.k8s_manifests.KubernetesSettings` fields plus how to reach the
    cluster (``config_file``, ``context``, ``in_cluster``; or ``conn_id``, the Airflow connection ``api_client``
    was made from). None: the settings and cluster from the environment. ``api_client``: the kubernetes client to
    use (in Airflow, the provider hook's: :mod:`carbonflow.operators.kubernetes`).
    """
    cls = backend_class(name)
    if name != "kubernetes":
        return cls(workdir)
    if not kubernetes:
        return cls.from_env(api_client=api_client)  # $CARBONFLOW_K8S_SETTINGS, in-cluster or kubeconfig
    options = dict(kubernetes)
    connection = {k: options.pop(k) for k in ("config_file", "context", "in_cluster", "conn_id") if k in options}
    return cls(_load(_KUBERNETES_SETTINGS).model_validate(options), api_client=api_client, **connection)
