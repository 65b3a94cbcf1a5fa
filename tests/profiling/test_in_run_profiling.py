"""Issue 24, in-run profiling: the first training run at a batch size with no profile sweeps its power limits
inside itself (each limit for the profile window, measured by the wrapper), keeps that work, trains on at the
limit best for the job's objective, and its windows are the profile the next night's planner reads — one run,
both the trained result and the profile, on the simulated GPU through the local backend."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Plan, SimulatedGpuSpec, utcnow
from carbonflow.energy.discovery import discover_devices
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.wrapper import IN_RUN_PROFILE
from carbonflow.profiling.profiler import in_run_options, needs_in_run_profile, profile_from_training

EPOCHS, PER_EPOCH, BATCH = 3, 640, 8

TRAIN = """
import os, time
from carbonflow import training
epochs, per_epoch, batch = int(os.environ["CARBONFLOW_EPOCHS"]), int(os.environ["PER_EPOCH"]), 8
samples = step = 0
for epoch in range(epochs):
    for _ in range(per_epoch // batch):
        if training.should_stop():
            raise SystemExit(0)  # told to stop (a separate profile): ends early, its epochs untrained
        time.sleep(0.01)
        step, samples = step + 1, samples + batch
        training.report(step, samples)
"""


def _spec(tmp_path: Path) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return JobSpec(
        name="in-run-job", command=[sys.executable, str(script)], epochs=EPOCHS, samples_per_epoch=PER_EPOCH,
        batch_size=BATCH, region="GB", simulated_gpu=SimulatedGpuSpec(), power_limits_w=[250, 200, 150],
        env={"PER_EPOCH": str(PER_EPOCH)}, profile_warmup_steps=2, profile_steps=10, max_slowdown=1.0,
        objective="energy", profile_min_window_s=0.2,
    )  # fmt: skip


def _plan(spec: JobSpec) -> Plan:
    return Plan(
        job=spec.name, config=Config(containers=1, power_limit_w=250), start=utcnow(), predicted_duration_s=0,
        predicted_energy_j=0, predicted_emissions_g=0, region=spec.region, forecast_provider="none", reason="test",
    )  # fmt: skip


def test_one_training_run_yields_the_trained_result_and_the_profile(tmp_path):
    spec, plan = _spec(tmp_path), None
    plan = _plan(spec)
    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    assert needs_in_run_profile(spec, None, plan.config)
    options = in_run_options(spec, devices)
    assert options is not None and options.train_after_sweep and options.sweep_limits_w == [250, 200, 150]
    run = LocalBackend(tmp_path / "runs").execute(spec, plan, options)
    # the training: every sample of the job's epochs, none discarded, and it finished on its own
    assert run.exit_code == 0, run.notes
    assert run.samples == EPOCHS * PER_EPOCH
    assert run.steps == EPOCHS * PER_EPOCH // BATCH
    # the sweep: one window per limit inside it, then the rest at the best limit for the objective
    assert [w.power_limit_w for w in run.windows] == [250, 200, 150]
    assert sum(w.samples for w in run.windows) < run.samples  # a prefix of the training, not all of it
    assert any(note.startswith(IN_RUN_PROFILE) for note in run.notes), run.notes
    per_sample = {w.power_limit_w: sum(w.energy_j.values()) / w.samples for w in run.windows}
    assert run.power_limit_w == min(per_sample, key=per_sample.get)  # objective energy, slowdown allowed
    # the profile from those windows, as the next night's planner reads a separate profile
    profile = profile_from_training(spec, devices, plan.config, run, samples_per_epoch=PER_EPOCH)
    assert sorted(p.config.power_limit_w for p in profile.points) == [150, 200, 250]
    assert all(p.config.containers == 1 and p.throughput_samples_per_s > 0 for p in profile.points)
    assert any(note.startswith(IN_RUN_PROFILE) for note in profile.notes)
    assert not needs_in_run_profile(spec, profile, plan.config)


def test_an_in_run_profile_keeps_the_earlier_points_of_other_batch_sizes(tmp_path):
    spec = _spec(tmp_path)
    spec = spec.model_copy(update={"batch_sizes": [8, 16]})
    plan = _plan(spec)
    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    run = LocalBackend(tmp_path / "runs").execute(spec, plan, in_run_options(spec, devices))
    at_8 = profile_from_training(spec, devices, plan.config, run, samples_per_epoch=PER_EPOCH)
    at_16 = Config(containers=1, batch_size=16)
    assert needs_in_run_profile(spec, at_8, at_16)  # a batch size never swept
    merged = profile_from_training(spec, devices, at_16, run, samples_per_epoch=PER_EPOCH, earlier=at_8)
    assert len(merged.points) == 6
    assert not needs_in_run_profile(spec, merged, at_16) and not needs_in_run_profile(spec, merged, plan.config)


def test_train_after_sweep_without_a_window_is_refused(tmp_path):
    from carbonflow.execution.wrapper import run_wrapped

    spec = _spec(tmp_path)
    with pytest.raises(ValueError, match="train_after_sweep needs profile_steps"):
        run_wrapped(spec, _plan(spec), [sys.executable, "-c", "pass"], train_after_sweep=True)
    assert os.environ.get("CARBONFLOW_EPOCHS") is None
