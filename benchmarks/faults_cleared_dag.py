"""The ``dag_run_cleared`` fault of benchmarks/faults.py, run by Airflow: a DAG run trains and logs a job, is
cleared with Airflow's own clear (as the UI's "Clear" of a DAG run), and runs again, ``--clears`` times.

Run as a subprocess with its own ``AIRFLOW_HOME`` (SQLite metadata DB, migrated by the caller) whose DAGs folder
holds only the DAG written here. The task does what the training operator does on every try: it takes the
run's identity from the Airflow context (``carbonflow.operators.carbon_aware_training._run_identity``: dag, run, clear
number, task), asks whether that run was already logged (``RunSession.already_logged``) and only then trains
(one line in ``$FAULTS_TRAININGS``) and logs it to ``$FAULTS_STORE``. Prints the DAG run's id and its clear
number after each run, as JSON, for the caller to count the runs each key holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "faults_dag_run_cleared"
TASK_ID = "train"
DAG_FILE = f"""
import sys
from datetime import datetime

from airflow.sdk import DAG, task

sys.path.insert(0, {str(REPO)!r})

with DAG(dag_id={DAG_ID!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task(task_id={TASK_ID!r})
    def train(**context):
        from benchmarks.faults_cleared_dag import train_once

        return train_once(context)

    train()
"""


def train_once(context: Any) -> str:
    """The training task's body: train and log unless this Airflow run (with its clear number) logged already."""
    from carbonflow.domain import utcnow
    from carbonflow.operators.carbon_aware_training import _run_identity
    from carbonflow.session.run import RunSession
    from carbonflow.session.source import CarbonSource
    from carbonflow.session.state import GroupMember, WaitState
    from carbonflow.tracking.logger import log_training_run
    from tests.tracking import tracking_factories as f

    job, store, folder = os.environ["FAULTS_JOB"], os.environ["FAULTS_STORE"], Path(os.environ["FAULTS_TRAININGS"])
    identity = _run_identity(context, job)
    session = RunSession(source=CarbonSource(replay=True), workdir=folder, tracking_uri=store,
                         identity=lambda name: identity)  # fmt: skip
    state = WaitState(members=[GroupMember(job=f.job_spec(job), plan=f.plan(job))], first_now=utcnow())
    if session.already_logged(state) is not None:
        return "reused"
    with (folder / "trainings").open("a") as out:
        out.write(identity.get("idempotency_key", "") + "\n")
    trace = folder / "trace.csv"
    trace.write_text("time_s,device,power_w\n0.0,GPU-0aa1,151.2\n1.0,GPU-0aa1,183.9\n")
    log_training_run(f.job_spec(job), f.plan(job), f.result(job), power_trace_csv=trace, tracking_uri=store,
                     spool_dir=folder / "spool", idempotency_key=identity.get("idempotency_key"))  # fmt: skip
    return "trained"


def write_dag(dags_folder: Path) -> None:
    dags_folder.mkdir(parents=True, exist_ok=True)
    (dags_folder / "faults_dag_run_cleared.py").write_text(DAG_FILE)


def _scheduler_dag(dag: Any) -> Any:
    """The DAG as the scheduler holds it (serialized), as ``dag.test`` makes it."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))


def _run_cleared(dag: Any, run_id: str) -> None:
    """Run a cleared DAG run again, as the scheduler would: the minimal loop of ``dag.test`` on that run."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.state import DagRunState, TaskInstanceState

    session = settings.Session()
    dr = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id).one()
    dr.dag = _scheduler_dag(dag)
    dr.state = DagRunState.RUNNING  # the scheduler picks the queued (cleared) run up
    session.commit()
    while dr.state == DagRunState.RUNNING:
        session.expire_all()
        schedulable, _ = dr.update_state(session=session)
        for ti in schedulable:
            ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        for ti in [t for t in dr.get_task_instances(session=session) if t.state == TaskInstanceState.SCHEDULED]:
            _run_task(ti=ti, task=dag.task_dict[ti.task_id])
    session.close()


def _clear(dag: Any, run_id: str) -> int:
    """Airflow's clear of the whole DAG run (``dag.clear``, as the UI's Clear); returns its new clear number."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState

    session = settings.Session()
    _scheduler_dag(dag).clear(run_id=run_id, dag_run_state=DagRunState.QUEUED, session=session)
    session.commit()
    number = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id).one().clear_number
    session.close()
    return int(number)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clears", type=int, required=True)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"the fault's DAG does not import: {bag.import_errors}")
    dag = bag.get_dag(DAG_ID)
    run = dag.test()
    runs = [{"run_id": run.run_id, "clear_number": int(run.clear_number or 0), "state": str(run.state)}]
    for _ in range(args.clears):
        number = _clear(dag, run.run_id)
        _run_cleared(dag, run.run_id)
        runs.append({"run_id": run.run_id, "clear_number": number})
    print(json.dumps({"dag_id": DAG_ID, "task_id": TASK_ID, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
