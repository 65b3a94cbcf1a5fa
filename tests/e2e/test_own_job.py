"""A user's own job works the first time, from the docs alone: the example in docs/examples/own_job (a DAG
file and a PyTorch script that is not carbonflow's) is copied to a folder outside the repository and run
with ``carbonflow dags test``, the documented dev loop, on embedded Airflow + MLflow with replayed carbon
data. No GPU here: energy is the CPU's, **estimated**; the output says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "own_job"
CARBONFLOW = str(Path(sys.executable).with_name("carbonflow"))


def _clean_env(home: Path) -> dict[str, str]:
    """The user's shell: none of the test session's Airflow or carbonflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CARBONFLOW", "MLFLOW"))}
    env["HOME"] = str(home)
    env["COLUMNS"] = "160"
    return env


def _dags_test(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CARBONFLOW, "dags", "test", *args], cwd=folder, env=_clean_env(folder),
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def test_the_docs_own_job_example_runs_with_the_dev_loop_from_outside_the_repo(tmp_path: Path) -> None:
    folder = tmp_path / "my-project"
    shutil.copytree(EXAMPLE, folder)
    done = _dags_test(folder, "my_dag.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "my_nightly success" in out and "my-mlp" in out and "estimated" in out
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / '.carbonflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(s.experiment_name("my-mlp"))
    [run] = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")
    assert run.data.params[s.P_EPOCHS] == "5"
    assert run.data.metrics[s.M_TEST_ACCURACY] >= 0.6
    assert run.data.tags[s.T_MODEL_REGISTERED] == "true"  # it saved model.pt and met min_accuracy


def test_a_dag_file_that_does_not_import_is_shown_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("from airflow.sdk import DAG\nimport not_installed_anywhere\n")
    done = _dags_test(tmp_path, "broken.py")
    assert done.returncode == 1
    assert "does not import" in done.stdout and "not_installed_anywhere" in done.stdout


def test_a_failing_training_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    shutil.copytree(EXAMPLE, folder)
    (folder / "project" / "train.py").write_text("raise SystemExit('data not found: /mnt/datasets/mnist')\n")
    done = _dags_test(folder, "my_dag.py")
    assert done.returncode != 0
    assert "did not succeed" in done.stdout and "ProfilingError" in done.stdout, done.stdout[-2000:]


def test_a_job_that_never_reports_fails_after_one_profiling_attempt_saying_what_to_add(tmp_path: Path) -> None:
    folder = tmp_path / "silent"
    shutil.copytree(REPO / "docs" / "examples" / "silent_job", folder)
    done = _dags_test(folder, "my_dag.py")
    assert done.returncode != 0
    out = " ".join(done.stdout.split())  # the console wraps long lines
    assert "ProfilingError" in out and "carbonflow.training.report(step, samples)" in out, out[-2000:]
    attempts = list((folder / ".carbonflow" / "runs").glob("*/silent-job/profile-c*"))
    assert [p.name for p in attempts] == ["profile-c1"]  # max_containers=2, yet one attempt, not one per count
    assert (attempts[0] / "training.log").is_file()
