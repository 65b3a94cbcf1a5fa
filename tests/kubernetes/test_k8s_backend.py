"""KubernetesBackend lifecycle against a local fake of the Kubernetes API (a real HTTP server)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi

from carbonflow.domain import Config, DeviceEnergy, ForecastPoint, JobSpec, Plan
from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import (
    KubernetesBackend,
    KubernetesRunError,
    merge_ranks,
    parse_signed_result,
)
from carbonflow.execution.signing import RESULT_KEY_ENV, new_result_key, result_line, sign_result
from carbonflow.execution.wrapper import WrappedRun

pytestmark = pytest.mark.timeout(60)


def make_spec() -> JobSpec:
    return JobSpec(
        name="resnet_nightly",
        command=["python", "train.py"],
        epochs=1,
        samples_per_epoch=50_000,
        region="GB",
        max_containers=4,
    )


def make_plan(containers: int = 1) -> Plan:
    now = datetime.now(UTC)
    return Plan(
        job="resnet_nightly",
        config=Config(containers=containers, power_limit_w=175),
        start=now,
        finish_by=now + timedelta(hours=8),
        predicted_duration_s=60,
        predicted_energy_j=9000,
        predicted_emissions_g=0.5,
        region="GB",
        forecast_provider="uk-neso",
        signal_kind="average-direct",
        reason="test",
    )


def container_result(view: ContainerView, *, energy_j: float = 1000.0, accuracy: float = 0.97) -> WrappedRun:
    """What the wrapper inside the container would write: built from the files/env the container sees."""
    plan = Plan.model_validate_json(view.files["/etc/carbonflow/plan.json"])
    job = JobSpec.model_validate_json(view.files["/etc/carbonflow/job.json"])
    rank = int(view.env.get("RANK", "0"))
    start = datetime(2026, 1, 1, 2, 0, tzinfo=UTC) + timedelta(seconds=rank)
    return WrappedRun(
        job=job.name,
        config_key=plan.config.key(),
        started_at=start,
        ended_at=start + timedelta(seconds=100),
        duration_s=100,
        exit_code=0,
        devices=[
            DeviceEnergy(
                device_id="GPU-0",
                device_model="A100",
                kind="gpu",
                energy_j=energy_j,
                label="measured",
                power_limit_w=plan.config.power_limit_w,
            ),
            DeviceEnergy(
                device_id="cpu-package-0", device_model="EPYC", kind="cpu", energy_j=200.0 + rank, label="estimated"
            ),
        ],
        steps=50,
        samples=1000 * (rank + 1),
        throughput_samples_per_s=10,
        metrics={"test_accuracy": accuracy - rank * 0.01, "rank": float(rank)},
        power_limit_w=plan.config.power_limit_w,
        notes=[f"zeusd={view.env.get('ZEUSD_SOCK_PATH')}", f"world={view.env.get('WORLD_SIZE', '1')}"],
    )


def signed(view: ContainerView, run: WrappedRun) -> str:
    """The run as its wrapper writes it to the termination log: signed with the run's key from its environment."""
    return sign_result(run.model_dump_json(), view.env[RESULT_KEY_ENV])


@pytest.fixture
def kube(tmp_path):
    seen: list[ContainerView] = []

    def behaviour(view: ContainerView) -> ContainerOutcome:
        seen.append(view)
        result = container_result(view)
        return ContainerOutcome(
            exit_code=0,
            termination_message=signed(view, result),
            log="epoch 1 loss 0.3\n",
            pending_reads=1,
            running_reads=2,
        )

    with FakeKubeApi(behaviour) as api:
        api.seen = seen
        api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        yield api


def backend_for(api: FakeKubeApi, **kw) -> KubernetesBackend:
    return KubernetesBackend(
        KubernetesSettings(namespace="ml"), config_file=str(api.kubeconfig), poll_interval_s=0.01, **kw
    )


