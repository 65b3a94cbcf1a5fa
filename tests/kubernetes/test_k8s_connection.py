"""Issue #22: in Airflow the Kubernetes backend's one client is the cncf-kubernetes provider's ``KubernetesHook``,
made from an Airflow connection (``kubernetes_conn_id``, default ``kubernetes_default``); the connection's id, never
a credential, travels to the triggerer, which makes its client from the same connection. Outside Airflow the backend
still builds its client from a kubeconfig (``carbonflow run``, the benchmarks).

The cluster is the FAKE API (``fake_kube_api.py``); the Airflow connection is set as ``AIRFLOW_CONN_<ID>``, pointing
at the fake API's kubeconfig, as a user would set it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk.exceptions import TaskDeferred
from fake_kube_api import ContainerOutcome, FakeKubeApi
from test_k8s_backend import backend_for, make_plan, make_spec
from test_k8s_deferral import T0, _Ti, _until_pod_deferral
from test_k8s_profile_deferral import JOB, _behaviour, _fire

from carbonflow.domain import Profile
from carbonflow.execution import kubernetes as k8s_backend
from carbonflow.execution.backend import make_backend
from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
from carbonflow.operators.kubernetes import DEFAULT_CONN_ID, KubernetesConnectionError, operator_backend
from carbonflow.operators.profile import EnergyProfileOperator
from carbonflow.operators.triggers import BackendRunTrigger, _cancel_run


@pytest.fixture
def api(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The fake cluster, an Airflow connection ``fake_cluster`` to it (namespace ``ml``), and a record of every
    client the provider's hook made; a client built from a kubeconfig by the backend itself fails the test."""
    monkeypatch.setattr(EnergyProfileOperator, "_log_profile", lambda self, spec, profile: None)  # no MLflow here
    with FakeKubeApi(_behaviour) as fake:
        fake.kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig.json")
        extra = {"kube_config_path": str(fake.kubeconfig), "namespace": "ml"}
        monkeypatch.setenv("AIRFLOW_CONN_FAKE_CLUSTER", json.dumps({"conn_type": "kubernetes", "extra": extra}))
        fake.hook_clients = []
        get_conn = KubernetesHook.get_conn

        def recorded(hook: KubernetesHook) -> Any:
            client = get_conn(hook)
            fake.hook_clients.append((hook.conn_id, client))
            return client

        def no_own_client(**kwargs: Any) -> Any:
            raise AssertionError(f"the backend built its own client ({kwargs}) beside the provider hook's")

        monkeypatch.setattr(KubernetesHook, "get_conn", recorded)
        monkeypatch.setattr(k8s_backend, "load_api_client", no_own_client)
        yield fake


def _profiler(**kwargs: Any) -> EnergyProfileOperator:
    return EnergyProfileOperator(task_id="profile", job=JOB, backend="kubernetes", reuse_profiles=False, poll_s=0.05,
                                 **kwargs)  # fmt: skip


def test_the_default_connection_id_is_the_providers() -> None:
    assert DEFAULT_CONN_ID == KubernetesHook.default_conn_name == "kubernetes_default"
    assert _profiler().kubernetes_conn_id == DEFAULT_CONN_ID


def test_the_profile_task_and_its_trigger_get_their_client_from_the_hook_with_the_named_connection(api) -> None:  # type: ignore[no-untyped-def]
    context = {"run_id": "k8s-connection"}
    with pytest.raises(TaskDeferred) as first:
        op = _profiler(kubernetes_conn_id="fake_cluster")
        op.execute(context)
    (conn_id, client), *_ = api.hook_clients
    assert conn_id == "fake_cluster" and op._backend._api_client is client, "one client: the hook's"
    (pod,) = api.live("Pod")
    assert pod["metadata"]["namespace"] == "ml", "the namespace comes from the connection"
    _, kwargs = first.value.trigger.serialize()
    assert kwargs["backend_options"]["conn_id"] == "fake_cluster"
    assert str(api.kubeconfig) not in json.dumps(kwargs) and "fake-token" not in json.dumps(kwargs), (
        "the connection's id travels to the triggerer, not its kubeconfig or token"
    )

    event = asyncio.run(_fire(BackendRunTrigger(**kwargs)))  # the triggerer: a client from the same connection
    assert event.payload["message"] == "Succeeded"
    assert [c for c, _ in api.hook_clients] == ["fake_cluster", "fake_cluster"]
    with pytest.raises(TaskDeferred) as second:
        _profiler(kubernetes_conn_id="fake_cluster").execute_run_ended(context, event.payload)
    event = asyncio.run(_fire(second.value.trigger))
    resumed = _profiler(kubernetes_conn_id="fake_cluster")
    profile = Profile.model_validate(resumed.execute_run_ended(context, event.payload))
    assert [p.config.containers for p in profile.points] == [1, 2]
    assert {c for c, _ in api.hook_clients} == {"fake_cluster"}
    assert not api.live("Pod") and not api.live("Job") and not api.live("ConfigMap")


