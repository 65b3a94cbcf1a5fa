"""The night's planning in the session, called without Airflow: a typed NightPlan from profiles and a forecast."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint
from carbonflow.planning.pairs import PairProfile
from carbonflow.session.night import pairs_to_profile, plan_night_batch
from carbonflow.session.source import CarbonSource
from carbonflow.session.state import NightPlan
from carbonflow.workloads.catalog import DIGITS_CNN, DIGITS_CNN_WIDE_BATCH

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped NESO GB replay


def _spec(base: dict[str, Any], name: str, **extra: Any) -> JobSpec:
    return JobSpec.model_validate({**base, "name": name, "epochs": 1, "objective": "energy", "max_slowdown": 0.5,
                                   "max_containers": 1, "finish_by": (T0 + timedelta(hours=10)).isoformat(),
                                   **extra})  # fmt: skip


def _profile(job: str) -> Profile:
    point = ProfilePoint(
        config=Config(containers=1, power_limit_w=250), throughput_samples_per_s=100.0,
        power_per_device_w={"gpu": 220.0}, energy_per_sample_j=2.2, duration_s=10, samples=1000, label="simulated",
    )  # fmt: skip
    return Profile(job=job, device_model="Tesla V100 (simulated)", device_kind="gpu", label="simulated",
                   default_power_limit_w=250, max_power_w=250, samples_per_epoch=1437, points=[point])  # fmt: skip


def _pair_night(speeds: tuple[float, float], **kwargs: Any) -> NightPlan:
    specs = [_spec(DIGITS_CNN, "a"), _spec(DIGITS_CNN_WIDE_BATCH, "b")]
    pair = PairProfile("a", "b", speeds[0], speeds[1], 240.0, label="simulated", power_limit_w=250)
    return plan_night_batch(specs, {s.name: _profile(s.name) for s in specs}, CarbonSource(replay=True), T0,
                            pair_profiles=[pair], **kwargs)  # fmt: skip


def test_a_pair_that_keeps_its_speed_shares_one_gpu_with_its_guards() -> None:
    night = _pair_night((0.95, 0.9))
    assert isinstance(night, NightPlan) and night.now == T0
    assert night.groups == [["a", "b"]]
    assert night.plans["a"].colocated_with == ["b"] and night.plans["b"].colocated_with == ["a"]
    assert 0 < night.min_kept_speed["a"] <= 0.95 and 0 < night.min_kept_speed["b"] <= 0.9
    assert all(p.replay for p in night.plans.values())  # planned on the replayed forecast, and it says so
    assert night.pair_profiles()[0].speeds("a", "b") == (0.95, 0.9)
    assert NightPlan.from_xcom(night.to_xcom()) == night


def test_a_pair_too_slow_together_runs_alone_and_the_plan_says_why() -> None:
    night = _pair_night((0.4, 0.4))  # 150 % slower together, beyond max_slowdown 50 %
    assert sorted(night.groups) == [["a"], ["b"]]
    assert night.min_kept_speed == {}
    for job in ("a", "b"):
        assert "alone, not with" in night.notes[job] and "150 %" in night.notes[job]
        assert night.plans[job].reason.endswith(night.notes[job])


def test_a_job_without_finish_by_must_finish_by_the_next_deadline() -> None:
    spec = _spec(DIGITS_CNN, "solo").model_copy(update={"finish_by": None})
    night = plan_night_batch([spec], {"solo": _profile("solo")}, CarbonSource(replay=True), T0,
                             deadline_time_utc="06:30")  # fmt: skip
    assert night.jobs["solo"].finish_by == datetime(2023, 3, 15, 6, 30, tzinfo=UTC)
    assert night.groups == [["solo"]] and night.notes == {"solo": ""}


def test_bad_input_is_refused_naming_it() -> None:
    late = _spec(DIGITS_CNN, "late", finish_by=(T0 - timedelta(hours=1)).isoformat())
    with pytest.raises(ValueError, match=r"finish_by=2023-03-14T18:00:00\+00:00 of job late is in the past"):
        plan_night_batch([late], {"late": _profile("late")}, CarbonSource(replay=True), T0)
    with pytest.raises(ValueError, match="gpus=0 is not allowed"):
        _pair_night((0.95, 0.9), gpus=0)
    with pytest.raises(ValueError, match="jobs=\\[\\] is not allowed"):
        plan_night_batch([], {}, CarbonSource(replay=True), T0)


def test_one_gpu_runs_the_night_one_group_after_the_other() -> None:
    apart = _pair_night((0.4, 0.4))
    assert apart.plans["a"].start == apart.plans["b"].start  # one GPU each: both at the lowest-carbon start
    night = _pair_night((0.4, 0.4), gpus=1)
    first, second = (night.plans[g[0]] for g in night.groups)
    assert second.start >= first.start + timedelta(seconds=first.predicted_duration_s)


def test_pairs_to_profile_skips_pairs_that_can_never_share_and_keeps_to_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    specs = [_spec(DIGITS_CNN, "a"), _spec(DIGITS_CNN_WIDE_BATCH, "b"), _spec(DIGITS_CNN, "c"),
             _spec(DIGITS_CNN, "de", region="DE")]  # fmt: skip
    profiles = {s.name: _profile(s.name) for s in specs}
    log = logging.getLogger("test.night")
    with caplog.at_level(logging.INFO, logger="test.night"):
        every = pairs_to_profile(specs, profiles, None, log=log)
    assert every == [("a", "b"), ("a", "c"), ("b", "c")]
    assert "not pairing a and de: different regions (GB, DE)" in caplog.text
    assert len(pairs_to_profile(specs, profiles, None, max_pairs=1, log=log)) == 1
    assert pairs_to_profile(specs, profiles, None, max_pair_gpu_s=0.0, log=log) == []


def test_the_night_session_imports_no_airflow() -> None:
    code = ("import sys, carbonflow.session.night, carbonflow.session.state; "
            "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
