"""Generated pods/jobs and deploy/k8s manifests validate against the Kubernetes schema and carry GPU + zeusd wiring."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from carbonflow.execution.k8s_manifests import (
    COMPLETION_INDEX_ANNOTATION,
    KubernetesSettings,
    ManifestBuilder,
    validate_manifest,
)
from carbonflow.models import Config, JobSpec, Plan, SimulatedGpuSpec

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "k8s"


def make_spec(**kw) -> JobSpec:
    base = dict(
        name="resnet_nightly",
        command=["python", "train.py"],
        epochs=2,
        samples_per_epoch=50_000,
        region="GB",
        max_containers=4,
    )
    base.update(kw)
    return JobSpec(**base)


def make_plan(
    containers: int = 1, power_limit_w: float | None = 175, group: str | None = None, job: str = "resnet_nightly"
) -> Plan:
    now = datetime.now(UTC)
    return Plan(
        job=job,
        config=Config(containers=containers, power_limit_w=power_limit_w, colocation_group=group),
        start=now + timedelta(hours=2),
        finish_by=now + timedelta(hours=9),
        predicted_duration_s=3600,
        predicted_energy_j=1e6,
        predicted_emissions_g=50,
        region="GB",
        forecast_provider="uk-neso",
        signal_kind="average-direct",
        reason="lowest forecast window before finish-by",
    )


@pytest.fixture(scope="module")
def builder() -> ManifestBuilder:
    return ManifestBuilder(KubernetesSettings(namespace="ml-train"))


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_single_container_is_a_valid_pod_with_gpu_and_zeusd(builder):
    m = builder.build(make_spec(), make_plan(1))
    assert m.kind == "Pod" and m.job is None and m.service is None
    docs = m.to_dicts()
    for doc in docs:
        validate_manifest(doc)
    cm, pod = docs
    assert cm["kind"] == "ConfigMap" and set(cm["data"]) == {"job.json", "plan.json"}
    assert Plan.model_validate_json(cm["data"]["plan.json"]).config.power_limit_w == 175
    assert JobSpec.model_validate_json(cm["data"]["job.json"]).name == "resnet_nightly"
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # the wrapper is the entrypoint
    assert c["command"] == ["carbonflow"]
    assert c["args"][:7] == [
        "run",
        "--job",
        "/etc/carbonflow/job.json",
        "--plan",
        "/etc/carbonflow/plan.json",
        "--result",
        "/dev/termination-log",
    ]
    assert c["args"][7:] == ["--", "python", "train.py"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # power limits through the zeusd node agent, not a privileged pod
    env = env_of(c)
    assert env["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
    assert env["CARBONFLOW_POWER_AGENT"] == "zeusd"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"zeusd-socket": "/var/run/zeusd", "power-journal": "/var/lib/carbonflow/power-journal"}
    assert env["CARBONFLOW_POWER_JOURNAL_DIR"] == "/var/lib/carbonflow/power-journal/$(POD_NAME)"
    assert c["env"][0] == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["zeusd-socket"]["mountPath"] == "/var/run/zeusd"
    assert mounts["carbonflow-config"]["readOnly"] is True
    assert c["securityContext"]["privileged"] is False
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["restartPolicy"] == "Never"
    assert pod["metadata"]["namespace"] == "ml-train"
    assert pod["metadata"]["labels"]["carbonflow.io/job"] == "resnet-nightly"


def test_several_containers_make_an_indexed_job_with_rendezvous(builder):
    m = builder.build(make_spec(), make_plan(3))
    assert m.kind == "Job"
    docs = m.to_dicts()
    for doc in docs:
        validate_manifest(doc)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Service", "Job"]
    svc, job = docs[1], docs[2]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    js = job["spec"]
    assert js["completionMode"] == "Indexed" and js["completions"] == 3 and js["parallelism"] == 3
    assert js["backoffLimit"] == 0
    tpl = js["template"]
    assert svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items()
    assert tpl["spec"]["subdomain"] == svc["metadata"]["name"]
    (c,) = tpl["spec"]["containers"]
    env = env_of(c)
    assert env["WORLD_SIZE"] == "3"
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{svc['metadata']['name']}.ml-train.svc"
    assert env["MASTER_PORT"] == "29500"
    assert env["RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
    assert c["securityContext"]["privileged"] is False


def test_colocated_plan_requests_the_time_sliced_resource():
    b = ManifestBuilder(KubernetesSettings(shared_gpu_resource="nvidia.com/gpu.shared"))
    pod = b.build(make_spec(), make_plan(1, group="night-a")).to_dicts()[-1]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu.shared": "1"}
    validate_manifest(pod)


def test_cpu_and_simulated_jobs_request_no_gpu_and_mount_no_agent(builder):
    for spec in (make_spec(device_kind="cpu"), make_spec(simulated_gpu=SimulatedGpuSpec())):
        pod = builder.build(spec, make_plan(1)).to_dicts()[-1]
        validate_manifest(pod)
        c = pod["spec"]["containers"][0]
        assert not any("nvidia.com" in k for k in (c["resources"].get("limits") or {}))
        assert "ZEUSD_SOCK_PATH" not in env_of(c)
        assert "nodeSelector" not in pod["spec"] or not pod["spec"]["nodeSelector"]


def test_workload_job_runs_the_builtin_module(builder):
    spec = make_spec(command=None, workload="digits_cnn", batch_size=32)
    for containers in (1, 2):  # one rank per container: never torch's single-node launcher
        doc = builder.build(spec, make_plan(containers)).to_dicts()[-1]
        pod_spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
        args = pod_spec["containers"][0]["args"]
        assert args[args.index("--") + 1 :] == [
            "python",
            "-m",
            "carbonflow.workloads.digits_cnn",
            "--epochs",
            "2",
            "--batch-size",
            "32",
        ]


def test_bad_input_is_rejected_with_the_field_named(builder):
    with pytest.raises(ValueError, match=r"plan.config.containers=5 is outside"):
        builder.build(make_spec(), make_plan(5))
    with pytest.raises(ValueError, match=r"plan.job='other'"):
        builder.build(make_spec(), make_plan(1, job="other"))
    with pytest.raises(ValueError, match=r"namespace='Bad_NS'"):
        KubernetesSettings(namespace="Bad_NS")
    with pytest.raises(ValueError, match="command=None and workload=None"):
        builder.build(make_spec(command=None, image="repo/train:1"), make_plan(1))


def test_validation_catches_a_broken_manifest(builder):
    pod = builder.build(make_spec(), make_plan(1)).to_dicts()[-1]
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = {"count": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(pod)


def _deploy_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def test_every_deploy_manifest_validates():
    docs = _deploy_docs()
    assert len(docs) >= 8
    for name, doc in docs:
        try:
            validate_manifest(doc)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} {doc.get('kind')}/{doc['metadata'].get('name')}: {exc.message} at {list(exc.path)}")


def test_deploy_zeusd_daemonset_and_example_job_are_wired():
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _deploy_docs()}
    ds = docs[("DaemonSet", "zeusd")]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"]["privileged"] is True  # the agent, not the training pod, is privileged
    assert "--socket-path" in c["args"] and "/var/run/zeusd/zeusd.sock" in c["args"]
    assert any(v.get("hostPath", {}).get("path") == "/var/run/zeusd" for v in pod["volumes"])
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    example = docs[("Job", "carbonflow-example-ddp")]
    tpl = example["spec"]["template"]["spec"]
    ec = tpl["containers"][0]
    assert ec["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert ec["securityContext"]["privileged"] is False
    assert ec["command"] == ["carbonflow"] and ec["args"][0] == "run"
    assert {e["name"] for e in ec["env"]} >= {"ZEUSD_SOCK_PATH", "RANK", "WORLD_SIZE", "MASTER_ADDR"}
    example_pod = docs[("Pod", "carbonflow-example-train")]
    assert example_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    role = docs[("Role", "carbonflow-pod-launcher")]
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert {
        ("pods", "create"),
        ("pods", "delete"),
        ("pods/log", "get"),
        ("jobs", "create"),
        ("configmaps", "create"),
        ("services", "delete"),
    } <= verbs
