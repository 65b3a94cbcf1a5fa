"""A FAKE Kubernetes API server (tests only): a local stand-in for the few API calls carbonflow makes, because
no cluster can run here.

It is a real HTTP server speaking the API server's JSON: the kubernetes python client (and the cncf-kubernetes
provider's async hook) talk to it through a kubeconfig, exactly as to a cluster. It implements create / read /
delete of namespaced ConfigMaps, Services, Pods and Jobs, listing pods by label selector, and reading pod logs.
Created objects are validated against the Kubernetes schema (kubernetes-validate), as admission would, and
rejected with 422 when invalid.

**Kubelet model.** Pods move through Pending → Running → Succeeded/Failed, one step per read, and "run" each
container through a test-supplied behaviour that receives the container's resolved environment (including
downward-API ``fieldRef`` values), the mounted ConfigMap files and the host directories mounted into it, as a
container would see them. A behaviour returns a scripted :class:`ContainerOutcome`, or one carrying a
:class:`LiveContainer` (e.g. a real process, see ``fake_gpu_node.py``) whose own exit ends the pod.

**Deletion, as a cluster does it** (the part that matters for power limits):

* A pod that is not scheduled, or already Succeeded/Failed, is removed at once (the API server's rule).
* A scheduled pod whose container runs is *terminating*: ``metadata.deletionTimestamp`` and
  ``metadata.deletionGracePeriodSeconds`` are set, its phase stays ``Running``, and it stays readable and
  listable. Its container is told SIGTERM (``ContainerOutcome.on_signal`` / ``LiveContainer.signal``); it
  exits ``stop_s`` later (the wrapper restoring power limits), or, when still running at the end of the grace
  period, gets SIGKILL (exit 137). Only then is the pod removed. The grace period is the request's
  ``gracePeriodSeconds``, else the pod's ``spec.terminationGracePeriodSeconds``, else 30 s; simulated seconds
  pass ``time_scale`` times faster than real ones (default 0.01: a 60 s grace period lasts 0.6 s).
* Jobs: ``propagationPolicy: Foreground`` keeps the Job (``deletionTimestamp``, finalizer
  ``foregroundDeletion``) until the garbage collector has deleted its pods — each with its own grace period —
  and they are gone; ``Background`` removes the Job at once and deletes its pods after; ``Orphan`` (the
  default for ``batch/v1`` Jobs through the API) leaves the pods running.
* ``kubelet_running = False`` plays a node whose kubelet no longer answers: its terminating pods never go.

The Indexed Job controller creates one pod per completion index with the ``batch.kubernetes.io/job-completion-index``
annotation and the ``JOB_COMPLETION_INDEX`` variable. A background thread (the kubelet and the garbage
collector) advances terminations in real time; every request does too.
"""

from __future__ import annotations

import copy
import json
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

SCHEMA_VERSION = "1.37.0"
DEFAULT_GRACE_PERIOD_S = 30  # the API's default terminationGracePeriodSeconds
RESTORE_LABEL = "carbonflow.io/restores"


class LiveContainer(Protocol):
    """A container that runs for real (a process): the fake kubelet polls it and signals it."""

    def poll(self) -> int | None:
        """The exit code once the container's main process ended (128 + N for a death by signal N), else None."""

    def signal(self, sig: int) -> None:
        """SIGTERM goes to the container's main process; SIGKILL to every process of the container."""

    def log(self) -> str: ...

    def termination_message(self) -> str: ...


@dataclass
class ContainerOutcome:
    """What a container does: exit code, termination message, log, and how long it stays in each phase."""

    exit_code: int = 0
    termination_message: str = ""
    log: str = ""
    pending_reads: int = 1
    running_reads: int = 1
    waiting_reason: str | None = None  # e.g. ErrImagePull: the pod stays Pending with this reason
    reason: str | None = None  # the terminated state's reason; default Completed / Error
    stop_s: float | None = 5.0
    """Simulated seconds from SIGTERM to exit (e.g. the wrapper restoring limits); None: it ignores SIGTERM."""
    on_signal: Callable[[int], None] | None = None
    """Told SIGTERM when its pod is deleted and SIGKILL when the grace period is over (or the kernel kills it)."""
    live: LiveContainer | None = None
    """A real container: it runs until it exits by itself or by a signal; the scripted fields above are unused."""


