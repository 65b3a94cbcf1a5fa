"""benchmarks/nightly_carbon.py (issue #23): the fair reference by hand, the published-forecast evenings, and
that the joint row is the product's plan_night on every night it scores (counted, and changed when swapped)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from carbonflow.domain import Forecast, ForecastPoint
from carbonflow.units import J_PER_KWH

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("/work/shared/data")
needs_data = pytest.mark.skipif(not (DATA / "zeus/summary_train.csv").exists(), reason="shared Zeus data not present")


def _load():
    spec = importlib.util.spec_from_file_location("nightly_carbon_bench", ROOT / "benchmarks" / "nightly_carbon.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def nc():
    return _load()


def _night(nc, values):
    """A night from 18:00 with hourly intensity ``values`` (24 h), with nightly_carbon's job types."""
    now = datetime(2024, 3, 1, 18, tzinfo=UTC)
    series = Forecast(region="GB", provider="actual", signal_kind="average-lifecycle", issued_at=now,
                      points=[ForecastPoint(start=now + timedelta(hours=h), length_s=3600, gco2_per_kwh=float(v))
                              for h, v in enumerate(values)])  # fmt: skip
    types = nc.job_types()
    return series, types, nc.Night(0, 7, now, series, {t.name: t for t in types})


@needs_data
def test_fair_reference_on_a_flat_night_is_the_least_expected_energy_now(nc):
    flat, types, night = _night(nc, [200.0] * 24)
    jt = next(t for t in types if t.name.startswith("squad"))
    energy, grams, duration, start_s, missed, target_missed = nc.fair_choice(night, jt, flat)
    ref_s = jt.epochs * jt.model.time_per_epoch_s(jt.model.max_power_w)
    _, bs, pl = min(
        (float(np.mean(jt.paths[b])) * m.time_per_epoch_s(p) * m.average_power_w(p), b, p)
        for b, m in jt.models.items()
        for p in m.power_limits_w
        if not np.isnan(jt.paths[b]).any()
        and float(np.mean(jt.paths[b])) * m.time_per_epoch_s(p) <= ref_s * 1.1 * (1 + 1e-9)
    )
    m = jt.models[bs]
    assert duration == pytest.approx(night.epochs_needed(jt.name, bs) * m.time_per_epoch_s(pl))  # tonight's path
    assert energy == pytest.approx(duration * m.average_power_w(pl))
    assert grams == pytest.approx(energy / J_PER_KWH * 200.0)
    assert (start_s, missed, target_missed) == (0.0, False, False)


@needs_data
def test_fair_reference_waits_for_clean_hours_but_leaves_room_for_the_worst_path(nc):
    # dirty until 04:00, then clean: the reference starts as late as the worst path allows, never later
    values = [400.0] * 10 + [50.0] * 14
    series, types, night = _night(nc, values)
    window_s = 12 * 3600
    for jt in types:
        energy, _, duration, start_s, missed, _ = nc.fair_choice(night, jt, series)
        assert not missed
        assert start_s > 0  # it waits for the clean hours
        bs, pl = next(
            (b, p)
            for b, m in jt.models.items()
            for p in m.power_limits_w
            if duration == pytest.approx(night.epochs_needed(jt.name, b) * m.time_per_epoch_s(p))
            and energy == pytest.approx(duration * m.average_power_w(p))
        )
        worst = float(np.max(jt.paths[bs])) * jt.models[bs].time_per_epoch_s(pl)
        assert start_s + worst <= window_s + 1e-6
        # a night clean from 18:00 does not wait
        clean, _, night2 = _night(nc, [50.0] * 10 + [400.0] * 14)
        assert nc.fair_choice(night2, jt, clean)[3] == 0.0


def _write_long(path: Path, issues: int, slots: int = 96, gap_at: int | None = None):
    rows = ["issued_at,slot_start,lead_h,forecast_gco2_per_kwh,actual_gco2_per_kwh"]
    for day in range(issues):
        issued = datetime(2023, 3, 14 + day, 18, 1, tzinfo=UTC)
        for k in range(slots):
            t = datetime(2023, 3, 14 + day, 18, tzinfo=UTC) + timedelta(minutes=30 * k)
            actual = (
                ""
                if gap_at is not None and t == datetime(2023, 3, 14, 18, tzinfo=UTC) + timedelta(minutes=30 * gap_at)
                else 100 + k % 48
            )
            lead = (t + timedelta(minutes=30) - issued).total_seconds() / 3600
            rows.append(f"{issued:%Y-%m-%dT%H:%M:%SZ},{t:%Y-%m-%dT%H:%M:%SZ},{lead:.3f},{200 + k},{actual}")
    path.write_text("\n".join(rows) + "\n")


def test_published_evenings_plan_on_the_issue_and_score_on_the_actuals(nc, tmp_path):
    f = tmp_path / "long.csv"
    _write_long(f, issues=3, gap_at=3)
    filled: list[int] = []
    evenings = list(nc.published_evenings(f, filled))
    assert [e[0] for e in evenings] == [0, 1, 2]
    _, now, forecast, perfect, recent = evenings[1]
    assert now == datetime(2023, 3, 15, 18, 30, tzinfo=UTC)  # the first half-hour after the 18:01 issue
    assert forecast.issued_at == datetime(2023, 3, 15, 18, 1, tzinfo=UTC)
    assert forecast.points[0].start == now and len(forecast.points) == 48  # window + 12 h
    assert forecast.points[0].gco2_per_kwh == 201  # the issue's own forecast for 18:30
    assert perfect.points[0].gco2_per_kwh == 101  # NESO's actual for that slot
    assert recent and recent[-1].end <= now  # only actuals ended by the submit time
    assert filled == [1, 0, 0]  # 19:30 on the first night had no actual: held, and counted


def test_published_evenings_refuse_an_issue_shorter_than_the_window(nc, tmp_path):
    f = tmp_path / "short.csv"
    _write_long(f, issues=1, slots=40)
    with pytest.raises(AssertionError, match="does not cover 24 h"):
        list(nc.published_evenings(f))


@needs_data
@pytest.mark.slow
def test_joint_row_is_plan_nights_on_every_night(nc, monkeypatch):
    """Two published evenings: plan_night is called for the joint row each night, and a plan_night that answers
    the baseline's plans (default limit, b0, now) makes the joint row's reduction exactly 0."""
    calls = []
    real = nc.plan_night

    def counting(specs, *a, **kw):
        calls.append(tuple(s.name for s in specs))
        return real(specs, *a, **kw)

    monkeypatch.setattr(nc, "plan_night", counting)
    out = nc.run_evenings("GB", itertools.islice(nc.published_evenings(), 2), 7)
    assert len(calls) == 2 * 4  # colocation, joint_without_batch_size, joint, hindsight_plan: every night
    assert out["joint"]["runs"] >= 2 * len(nc.job_types())

    def baseline_plans(specs, profiles, forecasts, now, *a, **kw):
        return [
            nc.plan_job(
                s.model_copy(
                    update={
                        "objective": "time",
                        "power_limit_w": profiles[s.name].default_power_limit_w,
                        "batch_sizes": None,
                    }
                ),
                profiles[s.name],
                None,
                now,
            )
            for s in specs
        ]

    monkeypatch.setattr(nc, "plan_night", baseline_plans)
    swapped = nc.run_evenings("GB", itertools.islice(nc.published_evenings(), 2), 7)
    assert swapped["joint"]["carbon_reduction"] == pytest.approx(0.0, abs=1e-12)
    assert swapped["joint_fraction_of_fair_reference"] == pytest.approx(0.0, abs=1e-12)
