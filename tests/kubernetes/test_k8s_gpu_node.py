"""Pods on a 2-GPU node, end to end: the real wrapper in the training pod, the real restore script in the restore
pod, zeusd addressed by the host index of the pod's GPU.

Everything below the Kubernetes client is FAKE (no cluster or GPU can run here): the API server
(``fake_kube_api.py``, pods terminate over their grace period), the node (``fake_gpu_node.py``: device plugin,
container runtime, host directories), NVML (``tests/energy/fake_pynvml``) and zeusd (``tests/fakes``). The
backend, the manifests, the wrapper, the guard, the restore command and the zeusd client are the real code.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_node import CAN_DROP_USERS, FakeGpuNode, fake_cluster

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import KubernetesBackend, KubernetesRunError
from tests.fakes.node import wait_for as _wait

pytestmark = pytest.mark.timeout(120)

FOREVER = "import time\nwhile True:\n    time.sleep(0.2)\n"


def _job(command: list[str], limit_w: float | None = 175) -> tuple[JobSpec, Plan]:
    spec = JobSpec(name="gpu-one", command=command, steps=100, region="GB")
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
                predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1, region="GB",
                forecast_provider="test", reason="2-GPU node test")  # fmt: skip
    return spec, plan


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    """A 2-GPU node at 300 W whose device plugin gives every GPU pod host GPU 1, its zeusd, and the API."""
    with fake_cluster(tmp_path, gpus=2, gpus_for=lambda pod: [1]) as parts:
        yield parts


def _posts(zeusd: Any) -> list[str]:
    return [path for method, path in zeusd.requests if method == "POST"]


def _lowered_while_running(gpu_node: FakeGpuNode, backend: KubernetesBackend, handle: Any) -> None:
    _wait(lambda: backend.poll(handle).state == "running" and gpu_node.node.limits_mw()[1] == 175000)


def test_a_pod_on_host_gpu_1_lowers_gpu_1_only_and_after_sigkill_the_restore_pod_puts_gpu_1_back_through_zeusd(
    cluster,
) -> None:  # type: ignore[no-untyped-def]
    """Finding: zeusd was told the GPU index the pod sees (0), so a pod on host GPU 1 lowered host GPU 0 —
    another tenant's — and the restore pod, unprivileged and without zeusd, could not put anything back."""
    gpu_node, zeusd, api, backend = cluster
    uuids = gpu_node.node.uuids()
    handle = backend.start(*_job(["python", "-c", FOREVER]))
    pod = handle.details["pod"]
    _lowered_while_running(gpu_node, backend, handle)
    assert gpu_node.node.limits_mw() == [300000, 175000], "host GPU 1 only"
    assert _posts(zeusd) == ["/gpu/set_power_limit?gpu_ids=1&power_limit_mw=175000&block=true"]
    journal = gpu_node.pod_journal_dir(pod) / f"{uuids[1]}.json"
    assert json.loads(journal.read_text())["previous_w"] == 300.0  # on the node, in the pod's own directory

    api.kill_container(pod)  # the OOM killer: SIGKILL to every process of the container, no grace period
    _wait(lambda: backend.poll(handle).state == "finished")
    with pytest.raises(KubernetesRunError, match=r"exit_code=137 reason=OOMKilled"):
        backend.collect(handle)

    assert gpu_node.node.limits_mw() == [300000, 300000], "the restore pod put GPU 1 back"
    assert _posts(zeusd)[1:] == ["/gpu/set_power_limit?gpu_ids=1&power_limit_mw=300000&block=true"]
    assert {call[0] for call in gpu_node.node.state()["set_calls"]} == {uuids[1]}, "GPU 0 was never touched"
    (restore,) = api.restores
    restore_pod = restore.pod["metadata"]["name"]
    assert restore.pod["spec"]["nodeName"] == "gpu-node-a"
    assert api.when("created", restore_pod) > api.when("removed", pod), "the killed pod was gone first"
    assert not gpu_node.pod_journal_dir(pod).exists(), "journal replayed and removed"
    assert api.objects == {}


def test_a_deleted_pod_on_host_gpu_1_puts_its_limit_back_in_its_grace_period_before_cancel_returns(cluster) -> None:  # type: ignore[no-untyped-def]
    """Finding: cancelling deleted the pod and went on at once; on a cluster the pod terminates over its grace
    period while the wrapper restores, so a restore that ran meanwhile raced it and "nothing left" was unproven."""
    gpu_node, zeusd, api, backend = cluster
    handle = backend.start(*_job(["python", "-c", FOREVER]))
    pod = handle.details["pod"]
    _lowered_while_running(gpu_node, backend, handle)
    backend.cancel(handle)
    returned = time.monotonic()
    assert api.signals == [(pod, signal.SIGTERM)], "SIGTERM, and the wrapper was done within its grace period"
    assert api.when("sigterm", pod) < api.when("removed", pod) <= returned, "cancel returned once the pod was gone"
    assert gpu_node.node.limits_mw() == [300000, 300000]
    (restore,) = api.restores  # it found nothing left to do: the wrapper had put the limit back itself
    assert api.when("created", restore.pod["metadata"]["name"]) > api.when("removed", pod)
    assert _posts(zeusd)[-1] == "/gpu/set_power_limit?gpu_ids=1&power_limit_mw=300000&block=true"
    assert len(_posts(zeusd)) == 2
    assert api.objects == {}


