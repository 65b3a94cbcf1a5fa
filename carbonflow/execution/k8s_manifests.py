"""Kubernetes manifests for one carbonflow training run, built with the kubernetes client's models alone.

One container → a ``V1Pod``; several containers → a ``V1Job`` with ``Indexed`` completion, one pod per rank, plus a
headless ``Service`` so that every rank finds rank 0 (PyTorch ``env://`` rendezvous: ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``).

How job and plan reach the container (a deliberate choice): a ``ConfigMap`` holding ``job.json`` and
``plan.json`` mounted read-only at ``/etc/carbonflow``. The wrapper keeps its file interface
(``carbonflow run --job /etc/carbonflow/job.json --plan /etc/carbonflow/plan.json --result
/dev/termination-log -- <command>``), every rank of a Job reads the same object, ``kubectl get configmap``
shows what ran, and nothing depends on environment-variable size limits.

Power limits: the training pod is not privileged. It mounts the host directory of the zeusd node agent
(``deploy/k8s/zeusd-daemonset.yaml``) read-only and gets ``ZEUSD_SOCK_PATH`` and the node's GPU UUID → host
index map (``CARBONFLOW_GPU_INDEX_MAP``, written there by the DaemonSet), so the wrapper asks zeusd to set and
restore the limit of the pod's own GPU, by its host index. The wrapper runs as root in its container with
every capability dropped but the few it needs to start the training as ``training_uid`` without
supplementary groups: zeusd's socket (root's, mode 660) and the power journals (root's) are the wrapper's
only. Each pod's journal is its own sub-directory of the host's journal directory, mounted with
``subPathExpr: $(POD_NAME)``: a pod sees no other pod's journal. Co-location: a plan with a co-location group
requests the time-sliced GPU resource (``nvidia.com/gpu.shared`` by default, see
``deploy/k8s/nvidia-time-slicing.yaml``).

No Airflow here (execution/ imports none): the objects are the ones the cncf-kubernetes provider's
``KubernetesPodOperator`` / ``KubernetesJobOperator`` built for carbonflow before (the container is named
``base``, ``restartPolicy: Never``, the provider's empty defaults), less the provider's own ``airflow_version`` and
``airflow_kpo_in_cluster`` labels; each is validated offline against the Kubernetes schema (kubernetes-validate).
"""

from __future__ import annotations

import fnmatch
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from carbonflow.contract import (
    GPU_INDEX_MAP_ENV,
    GPU_LEASE_DIR_ENV,
    POWER_JOURNAL_DIR_ENV,
    TRAINING_UID_ENV,
    ZEUSD_SOCK_ENV,
    check_job_env,
)
from carbonflow.domain import JobSpec, Plan
from carbonflow.execution.signing import RESULT_KEY_ENV
from carbonflow.settings import K8S_SETTINGS_ENV, k8s_settings_json

LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "carbonflow.io/job"
LABEL_RUN = "carbonflow.io/run"
LABEL_CONFIG = "carbonflow.io/config"
ANNOTATION_PLAN_START = "carbonflow.io/planned-start"
ANNOTATION_REASON = "carbonflow.io/plan-reason"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
CONTAINER_NAME = "base"  # the container's name (the cncf-kubernetes provider's too); results are read from it
JOB_NAME_PREFIX = "job-"  # a Job is named job-<run> (as the provider named it)
KUBERNETES_SCHEMA_VERSION = "1.37.0"
SETTINGS_ENV = K8S_SETTINGS_ENV
_DNS_LABEL_RE = re.compile(r"[^a-z0-9-]+")


