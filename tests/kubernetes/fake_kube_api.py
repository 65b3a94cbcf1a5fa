"""A local stand-in for the few Kubernetes API calls the carbonflow backend makes (no cluster can run here).

It is a real HTTP server speaking the API server's JSON: the kubernetes python client talks to it through a
kubeconfig, exactly as to a cluster. It implements create / read / delete of namespaced ConfigMaps,
Services, Pods and Jobs, listing pods by label selector, and reading pod logs. Created objects are validated
against the Kubernetes schema (kubernetes-validate), as admission would, and rejected with 422 when invalid.

A small kubelet/job-controller model moves pods through Pending → Running → Succeeded/Failed, one step per
read, and "runs" each container through a test-supplied behaviour that receives the container's resolved
environment (including downward-API ``fieldRef`` values) and the mounted ConfigMap files, as a container
would see them. The Indexed Job controller creates one pod per completion index with the
``batch.kubernetes.io/job-completion-index`` annotation and the ``JOB_COMPLETION_INDEX`` variable.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

SCHEMA_VERSION = "1.37.0"


@dataclass
class ContainerOutcome:
    """What a container does: exit code, termination message, log, and how long it stays in each phase."""

    exit_code: int = 0
    termination_message: str = ""
    log: str = ""
    pending_reads: int = 1
    running_reads: int = 1
    waiting_reason: str | None = None  # e.g. ErrImagePull: the pod stays Pending with this reason


@dataclass
class ContainerView:
    """What the container sees when it starts."""

    pod: dict[str, Any]
    env: dict[str, str]
    files: dict[str, str]  # mount path/file → content (from ConfigMap volumes)
    args: list[str]
    command: list[str]


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


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


class FakeKubeApi:
    """The fake API server; use as a context manager, then :meth:`write_kubeconfig`."""

    def __init__(
        self, behaviour: Behaviour | None = None, node_for: Callable[[dict[str, Any]], str] | None = None
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
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

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
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

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
        with self.lock:
            return [o for (k, _, _), o in self.objects.items() if k == kind]

    # -- request handling ---------------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: dict[str, Any] | None) -> tuple[int, Any] | tuple[int, Any, str]:
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
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
                return 200, self.objects[key]
            if method == "DELETE":
                return self._delete(kind, ns, name, body or {})
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
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        files: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                cm = self.objects.get(("ConfigMap", ns, volume["configMap"]["name"]))
                if cm is None:
                    return None
                for key, value in (cm.get("data") or {}).items():
                    files[f"{mount['mountPath'].rstrip('/')}/{key}"] = value
            elif "hostPath" in volume:
                files[mount["mountPath"]] = f"<hostPath {volume['hostPath']['path']}>"
        env: dict[str, str] = {}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
            elif "fieldRef" in var.get("valueFrom", {}):
                env[var["name"]] = self._field(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
        return ContainerView(
            pod=copy.deepcopy(pod),
            env=env,
            files=files,
            args=list(container.get("args") or []),
            command=list(container.get("command") or []),
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

    def _advance_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        phase = pod["status"]["phase"]
        if phase in ("Succeeded", "Failed"):
            return
        cstatus = pod["status"]["containerStatuses"][0]
        if name not in self.outcomes:
            view = self._view(pod)
            if view is None:  # FailedMount: stays ContainerCreating
                return
            pod["spec"].setdefault("nodeName", self.node_for(pod))  # pods with spec.nodeName skip the scheduler
            view.pod["spec"]["nodeName"] = pod["spec"]["nodeName"]
            if "carbonflow.io/restores" in (pod["metadata"].get("labels") or {}):
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
        if n <= outcome.pending_reads:
            return
        if n <= outcome.pending_reads + outcome.running_reads:
            pod["status"]["phase"] = "Running"
            pod["status"]["startTime"] = pod["status"].get("startTime", _now())
            cstatus["state"] = {"running": {"startedAt": _now()}}
            cstatus["ready"] = True
            return
        pod["status"]["phase"] = "Succeeded" if outcome.exit_code == 0 else "Failed"
        terminated: dict[str, Any] = {
            "exitCode": outcome.exit_code,
            "reason": "Completed" if outcome.exit_code == 0 else "Error",
            "finishedAt": _now(),
        }
        message = outcome.termination_message[:4096]  # the kubelet keeps at most 4096 bytes
        container = pod["spec"]["containers"][0]
        if (
            not message
            and outcome.exit_code != 0
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            message = "\n".join(outcome.log.splitlines()[-80:])[-2048:]
        if message:
            terminated["message"] = message
        cstatus["state"] = {"terminated": terminated}
        cstatus["ready"] = False

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
        text = outcome.log if outcome else ""
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
        job["status"]["active"] = len(self._job_pods(job))

    def _job_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        return [
            o
            for (k, pns, _), o in self.objects.items()
            if k == "Pod" and pns == ns and (o["metadata"].get("labels") or {}).get("job-name") == name
        ]

    def _update_job(self, job: dict[str, Any]) -> None:
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

    def _delete(self, kind: str, ns: str, name: str, options: dict[str, Any]) -> tuple[int, Any]:
        obj = self.objects.pop((kind, ns, name))
        self.deleted.append((kind, ns, name, options))
        if kind == "Job" and options.get("propagationPolicy", "Background") != "Orphan":
            for pod in self._job_pods(obj):
                self.objects.pop(("Pod", ns, pod["metadata"]["name"]), None)
                self.deleted.append(("Pod", ns, pod["metadata"]["name"], options))
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}