def test_a_pod_whose_limit_reads_back_wrong_puts_it_back_and_its_run_says_so(cluster) -> None:  # type: ignore[no-untyped-def]
    """Finding: a read-back that disagreed escaped the apply loop; restore found its own GPU unchanged, deleted
    the journal and said nothing. On the pod's path now: put back, not applied, and the run's result says why."""
    gpu_node, zeusd, api, backend = cluster
    zeusd.nvml.host_set_power_limit = lambda *args, **kwargs: None  # the call "succeeds" and changes nothing
    handle = backend.start(*_job(["python", "-c", "import time; time.sleep(1)"]))
    _wait(lambda: backend.poll(handle).state == "finished")
    result = backend.collect(handle)
    assert result.exit_code == 0 and result.power_limit_applied is False
    assert any("not applied" in n and "reads back 300 W" in n for n in result.notes), result.notes
    assert all(d.power_limit_w is None for d in result.devices if d.kind == "gpu"), "not labelled as capped"
    assert gpu_node.node.limits_mw() == [300000, 300000]
    assert {p.split("&")[0] for p in _posts(zeusd)} == {"/gpu/set_power_limit?gpu_ids=1"}, "its own GPU only"
    assert not list(gpu_node.journal_dir.rglob("*.json")), "nothing lowered, nothing left to restore"
    assert api.restores == [] and api.objects == {}


PROBE = """
import glob, json, os, socket, sys, time
sock, out = sys.argv[1], sys.argv[2]
seen = {"uid": os.getuid(), "groups": os.getgroups(), "zeusd_env": os.environ.get("ZEUSD_SOCK_PATH")}
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"POST /gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=100000&block=true HTTP/1.0\\r\\n\\r\\n")
    seen["zeusd"] = s.recv(100).decode(errors="replace")
except OSError as err:
    seen["zeusd"] = type(err).__name__
journal_dir = sys.argv[3]  # the pod's journal folder (the training's environment does not name it)
seen["journal_env"] = os.environ.get("CARBONFLOW_POWER_JOURNAL_DIR")
seen["journals"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(journal_dir, "*.json")))
for name, attack in (("move", lambda p: os.rename(p, p + ".moved")), ("remove", os.remove),
                     ("overwrite", lambda p: open(p, "w").write("{}"))):
    try:
        attack(os.path.join(journal_dir, seen["journals"][0]))
        seen[name] = "done"
    except (OSError, IndexError) as err:
        seen[name] = type(err).__name__
with open(out, "w") as handle:
    json.dump(seen, handle)
while True:
    time.sleep(0.2)
"""


@pytest.mark.skipif(not CAN_DROP_USERS, reason="dropping the training to another user needs root")
def test_the_users_command_in_a_pod_cannot_set_a_power_limit_or_move_its_journal(cluster) -> None:  # type: ignore[no-untyped-def]
    """Finding: zeusd's socket was world-writable and mounted into every training pod, and the journals were
    writable by the pod's command: any job could set any GPU's limit or hide its journal from the restore pod.
    The user's command runs here as the pod's training user and tries both; then the pod is SIGKILLed and the
    restore pod still finds the journal and puts the GPU back."""
    gpu_node, zeusd, api, backend = cluster
    probe, out = gpu_node.base / "probe.py", gpu_node.base / "probe-out"
    probe.write_text(PROBE)
    probe.chmod(0o644)
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    settings = KubernetesSettings()
    command = ["python", str(probe), settings.zeusd_socket_path, str(out / "seen.json"),
               settings.power_journal_host_dir]  # fmt: skip
    handle = backend.start(*_job(command))
    pod = handle.details["pod"]
    _lowered_while_running(gpu_node, backend, handle)
    _wait(lambda: (out / "seen.json").exists())
    seen = json.loads((out / "seen.json").read_text())
    assert seen["uid"] == 1000 and seen["groups"] == [] and seen["zeusd_env"] is None and seen["journal_env"] is None
    assert seen["zeusd"] == "PermissionError", "the socket is root's, mode 660"
    assert seen["journals"] == [f"{gpu_node.node.uuids()[1]}.json"], "it sees its own pod's journal only"
    assert seen["move"] == seen["remove"] == seen["overwrite"] == "PermissionError"
    assert gpu_node.node.limits_mw() == [300000, 175000], "GPU 0 was not set to 100 W"
    assert _posts(zeusd) == ["/gpu/set_power_limit?gpu_ids=1&power_limit_mw=175000&block=true"]

    api.kill_container(pod)
    _wait(lambda: backend.poll(handle).state == "finished")
    with pytest.raises(KubernetesRunError, match="OOMKilled"):
        backend.collect(handle)
    assert gpu_node.node.limits_mw() == [300000, 300000]
    assert api.objects == {}


