"""A FAKE GPU node under the fake Kubernetes API (tests and benchmarks only): its pods run as real processes.

The fake API (``fake_kube_api.py``) decides when a pod starts, is signalled and ends; this module is the node
it runs on — the kubelet's container runtime, the NVIDIA device plugin and the node's host filesystem — on
top of a fake NVML node (``tests/fakes/node.py``: GPUs with UUIDs and per-process privilege in a shared state
file) with the fake zeusd (``tests/fakes/fake_zeusd.py``) acting on it. What runs is real carbonflow: a
training pod's container is the real ``carbonflow run`` wrapper (and the user's command under it), a restore
pod's container the real restore script and ``python -m carbonflow.energy.power_limit restore``.

As on a real node:

* the device plugin gives a GPU pod the host GPUs ``gpus_for(pod)`` chooses; inside the container NVML
  enumerates only those, from index 0 (``FAKE_NVML_CONTAINER_GPUS``), so a pod given host GPU 1 sees it as 0;
  a pod that requests no GPU (a restore pod, with ``NVIDIA_VISIBLE_DEVICES=all``) sees every GPU;
* containers have no CAP_SYS_ADMIN (``FAKE_NVML_UNPRIVILEGED=1``): NVML refuses to change limits, zeusd does it;
* hostPath volumes are directories of the node (under a scratch root), with ``subPath``/``subPathExpr``
  resolved; ConfigMap files and the termination log live in the container's own directory;
* the zeusd DaemonSet's init container has written the GPU UUID → host index map beside zeusd's socket;
* SIGTERM goes to the container's main process (the wrapper), SIGKILL to every process of the container.

Dropping the training to its user (``CARBONFLOW_TRAINING_UID``) needs root: as another user the variable is
removed and the training runs as the wrapper's user (the tests that need the drop skip).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fake_kube_api import ContainerOutcome, ContainerView

from carbonflow.execution.k8s_manifests import KubernetesSettings

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from carbonflow.energy.power_agent import PowerAgent, serve_power_agent  # noqa: E402
from tests.fakes.fake_zeusd import FakeZeusdNode, serve_fake_zeusd  # noqa: E402
from tests.fakes.node import FakeNode  # noqa: E402

ZEUSD_INNER_SOCKET = "/var/run/zeusd-inner/zeusd.sock"  # as in deploy/k8s/zeusd-daemonset.yaml
POWER_AGENT_STATE = "/var/lib/carbonflow/power-agent/holders.json"
SYSTEM_PYTHON = "/usr/bin/python3"  # world-executable, as in an image (this venv's interpreter may not be)
CAN_DROP_USERS = os.geteuid() == 0


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class ProcessContainer:
    """A container whose main process is ``proc`` (see ``fake_kube_api.LiveContainer``)."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, message_path: Path) -> None:
        self.proc, self.log_path, self.message_path = proc, log_path, message_path

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal(self, sig: int) -> None:
        if sig != signal.SIGKILL:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            return
        for pid in [self.proc.pid, *_children(self.proc.pid)]:  # the whole container, as its cgroup is killed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def termination_message(self) -> str:
        return self.message_path.read_text(errors="replace") if self.message_path.exists() else ""