class KubernetesSettings(BaseModel):
    """Cluster-side choices for the Kubernetes backend (one object per cluster, not per job)."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(default="carbonflow", description="namespace of training pods, jobs and config maps")
    image: str = Field(default="carbonflow:0.1.0", description="image with carbonflow installed; JobSpec.image wins")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account_name: str | None = Field(default="carbonflow-training", description="see deploy/k8s/rbac.yaml")
    gpu_resource: str = Field(default="nvidia.com/gpu", description="extended resource of a whole GPU")
    shared_gpu_resource: str = Field(
        default="nvidia.com/gpu.shared",
        description="time-sliced GPU resource used for co-located jobs (NVIDIA device plugin renameByDefault)",
    )
    gpus_per_container: int = Field(default=1, ge=1, le=16)
    cpu_request: str | None = "1"
    memory_request: str | None = "2Gi"
    memory_limit: str | None = None
    node_selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    power_agent: Literal["zeusd", "none"] = Field(
        default="zeusd", description="who sets power limits: the zeusd node agent, or nobody (limits not applied)"
    )
    zeusd_host_dir: str = Field(default="/var/run/zeusd", description="host directory holding zeusd's socket")
    zeusd_socket_name: str = "zeusd.sock"
    gpu_index_map_name: str = Field(
        default="gpu-index-map.json",
        description="file in zeusd_host_dir mapping each GPU UUID to its host index (zeusd's numbering), written "
        "by the zeusd DaemonSet's init container; a pod sees its GPU as index 0 whatever its host index",
    )
    power_journal_host_dir: str = Field(
        default="/var/lib/carbonflow/power-journal",
        description="host directory for the wrapper's power-limit restore journals (one sub-directory per pod), "
        "so that a restore pod can put limits back after a training pod was killed",
    )
    gpu_lease_host_dir: str = Field(
        default="/var/lib/carbonflow/gpu-leases",
        description="host directory of the node's GPU leases, mounted into every training pod: pods of the node "
        "lease a GPU in one place, so two planned pairs never train on one time-sliced GPU at once",
    )
    restore_runtime_class: str | None = Field(
        default="nvidia", description="runtime class giving the restore pod NVML without requesting a GPU"
    )
    privileged: bool = Field(
        default=False, description="run the training container privileged (opt-in; zeusd makes it unnecessary)"
    )
    training_uid: int | None = Field(
        default=1000,
        ge=1,
        description="the user the wrapper starts the training as (no supplementary groups): the user's command "
        "cannot reach zeusd's root-only socket or the power journals; None: the training runs as the wrapper",
    )
    trusted_images: list[str] = Field(
        default_factory=list,
        description="images (fnmatch patterns) a GPU job's own JobSpec.image may name: the wrapper runs as root "
        "from that image beside zeusd's socket, so only images the platform team built FROM carbonflow's belong "
        "here; other job images are refused (the cluster's `image` is always trusted)",
    )
    termination_grace_period_s: int = Field(
        default=60,
        ge=1,
        description="pods' terminationGracePeriodSeconds and the backend's deletion grace period: the time the "
        "wrapper has, after SIGTERM, to stop the training and put the power limit back (Job pods deleted with "
        "their Job get the pod's own value)",
    )
    config_mount_path: str = "/etc/carbonflow"
    result_path: str = Field(default="/dev/termination-log", description="where the wrapper writes RunResult JSON")
    master_port: int = Field(default=29500, ge=1, le=65535)
    backoff_limit: int = Field(default=0, ge=0, description="Job retries; 0: a failed rank fails the run")
    active_deadline_s: int | None = Field(default=None, gt=0)
    ttl_seconds_after_finished: int | None = Field(default=3600, ge=0)
    extra_env: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_env(cls) -> KubernetesSettings:
        """Settings from ``$CARBONFLOW_K8S_SETTINGS`` (a JSON object of these fields), defaults otherwise."""
        raw = k8s_settings_json()
        if not raw:
            return cls()
        try:
            return cls.model_validate_json(raw)
        except ValueError as exc:
            raise ValueError(f"{SETTINGS_ENV} is not valid KubernetesSettings JSON: {exc}") from None

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v):
            raise ValueError(f"namespace={v!r} is not allowed; use a DNS-1123 label (lowercase letters, digits, '-')")
        return v

    @property
    def zeusd_mount_path(self) -> str:
        """Where the zeusd socket directory appears inside the training container (same path as the host)."""
        return self.zeusd_host_dir

    @property
    def zeusd_socket_path(self) -> str:
        return f"{self.zeusd_mount_path.rstrip('/')}/{self.zeusd_socket_name}"

    @property
    def gpu_index_map_path(self) -> str:
        """The node's GPU UUID → host index map, as containers see it (beside zeusd's socket)."""
        return f"{self.zeusd_mount_path.rstrip('/')}/{self.gpu_index_map_name}"

    def pod_journal_host_dir(self, pod_name: str) -> str:
        """Where a training pod's power journals are on its node (its own sub-directory)."""
        return f"{self.power_journal_host_dir.rstrip('/')}/{pod_name}"


