"""Production safety end to end on a multi-host Airflow: CeleryExecutor on the machine's Redis, the metadata DB
on its PostgreSQL, an MLflow server, two Celery workers and a triggerer, each with its own CARBONFLOW_HOME as
if on separate hosts, all on one 4-GPU **fake** NVML node (tests/energy/fake_pynvml; no GPU exists here).

The night (tests/e2e/distributed/dags/distributed_night.py) has a pair that may share a GPU and two jobs that
cannot. Checked: every job trains exactly once and has exactly one MLflow training run, no GPU is used by
two groups at once, every limit is back where it was. Then with faults: MLflow down for the whole training
(the runs are held in XCom and appear once MLflow is back, after the worker that trained is killed), and the
DAG run cleared and run again (one new run per job, no stale outcome).

Run it alone with ``make e2e-distributed``; ``make test`` runs it too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import requests
from test_stack_e2e import REPO, Stack, _group_alive, _wait

sys.path.insert(0, str(REPO / "tests"))
from fakes.node import FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(2400)]

DAG_ID = "distributed_night"
JOBS = ("pair-a", "pair-b", "solo-c", "solo-d")
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def _database() -> tuple[str, str]:
    import psycopg2

    try:
        conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG)
    except Exception as err:  # the machine's PostgreSQL is part of this test's setup (scripts/system-deps.sh)
        raise AssertionError(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {err}") from None
    name = f"airflow_e2e_{uuid.uuid4().hex[:8]}"
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return name, f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"


def _drop(name: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    conn.close()


class DistributedStack(Stack):
    def __init__(self, home: Path, node: FakeNode, db_url: str) -> None:
        super().__init__(home)
        self.node = node
        self.spans = home / "spans.jsonl"
        node_env = node.env()
        self.env.update({k: node_env[k] for k in ("PYTHONPATH", "FAKE_PYNVML_STATE", "CARBONFLOW_POWER_JOURNAL_DIR",
                                                  "CARBONFLOW_GPU_LEASE_DIR")})  # fmt: skip
        self.env.update({
            "CARBONFLOW_EXECUTOR": "celery",
            "CARBONFLOW_AIRFLOW_DB_URL": db_url,
            "CARBONFLOW_CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{int(uuid.uuid4().int % 8) + 8}",
            "CARBONFLOW_CELERY_WORKERS": "2",
            "CARBONFLOW_DAGS_FOLDER": str(REPO / "tests" / "e2e" / "distributed" / "dags"),
            "CARBONFLOW_GPU_POOL_SLOTS": "4",
            "CARBONFLOW_REPLAY_MIN_WAIT_S": "2",
            "E2E_SPANS_FILE": str(self.spans),
            # heartbeats and retries lowered so that faults are noticed in seconds, not minutes
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "3",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # a task a killed worker had taken from the broker but not started stays "queued" (the Redis transport
            # gives it back after its 1 h visibility timeout) until the scheduler's task_queued_timeout (Airflow's
            # default 600 s) sends it again: lowered, above the longest queue wait for a worker slot here
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "180",
            "AIRFLOW__CORE__PARALLELISM": "8",
        })  # fmt: skip
        self.expected = {"mlflow", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                         "airflow-triggerer", "airflow-celery-worker-1", "airflow-celery-worker-2"}  # fmt: skip

    def start(self) -> None:
        proc = subprocess.run([str(REPO / "scripts" / "serve.sh")], env=self.env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"serve.sh failed:\n{proc.stdout}\n{proc.stderr}"
        for pidfile in (self.home / "run").glob("*.pid"):
            self.pgids[pidfile.stem] = int(pidfile.read_text())
        assert set(self.pgids) == self.expected
        _wait(self._workers_ready, 180, 2, "both Celery workers to be ready")

    def _workers_ready(self) -> bool:
        logs = [(self.home / "logs" / f"airflow-celery-worker-{i}.log").read_text(errors="replace") for i in (1, 2)]
        return all("ready." in log for log in logs)

    def run_dag(self, timeout_s: float = 1200, on_running: Any = None) -> tuple[str, str]:
        response = self.api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}})
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]
        return run_id, self.wait_run(run_id, timeout_s, on_running)

    def wait_run(self, run_id: str, timeout_s: float, on_running: Any = None) -> str:
        def finished() -> str | None:
            if on_running is not None:
                on_running(self, run_id)
            run = self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
            return run["state"] if run["state"] in ("success", "failed") else None

        try:
            return _wait(finished, timeout_s, 1.0, f"dag run {run_id} to finish")
        except AssertionError as err:  # say which task held the run up
            states = {(t["task_id"], t["rendered_map_index"], t["try_number"]): t["state"]
                      for t in self.task_instances(run_id)}  # fmt: skip
            raise AssertionError(f"{err}; task instances (task, map index, try): {states}") from None

    def task_instances(self, run_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]

    def kill(self, name: str) -> None:
        """The host is gone: its process group, every task and wrapper under it, SIGKILLed."""
        os.killpg(self.pgids[name], signal.SIGKILL)
        _wait(lambda: not _group_alive(self.pgids[name]), 30, 0.5, f"{name} to die")

    def restart_mlflow(self) -> None:
        log = (self.home / "logs" / "mlflow.log").open("a")
        backend = f"sqlite:///{self.home / 'mlflow.db'}"
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port",
             str(self.mlflow_port), "--workers", "1", "--backend-store-uri", backend,
             "--artifacts-destination", str(self.home / "mlartifacts")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
        )  # fmt: skip
        _reap_when_done(proc)
        self.pgids["mlflow"] = proc.pid
        (self.home / "run" / "mlflow.pid").write_text(str(proc.pid))
        _wait(lambda: _mlflow_up(self.mlflow_port), 120, 1, "MLflow to be back")


def _reap_when_done(proc: subprocess.Popen) -> None:
    """A service this test restarted is its child: reap it when it dies, so stop.sh never sees a zombie."""
    threading.Thread(target=proc.wait, daemon=True).start()


def _mlflow_up(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=3).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory):  # type: ignore[no-untyped-def]
    name, url = _database()
    root = tmp_path_factory.mktemp("distributed")
    node = FakeNode(root / "node", gpus=4)
    for index in range(4):  # a busy GPU draws 250 W (capped by its limit); the fake's default draws nothing
        node.nvml.update_device(str(node.state_path), index, load_power_mw=250_000)
    stack = DistributedStack(root / "home", node, url)
    try:
        stack.start()
        dag = _wait(lambda: stack.api("GET", f"/dags/{DAG_ID}").status_code == 200, 240, 2, f"DAG {DAG_ID} parsed")
        assert dag
        assert stack.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
        yield stack
    finally:
        stack.save_logs()
        result = stack.stop()
        for pgid in stack.pgids.values():
            if _group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
        _drop(name)
        assert result.returncode == 0, result.stdout + result.stderr


def _training_runs(stack: DistributedStack, job: str) -> list[Any]:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{stack.mlflow_port}")
    experiment = client.get_experiment_by_name(s.experiment_name(job))
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")


def _spans(stack: DistributedStack, mode: str = "train") -> list[dict[str, Any]]:
    if not stack.spans.exists():
        return []
    return [json.loads(line) for line in stack.spans.read_text().splitlines() if json.loads(line)["mode"] == mode]


def _double_booked(spans: list[dict[str, Any]], groups: dict[str, str]) -> list[str]:
    """GPUs used at one time by trainings of different groups (a pair sharing its one GPU is one group)."""
    by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        for gpu in filter(None, span["gpus"].split(",")):
            by_gpu[gpu].append(span)
    clashes = []
    for gpu, uses in by_gpu.items():
        for i, a in enumerate(uses):
            for b in uses[i + 1 :]:
                same_group = groups.get(a["job"], a["job"]) == groups.get(b["job"], b["job"])
                if not same_group and a["start"] < b["end"] and b["start"] < a["end"]:
                    clashes.append(f"{gpu}: {a['job']} and {b['job']}")
    return clashes


def _groups(stack: DistributedStack, run_id: str) -> dict[str, str]:
    labels = [ti["rendered_map_index"] for ti in stack.task_instances(run_id) if ti["task_id"] == "train"]
    return {job: label for label in labels if label for job in label.split("+")}


def test_a_night_on_celery_trains_each_job_once_on_its_own_gpus_and_restores_every_limit(stack) -> None:  # type: ignore[no-untyped-def]
    run_id, state = stack.run_dag()
    tis = stack.task_instances(run_id)
    assert state == "success", {(t["task_id"], t["rendered_map_index"]): t["state"] for t in tis}
    hosts = {t["hostname"] for t in tis if t["task_id"] in ("train", "profile_pair_a", "profile_solo_c")}
    groups = _groups(stack, run_id)
    assert set(groups) == set(JOBS), groups
    assert any("+" in label for label in groups.values()), f"the pair did not share a GPU: {groups}"
    from carbonflow.tracking import schema as s

    limits_w = []
    for job in JOBS:
        [run] = _training_runs(stack, job)
        limits_w.append(float(run.data.params.get(s.P_POWER_LIMIT_W) or 300))
    assert min(limits_w) < 300, f"no run lowered a limit, so restoring them proves nothing: {limits_w}"
    trained = [s["job"] for s in _spans(stack)]
    assert sorted(set(trained)) == sorted(JOBS) and len(trained) == len(JOBS) + 2  # solo jobs: 2 containers each
    assert _double_booked(_spans(stack) + _spans(stack, "profile"), groups) == []
    assert stack.node.lowered() == 0, stack.node.limits_mw()
    print(f"tasks ran on {sorted(hosts)}")


def _wrapper_workers(stack: DistributedStack) -> set[str]:
    """The Celery workers (by their host folder) whose training wrappers are running now."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"carbonflow.cli" not in cmdline or not ({b"run", b"run-shared"} & set(cmdline)):
            continue
        home = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"CARBONFLOW_HOME=")), "")
        if "/hosts/airflow-celery-worker-" in home or "/hosts/worker-" in home:
            found.add(Path(home).name)
    return found


