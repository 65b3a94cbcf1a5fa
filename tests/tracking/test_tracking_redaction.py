"""Finding (issue #21): a password in the tracking URI was shown wherever the URI was — the task log line of a
run, ``carbonflow spool status``, the report. Every place shows it through ``uri.redacted_uri``."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from typer.testing import CliRunner

from carbonflow.cli import app
from carbonflow.tracking.records import RunRecord, TrackingOutcome
from carbonflow.tracking.spool import write_spool

PASSWORD = secrets.token_urlsafe(12)
URI = f"https://carbon:{PASSWORD}@mlflow.example:5000"


def test_a_runs_log_line_never_shows_the_tracking_password() -> None:
    reason = f"MlflowException: API request to {URI}/api/2.0/mlflow/runs/create failed"
    spooled = TrackingOutcome(tracking_uri=URI, idempotency_key="k", spooled=True, spool_path="/s/k", reason=reason)
    logged = TrackingOutcome(tracking_uri=URI, idempotency_key="k", run_id="r1")
    for message in (spooled.message, logged.message):
        assert PASSWORD not in message and "https://carbon:***@mlflow.example:5000" in message


def test_spool_status_never_shows_the_tracking_password(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    record = RunRecord(idempotency_key="k1", job="j", kind="training", experiment="carbonflow/j", run_name="j",
                       start_time_ms=now_ms, end_time_ms=now_ms)  # fmt: skip
    write_spool(record, URI, root=tmp_path / "spool", reason="down")
    result = CliRunner().invoke(app, ["spool", "status", "--home", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert PASSWORD not in result.output and "carbon:***@" in result.output