def test_one_container_runs_as_a_pod_and_everything_is_deleted(kube):
    points = [ForecastPoint(start=datetime(2026, 1, 1, 1, 30, tzinfo=UTC), length_s=3600, gco2_per_kwh=180.0)]
    result = backend_for(kube).run(make_spec(), make_plan(1), points)
    assert result.job == "resnet_nightly"
    assert result.energy_total_j == pytest.approx(1200)
    assert result.emissions_g == pytest.approx(1200 / 3.6e6 * 180)
    assert result.metrics["test_accuracy"] == pytest.approx(0.97)
    assert any(n.startswith("ran on Kubernetes as Pod ml/cf-resnet-nightly-") for n in result.notes)
    # the container saw the job, the plan, and the zeusd socket
    (view,) = kube.seen
    assert view.env["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
    assert view.files["/var/run/zeusd"] == "<hostPath /var/run/zeusd>"
    assert view.command == ["carbonflow"] and view.args[0] == "run"
    assert view.args[view.args.index("--") + 1 :] == ["python", "train.py"]
    assert "zeusd=/var/run/zeusd/zeusd.sock" in result.notes
    # created in order, all deleted with a grace period, nothing left
    posts = [p for m, p in kube.requests if m == "POST"]
    assert posts == ["/api/v1/namespaces/ml/configmaps", "/api/v1/namespaces/ml/pods"]
    assert {k for k, *_ in kube.deleted} == {"Pod", "ConfigMap"}
    assert all(opts.get("gracePeriodSeconds") == 60 for *_, opts in kube.deleted)
    assert kube.objects == {}


def test_several_containers_run_as_indexed_job_with_ranks(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(
            termination_message=signed(view, container_result(view)), pending_reads=1, running_reads=2
        )

    def node_for(pod: dict) -> str:  # ranks 0 and 1 share a node, rank 2 has its own
        index = int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        return "gpu-node-a" if index < 2 else "gpu-node-b"

    with FakeKubeApi(behaviour, node_for) as kube:
        seen = []
        kube.behaviour = lambda view: (seen.append(view), behaviour(view))[1]
        result = backend_for_path(kube, tmp_path).execute(make_spec(), make_plan(3))
        kube.seen = seen
        _check_indexed_job(kube, result)


def _check_indexed_job(kube: FakeKubeApi, result: WrappedRun) -> None:
    ranks = sorted(int(v.env["RANK"]) for v in kube.seen)
    assert ranks == [0, 1, 2]
    assert {v.env["WORLD_SIZE"] for v in kube.seen} == {"3"}
    assert all(v.env["RANK"] == v.env["JOB_COMPLETION_INDEX"] for v in kube.seen)
    master = {v.env["MASTER_ADDR"] for v in kube.seen}
    (addr,) = master
    job_pod_hosts = {v.pod["spec"]["hostname"] for v in kube.seen}
    assert addr.split(".")[0] in job_pod_hosts and addr.split(".")[0].endswith("-0")
    assert addr.split(".")[1] == kube.seen[0].pod["spec"]["subdomain"]
    # merged over ranks: each node's GPU counted; node a's CPU measured by ranks 0 and 1 counted once
    ids = sorted(d.device_id for d in result.devices)
    assert ids == ["gpu-node-a/GPU-0", "gpu-node-a/cpu-package-0", "gpu-node-b/GPU-0", "gpu-node-b/cpu-package-0"]
    energy = {d.device_id: d.energy_j for d in result.devices}
    assert energy["gpu-node-a/cpu-package-0"] == pytest.approx(201)  # the widest view of one counter
    assert energy["gpu-node-a/GPU-0"] == pytest.approx(1000)
    assert any("counted once" in n for n in result.notes)
    assert result.samples == 1000 + 2000 + 3000
    assert result.metrics["rank"] == 0.0  # metrics of rank 0
    assert result.duration_s == pytest.approx(102)
    kinds = [p.rsplit("/", 1)[-1] for m, p in kube.requests if m == "POST"]
    assert kinds == ["configmaps", "services", "jobs"]
    assert kube.objects == {}  # job deletion cascaded to its pods; service and config map deleted


def test_result_falls_back_to_the_log_when_the_termination_message_is_too_long(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        result = container_result(view)
        result.notes = ["x" * 300] * 20  # > 4096 bytes: the kubelet truncates the termination message
        text = result.model_dump_json()
        assert len(text) > 4096
        line = result_line(text, view.env[RESULT_KEY_ENV])
        return ContainerOutcome(termination_message=signed(view, result), log=f"training...\n{line}\nbye\n")

    with FakeKubeApi(behaviour) as api:
        backend = backend_for_path(api, tmp_path)
        result = backend.execute(make_spec(), make_plan(1))
    assert sum(d.energy_j for d in result.devices) == pytest.approx(1200)
    assert any(p.endswith("/log") for m, p in api.requests if m == "GET")


def backend_for_path(api: FakeKubeApi, tmp_path, **kw) -> KubernetesBackend:
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
    return backend_for(api, **kw)


def test_failed_container_without_result_raises_with_log_tail_and_cleans_up(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=137, log="epoch 1\nKilled: out of memory\n")

    with FakeKubeApi(behaviour) as api:
        with pytest.raises(KubernetesRunError, match=r"(?s)exit_code=137.*Killed: out of memory"):
            backend_for_path(api, tmp_path).execute(make_spec(), make_plan(1))
        assert api.objects == {}
        # the killed wrapper could not restore: a restore pod ran on that node, on that pod's journals
        (restore,) = api.restores
        (training,) = [name for kind, _, name, _ in api.deleted if kind == "Pod" and name.startswith("cf-resnet")]
        assert restore.pod["spec"]["nodeName"] == "gpu-node-a"
        assert restore.env["JOURNAL_DIR"] == f"/var/lib/carbonflow/power-journal/{training}"
        assert restore.env["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
        assert "python -m carbonflow.energy.power_limit restore" in restore.command[-1]
        assert restore.files["/var/lib/carbonflow/power-journal"] == "<hostPath /var/lib/carbonflow/power-journal>"
        assert "nvidia.com/gpu" not in str(restore.pod["spec"]["containers"][0].get("resources"))


def test_training_pod_keeps_its_power_journal_on_the_host(kube):
    backend_for(kube).execute(make_spec(), make_plan(1))
    (view,) = kube.seen
    pod_name = view.pod["metadata"]["name"]
    assert view.env["POD_NAME"] == pod_name
    # the pod's own sub-directory of the host's journal directory, and no other pod's, is mounted there
    assert view.env["CARBONFLOW_POWER_JOURNAL_DIR"] == "/var/lib/carbonflow/power-journal"
    assert view.host_paths["/var/lib/carbonflow/power-journal"] == f"/var/lib/carbonflow/power-journal/{pod_name}"
    assert view.host_paths["/var/run/zeusd"] == "/var/run/zeusd" and "/var/run/zeusd" in view.read_only
    assert view.env["CARBONFLOW_GPU_INDEX_MAP"] == "/var/run/zeusd/gpu-index-map.json"
    assert kube.restores == []  # a run that ended normally needs no restore pod


def test_a_failed_restore_is_reported_on_the_error(tmp_path):
    with FakeKubeApi(lambda v: ContainerOutcome(exit_code=137, log="Killed\n")) as api:
        api.restore_behaviour = lambda view: ContainerOutcome(exit_code=1, log="zeusd: connection refused\n")
        with pytest.raises(KubernetesRunError) as err:
            backend_for_path(api, tmp_path).execute(make_spec(), make_plan(2))
        notes = "\n".join(getattr(err.value, "__notes__", []))
        assert notes.count("power-limit restore for job-cf-resnet-nightly-") == 2  # one per rank's pod
        assert "zeusd: connection refused" in notes
        assert api.objects == {}


def test_failed_exit_code_is_kept_when_the_wrapper_wrote_a_result(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=1, termination_message=signed(view, container_result(view)))

    with FakeKubeApi(behaviour) as api:
        result = backend_for_path(api, tmp_path).execute(make_spec(), make_plan(1))
    assert result.exit_code == 1


def test_image_pull_error_fails_fast(tmp_path):
    with FakeKubeApi(lambda v: ContainerOutcome(waiting_reason="ErrImagePull")) as api:
        with pytest.raises(KubernetesRunError, match="ErrImagePull"):
            backend_for_path(api, tmp_path).execute(make_spec(), make_plan(2))
        assert api.objects == {}


def test_poll_says_a_job_whose_pod_cannot_pull_its_image_has_ended_as_execute_does(tmp_path):
    """One rule for whether a run ended, waited on (``execute``) or polled (a deferred task's trigger): a Job whose
    pod cannot pull its image has ended (the trigger once kept polling it)."""
    with FakeKubeApi(lambda v: ContainerOutcome(waiting_reason="ErrImagePull")) as api:
        backend = backend_for_path(api, tmp_path)
        handle = backend.start(make_spec(), make_plan(2))
        deadline = time.monotonic() + 10
        while (status := backend.poll(handle)).state != "finished" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert status.state == "finished" and "cannot start: ErrImagePull" in status.message
        with pytest.raises(KubernetesRunError, match="ErrImagePull"):
            backend.collect(handle)
        assert api.objects == {}


def test_unschedulable_pod_times_out_and_is_deleted(tmp_path):
    clock = iter(range(0, 10_000, 100))
    with FakeKubeApi(lambda v: ContainerOutcome(pending_reads=10**6)) as api:
        backend = backend_for_path(api, tmp_path, startup_timeout_s=500, clock=lambda: float(next(clock)))
        with pytest.raises(KubernetesRunError, match=r"still Pending .*startup_timeout_s=500"):
            backend.execute(make_spec(), make_plan(1))
        assert api.objects == {}


def test_stop_deletes_the_running_pod(tmp_path):
    with FakeKubeApi(lambda v: ContainerOutcome(pending_reads=0, running_reads=10**6)) as api:
        backend = backend_for_path(api, tmp_path)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                backend.execute(make_spec(), make_plan(1))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        while not any(p["status"]["phase"] == "Running" for p in api.live("Pod")):  # scheduled and started
            threading.Event().wait(0.01)
        backend.kill()
        thread.join(10)
        assert not thread.is_alive()
        assert errors and "stopped (on_kill)" in str(errors[0])
        assert api.objects == {}
        assert len(api.restores) == 1  # killed while running: its journals were replayed on its node


def test_fake_api_rejects_invalid_objects_like_a_server(kube):
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bad"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": {"n": 1}}}}]},
    }
    with pytest.raises(client.exceptions.ApiException) as err:
        api.create_namespaced_pod("ml", bad)
    assert err.value.status == 422