def test_fake_gpu_node_is_what_a_pod_would_see(cluster) -> None:  # type: ignore[no-untyped-def]
    """The fake node itself: the pod sees host GPU 1 as its index 0, NVML refuses it a limit, and the node's
    index map (what the DaemonSet writes) names the host index zeusd uses."""
    gpu_node, _, _, _ = cluster
    uuids = gpu_node.node.uuids()
    assert json.loads(gpu_node.index_map.read_text()) == {uuids[0]: 0, uuids[1]: 1}
    assert oct(gpu_node.socket.stat().st_mode & 0o777) == "0o660" and gpu_node.socket.stat().st_uid == os.getuid()
    code = (
        "import json; from carbonflow.energy.nvml import nvml_devices; from carbonflow.energy.errors import "
        "PowerLimitNotPermitted\n(g,) = nvml_devices()\ntry:\n    g.set_power_limit_w(150); refused = False\n"
        "except PowerLimitNotPermitted:\n    refused = True\nprint(json.dumps([g.id, g.index, refused]))"
    )
    env = gpu_node.node.env(FAKE_NVML_CONTAINER_GPUS=uuids[1], FAKE_NVML_UNPRIVILEGED="1")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == [uuids[1], 0, True], done.stderr
    assert Path(gpu_node.host_path("/var/run/zeusd")) == gpu_node.zeusd_dir


def _named_job(name: str, limit_w: float, group: str | None = None) -> tuple[JobSpec, Plan]:
    spec, plan = _job(["python", "-c", FOREVER], limit_w)
    spec = spec.model_copy(update={"name": name})
    config = plan.config.model_copy(update={"colocation_group": group})
    return spec, plan.model_copy(update={"job": name, "config": config})


PAIR_LIMITS_W = (175.0, 200.0)
"""One planned pair, runs 0 and 1: two pods time-sliced on one GPU (a second pair waits for the GPU's lease:
``test_two_planned_pairs_never_share_one_gpus_lease``, faults ``k8s_time_sliced_pairs_on_one_gpu``)."""


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "ends",
    [
        [("kill", 0), ("cancel", 1)],  # the pod that set the limit first SIGKILLed while its partner trains on
        [("cancel", 0), ("kill", 1)],  # the last pod killed
    ],
    ids=["first-pod-killed", "last-pod-killed"],
)
def test_two_pairs_time_sliced_on_one_gpu_never_leave_it_lowered(tmp_path, ends) -> None:  # type: ignore[no-untyped-def]
    """Finding: two co-located pairs on one time-sliced GPU left it lowered: each pod put back the limit it had
    read, and a pod that started after another had lowered it read the lowered one. Now a second pair waits for
    the GPU's node-wide lease, and within a pair the node's power agent
    owns the limit with a reference count per GPU: it records the original on the first hold, sets the latest
    holder's limit while any pod holds the GPU, and the original once the last one (or its restore pod, for a
    SIGKILLed pod) releases it — whatever order the pods end in."""
    with fake_cluster(tmp_path, gpus=1, gpus_for=lambda pod: [0]) as (gpu_node, zeusd, api, backend):
        agent = gpu_node.agent
        handles = []
        for number, limit_w in enumerate(PAIR_LIMITS_W):
            handles.append(backend.start(*_named_job(f"pair1-{'ab'[number]}", limit_w, group="pair1")))
            want = [round(limit_w * 1000)]  # the latest holder's limit
            _wait(lambda n=number, w=want: backend.poll(handles[n]).state == "running"  # the fake API moves on reads
                  and len(agent.gpus.get("0", {}).get("holders", {})) == n + 1 and gpu_node.node.limits_mw() == w,
                  timeout_s=120)  # fmt: skip
        assert agent.gpus["0"]["original_mw"] == 300000, "recorded once, from the first hold"
        left = list(range(len(handles)))
        for how, number in ends:
            handle = handles[number]
            if how == "kill":
                api.kill_container(handle.details["pod"])
                _wait(lambda h=handle: backend.poll(h).state == "finished", timeout_s=120)
                with pytest.raises(KubernetesRunError, match="OOMKilled"):
                    backend.collect(handle)  # its restore pod releases the dead pod's hold
            else:
                backend.cancel(handle)
            left.remove(number)
            holders = agent.gpus.get("0", {}).get("holders", {})
            assert len(holders) == len(left), (how, number, holders)
            want_mw = list(holders.values())[-1] if holders else 300000
            assert gpu_node.node.limits_mw() == [want_mw], f"after {how} of run {number}"
            if left:
                assert want_mw in {round(PAIR_LIMITS_W[n] * 1000) for n in left}, "a living pod's limit"
        assert gpu_node.node.limits_mw() == [300000], "back at the original once no pod holds it"
        assert agent.gpus == {} and not list(gpu_node.journal_dir.rglob("*.json"))
        assert len(api.restores) >= 1 and api.objects == {}
        assert all("holder=" not in path for _, path in zeusd.requests), "zeusd itself speaks its own API only"
