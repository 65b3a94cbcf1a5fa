"""KubernetesBackend lifecycle against a local fake of the Kubernetes API (a real HTTP server)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi

from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import (
    RESULT_LINE_PREFIX,
    KubernetesBackend,
    KubernetesRunError,
    merge_rank_results,
    parse_result_text,
)
from carbonflow.models import Config, DeviceEnergy, JobSpec, Plan, RunResult

pytestmark = pytest.mark.timeout(60)


def make_spec() -> JobSpec:
    return JobSpec(name="resnet_nightly", command=["python", "train.py"], epochs=1, region="GB", max_containers=4)


def make_plan(containers: int = 1) -> Plan:
    now = datetime.now(UTC)
    return Plan(job="resnet_nightly", config=Config(containers=containers, power_limit_w=175), start=now,
                finish_by=now + timedelta(hours=8), predicted_duration_s=60, predicted_energy_j=9000,
                predicted_emissions_g=0.5, region="GB", forecast_provider="uk-neso", signal_kind="average-direct",
                reason="test")


def container_result(view: ContainerView, *, energy_j: float = 1000.0, accuracy: float = 0.97) -> RunResult:
    """What the wrapper inside the container would write: built from the files/env the container sees."""
    plan = Plan.model_validate_json(view.files["/etc/carbonflow/plan.json"])
    job = JobSpec.model_validate_json(view.files["/etc/carbonflow/job.json"])
    rank = int(view.env.get("RANK", "0"))
    start = datetime(2026, 1, 1, 2, 0, tzinfo=UTC) + timedelta(seconds=rank)
    return RunResult(
        job=job.name, config=plan.config, started_at=start, ended_at=start + timedelta(seconds=100),
        duration_s=100, devices=[DeviceEnergy(device_id="GPU-0", device_model="A100", kind="gpu", energy_j=energy_j,
                                              label="measured", power_limit_w=plan.config.power_limit_w)],
        energy_gpu_j=energy_j, energy_cpu_j=0, energy_total_j=energy_j, energy_labels=["measured"],
        emissions_g=energy_j / 3.6e6 * 200, carbon_intensity_mean_gco2_per_kwh=200, samples=1000 * (rank + 1),
        throughput_samples_per_s=10, metrics={"test_accuracy": accuracy - rank * 0.01, "rank": float(rank)},
        emissions_run_now_default_g=energy_j / 3.6e6 * 300,
        notes=[f"zeusd={view.env.get('ZEUSD_SOCK_PATH')}", f"world={view.env.get('WORLD_SIZE', '1')}"],
    )


@pytest.fixture
def kube(tmp_path):
    seen: list[ContainerView] = []

    def behaviour(view: ContainerView) -> ContainerOutcome:
        seen.append(view)
        result = container_result(view)
        return ContainerOutcome(exit_code=0, termination_message=result.model_dump_json(),
                                log="epoch 1 loss 0.3\n", pending_reads=1, running_reads=2)

    with FakeKubeApi(behaviour) as api:
        api.seen = seen
        api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        yield api


def backend_for(api: FakeKubeApi, **kw) -> KubernetesBackend:
    return KubernetesBackend(KubernetesSettings(namespace="ml"), config_file=str(api.kubeconfig),
                             poll_interval_s=0.01, **kw)


def test_one_container_runs_as_a_pod_and_everything_is_deleted(kube):
    result = backend_for(kube).run(make_spec(), make_plan(1))
    assert result.job == "resnet_nightly"
    assert result.energy_total_j == 1000
    assert result.metrics["test_accuracy"] == pytest.approx(0.97)
    assert any(n.startswith("ran on Kubernetes as Pod ml/cf-resnet-nightly-") for n in result.notes)
    # the container saw the job, the plan, and the zeusd socket
    (view,) = kube.seen
    assert view.env["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
    assert view.files["/var/run/zeusd"] == "<hostPath /var/run/zeusd>"
    assert view.command == ["carbonflow"] and view.args[0] == "run"
    assert "zeusd=/var/run/zeusd/zeusd.sock" in result.notes
    # created in order, all deleted with a grace period, nothing left
    posts = [p for m, p in kube.requests if m == "POST"]
    assert posts == ["/api/v1/namespaces/ml/configmaps", "/api/v1/namespaces/ml/pods"]
    assert {k for k, *_ in kube.deleted} == {"Pod", "ConfigMap"}
    assert all(opts.get("gracePeriodSeconds") == 60 for *_, opts in kube.deleted)
    assert kube.objects == {}


def test_several_containers_run_as_indexed_job_with_ranks(kube):
    result = backend_for(kube).run(make_spec(), make_plan(3))
    ranks = sorted(int(v.env["RANK"]) for v in kube.seen)
    assert ranks == [0, 1, 2]
    assert {v.env["WORLD_SIZE"] for v in kube.seen} == {"3"}
    assert all(v.env["RANK"] == v.env["JOB_COMPLETION_INDEX"] for v in kube.seen)
    master = {v.env["MASTER_ADDR"] for v in kube.seen}
    (addr,) = master
    job_pod_hosts = {v.pod["spec"]["hostname"] for v in kube.seen}
    assert addr.split(".")[0] in job_pod_hosts and addr.split(".")[0].endswith("-0")
    assert addr.split(".")[1] == kube.seen[0].pod["spec"]["subdomain"]
    # merged over ranks
    assert result.energy_total_j == pytest.approx(3000)
    assert result.samples == 1000 + 2000 + 3000
    assert result.metrics["rank"] == 0.0  # metrics of rank 0
    assert [d.device_id for d in result.devices] == ["rank0/GPU-0", "rank1/GPU-0", "rank2/GPU-0"]
    assert result.saving_g == pytest.approx(3 * 1000 / 3.6e6 * 100)
    kinds = [p.rsplit("/", 1)[-1] for m, p in kube.requests if m == "POST"]
    assert kinds == ["configmaps", "services", "jobs"]
    assert kube.objects == {}  # job deletion cascaded to its pods; service and config map deleted


def test_result_falls_back_to_the_log_when_the_termination_message_is_too_long(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        result = container_result(view)
        result.notes = ["x" * 300] * 20  # > 4096 bytes: the kubelet truncates the termination message
        text = result.model_dump_json()
        assert len(text) > 4096
        return ContainerOutcome(termination_message=text, log=f"training...\n{RESULT_LINE_PREFIX}{text}\nbye\n")

    with FakeKubeApi(behaviour) as api:
        backend = backend_for_path(api, tmp_path)
        result = backend.run(make_spec(), make_plan(1))
    assert result.energy_total_j == 1000
    assert ("GET", next(p for m, p in api.requests if p.endswith("/log"))) in api.requests


def backend_for_path(api: FakeKubeApi, tmp_path, **kw) -> KubernetesBackend:
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
    return backend_for(api, **kw)


def test_failed_container_without_result_raises_with_log_tail_and_cleans_up(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=137, log="epoch 1\nKilled: out of memory\n")

    with FakeKubeApi(behaviour) as api:
        with pytest.raises(KubernetesRunError, match=r"(?s)exit_code=137.*Killed: out of memory"):
            backend_for_path(api, tmp_path).run(make_spec(), make_plan(1))
        assert api.objects == {}


def test_failed_exit_code_is_kept_when_the_wrapper_wrote_a_result(tmp_path):
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=1, termination_message=container_result(view).model_dump_json())

    with FakeKubeApi(behaviour) as api:
        result = backend_for_path(api, tmp_path).run(make_spec(), make_plan(1))
    assert result.exit_code == 1 and not result.succeeded


def test_image_pull_error_fails_fast(tmp_path):
    with FakeKubeApi(lambda v: ContainerOutcome(waiting_reason="ErrImagePull")) as api:
        with pytest.raises(KubernetesRunError, match="ErrImagePull"):
            backend_for_path(api, tmp_path).run(make_spec(), make_plan(2))
        assert api.objects == {}


def test_unschedulable_pod_times_out_and_is_deleted(tmp_path):
    clock = iter(range(0, 10_000, 100))
    with FakeKubeApi(lambda v: ContainerOutcome(pending_reads=10**6)) as api:
        backend = backend_for_path(api, tmp_path, startup_timeout_s=500, clock=lambda: float(next(clock)))
        with pytest.raises(KubernetesRunError, match=r"still Pending .*startup_timeout_s=500"):
            backend.run(make_spec(), make_plan(1))
        assert api.objects == {}


def test_stop_deletes_the_running_pod(tmp_path):
    with FakeKubeApi(lambda v: ContainerOutcome(pending_reads=0, running_reads=10**6)) as api:
        backend = backend_for_path(api, tmp_path)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                backend.run(make_spec(), make_plan(1))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        while not api.live("Pod"):
            threading.Event().wait(0.01)
        backend.stop()
        thread.join(10)
        assert not thread.is_alive()
        assert errors and "stopped (on_kill)" in str(errors[0])
        assert api.objects == {}


def test_fake_api_rejects_invalid_objects_like_a_server(kube):
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": {"n": 1}}}}]}}
    with pytest.raises(client.exceptions.ApiException) as err:
        api.create_namespaced_pod("ml", bad)
    assert err.value.status == 422


def test_parse_result_text_and_merge_bad_input():
    assert parse_result_text(None) is None
    assert parse_result_text("no json here\n{not json}") is None
    with pytest.raises(ValueError, match=r"results=\[\]"):
        merge_rank_results([])
    text = json.dumps({"job": "x"})
    assert parse_result_text(text) is None  # not a RunResult
