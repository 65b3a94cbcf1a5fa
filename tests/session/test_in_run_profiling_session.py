"""Issue 24, in-run profiling through the session the training operator runs: a new job's first night is planned
from a single-limit probe (``profile_job(probe=True)``); its training sweeps the power limits inside itself, keeps
that work (the run trains the job's whole epochs), trains on at the best limit, and the profile it measured is
logged to MLflow, where the next night's profile task reads it (``latest_profile``) instead of profiling again."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from carbonflow.domain import JobSpec, SimulatedGpuSpec, utcnow
from carbonflow.energy.discovery import discover_devices
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.wrapper import IN_RUN_PROFILE
from carbonflow.profiling.profiler import needs_in_run_profile, profile_job
from carbonflow.session import RunSession, SessionClock
from carbonflow.session.source import CarbonSource

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped replay
EPOCHS, PER_EPOCH = 3, 640
TRAIN = """
import os, time
from carbonflow import training
epochs, per_epoch, batch = int(os.environ["CARBONFLOW_EPOCHS"]), 640, 8
samples = step = 0
for epoch in range(epochs):
    for _ in range(per_epoch // batch):
        if training.should_stop():
            raise SystemExit(0)  # told to stop (the probe): ends early
        time.sleep(0.01)
        step, samples = step + 1, samples + batch
        training.report(step, samples)
"""


def test_the_first_run_profiles_itself_keeps_its_work_and_logs_the_profile_the_next_night_reads(tmp_path: Path):
    from carbonflow.tracking.history import latest_profile

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    spec = JobSpec(
        name="in-run-session", command=[sys.executable, str(script)], epochs=EPOCHS, samples_per_epoch=PER_EPOCH,
        batch_size=8, region="GB", simulated_gpu=SimulatedGpuSpec(), power_limits_w=[250, 200, 150],
        profile_warmup_steps=2, profile_steps=10, profile_min_window_s=0.2, max_slowdown=1.0,
        finish_by=T0 + timedelta(hours=10),
    )  # fmt: skip
    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    probe = profile_job(spec, LocalBackend(tmp_path / "probe"), devices, samples_per_epoch=PER_EPOCH, probe=True)
    assert [p.config.power_limit_w for p in probe.points] == [250]  # one limit: a probe
    assert needs_in_run_profile(spec, probe, probe.points[0].config)
    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path / "work")
    clock = SessionClock.replaying(T0)
    state = session.plan_alone(spec, probe, clock.now())
    state.members[0].plan.start = clock.now()  # train at once: the plan's window is not what is tested here
    outcome = session.launch(state, clock)
    assert outcome.failures == []
    [job] = outcome.jobs
    assert job.result is not None and job.result.succeeded
    assert job.result.samples == EPOCHS * PER_EPOCH  # the sweep's work kept: the job's epochs, nothing discarded
    assert job.profile is not None
    assert sorted(p.config.power_limit_w for p in job.profile.points) == [150, 200, 250]
    assert any(note.startswith(IN_RUN_PROFILE) for note in job.profile.notes)
    assert not needs_in_run_profile(spec, job.profile, state.members[0].plan.config)
    assert "profile" in job.to_json()
    # logged and learned from at the limit it trained on at (the wrapper's note names it)
    ran_at = job.plan.config.power_limit_w
    assert ran_at in {150.0, 200.0, 250.0}
    assert any(f"trained on at {ran_at:g} W" in note for note in job.result.notes), job.result.notes
    # its predictions moved to that limit by the sweep's own points, so its saving is judged against the planned
    # 250 W default, not against itself (a user saw "saved 0.0 %" on a run that trained at 175 W)
    planned = state.members[0].plan
    assert ran_at < 250, "the simulated V100 job's sweep picks a lower limit than the default"
    points = {p.config.power_limit_w: p for p in job.profile.points}
    # the sweep's windows ran at their limits, the rest of the samples at the chosen one (a user trial: crediting
    # the sweep's samples as if at the chosen limit overstated the saving)
    windows = [(p.samples, p.energy_per_sample_j) for p in job.profile.points]  # one point per window
    swept = sum(n for n, _ in windows)
    per_sample = sum(n * e for n, e in windows) + (job.result.samples - swept) * points[ran_at].energy_per_sample_j
    assert swept > 0 and job.plan.predicted_energy_j == pytest.approx(
        planned.predicted_energy_j * per_sample / (job.result.samples * points[250].energy_per_sample_j)
    )
    assert job.plan.predicted_energy_j > planned.predicted_energy_j * (
        points[ran_at].energy_per_sample_j / points[250].energy_per_sample_j
    )  # more than if every sample had run at the chosen limit
    assert job.plan.predicted_energy_j < planned.predicted_energy_j
    assert job.result.emissions_run_now_default_g is not None
    assert job.result.emissions_run_now_default_g > job.result.emissions_g
    # the next night's profile task reads it from MLflow as it reads a separate profile
    found = latest_profile(spec.name, job.profile.device_model, spec.code_version, 3600, utcnow())
    assert found is not None and len(found.points) == 3
