"""``carbonflow dags test`` says plainly what happened (findings from a new user trying the CLI from the docs):

- a failed DAG run was told three muddled times ("m_typo unknown in 31 s (run None)", "no training run was
  logged", "… (exit 1, state unknown): airflow.sdk.exceptions.AirflowFailException: …"): now once, which task
  failed with its message, and the log to read;
- a successful one now shows the plan's reason, predicted against measured energy, the saving, whether it was
  observe-only, and each training's own log (the task log repeats the wrapper's "carbonflow run:" line);
- every line fits 100 columns when piped, with units in the headers and start times without microseconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from carbonflow.dag_test import parse_dags_test_log, print_runs
from carbonflow.tracking import schema as s

CARBONFLOW = str(Path(sys.executable).with_name("carbonflow"))

LOG = """\
$ /venv/bin/airflow dags test m_typo --dagfile-path /p/m_typo.py
2026-11-24T23:09:28.233252Z [info     ] Filling up the DagBag from /p [airflow.dag_processing.dagbag.BundleDagBag]
2026-11-24T23:09:28.179652Z [error    ] Failed to import: /p/mk.py [airflow.dag_processing.importers.python_importer]
Traceback (most recent call last):
  File "/p/mk.py", line 2, in <module>
    name, patch = sys.argv[1], json.loads(sys.argv[2])
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
2026-11-24T23:09:28.369629Z [info     ] [DAG TEST] starting task_id=validate map_index=-1 [airflow.sdk.definitions.dag]
2026-11-24T23:09:28.370323Z [info     ] [DAG TEST] running task <TaskInstance: m_typo.validate manual__2026 [S]>
2026-11-24T23:09:32.890940Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/airflow/sdk/execution_time/task_runner.py", line 1579, in _run
    result = _execute_task(context=context, ti=ti, log=log)
  File "/work/main/carbonflow/operators/params.py", line 165, in execute
    raise AirflowFailException(f"invalid request: {err}") from None
airflow.sdk.exceptions.AirflowFailException: invalid request: invalid job: sample_per_epoch: unknown field
2026-11-24T23:09:32.904941Z [info     ] ::group::Post Execute          [task] loc=task_runner.py:1640
2026-11-24T23:09:34.989324Z [info     ] [DAG TEST] starting task_id=deliver_runs map_index=-1 [airflow.sdk]
2026-11-24T23:09:35.058965Z [info     ] DagRun Finished: dag_id=m_typo, logical_date=2026-11-24 23:09:27+00:00, \
run_id=manual__2026-11-24T23:09:28.225201+00:00, run_start_date=2026-11-24 23:09:27+00:00, run_duration=7.98, \
state=failed, run_type=manual
DagRun failed
"""


def test_the_log_tells_which_task_failed_with_its_plain_message() -> None:
    outcome = parse_dags_test_log(LOG, "m_typo")
    assert outcome.failed_tasks == [("validate", "invalid request: invalid job: sample_per_epoch: unknown field")]
    assert outcome.run_id == "manual__2026-11-24T23:09:28.225201+00:00" and outcome.state == "failed"
    assert outcome.import_errors == ["/p/mk.py"]  # another file of the DAGs folder, not this DAG's failure


def test_a_chained_multi_line_error_keeps_its_last_exception_and_its_class_name() -> None:
    log = """\
2026-11-24T23:09:28.369629Z [info     ] [DAG TEST] starting task_id=profile map_index=-1 [airflow.sdk]
2026-11-24T23:09:32.890940Z [error    ] Task failed with exception     [task]
Traceback (most recent call last):
  File "/x.py", line 1, in f
ValueError: inner

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/y.py", line 2, in g
carbonflow.profiling.profiler.ProfilingError: digits-mlp crashed before reporting; its log's last lines:
  data not found: /mnt/datasets/mnist
