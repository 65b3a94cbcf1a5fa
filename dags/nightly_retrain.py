"""nightly_retrain: every evening, profile → plan → wait → train → log for each recurring job.

Jobs are declared here; all logic lives in carbonflow's operators. Each job must finish by the
next morning (07:00 UTC). Set CARBONFLOW_REPLAY=1 (as `make demo` does) to replay the shipped
NESO GB forecasts instead of calling live carbon-intensity APIs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from carbonflow.operators import CarbonAwareTrainingOperator, EnergyProfileOperator, ValidateJobsOperator
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
            pattern=r"^(carbon|energy|time|edp|eds:[0-9.]+|zeus:[0-9.]+)$",
            description="override every job's objective",
        ),
        "power_limit_w": Param(None, type=["null", "number"], exclusiveMinimum=0, description="fixed GPU power limit"),
    },
    tags=["carbonflow", "nightly"],
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=JOBS)
    for job in JOBS:
        name = job["name"]
        key = name.replace("-", "_")
        job_json = f"{{{{ ti.xcom_pull(task_ids='validate', key='{name}') }}}}"
        profile = EnergyProfileOperator(task_id=f"profile_{key}", job=job_json, pool=GPU_POOL)
        train = CarbonAwareTrainingOperator(
            task_id=f"train_{key}", job=job_json, profile_task_id=f"profile_{key}", pool=GPU_POOL
        )
        validate >> profile >> train
