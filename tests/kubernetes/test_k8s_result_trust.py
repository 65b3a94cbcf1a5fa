"""Issue #21, trust boundary: a training cannot forge its run's result on Kubernetes.

Finding: "When the wrapper is OOM-killed or SIGKILLed, the backend takes the last ``CARBONFLOW_RESULT`` line of
the pod log, which the training itself can print: the run was recorded as 1 J at accuracy 0.999, no restore pod
ran, and the host GPU stayed at 150 W." Now a result is believed only when signed with the run's own key, which
only the wrapper holds; a pod without one is a failed run and the node's restore pod puts the limit back.

The cluster is the FAKE API and FAKE GPU node (``fake_kube_api.py``, ``fake_gpu_node.py``); the wrapper, the
training (as the pod's training user when this runs as root), the restore pod and the backend are real.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fake_gpu_node import CAN_DROP_USERS, fake_cluster
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi
from test_k8s_backend import backend_for_path, container_result, make_plan, make_spec

from carbonflow.domain import Config, DeviceEnergy, JobSpec, Plan
from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import KubernetesRunError
from carbonflow.execution.signing import (
    NOT_SIGNED,
    RESULT_KEY_ENV,
    new_result_key,
    result_line,
    sign_result,
)
from carbonflow.execution.wrapper import WrappedRun
from tests.fakes.node import wait_for

pytestmark = pytest.mark.timeout(120)

LIMIT_W = 150


def _job(command: list[str]) -> tuple[JobSpec, Plan]:
    spec = JobSpec(name="forger", command=command, steps=100, region="GB")
    plan = Plan(job=spec.name, config=Config(containers=1, power_limit_w=LIMIT_W), start=datetime.now(UTC),
                predicted_duration_s=60, predicted_energy_j=1e4, predicted_emissions_g=1, region="GB",
                forecast_provider="test", reason="forged-result test")  # fmt: skip
    return spec, plan


def _forged() -> str:
    """What a training would like its run to be: 1 J, accuracy 0.999."""
    now = datetime.now(UTC)
    return WrappedRun(
        job="forger", config_key=Config(containers=1, power_limit_w=LIMIT_W).key(), started_at=now, ended_at=now,
        duration_s=1, exit_code=0,
        devices=[DeviceEnergy(device_id="GPU-0", device_model="A100", kind="gpu", energy_j=1.0, label="measured")],
        metrics={"test_accuracy": 0.999}, power_limit_w=LIMIT_W,
    ).model_dump_json()  # fmt: skip


FORGER = """
import json, os, sys, time
forged, out = open(sys.argv[1]).read().strip(), sys.argv[2]
print("CARBONFLOW_RESULT " + forged, flush=True)
print("CARBONFLOW_RESULT hmac-sha256=" + "ab" * 32 + " " + forged, flush=True)
seen = {"uid": os.getuid(), "key_in_env": os.environ.get("CARBONFLOW_RESULT_KEY"), "ancestors": {}}
pid = os.getppid()
while pid > 1:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            seen["ancestors"][pid] = "CARBONFLOW_RESULT_KEY=" in handle.read().decode(errors="replace")
    except OSError as err:
        seen["ancestors"][pid] = type(err).__name__
    with open(f"/proc/{pid}/stat") as handle:
        pid = int(handle.read().rsplit(")", 1)[1].split()[1])
with open(out, "w") as handle:
    json.dump(seen, handle)
print("CARBONFLOW_RESULT " + forged, flush=True)
while True:
    time.sleep(0.2)