2026-11-24T23:09:32.904941Z [info     ] ::group::Post Execute          [task]
"""
    [(task, message)] = parse_dags_test_log(log, "d").failed_tasks
    assert task == "profile"
    assert message.splitlines() == ["ProfilingError: digits-mlp crashed before reporting; its log's last lines:",
                                    "  data not found: /mnt/datasets/mnist"]  # fmt: skip


def _run(job: str, *, observe_only: bool, saving_fraction: float, saving_g: float) -> dict:
    metrics = {s.M_ENERGY_TOTAL_J: 1234.5, s.M_PREDICTED_ENERGY_TOTAL_J: 1100.0, s.M_EMISSIONS_G: 0.0645,
               s.M_SAVING_FRACTION: saving_fraction, s.M_SAVING_G: saving_g, s.M_TEST_ACCURACY: 0.944}  # fmt: skip
    params = {s.P_CONTAINERS: "2", s.P_POWER_LIMIT_W: "None", s.P_PLANNED_START: "2023-03-15T02:00:00.000215+00:00",
              s.P_PLAN_REASON: "default power limit, 2 containers, start 02:00 UTC: saving 49.9 % carbon vs start "
              "now at default power limit (objective carbon); 40 % faster, finishes 02:00 before 06:01"}  # fmt: skip
    tags = {s.T_ENERGY_LABELS: "estimated", s.T_OBSERVE_ONLY: "true" if observe_only else "false"}
    if observe_only:
        params[s.P_PLAN_REASON] = ("observe-only: trained at once, alone, at the GPU's current limit; carbonflow "
                                   "would have run c2-pldefault from 2023-03-15 02:00 UTC: 0.00046 g")  # fmt: skip
    return {"run_id": "r-" + job, "job": job, "params": params, "metrics": metrics, "tags": tags}


def test_the_runs_table_has_units_in_headers_the_saving_the_reason_and_observe_only() -> None:
    console = Console(record=True, width=100)
    runs = [_run("a-job", observe_only=False, saving_fraction=0.499, saving_g=0.03),
            _run("shadow", observe_only=True, saving_fraction=-4.3e-16, saving_g=-8.67e-19)]  # fmt: skip
    print_runs(console, runs, replayed=True)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "energy (kJ)" in text and "predicted" in text and "measured" in text and "CO2e" in text
    assert "1.1" in text and "1.23" in text  # predicted and measured, scaled once (kJ), numbers in the cells
    assert "(%)" in text and "49.9" in text and "-0.0" not in text and "e-1" not in text
    assert "03-15 02:00" in text and ".000215" not in text  # start without microseconds
    assert "a-job: planned — default power limit, 2 containers, start 02:00 UTC" in text
    assert "shadow: observe-only" in text


def test_the_runs_table_shows_the_batch_size_a_learning_job_trained_at() -> None:
    """From a user trial: a job exploring batch sizes had its runs' table say nothing of which one each ran."""
    learning, plain = _run("explores", observe_only=False, saving_fraction=0.1, saving_g=0.01), _run(
        "plain", observe_only=False, saving_fraction=0.1, saving_g=0.01)  # fmt: skip
    learning["params"][s.P_BATCH_SIZE], plain["params"][s.P_BATCH_SIZE] = "128", "default (64)"
    console = Console(record=True, width=120)
    print_runs(console, [learning, plain], replayed=True)
    text = console.export_text()
    assert "batch" in text and "128" in text and "64 (default)" in text
    console = Console(record=True, width=120)
    print_runs(console, [plain], replayed=True)  # nothing chosen: no column to read
    assert "batch" not in console.export_text()


def test_the_runs_table_totals_the_dag_runs_energy_and_co2e_when_it_trained_more_than_once() -> None:
    """From a user trial: a night with a stopped attempt and its rerun showed two rows and no total."""
    attempt, rerun = (_run("explores", observe_only=False, saving_fraction=0.1, saving_g=0.01) for _ in range(2))
    rerun["metrics"][s.M_ENERGY_TOTAL_J], rerun["metrics"][s.M_EMISSIONS_G] = 2765.5, 0.1355
    console = Console(record=True, width=120)
    print_runs(console, [attempt, rerun], replayed=True)
    [total] = [line for line in console.export_text().splitlines() if "total (2 runs)" in line]
    assert "4.00" in total and " 200 " in total  # 1234.5 + 2765.5 J in kJ; 0.0645 + 0.1355 g in mg
    console = Console(record=True, width=120)
    print_runs(console, [attempt], replayed=True)
    assert "total" not in console.export_text()  # one run: its row is the total


