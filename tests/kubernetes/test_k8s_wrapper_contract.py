"""The container the backend generates runs the real `carbonflow run` wrapper, and the backend reads its result.

The fake kubelet "runs" the pod by executing its container command and args locally, as the image would:
``carbonflow`` is the installed CLI, ``python`` the interpreter; the ConfigMap files and the termination-log path
are mapped into a temporary directory. What the wrapper writes to the termination log goes back to the backend
through the fake API, exactly as a kubelet reports a termination message.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fake_kube_api import ContainerOutcome, ContainerView, FakeKubeApi

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.k8s_manifests import KubernetesSettings
from carbonflow.execution.kubernetes import KubernetesBackend

pytestmark = pytest.mark.timeout(240)

TRAIN = (
    "from carbonflow.training import report\n"
    "import time\n"
    "for step in range(1, 6):\n"
    "    time.sleep(0.05)\n"
    "    report(step, samples=32 * step, loss=1.0 / step)\n"
    "print('trained')\n"
)


def run_container_locally(view: ContainerView, workdir: Path) -> ContainerOutcome:
    """Execute the pod's container as the image would, with its files mapped under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    mapping: dict[str, str] = {}
    for path, content in view.files.items():
        if content.startswith("<hostPath"):
            continue
        local = workdir / Path(path).name
        local.write_text(content)
        mapping[path] = str(local)
    result = workdir / "termination-log"
    mapping[view.env["CARBONFLOW_RESULT_FILE"]] = str(result)
    argv = [*view.command, *view.args]
    argv = [mapping.get(a, a) for a in argv]
    exe = {"carbonflow": [sys.executable, "-m", "carbonflow.cli"], "python": [sys.executable]}
    argv = [*exe.get(argv[0], [argv[0]]), *argv[1:]]
    sep = argv.index("--")
    argv = [*argv[: sep + 1], *exe.get(argv[sep + 1], [argv[sep + 1]]), *argv[sep + 2 :]]
    # The pod's training user (CARBONFLOW_TRAINING_UID) cannot run this machine's interpreter (it lives under
    # /root); dropping to it is shown in tests/energy/test_training_privileges.py with a world-executable one.
    assert view.env["CARBONFLOW_TRAINING_UID"] == "1000"
    env = {k: v for k, v in view.env.items() if k not in ("ZEUSD_SOCK_PATH", "CARBONFLOW_TRAINING_UID")}
    env["CARBONFLOW_POWER_JOURNAL_DIR"] = str(workdir / "journal")
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=workdir,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(workdir),
            **env,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        },
    )
    message = result.read_text() if result.exists() else ""
    return ContainerOutcome(
        exit_code=proc.returncode,
        termination_message=message,
        log=proc.stdout + proc.stderr,
        pending_reads=1,
        running_reads=1,
    )


def test_generated_pod_runs_the_real_wrapper_and_its_result_comes_back(tmp_path):
    spec = JobSpec(name="tiny_job", command=["python", "-c", TRAIN], steps=5, region="GB", device_kind="cpu")
    now = datetime.now(UTC)
    plan = Plan(
        job="tiny_job",
        config=Config(containers=1),
        start=now,
        finish_by=now + timedelta(hours=1),
        predicted_duration_s=1,
        predicted_energy_j=1,
        predicted_emissions_g=0.001,
        region="GB",
        forecast_provider="static",
        signal_kind="average-direct",
        reason="contract test",
    )
    outcomes: list[ContainerOutcome] = []

    def behaviour(view: ContainerView) -> ContainerOutcome:
        outcomes.append(run_container_locally(view, tmp_path / view.pod["metadata"]["name"]))
        return outcomes[-1]

    with FakeKubeApi(behaviour) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        backend = KubernetesBackend(
            KubernetesSettings(namespace="ml"), config_file=str(kubeconfig), poll_interval_s=0.05
        )
        wrapped = backend.execute(spec, plan)
    (outcome,) = outcomes
    assert outcome.exit_code == 0, outcome.log[-3000:]
    assert wrapped.job == "tiny_job" and wrapped.exit_code == 0
    assert wrapped.steps == 5 and wrapped.samples == 5 * 32
    assert wrapped.devices and all(d.label in ("estimated", "measured") for d in wrapped.devices)
    assert any(n.startswith("ran on Kubernetes as Pod ml/") for n in wrapped.notes)
