"""The schema is one table; names carry units; the URI rules of the embedded default and production."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from carbonflow.tracking import schema
from carbonflow.tracking.uri import (
    default_tracking_uri,
    experiment_artifact_location,
    is_server_uri,
    server_reachable,
    short_http_timeouts,
    tracking_uri,
)

UNIT_SUFFIXES = ("_s", "_j", "_kwh", "_g", "_gco2_per_kwh", "_w", "_samples_per_s", "_fraction", "_accuracy")
UNITLESS_METRICS = {"samples", "exit_code"}


def test_every_constant_is_documented_once() -> None:
    constants = {
        value
        for name, value in vars(schema).items()
        if re.match(r"^[MPTA]_[A-Z0-9_]+$", name) and isinstance(value, str)
    }
    documented = [entry.name for entry in schema.SCHEMA]
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert constants <= set(documented) | {schema.T_PARENT_RUN_ID}
    assert set(documented) <= constants


def test_metric_names_carry_units() -> None:
    for name in schema.METRIC_NAMES - UNITLESS_METRICS:
        assert name.endswith(UNIT_SUFFIXES), f"metric {name} has no unit in its name"


def test_issue_names_present() -> None:
    for name in [
        "duration_s",
        "energy_gpu_j",
        "energy_cpu_j",
        "energy_total_j",
        "energy_total_kwh",
        "emissions_g",
        "carbon_intensity_mean_gco2_per_kwh",
        "test_accuracy",
        "throughput_samples_per_s",
        "emissions_run_now_default_g",
        "saving_g",
        "saving_fraction",
    ]:
        assert name in schema.METRIC_NAMES
    for name in ["containers", "power_limit_w", "batch_size", "planned_start", "actual_start", "region"]:
        assert name in schema.PARAM_NAMES
    assert {"forecast_provider", "signal_kind", "objective", "colocated_jobs", "plan_reason"} <= schema.PARAM_NAMES
    for tag in ["job", "recurrence", "device_model", "device_uuids", "energy_labels", "replay", "version", "kind"]:
        assert f"carbonflow.{tag}" in schema.TAG_NAMES


def test_required_sets_are_documented() -> None:
    assert set(schema.TRAINING_REQUIRED_METRICS) <= schema.METRIC_NAMES
    assert set(schema.TRAINING_REQUIRED_PARAMS) <= schema.PARAM_NAMES
    assert set(schema.TRAINING_REQUIRED_TAGS) <= schema.TAG_NAMES


def test_markdown_table_lists_every_entry() -> None:
    text = schema.schema_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(schema.SCHEMA)
    for entry, row in zip(schema.SCHEMA, rows, strict=True):
        assert row.startswith(f"| `{entry.name}` | {entry.kind} |")
    assert "carbonflow/<job>" in text


def test_tracking_uri_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CARBONFLOW_HOME", str(tmp_path / "h"))
    assert tracking_uri() == f"sqlite:///{tmp_path / 'h' / 'mlflow.db'}"
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking_uri() == "http://mlflow:5000"
    assert is_server_uri(tracking_uri())
    assert not is_server_uri("sqlite:///x.db")


def test_artifact_location_local_vs_server(tmp_path: Path) -> None:
    location = experiment_artifact_location("sqlite:///x.db", "carbonflow/digits", home=tmp_path)
    assert location == (tmp_path / "mlartifacts" / "carbonflow-digits").as_uri()
    assert (tmp_path / "mlartifacts" / "carbonflow-digits").is_dir()
    assert experiment_artifact_location("http://127.0.0.1:5000", "carbonflow/digits", home=tmp_path) is None


def test_short_http_timeouts_respects_user_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "9")
    with short_http_timeouts(max_retries=1, timeout_s=4):
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "9"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "9"


def test_server_reachable_reports_a_closed_port() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ok, why = server_reachable(f"http://127.0.0.1:{port}", timeout_s=1)
    assert not ok and str(port) in why
    assert server_reachable("sqlite:///x.db") == (True, "local store")


def test_docs_schema_section_is_generated_from_the_code() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "mlflow-schema.md"
    text = page.read_text()
    assert schema.README_START in text, f"docs/mlflow-schema.md lost its {schema.README_START} marker"
    body = text.split(schema.README_START, 1)[1].split(schema.README_END, 1)[0]
    assert body.strip() == schema.schema_markdown().strip(), (
        "docs/mlflow-schema.md is stale: paste `python -m carbonflow.tracking.schema` between the markers"
    )
