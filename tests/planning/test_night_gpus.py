"""Fitting a night's plans onto the GPUs there are (carbon-aware, deadline-safe, over-commit fallback)."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from planning_factories import NOW, make_forecast

from carbonflow.domain import Config, Forecast, JobSpec, Plan, Profile
from carbonflow.planning.night_gpus import fit_plans_to_gpus, gpu_groups

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "night_scale.py"


def _plan(job: str, start_h: float, hours: float, finish_h: float = 12.0, with_: tuple[str, ...] = ()) -> Plan:
    return Plan(
        job=job, config=Config(containers=1, power_limit_w=200), start=NOW + timedelta(hours=start_h),
        finish_by=NOW + timedelta(hours=finish_h), predicted_duration_s=hours * 3600, predicted_energy_j=3.6e6 * hours,
        predicted_emissions_g=100, region="GB", forecast_provider="test", reason="lowest carbon",
        colocated_with=list(with_),
    )  # fmt: skip


# hourly intensity over 12 h: lowest at hour 4, second lowest at hour 8
INTENSITY = [300, 280, 250, 220, 100, 220, 250, 240, 150, 260, 300, 320, 330, 330]


def _intensity() -> Forecast:
    return make_forecast(INTENSITY, slot_s=3600)


def test_groups_that_fit_keep_their_carbon_start():
    plans = [_plan("a", 4, 1), _plan("b", 4, 1)]
    assert [p.start for p in fit_plans_to_gpus(plans, 2, NOW, _intensity())] == [p.start for p in plans]


def test_a_group_with_no_free_gpu_moves_to_the_next_lowest_carbon_start_that_fits():
    plans = [_plan("a", 4, 1), _plan("b", 4, 1), _plan("c", 4, 1)]
    fitted = {p.job: p for p in fit_plans_to_gpus(plans, 2, NOW, _intensity())}
    moved = [p for p in fitted.values() if p.start != NOW + timedelta(hours=4)]
    assert len(moved) == 1
    assert moved[0].start == NOW + timedelta(hours=8)  # hour 8 is the next lowest, not "right after"
    assert "moved from" in moved[0].reason and "GPUs are booked" in moved[0].reason


def test_a_moved_group_keeps_the_planners_deadline_margin():
    # finish-by at 10 h; a 1 h run with a 2.5x margin must start by 7.5 h: hour 8 is not allowed
    plans = [_plan("a", 4, 1, 10), _plan("b", 4, 1, 10), _plan("c", 4, 1, 10)]
    fitted = fit_plans_to_gpus(plans, 2, NOW, _intensity(), {"a": 2.5, "b": 2.5, "c": 2.5})
    for p in fitted:
        assert p.start + timedelta(hours=2.5) <= p.finish_by


def test_a_co_located_pair_takes_one_gpu():
    plans = [_plan("a", 4, 1, with_=("b",)), _plan("b", 4, 1, with_=("a",)), _plan("c", 4, 1)]
    assert len(gpu_groups(plans)) == 2
    assert all(p.start == NOW + timedelta(hours=4) for p in fit_plans_to_gpus(plans, 2, NOW, _intensity()))


def test_an_over_committed_night_drops_carbon_shifting_and_starts_everything_now():
    plans = [_plan(j, 4, 5) for j in "abc"]  # 15 GPU-h on 1 GPU before a 12 h finish-by: impossible
    fitted = fit_plans_to_gpus(plans, 1, NOW, _intensity())
    assert all(p.start == NOW for p in fitted)
    assert all("does not fit 1 GPUs" in p.reason for p in fitted)


def test_zero_gpus_is_refused_by_name():
    with pytest.raises(ValueError, match="gpus=0"):
        fit_plans_to_gpus([_plan("a", 0, 1)], 0, NOW)


def _bench():
    spec = importlib.util.spec_from_file_location("night_scale_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


OVERRIDES = ["--profile-startup-s", "30", "--profile-s-per-config", "10", "--pair-profile-s", "20"]


def test_night_scale_benchmark_small_run_meets_its_own_accounting(tmp_path):
    bench = _bench()
    out = tmp_path / "night_scale.json"
    assert bench.main(["--jobs", "12", "--gpus", "2", "--nights", "3", *OVERRIDES, "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    exhaustive, budgeted = r["policies"]["exhaustive"], r["policies"]["budgeted"]
    assert exhaustive["pairs_profiled"] > budgeted["pairs_profiled"] > 0
    # the first night profiles every job: 12 solo profiles at the given seconds, plus the pairs
    used = r["profiling_seconds_used"]
    assert set(used["source"].values()) == {"override"} and r["profiling_seconds_measured"] is None
    solo_s = 12 * (used["profile_startup_s"] + 7 * used["profile_s_per_config"])
    assert exhaustive["profiling_gpu_s_first_night"] == pytest.approx(solo_s + 66 * used["pair_profile_s"], rel=0.2)
    assert r["deadline_misses"] == budgeted["deadline_misses"]
    assert 0 < r["night_plan_s"] < 10


def test_night_scale_charges_the_measured_profiling_seconds_by_default():
    """The published run charges what the product's profiler measured (no flag given), and says how."""
    r = json.loads((BENCH.parent / "results" / "night_scale.json").read_text())
    measured, used = r["profiling_seconds_measured"], r["profiling_seconds_used"]
    assert set(used["source"].values()) == {"measured"}
    for key in ("profile_startup_s", "profile_s_per_config", "pair_profile_s"):
        assert used[key] == measured[key] > 0
    assert "profile_job" in measured["label"] and "simulated" in measured["label"]
    assert "host wall time" in measured["how"] and "simulated GPU's clock" in measured["how"]
    assert len(measured["solo"]) >= 2 and all(row["limits_swept"] >= 2 for row in measured["solo"])
    assert "assumptions" not in r or "profile_startup_s" not in r["assumptions"]