@dataclass
class KubernetesManifests:
    """Everything one run creates, as kubernetes client objects, in creation order."""

    name: str
    namespace: str
    config_map: Any
    pod: Any | None = None
    job: Any | None = None
    service: Any | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "Job" if self.job is not None else "Pod"

    def objects(self) -> list[Any]:
        """The objects in the order they must be created."""
        return [o for o in (self.config_map, self.service, self.job, self.pod) if o is not None]

    def to_dicts(self) -> list[dict[str, Any]]:
        """The objects as the camelCase JSON the API server receives."""
        from kubernetes.client import ApiClient

        client = ApiClient()
        return [client.sanitize_for_serialization(o) for o in self.objects()]


def dns_name(*parts: str, max_length: int = 52) -> str:
    """A DNS-1123 label from ``parts`` (lowercased, '_'/'.' → '-'), at most ``max_length`` characters."""
    raw = "-".join(p for p in parts if p)
    name = _DNS_LABEL_RE.sub("-", raw.lower()).strip("-")
    name = re.sub("-{2,}", "-", name)[:max_length].strip("-")
    if not name:
        raise ValueError(f"cannot make a Kubernetes name from {parts!r}")
    return name


def run_name(spec: JobSpec, unique: str | None = None) -> str:
    """``cf-<job>-<8 hex>``: short enough for the provider's ``job-`` prefix and index suffixes."""
    suffix = unique or uuid.uuid4().hex[:8]
    return dns_name("cf", spec.name[:36], suffix, max_length=48)


def container_command(spec: JobSpec, plan: Plan) -> list[str]:
    """The command the wrapper runs in one container: one rank of the plan (never torch's local launcher:
    on Kubernetes each rank is its own pod, wired by MASTER_ADDR/WORLD_SIZE/RANK)."""
    from carbonflow.execution.commands import training_command

    if spec.command is None and spec.workload is None:
        # An image-only job: the image's own entrypoint is unknown to Kubernetes once we override it.
        raise ValueError(
            f"job {spec.name!r}: command=None and workload=None; the Kubernetes backend needs a command to pass to "
            "`carbonflow run -- <command>` (set JobSpec.command to the image's training command)"
        )
    return training_command(spec, plan.config.model_copy(update={"containers": 1}), python="python")


def wrapper_arguments(
    spec: JobSpec,
    plan: Plan,
    settings: KubernetesSettings,
    *,
    profile_steps: int | None = None,
    warmup_steps: int = 0,
    sweep_limits_w: list[float] | None = None,
    stop_below_fraction: float | None = None,
) -> list[str]:
    """``run --job ... --plan ... --result ... -- <command>`` (the container command is ``carbonflow``).

    A profile passes ``--profile-steps`` and, for a power-limit sweep, ``--sweep-limits`` and ``--stop-below``
    exactly as the local backend does."""
    mount = settings.config_mount_path.rstrip("/")
    args = ["run", "--job", f"{mount}/job.json", "--plan", f"{mount}/plan.json", "--result", settings.result_path]
    if warmup_steps:
        args += ["--warmup-steps", str(warmup_steps)]
    if profile_steps is not None:
        args += ["--profile-steps", str(profile_steps)]
    if sweep_limits_w:
        args += ["--sweep-limits", ",".join(f"{w:g}" for w in sweep_limits_w)]
    if stop_below_fraction is not None:
        args += ["--stop-below", f"{stop_below_fraction:g}"]
    return [*args, "--", *container_command(spec, plan)]


