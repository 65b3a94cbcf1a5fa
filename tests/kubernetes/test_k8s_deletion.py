"""Deleting pods as a cluster does: they terminate over their grace period, and the backend waits for them.

Finding: the fake Kubernetes API deleted objects at once (ignoring grace periods and foreground deletion), so
the code that must wait for a terminating pod — whose wrapper restores the power limit after SIGTERM — was
never exercised, and "nothing left" assertions could not fail. The fake (``fake_kube_api.py``, a FAKE API
server) now terminates pods over their grace period; these tests pin that down and show the backend waits.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import ContainerOutcome, FakeKubeApi
from kubernetes import client, config

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.backend import RunOptions
from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import KubernetesBackend, KubernetesRunError
from tests.fakes.node import wait_for as _wait

pytestmark = pytest.mark.timeout(60)


def _pod(name: str, grace_s: int | None = None) -> dict:
    spec: dict = {"containers": [{"name": "base", "image": "x"}], "restartPolicy": "Never"}
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _job(name: str) -> dict:
    template = {"metadata": {"labels": {"app": name}}, "spec": _pod(name, grace_s=20)["spec"]}
    spec = {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": template}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _apis(api: FakeKubeApi, tmp_path) -> tuple[client.CoreV1Api, client.BatchV1Api]:  # type: ignore[no-untyped-def]
    conn = config.new_client_from_config(config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig.json")))
    return client.CoreV1Api(conn), client.BatchV1Api(conn)


def test_fake_api_keeps_a_deleted_running_pod_terminating_for_its_grace_period(tmp_path) -> None:  # type: ignore[no-untyped-def]
    told: list[int] = []
    outcome = ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=None, on_signal=told.append)
    with FakeKubeApi(lambda view: outcome) as api:
        core, _ = _apis(api, tmp_path)
        core.create_namespaced_pod("ml", _pod("ignores-sigterm"))
        assert core.read_namespaced_pod("ignores-sigterm", "ml").status.phase == "Running"
        start = time.monotonic()
        core.delete_namespaced_pod("ignores-sigterm", "ml", body=client.V1DeleteOptions(grace_period_seconds=50))
        pod = core.read_namespaced_pod("ignores-sigterm", "ml")  # still there: terminating
        assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 50
        assert pod.status.phase == "Running" and told == [signal.SIGTERM]
        assert [p.metadata.name for p in core.list_namespaced_pod("ml").items] == ["ignores-sigterm"]
        _wait(lambda: not api.live("Pod"))
        assert time.monotonic() - start >= 50 * api.time_scale * 0.9  # the whole grace period (scaled)
        assert told == [signal.SIGTERM, signal.SIGKILL]
        with pytest.raises(client.exceptions.ApiException) as gone:
            core.read_namespaced_pod("ignores-sigterm", "ml")
        assert gone.value.status == 404


def test_fake_api_ends_a_pod_when_its_container_exits_after_sigterm_and_defaults_to_the_pods_grace(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    told: list[int] = []
    with FakeKubeApi(lambda view: ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=5,
                                                  on_signal=told.append)) as api:  # fmt: skip
        core, _ = _apis(api, tmp_path)
        core.create_namespaced_pod("ml", _pod("stops", grace_s=40))
        core.read_namespaced_pod("stops", "ml")
        core.delete_namespaced_pod("stops", "ml")  # no grace period in the request: the pod's own
        assert core.read_namespaced_pod("stops", "ml").metadata.deletion_grace_period_seconds == 40
        _wait(lambda: not api.live("Pod"))
        assert told == [signal.SIGTERM], "it exited by itself, 5 s after SIGTERM: no SIGKILL"
        # an unscheduled pod, or one that already ended, is removed at once
        core.create_namespaced_pod("ml", _pod("never-scheduled"))
        core.delete_namespaced_pod("never-scheduled", "ml")
        assert not api.live("Pod")


def test_fake_api_foreground_deletion_keeps_the_job_until_its_pods_are_gone_background_after_orphan_never(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    with FakeKubeApi(lambda view: ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=300)) as api:
        _, batch = _apis(api, tmp_path)
        for name in ("fg", "bg", "orphan"):
            batch.create_namespaced_job("ml", _job(name))
            batch.read_namespaced_job(name, "ml")  # the kubelet starts its pods
        batch.delete_namespaced_job("fg", "ml", body=client.V1DeleteOptions(propagation_policy="Foreground"))
        job = batch.read_namespaced_job("fg", "ml")
        assert job.metadata.deletion_timestamp is not None and "foregroundDeletion" in job.metadata.finalizers
        _wait(lambda: len(api.terminating()) == 2)  # the garbage collector deleted its pods, each with its grace
        assert {o["gracePeriodSeconds"] for k, _, n, o in api.deleted if k == "Pod" and n.startswith("fg-")} == {20}
        _wait(lambda: ("Job", "ml", "fg") not in api.objects, timeout_s=30)
        fg_pods = [n for _, _, k, n in api.events if k == "Pod" and n.startswith("fg-")]
        assert api.when("removed", "fg", kind="Job") >= max(api.when("removed", n) for n in fg_pods)

        batch.delete_namespaced_job("bg", "ml", body=client.V1DeleteOptions(propagation_policy="Background"))
        assert ("Job", "ml", "bg") not in api.objects  # at once; its pods terminate after
        assert sum(n.startswith("bg-") for n in api.terminating()) == 2

        batch.delete_namespaced_job("orphan", "ml")  # batch/v1's default: the pods are orphaned and run on
        time.sleep(0.1)
        orphans = [p for p in api.live("Pod") if p["metadata"]["name"].startswith("orphan-")]
        assert len(orphans) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in orphans)


def _spec() -> JobSpec:
    return JobSpec(name="resnet_nightly", command=["python", "train.py"], steps=10, region="GB", max_containers=4)


def _plan(containers: int = 1) -> Plan:
    now = datetime.now(UTC)
    return Plan(job="resnet_nightly", config=Config(containers=containers, power_limit_w=175), start=now,
                finish_by=now + timedelta(hours=8), predicted_duration_s=60, predicted_energy_j=9000,
                predicted_emissions_g=0.5, region="GB", forecast_provider="test", reason="deletion test")  # fmt: skip


def _backend(api: FakeKubeApi, tmp_path, **kw) -> KubernetesBackend:  # type: ignore[no-untyped-def]
    settings = KubernetesSettings(namespace="ml", **kw.pop("settings", {}))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
    return KubernetesBackend(settings, config_file=str(kubeconfig), poll_interval_s=0.01, **kw)


def _running(api: FakeKubeApi, backend: KubernetesBackend, handle) -> None:  # type: ignore[no-untyped-def]
    _wait(lambda: backend.poll(handle).state == "running")


class _Wrapper:
    """A scripted container that behaves like the wrapper: it lowered the GPU; on SIGTERM it puts it back
    (taking ``stop_s`` of its grace period); a SIGKILL leaves the GPU lowered for the restore pod."""

    def __init__(self, api: FakeKubeApi) -> None:
        self.api = api
        self.limit_w = 175.0
        self.restored_at: float | None = None

    def __call__(self, view) -> ContainerOutcome:  # type: ignore[no-untyped-def]
        def on_signal(sig: int) -> None:
            if sig == signal.SIGTERM:
                self.limit_w, self.restored_at = 300.0, time.monotonic()

        return ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=20, on_signal=on_signal)


def test_cancel_waits_until_the_pod_is_gone_before_the_restore_pod_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with FakeKubeApi() as api:
        wrapper = _Wrapper(api)
        api.behaviour = wrapper
        restored_by_pod: list[float] = []
        api.restore_behaviour = lambda view: (restored_by_pod.append(wrapper.limit_w), ContainerOutcome())[1]
        backend = _backend(api, tmp_path)
        handle = backend.start(_spec(), _plan(), RunOptions())
        pod = handle.details["pod"]
        _running(api, backend, handle)
        backend.cancel(handle)
        done = time.monotonic()
        assert api.when("sigterm", pod) < api.when("removed", pod) <= done
        assert api.when("removed", pod) - api.when("sigterm", pod) >= 20 * api.time_scale * 0.9  # its stop time
        (restore,) = api.restores
        assert api.when("created", restore.pod["metadata"]["name"]) > api.when("removed", pod)
        assert restored_by_pod == [300.0], "the restore pod ran after the wrapper's own restore, never beside it"
        assert api.objects == {}


def test_a_backend_that_did_not_wait_would_leave_a_terminating_pod(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The "nothing left" assertions can fail: without the wait, the deleted pod is still terminating."""
    with FakeKubeApi(lambda view: ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=200)) as api:
        backend = _backend(api, tmp_path, settings={"power_agent": "none"})
        monkeypatch.setattr(KubernetesBackend, "_wait_deleted", lambda self, run: [])
        handle = backend.start(_spec(), _plan(), RunOptions())
        _running(api, backend, handle)
        backend.cancel(handle)
        assert api.terminating() == [handle.details["pod"]]
        assert api.objects != {}
        monkeypatch.undo()
        handle = backend.start(_spec(), _plan(), RunOptions())
        _running(api, backend, handle)
        backend.cancel(handle)
        _wait(lambda: not api.terminating())  # the first one, left by the backend that did not wait
        assert api.objects == {}


