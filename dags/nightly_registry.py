"""nightly_registry: the nightly batch generated from the job registry — adding a model is adding a file.

Every JobSpec file in the registry folder (``$CARBONFLOW_JOBS_DIR``, else ``dags/jobs/``) joins the batch;
the files are validated when this DAG is parsed (no network, no ML framework), so a bad file shows as an
import error naming the file and field. Profiles are one mapped task per job and training one mapped task
per GPU group of the night plan, each labelled with its job names in the UI. Pair profiling keeps to a
budget: the pair predictor picks the most promising unknown pairs; the early-observation guard settles
the rest.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    NightPlanOperator,
    PairProfileOperator,
)
from carbonflow.operators.night import night_gpu_groups
from carbonflow.registry import load_registry, registry_dir
from carbonflow.settings import max_pairs_per_night, night_gpus

GPU_POOL = "carbonflow_gpu"
GPUS = night_gpus(default=2)
MAX_PAIRS = max_pairs_per_night(default=5)

JOBS = {name: spec.model_dump(mode="json", exclude_none=True)
        for name, spec in load_registry(registry_dir(Path(__file__).parent)).items()}  # fmt: skip

with DAG(
    dag_id="nightly_registry",
    description="Nightly carbon-aware retraining of every job in the registry folder",
    schedule="0 19 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["carbonflow", "nightly", "registry"],
) as dag:
    if JOBS:
        profile = EnergyProfileOperator.partial(
            task_id="profile", pool=GPU_POOL, map_index_template="{{ task.job['name'] }}"
        ).expand(job=list(JOBS.values()))
        pairs = PairProfileOperator(task_id="profile_pairs", jobs=JOBS, profile_task_ids="profile", pool=GPU_POOL,
                                    max_pairs=MAX_PAIRS)  # fmt: skip
        night = NightPlanOperator(task_id="plan_night", jobs=JOBS, profile_task_ids="profile",
                                  pair_profile_task_id="profile_pairs", gpus=GPUS)  # fmt: skip
        train = CarbonAwareTrainingOperator.partial(
            task_id="train", night_plan_task_id="plan_night", pool=GPU_POOL,
            map_index_template="{{ task.gpu_group | join('+') }}",
        ).expand(gpu_group=night_gpu_groups(night.output))  # fmt: skip
        profile >> pairs >> night
        train >> DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"]).as_teardown()