class FakeGpuNode:
    """The node's side of the fake cluster: use ``training`` and ``restore`` as the fake API's behaviours."""

    def __init__(
        self,
        gpus: int = 2,
        *,
        gpus_for: Callable[[dict[str, Any]], list[int]] | None = None,
        settings: KubernetesSettings | None = None,
        limit_mw: int = 300000,
    ) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="cf-gpu-node-"))
        self.base.chmod(0o755)  # the training's user must reach its own run folder, as in an image
        self.node = FakeNode(self.base / "nvml", gpus=gpus, limit_mw=limit_mw)
        self.settings = settings or KubernetesSettings()
        self.gpus_for = gpus_for or (lambda pod: [0])
        self.zeusd_dir = self.host_path(self.settings.zeusd_host_dir)
        self.journal_dir = self.host_path(self.settings.power_journal_host_dir)
        self.socket = self.host_path(self.settings.zeusd_socket_path)
        self.index_map = self.host_path(self.settings.gpu_index_map_path)
        for folder in (self.zeusd_dir, self.journal_dir):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)
        self.bin = self.base / "bin"  # `python` of the image
        self.bin.mkdir()
        (self.bin / "python").symlink_to(sys.executable)
        self.containers: dict[str, ProcessContainer] = {}
        self.agent: PowerAgent | None = None
        self.gpus_of: dict[str, list[int]] = {}
        self.write_index_map()

    def __enter__(self) -> FakeGpuNode:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for container in self.containers.values():
            container.signal(signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)

    # -- the node -------------------------------------------------------------------------------------------------

    def host_path(self, path: str) -> Path:
        """Where the node's ``path`` is on this machine."""
        return self.base / "host" / path.lstrip("/")

    def write_index_map(self) -> None:
        """What the zeusd DaemonSet's init container does: ``python -m carbonflow.energy.zeusd write-index-map``
        on the host, seeing every GPU."""
        done = subprocess.run([sys.executable, "-m", "carbonflow.energy.zeusd", "write-index-map", str(self.index_map)],
                              env=self.node.env(), capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr

    @contextlib.contextmanager
    def zeusd(self) -> Iterator[FakeZeusdNode]:
        """The node agent, as deploy/k8s/zeusd-daemonset.yaml runs it: the fake zeusd on its inner socket (in no
        pod's mounts), and carbonflow's real power agent (per-GPU reference counts) on the node's socket, root's
        with mode 660, its state in the node's host directory. Yields the fake zeusd (what reached the GPUs);
        the agent is ``self.agent``."""
        inner = self.host_path(ZEUSD_INNER_SOCKET)
        inner.parent.mkdir(parents=True, exist_ok=True)
        with (
            serve_fake_zeusd(self.node.state_path, inner, mode=0o600) as zeusd,
            serve_power_agent(self.socket, inner, self.host_path(POWER_AGENT_STATE), mode=0o660) as agent,
        ):
            self.agent = agent
            yield zeusd

    def pod_journal_dir(self, pod_name: str) -> Path:
        return self.journal_dir / pod_name

    # -- the container runtime --------------------------------------------------------------------------------------

    def training(self, view: ContainerView) -> ContainerOutcome:
        """Start a training pod's container: the real wrapper, on the GPUs the device plugin gives the pod."""
        name = view.pod["metadata"]["name"]
        resources = view.pod["spec"]["containers"][0].get("resources") or {}
        wants_gpu = any(k.startswith("nvidia.com/") for k in (resources.get("limits") or {}))
        gpus = self.gpus_for(view.pod) if wants_gpu else []
        self.gpus_of[name] = gpus
        uuids = self.node.uuids()
        visible = ",".join(uuids[i] for i in gpus)
        env = self._env(view, FAKE_NVML_CONTAINER_GPUS=visible, NVIDIA_VISIBLE_DEVICES=visible or "void")
        return self._start(view, env)

    def restore(self, view: ContainerView) -> ContainerOutcome:
        """Start a restore pod's container: its script, on every GPU of the node (it requests none)."""
        env = self._env(view)  # NVIDIA_VISIBLE_DEVICES=all: NVML sees the host's GPUs
        return self._start(view, env)

    def _env(self, view: ContainerView, **extra: str) -> dict[str, str]:
        root = self._root(view)
        env = self.node.env()
        for name in ("CARBONFLOW_POWER_JOURNAL_DIR", "CARBONFLOW_GPU_LEASE_DIR", "CARBONFLOW_NODE_DIR"):
            env.pop(name, None)  # the host's settings: a container sees only what its manifest gives it
        env.update({k: self._map(view, v) for k, v in view.env.items()})
        # carbonflow's fixed default node directory, unless the manifest names a mounted one, is in the
        # container's own filesystem: pods share leases only through a hostPath their manifest mounts
        env.setdefault("CARBONFLOW_NODE_DIR", str(root / "node"))
        env.update(
            FAKE_NVML_UNPRIVILEGED="1",  # no CAP_SYS_ADMIN in the container: limits go through zeusd
            CARBONFLOW_HOME=str(root / "home"),
            HOME=str(root / "home"),
            PATH=f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        env.update(extra)
        if not CAN_DROP_USERS:
            env.pop("CARBONFLOW_TRAINING_UID", None)
        return env

    def _root(self, view: ContainerView) -> Path:
        return self.base / "pods" / view.pod["metadata"]["name"]

    def _map(self, view: ContainerView, value: str) -> str:
        """A container path → this machine's path (mounts by their longest prefix, files the container owns)."""
        root = self._root(view)
        for mount in sorted(view.host_paths, key=len, reverse=True):
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                return str(self.host_path(view.host_paths[mount])) + value[len(mount) :]
        if value in view.files or value == view.env.get("CARBONFLOW_RESULT_FILE"):
            return str(root / "fs" / value.lstrip("/"))
        return value

    def _start(self, view: ContainerView, env: dict[str, str]) -> ContainerOutcome:
        root = self._root(view)
        for path, content in view.files.items():
            if path in view.host_paths:
                continue
            local = root / "fs" / path.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(content)
        for host in view.host_paths.values():  # hostPath DirectoryOrCreate; subPath dirs made by the kubelet
            folder = self.host_path(host)
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)
        for folder in (root, root / "home"):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)
        message = Path(self._map(view, view.env.get("CARBONFLOW_RESULT_FILE", "/dev/termination-log")))
        message.parent.mkdir(parents=True, exist_ok=True)
        argv = [self._map(view, a) for a in [*view.command, *view.args]]
        if argv[0] == "carbonflow":
            argv = [sys.executable, "-m", "carbonflow.cli", *argv[1:]]
        if "--" in argv:  # the user's command: the image's python (world-executable when it runs as another user)
            sep = argv.index("--")
            if argv[sep + 1] == "python":
                argv[sep + 1] = SYSTEM_PYTHON if env.get("CARBONFLOW_TRAINING_UID") else sys.executable
        log = root / "container.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        container = ProcessContainer(proc, log, message)
        self.containers[view.pod["metadata"]["name"]] = container
        return ContainerOutcome(live=container, pending_reads=0)


