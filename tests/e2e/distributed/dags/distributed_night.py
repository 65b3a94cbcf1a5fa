"""The distributed end-to-end test's night: a pair that may share a GPU and two jobs that cannot
(they need two containers), on the fake 4-GPU NVML node, served by CeleryExecutor with two workers."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    NightPlanOperator,
    PairProfileOperator,
    ValidateJobsOperator,
)
from carbonflow.operators.night import night_gpu_groups

HERE = Path(__file__).resolve().parent.parent
BASE = {"command": ["python", "train_steps.py"], "working_dir": str(HERE), "steps": 200, "batch_size": 32,
        "region": "GB", "objective": "energy", "max_slowdown": 2.0, "profile_steps": 40,
        # a training sees only what its job declares (the worker's environment does not reach it)
        "env": {"E2E_SPANS_FILE": os.environ.get("E2E_SPANS_FILE", "")}}  # fmt: skip
JOBS = [
    {**BASE, "name": "pair-a", "max_containers": 1},
    {**BASE, "name": "pair-b", "max_containers": 1},
    {**BASE, "name": "solo-c", "min_containers": 2, "max_containers": 2},
    {**BASE, "name": "solo-d", "min_containers": 2, "max_containers": 2},
]

with DAG(
    dag_id="distributed_night",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["carbonflow", "e2e"],
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=JOBS)
    jobs = {job["name"]: f"{{{{ ti.xcom_pull(task_ids='validate', key='{job['name']}') }}}}" for job in JOBS}
    profiles = {name: "profile_" + name.replace("-", "_") for name in jobs}
    pairs = PairProfileOperator(task_id="profile_pairs", jobs=jobs, profile_task_ids=profiles, pool="carbonflow_gpu")
    night = NightPlanOperator(task_id="plan_night", jobs=jobs, profile_task_ids=profiles,
                              pair_profile_task_id="profile_pairs", gpus=4)  # fmt: skip
    for name, job in jobs.items():
        validate >> EnergyProfileOperator(task_id=profiles[name], job=job, pool="carbonflow_gpu") >> pairs
    pairs >> night
    train = CarbonAwareTrainingOperator.partial(
        task_id="train", night_plan_task_id="plan_night", pool="carbonflow_gpu",
        map_index_template="{{ task.gpu_group | join('+') }}",
    ).expand(gpu_group=night_gpu_groups(night.output))  # fmt: skip
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"],
                                      retry_delay=timedelta(seconds=5), retry_exponential_backoff=False)  # fmt: skip
    train >> deliver.as_teardown()
