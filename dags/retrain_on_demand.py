"""retrain_on_demand: retrain one registered job now, from Airflow's "Trigger DAG" form.

A trigger chooses, the author defines: the form (or a REST/CLI conf) picks a job declared here or in the job
registry by name and may set only bounded fields — epochs or steps and batch size within the limits the job's
author set (``trigger_limits``; default: at most the job's own work and its own batch sizes), finish-by within
a week, objective, observe-only, region, allowed slowdown and a power limit inside the device's range. What
runs (command, working directory, environment, image, resources) and where (the backend, below) come only
from files the author controls; the ``validate`` task refuses any other conf key by name before any work.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from carbonflow.domain import MAX_POWER_LIMIT_W, OBJECTIVE_PARAM_PATTERN, parse_job
from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    ValidateJobsOperator,
)
from carbonflow.registry import load_registry, registry_dir
from carbonflow.validation import trigger_batch_sizes, trigger_work_limit
from carbonflow.workloads.catalog import JOBS_BY_NAME

GPU_POOL = "carbonflow_gpu"
BACKEND = "local"
"""Where the job trains: the DAG author's choice ("local" or "kubernetes"), never a trigger's."""


def _registered_jobs() -> dict[str, dict]:
    """The jobs a trigger may choose: this DAG's examples and every job of the registry folder (when it exists)."""
    folder = registry_dir(Path(__file__).parent)
    registered = load_registry(folder) if folder.is_dir() else {}
    clash = sorted(set(registered) & set(JOBS_BY_NAME))
    if clash:
        raise ValueError(f"job name(s) {clash} are both a registry file's and this DAG's; rename one")
    return {**JOBS_BY_NAME, **{n: s.model_dump(mode="json", exclude_none=True) for n, s in registered.items()}}


JOBS = _registered_jobs()
SPECS = [parse_job(job) for job in JOBS.values()]
MAX_TRIGGER_EPOCHS = max((trigger_work_limit(s, "epochs")[0] or 0 for s in SPECS), default=0)
MAX_TRIGGER_STEPS = max((trigger_work_limit(s, "steps")[0] or 0 for s in SPECS), default=0)
TRIGGER_BATCH_SIZES = sorted({b for s in SPECS for b in trigger_batch_sizes(s)[0]})


def _work_params() -> dict[str, Param]:
    """epochs, steps and batch size, bounded by the largest limit any job's author allows (the validate task then
    checks the chosen job's own limit)."""
    params = {
        "batch_size": Param(None, type=["null", "integer"], enum=[None, *TRIGGER_BATCH_SIZES],
                            description="batch size; empty: the job's own (only sizes its author allows)"),
    }  # fmt: skip
    for field, top in (("epochs", MAX_TRIGGER_EPOCHS), ("steps", MAX_TRIGGER_STEPS)):
        if top:
            params[field] = Param(None, type=["null", "integer"], minimum=1, maximum=top,
                                  description=f"work in {field}; empty: the job's own")  # fmt: skip
    return params


with DAG(
    dag_id="retrain_on_demand",
    description="Retrain one registered job carbon-aware now, with a validated request form",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "job": Param("digits-cnn", type="string", enum=sorted(JOBS), description="which registered job"),
        "region": Param(
            None,
            type=["null", "string"],
            minLength=2,
            maxLength=64,
            description="grid zone (GB, DE, US-CAL-CISO) or cloud region (aws:eu-west-2); empty: the job's own",
        ),
        "finish_by": Param(
            None,
            type=["null", "string"],
            format="date-time",
            description="UTC deadline, at most 7 days ahead; empty: the job's own, else next 07:00 UTC",
        ),
        "objective": Param(
            None,
            type=["null", "string"],
            pattern=OBJECTIVE_PARAM_PATTERN,
            description="carbon, energy, time, edp, eds:<k>, zeus:<eta>; empty: the job's own",
        ),
        "max_slowdown": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=2,
            description="allowed extra run time (fraction); empty: the job's own",
        ),
        "power_limit_w": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            maximum=MAX_POWER_LIMIT_W,
            description="fix the GPU power limit (inside the device's range); empty: the planner chooses",
        ),
        "observe_only": Param(
            None, type=["null", "boolean"], description="shadow mode: plan and log, train at once; empty: the job's own"
        ),
        **_work_params(),
    },
    tags=["carbonflow", "on-demand"],
) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=list(JOBS.values()), only_param="job")
    job_json = "{{ ti.xcom_pull(task_ids='validate', key='requested') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job_json, backend=BACKEND, pool=GPU_POOL)
    train = CarbonAwareTrainingOperator(
        task_id="train", job=job_json, profile_task_id="profile", backend=BACKEND, pool=GPU_POOL
    )
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()  # runs whatever training did; a failure still fails
