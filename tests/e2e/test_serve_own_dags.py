"""A local UI for your own DAGs (issue #25): ``carbonflow serve --dags DIR`` on a DAG folder outside the repository,
driven as a user would, in headless Chromium.

The user's folder (a DAG with a Params form and a plain PyTorch script, the docs' own-job example) is served; the
command prints the URL, the admin user and where the password file is, never the password. Logged in as that
admin (a token from the REST API, with the password read from the 0600 file), Chromium shows the DAG listed and
unpaused; a REST trigger with Params runs it to success; the Carbon page shows its run and names the carbon source,
the one the task used. Ctrl-C (SIGINT) stops the whole stack. The Carbon page's screenshot goes to
docs/img/local-ui-carbon.png (docs/getting-started.md, "Local UI") and, with the DOM and logs, .carbonflow/e2e/.

Needs Debian's chromium and chromium-driver (Chromium is driven through chromedriver's W3C WebDriver protocol).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
CARBONFLOW = str(Path(sys.executable).with_name("carbonflow"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = REPO / ".carbonflow" / "e2e" / "serve-own-dags"
SCREENSHOT = REPO / "docs" / "img" / "local-ui-carbon.png"
DAG_ID = "my_local_dag"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

USER_DAG = '''"""My own DAG, in my own folder: retrain my-mlp on demand, epochs chosen in the trigger form."""

from airflow.sdk import DAG, Param

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    ValidateJobsOperator,
)

JOB = {
    "name": "my-mlp",
    "command": ["python", "train.py", "--epochs", "{epochs}", "--batch-size", "{batch_size}"],
    "working_dir": "project",
    "epochs": 3,
    "samples_per_epoch": 512,
    "batch_size": 64,
    "region": "GB",
    "objective": "carbon",
    "max_slowdown": 0.1,
}

with DAG(
    DAG_ID,
    schedule=None,
    params={"epochs": Param(None, type=["null", "integer"], minimum=1, maximum=3, description="epochs")},
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=[JOB], overridable=("epochs",))
    job = "{{ ti.xcom_pull(task_ids='validate', key='my-mlp') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job)
    train = CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile")
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()
'''.replace("DAG_ID", repr(DAG_ID))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(predicate, timeout_s: float, interval_s: float = 1.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {str(last)[-3000:]!r}")


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell: none of the test session's Airflow, carbonflow or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CARBONFLOW", "MLFLOW"))}
    env.update({"HOME": str(home), "COLUMNS": "160", "PYTHONUNBUFFERED": "1"})
    return env


class Browser:
    """Headless Chromium through chromedriver's W3C WebDriver HTTP protocol (no client library needed)."""

    def __init__(self, profile: Path) -> None:
        self.port = _free_port()
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        _wait(lambda: self._ready(), 60, 0.5, "chromedriver")
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", f"--user-data-dir={profile}", "--window-size=1440,1000"]  # fmt: skip
        chrome = {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}
        caps = {"capabilities": {"alwaysMatch": chrome}}
        answer = requests.post(f"{self.url}/session", json=caps, timeout=120).json()["value"]
        assert "sessionId" in answer, answer
        self.session = f"{self.url}/session/{answer['sessionId']}"

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/status", timeout=2).json()["value"]["ready"]
        except (requests.RequestException, ValueError, KeyError):
            return False

    def _call(self, method: str, path: str, body: dict | None = None):
        answer = requests.request(method, f"{self.session}{path}", json=body, timeout=120).json()
        value = answer.get("value")
        if isinstance(value, dict) and value.get("error"):
            raise AssertionError(f"WebDriver {path}: {value['error']}: {value.get('message', '')[:500]}")
        return value

    def go(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def add_cookie(self, name: str, value: str) -> None:
        self._call("POST", "/cookie", {"cookie": {"name": name, "value": value, "path": "/", "httpOnly": True}})

    def source(self) -> str:
        return self._call("GET", "/source")

    def text(self) -> str:
        return self._call("POST", "/execute/sync", {"script": "return document.body.innerText", "args": []})

    def run(self, script: str):
        return self._call("POST", "/execute/sync", {"script": script, "args": []})

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))

    def close(self) -> None:
        with contextlib.suppress(requests.RequestException):
            requests.delete(self.session, timeout=30)
        os.killpg(self.driver.pid, signal.SIGTERM)
        self.driver.wait(timeout=30)