def uses_gpu(spec: JobSpec) -> bool:
    """A real GPU is requested only for GPU jobs that are not a simulated-GPU replay."""
    return spec.device_kind == "gpu" and spec.simulated_gpu is None


def gpu_resource_name(plan: Plan, settings: KubernetesSettings) -> str:
    """Co-located runs ask for the time-sliced resource; the others for whole GPUs."""
    return settings.shared_gpu_resource if plan.config.colocation_group else settings.gpu_resource


class ManifestBuilder:
    """Builds the pod/job/service/config map of one run (kubernetes client models; no cluster is asked)."""

    def __init__(self, settings: KubernetesSettings | None = None) -> None:
        self.settings = settings or KubernetesSettings()

    def build(
        self,
        spec: JobSpec,
        plan: Plan,
        *,
        name: str | None = None,
        profile_steps: int | None = None,
        warmup_steps: int = 0,
        sweep_limits_w: list[float] | None = None,
        stop_below_fraction: float | None = None,
        result_key: str | None = None,
    ) -> KubernetesManifests:
        """All objects for ``plan``: a Pod for one container, an Indexed Job + headless Service for more.

        ``profile_steps``/``warmup_steps`` run the wrapper in profile mode (stop after the budgeted steps),
        sweeping ``sweep_limits_w`` (stopping below ``stop_below_fraction`` of the fastest). ``result_key``: the
        run's result key, in the wrapper's environment only (never the ConfigMap); the wrapper signs its result
        with it and takes it out of its environment before the training starts.
        """
        if plan.job != spec.name:
            raise ValueError(f"plan.job={plan.job!r} does not match spec.name={spec.name!r}; they must be equal")
        containers = plan.config.containers
        if not spec.min_containers <= containers <= spec.max_containers:
            raise ValueError(
                f"plan.config.containers={containers} is outside the job's range "
                f"[{spec.min_containers}, {spec.max_containers}]"
            )
        if profile_steps is not None and profile_steps < 1:
            raise ValueError(f"profile_steps={profile_steps} is not allowed; it must be >= 1 or None")
        args = wrapper_arguments(spec, plan, self.settings, profile_steps=profile_steps, warmup_steps=warmup_steps,
                                 sweep_limits_w=sweep_limits_w, stop_below_fraction=stop_below_fraction)  # fmt: skip
        name = name or run_name(spec)
        labels = {
            LABEL_APP: "carbonflow",
            LABEL_JOB: dns_name(spec.name, max_length=63),
            LABEL_RUN: name,
            LABEL_CONFIG: dns_name(plan.config.key(), max_length=63),
        }
        manifests = KubernetesManifests(
            name=name,
            namespace=self.settings.namespace,
            config_map=self._config_map(spec, plan, name, labels),
            labels=labels,
        )
        if containers == 1:
            manifests.pod = self._training_pod(spec, plan, name, labels, args)
        else:
            manifests.service = self._headless_service(name, labels)
            manifests.job = self._indexed_job(spec, plan, name, labels, args)
        if result_key:
            _add_result_key(manifests, result_key)
        return manifests

    # -- pieces -------------------------------------------------------------------------------------------------

    def _config_map(self, spec: JobSpec, plan: Plan, name: str, labels: dict[str, str]) -> Any:
        from kubernetes.client import models as k8s

        return k8s.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=k8s.V1ObjectMeta(name=name, namespace=self.settings.namespace, labels=dict(labels)),
            data={"job.json": spec.model_dump_json(), "plan.json": plan.model_dump_json()},
        )

    def _headless_service(self, name: str, labels: dict[str, str]) -> Any:
        from kubernetes.client import models as k8s

        return k8s.V1Service(
            api_version="v1",
            kind="Service",
            metadata=k8s.V1ObjectMeta(name=name, namespace=self.settings.namespace, labels=dict(labels)),
            spec=k8s.V1ServiceSpec(
                cluster_ip="None",
                publish_not_ready_addresses=True,
                selector={LABEL_RUN: name},
                ports=[k8s.V1ServicePort(name="rendezvous", port=self.settings.master_port, protocol="TCP")],
            ),
        )

    def _training_pod(
        self,
        spec: JobSpec,
        plan: Plan,
        name: str,
        labels: dict[str, str],
        args: list[str],
        extra_env: list[Any] | None = None,
        subdomain: str | None = None,
        ports: list[Any] | None = None,
    ) -> Any:
        """The training's pod (for a Job: its template's pod, ``extra_env`` and ``ports`` added)."""
        from kubernetes.client import models as k8s

        s = self.settings
        check_job_env(spec.env)  # refused by name, before anything is built or sent (also for a stale JobSpec)
        # The job's env first, carbonflow's own after: in a container the last definition of a name wins.
        env = {
            **s.extra_env,
            **spec.env,
            "CARBONFLOW_JOB_FILE": f"{s.config_mount_path.rstrip('/')}/job.json",
            "CARBONFLOW_PLAN_FILE": f"{s.config_mount_path.rstrip('/')}/plan.json",
            "CARBONFLOW_RESULT_FILE": s.result_path,
            "CARBONFLOW_BACKEND": "kubernetes",
            "CARBONFLOW_POWER_AGENT": s.power_agent,
        }
        volumes = [
            k8s.V1Volume(name="carbonflow-config", config_map=k8s.V1ConfigMapVolumeSource(name=name)),
        ]
        mounts = [k8s.V1VolumeMount(name="carbonflow-config", mount_path=s.config_mount_path, read_only=True)]
        requests: dict[str, str] = {}
        limits: dict[str, str] = {}
        if s.cpu_request:
            requests["cpu"] = s.cpu_request
        if s.memory_request:
            requests["memory"] = s.memory_request
        if s.memory_limit:
            limits["memory"] = s.memory_limit
        node_selector: dict[str, str] | None = None
        tolerations: list[Any] | None = None
        if uses_gpu(spec):
            resource = gpu_resource_name(plan, s)
            # Extended resources: requests must equal limits.
            requests[resource] = limits[resource] = str(s.gpus_per_container)
            node_selector = dict(s.node_selector) or None
            tolerations = [k8s.V1Toleration(**_snake(t)) for t in s.tolerations] or None
            if s.power_agent == "zeusd":
                self._check_image(spec)
                env[ZEUSD_SOCK_ENV] = s.zeusd_socket_path
                env[GPU_INDEX_MAP_ENV] = s.gpu_index_map_path
                # Mounted from <power_journal_host_dir>/$(POD_NAME) on the node: this pod's journals only.
                env[POWER_JOURNAL_DIR_ENV] = s.power_journal_host_dir
                env[GPU_LEASE_DIR_ENV] = s.gpu_lease_host_dir
                v, m = self._agent_volumes(journal_sub_path_expr="$(POD_NAME)")
                volumes += [
                    *v,
                    k8s.V1Volume(
                        name="gpu-leases",
                        host_path=k8s.V1HostPathVolumeSource(path=s.gpu_lease_host_dir, type="DirectoryOrCreate"),
                    ),
                ]
                mounts += [*m, k8s.V1VolumeMount(name="gpu-leases", mount_path=s.gpu_lease_host_dir)]
        security = k8s.V1SecurityContext(
            privileged=s.privileged,
            allow_privilege_escalation=s.privileged,
        )
        if s.training_uid is not None and not s.privileged:
            # The wrapper runs as root in its container, with only what it needs to drop the training's privileges
            # (and to signal and own its files); the training runs as training_uid (see carbonflow.execution.gpus).
            env[TRAINING_UID_ENV] = str(s.training_uid)
            security = k8s.V1SecurityContext(
                privileged=False, allow_privilege_escalation=False, run_as_user=0, run_as_non_root=False,
                capabilities=k8s.V1Capabilities(drop=["ALL"], add=["SETUID", "SETGID", "CHOWN", "KILL"]),
            )  # fmt: skip
        annotations = {ANNOTATION_PLAN_START: plan.start.isoformat(), ANNOTATION_REASON: plan.reason[:250]}
        container = _container(
            image=spec.image or s.image, image_pull_policy=s.image_pull_policy, command=["carbonflow"], args=list(args),
            env=[_pod_name_env(), *(k8s.V1EnvVar(name=k, value=v) for k, v in env.items()), *(extra_env or [])],
            resources=k8s.V1ResourceRequirements(requests=requests or None, limits=limits or None),
            mounts=mounts, security=security, ports=ports,
        )  # fmt: skip
        return _pod(
            name=name, namespace=s.namespace, labels=dict(labels), annotations=annotations, container=container,
            volumes=volumes, node_selector=node_selector, tolerations=tolerations,
            service_account_name=s.service_account_name, termination_grace_period_s=s.termination_grace_period_s,
            active_deadline_s=s.active_deadline_s, subdomain=subdomain,
        )  # fmt: skip

    def _agent_volumes(self, journal_sub_path_expr: str | None = None) -> tuple[list[Any], list[Any]]:
        """The zeusd socket directory (read-only: connecting to a socket needs no write access to its directory)
        and the power-limit journal directory, both from the host. ``journal_sub_path_expr``: mount only that
        sub-directory of the journals (a training pod's own, ``$(POD_NAME)``); None: all of them (restore pods)."""
        from kubernetes.client import models as k8s

        s = self.settings
        volumes = [
            k8s.V1Volume(
                name="zeusd-socket", host_path=k8s.V1HostPathVolumeSource(path=s.zeusd_host_dir, type="Directory")
            ),
            k8s.V1Volume(
                name="power-journal",
                host_path=k8s.V1HostPathVolumeSource(path=s.power_journal_host_dir, type="DirectoryOrCreate"),
            ),
        ]
        mounts = [
            k8s.V1VolumeMount(name="zeusd-socket", mount_path=s.zeusd_mount_path, read_only=True),
            k8s.V1VolumeMount(
                name="power-journal", mount_path=s.power_journal_host_dir, sub_path_expr=journal_sub_path_expr
            ),
        ]
        return volumes, mounts

    def _check_image(self, spec: JobSpec) -> None:
        """A GPU job's own image runs carbonflow's wrapper as root beside zeusd's socket: only trusted ones."""
        s = self.settings
        trusted = [s.image, *s.trusted_images]
        if spec.image is None or any(fnmatch.fnmatchcase(spec.image, pattern) for pattern in trusted):
            return
        raise ValueError(
            f"job {spec.name!r}: image={spec.image!r} is not allowed on GPU pods: the wrapper runs as root from the "
            f"job's image beside the node's power-limit agent; use the cluster's image ({s.image!r}) or add the "
            "image to KubernetesSettings.trusted_images (images your platform team builds FROM carbonflow's)"
        )

    def restore_pod(self, spec: JobSpec, failed_pod_name: str, node_name: str) -> Any:
        """A pod pinned to ``node_name`` that puts back the power limits a killed training pod left lowered.

        It replays that pod's restore journals (``python -m carbonflow.energy.power_limit restore <file>``)
        through zeusd, addressing each GPU by the host index the node's map gives its UUID; the journals live in
        the host directory ``<power_journal_host_dir>/<pod name>``. It runs the cluster's image (never a job's),
        as root (zeusd's socket is root's, mode 660) with every capability dropped, and requests no GPU: the
        NVIDIA runtime shows it every GPU of the node.
        """
        from kubernetes.client import models as k8s

        s = self.settings
        journal_dir = s.pod_journal_host_dir(failed_pod_name)
        script = (
            'set -e; for f in "$JOURNAL_DIR"/*.json; do [ -e "$f" ] || continue; '
            'python -m carbonflow.energy.power_limit restore "$f"; done; rmdir "$JOURNAL_DIR" 2>/dev/null || true'
        )
        volumes, mounts = self._agent_volumes()
        name = dns_name("cf-restore", failed_pod_name[-40:], uuid.uuid4().hex[:5], max_length=63)
        security = k8s.V1SecurityContext(
            privileged=False, allow_privilege_escalation=False, run_as_user=0, run_as_non_root=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        )  # fmt: skip
        container = _container(
            image=s.image, image_pull_policy=s.image_pull_policy, command=["sh", "-c", script], args=[],
            env=[
                k8s.V1EnvVar(name="JOURNAL_DIR", value=journal_dir),
                k8s.V1EnvVar(name=ZEUSD_SOCK_ENV, value=s.zeusd_socket_path),
                k8s.V1EnvVar(name=GPU_INDEX_MAP_ENV, value=s.gpu_index_map_path),
                k8s.V1EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="all"),
                k8s.V1EnvVar(name="NVIDIA_DRIVER_CAPABILITIES", value="utility"),
            ],
            resources=k8s.V1ResourceRequirements(requests={"cpu": "100m", "memory": "256Mi"}),
            mounts=mounts, security=security,
        )  # fmt: skip
        pod = _pod(
            name=name, namespace=s.namespace, annotations={}, container=container, volumes=volumes,
            labels={LABEL_APP: "carbonflow", LABEL_RUN: name, "carbonflow.io/restores": failed_pod_name[:63]},
            tolerations=[k8s.V1Toleration(**_snake(t)) for t in s.tolerations] or None, node_selector=None,
            service_account_name=s.service_account_name, termination_grace_period_s=s.termination_grace_period_s,
            runtime_class_name=s.restore_runtime_class,
        )  # fmt: skip
        pod.spec.node_name = node_name  # bypass the scheduler: it must run where the GPUs are
        return pod

    def _indexed_job(self, spec: JobSpec, plan: Plan, name: str, labels: dict[str, str], args: list[str]) -> Any:
        """An ``Indexed`` Job of ``plan.config.containers`` ranks (one pod each) that find rank 0 through the
        headless Service: ``MASTER_ADDR`` is rank 0's pod, ``<job>-0.<service>``, its ``RANK`` its completion index."""
        from kubernetes.client import models as k8s

        s = self.settings
        world_size = plan.config.containers
        job_name = f"{JOB_NAME_PREFIX}{name}"
        rank_env = [
            k8s.V1EnvVar(name="WORLD_SIZE", value=str(world_size)),
            # Indexed Job pods are named <job>-<index> and, with subdomain=<service>, resolve as such.
            k8s.V1EnvVar(name="MASTER_ADDR", value=f"{job_name}-0.{name}.{s.namespace}.svc"),
            k8s.V1EnvVar(name="MASTER_PORT", value=str(s.master_port)),
            k8s.V1EnvVar(
                name="RANK",
                value_from=k8s.V1EnvVarSource(
                    field_ref=k8s.V1ObjectFieldSelector(
                        field_path=f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
                    )
                ),
            ),
            k8s.V1EnvVar(name="LOCAL_RANK", value="0"),
            k8s.V1EnvVar(name="LOCAL_WORLD_SIZE", value="1"),
        ]
        ports = [k8s.V1ContainerPort(name="rendezvous", container_port=s.master_port)]
        pod = self._training_pod(spec, plan, name, labels, args, extra_env=rank_env, subdomain=name, ports=ports)
        return k8s.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=k8s.V1ObjectMeta(
                name=job_name, namespace=s.namespace, labels=dict(labels), annotations=dict(pod.metadata.annotations)
            ),
            spec=k8s.V1JobSpec(
                template=k8s.V1PodTemplateSpec(metadata=pod.metadata, spec=pod.spec),
                completion_mode="Indexed",
                completions=world_size,
                parallelism=world_size,
                backoff_limit=s.backoff_limit,
                ttl_seconds_after_finished=s.ttl_seconds_after_finished,
                active_deadline_seconds=s.active_deadline_s,
            ),
        )


