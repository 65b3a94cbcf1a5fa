"""Generated pods/jobs and deploy/k8s manifests validate against the Kubernetes schema and carry GPU + zeusd wiring."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from carbonflow.domain import Config, JobSpec, Plan, SimulatedGpuSpec
from carbonflow.execution.k8s_manifests import (
    COMPLETION_INDEX_ANNOTATION,
    KubernetesSettings,
    ManifestBuilder,
    validate_manifest,
)

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
    assert host_paths == {"zeusd-socket": "/var/run/zeusd", "power-journal": "/var/lib/carbonflow/power-journal",
                          "gpu-leases": "/var/lib/carbonflow/gpu-leases"}  # fmt: skip
    assert env["CARBONFLOW_POWER_JOURNAL_DIR"] == "/var/lib/carbonflow/power-journal"
    assert env["CARBONFLOW_GPU_LEASE_DIR"] == "/var/lib/carbonflow/gpu-leases"  # one lease place for the node's pods
    assert env["CARBONFLOW_GPU_INDEX_MAP"] == "/var/run/zeusd/gpu-index-map.json"
    assert c["env"][0] == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["zeusd-socket"]["mountPath"] == "/var/run/zeusd" and mounts["zeusd-socket"]["readOnly"] is True
    # the pod's own journal directory on the node, and nobody else's
    assert mounts["power-journal"]["subPathExpr"] == "$(POD_NAME)"
    assert spec["terminationGracePeriodSeconds"] == 60
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
    c, agent = pod["containers"]  # zeusd, and carbonflow's power agent in front of it (one owner per GPU limit)
    assert c["securityContext"]["privileged"] is True  # zeusd, not the training pod, is privileged
    assert "--socket-path" in c["args"] and "/var/run/zeusd-inner/zeusd.sock" in c["args"]
    assert agent["command"] == ["python", "-m", "carbonflow.energy.power_agent"]
    assert agent["args"][:4] == ["--socket", "/var/run/zeusd/zeusd.sock", "--zeusd-socket", c["args"][2]]
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]  # it changes nothing itself
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/var/run/zeusd-inner"}, "zeusd's socket: no pod's"
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


def test_training_pods_drop_the_users_command_to_an_unprivileged_user() -> None:
    """Finding: every training pod's command inherited the wrapper's access to zeusd."""
    pod = ManifestBuilder(KubernetesSettings()).build(make_spec(), make_plan(1)).to_dicts()[-1]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CARBONFLOW_TRAINING_UID"] == "1000"
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID", "CHOWN", "KILL"]}


SOCKET_MODE = re.compile(r"socket-permissions[\"',\s=]+(\d{3,4})")
CHMOD = re.compile(r"chmod\s+(?:-\w+\s+)*([0-7]{3,4})\b")


def _world_accessible_modes(text: str) -> list[str]:
    """Every zeusd socket mode (``--socket-permissions N``) or ``chmod N`` in ``text`` that lets others in."""
    modes = SOCKET_MODE.findall(text) + CHMOD.findall(text)
    return [m for m in modes if int(m, 8) & 0o007]


def test_no_zeusd_socket_is_world_writable_in_deploy_or_docker_compose() -> None:
    """Finding: zeusd's socket was created with --socket-permissions 666, so any job could set any GPU's limit."""
    files = [p for p in (REPO / "deploy").rglob("*") if p.is_file()] + [REPO / "docker-compose.yml"]
    modes_seen = []
    for path in files:
        text = path.read_text(errors="replace")
        modes_seen += SOCKET_MODE.findall(text)
        assert not _world_accessible_modes(text), f"{path}: a socket or file others may use"
        assert not re.search(r"\b0?666\b", text), f"{path}: mode 666"
    assert modes_seen.count("660") >= 2, modes_seen  # the DaemonSet and the image (docker-compose's zeusd) say 660
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    zeusd = compose["services"]["zeusd"]
    assert "command" not in zeusd and "entrypoint" not in zeusd  # so the image's `serve ... 660` is what runs
    # the check itself can fail
    assert _world_accessible_modes('args: ["serve", "--socket-permissions", "666"]') == ["666"]
    assert _world_accessible_modes("chmod 0777 /var/run/zeusd/zeusd.sock") == ["0777"]


def test_the_zeusd_daemonset_writes_the_gpu_index_map_pods_read() -> None:
    """Finding: zeusd was told the GPU index a pod sees (0) instead of its host index; a pod's GPU UUID is now
    mapped to zeusd's index with the node's map, which the DaemonSet writes where pods find it."""
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _deploy_docs()}
    pod_spec = docs[("DaemonSet", "zeusd")]["spec"]["template"]["spec"]
    (init,) = pod_spec["initContainers"]
    settings = KubernetesSettings()
    assert init["command"][-3:] == ["carbonflow.energy.zeusd", "write-index-map", settings.gpu_index_map_path]
    assert {e["name"]: e["value"] for e in init["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"  # every GPU of the host
    assert init["volumeMounts"] == [{"name": "zeusd-socket", "mountPath": settings.zeusd_mount_path}]
    assert "nvidia.com/gpu" not in str(init["resources"])  # it must not take a GPU away from training
    pod = ManifestBuilder(settings).build(make_spec(), make_plan(1)).to_dicts()[-1]
    assert env_of(pod["spec"]["containers"][0])["CARBONFLOW_GPU_INDEX_MAP"] == settings.gpu_index_map_path
    restore = ManifestBuilder(settings).restore_pod(make_spec(), "cf-x-1", "node-a").to_dict()
    assert {e["name"]: e["value"] for e in restore["spec"]["containers"][0]["env"]}[
        "CARBONFLOW_GPU_INDEX_MAP"
    ] == settings.gpu_index_map_path


def test_the_example_manifests_carry_what_the_backend_generates() -> None:
    """The hand-written examples in deploy/k8s/ show the generated tenancy wiring, not an older one."""
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _deploy_docs()}
    generated = ManifestBuilder(KubernetesSettings()).build(make_spec(), make_plan(1)).to_dicts()[-1]["spec"]
    want = generated["containers"][0]
    examples = [
        docs[("Pod", "carbonflow-example-train")]["spec"],
        docs[("Job", "carbonflow-example-ddp")]["spec"]["template"]["spec"],
    ]
    for example in examples:
        got = example["containers"][0]
        assert got["securityContext"] == want["securityContext"]
        assert example["terminationGracePeriodSeconds"] == generated["terminationGracePeriodSeconds"]
        names = (
            "CARBONFLOW_POWER_JOURNAL_DIR",
            "CARBONFLOW_GPU_INDEX_MAP",
            "CARBONFLOW_TRAINING_UID",
            "ZEUSD_SOCK_PATH",
        )
        assert {n: env_of(got)[n] for n in names} == {n: env_of(want)[n] for n in names}
        mounts = {m["name"]: m for m in got["volumeMounts"]}
        wanted = {m["name"]: m for m in want["volumeMounts"]}
        assert mounts["zeusd-socket"] == wanted["zeusd-socket"] and mounts["power-journal"] == wanted["power-journal"]


def test_a_jobs_env_cannot_set_pod_name_cuda_visible_devices_or_the_journal_directory() -> None:
    """Finding: a job's env came after the admin's settings, so ``POD_NAME`` moved the journal where the restore
    pod does not look, and ``CUDA_VISIBLE_DEVICES`` pointed the training at another GPU. Refused by name at
    validation, and again by the manifest builder (for a JobSpec that skipped validation) before anything
    is built."""
    from pydantic import ValidationError

    for name in ("POD_NAME", "CUDA_VISIBLE_DEVICES", "CARBONFLOW_POWER_JOURNAL_DIR"):
        with pytest.raises(ValidationError, match=f"env.{name}"):
            make_spec(env={name: "elsewhere"})
        unchecked = make_spec().model_copy(update={"env": {name: "elsewhere"}})
        with pytest.raises(ValueError, match=f"env.{name}"):
            ManifestBuilder(KubernetesSettings()).build(unchecked, make_plan(1))
    # and what a job may set comes before carbonflow's own variables (in a container the last one wins)
    pod = ManifestBuilder(KubernetesSettings()).build(make_spec(env={"MY_FLAG": "1"}), make_plan(1)).to_dicts()[-1]
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names[0] == "POD_NAME" and names.index("MY_FLAG") < names.index("CARBONFLOW_POWER_JOURNAL_DIR")


def test_a_gpu_jobs_own_image_is_refused_unless_the_cluster_trusts_it() -> None:
    """Finding: ``JobSpec.image`` chose the image whose ``carbonflow`` entrypoint runs as root beside zeusd's
    socket (and the restore pod ran the job's image too): a job could bring its own "wrapper"."""
    settings = KubernetesSettings(image="reg/carbonflow:1", trusted_images=["reg/team-*:*"])
    builder = ManifestBuilder(settings)
    with pytest.raises(ValueError, match=r"image='evil/train:1' is not allowed on GPU pods"):
        builder.build(make_spec(image="evil/train:1"), make_plan(1))
    for image in ("reg/carbonflow:1", "reg/team-vision:3"):
        pod = builder.build(make_spec(image=image), make_plan(1)).to_dicts()[-1]
        assert pod["spec"]["containers"][0]["image"] == image
    cpu = builder.build(make_spec(image="evil/train:1", device_kind="cpu"), make_plan(1)).to_dicts()[-1]
    assert "ZEUSD_SOCK_PATH" not in env_of(cpu["spec"]["containers"][0])  # no agent mounted: any image may run
    restore = builder.restore_pod(make_spec(image="reg/team-vision:3"), "cf-x-1", "node-a").to_dict()
    container = restore["spec"]["containers"][0]
    assert container["image"] == "reg/carbonflow:1"  # the cluster's, never the job's
    assert container["security_context"]["run_as_user"] == 0
    assert container["security_context"]["capabilities"]["drop"] == ["ALL"]