def test_kill_9_of_the_worker_running_a_training_retries_it_elsewhere_with_one_mlflow_run(stack) -> None:  # type: ignore[no-untyped-def]
    before = {job: len(_training_runs(stack, job)) for job in JOBS}
    killed: dict[str, str] = {}

    def kill_a_training_worker(s: DistributedStack, run_id: str) -> None:
        if killed:
            return
        training = [t for t in s.task_instances(run_id) if t["task_id"] == "train" and t["state"] == "running"]
        workers = _wrapper_workers(s) if training else set()
        if workers:
            host = sorted(workers)[0]  # worker-N, or airflow-celery-worker-N-replacement
            name = "airflow-celery-worker-" + re.search(r"worker-(\d+)", host).group(1)  # type: ignore[union-attr]
            s.kill(name)
            killed["worker"] = name
            _restart_worker(s, name)

    run_id, state = stack.run_dag(on_running=kill_a_training_worker)
    assert killed, "no training was seen running to kill its worker"
    assert state == "success", {
        (t["task_id"], t["rendered_map_index"]): t["state"] for t in stack.task_instances(run_id)
    }
    retried = [t for t in stack.task_instances(run_id) if t["task_id"] == "train" and t["try_number"] > 1]
    assert retried, "the killed worker's training was not retried"
    for job in JOBS:
        assert len(_training_runs(stack, job)) == before[job] + 1, job
    assert stack.node.lowered() == 0, stack.node.limits_mw()


