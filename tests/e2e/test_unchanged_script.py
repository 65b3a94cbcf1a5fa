"""An unchanged training script runs nightly from a job file alone (issue 25, "Progress from the script's own
output"): a plain PyTorch script that only prints ``epoch N/M loss L val_acc A`` lines, with no carbonflow
import, goes through ``carbonflow dags test`` for two nights from a DAG folder outside the repository. Its
``progress_pattern`` turns the printed lines into progress reports: it is profiled, planned, trained and
logged to MLflow with its energy, emissions, the plan's reason and ``test_accuracy`` = the last ``val_acc``
it printed. No GPU here: energy is the CPU's, estimated.

Finding: the user had to write a 20-line wrapper that turned these lines into progress-file JSON.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CARBONFLOW = str(Path(sys.executable).with_name("carbonflow"))

SCRIPT = '''"""A plain PyTorch MLP on scikit-learn's digits: it knows nothing of carbonflow."""
import argparse

import torch
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
order = torch.randperm(len(x))
train, val = order[:1437], order[1437:]
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(1, args.epochs + 1):
    for i in range(0, len(train), args.batch_size):
        batch = train[i : i + args.batch_size]
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        val_acc = (model(x[val]).argmax(1) == y[val]).float().mean().item()
    print(f"epoch {epoch}/{args.epochs} loss {loss.item():.4f} val_acc {val_acc:.4f}")
'''

DAG = """from airflow.sdk import DAG

from carbonflow.operators import (
    CarbonAwareTrainingOperator,
    DeliverHeldRunsOperator,
    EnergyProfileOperator,
    ValidateJobsOperator,
)

JOB = {
    "name": "unchanged-mlp",
    "command": ["python", "train.py", "--epochs", "{epochs}", "--batch-size", "{batch_size}"],
    "working_dir": "project",
    "progress_pattern": r"epoch (?P<epoch>\\d+)/(?P<epochs>\\d+) loss (?P<loss>[\\d.]+) val_acc (?P<accuracy>[\\d.]+)",
    "epochs": 40,
    "samples_per_epoch": 1437,
    "batch_size": 64,
    "profile_warmup_steps": 1,
    "profile_steps": 3,
    "profile_min_window_s": 0.5,
    "region": "GB",
}

with DAG("unchanged_nightly", schedule="0 19 * * *") as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=[JOB])
    job = "{{ ti.xcom_pull(task_ids='validate', key='unchanged-mlp') }}"
    profile = EnergyProfileOperator(task_id="profile", job=job)
    train = CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile", deadline_time_utc="07:00")
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()
"""
LINE = re.compile(r"^epoch (\d+)/40 loss [\d.]+ val_acc ([\d.]+)$", re.MULTILINE)


def _clean_env(home: Path) -> dict[str, str]:
    """The user's shell: none of the test session's Airflow or carbonflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CARBONFLOW", "MLFLOW"))}
    env["HOME"] = str(home)
    env["COLUMNS"] = "160"
    return env


def _night(folder: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([CARBONFLOW, "dags", "test", "my_dag.py"], cwd=folder, env=_clean_env(folder),
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "unchanged_nightly success" in done.stdout
    return done


def _last_printed_val_acc(log: Path) -> float:
    found = LINE.findall(log.read_text())
    assert [int(epoch) for epoch, _ in found] == list(range(1, 41)), log  # trained in full, every line echoed
    return float(found[-1][1])


def test_an_unchanged_script_that_only_prints_epochs_runs_two_nights_from_a_job_file(tmp_path: Path) -> None:
    folder = tmp_path / "my-project"
    (folder / "project").mkdir(parents=True)
    (folder / "project" / "train.py").write_text(SCRIPT)
    (folder / "my_dag.py").write_text(DAG)
    assert "carbonflow" not in SCRIPT.replace("knows nothing of carbonflow", "")
    for _night_number in (1, 2):
        _night(folder)

    from mlflow import MlflowClient

    from carbonflow.dag_test import training_log_of
    from carbonflow.tracking import schema as s

    uri = f"sqlite:///{folder / '.carbonflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(s.experiment_name("unchanged-mlp"))
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")
    assert len(runs) == 2  # one per night
    for run in runs:
        metrics, params = run.data.metrics, run.data.params
        assert metrics[s.M_ENERGY_TOTAL_J] > 0 and metrics[s.M_EMISSIONS_G] > 0
        assert params[s.P_PLAN_REASON].strip()
        log = training_log_of(uri, run.info.run_id)
        assert log is not None and log.is_file()
        assert metrics[s.M_TEST_ACCURACY] == pytest.approx(_last_printed_val_acc(log), abs=1e-9)
        assert metrics[s.M_TEST_ACCURACY] > 0.8
