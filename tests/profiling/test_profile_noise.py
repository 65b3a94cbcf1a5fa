"""Finding: a profile was read as a ranking even when its points differed less than its own measurement noise
(a run-to-run wobble decided the power limit). Now each point carries the spread of its step times, the
profiler says when the points cannot be told apart, and the planner then keeps the default power limit."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.execution.local import LocalBackend
from carbonflow.planning.optimizer import decidable_profile, plan_job
from carbonflow.profiling.profiler import noise_note, profile_job

NOW = datetime(2030, 1, 1, 18, tzinfo=UTC)


def _point(limit_w: float, joules: float, spread: float | None) -> ProfilePoint:
    """A point of ``joules`` per sample at 100 samples/s, with its throughput's relative standard error."""
    return ProfilePoint(config=Config(containers=1, power_limit_w=limit_w), throughput_samples_per_s=100.0,
                        power_per_device_w={"gpu": 100.0 * joules}, energy_per_sample_j=joules,
                        duration_s=10, samples=1000, label="measured", throughput_spread=spread)  # fmt: skip


def _profile(points: list[ProfilePoint]) -> Profile:
    profile = Profile(job="noisy", device_model="V100", device_kind="gpu", label="measured", default_power_limit_w=250,
                      max_power_w=250, samples_per_epoch=10_000, points=points)  # fmt: skip
    note = noise_note(points)
    return profile.model_copy(update={"notes": [note] if note else []})


def test_points_inside_their_own_noise_are_not_ranked() -> None:
    noisy = [_point(250, 2.50, 0.05), _point(200, 2.45, 0.05), _point(150, 2.48, 0.04)]
    assert "cannot rank them (noise)" in (noise_note(noisy) or "")
    clear = [_point(250, 2.5, 0.01), _point(200, 2.0, 0.01), _point(150, 1.8, 0.01)]
    assert noise_note(clear) is None
    assert noise_note([_point(250, 2.5, None), _point(200, 2.4, None)]) is None  # spread unknown: no claim


def test_the_planner_keeps_the_default_limit_and_says_why() -> None:
    noisy = _profile([_point(250, 2.50, 0.05), _point(200, 2.40, 0.05), _point(150, 2.45, 0.04)])
    assert [p.config.power_limit_w for p in decidable_profile(noisy).points] == [250]
    spec = JobSpec(name="noisy", command=["true"], epochs=1, samples_per_epoch=10_000, region="GB", objective="energy",
                   finish_by=NOW + timedelta(hours=8))  # fmt: skip
    plan = plan_job(spec, noisy, None, NOW)
    assert plan.config.power_limit_w == 250
    assert "cannot rank them (noise)" in plan.reason
    clear = _profile([_point(250, 2.5, 0.01), _point(200, 2.0, 0.01)])
    assert plan_job(spec, clear, None, NOW).config.power_limit_w == 200  # a real difference is still used


JITTERY = """
import time
from carbonflow import training
for step in range(1, 200):
    time.sleep(0.005 if step % 2 else 0.03)  # step times alternate: a noisy job
    training.report(step, step * 8)
    if training.should_stop():
        break
"""


def test_the_wrapper_measures_the_spread_of_a_jobs_own_step_times(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(JITTERY)
    spec = JobSpec(name="jittery", command=[sys.executable, str(script)], steps=199, region="GB", device_kind="cpu",
                   profile_steps=40, profile_warmup_steps=2, profile_min_window_s=0.2)  # fmt: skip
    profile = profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    [point] = profile.points
    assert point.throughput_spread is not None
    assert 0.3 / 40**0.5 < point.throughput_spread < 1.2 / 5**0.5  # step times vary by ~70 %: the spread shows it
