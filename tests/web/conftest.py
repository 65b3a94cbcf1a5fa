"""The Carbon page's app sets MLflow's HTTP timeouts once for its process; give them back after each test."""

from __future__ import annotations

import pytest

MLFLOW_HTTP_SETTINGS = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)


@pytest.fixture(autouse=True)
def _mlflow_http_settings_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in MLFLOW_HTTP_SETTINGS:  # setenv records the value before (or its absence) for the teardown
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
