"""Issue 25 findings, through the session the training operator runs: a script that crashed mid-training gave a
raw Python dict of logging details and no exception text, and its failed MLflow run had no error tag yet logged
a "saving". A real script crashes under the local backend; the task error and the MLflow run are read back."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.session import RunSession, SessionClock
from carbonflow.session.source import CarbonSource

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped replay
CRASHING = r"""
import json, os, time
with open(os.environ["CARBONFLOW_PROGRESS_FILE"], "a") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "samples": step * 32, "t_s": time.monotonic()}) + "\n")
def next_batch():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
next_batch()
"""


def _profile(job: str) -> Profile:
    points = [ProfilePoint(config=Config(containers=1), throughput_samples_per_s=100, power_per_device_w={"cpu": 20},
                           energy_per_sample_j=0.2, duration_s=10, samples=1000, label="estimated")]  # fmt: skip
    return Profile(job=job, device_model="cpu", device_kind="cpu", label="estimated", samples_per_epoch=320,
                   points=points)  # fmt: skip


def test_a_crashed_training_fails_its_task_with_the_exception_and_exit_status_and_tags_its_mlflow_run(
    tmp_path: Path,
) -> None:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    script = tmp_path / "train.py"
    script.write_text(CRASHING)
    spec = JobSpec(name="crashy", command=[sys.executable, str(script)], steps=10, batch_size=32, region="GB",
                   device_kind="cpu", finish_by=T0 + timedelta(hours=10))  # fmt: skip
    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path / "work")
    clock = SessionClock.replaying(T0)
    state = session.plan_alone(spec, _profile("crashy"), clock.now())
    state.members[0].plan.start = clock.now()  # train at once: the plan's window is not what is tested here
    assert state.members[0].plan.baseline is not None  # so a saving would be accounted, as for any run
    outcome = session.launch(state, clock)
    [failure] = outcome.failures
    assert failure.startswith("training of crashy failed with exit status 1; its last output lines:"), failure
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in failure
    assert "tracking_uri" not in failure and "idempotency_key" not in failure and "{" not in failure
    [job] = outcome.jobs
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(job.tracking["run_id"])
    assert run.info.status == "FAILED"
    assert "exit status 1" in run.data.tags[s.T_ERROR] and "illegal memory access" in run.data.tags[s.T_ERROR]
    assert s.M_SAVING_FRACTION not in run.data.metrics and s.M_SAVING_G not in run.data.metrics
    assert f"its MLflow run {job.tracking['run_id']}" in failure
