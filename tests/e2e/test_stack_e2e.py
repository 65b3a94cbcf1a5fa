"""The whole stack, as `make serve` runs it: trigger retrain_on_demand through Airflow's REST API v2, watch its
training task defer and succeed, find the MLflow run, open the Carbon page in headless Chromium, stop the stack
with nothing left running.

Needs: the venv with carbonflow installed, Debian's chromium (apt-get install chromium chromium-driver).
Artifacts (screenshot, DOM, stack logs) are copied to .carbonflow/e2e/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
DAG_ID = os.environ.get("CARBONFLOW_E2E_DAG", "retrain_on_demand")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / ".carbonflow" / "e2e"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Stack:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.airflow_port = _free_port()
        self.mlflow_port = _free_port()
        self.env = {
            **os.environ,
            "CARBONFLOW_HOME": str(home),
            "CARBONFLOW_AIRFLOW_PORT": str(self.airflow_port),
            "CARBONFLOW_MLFLOW_PORT": str(self.mlflow_port),
            "CARBONFLOW_VENV": str(Path(sys.executable).parent.parent),
            "CARBONFLOW_REPLAY": "1",  # replay the shipped NESO data: no live API, waiting in replayed time
            "CARBONFLOW_CARBON_MODE": "replay",
            # the test is about deferral: the safer-start guard would start the replayed evening at once on some
            # wall-clock hours (its dip within the forecast's error)
            "CARBONFLOW_START_GUARD_Z": "0",
            "CARBONFLOW_SERVE_AUTH": "all-admins",  # tokens and Chromium's login without a password (tests only)
        }
        self.pgids: dict[str, int] = {}
        self.base = f"http://127.0.0.1:{self.airflow_port}"
        self._token: str | None = None

    def start(self) -> None:
        proc = subprocess.run(
            [str(REPO / "scripts" / "serve.sh")], env=self.env, capture_output=True, text=True, timeout=400
        )
        assert proc.returncode == 0, f"serve.sh failed:\n{proc.stdout}\n{proc.stderr}"
        for pidfile in (self.home / "run").glob("*.pid"):
            self.pgids[pidfile.stem] = int(pidfile.read_text())
        assert set(self.pgids) == {
            "mlflow",
            "airflow-api-server",
            "airflow-scheduler",
            "airflow-dag-processor",
            "airflow-triggerer",
        }

    def stop(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(REPO / "scripts" / "stop.sh")], env=self.env, capture_output=True, text=True, timeout=300
        )

    @property
    def token(self) -> str:
        if self._token is None:
            response = requests.get(f"{self.base}/auth/token", timeout=30)  # SimpleAuthManager, all admins
            response.raise_for_status()
            self._token = response.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, headers_accept: str = "application/json", **kw) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": headers_accept}
        return requests.request(method, f"{self.base}/api/v2{path}", headers=headers, timeout=60, **kw)

    def save_logs(self) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for log in (self.home / "logs").glob("*.log"):
            shutil.copy(log, ARTIFACTS / log.name)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("stack"))
    try:
        stack.start()
        yield stack
    finally:
        stack.save_logs()
        result = stack.stop()
        left = [name for name, pgid in stack.pgids.items() if _group_alive(pgid)]
        for name in left:  # never leave processes behind, even when stop.sh failed
            os.killpg(stack.pgids[name], signal.SIGKILL)
        assert result.returncode == 0, result.stdout + result.stderr
        assert not left, f"still running after stop.sh: {left}"


def _wait(predicate, timeout_s: float, interval_s: float = 1.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")


def _task_log(stack: Stack, run_id: str, task_id: str) -> str:
    """Every try's log of a task instance, as text (REST API v2)."""
    ti = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}").json()
    texts = []
    for try_number in range(1, int(ti.get("try_number") or 1) + 1):
        r = stack.api(
            "GET",
            f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers_accept="application/json",
        )
        texts.append(r.text)
    return "\n".join(texts)