def test_an_unknown_connection_id_fails_naming_it_before_any_pod_is_created(api) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KubernetesConnectionError, match=r"kubernetes_conn_id='no_such_cluster': no Airflow "
                       r"connection of that id is defined.*AIRFLOW_CONN_NO_SUCH_CLUSTER"):  # fmt: skip
        _profiler(kubernetes_conn_id="no_such_cluster").execute({"run_id": "k8s-unknown-connection"})
    assert api.requests == [] and api.objects == {}, "nothing was sent to the cluster"


def test_a_job_option_names_another_connection_than_the_operators(api) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TaskDeferred) as deferred:
        op = _profiler(kubernetes_conn_id="no_such_cluster", kubernetes={"conn_id": "fake_cluster"})
        op.execute({"run_id": "k8s-job-conn"})
    _, kwargs = deferred.value.trigger.serialize()
    assert kwargs["backend_options"]["conn_id"] == "fake_cluster"
    _cancel_run("kubernetes", kwargs["backend_options"], kwargs["handles"][0])  # as the trigger's on_kill does
    assert not api.live("Pod") and not api.live("ConfigMap")


def _trainer(**kwargs: Any) -> CarbonAwareTrainingOperator:
    job = {"name": "pod-job", "command": ["python", "train.py"], "steps": 100, "region": "GB", "device_kind": "cpu",
           "finish_by": "2023-03-15T01:00:00+00:00"}  # fmt: skip
    return CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile", replay=True,
                                       replay_start=T0.isoformat(), replay_speedup=1e7, replay_min_wait_s=0,
                                       backend="kubernetes", pod_poll_s=0.05, **kwargs)  # fmt: skip


def test_the_training_task_gets_its_client_from_the_hook_with_the_named_connection(api) -> None:  # type: ignore[no-untyped-def]
    deferred = _until_pod_deferral(_trainer(kubernetes_conn_id="fake_cluster"), {"ti": _Ti(), "run_id": "k8s-conn"})
    assert [c for c, _ in api.hook_clients] == ["fake_cluster"]
    (pod,) = api.live("Pod")
    assert pod["metadata"]["namespace"] == "ml"
    _, kwargs = deferred.trigger.serialize()
    assert kwargs["backend_options"]["conn_id"] == "fake_cluster" and str(api.kubeconfig) not in json.dumps(kwargs)
    _cancel_run("kubernetes", kwargs["backend_options"], kwargs["handles"][0])
    assert [c for c, _ in api.hook_clients] == ["fake_cluster", "fake_cluster"] and not api.live("Pod")


def test_the_training_task_with_an_unknown_connection_fails_naming_it_before_any_pod(api) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KubernetesConnectionError, match="kubernetes_conn_id='elsewhere'"):
        _until_pod_deferral(_trainer(kubernetes_conn_id="elsewhere"), {"ti": _Ti(), "run_id": "k8s-conn-unknown"})
    assert api.objects == {} and not any(method == "POST" for method, _ in api.requests)


def test_an_operators_kubeconfig_option_overrides_the_connections_as_the_providers_arguments_do(api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    backend = operator_backend("kubernetes", tmp_path, {"namespace": "ml", "config_file": str(api.kubeconfig)})
    assert [c for c, _ in api.hook_clients] == [DEFAULT_CONN_ID], "the default connection, undefined: the hook's"
    assert backend.rebuild_options()["conn_id"] == DEFAULT_CONN_ID
    assert backend.rebuild_options()["config_file"] == str(api.kubeconfig)
    handle = backend.start(make_spec(), make_plan(1))
    assert handle.details["namespace"] == "ml"
    backend.cancel(handle)


def test_outside_airflow_the_backend_builds_its_client_from_the_kubeconfig(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with FakeKubeApi(lambda view: ContainerOutcome()) as fake:
        fake.kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig.json")
        backend = backend_for(fake)
        assert backend.conn_id is None and "conn_id" not in backend.rebuild_options()
        assert backend.core.list_namespaced_pod("ml").items == []


def test_a_connection_id_without_its_client_is_refused_outside_airflow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"conn_id='fake_cluster' names an Airflow connection, which only"):
        make_backend("kubernetes", tmp_path, {"namespace": "ml", "conn_id": "fake_cluster"})
