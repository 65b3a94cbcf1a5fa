"""benchmarks/chase.py (issue #23, "Chase's setting"): a reduced run, its keys and internal consistency, and
that every choice it scores is plan_job's (counted, and changed when plan_job is swapped)."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from carbonflow.domain import Forecast, ForecastPoint

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "chase.py"
DATA = REPO.parent / "shared" / "data" / "zeus"
needs_data = pytest.mark.skipif(not (DATA / "carbon_hist.csv").exists(), reason="shared Zeus data not present")
QUICK = {"limit_starts": 3, "error_seeds": (0,)}
SEEDS = 5  # Zeus's imagenet/resnet50 b256 runs that reached 65 %


def _bench():
    spec = importlib.util.spec_from_file_location("chase_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def quick(bench) -> dict:
    return bench.run(DATA, **QUICK)


@needs_data
def test_keys_and_targets_are_consistent(quick, bench):
    keys = ["power_limit_only_carbon_reduction", "time_to_accuracy_increase", "finish_by_12h_carbon_reduction"]
    keys += ["finish_by_12h_misses", "label", "seeds", "forecast_error_seeds", "starts", "met", "why_not_met"]
    for key in keys:
        assert key in quick, key
    assert "replayed" in quick["label"]
    t = quick["targets"]
    assert quick["met"] == {
        "power_limit_only_carbon_reduction": quick["power_limit_only_carbon_reduction"]
        >= t["power_limit_only_carbon_reduction"],
        "time_to_accuracy_increase": quick["time_to_accuracy_increase"] <= t["time_to_accuracy_increase"],
        "finish_by_12h_carbon_reduction": quick["finish_by_12h_carbon_reduction"]
        >= t["finish_by_12h_carbon_reduction"],
        "finish_by_12h_misses": quick["finish_by_12h_misses"] == 0,
    }
    assert set(quick["why_not_met"]) == {k for k, ok in quick["met"].items() if not ok}
    primary = quick["by_forecast"][quick["primary_forecast"]]
    assert quick["power_limit_only_carbon_reduction"] == primary["power_limit_only"]["carbon_reduction"]
    assert quick["finish_by_12h_misses"] == primary["finish_by_12h"]["misses"]
    assert quick["finish_by_12h_epochs_from_history_misses"] == primary["finish_by_12h_epochs_from_history"]["misses"]
    n = quick["starts"]["count"] * SEEDS
    assert quick["starts"]["count"] == QUICK["limit_starts"] and len(quick["seeds"]) == SEEDS
    assert primary["power_limit_only"]["runs"] == n * len(QUICK["error_seeds"])


@needs_data
def test_figures_agree_with_the_measurements(quick, bench):
    """Power limits alone start at once, so the time increase is the chosen limit's measured slowdown."""
    setting = bench.load_setting(DATA)
    plo = quick["by_forecast"]["perfect"]["power_limit_only"]
    assert plo["mean_start_delay_h"] == 0.0
    [pl] = plo["power_limits_chosen_w"]
    t = setting.time_per_epoch_s
    assert plo["time_to_accuracy_increase"] == pytest.approx(t[pl] / t[setting.max_limit_w] - 1)
    assert quick["planner_agrees_with_choose_power_limit"] == (pl == quick["choose_power_limit_w"])


@needs_data
def test_no_choice_beats_the_exhaustive_ceiling(quick):
    ceiling = quick["finish_by_12h_exhaustive_ceiling_carbon_reduction"]
    for arms in quick["by_forecast"].values():
        for name, s in arms.items():
            assert s["carbon_reduction"] <= ceiling + 1e-4, name
    # the product's own search with known intensity and no slowdown bound comes within 0.005 of the ceiling (60 s
    # grid here); not to it: its safer-start guard (windows.START_GUARD_Z) keeps a later start only when the gain
    # beats the forecast error the product's model assumes, even on a perfect forecast
    assert quick["finish_by_12h_ceiling_carbon_reduction"] == pytest.approx(ceiling, abs=5e-3)


@needs_data
def test_finish_by_target_unreachable_in_chase_setting(quick):
    """Finding: twice Chase's cut (27.2 %) cannot be had here: the least-energy limit saves ~19 % and the MISO
    intensity barely moves in 12 h, so even the exhaustive ceiling stays below it. Reported, not tuned away."""
    assert (
        quick["finish_by_12h_exhaustive_ceiling_carbon_reduction"] < quick["targets"]["finish_by_12h_carbon_reduction"]
    )
    assert "unreachable" in quick["why_not_met"]["finish_by_12h_carbon_reduction"]