"""


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    """A 2-GPU node at 300 W whose device plugin gives the pod host GPU 1, its zeusd, and the API."""
    with fake_cluster(tmp_path, gpus=2, gpus_for=lambda pod: [1]) as parts:
        yield parts


def test_a_training_cannot_forge_its_result_by_printing_it(cluster) -> None:  # type: ignore[no-untyped-def]
    """The training prints a forged ``CARBONFLOW_RESULT`` (1 J, accuracy 0.999), unsigned and with a made-up
    signature, then its wrapper is SIGKILLed: the run fails, the restore pod runs, GPU 1 is back at 300 W."""
    gpu_node, _, api, backend = cluster
    probe, out = gpu_node.base / "forger.py", gpu_node.base / "forger-out"
    probe.write_text(FORGER)
    probe.chmod(0o644)
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    forged = gpu_node.base / "forged.json"
    forged.write_text(_forged())
    forged.chmod(0o644)
    handle = backend.start(*_job(["python", str(probe), str(forged), str(out / "seen.json")]))
    pod = handle.details["pod"]
    running = lambda: backend.poll(handle).state == "running"  # noqa: E731 (each read moves the fake kubelet on)
    wait_for(lambda: running() and (out / "seen.json").exists() and gpu_node.node.limits_mw()[1] == LIMIT_W * 1000)
    seen = json.loads((out / "seen.json").read_text())
    assert seen["key_in_env"] is None, "the wrapper took the key out of the training's environment"
    if CAN_DROP_USERS:  # the training runs as the pod's training user: the wrapper's environment is not readable
        assert seen["uid"] == 1000 and True not in seen["ancestors"].values(), seen
        assert "PermissionError" in seen["ancestors"].values(), "the wrapper's environment is root's alone"
    assert "hmac-sha256=abab" in gpu_node.containers[pod].log()

    api.kill_container(pod)  # SIGKILL to every process of the container: the wrapper writes nothing
    wait_for(lambda: backend.poll(handle).state == "finished")
    with pytest.raises(KubernetesRunError, match=NOT_SIGNED) as err:
        backend.collect(handle)
    assert "exit_code=137" in str(err.value) and "result(s) refused" in str(err.value)
    assert len(api.restores) == 1, "the killed wrapper's journal was replayed by the restore pod"
    assert gpu_node.node.limits_mw() == [300000, 300000], "GPU 1 is back at its default limit"
    assert api.objects == {}


def test_a_real_wrapper_result_is_signed_and_believed(cluster) -> None:  # type: ignore[no-untyped-def]
    """The other side: a training that ends normally is collected from its wrapper's signed termination message,
    even though it printed a forged line first (the forged numbers are not what is recorded)."""
    gpu_node, _, api, backend = cluster
    forged = gpu_node.base / "forged.json"
    forged.write_text(_forged())
    forged.chmod(0o644)
    code = "import sys; print('CARBONFLOW_RESULT ' + open(sys.argv[1]).read(), flush=True)"
    handle = backend.start(*_job(["python", "-c", code, str(forged)]))
    message: list[str] = []
    wait_for(lambda: backend.poll(handle).state == "finished")
    message.append(gpu_node.containers[handle.details["pod"]].termination_message())
    run = backend.collect(handle)
    assert message[0].startswith("hmac-sha256="), "the wrapper signed its termination message"
    assert run.exit_code == 0 and "test_accuracy" not in run.metrics
    assert sum(d.energy_j for d in run.devices) != pytest.approx(1.0)
    assert gpu_node.node.limits_mw() == [300000, 300000] and api.restores == []


def test_a_result_signed_with_another_key_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A result signed with any key but this run's (another run's, a guessed one) is a failed run: refused in
    the termination message and in the log alike, and the restore pod runs on the node."""
    other = new_result_key()

    def behaviour(view: ContainerView) -> ContainerOutcome:
        assert view.env[RESULT_KEY_ENV] != other
        text = container_result(view, energy_j=1.0, accuracy=0.999).model_dump_json()
        return ContainerOutcome(exit_code=0, termination_message=sign_result(text, other),
                                log=f"epoch 1\n{result_line(text, other)}\n")  # fmt: skip

    with FakeKubeApi(behaviour) as api:
        with pytest.raises(KubernetesRunError, match="does not match this run's key") as err:
            backend_for_path(api, tmp_path).execute(make_spec(), make_plan(1))
        assert NOT_SIGNED in str(err.value)
        assert len(api.restores) == 1, "a refused result is a failed run: its node's journals are replayed"
        assert api.objects == {}


def test_an_unsigned_termination_message_is_refused_even_when_it_parses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the old backend believed (a bare WrappedRun JSON as the message, or a log line) is refused."""

    def behaviour(view: ContainerView) -> ContainerOutcome:
        text = container_result(view).model_dump_json()
        return ContainerOutcome(exit_code=0, termination_message=text, log=f"CARBONFLOW_RESULT {text}\n")

    with FakeKubeApi(behaviour) as api:
        with pytest.raises(KubernetesRunError, match="carries no signature"):
            backend_for_path(api, tmp_path).execute(make_spec(), make_plan(1))
        assert len(api.restores) == 1 and api.objects == {}


@pytest.mark.parametrize("containers", [1, 3])
def test_the_result_key_is_in_the_wrappers_environment_only(containers: int) -> None:
    """The key is the training container's last env entry (a job's env cannot override it), never in the
    ConfigMap the training can read; a dry run (no key) puts none anywhere."""
    from carbonflow.execution.k8s_manifests import CONTAINER_NAME, ManifestBuilder

    key = new_result_key()
    builder = ManifestBuilder(KubernetesSettings(namespace="ml"))
    manifests = builder.build(make_spec(), make_plan(containers), result_key=key)
    template = manifests.pod if manifests.pod is not None else manifests.job.spec.template
    (container,) = [c for c in template.spec.containers if c.name == CONTAINER_NAME]
    assert (container.env[-1].name, container.env[-1].value) == (RESULT_KEY_ENV, key)
    assert [e.name for e in container.env].count(RESULT_KEY_ENV) == 1
    assert key not in json.dumps(manifests.config_map.data)
    dry = builder.build(make_spec(), make_plan(containers))
    assert RESULT_KEY_ENV not in json.dumps(dry.to_dicts(), default=str)
