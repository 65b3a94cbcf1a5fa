"""Issue 22: profile reuse and drift live in the session (``carbonflow.session.profile``); the profile task only
translates. A fresh profile is reused, a job whose realised energy drifted from its predictions is profiled again,
and MLflow being down profiles again instead of failing."""

from __future__ import annotations

import logging
import socket
import sys
from datetime import timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
import tracking_factories as f

from carbonflow.session.profile import drift_from_profile, log_measured_profile, reusable_profile
from carbonflow.tracking.logger import log_training_run

NOW = f.T0 + timedelta(hours=2)
PREDICTED_J = 70000.0  # tracking_factories.plan's predicted energy
CPU_J = 7000.0


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _runs(uri: str, job: str, ratios: list[float]) -> None:
    """Training runs of ``job`` whose realised energy is ``ratio`` times the predicted, oldest first."""
    spec = f.job_spec(job)
    for i, ratio in enumerate(ratios):
        start = f.T0 - timedelta(days=len(ratios) - i)
        gpu_j = ratio * PREDICTED_J - CPU_J
        outcome = log_training_run(
            spec,
            f.plan(job, start=start),
            f.result(job, started_at=start, energy_gpu_j=gpu_j, energy_cpu_j=CPU_J),
            tracking_uri=uri,
        )
        assert not outcome.spooled, outcome.reason


def test_a_fresh_profile_is_reused(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    spec = f.job_spec("steady")
    log_measured_profile(spec, f.profile("steady"), uri)
    _runs(uri, "steady", [1.1, 1.1, 1.1, 1.12, 1.1, 1.09])  # a steady ratio is learned, not drift
    with caplog.at_level(logging.INFO):
        reused = reusable_profile(spec, "NVIDIA A40", NOW, uri)
    assert reused is not None and reused.job == "steady" and len(reused.points) == 3
    assert "reusing the profile of steady" in caplog.text
    assert reusable_profile(spec, "NVIDIA V100", NOW, uri) is None  # another device model: measure it


def test_a_job_that_drifted_from_its_profile_is_profiled_again(uri: str, caplog: pytest.LogCaptureFixture) -> None:
    spec = f.job_spec("drifting")
    log_measured_profile(spec, f.profile("drifting"), uri)
    _runs(uri, "drifting", [1.0, 1.0, 1.0, 1.5, 1.5, 1.5])
    assert "moved from 1.00 to 1.50" in (drift_from_profile(spec, uri) or "")
    with caplog.at_level(logging.INFO):
        assert reusable_profile(spec, "NVIDIA A40", NOW, uri) is None
    assert "profiling drifting again" in caplog.text


def test_mlflow_down_profiles_again_instead_of_failing(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with caplog.at_level(logging.WARNING):
        assert reusable_profile(f.job_spec("offline"), "NVIDIA A40", NOW, closed) is None
    assert "unreadable" in caplog.text  # said, and the job is profiled again