@dataclass
class ContainerView:
    """What the container sees when it starts."""

    pod: dict[str, Any]
    env: dict[str, str]
    files: dict[str, str]  # mount path/file → content (from ConfigMap volumes); hostPath mounts as "<hostPath …>"
    args: list[str]
    command: list[str]
    host_paths: dict[str, str] = field(default_factory=dict)  # mount path → host path (subPath resolved)
    read_only: set[str] = field(default_factory=set)  # mount paths mounted read-only


Behaviour = Callable[[ContainerView], ContainerOutcome]

_PATHS = [
    (
        re.compile(
            r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|pods)(?:/(?P<name>[^/]+))?"
            r"(?:/(?P<sub>log|status))?$"
        ),
        "v1",
    ),
    (
        re.compile(
            r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>jobs)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
        ),
        "batch/v1",
    ),
]
_KIND = {"configmaps": "ConfigMap", "services": "Service", "pods": "Pod", "jobs": "Job"}
_TERMINAL = ("Succeeded", "Failed")


def _now(plus_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=plus_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class _Terminating:
    """A pod being deleted gracefully: when its container exits by itself, and when it gets SIGKILL."""

    grace_s: float
    kill_at: float  # time.monotonic()
    exit_at: float | None  # scripted containers: when they exit after SIGTERM


class FakeKubeApi:
    """The fake API server; use as a context manager, then :meth:`write_kubeconfig`.

    ``time_scale``: real seconds per simulated second for grace periods and ``stop_s``. ``grace_period_s``
    overrides every grace period (simulated seconds) when set.
    """

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        node_for: Callable[[dict[str, Any]], str] | None = None,
        *,
        time_scale: float = 0.01,
        grace_period_s: float | None = None,
        sync_interval_s: float = 0.01,
    ) -> None:
        self.behaviour = behaviour or (lambda view: ContainerOutcome())
        self.node_for = node_for or (lambda pod: "gpu-node-a")  # the scheduler's choice
        # Restore pods (label carbonflow.io/restores) run this instead; every one is recorded in ``restores``.
        self.restore_behaviour: Behaviour = lambda view: ContainerOutcome(log="restored\n", pending_reads=0)
        self.restores: list[ContainerView] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) → object
        self.requests: list[tuple[str, str]] = []  # (method, path) in order
        self.deleted: list[tuple[str, str, str, dict[str, Any]]] = []  # kind, ns, name, delete options
        self.outcomes: dict[str, ContainerOutcome] = {}
        self.reads: dict[str, int] = {}
        self.signals: list[tuple[str, int]] = []  # (pod name, signal) as the kubelet sent them
        self.events: list[tuple[float, str, str, str]] = []  # (monotonic time, what, kind, name)
        self.time_scale = time_scale
        self.grace_period_s = grace_period_s
        self.kubelet_running = True
        self.lock = threading.RLock()
        self._terminating: dict[str, _Terminating] = {}
        self._killed: dict[str, tuple[int, str]] = {}
        self._sync_interval_s = sync_interval_s
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._kubelet: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> FakeKubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_GET(self) -> None:
                self._send(*api.handle("GET", self.path, None))

            def do_POST(self) -> None:
                self._send(*api.handle("POST", self.path, self._body()))

            def do_DELETE(self) -> None:
                self._send(*api.handle("DELETE", self.path, self._body()))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._kubelet = threading.Thread(target=self._kubelet_loop, daemon=True)
        self._kubelet.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._stopping.set()
        if self._kubelet is not None:
            self._kubelet.join(5)
        self._server.shutdown()
        self._server.server_close()
        with self.lock:  # a cluster torn down: every container still running is killed
            for outcome in self.outcomes.values():
                if outcome.live is not None and outcome.live.poll() is None:
                    outcome.live.signal(signal.SIGKILL)

    def _kubelet_loop(self) -> None:
        while not self._stopping.wait(self._sync_interval_s):
            with self.lock:
                self._sync()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def live(self, kind: str) -> list[dict[str, Any]]:
        """The objects of ``kind`` that exist (terminating ones included, as ``kubectl get`` shows them)."""
        with self.lock:
            self._sync()
            return [o for (k, _, _), o in self.objects.items() if k == kind]

    def terminating(self) -> list[str]:
        """Names of the pods being deleted that are still there."""
        with self.lock:
            self._sync()
            return sorted(self._terminating)

    def when(self, what: str, name: str, kind: str = "Pod") -> float | None:
        """When (time.monotonic) ``what`` ("created", "sigterm", "sigkill", "removed") first happened to the
        object ``kind``/``name`` (a run's ConfigMap is named like its pod)."""
        with self.lock:
            return next((t for t, w, k, n in self.events if w == what and k == kind and n == name), None)

    def kill_container(self, name: str, sig: int = signal.SIGKILL, reason: str = "OOMKilled") -> None:
        """The kernel kills a pod's container (the OOM killer): no deletion, the pod fails with ``reason``."""
        with self.lock:
            self._signal(name, sig)
            self._killed[name] = (128 + sig, reason)

    # -- request handling ---------------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: dict[str, Any] | None) -> tuple[int, Any] | tuple[int, Any, str]:
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self._sync()
            self.requests.append((method, url.path))
            found = next(((p.match(url.path), v) for p, v in _PATHS if p.match(url.path)), None)
            if found is None:
                return 404, _status(404, "NotFound", f"the server could not find the requested resource {url.path}")
            m, api_version = found
            ns, kind, name, sub = m["ns"], _KIND[m["kind"]], m["name"], m["sub"]
            if method == "POST" and name is None:
                return self._create(kind, api_version, ns, body or {})
            if method == "GET" and name is None and kind == "Pod":
                return 200, self._list_pods(ns, query.get("labelSelector"))
            if name is None:
                return 405, _status(405, "MethodNotAllowed", f"{method} {url.path}")
            key = (kind, ns, name)
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'{m["kind"]} "{name}" not found')
            if method == "GET" and sub == "log":
                return self._log(name, query)
            if method == "GET":
                self._tick(kind, ns, name)
                if key not in self.objects:  # removed by this very step (a terminating pod's container exited)
                    return 404, _status(404, "NotFound", f'{m["kind"]} "{name}" not found')
                return 200, self.objects[key]
            if method == "DELETE":
                options = dict(body or {})
                for q in ("gracePeriodSeconds", "propagationPolicy"):
                    if q in query and q not in options:
                        options[q] = int(query[q]) if q == "gracePeriodSeconds" else query[q]
                return self._delete(kind, ns, name, options)
            return 405, _status(405, "MethodNotAllowed", f"{method} {url.path}")

    def _create(self, kind: str, api_version: str, ns: str, body: dict[str, Any]) -> tuple[int, Any]:
        body.setdefault("apiVersion", api_version)
        body.setdefault("kind", kind)
        if body["kind"] != kind:
            return 400, _status(400, "BadRequest", f"kind {body['kind']} posted to {kind} collection")
        try:
            kubernetes_validate.validate(body, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return 422, _status(422, "Invalid", f"{kind} is invalid: {exc.message} at {list(exc.path)}")
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            return 422, _status(422, "Invalid", "metadata.name: Required value")
        if meta.get("namespace", ns) != ns:
            return 400, _status(400, "BadRequest", "the namespace of the object does not match the request")
        if (kind, ns, name) in self.objects:
            return 409, _status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1")
        if kind == "Pod":
            self._admit_pod(body)
        elif kind == "Job":
            self._start_job(body)
        self.objects[(kind, ns, name)] = body
        self.events.append((time.monotonic(), "created", kind, name))
        return 201, body

    # -- pods (kubelet model) -------------------------------------------------------------------------------------

    def _admit_pod(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        pod["status"] = {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                }
            ],
        }
        self.reads[pod["metadata"]["name"]] = 0

    def _view(self, pod: dict[str, Any]) -> ContainerView | None:
        """The container's environment and files, or None while a mounted ConfigMap is missing."""
        ns = pod["metadata"]["namespace"]
        container = pod["spec"]["containers"][0]
        env: dict[str, str] = {}
        for var in container.get("env") or []:  # later definitions win, as in a container
            if "value" in var:
                env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
            elif "fieldRef" in var.get("valueFrom", {}):
                env[var["name"]] = self._field(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        files: dict[str, str] = {}
        host_paths: dict[str, str] = {}
        read_only: set[str] = set()
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if mount.get("readOnly"):
                read_only.add(mount["mountPath"])
            if "configMap" in volume:
                cm = self.objects.get(("ConfigMap", ns, volume["configMap"]["name"]))
                if cm is None:
                    return None
                for key, value in (cm.get("data") or {}).items():
                    files[f"{mount['mountPath'].rstrip('/')}/{key}"] = value
            elif "hostPath" in volume:
                path = volume["hostPath"]["path"].rstrip("/")
                sub = mount.get("subPath") or re.sub(
                    r"\$\((\w+)\)", lambda m: env.get(m[1], ""), mount.get("subPathExpr") or ""
                )
                if sub:
                    path = f"{path}/{sub}"
                files[mount["mountPath"]] = f"<hostPath {path}>"
                host_paths[mount["mountPath"]] = path
        return ContainerView(
            pod=copy.deepcopy(pod),
            env=env,
            files=files,
            args=list(container.get("args") or []),
            command=list(container.get("command") or []),
            host_paths=host_paths,
            read_only=read_only,
        )

    @staticmethod
    def _field(pod: dict[str, Any], path: str) -> str:
        m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
        if m:
            return (pod["metadata"].get(m[1]) or {}).get(m[2], "")
        if path in ("metadata.name", "metadata.namespace"):
            return pod["metadata"][path.split(".")[1]]
        if path == "spec.nodeName":
            return pod["spec"].get("nodeName", "fake-node")
        raise ValueError(f"fieldRef {path} not supported by the fake")

    def _tick(self, kind: str, ns: str, name: str) -> None:
        if kind == "Pod":
            self._advance_pod(self.objects[(kind, ns, name)])
        elif kind == "Job":
            job = self.objects[(kind, ns, name)]
            for pod in self._job_pods(job):
                self._advance_pod(pod)
            self._update_job(job)
        self._sync()

    def _advance_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        phase = pod["status"]["phase"]
        if phase in _TERMINAL:
            return
        cstatus = pod["status"]["containerStatuses"][0]
        if name not in self.outcomes:
            if name in self._terminating:  # deleted before its container was created
                return
            pod["spec"].setdefault("nodeName", self.node_for(pod))  # pods with spec.nodeName skip the scheduler
            view = self._view(pod)
            if view is None:  # FailedMount: stays ContainerCreating
                return
            if RESTORE_LABEL in (pod["metadata"].get("labels") or {}):
                self.restores.append(view)
                self.outcomes[name] = self.restore_behaviour(view)
            else:
                self.outcomes[name] = self.behaviour(view)
        outcome = self.outcomes[name]
        self.reads[name] += 1
        n = self.reads[name]
        if outcome.waiting_reason:
            cstatus["state"] = {"waiting": {"reason": outcome.waiting_reason, "message": "fake: cannot start"}}
            return
        if name in self._killed:
            code, reason = self._killed[name]
            if outcome.live is None or outcome.live.poll() is not None:
                self._finish_container(pod, code, reason)
            return
        if n <= outcome.pending_reads:
            return
        if outcome.live is not None:
            code = outcome.live.poll()
            if code is None:
                self._set_running(pod)
            else:
                self._finish_container(pod, code)
            return
        if name in self._terminating:  # told SIGTERM: a scripted container no longer follows its script
            return
        if n <= outcome.pending_reads + outcome.running_reads:
            self._set_running(pod)
            return
        self._finish_container(pod, outcome.exit_code)

    @staticmethod
    def _set_running(pod: dict[str, Any]) -> None:
        cstatus = pod["status"]["containerStatuses"][0]
        pod["status"]["phase"] = "Running"
        pod["status"]["startTime"] = pod["status"].get("startTime", _now())
        if "running" not in cstatus["state"]:
            cstatus["state"] = {"running": {"startedAt": _now()}}
        cstatus["ready"] = True

    def _finish_container(self, pod: dict[str, Any], exit_code: int, reason: str | None = None) -> None:
        name = pod["metadata"]["name"]
        outcome = self.outcomes.get(name) or ContainerOutcome(exit_code=exit_code)
        cstatus = pod["status"]["containerStatuses"][0]
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason or outcome.reason or ("Completed" if exit_code == 0 else "Error"),
            "finishedAt": _now(),
        }
        log = outcome.live.log() if outcome.live is not None else outcome.log
        message = outcome.live.termination_message() if outcome.live is not None else outcome.termination_message
        message = message[:4096]  # the kubelet keeps at most 4096 bytes
        container = pod["spec"]["containers"][0]
        if not message and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = "\n".join(log.splitlines()[-80:])[-2048:]
        if message:
            terminated["message"] = message
        cstatus["state"] = {"terminated": terminated}
        cstatus["ready"] = False

    def _running(self, pod: dict[str, Any]) -> bool:
        """Whether the pod's container was started and has not ended."""
        name = pod["metadata"]["name"]
        outcome = self.outcomes.get(name)
        if outcome is None or outcome.waiting_reason or pod["status"]["phase"] in _TERMINAL:
            return False
        if outcome.live is not None:
            return outcome.live.poll() is None
        return pod["status"]["phase"] == "Running"

    def _signal(self, name: str, sig: int) -> None:
        self.signals.append((name, sig))
        self.events.append((time.monotonic(), signal.Signals(sig).name.lower(), "Pod", name))
        outcome = self.outcomes.get(name)
        if outcome is None:
            return
        if outcome.on_signal is not None:
            outcome.on_signal(sig)
        if outcome.live is not None:
            outcome.live.signal(sig)

    def _list_pods(self, ns: str, selector: str | None) -> dict[str, Any]:
        wanted = dict(part.split("=", 1) for part in selector.split(",")) if selector else {}
        items = []
        for (kind, pns, _), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            if kind == "Pod" and pns == ns and all(labels.get(k) == v for k, v in wanted.items()):
                items.append(obj)
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}

    def _log(self, name: str, query: dict[str, str]) -> tuple[int, Any, str]:
        outcome = self.outcomes.get(name)
        text = "" if outcome is None else (outcome.live.log() if outcome.live is not None else outcome.log)
        if "tailLines" in query:
            text = "\n".join(text.splitlines()[-int(query["tailLines"]) :])
        return 200, text, "text/plain"

    # -- jobs (Indexed job controller model) -----------------------------------------------------------------------

    def _start_job(self, job: dict[str, Any]) -> None:
        spec = job["spec"]
        ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
        if spec.get("completionMode") != "Indexed":
            raise ValueError("the fake implements Indexed Jobs only")
        job["status"] = {"active": 0, "succeeded": 0, "failed": 0, "startTime": _now()}
        template = spec["template"]
        for index in range(min(spec.get("parallelism", 1), spec.get("completions", 1))):
            pod = copy.deepcopy(
                {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}
            )
            meta = pod["metadata"]
            meta["name"] = f"{job_name}-{index}-{uuid.uuid4().hex[:5]}"
            meta["namespace"] = ns
            meta.setdefault("labels", {}).update(
                {
                    "job-name": job_name,
                    "batch.kubernetes.io/job-name": job_name,
                    "batch.kubernetes.io/job-completion-index": str(index),
                }
            )
            meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            meta["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            pod["spec"]["hostname"] = f"{job_name}-{index}"
            container = pod["spec"]["containers"][0]
            container["env"] = [
                {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
                    },
                },
                *(container.get("env") or []),
            ]
            self._admit_pod(pod)
            self.objects[("Pod", ns, meta["name"])] = pod
            self.events.append((time.monotonic(), "created", "Pod", meta["name"]))
        job["status"]["active"] = len(self._job_pods(job))

    def _job_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        return [o for (k, pns, _), o in self.objects.items() if k == "Pod" and pns == ns and self._owner(o) == uid]

    @staticmethod
    def _owner(pod: dict[str, Any]) -> str | None:
        refs = pod["metadata"].get("ownerReferences") or []
        return next((r["uid"] for r in refs if r.get("controller")), None)

    def _update_job(self, job: dict[str, Any]) -> None:
        if job["metadata"].get("deletionTimestamp"):
            return
        pods = self._job_pods(job)
        phases = [p["status"]["phase"] for p in pods]
        status = job["status"]
        status.update(
            active=sum(ph in ("Pending", "Running") for ph in phases),
            succeeded=phases.count("Succeeded"),
            failed=phases.count("Failed"),
        )
        spec = job["spec"]
        if status["succeeded"] >= spec.get("completions", 1):
            status["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": _now()}]
            status["completionTime"] = _now()
        elif status["failed"] > spec.get("backoffLimit", 6):
            status["conditions"] = [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": _now()}
            ]

    # -- deletion: API server, kubelet and garbage collector -------------------------------------------------------

    def _delete(self, kind: str, ns: str, name: str, options: dict[str, Any]) -> tuple[int, Any]:
        obj = self.objects[(kind, ns, name)]
        self.deleted.append((kind, ns, name, options))
        if kind == "Pod":
            self._delete_pod(obj, options.get("gracePeriodSeconds"), options.get("propagationPolicy"))
        elif kind == "Job":
            # batch/v1 Jobs orphan their pods unless told otherwise (the API's default policy for Jobs).
            policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents", True) else "")
            if policy == "Foreground":
                meta = obj["metadata"]
                meta.setdefault("deletionTimestamp", _now())
                meta["deletionGracePeriodSeconds"] = 0
                if "foregroundDeletion" not in meta.setdefault("finalizers", []):
                    meta["finalizers"].append("foregroundDeletion")
            else:
                if policy == "Orphan":
                    for pod in self._job_pods(obj):
                        pod["metadata"]["ownerReferences"] = []
                self._remove(("Job", ns, name))
        else:
            self._remove((kind, ns, name))
        return 200, obj

    def _delete_pod(self, pod: dict[str, Any], grace_s: float | None, policy: str | None = None) -> None:
        meta, name = pod["metadata"], pod["metadata"]["name"]
        key = ("Pod", meta["namespace"], name)
        if grace_s is None:
            grace_s = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S)
        if self.grace_period_s is not None:
            grace_s = self.grace_period_s
        if not pod["spec"].get("nodeName") or pod["status"]["phase"] in _TERMINAL:
            self._remove(key)  # nothing runs: the API server deletes it at once
            return
        now = time.monotonic()
        if name in self._terminating:  # deleted again: a shorter grace period wins
            term = self._terminating[name]
            term.kill_at = min(term.kill_at, now + grace_s * self.time_scale)
            return
        if grace_s <= 0:  # forced: gone from the API at once; the kubelet kills the container after
            if self._running(pod):
                self._signal(name, signal.SIGKILL)
            self._remove(key)
            return
        meta["deletionTimestamp"] = _now(grace_s)
        meta["deletionGracePeriodSeconds"] = int(grace_s)
        if policy == "Foreground":
            meta.setdefault("finalizers", []).append("foregroundDeletion")
        term = _Terminating(grace_s=grace_s, kill_at=now + grace_s * self.time_scale, exit_at=now)
        self._terminating[name] = term
        if self._running(pod):
            self._signal(name, signal.SIGTERM)
            outcome = self.outcomes[name]
            term.exit_at = None if outcome.live is not None or outcome.stop_s is None else (
                now + outcome.stop_s * self.time_scale
            )  # fmt: skip

    def _remove(self, key: tuple[str, str, str]) -> None:
        if self.objects.pop(key, None) is not None:
            self.events.append((time.monotonic(), "removed", key[0], key[2]))
        if key[0] == "Pod":
            self._terminating.pop(key[2], None)

    def _sync(self) -> None:
        """The kubelet ends terminating pods; the garbage collector deletes a deleted Job's pods."""
        now = time.monotonic()
        for name, term in list(self._terminating.items()):
            key = next((k for k in self.objects if k[0] == "Pod" and k[2] == name), None)
            if key is None:
                self._terminating.pop(name, None)
                continue
            if not self.kubelet_running:
                continue
            pod = self.objects[key]
            outcome = self.outcomes.get(name)
            code: int | None = None
            if outcome is None or outcome.waiting_reason or pod["status"]["phase"] in _TERMINAL:
                self._remove(key)
                continue
            if outcome.live is not None:
                code = outcome.live.poll()
            elif term.exit_at is not None and now >= term.exit_at:
                code = 128 + signal.SIGTERM
            if code is None and now >= term.kill_at:
                self._signal(name, signal.SIGKILL)
                code = 128 + signal.SIGKILL
                if outcome.live is not None:
                    deadline = time.monotonic() + 5
                    while outcome.live.poll() is None and time.monotonic() < deadline:
                        time.sleep(0.01)
            if code is not None:
                self._finish_container(pod, code)
                self._remove(key)
        for (kind, ns, name), job in list(self.objects.items()):
            if kind != "Job" or "foregroundDeletion" not in (job["metadata"].get("finalizers") or []):
                continue
            dependents = self._job_pods(job)
            for pod in dependents:
                if pod["metadata"]["name"] not in self._terminating:
                    self._gc_delete(pod)
            if not self._job_pods(job):
                self._remove((kind, ns, name))
        uids = {o["metadata"].get("uid") for o in self.objects.values()}
        for pod in [o for (k, _, _), o in self.objects.items() if k == "Pod"]:
            owner = self._owner(pod)
            if owner is not None and owner not in uids and pod["metadata"]["name"] not in self._terminating:
                self._gc_delete(pod)  # background deletion: the owner is gone, its pods follow

    def _gc_delete(self, pod: dict[str, Any]) -> None:
        """The garbage collector deletes a dependent with default options: the pod's own grace period."""
        meta = pod["metadata"]
        grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S)
        self.deleted.append(("Pod", meta["namespace"], meta["name"], {"gracePeriodSeconds": grace, "by": "gc"}))
        self._delete_pod(pod, None)
