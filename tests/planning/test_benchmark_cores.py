"""The benchmarks' core computations on hand-checkable cases (carbon_windows, nightly_carbon's ceiling, the
biased forecast error both draw from)."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from carbonflow.carbon.calibration import provider_error, sample_biased
from carbonflow.domain import Forecast, ForecastPoint
from carbonflow.units import J_PER_KWH

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("/work/shared/data")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_carbon_windows_scores_and_per_start_judgement_by_hand():
    cw = _load("carbon_windows")
    run_now, chosen, oracle = np.array([100.0, 100.0]), np.array([90.0, 102.0]), np.array([80.0, 80.0])
    score = cw._score(run_now, chosen, oracle)
    assert score["reduction_vs_run_now"] == pytest.approx(0.04)  # 1 - 192/200
    assert score["fraction_of_oracle"] == pytest.approx(8 / 40)  # (200 - 192) / (200 - 160)
    # pooled, the choice looks 4 % better than run-now; per start one of two is 2 % worse
    judged = cw.per_start(run_now, chosen)
    assert judged == {"share_worse_than_run_now_by_1pct": 0.5, "worst_start_above_run_now": pytest.approx(0.02)}


def test_biased_error_keeps_each_providers_bias_per_lead_time():
    edges, bias, spread, _ = provider_error("neso-gb-national")
    actual = np.full((20_000, 1), 200.0)
    for lead_h in (3.0, 18.0):
        drawn = sample_biased(actual, np.array([lead_h]), 0.5, "neso-gb-national", np.random.default_rng(1))
        i = int(np.searchsorted(edges, lead_h))
        assert drawn.mean() / 200.0 - 1 == pytest.approx(bias[i], abs=0.01)
        assert (drawn / 200.0).std() == pytest.approx(spread[i], rel=0.05)
    # refitted on 91 issues: 12-24 h ahead NESO ran 6.6 % low (4 issues said +13 %)
    assert bias[2] == pytest.approx(-0.0661)


def _flat_night(nc):
    """A night at a flat 200 gCO2/kWh for 24 h from 18:00, with nightly_carbon's job types."""
    now = datetime(2024, 3, 1, 18, tzinfo=UTC)
    flat = Forecast(region="GB", provider="actual", signal_kind="average-lifecycle", issued_at=now,
                    points=[ForecastPoint(start=now + timedelta(hours=h), length_s=3600, gco2_per_kwh=200.0)
                            for h in range(24)])  # fmt: skip
    types = nc.job_types()
    return flat, types, nc.Night(0, 7, now, flat, {t.name: t for t in types})


@pytest.mark.skipif(not (DATA / "zeus/summary_train.csv").exists(), reason="shared Zeus data not present")
def test_nightly_ceiling_on_a_flat_night_is_the_least_energy_within_the_bound():
    nc = _load("nightly_carbon")
    flat, types, night = _flat_night(nc)
    jt = types[0]
    energy, _, start_s, grams = nc.ceiling_choice(night, jt, flat)
    # by hand: every (batch size, limit) tonight, within 10 % of b0 at the default limit
    ep0 = night.epochs_needed(jt.name, jt.b0)
    ref_s = ep0 * jt.model.time_per_epoch_s(jt.model.max_power_w)
    best = min(
        night.epochs_needed(jt.name, bs) * m.time_per_epoch_s(pl) * m.average_power_w(pl)
        for bs, m in jt.models.items()
        for pl in m.power_limits_w
        if np.isfinite(night.epochs_needed(jt.name, bs))
        and night.epochs_needed(jt.name, bs) <= jt.budget_epochs
        and night.epochs_needed(jt.name, bs) * m.time_per_epoch_s(pl) <= ref_s * 1.1 * (1 + 1e-9)
    )
    assert energy == pytest.approx(best)
    assert grams == pytest.approx(energy / J_PER_KWH * 200.0)
    assert start_s == 0.0  # a flat night: ties go to the earliest start


@pytest.mark.skipif(not (DATA / "zeus/summary_train.csv").exists(), reason="shared Zeus data not present")
def test_nightly_bound_on_a_flat_night_chooses_on_expected_epochs_and_pays_tonights():
    nc = _load("nightly_carbon")
    flat, types, night = _flat_night(nc)
    jt = next(t for t in types if t.name.startswith("squad"))
    energy, grams, duration, start_s, missed, target_missed = nc.bound_choice(night, jt, flat)
    # by hand: the (batch size, limit) of least *expected* energy within 10 % of b0's expected time at 250 W
    ref_s = jt.epochs * jt.model.time_per_epoch_s(jt.model.max_power_w)
    _, bs, pl = min(
        (float(np.mean(jt.paths[b])) * m.time_per_epoch_s(p) * m.average_power_w(p), b, p)
        for b, m in jt.models.items()
        for p in m.power_limits_w
        if not np.isnan(jt.paths[b]).any()
        and float(np.mean(jt.paths[b])) * m.time_per_epoch_s(p) <= ref_s * 1.1 * (1 + 1e-9)
    )
    m = jt.models[bs]
    tonight = night.epochs_needed(jt.name, bs)  # ... realised on tonight's epochs at that batch size
    assert duration == pytest.approx(tonight * m.time_per_epoch_s(pl))
    assert energy == pytest.approx(duration * m.average_power_w(pl))
    assert grams == pytest.approx(energy / J_PER_KWH * 200.0)
    assert (start_s, missed, target_missed) == (0.0, False, False)
    # with a margin the latest start leaves room for 1.1 x the most epochs a path needs: on a flat night the
    # choice is the same (it starts now)
    assert nc.bound_choice(night, jt, flat, margin=1.1)[:4] == pytest.approx((energy, grams, duration, 0.0))


