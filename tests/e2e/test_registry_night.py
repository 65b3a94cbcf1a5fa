"""Adding a model to the nightly batch is adding a file: the nightly_registry DAG, run through Airflow
(dag.test, embedded DB), profiles, plans and trains a job whose spec file was dropped into the registry
folder since the last run, with no DAG file edited. The training is the real digits CNN on this CPU on a
**simulated** V100; carbon data is the shipped NESO GB **replay**."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPEC = """name: {name}
workload: digits_cnn
simulated_gpu: {{gpu_model: V100, dataset: cifar100, network: shufflenetv2, count: 1, pair_type: "A3C"}}
max_containers: 1
epochs: 1
batch_size: 64
region: GB
objective: carbon
max_slowdown: 0.5
profile_steps: 20
profile_warmup_steps: 2
"""


def _parse(registry: Path):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "nightly_registry.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag("nightly_registry")


def _runs(job: str, kind: str) -> list:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(s.experiment_name(job))
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = '{kind}'")


def test_a_spec_file_dropped_into_the_registry_is_profiled_planned_and_trained_next_run(
    airflow_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tmp_path / "jobs"
    registry.mkdir()
    monkeypatch.setenv("CARBONFLOW_JOBS_DIR", str(registry))
    (registry / "reg-first.yaml").write_text(SPEC.format(name="reg-first"))

    run = _parse(registry).test()
    assert {ti.state for ti in run.get_task_instances()} == {"success"}
    assert len(_runs("reg-first", "training")) == 1 and _runs("reg-second", "training") == []

    (registry / "reg-second.yaml").write_text(SPEC.format(name="reg-second"))  # the only change
    dag = _parse(registry)
    run = dag.test()
    tis = run.get_task_instances()
    assert {ti.state for ti in tis} == {"success"}, {(ti.task_id, ti.map_index): ti.state for ti in tis}
    profiled = {ti.rendered_map_index for ti in tis if ti.task_id == "profile"}
    assert profiled == {"reg-first", "reg-second"}  # one mapped profile task per job, labelled with its name
    trained = {job for ti in tis if ti.task_id == "train" for job in (ti.rendered_map_index or "").split("+")}
    assert trained == {"reg-first", "reg-second"}
    assert len(_runs("reg-second", "profile")) >= 1
    assert len(_runs("reg-second", "training")) == 1
    assert len(_runs("reg-first", "training")) == 2
