"""nightly_retrain: every evening, profile → pair-profile → plan the night → wait → train → log.

Jobs are declared here; all logic lives in carbonflow's operators. Each job must finish by the
next morning (07:00 UTC). The night is planned jointly: each job's power limit, containers and
start, and which jobs share a GPU (pairs whose measured slowdown stays inside both jobs' bounds);
one training task per GPU group of the night plan (a job alone, or a pair sharing one GPU, labelled
with its job names in the UI), each in one GPU-pool slot. Runs that could not reach MLflow wait in
Airflow's metadata DB and are written by `deliver_runs` once MLflow is back.
Set CARBONFLOW_REPLAY=1 (as `make demo` does) to replay the shipped
NESO GB forecasts instead of calling live carbon-intensity APIs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from carbonflow.domain import OBJECTIVE_PARAM_PATTERN
from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    NightPlanOperator,
    PairProfileOperator,
    ValidateJobsOperator,
)
from carbonflow.operators.night import night_gpu_groups
from carbonflow.workloads.catalog import NIGHTLY_JOBS

GPU_POOL = "carbonflow_gpu"

JOBS = NIGHTLY_JOBS

with DAG(
    dag_id="nightly_retrain",
    description="Nightly carbon-aware retraining of recurring jobs (profile → plan → wait → train → log)",
    schedule="0 19 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    params={
        "region": Param(None, type=["null", "string"], description="override every job's grid region"),
        "objective": Param(
            None,
            type=["null", "string"],
            pattern=OBJECTIVE_PARAM_PATTERN,
            description="override every job's objective",
        ),
        "power_limit_w": Param(None, type=["null", "number"], exclusiveMinimum=0, description="fixed GPU power limit"),
        "max_slowdown": Param(
            None, type=["null", "number"], minimum=0, description="override every job's allowed slowdown (fraction)"
        ),
    },
    tags=["carbonflow", "nightly"],
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=JOBS)
    job_jsons = {job["name"]: f"{{{{ ti.xcom_pull(task_ids='validate', key='{job['name']}') }}}}" for job in JOBS}
    profile_ids = {name: "profile_" + name.replace("-", "_") for name in job_jsons}
    pairs = PairProfileOperator(task_id="profile_pairs", jobs=job_jsons, profile_task_ids=profile_ids, pool=GPU_POOL)
    night = NightPlanOperator(
        task_id="plan_night", jobs=job_jsons, profile_task_ids=profile_ids, pair_profile_task_id="profile_pairs"
    )
    for name, job_json in job_jsons.items():
        profile = EnergyProfileOperator(task_id=profile_ids[name], job=job_json, pool=GPU_POOL)
        validate >> profile >> pairs
    pairs >> night
    train = CarbonAwareTrainingOperator.partial(
        task_id="train",
        night_plan_task_id="plan_night",
        pool=GPU_POOL,
        map_index_template="{{ task.gpu_group | join('+') }}",
    ).expand(gpu_group=night_gpu_groups(night.output))
    train >> DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"]).as_teardown()