def test_nightly_decomposition_adds_up_to_the_distance_from_the_ceiling():
    nc = _load("nightly_carbon")
    r = {"oracle": {"carbon_reduction": 0.40}, "joint": {"carbon_reduction": 0.34}}
    for k, v in zip(nc.BOUNDS, (0.38, 0.36, 0.355), strict=True):
        r[k] = {"carbon_reduction": v}
    d = nc.decomposition(r)
    assert d == pytest.approx(
        {"tonights_epochs": 0.05, "forecast": 0.05, "deadline_margins": 0.0125, "learning_and_rest": 0.0375}
    )
    assert sum(d.values()) == pytest.approx(1 - nc.fraction_of_oracle(r))


def test_carbon_windows_reads_the_long_neso_archive_and_serves_issues_at_most_a_day(tmp_path):
    cw = _load("carbon_windows")
    rows = ["issued_at,slot_start,lead_h,forecast_gco2_per_kwh,actual_gco2_per_kwh"]
    for day in (1, 3):  # 2 March has no issue
        issued = datetime(2023, 3, day, 18, 1, tzinfo=UTC)
        for k in range(96):
            slot = datetime(2023, 3, day, 18, tzinfo=UTC) + timedelta(minutes=30 * k)
            actual = "" if (day, k) == (1, 5) else ("0" if (day, k) == (1, 6) else str(100 + k))
            lead = (slot + timedelta(minutes=30) - issued).total_seconds() / 3600
            rows.append(f"{issued:%Y-%m-%dT%H:%M:%SZ},{slot:%Y-%m-%dT%H:%M:%SZ},{lead:.3f},{150 + k},{actual}")
    path = tmp_path / "long.csv"
    path.write_text("\n".join(rows) + "\n")
    trace = cw.load_neso_long(path)
    assert trace.slot_s == 1800.0 and trace.region == "GB" and trace.has_forecasts
    assert len(trace.forecasts) == 192 and trace.forecasts["issued_at"].nunique() == 2
    assert np.isnan(trace.actuals[datetime(2023, 3, 1, 20, 30, tzinfo=UTC)])  # not published
    assert np.isnan(trace.actuals[datetime(2023, 3, 1, 21, tzinfo=UTC)])  # published as 0: treated as missing
    assert trace.actuals[datetime(2023, 3, 1, 21, 30, tzinfo=UTC)] == 107.0
    # 1-h jobs with 6 h of slack (7 h of slots from the start). Hourly: each issue serves the 24 starts after it
    # (19:00 to 18:00), not the day without an issue; the 1 March starts at 19:00, 20:00 and 21:00 touch the
    # missing actuals: 21 + 24 starts (serving 2 March too would add 17).
    hourly = cw.published(trace, 0.0)
    assert hourly[(1, 6)]["n_starts"] == 45
    # At issue time only: 19:00 on 1 March touches them, 19:00 on 3 March is scored
    assert cw.published(trace, 0.0, at_issue_only=True)[(1, 6)]["n_starts"] == 1


def test_a_conservative_explorer_profiles_no_more_than_its_budget_covers():
    from carbonflow.planning.batch_size import BatchSizeExplorer

    # the default (64) at its best limit costs what the default configuration costs: nothing saved, no profile
    flat = BatchSizeExplorer([32, 64, 128], 64, {64: 10.0}, default_cost_per_epoch=10.0, horizon=20)
    flat.observe(64, 40.0, True, 4.0)
    assert flat.budget() == pytest.approx(0.0)
    assert flat.unprofiled() == [32, 128]  # without a price, as before
    assert flat.unprofiled(profile_cost=5.0) == []
    # 20 % below the default: 19 recurrences x 8 saved + 8 banked = 160 covers 3 profiles of 50, so both
    cheap = BatchSizeExplorer([32, 64, 128], 64, {64: 8.0}, default_cost_per_epoch=10.0, horizon=20)
    cheap.observe(64, 32.0, True, 4.0)
    assert cheap.budget() == pytest.approx(1 * 40.0 - 32.0 + 19 * 8.0)
    assert cheap.unprofiled(profile_cost=50.0) == [32, 128]
    assert cheap.unprofiled(profile_cost=100.0) == [32]
