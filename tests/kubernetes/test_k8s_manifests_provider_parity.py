"""Issue #22: ``execution/`` imports no Airflow, so the run's pods and Jobs are built with the kubernetes client's
models alone (``execution/k8s_manifests.py``), no longer through the cncf-kubernetes provider's operators. The
objects must stay what the provider builds: here each generated pod (and Job) is built again by the provider's
``KubernetesPodOperator`` / ``KubernetesJobOperator`` from the generated object's own fields, and the two must be
equal but for the provider's own ``airflow_version`` / ``airflow_kpo_in_cluster`` labels. A default carbonflow
sets differently from the provider (restart policy, container name, an empty list left out) fails here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.k8s_manifests import JOB_NAME_PREFIX, KubernetesSettings, ManifestBuilder

PROVIDER_LABELS = {"airflow_version", "airflow_kpo_in_cluster"}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPU = JobSpec(name="gpu-job", command=["python", "t.py"], steps=10, region="GB", device_kind="gpu", max_containers=3)
CPU = JobSpec(name="cpu-job", command=["python", "t.py"], steps=10, region="GB", device_kind="cpu", max_containers=3,
              env={"A": "1"})  # fmt: skip
STRICT = KubernetesSettings(
    namespace="ml", training_uid=1000, node_selector={"gpu": "yes"}, cpu_request="1", memory_request="1Gi",
    memory_limit="2Gi", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)  # fmt: skip
PRIVILEGED = KubernetesSettings(namespace="ml", training_uid=None, privileged=True, active_deadline_s=100,
                                extra_env={"X": "y"}, power_agent="none", backoff_limit=2,
                                ttl_seconds_after_finished=None)  # fmt: skip


def _plan(job: str, containers: int, limit_w: float | None = None, group: str | None = None) -> Plan:
    return Plan(job=job, config=Config(containers=containers, power_limit_w=limit_w, colocation_group=group),
                start=T0, predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
                forecast_provider="test", reason="parity")  # fmt: skip


def _dict(obj: Any) -> dict[str, Any]:
    return ApiClient().sanitize_for_serialization(obj)


def _without_provider_labels(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_provider_labels(v) for k, v in data.items() if k not in PROVIDER_LABELS}
    if isinstance(data, list):
        return [_without_provider_labels(v) for v in data]
    return data


def _operator_kwargs(pod: Any, config_file: str) -> dict[str, Any]:
    """What the provider's pod operator is given to build ``pod``: each of the pod's fields as its argument."""
    (container,) = pod.spec.containers
    s = pod.spec
    return {
        "task_id": "parity", "name": pod.metadata.name, "namespace": pod.metadata.namespace,
        "image": container.image, "image_pull_policy": container.image_pull_policy, "cmds": container.command,
        "arguments": container.args, "env_vars": container.env, "labels": dict(pod.metadata.labels),
        "annotations": dict(pod.metadata.annotations or {}), "container_resources": container.resources,
        "node_selector": s.node_selector or None, "tolerations": s.tolerations or None, "volumes": s.volumes,
        "volume_mounts": container.volume_mounts, "service_account_name": s.service_account_name,
        "container_security_context": container.security_context, "runtime_class_name": s.runtime_class_name,
        "termination_message_policy": container.termination_message_policy,
        "active_deadline_seconds": s.active_deadline_seconds,
        "termination_grace_period": s.termination_grace_period_seconds, "random_name_suffix": False,
        "do_xcom_push": False, "in_cluster": False, "config_file": config_file,
    }  # fmt: skip


@pytest.fixture
def kubeconfig(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """The provider's operators read a kubeconfig when built; one naming an unreachable server suffices."""
    config = tmp_path / "kubeconfig.json"
    config.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "offline", "clusters": [{"name": '
                      '"offline", "cluster": {"server": "https://offline.invalid"}}], "users": [{"name": "offline", '
                      '"user": {}}], "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": '
                      '"offline"}}]}')  # fmt: skip
    return str(config)


CASES = {
    "cpu pod": (STRICT, CPU, _plan("cpu-job", 1)),
    "gpu pod, zeusd, unprivileged training user": (STRICT, GPU, _plan("gpu-job", 1, 200.0)),
    "co-located gpu pod": (STRICT, GPU, _plan("gpu-job", 1, 200.0, "a+b")),
    "privileged gpu pod with a deadline": (PRIVILEGED, GPU, _plan("gpu-job", 1, 200.0)),
    "default settings": (KubernetesSettings(), CPU, _plan("cpu-job", 1)),
}
JOBS = {
    "cpu job of 3 ranks": (STRICT, CPU, _plan("cpu-job", 3)),
    "gpu job of 2 ranks": (STRICT, GPU, _plan("gpu-job", 2, 200.0)),
    "privileged job with a deadline, retries, no ttl": (PRIVILEGED, GPU, _plan("gpu-job", 2, 200.0)),
}


@pytest.mark.parametrize("case", CASES)
def test_each_training_pod_is_the_providers_pod(case: str, kubeconfig: str) -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    settings, spec, plan = CASES[case]
    pod = ManifestBuilder(settings).build(spec, plan, name="cf-parity", result_key="KEY").pod
    provider = KubernetesPodOperator(**_operator_kwargs(pod, kubeconfig)).build_pod_request_obj(dry_run=True)
    assert _without_provider_labels(_dict(provider)) == _dict(pod)


@pytest.mark.parametrize("case", JOBS)
def test_each_indexed_job_is_the_providers_job(case: str, kubeconfig: str) -> None:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    settings, spec, plan = JOBS[case]
    job = ManifestBuilder(settings).build(spec, plan, name="cf-parity", result_key="KEY").job
    assert job.metadata.name == f"{JOB_NAME_PREFIX}cf-parity"
    template = job.spec.template
    kwargs = _operator_kwargs(template, kubeconfig)
    (container,) = template.spec.containers
    provider = KubernetesJobOperator(
        **kwargs, subdomain=template.spec.subdomain, ports=container.ports, completion_mode="Indexed",
        completions=job.spec.completions, parallelism=job.spec.parallelism, backoff_limit=job.spec.backoff_limit,
        ttl_seconds_after_finished=job.spec.ttl_seconds_after_finished,
    ).build_job_request_obj()  # fmt: skip
    assert _without_provider_labels(_dict(provider)) == _dict(job)


def test_the_restore_pod_is_the_providers_pod(kubeconfig: str) -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    pod = ManifestBuilder(STRICT).restore_pod(GPU, "cf-gpu-1", "node-1")
    provider = KubernetesPodOperator(**_operator_kwargs(pod, kubeconfig)).build_pod_request_obj(dry_run=True)
    provider.spec.node_name = "node-1"  # the restore pod bypasses the scheduler
    assert _without_provider_labels(_dict(provider)) == _dict(pod)