def _container(
    *,
    image: str,
    image_pull_policy: str,
    command: list[str],
    args: list[str],
    env: list[Any],
    resources: Any,
    mounts: list[Any],
    security: Any,
    ports: list[Any] | None = None,
) -> Any:
    """The one container of a carbonflow pod, named ``base`` (results are read from it)."""
    from kubernetes.client import models as k8s

    return k8s.V1Container(
        name=CONTAINER_NAME, image=image, image_pull_policy=image_pull_policy, command=command, args=args, env=env,
        env_from=[], ports=list(ports or []), resources=resources, volume_mounts=mounts, security_context=security,
        termination_message_policy="FallbackToLogsOnError",
    )  # fmt: skip


def _pod(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    container: Any,
    volumes: list[Any],
    node_selector: dict[str, str] | None,
    tolerations: list[Any] | None,
    service_account_name: str | None,
    termination_grace_period_s: int,
    active_deadline_s: int | None = None,
    subdomain: str | None = None,
    runtime_class_name: str | None = None,
) -> Any:
    """A pod that runs ``container`` once (``restartPolicy: Never``): a failed training is a failed run."""
    from kubernetes.client import models as k8s

    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations),
        spec=k8s.V1PodSpec(
            containers=[container], init_containers=[], restart_policy="Never", volumes=volumes,
            node_selector=node_selector or {}, tolerations=tolerations or [], affinity=k8s.V1Affinity(),
            security_context=k8s.V1PodSecurityContext(), image_pull_secrets=[], host_network=False,
            service_account_name=service_account_name, termination_grace_period_seconds=termination_grace_period_s,
            active_deadline_seconds=active_deadline_s, subdomain=subdomain, runtime_class_name=runtime_class_name,
        ),
    )  # fmt: skip