GRACE_TIME_SCALE = 0.2
"""Real seconds per simulated second of a pod's grace period in :func:`fake_cluster`."""


@contextlib.contextmanager
def fake_cluster(
    workdir: Path, gpus: int = 2, gpus_for: Callable[[str], list[int]] | None = None
) -> Iterator[tuple[FakeGpuNode, Any, Any, Any]]:
    """The fake node (``gpus`` GPUs at 300 W, the device plugin's choice ``gpus_for``), its zeusd and power agent,
    the fake API with restore pods on, and a real KubernetesBackend polling it quickly: (node, zeusd, api, backend).
    Grace periods pass at ``GRACE_TIME_SCALE`` real seconds per simulated one: the default 60 s lasts 12 s, room
    for a real wrapper's stop and restore (a process, HTTP to zeusd) on a loaded 2-core machine. At 0.01 (0.6 s)
    it was SIGKILLed in its grace period under ``make test-fast``, and at 0.05 (3 s) under the full CI run, where
    its restore log came 5 s after the pod started."""
    from fake_kube_api import FakeKubeApi

    from carbonflow.execution.kubernetes import KubernetesBackend

    with FakeGpuNode(gpus=gpus, gpus_for=gpus_for) as gpu_node, gpu_node.zeusd() as zeusd, \
            FakeKubeApi(gpu_node.training, time_scale=GRACE_TIME_SCALE) as api:  # fmt: skip
        api.restore_behaviour = gpu_node.restore
        backend = KubernetesBackend(KubernetesSettings(namespace="ml"),
                                    config_file=str(api.write_kubeconfig(workdir / "kubeconfig.json")),
                                    poll_interval_s=0.05, restore_timeout_s=60)  # fmt: skip
        yield gpu_node, zeusd, api, backend
