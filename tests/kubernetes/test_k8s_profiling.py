"""Finding (issue #21): ``EnergyProfileOperator(backend="kubernetes")`` raised TypeError (the profiler passed
``sweep_limits_w`` and ``stop_below_fraction``, which ``KubernetesBackend.execute`` did not take). Now the pod's
wrapper gets ``--sweep-limits``/``--stop-below`` as the local one does and sweeps the limits in the running
training: through Airflow's own ``dag.test()`` the profile has one point per swept limit.

Issue #22: the task no longer holds its worker while the pod sweeps. It defers on ``BackendRunTrigger``; the
metadata DB says ``deferred`` while the pod is Running, and the resumed task collects the pod and returns the
profile.

The cluster is the FAKE API and FAKE node (``fake_kube_api.py``, ``fake_gpu_node.py``); the operator, the
backend, the manifests and the ``carbonflow run`` wrapper in the pod (on the job's simulated V100) are real.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_node import FakeGpuNode
from fake_kube_api import FakeKubeApi
from test_k8s_deferral import _db_state, _pod_phase, _value

from carbonflow.domain import Profile
from carbonflow.workloads.catalog import DIGITS_CNN

pytestmark = pytest.mark.timeout(300)

LIMITS_W = [250.0, 225.0, 200.0]

# A training that keeps the contract without importing carbonflow (it may run as the pod's training user, with
# the image's python): reports each step with its own clock, slows down as the simulated GPU says, stops when told.
TRAIN = """
import json, os, time
progress, stop = os.environ["CARBONFLOW_PROGRESS_FILE"], os.environ["CARBONFLOW_STOP_FILE"]
slowdown_file, max_steps = os.environ.get("CARBONFLOW_SIM_SLOWDOWN_FILE"), os.environ.get("CARBONFLOW_MAX_STEPS")
step = 0
while not os.path.exists(stop) and (max_steps is None or step < int(max_steps)):
    slowdown = float(open(slowdown_file).read() or 1) if slowdown_file and os.path.exists(slowdown_file) else 1.0
    time.sleep(0.03 * slowdown)
    step += 1
    with open(progress, "a") as handle:
        handle.write(json.dumps({"step": step, "samples": 16 * step, "t_s": time.monotonic()}) + "\\n")
"""

DAG_FILE = """
import json, os
from datetime import datetime
from pathlib import Path
from airflow.sdk import DAG, task
from carbonflow.operators import EnergyProfileOperator

with DAG(os.environ["E2E_DAG_ID"], schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    profile = EnergyProfileOperator(
        task_id="profile", job=json.loads(os.environ["E2E_JOB_JSON"]), backend="kubernetes", reuse_profiles=False,
        kubernetes={"namespace": "ml", "config_file": os.environ["E2E_KUBECONFIG"]},
    )

    @task(task_id="keep")
    def keep(measured):
        Path(os.environ["E2E_OUT"]).write_text(json.dumps(measured))

    keep(profile.output)
"""


@pytest.mark.slow  # a real Airflow DAG run (dag.test())
def test_energy_profile_operator_on_kubernetes_sweeps_every_limit_in_the_pod(tmp_path, airflow_db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk.execution_time import supervisor

    observed: list[dict[str, Any]] = []
    real_run = supervisor.run_task_in_process

    def observing(ti: Any, task: Any, client: Any = None) -> Any:
        """Each run of the profile task as it returns: the runner's and the metadata DB's state, and while it is
        deferred, the pod's phase read through the API (the first read starts the pod's wrapper)."""
        result = real_run(ti=ti, task=task, client=client)
        if ti.task_id == "profile":
            seen = {"state": _value(result.state), "db": _db_state(ti), "error": str(result.error or ""),
                    "trigger": getattr(result.msg, "classpath", "").rsplit(".", 1)[-1]}  # fmt: skip
            if seen["trigger"] == "BackendRunTrigger":
                deadline = datetime.now(UTC) + timedelta(seconds=60)
                while (phase := _pod_phase(api)) != "Running" and datetime.now(UTC) < deadline:
                    pass
                seen["pod"], seen["db_while_pod_runs"] = phase, _db_state(ti)
            observed.append(seen)
        return result

    monkeypatch.setattr(supervisor, "run_task_in_process", observing)
    with FakeGpuNode(gpus=1) as node, FakeKubeApi(node.training) as api:
        script = node.base / "train.py"
        script.write_text(TRAIN)
        script.chmod(0o644)
        job = {"name": "k8s-profile", "command": ["python", str(script)], "steps": 10_000, "region": "GB",
               "device_kind": "gpu", "simulated_gpu": DIGITS_CNN["simulated_gpu"], "power_limits_w": LIMITS_W,
               "profile_steps": 6, "profile_warmup_steps": 1, "profile_min_window_s": 0.2,
               "max_slowdown": 1.0}  # fmt: skip
        out = tmp_path / "profile.json"
        monkeypatch.setenv("E2E_DAG_ID", "k8s_profile_sweep")
        monkeypatch.setenv("E2E_JOB_JSON", json.dumps(job))
        monkeypatch.setenv("E2E_KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig.json")))
        monkeypatch.setenv("E2E_OUT", str(out))
        dag_file = tmp_path / "k8s_profile_sweep.py"
        dag_file.write_text(DAG_FILE)
        bag = DagBag(dag_folder=str(dag_file))
        assert not bag.import_errors, bag.import_errors
        DagBundlesManager().sync_bundles_to_db()
        sync_bag_to_db(bag, "dags-folder", None)
        run = bag.get_dag("k8s_profile_sweep").test()
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        pods = [p for m, p in api.requests if m == "POST" and p.endswith("/pods")]
    assert states == {"profile": "success", "keep": "success"}, states
    deferred, resumed = observed
    assert deferred["trigger"] == "BackendRunTrigger" and deferred["state"] == deferred["db"] == "deferred", deferred
    assert deferred["pod"] == "Running" and deferred["db_while_pod_runs"] == "deferred", deferred
    assert resumed["state"] == "success" and resumed["error"] == "", resumed
    profile = Profile.model_validate_json(Path(out).read_text())
    assert [p.config.power_limit_w for p in profile.points] == LIMITS_W, "one point per swept limit"
    assert all(p.throughput_samples_per_s > 0 and p.energy_per_sample_j > 0 for p in profile.points)
    assert len(pods) == 1, "one pod swept every limit in its running training"
    assert api.objects == {}, "the profile's pod and config map were deleted"
