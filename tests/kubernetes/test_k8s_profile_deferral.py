"""Issue #22: ``EnergyProfileOperator(backend="kubernetes")`` held its worker slot while its pods swept the limits.
Now it starts one profiling run at a time and defers on the generic ``BackendRunTrigger`` (which polls the run
through ``KubernetesBackend.poll``); it resumes, on any worker, to collect the run, then starts the next container
count's or returns the profile.

The cluster is the FAKE API (``fake_kube_api.py``: a real HTTP server speaking the API's JSON); each container's
result is scripted, signed with the run's key as the wrapper signs it. The through-``dag.test()`` check, with the
real wrapper in the pod, is ``test_k8s_profiling.py``.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi
from test_k8s_backend import container_result, signed

from carbonflow.domain import Config, Plan, Profile
from carbonflow.execution.wrapper import MeasuredWindow
from carbonflow.operators.profile import EnergyProfileOperator
from carbonflow.operators.triggers import BackendRunTrigger

JOB = {"name": "pod-profile", "command": ["python", "train.py"], "steps": 1000, "region": "GB", "device_kind": "cpu",
       "min_containers": 1, "max_containers": 2, "profile_steps": 20,
       "env": {"DB_URI": "postgres://u:s3cret@db"}}  # fmt: skip


def _behaviour(view: ContainerView) -> ContainerOutcome:
    """A profiling pod: one measured window (a CPU job sweeps no limit), rank r measuring 100 + r samples."""
    rank = int(view.env.get("RANK", "0"))
    window = MeasuredWindow(power_limit_w=None, samples=100 + rank, window_s=2.0, energy_j={"cpu-package-0": 60.0},
                            energy_window_s=2.0, steps=20)  # fmt: skip
    now = datetime.now(UTC)
    result = container_result(view).model_copy(
        update={"windows": [window], "steps": 20, "started_at": now - timedelta(seconds=5), "ended_at": now}
    )
    return ContainerOutcome(exit_code=0, termination_message=signed(view, result), pending_reads=1, running_reads=3)


async def _fire(trigger: BackendRunTrigger) -> Any:
    async for event in trigger.run():
        return event


def _operator(api: FakeKubeApi, **kwargs: Any) -> EnergyProfileOperator:
    return EnergyProfileOperator(task_id="profile", job=JOB, backend="kubernetes", reuse_profiles=False,
                                 kubernetes={"namespace": "ml", "config_file": str(api.kubeconfig)}, poll_s=0.05,
                                 **kwargs)  # fmt: skip


@pytest.fixture
def api(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(EnergyProfileOperator, "_log_profile", lambda self, spec, profile: None)  # no MLflow here
    with FakeKubeApi(_behaviour) as fake:
        fake.kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig.json")
        yield fake


def test_the_profile_task_defers_on_each_run_and_resumes_on_another_worker(api) -> None:  # type: ignore[no-untyped-def]
    context = {"run_id": "k8s-profile-deferral"}
    with pytest.raises(TaskDeferred) as first:
        _operator(api).execute(context)
    assert first.value.method_name == "execute_run_ended"
    trigger = first.value.trigger
    assert isinstance(trigger, BackendRunTrigger) and trigger.backend == "kubernetes"
    assert trigger.state["runs_done"] == 0
    assert "s3cret" not in json.dumps(trigger.serialize()), "the job's env reaches the pod, not the trigger's row"
    (pod,) = api.live("Pod")  # one container: a Pod, created before the task let its worker go
    assert Plan.model_validate_json(api.live("ConfigMap")[0]["data"]["plan.json"]).config == Config(containers=1)

    _, kwargs = trigger.serialize()  # the triggerer rebuilds it from its kwargs
    event = asyncio.run(_fire(BackendRunTrigger(**kwargs)))
    assert event.payload["message"] == "Succeeded"
    with pytest.raises(TaskDeferred) as second:  # a fresh operator (another worker) collects, starts count 2
        _operator(api).execute_run_ended(context, event.payload)
    assert second.value.trigger.state["runs_done"] == 1 and len(second.value.trigger.state["points"]) == 1
    assert not any(p["metadata"]["name"] == pod["metadata"]["name"] for p in api.live("Pod")), "collected, deleted"
    assert [j["spec"]["completions"] for j in api.live("Job")] == [2], "two containers: an Indexed Job"

    event = asyncio.run(_fire(second.value.trigger))
    profile = Profile.model_validate(_operator(api).execute_run_ended(context, event.payload))
    assert [p.config.containers for p in profile.points] == [1, 2]
    assert [p.samples for p in profile.points] == [100, 201], "the two ranks' windows merged (samples add up)"
    assert profile.points[1].power_per_device_w and all(w > 0 for w in profile.points[1].power_per_device_w.values())
    assert not api.live("Pod") and not api.live("Job") and not api.live("ConfigMap")


@pytest.mark.slow  # a whole blocking profile through the fake cluster (about 40 s): in make test, not test-fast
def test_not_deferrable_profiles_in_the_task_as_before(api) -> None:  # type: ignore[no-untyped-def]
    profile = Profile.model_validate(_operator(api, deferrable=False).execute({"run_id": "k8s-profile-blocking"}))
    assert [p.config.containers for p in profile.points] == [1, 2]
    assert not api.live("Pod") and not api.live("Job")


def test_a_failed_profiling_pod_fails_the_resumed_task_with_its_exit_reason(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(EnergyProfileOperator, "_log_profile", lambda self, spec, profile: None)
    with FakeKubeApi(lambda view: ContainerOutcome(exit_code=137, reason="OOMKilled", log="Killed\n")) as api:
        api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        with pytest.raises(TaskDeferred) as deferred:
            _operator(api).execute({"run_id": "k8s-profile-failed"})
        event = asyncio.run(_fire(deferred.value.trigger))
        with pytest.raises(Exception, match="exit_code=137 reason=OOMKilled"):
            _operator(api).execute_run_ended({"run_id": "k8s-profile-failed"}, event.payload)
        assert not api.live("Pod"), "the failed pod is deleted too"


def test_poll_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"poll_s=0 is not allowed; it must be > 0 seconds"):
        EnergyProfileOperator(task_id="p", job=JOB, poll_s=0)