def test_trigger_defer_succeed_mlflow_and_carbon_page(stack):
    # the DAG is parsed and has no import errors
    def dag_ready():
        r = stack.api("GET", f"/dags/{DAG_ID}")
        return r.json() if r.status_code == 200 else None

    dag = _wait(dag_ready, 180, 2, f"DAG {DAG_ID} to be parsed")
    errors = stack.api("GET", "/importErrors").json()
    assert errors["total_entries"] == 0, errors
    if dag["is_paused"]:
        assert stack.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200

    response = stack.api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}})
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]

    # watch the task instances: the training task must be seen deferred, then everything succeeds
    seen: dict[str, list[str]] = {}
    operators: dict[str, str] = {}

    def finished():
        tis = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        for ti in tis:
            states = seen.setdefault(ti["task_id"], [])
            operators[ti["task_id"]] = ti.get("operator") or ""
            if not states or states[-1] != ti["state"]:
                states.append(ti["state"])
        run = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
        return run["state"] if run["state"] in ("success", "failed") else None

    state = _wait(finished, 900, 0.25, f"dag run {run_id} to finish")
    training = [t for t, op in operators.items() if op == "CarbonAwareTrainingOperator"]
    assert training, f"no CarbonAwareTrainingOperator task in {operators}"
    assert state == "success", f"dag run ended {state}; task states: {seen}"
    for task in training:
        assert seen[task][-1] == "success"
        if "deferred" not in seen[task]:
            # A replayed wait can be shorter than the polling interval: then Airflow's own task log (read
            # through the same REST API) must show that the task paused as DEFERRED and resumed.
            log = _task_log(stack, run_id, task)
            assert "Pausing task as DEFERRED" in log, f"{task} never deferred: states {seen[task]}"
            seen[task].insert(-1, "deferred (from the task log)")

    # the MLflow run exists on the stack's tracking server, with the documented metrics
    from carbonflow.web.data import latest_runs

    mlflow_uri = f"http://127.0.0.1:{stack.mlflow_port}"
    runs = latest_runs(mlflow_uri, limit=10)
    assert runs, f"no training run in MLflow at {mlflow_uri}"
    newest = runs[0]
    assert newest.status == "FINISHED"
    assert newest.energy_total_j and newest.energy_total_j > 0
    assert newest.emissions_g is not None and newest.emissions_g > 0
    assert newest.test_accuracy is not None

    # the Carbon page in headless Chromium (logged in through Airflow's all-admins login redirect)
    if CHROMIUM is None:
        pytest.fail("chromium not installed: apt-get install -y --no-install-recommends chromium chromium-driver")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    url = f"{stack.base}/auth/token/login?next=/carbonflow/carbon"
    profile = stack.home / "chromium-profile"
    common = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1440,1100",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    (ARTIFACTS / "carbon_page.html").write_text(html)
    line = re.search(r'<path id="forecast-line" d="([^"]+)"[^>]*data-points="(\d+)"', html)
    assert line and int(line.group(2)) > 1, "forecast chart not rendered"
    rows = re.findall(r'<tr class="run-row" data-run-id="([0-9a-f]+)">', html)
    assert newest.run_id in rows, f"run {newest.run_id} not in the table ({rows})"
    shot = ARTIFACTS / "carbon_page.png"
    shot.unlink(missing_ok=True)
    proc = subprocess.run([*common, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    # the Airflow UI lists the page in its navigation (external view of the plugin)
    plugins = stack.api("GET", "/plugins").json()["plugins"]
    views = [v for p in plugins if p["name"] == "carbonflow" for v in p["external_views"]]
    assert views and views[0]["href"] == "/carbonflow/carbon"
    (ARTIFACTS / "run.json").write_text(
        json.dumps({"dag_id": DAG_ID, "run_id": run_id, "task_states": seen, "mlflow_run": newest.to_json()}, indent=2)
    )