@pytest.mark.parametrize(
    ("conf", "message"),
    [("{epochs: 2}", "is not JSON"), ("[1, 2]", "is a JSON list; give an object"), ("x" * 70_000, "too long")],
)
def test_a_bad_conf_is_refused_before_airflow_starts(tmp_path: Path, conf: str, message: str) -> None:
    folder = _project(tmp_path / "p", "tiny_dag")
    done = subprocess.run([CARBONFLOW, "dags", "test", "tiny_dag.py", "--conf", conf], cwd=folder,
                          env=_clean_env(folder), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and message in " ".join((done.stdout + done.stderr).split()), done.stderr
    assert not (folder / ".carbonflow" / "dags-test.log").exists()  # nothing started


@pytest.mark.slow
def test_a_conf_reaches_the_dag_run_and_its_validate_task_checks_it_as_a_triggers(tmp_path: Path) -> None:
    """--conf is what a UI trigger sends: a key only the job's author may set fails the validate task, naming it."""
    folder = _project(tmp_path / "p", "tiny_dag")
    done = subprocess.run([CARBONFLOW, "dags", "test", "tiny_dag.py", "--conf", '{"command": ["sh", "-c", "id"]}'],
                          cwd=folder, env=_clean_env(folder), capture_output=True, text=True, timeout=900)  # fmt: skip
    flat = " ".join(done.stdout.split())
    assert done.returncode == 1 and "task validate failed" in flat and "command" in flat, done.stdout[-3000:]
    assert not list((folder / ".carbonflow").glob("runs/*/tiny/train"))  # refused before any work started


def _clean_env(home: Path) -> dict[str, str]:
    """The user's shell: none of the test session's Airflow or carbonflow settings; output piped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CARBONFLOW", "MLFLOW", "COLUMNS"))}
    env["HOME"] = str(home)
    return env


def _dags_test(folder: Path, dag_file: str) -> subprocess.CompletedProcess:
    return subprocess.run([CARBONFLOW, "dags", "test", dag_file], cwd=folder, env=_clean_env(folder),
                          capture_output=True, text=True, timeout=900)  # fmt: skip


DAG = """from airflow.sdk import DAG
from carbonflow.operators import (CarbonAwareTrainingOperator, DeliverHeldRunsOperator, EnergyProfileOperator,
                                  ValidateJobsOperator)
JOB = {job!r}
with DAG("{dag_id}", schedule="0 19 * * *") as dag:
    validate = ValidateJobsOperator(task_id="validate", jobs=[JOB])
    job = "{{{{ ti.xcom_pull(task_ids='validate', key='tiny') }}}}"
    profile = EnergyProfileOperator(task_id="profile", job=job)
    train = CarbonAwareTrainingOperator(task_id="train", job=job, profile_task_id="profile",
                                        deadline_time_utc="07:00", backend="local")
    deliver = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    validate >> profile >> train >> deliver.as_teardown()
"""
SCRIPT = """import os, time
from carbonflow import training
step = 0
for step in range(1, int(os.environ["CARBONFLOW_STEPS"]) + 1):
    time.sleep(0.02)
    training.report(step, step * 8, loss=1.0 / step)
    if training.should_stop():
        break
training.report(step, step * 8, test_accuracy=0.5)
"""
JOB = {"name": "tiny", "command": ["python", "train.py"], "working_dir": "project", "steps": 60, "region": "GB",
       "objective": "carbon", "profile_steps": 10, "profile_warmup_steps": 2, "profile_min_window_s": 0.5}  # fmt: skip


def _project(folder: Path, dag_id: str, **job: object) -> Path:
    (folder / "project").mkdir(parents=True)
    (folder / "project" / "train.py").write_text(SCRIPT)
    (folder / f"{dag_id}.py").write_text(DAG.format(job={**JOB, **job}, dag_id=dag_id))
    return folder


def _assert_fits_100_columns(out: str) -> None:
    """Every line fits 100 columns, except a path printed whole on its own line (carbonflow never cuts a path:
    the pytest tmp path alone can pass 100 characters; CI found this)."""
    too_wide = [line for line in out.splitlines() if len(line) > 100]
    lone_paths = [line for line in too_wide if " " not in line.strip() and ("/" in line)]
    assert too_wide == lone_paths, out


@pytest.mark.slow
def test_a_failed_task_is_told_once_plainly_with_the_log_to_read(tmp_path: Path) -> None:
    folder = _project(tmp_path / "p", "typo_dag", sample_per_epoch=100)
    done = _dags_test(folder, "typo_dag.py")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    flat = " ".join(out.split())
    assert "typo_dag did not succeed" in flat and "task validate failed: invalid request: invalid job:" in flat
    assert "sample_per_epoch" in flat
    for muddle in ("AirflowFailException", "airflow.sdk", "run None", "unknown in", "state unknown",
                   "no training run was logged"):  # fmt: skip
        assert muddle not in out, out
    assert flat.count("failed:") == 1
    assert str(folder / ".carbonflow" / "dags-test.log") in flat.replace(" ", "") or "dags-test.log" in out
    _assert_fits_100_columns(out)


@pytest.mark.slow
def test_a_successful_run_shows_reason_energy_saving_and_each_trainings_log(tmp_path: Path) -> None:
    folder = _project(tmp_path / "p", "tiny_dag")
    done = _dags_test(folder, "tiny_dag.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    _assert_fits_100_columns(out)
    assert "tiny_dag success" in out
    assert re.search(r"energy \((J|kJ|MJ)\)", out) and "predicted" in out and "measured" in out
    assert "saving" in out and "(%)" in out and "tiny: planned — " in out
    rows = [line for line in out.splitlines() if line.startswith("│ tiny")]
    assert rows and not re.search(r"\d{2}:\d{2}:\d{2}", rows[0]), rows  # start without seconds or microseconds
    print(out)
    joined = "".join(line.strip() for line in out.splitlines())
    [log] = list((folder / ".carbonflow" / "runs").glob("*/tiny/train/training.log"))
    assert "training log:" in out and str(log) in joined
    task_log = (folder / ".carbonflow" / "dags-test.log").read_text()
    assert "carbonflow run: " in task_log and f"training log: {log}" in task_log  # the task log says both


def test_the_summary_says_whether_the_model_was_registered_and_what_a_run_must_not_hide() -> None:
    """Second user trial: the summary had no model line, and the warning that the ranks repeated the data set
    was only in the task log and MLflow's note."""
    from carbonflow.session.run import MORE_WORK

    run = _run("ddp", observe_only=False, saving_fraction=0.1, saving_g=0.01)
    run["tags"][s.T_MODEL_REGISTRY_NOTE] = "registered: test_accuracy 0.9650 (>= min_accuracy 0.9)"
    run["tags"][s.T_NOTE] = f"Plan: …\n{MORE_WORK}: 280 steps where … take 134 (2.1×) with 2 containers\nother note"
    console = Console(record=True, width=100)
    print_runs(console, [run], replayed=True)
    text = " ".join(console.export_text().split())
    assert "model: registered: test_accuracy 0.9650" in text
    assert f"warning: {MORE_WORK}: 280 steps" in text and "other note" not in text


def test_a_long_path_is_printed_whole_on_its_own_line() -> None:
    """Second user trial: the training log's path was wrapped mid-name ('training.l' / 'og') and could not be copied."""
    from carbonflow.terminal import print_path

    path = "/tmp/trial2/.carbonflow/runs/manual__2026-11-25T01_02_03.456789_00_00/bc-logreg/train/training.log"
    console = Console(record=True, width=60)
    print_path(console, "training log:", path, indent="  ")
    lines = console.export_text().splitlines()
    assert lines == ["  training log:", f"    {path}"]