def test_mlflow_down_for_the_whole_training_the_runs_arrive_once_it_is_back_after_the_worker_is_gone(stack) -> None:  # type: ignore[no-untyped-def]
    before = {job: len(_training_runs(stack, job)) for job in JOBS}
    down: dict[str, bool] = {}

    def stop_mlflow_before_training(s: DistributedStack, run_id: str) -> None:
        if down:
            return
        if any(t["task_id"] == "train" for t in s.task_instances(run_id)):
            s.kill("mlflow")
            down["at"] = True

    response = stack.api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}})
    run_id = response.json()["dag_run_id"]

    def trained_all() -> bool:
        stop_mlflow_before_training(stack, run_id)
        trains = [t for t in stack.task_instances(run_id) if t["task_id"] == "train"]
        return bool(trains) and all(t["state"] == "success" for t in trains)

    _wait(trained_all, 1200, 1.0, "every group to train with MLflow down")
    assert not _mlflow_up(stack.mlflow_port)
    for name in ("airflow-celery-worker-1", "airflow-celery-worker-2"):
        stack.kill(name)  # the workers that trained are gone, with their spools
    for name in ("airflow-celery-worker-1", "airflow-celery-worker-2"):
        _restart_worker(stack, name)
    stack.restart_mlflow()
    assert stack.wait_run(run_id, 600) == "success"
    for job in JOBS:
        runs = _training_runs(stack, job)
        assert len(runs) == before[job] + 1, job
    assert stack.node.lowered() == 0


def _restart_worker(stack: DistributedStack, name: str) -> None:
    """A new worker host (an empty CARBONFLOW_HOME: nothing of the old one's disk)."""
    index = name.rsplit("-", 1)[1]
    home = stack.home / "hosts" / f"{name}-replacement"
    home.mkdir(parents=True, exist_ok=True)
    env = {**stack.env, "CARBONFLOW_HOME": str(home)}
    source = f"source {stack.home / 'stack.env'}; export CARBONFLOW_HOME={home}; "
    log = (stack.home / "logs" / f"{name}.log").open("a")
    proc = subprocess.Popen(
        ["bash", "-c", source + f"exec {Path(sys.executable).parent / 'airflow'} celery worker "
                                f"--celery-hostname worker-{index}b@%h --concurrency 2 --skip-serve-logs"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    _reap_when_done(proc)
    stack.pgids[name] = proc.pid
    (stack.home / "run" / f"{name}.pid").write_text(str(proc.pid))


def test_a_cleared_dag_run_trains_each_job_once_more_with_no_stale_outcome(stack) -> None:  # type: ignore[no-untyped-def]
    run_id, state = stack.run_dag()
    assert state == "success"
    after_first = {job: len(_training_runs(stack, job)) for job in JOBS}
    trained_before = len(_spans(stack))
    response = stack.api("POST", f"/dags/{DAG_ID}/clearTaskInstances",
                         json={"dry_run": False, "dag_run_id": run_id, "reset_dag_runs": True,
                               "only_failed": False})  # fmt: skip
    assert response.status_code == 200, response.text
    _wait(lambda: stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"] != "success", 60, 0.5,
          "the cleared run to start again")  # fmt: skip
    assert stack.wait_run(run_id, 1200) == "success"
    for job in JOBS:
        assert len(_training_runs(stack, job)) == after_first[job] + 1, job
    assert len(_spans(stack)) == trained_before + len(JOBS) + 2
    assert stack.node.lowered() == 0
