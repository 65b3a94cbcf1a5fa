"""Observe-only (shadow) mode: carbonflow profiles, plans and logs what it would have saved, but the job trains
at once, alone, without a power limit. The run here is the real digits CNN on a **simulated** V100, with the
shipped NESO GB **replay**, logged to the embedded MLflow store."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.operators.night import can_share
from carbonflow.session import RunSession, SessionClock
from carbonflow.session.source import CarbonSource
from carbonflow.workloads.catalog import DIGITS_CNN

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped replay


def _point(limit_w: float) -> ProfilePoint:
    speed = 100.0 * (limit_w / 250) ** 0.3
    return ProfilePoint(config=Config(containers=1, power_limit_w=limit_w), throughput_samples_per_s=speed,
                        power_per_device_w={"gpu": limit_w * 0.9}, energy_per_sample_j=limit_w * 0.9 / speed,
                        duration_s=10, samples=1000, label="simulated")  # fmt: skip


def _profile(job: str) -> Profile:
    return Profile(job=job, device_model="Tesla V100 (simulated)", device_kind="gpu", label="simulated",
                   default_power_limit_w=250, max_power_w=250, samples_per_epoch=1437,
                   points=[_point(w) for w in (250, 200, 150)])  # fmt: skip


def _spec(**extra: object) -> JobSpec:
    return JobSpec.model_validate({**DIGITS_CNN, "name": "shadow-job", "epochs": 1, "objective": "carbon",
                                   "finish_by": (T0 + timedelta(hours=10)).isoformat(), **extra})  # fmt: skip


def test_an_observe_only_job_trains_now_without_a_limit_and_logs_what_it_would_have_done(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path)
    clock = SessionClock.replaying(T0)
    state = session.plan_alone(_spec(observe_only=True), _profile("shadow-job"), clock.now())
    [member] = state.members
    assert member.would_have is not None  # what carbonflow would have run
    assert member.plan.config.power_limit_w is None and member.plan.colocated_with == []
    assert abs((member.plan.start - clock.now()).total_seconds()) < 60
    assert session.next_wake(state, clock.now(), 3600) is None  # no waiting for a low-carbon window
    assert "observe-only" in member.plan.reason and member.would_have.config.key() in member.plan.reason

    outcome = session.launch(state, clock)
    [job] = outcome.jobs
    assert job.result is not None and job.result.succeeded and not job.result.power_limit_applied
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(job.tracking["run_id"])
    assert run.data.tags[s.T_OBSERVE_ONLY] == "true"
    assert run.data.tags[s.T_WOULD_HAVE_CONFIG] == member.would_have.config.key()
    assert run.data.metrics[s.M_WOULD_HAVE_PREDICTED_EMISSIONS_G] == pytest.approx(
        member.would_have.predicted_emissions_g
    )


def test_the_deployment_switch_and_pairing(monkeypatch: pytest.MonkeyPatch) -> None:
    from carbonflow.session.run import observe_only

    plain = _spec()
    assert not observe_only(plain)
    assert can_share(plain, _spec(name="other")) is None
    assert "observe-only" in (can_share(plain, _spec(name="shadow", observe_only=True)) or "")
    monkeypatch.setenv("CARBONFLOW_OBSERVE_ONLY", "1")
    assert observe_only(plain)
