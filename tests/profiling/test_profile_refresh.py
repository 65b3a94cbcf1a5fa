"""Which solo profiles are refreshed tonight: required ones always, aged ones oldest first within a budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from carbonflow.profiling.refresh import ProfileState, profiles_to_refresh

NOW = datetime(2024, 3, 8, 18, tzinfo=UTC)
WEEK_S = 7 * 86400


def _state(job: str, age_d: float | None, **kw) -> ProfileState:
    measured = None if age_d is None else NOW - timedelta(days=age_d)
    return ProfileState(job, WEEK_S, 100.0, measured, **kw)


def test_missing_changed_or_drifting_profiles_are_always_refreshed_even_over_budget():
    states = [
        _state("new", None),
        _state("code", 1, code_version="v1", current_code_version="v2"),
        _state("gpu", 1, gpu_model="V100", current_gpu_model="A100"),
        _state("drift", 1, drifting=True),
        _state("fresh", 1, code_version="v1", current_code_version="v1"),
    ]
    refreshes = profiles_to_refresh(states, NOW, budget_gpu_s=0)
    assert {r.job for r in refreshes} == {"new", "code", "gpu", "drift"}
    assert all(r.required for r in refreshes)
    assert "v1 → v2" in next(r.reason for r in refreshes if r.job == "code")


def test_aged_profiles_refresh_oldest_first_within_the_budget():
    states = [_state(f"j{i}", 7 + i) for i in range(5)] + [_state("young", 2)]
    refreshes = profiles_to_refresh(states, NOW, budget_gpu_s=250)
    assert [r.job for r in refreshes] == ["j4", "j3"]  # 100 GPU-s each: two fit in 250
    assert not any(r.required for r in refreshes)


def test_fifty_profiles_from_one_night_do_not_all_rerun_a_week_later():
    states = [_state(f"j{i}", 7) for i in range(50)]
    assert len(profiles_to_refresh(states, NOW, budget_gpu_s=1000)) == 10


def test_negative_budget_is_refused_by_name():
    with pytest.raises(ValueError, match="budget_gpu_s=-1"):
        profiles_to_refresh([], NOW, budget_gpu_s=-1)


def test_drift_is_a_moving_ratio_not_a_steady_one() -> None:
    """Realised/predicted energy that stays put (fixed costs the planner learns) is no reason to re-profile;
    one that moves by more than a quarter over the last runs is, and the operator says so."""
    from carbonflow.profiling.refresh import drift_reason

    assert drift_reason([1.4, 1.5, 1.4, 1.45, 1.5, 1.4]) is None  # steady: fixed costs
    assert drift_reason([1.0, 1.1]) is None  # too few runs to tell
    reason = drift_reason([1.0, 1.05, 0.95, 1.0, 1.6, 1.7, 1.65])
    assert reason is not None and "from 1.00 to 1.65" in reason
