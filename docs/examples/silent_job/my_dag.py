"""A DAG whose training never reports progress: ``carbonflow dags test`` shows the profiling error after one
attempt, with what to add and where the training's log is."""

from airflow.sdk import DAG

from carbonflow.operators import CarbonAwareTrainingOperator, EnergyProfileOperator, ValidateJobsOperator

JOB = {
    "name": "silent-job",
    "command": ["python", "train.py"],
    "working_dir": "project",
    "steps": 200,
    "max_containers": 2,
    "region": "GB",
    "profile_report_timeout_s": 5,
}

with DAG("silent_nightly", schedule=None) as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=[JOB])
    job = "{{ ti.xcom_pull(task_ids='validate', key='silent-job') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job)
    train = CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile")
    validate >> profile >> train