@needs_data
def test_every_scored_choice_is_plan_jobs(bench, monkeypatch):
    calls = []
    real = bench.plan_job

    def counting(*args, **kwargs):
        calls.append(args[0].finish_by)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "plan_job", counting)
    doc = bench.run(DATA, **QUICK)
    pairs = QUICK["limit_starts"] * SEEDS
    arms_per_provider = 4  # power limits alone, finish-by, finish-by at max_slowdown 0.025, epochs from history
    providers = 1 + len(QUICK["error_seeds"])  # perfect foresight + each error seed
    assert len(calls) == pairs * (arms_per_provider * providers + 1)  # + the perfect-foresight ceiling arm
    assert sum(f is None for f in calls) == pairs * providers  # power limits alone: no finish_by
    assert doc["power_limit_only_carbon_reduction"] > 0.05

    def default_limit(spec, profile, forecast, now, *a, **kw):
        """A planner that always answers the default 300 W at once: the benchmark must score exactly that."""
        plan = real(spec.model_copy(update={"max_slowdown": 0.0}), profile, forecast, now, *a, **kw)
        return plan.model_copy(update={"start": now})

    monkeypatch.setattr(bench, "plan_job", default_limit)
    swapped = bench.run(DATA, **QUICK)
    assert swapped["power_limit_only_carbon_reduction"] == pytest.approx(0.0, abs=1e-12)
    assert swapped["finish_by_12h_carbon_reduction"] == pytest.approx(0.0, abs=1e-12)


def test_window_ending_cuts_the_last_slot(bench):
    t0 = datetime(2022, 10, 20, 6, 20, tzinfo=UTC)
    points = [
        ForecastPoint(start=t0 + timedelta(minutes=30 * i), length_s=1800, gco2_per_kwh=600 + i) for i in range(4)
    ]
    forecast = Forecast(region="X", provider="test", signal_kind="marginal", issued_at=t0, points=points)
    cut = bench.window_ending(forecast, t0 + timedelta(minutes=70))
    assert [p.length_s for p in cut.points] == [1800, 1800, 600]
    assert cut.points[-1].end == t0 + timedelta(minutes=70)


def test_bad_signal_is_refused_by_name(bench):
    with pytest.raises(ValueError, match=r"signal='hist2'.*'hist'"):
        bench.load_setting(DATA, "hist2")


@needs_data
def test_unknown_epochs_make_no_misses(quick):
    """Told only the other seeds' epochs, the planner keeps room for the most a run may need: no run (some
    need more epochs than the mean it plans the cost with) finishes after finish_by."""
    for arms in quick["by_forecast"].values():
        assert arms["finish_by_12h_epochs_from_history"]["misses"] == 0
    assert quick["finish_by_12h_misses"] == 0


def test_any_schedule_bound_by_hand(bench):
    """Two 1-h slots at 100 and 300 gCO2/kWh; 2 epochs due in 2 h; a slow limit (1 epoch/h at 100 W) and a fast
    one (2 epochs/h at 250 W). Best: the fast limit in the clean hour only, 0.25 kWh x 100 = 25 g (the slow limit
    in both hours emits 0.1 x 100 + 0.1 x 300 = 40 g)."""
    from types import SimpleNamespace

    t0 = datetime(2022, 10, 20, tzinfo=UTC)
    actuals = [
        ForecastPoint(start=t0 + timedelta(hours=h), length_s=3600, gco2_per_kwh=v) for h, v in ((0, 100), (1, 300))
    ]
    setting = SimpleNamespace(limits_w=[100.0, 250.0], time_per_epoch_s={100.0: 3600.0, 250.0: 1800.0},
                              power_w={100.0: 100.0, 250.0: 250.0})  # fmt: skip
    base = [bench.Run(t0, 250.0, 3600.0, 0.0, 50.0)]  # a baseline of 50 g
    cut = bench.any_schedule_bound(setting, actuals, [(t0, 1, 2)], base, slack_h=1.0)
    assert cut == pytest.approx(1 - 25.0 / 50.0)


@needs_data
def test_any_schedule_bound_is_above_every_plan_and_below_the_target(quick):
    bound = quick["finish_by_12h_any_schedule_bound_carbon_reduction"]
    assert bound >= quick["finish_by_12h_exhaustive_ceiling_carbon_reduction"] - 1e-9
    for arms in quick["by_forecast"].values():
        for name, s in arms.items():
            assert s["carbon_reduction"] <= bound + 1e-9, name
    assert bound < quick["targets"]["finish_by_12h_carbon_reduction"]
    assert "physically unreachable" in quick["why_not_met"]["finish_by_12h_carbon_reduction"]
