"""A user's own command gets its work from carbonflow, runs where the job says, and bad jobs are refused early.

Findings (issue 13): the README's example validated, profiled, then failed in the train task on
``profile.samples_per_epoch=None``; the job's ``epochs`` never reached the command (the script ran its own
20 while the job said 40); ``["python", "train.py"]`` ran whatever ``train.py`` was in the worker's cwd.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.commands import resolved_command, samples_per_epoch, training_command
from carbonflow.execution.local import LocalBackend

# A user's script: it reads its work from carbonflow's environment and reports progress by JSON lines.
SCRIPT = r"""
import json, os, sys
work = {k: v for k, v in os.environ.items() if k.startswith("CARBONFLOW_") and k in (
    "CARBONFLOW_JOB", "CARBONFLOW_EPOCHS", "CARBONFLOW_STEPS", "CARBONFLOW_BATCH_SIZE", "CARBONFLOW_MODE",
    "CARBONFLOW_CONTAINERS", "CARBONFLOW_OUTPUT_DIR")}
work["argv"] = sys.argv[1:]
work["cwd"] = os.getcwd()
work["python"] = sys.executable
open(os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "work.json"), "w").write(json.dumps(work))
with open(os.environ["CARBONFLOW_PROGRESS_FILE"], "a") as f:
    f.write(json.dumps({"step": 1, "samples": 32, "metrics": {"test_accuracy": 0.9}}) + "\n")
"""


def _plan(spec: JobSpec, batch_size: int | None = None) -> Plan:
    return Plan(
        job=spec.name, config=Config(containers=1, batch_size=batch_size), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
        forecast_provider="test", reason="test",
    )  # fmt: skip


def test_command_job_receives_the_jobs_epochs_and_batch_size(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = JobSpec(
        name="my-mlp", command=["python", "train.py", "--epochs", "{epochs}", "--bs", "{batch_size}"], epochs=40,
        samples_per_epoch=1000, batch_size=64, region="GB", device_kind="cpu", working_dir=str(tmp_path),
    )  # fmt: skip
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec, batch_size=128), trace=False)
    assert run.exit_code == 0
    work = json.loads((Path(run.output_dir) / "work.json").read_text())
    assert work["CARBONFLOW_EPOCHS"] == "40" and work["argv"] == ["--epochs", "40", "--bs", "128"]
    assert work["CARBONFLOW_BATCH_SIZE"] == "128" and work["CARBONFLOW_MODE"] == "train"
    assert work["CARBONFLOW_JOB"] == "my-mlp" and work["CARBONFLOW_CONTAINERS"] == "1"
    assert work["cwd"] == str(tmp_path)  # the job's working_dir, not the worker's cwd
    assert Path(work["python"]).resolve() == Path(sys.executable).resolve()  # 'python' = the worker's interpreter
    log = (tmp_path / "runs" / "train" / "training.log").read_text()
    assert "train.py" in log and str(tmp_path) in log and sys.executable in log  # the log says what ran where


def test_epochs_without_samples_per_epoch_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="samples_per_epoch=None: job 'my-mlp' gives its work in epochs=10"):
        JobSpec(name="my-mlp", command=["python", "train.py"], epochs=10, region="GB")


def test_a_command_job_with_samples_per_epoch_profiles_and_plans_in_epochs():
    spec = JobSpec(name="my-mlp", command=["python", "t.py"], epochs=10, samples_per_epoch=60_000, region="GB")
    assert samples_per_epoch(spec) == 60_000


def test_unknown_command_placeholder_is_refused_with_the_allowed_ones():
    with pytest.raises(ValidationError, match=r"placeholder \{epoch\} in '--epochs=\{epoch\}' is not known"):
        JobSpec(name="j", command=["python", "t.py", "--epochs={epoch}"], steps=5, region="GB")


def test_empty_command_is_refused():
    with pytest.raises(ValidationError, match=r"command=\[\] is not allowed"):
        JobSpec(name="j", command=[], steps=5, region="GB")


def test_placeholders_and_python_are_resolved_before_launch():
    spec = JobSpec(name="j", command=["python3", "t.py", "{steps}", "{python}"], steps=7, region="GB")
    assert resolved_command(spec, Config(), python="/opt/py") == ["/opt/py", "t.py", "7", "/opt/py"]
    two = training_command(spec, Config(containers=2), python="/opt/py")
    assert two[-4:] == ["/opt/py", "t.py", "7", "/opt/py"] and "torch.distributed.run" in two


def test_a_missing_working_dir_fails_before_training(tmp_path):
    spec = JobSpec(name="j", command=["python", "t.py"], steps=1, region="GB", device_kind="cpu",
                   working_dir=str(tmp_path / "nope"))  # fmt: skip
    run_dir = tmp_path / "runs"
    with pytest.raises(ValueError, match=r"working_dir=.*nope.* is not a directory on this worker"):
        LocalBackend(run_dir).execute(spec, _plan(spec), trace=False)
    assert not run_dir.exists()  # nothing started