def test_cancel_says_which_pods_are_still_there_when_they_do_not_go(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node whose kubelet no longer answers keeps its pods terminating: cancel says so (the pod, that its
    wrapper may still hold a lowered limit, and how to look) instead of calling the run stopped."""
    with FakeKubeApi(lambda view: ContainerOutcome(pending_reads=0, running_reads=10**6)) as api:
        backend = _backend(api, tmp_path, delete_grace_period_s=1, delete_wait_margin_s=0.5,
                           settings={"termination_grace_period_s": 1})  # fmt: skip
        handle = backend.start(_spec(), _plan(), RunOptions())
        _running(api, backend, handle)
        api.kubelet_running = False
        started = time.monotonic()
        with pytest.raises(KubernetesRunError) as err:
            backend.cancel(handle)
        assert time.monotonic() - started >= 1.5
        message = str(err.value)
        assert f"Pod {handle.details['pod']} (terminating)" in message and "still there" in message
        assert (
            "may still be running and holding a lowered power limit" in message and "kubectl -n ml get pods" in message
        )
        assert api.restores == [], "no restore beside a wrapper that may still run"
        api.kubelet_running = True


def test_job_pods_deleted_with_their_job_get_the_wrappers_grace_period(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding: a Job's pods are deleted by the garbage collector with their own terminationGracePeriodSeconds
    (30 s by default), not the grace period the backend asks for on the Job; the pods now carry it."""
    told: list[tuple[str, int]] = []

    def behaviour(view) -> ContainerOutcome:  # type: ignore[no-untyped-def]
        name = view.pod["metadata"]["name"]
        return ContainerOutcome(pending_reads=0, running_reads=10**6, stop_s=None,
                                on_signal=lambda sig: told.append((name, sig)))  # fmt: skip

    with FakeKubeApi(behaviour) as api:
        backend = _backend(api, tmp_path, settings={"power_agent": "none"})
        handle = backend.start(_spec(), _plan(containers=2), RunOptions())
        _running(api, backend, handle)
        started = time.monotonic()
        backend.cancel(handle)
        assert time.monotonic() - started >= 60 * api.time_scale * 0.9, "each rank had its 60 s"
        pods = {n for n, _ in told}
        assert len(pods) == 2 and sorted(told) == sorted([(n, signal.SIGTERM) for n in pods] +
                                                          [(n, signal.SIGKILL) for n in pods])  # fmt: skip
        graces = {o.get("gracePeriodSeconds") for k, _, n, o in api.deleted if k == "Pod" and n in pods}
        assert graces == {60}
        assert api.when("removed", handle.details["job"], kind="Job") >= max(api.when("removed", n) for n in pods)
        assert api.objects == {}


def test_collect_of_a_killed_pod_deletes_it_before_the_restore_pod_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding: after a failed pod, collect started the restore (waiting for the pod to be gone) before it had
    deleted the pod, so it waited out the whole grace period plus 30 s, then restored beside the pod."""
    with FakeKubeApi(lambda view: ContainerOutcome(exit_code=137, reason="OOMKilled", log="Killed\n")) as api:
        backend = _backend(api, tmp_path)
        handle = backend.start(_spec(), _plan(), RunOptions())
        _wait(lambda: backend.poll(handle).state == "finished")
        started = time.monotonic()
        with pytest.raises(KubernetesRunError, match="reason=OOMKilled") as err:
            backend.collect(handle)
        assert time.monotonic() - started < 10
        (restore,) = api.restores
        assert api.when("created", restore.pod["metadata"]["name"]) > api.when("removed", handle.details["pod"])
        assert not getattr(err.value, "__notes__", []), "the restore succeeded: nothing to report"
        assert api.objects == {}
