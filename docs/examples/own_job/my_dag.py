"""A nightly DAG for one's own training script (docs: "Bring your own job"); try it with
``carbonflow dags test my_dag.py``."""

from airflow.sdk import DAG

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    ValidateJobsOperator,
)

JOB = {
    "name": "my-mlp",
    "command": ["python", "train.py", "--epochs", "{epochs}", "--batch-size", "{batch_size}"],
    "working_dir": "project",  # relative to this file's folder
    "epochs": 5,
    "samples_per_epoch": 512,
    "batch_size": 64,
    "region": "GB",
    "objective": "carbon",
    "max_slowdown": 0.1,
    "min_accuracy": 0.6,
}

with DAG("my_nightly", schedule="0 19 * * *") as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=[JOB])
    job = "{{ ti.xcom_pull(task_ids='validate', key='my-mlp') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job)
    train = CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile", deadline_time_utc="07:00")
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()  # runs even when training failed; the run still fails
