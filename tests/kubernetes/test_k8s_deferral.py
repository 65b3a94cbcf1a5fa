"""Finding: on Kubernetes the training task held its worker slot for the whole training (the backend waited
synchronously). Now the task starts the pod, defers on the generic ``BackendRunTrigger`` that polls it through
the backend contract (``KubernetesBackend.poll``), and resumes, on any worker, to collect, account and log the run.

The cluster is the **fake** Kubernetes API (a real HTTP server speaking the API's JSON; no cluster can run
here): carbonflow's client talks to it through a kubeconfig."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi
from test_k8s_backend import container_result, signed

from carbonflow.domain import Config, Profile, ProfilePoint
from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
from carbonflow.operators.triggers import BackendRunTrigger, CarbonWindowTrigger

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped NESO GB replay


def _profile() -> Profile:
    point = ProfilePoint(config=Config(containers=1), throughput_samples_per_s=500.0, power_per_device_w={"cpu": 50.0},
                         energy_per_sample_j=0.1, duration_s=5, samples=2500, label="estimated")  # fmt: skip
    return Profile(job="pod-job", device_model="EPYC", device_kind="cpu", label="estimated", samples_per_epoch=5000,
                   points=[point])  # fmt: skip


class _Ti:
    def xcom_pull(self, task_ids: str, **_: Any) -> Any:
        return _profile().model_dump(mode="json")

    def xcom_push(self, key: str, value: Any) -> None:
        pass


async def _fire(trigger: Any) -> Any:
    async for event in trigger.run():
        return event


def _operator(api: FakeKubeApi) -> CarbonAwareTrainingOperator:
    job = {"name": "pod-job", "command": ["python", "train.py"], "steps": 100, "region": "GB", "device_kind": "cpu",
           "finish_by": (T0 + timedelta(hours=6)).isoformat()}  # fmt: skip
    return CarbonAwareTrainingOperator(
        task_id="train", job=job, profile_task_id="profile", replay=True, replay_start=T0.isoformat(),
        replay_speedup=1e7, replay_min_wait_s=0, backend="kubernetes", pod_poll_s=0.05,
        kubernetes={"namespace": "ml", "config_file": str(api.kubeconfig)},
        tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
    )  # fmt: skip


def _until_pod_deferral(op: CarbonAwareTrainingOperator, context: dict[str, Any]) -> TaskDeferred:
    """Run the task as Airflow would (carbon-window deferrals fired) until it defers on the pod."""
    try:
        op.execute(context)
    except TaskDeferred as deferred:
        pending = deferred
    for _ in range(10):
        if isinstance(pending.trigger, BackendRunTrigger):
            return pending
        assert isinstance(pending.trigger, CarbonWindowTrigger)
        event = asyncio.run(_fire(pending.trigger))
        try:
            op.execute_complete(context, event.payload)
        except TaskDeferred as again:
            pending = again
    raise AssertionError("the task never deferred on its pod")


def _api(tmp_path, outcome) -> FakeKubeApi:  # type: ignore[no-untyped-def]
    api = FakeKubeApi(outcome)
    api.__enter__()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
    return api


def test_the_task_defers_on_its_pod_and_another_worker_resumes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def behaviour(view: ContainerView) -> ContainerOutcome:
        now = datetime.now(UTC)  # the wrapper in the pod records wall-clock times
        result = container_result(view).model_copy(update={"started_at": now - timedelta(seconds=100), "ended_at": now})
        return ContainerOutcome(exit_code=0, termination_message=signed(view, result), pending_reads=2,
                                running_reads=6)  # fmt: skip

    api = _api(tmp_path, behaviour)
    try:
        op = _operator(api)
        context = {"ti": _Ti(), "run_id": "k8s-deferral"}
        deferred = _until_pod_deferral(op, context)
        trigger = deferred.trigger
        assert deferred.method_name == "execute_run_ended"
        _, kwargs = trigger.serialize()  # the triggerer rebuilds it from its kwargs
        assert api.live("Pod"), "the pod exists while the task is deferred"
        event = asyncio.run(_fire(BackendRunTrigger(**kwargs)))
        assert event.payload["status"] == "ended" and event.payload["message"] == "Succeeded"
        resumed = _operator(api)  # another worker resumes: a fresh operator
        outcome = resumed.execute_run_ended(context, event.payload)
    finally:
        api.__exit__(None, None, None)
    assert outcome["result"]["exit_code"] == 0 and outcome["tracking"]["run_id"]
    assert any("ran on Kubernetes as Pod ml/" in n for n in outcome["result"]["notes"])
    assert not api.live("Pod"), "collected and deleted"


def test_a_failed_pod_fails_the_resumed_task_with_its_exit_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=137, log="Killed: out of memory\n", pending_reads=1, running_reads=2)

    api = _api(tmp_path, behaviour)
    try:
        op = _operator(api)
        context = {"ti": _Ti(), "run_id": "k8s-deferral-failed"}
        deferred = _until_pod_deferral(op, context)
        event = asyncio.run(_fire(deferred.trigger))
        with pytest.raises(Exception, match="exit_code=137"):
            _operator(api).execute_run_ended(context, event.payload)
    finally:
        api.__exit__(None, None, None)
    assert not api.live("Pod"), "a failed pod is deleted too"


def _night(api: FakeKubeApi) -> dict[str, Any]:
    """A night plan that puts two GPU jobs on one time-sliced GPU at 200 W (what NightPlanOperator returns)."""
    from carbonflow.domain import JobSpec, Plan

    jobs, plans = {}, {}
    for name, other in (("pod-a", "pod-b"), ("pod-b", "pod-a")):
        jobs[name] = JobSpec(name=name, command=["python", "train.py"], steps=100, region="GB",
                             finish_by=T0 + timedelta(hours=6)).model_dump(mode="json")  # fmt: skip
        plans[name] = Plan(job=name, config=Config(containers=1, power_limit_w=200, colocation_group="pod-a+pod-b"),
                           start=T0, predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1.0,
                           region="GB", forecast_provider="replay", reason="co-located", colocated_with=[other],
                           replay=True).model_dump(mode="json")  # fmt: skip
    profile = _profile().model_dump(mode="json")
    return {"now": T0.isoformat(), "jobs": jobs, "plans": plans, "profiles": {"pod-a": profile, "pod-b": profile},
            "forecasts": {}, "min_kept_speed": {}, "notes": {}, "groups": [["pod-a", "pod-b"]]}  # fmt: skip


def test_a_colocated_pair_runs_as_two_pods_on_one_shared_gpu_and_sets_its_limit_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seen: list[ContainerView] = []

    def behaviour(view: ContainerView) -> ContainerOutcome:
        seen.append(view)
        now = datetime.now(UTC)
        result = container_result(view).model_copy(update={"started_at": now - timedelta(seconds=60), "ended_at": now})
        return ContainerOutcome(exit_code=0, termination_message=signed(view, result), running_reads=3)

    api = _api(tmp_path, behaviour)
    night = _night(api)

    class _NightTi(_Ti):
        def xcom_pull(self, task_ids: str, **_: Any) -> Any:
            return night

    try:
        op = CarbonAwareTrainingOperator(
            task_id="train", gpu_group=["pod-a", "pod-b"], night_plan_task_id="plan_night", replay=True,
            replay_start=T0.isoformat(), replay_min_wait_s=0, backend="kubernetes", pod_poll_s=0.05,
            kubernetes={"namespace": "ml", "config_file": str(api.kubeconfig)},
            tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
        )  # fmt: skip
        context = {"ti": _NightTi(), "run_id": "k8s-pair"}
        deferred = _until_pod_deferral(op, context)
        assert len(deferred.trigger.handles) == 2  # two pods, one task
        pods = api.live("Pod")
        resources = [p["spec"]["containers"][0]["resources"]["limits"] for p in pods]
        assert all("nvidia.com/gpu.shared" in r for r in resources), resources
        event = asyncio.run(_fire(deferred.trigger))
        outcome = op.execute_run_ended(context, event.payload)
    finally:
        api.__exit__(None, None, None)
    limits = sorted(str(_plan_limit(v)) for v in seen)
    assert limits == ["200", "None"], "the limit is set once, by the first pod; the second runs at the GPU's"
    assert set(outcome["runs"]) == {"pod-a", "pod-b"}
    assert not api.live("Pod")


def _plan_limit(view: ContainerView) -> float | None:
    from carbonflow.domain import Plan

    limit = Plan.model_validate_json(view.files["/etc/carbonflow/plan.json"]).config.power_limit_w
    return None if limit is None else int(limit)


DAG_FILE = """
import json, os
from datetime import datetime
from airflow.sdk import DAG, task
from carbonflow.operators import CarbonAwareTrainingOperator