class Output:
    """A command's output lines, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self, start: int = 0) -> str:
        return "".join(self.lines[start:])

    def until(self, marker: str, timeout_s: float) -> str:
        """The output up to the line holding ``marker`` (fails when the command exits first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(marker in line for line in self.lines):
                return self.text()
            if self.proc.poll() is not None:
                self.thread.join(5)
                raise AssertionError(f"carbonflow serve exited {self.proc.returncode}:\n{self.text()}")
            time.sleep(0.2)
        raise AssertionError(f"no {marker!r} after {timeout_s:.0f} s:\n{self.text()}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def test_serve_own_dags_listed_unpaused_triggered_and_on_the_carbon_page(tmp_path: Path) -> None:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium not installed: apt-get install -y --no-install-recommends chromium chromium-driver")
    assert not tmp_path.resolve().is_relative_to(REPO)
    dags = tmp_path / "my-dags"
    dags.mkdir()
    shutil.copytree(REPO / "docs" / "examples" / "own_job" / "project", dags / "project")
    (dags / "my_local_dag.py").write_text(USER_DAG)
    home = tmp_path / "home"
    port, mlflow_port = _free_port(), _free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    serve = subprocess.Popen(
        [CARBONFLOW, "serve", "--dags", "my-dags", "--home", str(home), "--port", str(port),
         "--mlflow-port", str(mlflow_port)],
        cwd=tmp_path, env=_user_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    output = Output(serve)
    browser: Browser | None = None
    pgids: dict[str, int] = {}
    try:
        printed = output.until("serving until Ctrl-C", 600)
        (ARTIFACTS / "serve-output.txt").write_text(printed)
        pgids = {p.stem: int(p.read_text()) for p in (home / "run").glob("*.pid")}
        base = f"http://127.0.0.1:{port}"
        passwords = home / "airflow" / "simple_auth_manager_passwords.json"
        password = json.loads(passwords.read_text())["admin"]
        assert f"Airflow UI      {base}" in printed
        assert f"Airflow admin   user admin, password in {passwords} (mode 0600)" in printed
        assert f"DAGs folder     {dags}" in printed and "new DAGs start unpaused: yes" in printed
        assert "carbon source   replay" in printed
        assert password not in printed

        token = requests.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
        token.raise_for_status()
        headers = {"Authorization": f"Bearer {token.json()['access_token']}"}

        def api(method: str, path: str, **kw) -> requests.Response:
            return requests.request(method, f"{base}/api/v2{path}", headers=headers, timeout=60, **kw)

        dag = _wait(lambda: (r := api("GET", f"/dags/{DAG_ID}")).status_code == 200 and r.json(), 300, 2,
                    f"{DAG_ID} to be parsed from {dags}")  # fmt: skip
        assert dag["is_paused"] is False, dag  # unpaused at creation: no PATCH here
        assert dag["fileloc"].startswith(str(dags)), dag["fileloc"]
        assert api("GET", "/importErrors").json()["total_entries"] == 0

        # the UI, logged in as admin with the REST token (the cookie Airflow's own login sets)
        browser = Browser(tmp_path / "chromium-profile")
        browser.go(f"{base}/api/v2/version")
        browser.add_cookie("_token", token.json()["access_token"])
        browser.go(f"{base}/dags/{DAG_ID}")
        _wait(lambda: DAG_ID in browser.text(), 120, 1, f"the UI to show {DAG_ID}")
        toggles = "return [...document.querySelectorAll('[data-testid=toggle-pause]')].map(e => e.dataset.state)"
        (ARTIFACTS / "dag_page.html").write_text(browser.source())
        states = _wait(lambda: browser.run(toggles), 60, 1, "the DAG's pause switch")
        browser.screenshot(ARTIFACTS / "dag_page.png")
        assert states == ["checked"], states  # Airflow's pause switch, on: the DAG runs (unpaused)
        browser.go(f"{base}/dags")
        _wait(lambda: DAG_ID in browser.text(), 120, 1, f"the DAG list to show {DAG_ID}")
        listed = _wait(lambda: browser.run(toggles), 60, 1, "the DAG list's pause switch")
        (ARTIFACTS / "dag_list.html").write_text(browser.source())
        browser.screenshot(ARTIFACTS / "dag_list.png")
        assert listed == ["checked"], listed  # the folder's one DAG, listed and on

        # a REST trigger with Params runs it to success
        run = api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {"epochs": 2}})
        assert run.status_code == 200, run.text
        run_id = run.json()["dag_run_id"]

        def finished():
            state = api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
            return state if state in ("success", "failed") else None

        state = _wait(finished, 900, 2, f"run {run_id} to finish")
        tis = api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        assert state == "success", {t["task_id"]: t["state"] for t in tis}

        from carbonflow.tracking import schema
        from carbonflow.web.data import latest_runs

        [row] = [r for r in latest_runs(f"http://127.0.0.1:{mlflow_port}", limit=10) if r.dag_id == DAG_ID]
        assert row.job == "my-mlp" and row.status == "FINISHED" and row.forecast_provider
        from mlflow import MlflowClient

        params = MlflowClient(tracking_uri=f"http://127.0.0.1:{mlflow_port}").get_run(row.run_id).data.params
        assert params[schema.P_EPOCHS] == "2"  # the trigger's Params reached the training

        # the Carbon page: the run, and the carbon source named (the one the task used)
        browser.add_cookie("_token", token.json()["access_token"])

        def carbon_page():
            browser.go(f"{base}/carbonflow/carbon")
            html = browser.source()
            return html if row.run_id in html and 'id="carbon-source-name"' in html else None

        html = _wait(carbon_page, 300, 3, "the Carbon page with the run and its carbon source")
        (ARTIFACTS / "carbon_page.html").write_text(html)
        name = re.search(r'<b id="carbon-source-name">(.*?)</b>', html).group(1)
        assert name == row.forecast_provider, (name, row.forecast_provider)
        cells = re.search(rf'<tr class="run-row" data-run-id="{row.run_id}">(.*?)</tr>', html).group(1)
        assert f'<td class="text source">{row.forecast_provider}</td>' in cells
        browser.run("window.scrollTo(0, 0)")
        browser.screenshot(ARTIFACTS / "carbon_page.png")
        assert (ARTIFACTS / "carbon_page.png").stat().st_size > 20_000
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ARTIFACTS / "carbon_page.png", SCREENSHOT)
    finally:
        if browser is not None:
            browser.close()
        for log in (home / "logs").glob("*.log"):
            shutil.copy(log, ARTIFACTS / log.name)
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C
        try:
            serve.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        output.thread.join(10)
        rest = output.text()
        (ARTIFACTS / "serve-stop.txt").write_text(rest)
        left = [name for name, pgid in pgids.items() if _group_alive(pgid)]
        for name in left:  # never leave processes behind, even when the stop failed
            os.killpg(pgids[name], signal.SIGKILL)
    assert serve.returncode == 0, rest
    assert "carbonflow serve: stopped" in rest
    assert not left, f"still running after Ctrl-C: {left}"
    assert not list((home / "run").glob("*.pid"))