def _add_result_key(manifests: KubernetesManifests, key: str) -> None:
    """The run's result key in the training container's environment, defined last (a job's env cannot override
    it). The training pods' service account has no API token (deploy/k8s/rbac.yaml): the pod spec is out of the
    training's reach; inside the container only the wrapper's environment holds the key."""
    from kubernetes.client import models as k8s

    template = manifests.pod if manifests.pod is not None else manifests.job.spec.template
    for container in template.spec.containers:
        if container.name == CONTAINER_NAME:
            container.env = [*(e for e in container.env or [] if e.name != RESULT_KEY_ENV),
                             k8s.V1EnvVar(name=RESULT_KEY_ENV, value=key)]  # fmt: skip


def _pod_name_env() -> Any:
    """``POD_NAME`` from the downward API (first in the list so that later values can use ``$(POD_NAME)``)."""
    from kubernetes.client import models as k8s

    return k8s.V1EnvVar(
        name="POD_NAME", value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name"))
    )


def _snake(mapping: dict[str, Any]) -> dict[str, Any]:
    """camelCase keys (as written in YAML) → the kubernetes client's snake_case keyword arguments."""
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in mapping.items()}


def validate_manifest(obj: Any, *, version: str = KUBERNETES_SCHEMA_VERSION, strict: bool = True) -> None:
    """Validate one object (client model or camelCase dict) against the Kubernetes schema, offline.

    Raises ``kubernetes_validate.ValidationError`` naming the field at fault.
    """
    import kubernetes_validate
    from kubernetes.client import ApiClient

    data = obj if isinstance(obj, dict) else ApiClient().sanitize_for_serialization(obj)
    kubernetes_validate.validate(data, version, strict=strict)