with DAG(os.environ["E2E_DAG_ID"], schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    @task(task_id="profile")
    def profile():
        return json.loads(os.environ["E2E_PROFILE_JSON"])

    profile() >> CarbonAwareTrainingOperator(
        task_id="train", job=json.loads(os.environ["E2E_JOB_JSON"]), profile_task_id="profile", replay=True,
        replay_start=os.environ["E2E_T0"], replay_min_wait_s=0, backend="kubernetes", pod_poll_s=0.05,
        kubernetes={"namespace": "ml", "config_file": os.environ["E2E_KUBECONFIG"]},
    )
"""


def _pod_phase(api: FakeKubeApi) -> str | None:
    """Read the training pod through the API, as kubectl would (each read moves the fake kubelet on)."""
    (pod,) = [p for p in api.live("Pod") if "carbonflow.io/restores" not in p["metadata"]["labels"]]
    _, body = api.handle("GET", f"/api/v1/namespaces/ml/pods/{pod['metadata']['name']}", None)[:2]
    return body.get("status", {}).get("phase")


def _db_state(ti: Any) -> str | None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return _value(session.scalar(select(TaskInstance.state).where(TaskInstance.id == ti.id)))


def _value(state: Any) -> str | None:
    """A task state as Airflow's API names it (``deferred``), whether a TaskInstanceState or a string."""
    return None if state is None else str(getattr(state, "value", state))


def _dag_test(
    tmp_path, monkeypatch, dag_id: str, behaviour
) -> tuple[dict[str, Any], list[dict[str, Any]], FakeKubeApi]:  # type: ignore[no-untyped-def]
    """Run the DAG with Airflow's own ``dag.test()`` (its task runner, in-process execution API and metadata DB,
    triggers run in line) against the fake API. Each run of the training task is observed as it returns: the
    runner's state, the metadata DB's state and, while it is deferred, the pod's phase."""
    import json

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk.execution_time import supervisor

    api = _api(tmp_path, behaviour)
    observed: list[dict[str, Any]] = []
    real_run = supervisor.run_task_in_process

    def observing(ti: Any, task: Any, client: Any = None) -> Any:
        result = real_run(ti=ti, task=task, client=client)
        if ti.task_id == "train":
            seen = {"state": _value(result.state), "db": _db_state(ti), "error": str(result.error or ""),
                    "trigger": getattr(result.msg, "classpath", "").rsplit(".", 1)[-1]}  # fmt: skip
            if seen["trigger"] == "BackendRunTrigger":  # the worker is free; the pod trains on: watch it run
                deadline = datetime.now(UTC) + timedelta(seconds=30)
                while _pod_phase(api) != "Running" and datetime.now(UTC) < deadline:
                    pass
                seen["pod"] = _pod_phase(api)
                seen["db_while_pod_runs"] = _db_state(ti)
            observed.append(seen)
        return result

    monkeypatch.setattr(supervisor, "run_task_in_process", observing)
    try:
        job = {"name": "pod-job", "command": ["python", "train.py"], "steps": 100, "region": "GB",
               "device_kind": "cpu", "finish_by": (T0 + timedelta(hours=6)).isoformat()}  # fmt: skip
        monkeypatch.setenv("E2E_DAG_ID", dag_id)
        monkeypatch.setenv("E2E_JOB_JSON", json.dumps(job))
        monkeypatch.setenv("E2E_PROFILE_JSON", _profile().model_dump_json())
        monkeypatch.setenv("E2E_T0", T0.isoformat())
        monkeypatch.setenv("E2E_KUBECONFIG", str(api.kubeconfig))
        (tmp_path / f"{dag_id}.py").write_text(DAG_FILE)
        bag = DagBag(dag_folder=str(tmp_path / f"{dag_id}.py"))
        assert not bag.import_errors, bag.import_errors
        DagBundlesManager().sync_bundles_to_db()  # the bundle row the DAG's record points at
        sync_bag_to_db(bag, "dags-folder", None)
        run = bag.get_dag(dag_id).test()
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    finally:
        api.__exit__(None, None, None)
    return states, observed, api


@pytest.mark.slow  # a real Airflow DAG run (dag.test())
def test_training_task_is_deferred_while_pod_runs(tmp_path, airflow_db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Finding: on Kubernetes the training task held its worker slot for the whole training. Through Airflow's
    own ``dag.test()``: the training task returns ``deferred`` (so recorded in the metadata DB) while its pod
    is Running, and succeeds once the pod has ended — collected, logged and deleted."""

    def behaviour(view: ContainerView) -> ContainerOutcome:
        now = datetime.now(UTC)
        result = container_result(view).model_copy(update={"started_at": now - timedelta(seconds=100), "ended_at": now})
        return ContainerOutcome(exit_code=0, termination_message=signed(view, result), running_reads=8)

    states, observed, api = _dag_test(tmp_path, monkeypatch, "k8s_deferral_ok", behaviour)
    *waits, deferred, resumed = observed  # waits for the carbon window, then on its pod, then after the pod ended
    assert all(w["trigger"] == "CarbonWindowTrigger" for w in waits)
    assert deferred["trigger"] == "BackendRunTrigger"
    assert deferred["state"] == deferred["db"] == "deferred"
    assert deferred["pod"] == "Running" and deferred["db_while_pod_runs"] == "deferred"
    assert resumed["state"] == "success" and resumed["error"] == ""
    assert states == {"profile": "success", "train": "success"}, states
    trigger_reads = [path for method, path in api.requests if method == "GET" and "/pods/" in path]
    assert len(trigger_reads) > 3, "the trigger polled the pod through the API"
    assert not api.live("Pod") and not api.live("ConfigMap")


@pytest.mark.slow  # a real Airflow DAG run (dag.test())
def test_through_dag_test_a_failed_pod_fails_the_training_task_with_its_exit_reason(
    tmp_path, airflow_db, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=137, reason="OOMKilled", log="epoch 1\nKilled\n", running_reads=8)

    states, observed, api = _dag_test(tmp_path, monkeypatch, "k8s_deferral_failed", behaviour)
    *_, deferred, resumed = observed
    assert deferred["trigger"] == "BackendRunTrigger"
    assert deferred["state"] == "deferred" and deferred["pod"] == "Running"
    assert deferred["db_while_pod_runs"] == "deferred"
    assert resumed["state"] == "failed"
    assert "exit_code=137 reason=OOMKilled" in resumed["error"] and "Killed" in resumed["error"], resumed["error"]
    assert states == {"profile": "success", "train": "failed"}, states
    assert not api.live("Pod"), "the failed pod was deleted too"


def test_a_user_killing_the_deferred_task_deletes_its_pod_through_the_trigger(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding: a deferred training task marked failed or cleared left its pod training (``on_kill`` of the
    operator does not run while it is deferred). Airflow 3.3 calls the trigger's ``on_kill`` for a user's kill:
    it cancels the run through the backend — pods deleted, waited for until gone (their grace period, on the
    faithful fake), limits restored — and does nothing once the trigger has fired."""

    def behaviour(view: ContainerView) -> ContainerOutcome:
        return ContainerOutcome(exit_code=0, termination_message=signed(view, container_result(view)),
                                pending_reads=1, running_reads=10_000)  # trains until it is killed  # fmt: skip

    api = _api(tmp_path, behaviour)
    try:
        deferred = _until_pod_deferral(_operator(api), {"ti": _Ti(), "run_id": "k8s-kill"})
        _, kwargs = deferred.trigger.serialize()
        assert kwargs["backend_options"]["namespace"] == "ml", "the triggerer can rebuild the backend"
        assert api.live("Pod"), "the pod trains while the task is deferred"
        fired = BackendRunTrigger(**kwargs)
        fired._fired = True
        asyncio.run(fired.on_kill())  # after the event: the resumed task owns the pod
        assert api.live("Pod") and not api.deleted, "a trigger that fired must not delete the pod"
        asyncio.run(BackendRunTrigger(**kwargs).on_kill())
        assert not api.live("Pod"), "the user's kill deleted the pod and waited until it was gone"
        assert any(kind == "Pod" for kind, *_ in api.deleted)
    finally:
        api.__exit__(None, None, None)
