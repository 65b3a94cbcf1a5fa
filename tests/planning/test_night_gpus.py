"""Fitting a night's plans onto the GPUs there are (carbon-aware, deadline-safe, over-commit fallback)."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from planning_factories import NOW, make_forecast

from carbonflow.models import Config, Forecast, Plan
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


def test_night_scale_benchmark_small_run_meets_its_own_accounting(tmp_path):
    spec = importlib.util.spec_from_file_location("night_scale_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "night_scale.json"
    assert bench.main(["--jobs", "12", "--gpus", "2", "--nights", "3", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    exhaustive, budgeted = r["policies"]["exhaustive"], r["policies"]["budgeted"]
    assert exhaustive["pairs_profiled"] > budgeted["pairs_profiled"] > 0
    # the first night profiles every job: 12 solo profiles at the stated assumptions, plus the pairs
    a = r["assumptions"]
    solo_s = 12 * (a["profile_startup_s"] + 7 * a["profile_s_per_config"])
    assert exhaustive["profiling_gpu_s_first_night"] == pytest.approx(solo_s + 66 * a["pair_profile_s"], rel=0.2)
    assert r["deadline_misses"] == budgeted["deadline_misses"]
    assert 0 < r["night_plan_s"] < 10
