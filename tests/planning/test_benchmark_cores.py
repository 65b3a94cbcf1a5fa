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
from carbonflow.models import Forecast, ForecastPoint
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
    assert bias[2] == pytest.approx(0.1321)  # NESO's forecasts 12-24 h ahead ran 13 % high


@pytest.mark.skipif(not (DATA / "zeus/summary_train.csv").exists(), reason="shared Zeus data not present")
def test_nightly_ceiling_on_a_flat_night_is_the_least_energy_within_the_bound():
    nc = _load("nightly_carbon")
    now = datetime(2024, 3, 1, 18, tzinfo=UTC)
    flat = Forecast(region="GB", provider="actual", signal_kind="average-lifecycle", issued_at=now,
                    points=[ForecastPoint(start=now + timedelta(hours=h), length_s=3600, gco2_per_kwh=200.0)
                            for h in range(24)])  # fmt: skip
    types = nc.job_types()
    night = nc.Night(0, 7, now, flat, {t.name: t for t in types})
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


def test_vs_zeus_charges_profiling_by_zeus_rule_unless_told_otherwise():
    from types import SimpleNamespace

    vz = _load("vs_zeus")
    dataset = next(iter(vz.SAMPLES_PER_EPOCH))
    w = SimpleNamespace(power_limits=[100, 150, 200, 250], dataset=dataset)
    assert vz.PROFILING_RULE == "zeus"
    assert vz.profile_slice_epochs(w, 64) == pytest.approx(0.25)  # 1/|P| of the first epoch per limit, as Zeus
    vz.PROFILING_RULE = "own"
    own = min(vz.PROFILE_STEPS * 64 / vz.SAMPLES_PER_EPOCH[dataset], 0.25)
    assert vz.profile_slice_epochs(w, 64) == pytest.approx(own)
