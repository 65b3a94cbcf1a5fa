"""retrain_on_demand: retrain one job now, from Airflow's "Trigger DAG" form.

The Params form validates its fields with JSON schema; the first task then checks what a schema
cannot (a known region, finish-by in the future, a power limit inside the device's range) before
any profiling or training starts.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    ValidateJobsOperator,
)
from carbonflow.workloads.catalog import JOBS_BY_NAME

GPU_POOL = "carbonflow_gpu"

with DAG(
    dag_id="retrain_on_demand",
    description="Retrain one job carbon-aware now, with a validated request form",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "job": Param(
            "digits-cnn",
            type="string",
            enum=sorted(JOBS_BY_NAME),
            description="which registered job (or give job_spec)",
        ),
        "region": Param(
            "GB",
            type="string",
            minLength=2,
            description="grid zone (GB, DE, US-CAL-CISO) or cloud region (aws:eu-west-2)",
        ),
        "finish_by": Param(
            None, type=["null", "string"], format="date-time", description="UTC deadline; empty: next 07:00 UTC"
        ),
        "objective": Param(
            "carbon",
            type="string",
            pattern=r"^(carbon|energy|time|edp|eds:[0-9.]+|zeus:[0-9.]+)$",
            description="carbon, energy, time, edp, eds:<k>, zeus:<eta>",
        ),
        "max_slowdown": Param(
            0.15, type="number", minimum=0, maximum=2, description="allowed extra run time (fraction)"
        ),
        "power_limit_w": Param(
            None, type=["null", "number"], exclusiveMinimum=0, description="fix the GPU power limit"
        ),
        "epochs": Param(None, type=["null", "integer"], minimum=1, description="override the work, in epochs"),
        "steps": Param(None, type=["null", "integer"], minimum=1, description="override the work, in steps"),
        "job_spec": Param(
            None, type=["null", "object"], description="a whole JobSpec to run instead of a registered job"
        ),
        "backend": Param("local", type="string", enum=["local", "kubernetes"], description="where to train"),
    },
    tags=["carbonflow", "on-demand"],
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=list(JOBS_BY_NAME.values()), only_param="job")
    job_json = "{{ ti.xcom_pull(task_ids='validate', key='requested') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job_json, backend="{{ params.backend }}", pool=GPU_POOL)
    train = CarbonAwareTrainingOperator(
        task_id="train", job=job_json, profile_task_id="profile", backend="{{ params.backend }}", pool=GPU_POOL
    )
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()  # runs whatever training did; a failure still fails
