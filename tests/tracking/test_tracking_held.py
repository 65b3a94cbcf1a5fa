"""Finding: the MLflow spool lived only on the worker's disk, so a run recorded during an outage was lost
with an ephemeral worker. Now the record is also held in XCom (Airflow's metadata DB) and a downstream
task delivers it, exactly once, when MLflow is back, even after the worker and its disk are gone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import tracking_factories as f
from tracking_server_process import MlflowServer

from carbonflow.tracking import schema
from carbonflow.tracking.held import HELD_RUN_MAX_KIB, deliver_held, hold_run
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.store import client_for, search_all_runs, tag_filter


def _spooled_run(server: MlflowServer, job: str, files: dict[str, Path]) -> Any:
    server.stop()
    spec = f.job_spec(job)
    outcome = log_training_run(spec, f.plan(job), f.result(job), power_trace_csv=files["trace"],
                               model_path=files["model"], tracking_uri=server.uri)  # fmt: skip
    assert outcome.spooled
    return outcome


def _runs(server: MlflowServer, job: str, key: str) -> list[Any]:
    client = client_for(server.uri)
    experiment = client.get_experiment_by_name(schema.experiment_name(job))
    return search_all_runs(client, [experiment.experiment_id], tag_filter(schema.T_IDEMPOTENCY_KEY, key))


def test_a_held_run_reaches_mlflow_once_after_the_worker_and_its_spool_are_gone(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path]
) -> None:
    outcome = _spooled_run(server, job_name, files)
    held = json.loads(json.dumps(hold_run(outcome.model_dump(mode="json"))))  # as XCom stores it
    assert held["left_on_worker"] == []
    shutil.rmtree(home)  # the worker pod is gone, with its spool
    with pytest.raises(Exception):  # noqa: B017 - MLflow still down: the delivering task fails and is retried
        deliver_held(held, server.uri)
    server.start()
    run_id = deliver_held(held, server.uri)
    assert deliver_held(held, server.uri) == run_id  # a retry of the delivering task finds the run
    [run] = _runs(server, job_name, outcome.idempotency_key)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.tags[schema.T_LOGGED_LATE] == "true"
    artifacts = {a.path for a in client_for(server.uri).list_artifacts(run_id)}
    assert schema.A_PLAN in artifacts


def test_a_file_over_the_budget_stays_on_the_worker_and_the_run_says_so(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path]
) -> None:
    files["model"].write_bytes(os.urandom(HELD_RUN_MAX_KIB * 1024))  # a checkpoint bigger than a held run may be
    outcome = _spooled_run(server, job_name, files)
    held = hold_run(outcome.model_dump(mode="json"))
    assert any(name.endswith("model.pt") for name in held["left_on_worker"]), held["left_on_worker"]
    server.start()
    run_id = deliver_held(held, server.uri)
    [run] = _runs(server, job_name, outcome.idempotency_key)
    assert run.info.run_id == run_id
    assert "model.pt" in run.data.tags[schema.T_HELD_WITHOUT]


def test_the_deliver_task_writes_held_runs_of_every_map_index_and_fails_while_mlflow_is_down(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path]
) -> None:
    from carbonflow.operators.delivery import DeliverHeldRunsOperator, HeldRunsNotDelivered

    outcome = _spooled_run(server, job_name, files)
    held = hold_run(outcome.model_dump(mode="json"))

    class _Ti:  # Airflow's xcom_pull over a list of task ids: one value per task and map index
        def xcom_pull(self, task_ids: list[str], key: str) -> list[Any]:
            assert task_ids == ["train"] and key == "held_runs"
            return [[held], None]

    op = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"], tracking_uri=server.uri)
    assert op.trigger_rule == "all_done" and op.retries > 0
    with pytest.raises(HeldRunsNotDelivered, match="1 of 1 held run"):
        op.execute({"ti": _Ti()})
    server.start()
    delivered = op.execute({"ti": _Ti()})["delivered"]
    assert list(delivered) == [outcome.idempotency_key]
    assert len(_runs(server, job_name, outcome.idempotency_key)) == 1
