"""Kubernetes execution backend: the same ``Plan`` in, the same ``RunResult`` out, on a cluster.

``KubernetesBackend(settings).execute(spec, plan)`` (the same contract as the local backend: the wrapper's
measurements, a :class:`~carbonflow.execution.wrapper.WrappedRun`) and ``.run(spec, plan, points)`` (a
:class:`RunResult`, accounted with :func:`carbonflow.accounting.run.to_run_result`):

1. builds the objects with :class:`~carbonflow.execution.k8s_manifests.ManifestBuilder` (the kubernetes client's
   models, as the cncf-kubernetes provider's pod / job operators built them) and validates them offline against
   the Kubernetes schema;
2. creates the ConfigMap (job.json, plan.json), then the Pod — or the headless Service and Indexed Job;
3. polls until the pod (every rank) terminated, failing fast on image-pull / config errors;
4. reads each rank's ``WrappedRun`` from its termination message (``carbonflow run --result
   /dev/termination-log``), falling back to a ``CARBONFLOW_RESULT`` line of the pod log when the message is
   truncated, and merges the ranks (devices keyed by node; a device two ranks on one node both measured is
   counted once). Either is believed only when signed with the run's key (:mod:`carbonflow.execution.signing`):
   the training shares the log and can print anything; a rank without a signed result is a failed run;
5. deletes everything it created, whatever happened, with a grace period so that the wrapper's SIGTERM
   handler restores power limits through zeusd, and **waits until the pods (and the Job) are gone** — a
   deleted pod terminates over its grace period — or says which are still there when they are not gone in
   the grace period plus ``delete_wait_margin_s``;
6. after a failed or killed run that lowered power limits, and only once its pods are gone, starts a restore
   pod pinned to each node a training pod ran on, which replays that pod's restore journals (kept in a host
   directory) through zeusd, so a SIGKILL or OOM kill never leaves a GPU at a lowered limit.

The client is given (``api_client``) or built: in Airflow it is the cncf-kubernetes provider's ``KubernetesHook``'s,
made from an Airflow connection by :mod:`carbonflow.operators.kubernetes` (this module imports no Airflow); outside
Airflow (``carbonflow run``, the benchmarks) it is built from a kubeconfig or the in-cluster service account.
Only the kubernetes python client talks to the cluster; the API calls used are: create/read/delete
namespaced config map, pod, service and job, list namespaced pod (label selector), read pod log. Whether a run
has ended (a pod Succeeded or Failed, or waiting for a reason it cannot recover from; a Job Complete or Failed)
is decided in :meth:`KubernetesBackend.poll` alone: a deferred Airflow task's trigger asks it through the
backend contract (``carbonflow.operators.triggers.BackendRunTrigger``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from carbonflow.contract import GPU_INDEX_MAP_ENV, POWER_JOURNAL_DIR_ENV, ZEUSD_SOCK_ENV
from carbonflow.domain import ForecastPoint, JobSpec, Plan, RunResult
from carbonflow.execution.backend import RunHandle, RunOptions, RunStatus, run_options
from carbonflow.execution.errors import RunFailed
from carbonflow.execution.k8s_manifests import (
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER_NAME,
    LABEL_RUN,
    KubernetesManifests,
    KubernetesSettings,
    ManifestBuilder,
    validate_manifest,
)
from carbonflow.execution.pair_wrapper import SharedRequest
from carbonflow.execution.signing import NOT_SIGNED, find_signed_payload, new_result_key
from carbonflow.execution.wrapper import MeasuredWindow, WrappedRun

log = logging.getLogger(__name__)


FATAL_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
)


class KubernetesRunError(RunFailed):
    """A run that did not produce a result: names the object, its phase/reason and the log tail."""


def parse_signed_result(text: str | None, key: str) -> tuple[WrappedRun | None, list[str]]:
    """A ``WrappedRun`` from a termination message or a log, only if this run's wrapper signed it with ``key``:
    the whole text, else the last signed ``CARBONFLOW_RESULT`` line (Kubernetes keeps at most 4096 bytes of the
    message). Returns ``(run or None, why each result-looking candidate was refused)``."""
    payload, refused = find_signed_payload(text, key)
    if payload is None:
        return None, refused
    try:
        return WrappedRun.model_validate_json(payload), refused
    except ValidationError as err:
        return None, [*refused, f"a signed result that is not a WrappedRun ({err.error_count()} problems)"]


def merge_ranks(ranks: list[tuple[str, WrappedRun]]) -> WrappedRun:
    """One ``WrappedRun`` for a multi-container run from ``(node name, rank's run)`` pairs ordered by rank.

    Devices are keyed ``<node>/<device id>``; when ranks on one node measured the same device (the node's CPU)
    over overlapping windows it is counted once, from the widest view (the largest energy). Samples add up;
    steps, metrics and the measured window are rank 0's (data-parallel ranks step together). A profile's windows
    (one per swept limit) are merged the same way (they were dropped, so a multi-container profile on Kubernetes
    measured no point).
    """
    if not ranks:
        raise ValueError("ranks=[] is not allowed; give at least one rank's WrappedRun")
    if len(ranks) == 1:
        return ranks[0][1]
    first = ranks[0][1]
    started = min(r.started_at for _, r in ranks)
    ended = max(r.ended_at for _, r in ranks)
    devices: dict[str, Any] = {}
    notes = list(dict.fromkeys(n for _, r in ranks for n in r.notes))
    measured: dict[str, float] = {}
    for node, run in ranks:
        for device in run.devices:
            key = f"{node}/{device.device_id}"
            if key in devices:
                if device.energy_j > devices[key].energy_j:
                    devices[key] = device.model_copy(update={"device_id": key})
                notes.append(f"device {key} was measured by several ranks on one node: counted once")
            else:
                devices[key] = device.model_copy(update={"device_id": key})
        for dev, energy in run.measured_energy_j.items():
            key = f"{node}/{dev}"
            measured[key] = max(measured.get(key, 0.0), energy)
    duration_s = (ended - started).total_seconds()
    samples = sum(r.samples for _, r in ranks)
    windows = _merge_windows(ranks)
    notes.append(f"merged from {len(ranks)} ranks (Kubernetes Indexed Job)")
    return WrappedRun(
        job=first.job,
        config_key=first.config_key,
        started_at=started,
        ended_at=ended,
        duration_s=duration_s,
        exit_code=next((r.exit_code for _, r in ranks if r.exit_code != 0), 0),
        devices=list(devices.values()),
        steps=first.steps,
        samples=samples,
        throughput_samples_per_s=samples / duration_s if duration_s > 0 else 0.0,
        measured_window_s=first.measured_window_s,
        measured_samples=sum(r.measured_samples for _, r in ranks),
        measured_energy_j=measured,
        measured_energy_window_s=first.measured_energy_window_s,
        metrics=dict(first.metrics),
        power_limit_applied=all(r.power_limit_applied for _, r in ranks),
        power_limit_w=first.power_limit_w,
        windows=windows,
        notes=list(dict.fromkeys(notes)),
    )


def _merge_windows(ranks: list[tuple[str, WrappedRun]]) -> list[MeasuredWindow]:
    """A profile's windows (one per swept limit) over every rank: rank 0's window, samples added up, energy per
    ``<node>/<device>`` (a device two ranks on one node both measured counted once, the largest). Ranks sweep in
    step (the same limits in the same order); a limit some rank did not reach is left out."""
    first = ranks[0][1]
    merged: list[MeasuredWindow] = []
    for i, window in enumerate(first.windows):
        same = [(node, r.windows[i]) for node, r in ranks if len(r.windows) > i]
        if len(same) < len(ranks) or any(w.power_limit_w != window.power_limit_w for _, w in same):
            break
        energy: dict[str, float] = {}
        for node, w in same:
            for dev, joules in w.energy_j.items():
                energy[f"{node}/{dev}"] = max(energy.get(f"{node}/{dev}", 0.0), joules)
        merged.append(window.model_copy(update={"samples": sum(w.samples for _, w in same), "energy_j": energy}))
    return merged


def load_api_client(*, config_file: str | None = None, context: str | None = None, in_cluster: bool = False) -> Any:
    """A kubernetes ``ApiClient`` from a kubeconfig file (or the in-cluster service account)."""
    from kubernetes import client, config

    if in_cluster:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=config_file, context=context)


class KubernetesBackend:
    """Runs a plan as a Pod (one container) or an Indexed Job (several) and returns its ``RunResult``."""

    name = "kubernetes"
    supports_deferral = True
    """A pod or Job outlives the task that started it: the task defers while it trains (``start`` → a trigger
    polls the pod → ``collect``), holding no worker slot."""
    supports_shared = False
    """Pair profiles and co-located launches run on the local backend; on Kubernetes pairs come from history."""

    def __init__(
        self,
        settings: KubernetesSettings | None = None,
        *,
        config_file: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        api_client: Any | None = None,
        conn_id: str | None = None,
        poll_interval_s: float = 5.0,
        startup_timeout_s: float = 900.0,
        run_timeout_s: float | None = None,
        delete_grace_period_s: int | None = None,
        delete_wait_margin_s: float = 30.0,
        restore_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s={poll_interval_s} is not allowed; it must be > 0")
        self.settings = settings or KubernetesSettings()
        self.config_file = config_file
        self.context = context
        self.in_cluster = in_cluster
        if conn_id is not None and api_client is None:
            raise ValueError(
                f"conn_id={conn_id!r} names an Airflow connection, which only carbonflow's operators resolve: give "
                "the client made from it (api_client=, see carbonflow.operators.kubernetes), or a kubeconfig instead"
            )
        self.conn_id = conn_id
        self._api_client = api_client or load_api_client(
            config_file=config_file, context=context, in_cluster=in_cluster
        )
        self.poll_interval_s = poll_interval_s
        self.startup_timeout_s = startup_timeout_s
        self.run_timeout_s = run_timeout_s
        self.delete_grace_period_s = (
            delete_grace_period_s if delete_grace_period_s is not None else self.settings.termination_grace_period_s
        )
        self.delete_wait_margin_s = delete_wait_margin_s
        self.restore_timeout_s = restore_timeout_s
        self._nodes: dict[str, str] = {}
        self._clock = clock
        self._stop = threading.Event()
        self._current: KubernetesManifests | None = None
        self.builder = ManifestBuilder(self.settings)

    @classmethod
    def from_env(cls, **kwargs: Any) -> KubernetesBackend:
        """A backend configured from the environment, as an Airflow worker has it:
        ``$CARBONFLOW_K8S_SETTINGS`` (JSON :class:`KubernetesSettings`), in-cluster credentials when running in a
        pod (``$KUBERNETES_SERVICE_HOST``), else ``$KUBECONFIG`` / ``~/.kube/config`` and ``$CARBONFLOW_K8S_CONTEXT``.
        """
        import os

        from carbonflow.settings import k8s_context

        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")
        return cls(
            KubernetesSettings.from_env(),
            config_file=None if in_cluster else os.environ.get("KUBECONFIG"),
            context=k8s_context(),
            in_cluster=in_cluster,
            **kwargs,
        )

    # -- public ---------------------------------------------------------------------------------------------------

    def build(
        self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, *, result_key: str | None = None
    ) -> KubernetesManifests:
        """The validated objects ``execute`` would create (a dry run: nothing is sent to the cluster)."""
        options = options or RunOptions()
        if options.stop_above_energy_j is not None:
            raise ValueError(
                f"stop_above_energy_j={options.stop_above_energy_j:g} is not supported on the Kubernetes backend yet; "
                "leave it None (an energy budget is honoured by the local backend: supports_energy_budget)"
            )
        manifests = self.builder.build(
            spec, plan, profile_steps=options.profile_steps, warmup_steps=options.warmup_steps,
            sweep_limits_w=options.sweep_limits_w, stop_below_fraction=options.stop_below_fraction,
            result_key=result_key,
        )  # fmt: skip
        for obj in manifests.to_dicts():
            validate_manifest(obj)
        return manifests

    def run(
        self,
        spec: JobSpec,
        plan: Plan,
        intensity_points: list[ForecastPoint] | None = None,
        *,
        fallback_gco2_per_kwh: float | None = None,
    ) -> RunResult:
        """Launch, wait, read, delete, then account energy and emissions against ``intensity_points``."""
        from carbonflow.accounting.run import to_run_result

        wrapped = self.execute(spec, plan)
        return to_run_result(wrapped, plan, intensity_points, fallback_gco2_per_kwh=fallback_gco2_per_kwh)

    def execute(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, **fields: Any) -> WrappedRun:
        """Launch, wait, read the measurements, delete (the :class:`~carbonflow.execution.backend.Backend` contract's
        ``execute``, as ``LocalBackend.execute``: a :class:`RunOptions` or its fields as keywords).

        Raises :class:`KubernetesRunError` when no signed result came back. A profile sweeps
        ``options.sweep_limits_w`` in the pod as locally. ``trace`` is ignored: a power trace would stay inside the
        pod; emissions are spread over the run window instead. ``run_name`` only labels the log line.
        """
        options = run_options(options, fields)
        timeout_s, run_name = options.timeout_s, options.run_name
        key = new_result_key()
        manifests = self.build(spec, plan, options, result_key=key)
        log.info(
            "%s: running %s of %s on Kubernetes as %s %s",
            run_name,
            plan.config.key(),
            spec.name,
            manifests.kind,
            manifests.name,
        )
        deadline_s = timeout_s if timeout_s is not None else self.run_timeout_s
        self._current = manifests
        self._stop.clear()
        self._nodes = {}
        created: list[tuple[str, str]] = []
        try:
            self._create(manifests, created)
            if manifests.job is not None:
                pods = self._wait_job(manifests, deadline_s)
            else:
                pods = [self._wait_pod(manifests.namespace, manifests.pod.metadata.name, deadline_s)]
            wrapped = self._collect(manifests, pods, key)
        except BaseException as exc:
            for problem in self._stop_and_restore(manifests, created, spec if self._lowers_power(spec, plan) else None):
                exc.add_note(problem)
            raise
        finally:
            self._current = None
        return _with_notes(wrapped, self._clean_up(manifests, created))

    def _lowers_power(self, spec: JobSpec, plan: Plan) -> bool:
        from carbonflow.execution.k8s_manifests import uses_gpu

        return self.settings.power_agent == "zeusd" and uses_gpu(spec) and plan.config.power_limit_w is not None

    def _restore_power_limits(self, spec: JobSpec, namespace: str, pods_gone: bool = True) -> list[str]:
        """After a failed or killed run whose pods are gone: on every node a training pod ran on, replay its
        restore journals.

        The wrapper restores limits itself on every exit it lives through (including SIGTERM); this covers the
        ones it does not (SIGKILL after the grace period, OOM kill, node agent restarts). A pod with no journal
        left is a no-op. ``pods_gone=False`` (a pod still terminating after its grace period): no restore pod is
        started beside a wrapper that may still run; the problems say how to restore by hand once it is gone.
        Returns the problems (also logged CRITICAL), empty when every restore succeeded.
        """
        from kubernetes.client.exceptions import ApiException

        problems: list[str] = []
        if not pods_gone:
            for pod_name, node in sorted(self._nodes.items()):
                problems.append(f"no power-limit restore pod was started for {pod_name} on {node} while it may "
                                f"still run; once it is gone, {self._by_hand(pod_name, node)}")  # fmt: skip
            for problem in problems:
                log.critical(problem)
            return problems
        for pod_name, node in sorted(self._nodes.items()):
            restore = self.builder.restore_pod(spec, pod_name, node)
            validate_manifest(restore)
            name = restore.metadata.name
            try:
                self.core.create_namespaced_pod(namespace, restore)
                try:
                    done = self._wait_pod(namespace, name, self.restore_timeout_s, honour_stop=False)
                    terminated = self._termination(done)
                    if done.status.phase != "Succeeded":
                        code = terminated.exit_code if terminated else None
                        problems.append(
                            f"power-limit restore for {pod_name} on {node} failed (exit {code}): "
                            f"{self._log_tail(done, 20).strip()}; {self._by_hand(pod_name, node)}"
                        )
                    else:
                        log.info("power limits on %s checked/restored after %s", node, pod_name)
                finally:
                    try:
                        self.core.delete_namespaced_pod(name, namespace)
                    except ApiException as exc:
                        if exc.status != 404:
                            log.warning("could not delete restore pod %s: %s", name, exc.reason)
            except (ApiException, KubernetesRunError) as exc:
                by_hand = self._by_hand(pod_name, node)
                problems.append(f"power-limit restore for {pod_name} on {node} could not run: {exc}; {by_hand}")
        for problem in problems:
            log.critical("%s; GPU power limits on that node may still be lowered", problem)
        return problems

    def _by_hand(self, pod_name: str, node: str) -> str:
        s = self.settings
        return (
            f"put the limits back on {node} with: {POWER_JOURNAL_DIR_ENV}={s.pod_journal_host_dir(pod_name)} "
            f"{ZEUSD_SOCK_ENV}={s.zeusd_socket_path} {GPU_INDEX_MAP_ENV}={s.gpu_index_map_path} "
            "python -m carbonflow.energy.power_limit restore"
        )

    def _clean_up(self, run: Any, created: list[tuple[str, str]]) -> list[str]:
        """Delete what the run created (pods get the grace period) and wait until its pods and Job are gone.

        A deleted pod terminates over its grace period while its wrapper stops the training and restores the
        power limit; nothing may replay its journals, or call the run stopped, before it is gone. Returns what is
        still there after the grace period plus ``delete_wait_margin_s`` (also logged CRITICAL), else [].
        """
        if not created:
            return []
        self._delete(run, created)
        created.clear()
        left = self._wait_deleted(run)
        if not left:
            return []
        problem = (
            f"{', '.join(left)} of run {run.namespace}/{run.name} still there "
            f"{self._delete_wait_s():g} s after it was deleted (grace period "
            f"{self.delete_grace_period_s} s): its wrapper may still be running and holding a lowered power limit; "
            f"check with: kubectl -n {run.namespace} get pods -l {LABEL_RUN}={run.name} -o wide"
        )
        log.critical(problem)
        return [problem]

    def _wait_deleted(self, run: Any) -> list[str]:
        """Wait until no pod labelled with the run (terminating ones included) and no Job of it is left; returns
        what is left at the deadline (real time: the grace period runs on the cluster's clock, not ours)."""
        deadline = time.monotonic() + self._delete_wait_s()
        while True:
            left = self._left(run)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(self.poll_interval_s)

    def _delete_wait_s(self) -> float:
        """How long deleted pods may take: the longer of the deletion's and the pods' own grace period (a Job's
        pods are deleted with their own), plus the margin."""
        return max(self.delete_grace_period_s, self.settings.termination_grace_period_s) + self.delete_wait_margin_s

    def _left(self, run: Any) -> list[str]:
        """The run's pods and Job that still exist (a pod being deleted says so)."""
        from kubernetes.client.exceptions import ApiException

        left: list[str] = []
        try:
            pods = self.core.list_namespaced_pod(run.namespace, label_selector=f"{LABEL_RUN}={run.name}").items
            for pod in pods:
                terminating = " (terminating)" if pod.metadata.deletion_timestamp else ""
                left.append(f"Pod {pod.metadata.name}{terminating}")
            if run.kind == "Job":
                try:
                    self.batch.read_namespaced_job(_job_name(run), run.namespace)
                    left.append(f"Job {_job_name(run)}")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        except Exception as exc:  # the API cannot say: nothing is known to be gone
            left.append(f"(the API could not be asked: {type(exc).__name__}: {exc})")
        return left

    def kill(self) -> None:
        """``LocalBackend.kill`` counterpart (Airflow ``on_kill``)."""
        self.stop()

    def stop(self) -> None:
        """Stop the current run (Airflow ``on_kill``): delete its pods with a grace period for the wrapper."""
        self._stop.set()
        manifests = self._current
        if manifests is not None:
            self._note_nodes_now(manifests)
            kinds = [("Job", manifests.job.metadata.name)] if manifests.job is not None else []
            if manifests.pod is not None:
                kinds.append(("Pod", manifests.pod.metadata.name))
            self._delete(manifests, kinds)

    # -- the backend contract (start → handle, poll, collect, cancel) ---------------------------------------------

    def rebuild_options(self) -> dict[str, Any]:
        """What another process (the triggerer) needs to rebuild this backend: the settings and how to reach the
        cluster, never credentials. With an Airflow connection (``conn_id``: the client came from the provider's
        ``KubernetesHook``) that is the connection's id and any overrides the operator gave; otherwise a kubeconfig
        path or in-cluster, for :func:`~carbonflow.execution.backend.make_backend`."""
        reach: dict[str, Any] = dict(config_file=self.config_file, context=self.context, in_cluster=self.in_cluster)
        if self.conn_id is not None:
            reach = {"conn_id": self.conn_id, **{k: v for k, v in reach.items() if v}}
        return {**self.settings.model_dump(mode="json"), **reach}

    def start(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None) -> RunHandle:
        """Create the run's objects and return at once with a :class:`RunHandle` (JSON: another process polls,
        collects or cancels the run from it, e.g. after the Airflow task deferred). The handle holds the run's
        result key: whoever collects verifies the wrapper's signature with it."""
        key = new_result_key()
        manifests = self.build(spec, plan, options, result_key=key)
        created: list[tuple[str, str]] = []
        try:
            self._create(manifests, created)
        except BaseException as exc:
            for problem in self._clean_up(manifests, created):
                exc.add_note(problem)
            raise
        log.info("started %s of %s on Kubernetes as %s %s", plan.config.key(), spec.name, manifests.kind,
                 manifests.name)  # fmt: skip
        return RunHandle(
            backend=self.name, run_id=manifests.name, kind="solo", jobs=[spec.name],
            details={"namespace": manifests.namespace, "name": manifests.name, "kind": manifests.kind,
                     "pod": manifests.pod.metadata.name if manifests.pod is not None else "",
                     "job": manifests.job.metadata.name if manifests.job is not None else "",
                     "created": json.dumps(created), "spec": _without_env(spec),
                     "lowers_power": "true" if self._lowers_power(spec, plan) else "false", "result_key": key},
        )  # fmt: skip

    def start_shared(self, request: SharedRequest, options: RunOptions | None = None) -> RunHandle:
        """Not on Kubernetes (``supports_shared`` is False): a co-located pair runs as one pod per job on a
        time-sliced GPU (:meth:`start` each), and pair profiles run on the local backend."""
        names = "+".join(m.job.name for m in request.members)
        raise NotImplementedError(
            f"the kubernetes backend does not run the pair {names} in one wrapper (supports_shared=False); start "
            "each job as its own pod on the time-sliced GPU, or profile the pair with backend='local'"
        )

    def poll(self, handle: RunHandle) -> RunStatus:
        """Whether the run's pod (or every rank of its Job) has ended, without waiting: the one rule
        (:meth:`_pod_seen`, :meth:`_job_seen`) that ``execute`` waits on too."""
        d = handle.details
        if d["pod"]:
            seen = self._pod_seen(self._read_or_gone(self.core.read_namespaced_pod, "Pod", d["pod"], d["namespace"]))
        else:
            job = self._read_or_gone(self.batch.read_namespaced_job, "Job", d["job"], d["namespace"])
            seen = self._job_seen(job, self._pods_of(d["namespace"], d["name"]))
        return RunStatus(state=seen.state, message=seen.cannot_start or seen.message)

    def collect(self, handle: RunHandle) -> WrappedRun:
        """The finished run's measurements (every rank merged); deletes its objects, restoring limits on failure."""
        d = handle.details
        run = _RunRef.of(handle)
        created = [tuple(x) for x in json.loads(d["created"])]
        try:
            if d["pod"]:
                pods = [self._read_or_gone(self.core.read_namespaced_pod, "Pod", d["pod"], d["namespace"])]
            else:
                pods = self._by_rank(self._pods_of(d["namespace"], d["name"]))
            for pod in pods:
                self._note_node(pod)
                fatal = self._fatal_waiting(pod)
                if fatal:
                    raise KubernetesRunError(f"Pod {d['namespace']}/{pod.metadata.name} cannot start: {fatal}")
            wrapped = self._collect(run, pods, d.get("result_key", ""))  # type: ignore[arg-type]
        except BaseException as exc:
            for problem in self._stop_and_restore(run, created, _power_spec(handle)):
                exc.add_note(problem)
            raise
        return _with_notes(wrapped, self._clean_up(run, created))

    def cancel(self, handle: RunHandle) -> None:
        """Stop the run: delete its pods (the wrapper restores limits in its grace period), wait until they are
        gone, then replay whatever journals a wrapper left. Raises :class:`KubernetesRunError` naming what is
        still there, or what could not be restored, after doing all it can."""
        run = _RunRef.of(handle)
        self._note_nodes_now(run)  # type: ignore[arg-type]
        created = [tuple(x) for x in json.loads(handle.details["created"])]
        problems = self._stop_and_restore(run, created, _power_spec(handle))
        if problems:
            raise KubernetesRunError(f"cancelling {run.kind} {run.namespace}/{run.name}: " + "; ".join(problems))

    def _stop_and_restore(self, run: Any, created: list[tuple[str, str]], lowered: JobSpec | None) -> list[str]:
        """Delete the run and wait until its pods are gone (their wrappers done); then, for a run that lowered
        power limits (``lowered``: its job), replay its journals — never beside a pod still terminating."""
        problems = self._clean_up(run, created)
        if lowered is not None:
            problems += self._restore_power_limits(lowered, run.namespace, pods_gone=not problems)
        return problems

    # -- API calls ------------------------------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api_client)

    @property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self._api_client)

    def _create(self, manifests: KubernetesManifests, created: list[tuple[str, str]]) -> None:
        ns = manifests.namespace
        self.core.create_namespaced_config_map(ns, manifests.config_map)
        created.append(("ConfigMap", manifests.config_map.metadata.name))
        if manifests.service is not None:
            self.core.create_namespaced_service(ns, manifests.service)
            created.append(("Service", manifests.service.metadata.name))
        if manifests.job is not None:
            self.batch.create_namespaced_job(ns, manifests.job)
            created.append(("Job", manifests.job.metadata.name))
            log.info("created Job %s/%s (%s ranks)", ns, manifests.job.metadata.name, manifests.job.spec.completions)
        if manifests.pod is not None:
            self.core.create_namespaced_pod(ns, manifests.pod)
            created.append(("Pod", manifests.pod.metadata.name))
            log.info("created Pod %s/%s", ns, manifests.pod.metadata.name)

    def _delete(self, manifests: KubernetesManifests, created: list[tuple[str, str]]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        ns = manifests.namespace
        body = client.V1DeleteOptions(grace_period_seconds=self.delete_grace_period_s, propagation_policy="Foreground")
        calls = {
            "Pod": self.core.delete_namespaced_pod,
            "Job": self.batch.delete_namespaced_job,
            "Service": self.core.delete_namespaced_service,
            "ConfigMap": self.core.delete_namespaced_config_map,
        }
        for kind, name in reversed(created):
            try:
                calls[kind](name, ns, body=body)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not delete %s %s/%s: %s", kind, ns, name, exc.reason)

    def _deadline_check(
        self, started: float, phase: str | None, what: str, run_timeout_s: float | None, honour_stop: bool = True
    ) -> None:
        elapsed = self._clock() - started
        if honour_stop and self._stop.is_set():
            raise KubernetesRunError(f"{what}: stopped (on_kill) after {elapsed:.0f} s")
        if phase in (None, "Pending") and elapsed > self.startup_timeout_s:
            raise KubernetesRunError(
                f"{what} still {phase or 'not scheduled'} after {elapsed:.0f} s (startup_timeout_s="
                f"{self.startup_timeout_s:g}); check GPU capacity, node selector and tolerations"
            )
        if run_timeout_s is not None and elapsed > run_timeout_s:
            raise KubernetesRunError(f"{what} exceeded its timeout of {run_timeout_s:g} s")

    def _fatal_waiting(self, pod: Any) -> str | None:
        for status in (pod.status.container_statuses or []) if pod.status else []:
            waiting = status.state.waiting if status.state else None
            if waiting is not None and waiting.reason in FATAL_WAITING_REASONS:
                return f"{waiting.reason}: {waiting.message or ''}".strip()
        return None

    def _read_or_gone(self, read: Callable[..., Any], kind: str, name: str, namespace: str) -> Any:
        """Read an object; a 404 means it was deleted under us (``stop()``, eviction, a user's kubectl)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return read(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            why = "stopped (on_kill)" if self._stop.is_set() else "deleted while running (evicted or removed)"
            raise KubernetesRunError(f"{kind} {namespace}/{name}: {why}") from None

    def _wait_pod(self, namespace: str, name: str, run_timeout_s: float | None, honour_stop: bool = True) -> Any:
        started = self._clock()
        while True:
            pod = self._read_or_gone(self.core.read_namespaced_pod, "Pod", name, namespace)
            self._note_node(pod)
            seen = self._pod_seen(pod)
            if seen.cannot_start:
                raise KubernetesRunError(f"Pod {namespace}/{name} cannot start: {seen.cannot_start}")
            if seen.state == "finished":
                return pod
            phase = pod.status.phase if pod.status else None
            self._deadline_check(started, phase, f"Pod {namespace}/{name}", run_timeout_s, honour_stop)
            if honour_stop:
                self._stop.wait(self.poll_interval_s)
            else:
                time.sleep(self.poll_interval_s)

    def _pod_seen(self, pod: Any) -> _Seen:
        """Whether a pod has ended: Succeeded or Failed, or waiting for a reason it cannot recover from."""
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            return _Seen("finished", phase)
        fatal = self._fatal_waiting(pod)
        if fatal:
            return _Seen("finished", fatal, cannot_start=fatal)
        return _Seen("running" if phase == "Running" else "pending", phase or "")

    def _job_seen(self, job: Any, pods: list[Any]) -> _Seen:
        """Whether an Indexed Job has ended: Complete (or every rank succeeded) or Failed, or one of its pods
        cannot start."""
        status = job.status
        conditions = {c.type: c.status for c in (status.conditions or [])} if status else {}
        completions = job.spec.completions if job.spec else None
        if conditions.get("Failed") == "True":
            return _Seen("finished", "Failed")
        if conditions.get("Complete") == "True" or (completions and status and (status.succeeded or 0) >= completions):
            return _Seen("finished", "Complete")
        for pod in pods:
            fatal = self._fatal_waiting(pod)
            if fatal:
                return _Seen("finished", fatal, cannot_start=f"pod {pod.metadata.name} cannot start: {fatal}")
        running = bool(status and (status.active or 0) > 0) and any(
            p.status and p.status.phase == "Running" for p in pods
        )
        return _Seen("running" if running else "pending")

    def _pods_of(self, namespace: str, run_name: str) -> list[Any]:
        return self.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_RUN}={run_name}").items

    def _note_nodes_now(self, manifests: KubernetesManifests) -> None:
        """Read where the run's pods are before deleting them (a pod deleted unseen still gets its restore)."""
        try:
            selector = f"{LABEL_RUN}={manifests.name}"
            for pod in self.core.list_namespaced_pod(manifests.namespace, label_selector=selector).items:
                self._note_node(pod)
        except Exception as exc:  # best effort: the deletion below matters more
            log.warning("could not list the pods of %s before stopping it: %s", manifests.name, exc)

    def _note_node(self, pod: Any) -> None:
        """Remember where each training pod ran (for the power-limit restore after a failure)."""
        node = pod.spec.node_name if pod.spec else None
        labels = pod.metadata.labels or {}
        if node and "carbonflow.io/restores" not in labels:
            self._nodes[pod.metadata.name] = node

    def _wait_job(self, manifests: KubernetesManifests, run_timeout_s: float | None) -> list[Any]:
        ns, name = manifests.namespace, manifests.job.metadata.name
        started = self._clock()
        while True:
            job = self._read_or_gone(self.batch.read_namespaced_job, "Job", name, ns)
            pods = self._pods_of(ns, manifests.name)
            for pod in pods:
                self._note_node(pod)
            seen = self._job_seen(job, pods)
            if seen.cannot_start:
                raise KubernetesRunError(f"Job {ns}/{name}: {seen.cannot_start}")
            if seen.state == "finished":
                return self._by_rank(pods)
            phase = "Running" if seen.state == "running" else "Pending"
            self._deadline_check(started, phase, f"Job {ns}/{name}", run_timeout_s)
            self._stop.wait(self.poll_interval_s)

    @staticmethod
    def _by_rank(pods: list[Any]) -> list[Any]:
        def rank(pod: Any) -> int:
            annotations = pod.metadata.annotations or {}
            return int(annotations.get(COMPLETION_INDEX_ANNOTATION, "0"))

        latest: dict[int, Any] = {}
        for pod in pods:  # a retried rank has several pods; keep the one that terminated last
            r = rank(pod)
            if r not in latest or (pod.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)) >= (
                latest[r].metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)
            ):
                latest[r] = pod
        return [latest[r] for r in sorted(latest)]

    @staticmethod
    def _no_result(pod: Any, terminated: Any | None, refused: list[str], log_text: str | None) -> str:
        """Why a pod gave no result: its end, the results refused (unsigned: the training's), its log's tail."""
        exit_code = terminated.exit_code if terminated else None
        reason = terminated.reason if terminated else (pod.status.reason if pod.status else None)
        tail = "\n".join((log_text or "").splitlines()[-20:])
        why = f"; {len(refused)} result(s) refused, the first: {refused[0]}" if refused else ""
        return (
            f"Pod {pod.metadata.namespace}/{pod.metadata.name} ended phase={pod.status.phase} exit_code={exit_code} "
            f"reason={reason} without a result signed by its wrapper{why}; last log lines:\n{tail}"
        )

    def _termination(self, pod: Any) -> Any | None:
        for status in (pod.status.container_statuses or []) if pod.status else []:
            if status.name == CONTAINER_NAME and status.state and status.state.terminated:
                return status.state.terminated
        return None

    def _log_tail(self, pod: Any, lines: int = 200) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            # _preload_content=False: the client would otherwise return str(bytes) for some responses.
            response = self.core.read_namespaced_pod_log(
                pod.metadata.name,
                pod.metadata.namespace,
                container=CONTAINER_NAME,
                tail_lines=lines,
                _preload_content=False,
            )
            return response.data.decode("utf-8", errors="replace")
        except ApiException as exc:
            return f"(log unavailable: {exc.status} {exc.reason})"

    def _collect(self, manifests: KubernetesManifests, pods: list[Any], key: str) -> WrappedRun:
        if not pods:
            raise KubernetesRunError(f"{manifests.kind} {manifests.namespace}/{manifests.name}: no pod ran")
        if not key:
            raise KubernetesRunError(f"{manifests.kind} {manifests.namespace}/{manifests.name}: the run has no "
                                     f"result key (a handle from an older carbonflow?); {NOT_SIGNED}")  # fmt: skip
        ranks: list[tuple[str, WrappedRun]] = []
        for pod in pods:
            terminated = self._termination(pod)
            result, refused = parse_signed_result(terminated.message if terminated else None, key)
            log_text = None
            if result is None:  # no message, or a truncated one: the wrapper's signed line in the log
                log_text = self._log_tail(pod)
                result, refused_in_log = parse_signed_result(log_text, key)
                refused += refused_in_log
            if result is None:
                raise KubernetesRunError(self._no_result(pod, terminated, refused, log_text))
            if terminated is not None and terminated.exit_code and result.exit_code == 0:
                result = result.model_copy(update={"exit_code": terminated.exit_code})
            node = (pod.spec.node_name if pod.spec else None) or pod.metadata.name
            ranks.append((node, result))
        merged = merge_ranks(ranks)
        note = f"ran on Kubernetes as {manifests.kind} {manifests.namespace}/{manifests.name}"
        return merged.model_copy(update={"notes": [*merged.notes, note]})


@dataclass(frozen=True)
class _Seen:
    """One look at a run (the one rule for a pod or a Job, whether waited on here or polled by a trigger)."""

    state: str  # pending, running or finished
    message: str = ""
    cannot_start: str | None = None  # finished without starting: why (an image that cannot be pulled, …)


@dataclass(frozen=True)
class _RunRef:
    """What cleaning up and collecting a run needs of its manifests, rebuilt from a handle."""

    name: str
    namespace: str
    kind: str
    job_name: str = ""

    @classmethod
    def of(cls, handle: Any) -> _RunRef:
        d = handle.details
        return cls(name=d["name"], namespace=d["namespace"], kind=d["kind"], job_name=d["job"])


def _job_name(run: Any) -> str:
    """The run's Job's name (from its manifests, or from its handle)."""
    job = getattr(run, "job", None)
    return job.metadata.name if job is not None else run.job_name


def _power_spec(handle: Any) -> JobSpec | None:
    """The job of a run that lowered power limits (its journals may need replaying), else None."""
    if handle.details.get("lowers_power") != "true":
        return None
    return JobSpec.model_validate_json(handle.details["spec"])


def _without_env(spec: JobSpec) -> str:
    """The job as a handle keeps it (for a restore after the run): without its ``env``, which may hold a connection's
    secret resolved at launch; a handle is stored where the pod's spec is not (a deferred task's trigger, in
    Airflow's metadata DB)."""
    return spec.model_copy(update={"env": {}}).model_dump_json()


def _with_notes(wrapped: WrappedRun, problems: list[str]) -> WrappedRun:
    """The run's result, with what its clean-up could not do added to its notes."""
    if not problems:
        return wrapped
    return wrapped.model_copy(update={"notes": [*wrapped.notes, *problems]})