def test_night_scale_reuses_a_measurement_without_profiling_again(tmp_path):
    bench = _bench()
    out = tmp_path / "night_scale.json"
    published = BENCH.parent / "results" / "night_scale.json"
    assert bench.main(["--jobs", "6", "--gpus", "2", "--nights", "2", "--profiling-measured", str(published),
                       "--out", str(out)]) == 0  # fmt: skip
    r = json.loads(out.read_text())
    measured = json.loads(published.read_text())["profiling_seconds_measured"]
    assert r["profiling_seconds_used"]["profile_s_per_config"] == measured["profile_s_per_config"]
    assert set(r["profiling_seconds_used"]["source"].values()) == {"measured"}


def test_a_phase_lasts_until_both_profile_steps_and_the_minimum_window_are_met():
    bench = _bench()
    spec = bench._profiling_spec("cifar100", "shufflenetv2")
    assert spec.profile_steps == 30 and spec.profile_min_window_s == 2.0  # the product's defaults
    # fast steps (10 ms): the 2 s window decides (200 steps); slow steps (1 s): the 30 steps do
    assert bench._phase_gpu_s(0.01, 5, spec) == pytest.approx((5 + 200) * 0.01)
    assert bench._phase_gpu_s(1.0, 5, spec) == pytest.approx(35.0)


def test_drift_triggers_refreshes_through_the_products_rule(monkeypatch):
    """A drifting job is refreshed once its ratios move past drift_reason's threshold; a steady one never is."""
    bench = _bench()
    drift = bench.DriftModel({"a": 3}, step=0.4, per_night=0.0, noise=0.0, seed=0)
    state = bench.PolicyState("budgeted")
    specs = {n: JobSpec(name=n, command=["true"], steps=1, region="GB") for n in ("a", "b")}
    profile = Profile(job="x", device_model="V100", device_kind="gpu", label="simulated", points=[])

    class Args:
        profile_startup_s, profile_s_per_config, profile_budget_fraction = 10.0, 1.0, 0.0

    calls = []
    monkeypatch.setattr(bench, "drift_reason", lambda ratios: calls.append(list(ratios)) or real(ratios))
    from carbonflow.profiling.refresh import drift_reason as real

    refreshed = {}
    for night in range(12):
        before = dict(state.refreshes)
        bench.profile_solo(state, specs, {"a": profile, "b": profile}, NOW + timedelta(days=night), night, drift, Args)
        refreshed[night] = state.refreshes["drift"] - before["drift"]
        bench.record_drift(state, list(specs), night, drift)
    assert calls  # the product's function decided
    assert state.refreshes["first"] == 2 and state.refreshes["drift"] >= 1 and state.refreshes["drift_false_alarm"] == 0
    assert state.drift_lags and min(state.drift_lags) >= 1
    assert sum(refreshed.values()) == state.refreshes["drift"]