def test_parse_signed_result_and_merge_bad_input():
    key = new_result_key()
    assert parse_signed_result(None, key) == (None, [])
    assert parse_signed_result("no json here\n{not json}", key) == (None, [])
    with pytest.raises(ValueError, match=r"ranks=\[\]"):
        merge_ranks([])
    run, refused = parse_signed_result(sign_result(json.dumps({"job": "x"}), key), key)
    assert run is None and "not a WrappedRun" in refused[0]  # signed, but not a WrappedRun


def test_profile_mode_passes_the_step_budget_to_the_wrapper(kube):
    backend_for(kube).execute(make_spec(), make_plan(1), profile_steps=30, warmup_steps=5)
    args = kube.seen[0].args
    assert args[args.index("--profile-steps") + 1] == "30" and args[args.index("--warmup-steps") + 1] == "5"


def test_backend_from_env_reads_settings_and_kubeconfig(kube, monkeypatch):
    monkeypatch.setenv("CARBONFLOW_K8S_SETTINGS", '{"namespace": "ml", "image": "reg/cf:1"}')
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend.from_env(poll_interval_s=0.01)
    assert backend.settings.namespace == "ml" and backend.settings.image == "reg/cf:1"
    backend.execute(make_spec(), make_plan(1))
    assert kube.seen[0].pod["spec"]["containers"][0]["image"] == "reg/cf:1"
    monkeypatch.setenv("CARBONFLOW_K8S_SETTINGS", '{"namespace": "Not_Valid"}')
    with pytest.raises(ValueError, match="CARBONFLOW_K8S_SETTINGS is not valid"):
        KubernetesBackend.from_env()
