"""carbonflow's one start search (carbon.windows.search_starts): the same function behind plan_job, plan_night,
choose_start, the cluster simulator and the benchmarks."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from carbonflow.carbon import windows
from carbonflow.carbon.windows import choose_start, search_starts
from carbonflow.domain import Forecast, ForecastPoint
from carbonflow.planning import night, optimizer, pairs, start_search
from carbonflow.simulation import policies

T0 = datetime(2024, 3, 1, 18, tzinfo=UTC)


def hourly(values: list[float], start: datetime = T0) -> Forecast:
    points = [
        ForecastPoint(start=start + timedelta(hours=i), length_s=3600, gco2_per_kwh=v) for i, v in enumerate(values)
    ]
    return Forecast(region="GB", provider="test", signal_kind="average-direct", issued_at=start, points=points)


def test_hand_checked_windows_of_two_runs_at_once() -> None:
    # values 100, 100, 40, 40, 100, 100: a 1 h run is best at 2 h, a 2 h run at 2 h (40 mean)
    found = search_starts(hourly([100, 100, 40, 40, 100, 100]), [3600.0, 7200.0], T0, [5 * 3600.0, 4 * 3600.0])
    for run, want_s, want_mean in ((0, 7200.0, 40.0), (1, 7200.0, 40.0)):
        sel = found.run == run
        k = int(np.argmin(np.where(sel, found.score_gco2_per_kwh, np.inf)))
        assert found.start_s[k] == want_s and found.mean_gco2_per_kwh[k] == pytest.approx(want_mean)
    # the run started at once is a candidate with the forecast's own mean
    now = (found.run == 1) & (found.start_s == 0.0)
    assert found.mean_gco2_per_kwh[now][0] == pytest.approx(100.0)


def test_delay_cost_trades_carbon_for_waiting() -> None:
    forecast = hourly([100, 90, 80, 70, 80, 90, 100])
    free = search_starts(forecast, [3600.0], T0, [6 * 3600.0], step_s=3600.0)
    assert free.start_s[free.best()] == 3 * 3600.0
    # waiting costs 20 gCO2/kWh per hour, more than the 10 an hour gains: start at once
    priced = search_starts(forecast, [3600.0], T0, [6 * 3600.0], step_s=3600.0, delay_cost_per_s=20.0 / 3600.0)
    assert priced.start_s[priced.best()] == 0.0


def test_a_run_without_room_gets_no_candidate_and_edges_hold_only_when_asked() -> None:
    forecast = hourly([100, 50])
    found = search_starts(forecast, [3600.0, 3600.0], T0, [-1.0, 3600.0])
    assert set(found.run.tolist()) == {1}
    # a 3 h run is not covered by a 2 h forecast unless the last value is held
    assert search_starts(forecast, [3 * 3600.0], T0, [0.0]).start_s.size == 0
    held = search_starts(forecast, [3 * 3600.0], T0, [0.0], hold_edges=True)
    assert held.mean_gco2_per_kwh[0] == pytest.approx((100 + 50 + 50) / 3)


def test_plan_job_and_choose_start_pick_the_same_start() -> None:
    from tests.planning.planning_factories import NOW, make_profile, make_spec

    values = [300.0] * 4 + [80.0] * 4 + [300.0] * 40
    forecast = hourly(values, NOW)
    spec = make_spec(hours=12, max_slowdown=0.0, objective="carbon")
    profile = make_profile()
    plan = optimizer.plan_job(spec, profile, forecast, NOW)
    choice = choose_start(forecast, plan.predicted_duration_s, NOW, spec.finish_by, robust=False)
    assert plan.start == choice.start


def test_every_planner_path_calls_the_one_search() -> None:
    for module in (optimizer, night, pairs, policies):
        source = inspect.getsource(module)
        assert "IntensityIntegral" not in source and "choose_start_with_delay_cost" not in source
    assert "plan_starts(" in inspect.getsource(optimizer.plan_job)
    assert "search_starts(" in inspect.getsource(start_search.plan_starts)
    assert "pair_starts(" in inspect.getsource(pairs.pair_option)  # a co-located pair's joint starts
    assert "search_starts(" in inspect.getsource(start_search.pair_starts)


def test_a_two_segment_window_also_starts_where_its_first_segment_ends_on_a_boundary() -> None:
    # A 2 h run whose first 30 min is one segment (a pair's overlap), hourly slots: besides the starts on a boundary
    # (0, 1 h, ...) and ending on one, the starts at 30 min past each hour end the first segment on a boundary.
    forecast = hourly([100, 100, 40, 40, 100, 100])
    whole = search_starts(forecast, [7200.0], T0, [4 * 3600.0], guard_z=0.0)
    split = search_starts(forecast, [7200.0], T0, [4 * 3600.0], guard_z=0.0, split_s=1800.0)
    assert set(whole.start_s) == {0.0, 3600.0, 7200.0, 10800.0, 14400.0}
    assert set(split.start_s) == set(whole.start_s) | {1800.0, 5400.0, 9000.0, 12600.0}
    # the means are over the whole run either way
    k = int(np.flatnonzero(split.start_s == 5400.0)[0])
    assert split.mean_gco2_per_kwh[k] == pytest.approx((1800 * 100 + 3600 * 40 + 1800 * 40) / 7200)
    assert "search_starts(" in inspect.getsource(windows.choose_start)
    assert "search_starts(" in inspect.getsource(policies)
