"""Replay of shipped and user traces, trace shapes, and the shipped forecast-error calibration."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from carbonflow.carbon.base import ProviderUnavailable, RegionNotSupported
from carbonflow.carbon.calibration import (
    CALIBRATION_PATH,
    NESO_FW48H,
    SHARED_CARBONCAST,
    compute,
    default_error_model,
    measure_neso,
)
from carbonflow.carbon.replay import DEFAULT_REPLAY_NAME, NESO_ACTUALS, ReplayProvider
from carbonflow.carbon.traces import load_trace

DATA = Path(__file__).resolve().parents[2] / "carbonflow" / "carbon" / "data"


def test_shipped_data_has_its_notice():
    notice = (DATA / "NOTICE.md").read_text()
    assert "CC BY 4.0" in notice and "nmpowell/carbon-intensity-forecast-tracking" in notice and "MIT" in notice
    assert NESO_FW48H.exists() and NESO_ACTUALS.exists()


def test_default_replay_serves_the_forecast_published_before_now():
    replay = ReplayProvider.default()
    now = datetime(2023, 3, 15, 3, 0, tzinfo=UTC)
    fc = replay.forecast("GB", now)
    rows = pd.read_csv(NESO_FW48H)
    issue = rows[rows["issued_at_utc"] == "2023-03-14T12:01Z"]
    expected = issue[pd.to_datetime(issue["from_utc"], utc=True) >= pd.Timestamp(now)]["forecast_gco2_per_kwh"]
    assert [p.gco2_per_kwh for p in fc.points] == [float(v) for v in expected]
    assert fc.issued_at == datetime(2023, 3, 14, 12, 1, tzinfo=UTC)
    assert fc.replay and fc.provider == DEFAULT_REPLAY_NAME == "replay:neso-gb-2023-03"
    assert fc.signal_kind == "average-direct" and fc.error_mae_by_lead_h
    assert "published" in fc.notes[0]
    later = replay.forecast("national", datetime(2023, 3, 16, 13, 0, tzinfo=UTC), horizon_s=6 * 3600)
    assert later.issued_at == datetime(2023, 3, 16, 12, 1, tzinfo=UTC) and len(later.points) == 12


def test_replay_window_and_out_of_range():
    replay = ReplayProvider.default()
    first, last = replay.replay_window()
    assert first == datetime(2023, 3, 14, 12, 1, tzinfo=UTC)
    assert last == datetime(2023, 3, 18, 12, 0, tzinfo=UTC)
    with pytest.raises(ProviderUnavailable, match="covers 2023-03-14T12:01"):
        replay.forecast("GB", datetime(2023, 3, 1, tzinfo=UTC))
    with pytest.raises(RegionNotSupported, match="allowed: GB"):
        replay.forecast("DE", first)
    with pytest.raises(ValueError, match="no time zone"):
        replay.forecast("GB", datetime(2023, 3, 15))


def test_replay_actuals_are_the_latest_revision():
    replay = ReplayProvider.default()
    pts = replay.actuals("GB", datetime(2023, 3, 13, 12, tzinfo=UTC), datetime(2023, 3, 13, 13, tzinfo=UTC))
    assert [p.gco2_per_kwh for p in pts] == [54.0, 55.0]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _hourly_csv(tmp_path: Path, days: int = 3) -> Path:
    start = pd.Timestamp("2022-01-01T00:00Z")
    lines = ["start_utc,gco2_per_kwh,region,signal_kind"]
    for i in range(days * 24):
        lines.append(
            f"{(start + pd.Timedelta(hours=i)).isoformat()},{200 + 50 * np.sin(i / 24 * 2 * np.pi):.2f},"
            "XX,average-lifecycle"
        )
    return _write(tmp_path, "mine.csv", "\n".join(lines) + "\n")


def test_actuals_only_trace_gets_seeded_synthetic_error(tmp_path):
    path = _hourly_csv(tmp_path)
    now = datetime(2022, 1, 1, 6, 30, tzinfo=UTC)
    noisy = ReplayProvider([path], seed=3).forecast("XX", now, 24 * 3600)
    again = ReplayProvider([path], seed=3).forecast("XX", now, 24 * 3600)
    exact = ReplayProvider([path], synthetic_error=False).forecast("XX", now, 24 * 3600)
    assert noisy.points == again.points, "replay must be reproducible"
    assert noisy.points != exact.points
    assert exact.points[0].start == datetime(2022, 1, 1, 6, 0, tzinfo=UTC)
    assert "synthetic lead-time error" in noisy.notes[0] and noisy.error_mae_by_lead_h
    assert "perfect foresight" in exact.notes[0]
    assert noisy.signal_kind == "average-lifecycle" and noisy.replay and noisy.provider == "replay:mine"


def test_user_forecast_file_is_served_as_published(tmp_path):
    path = _write(
        tmp_path,
        "fc.csv",
        "issued_at_utc,start_utc,gco2_per_kwh,actual_gco2_per_kwh\n"
        "2022-01-01T00:00Z,2022-01-01T00:00Z,100,110\n2022-01-01T00:00Z,2022-01-01T01:00Z,90,95\n"
        "2022-01-01T01:00Z,2022-01-01T01:00Z,80,95\n2022-01-01T01:00Z,2022-01-01T02:00Z,70,60\n",
    )
    replay = ReplayProvider([path])
    fc = replay.forecast("FC", datetime(2022, 1, 1, 1, 30, tzinfo=UTC))
    assert [p.gco2_per_kwh for p in fc.points] == [80.0, 70.0]
    actuals = replay.actuals("FC", datetime(2022, 1, 1, tzinfo=UTC), datetime(2022, 1, 1, 3, tzinfo=UTC))
    assert actuals[-1].gco2_per_kwh == 60


SHAPES = {
    "ger_ci.csv": (
        "Time,Carbon Intensity\n2020-01-01 00:00:00,300.5\n2020-01-01 00:15:00,310.0\n2020-01-01 00:30:00,305.0\n",
        "DE",
        "average-lifecycle",
        900,
    ),
    "NO_2022_hourly.csv": (
        "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
        "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,Data Estimated,"
        "Data Estimation Method\n2022-01-01 00:00:00,Norway,Norway,NO,33.11,63.03,94.86,90.85,entsoe.eu,false,\n"
        "2022-01-01 01:00:00,Norway,Norway,NO,27.06,56.47,96.07,92.12,entsoe.eu,false,\n",
        "NO",
        "average-lifecycle",
        3600,
    ),
    "GB.csv": (
        "zone_datetime,timestamp,carbon_intensity_avg,fossilFuelPercentage\n"
        "2021-10-08T04:00:00.000Z,1633671337.0,231.0,39.43\n2021-10-08T05:00:00.000Z,1633671337.0,240.0,39.0\n",
        "GB",
        "average-lifecycle",
        3600,
    ),
    "carbon_hist.csv": (
        "location,timestamp,duration,value,hist\n"
        "MISO_MASON_CITY,2022-10-20T06:20:00+00:00,30,646.85,619.2\n"
        "MISO_MASON_CITY,2022-10-20T06:50:00+00:00,30,639.68,618.7\n",
        "MISO_MASON_CITY",
        "marginal",
        1800,
    ),
    "fw48h_2023-03-14T1201Z.csv": (
        "from,intensity.forecast,intensity.actual\n2023-03-14T12:00Z,93,\n2023-03-14T12:30Z,91,\n",
        "GB",
        "average-direct",
        1800,
    ),
    "US-CISO_lifecycle_96h.csv": (
        "forecast_run_day_utc,target_time_utc,lead_hour,forecast_lifecycle_gco2_per_kwh,actual_lifecycle_gco2_per_kwh\n"
        "2021-07-01,2021-07-01T00:00:00Z,0,253.58,233.04\n2021-07-01,2021-07-01T01:00:00Z,1,284.15,258.3\n",
        "US-CAL-CISO",
        "average-lifecycle",
        3600,
    ),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_known_shape_loads(tmp_path, name):
    text, region, kind, slot_s = SHAPES[name]
    trace = load_trace(_write(tmp_path, name, text))
    assert (trace.region, trace.signal_kind, trace.slot_s) == (region, kind, slot_s)
    assert trace.actuals.index.tz is not None


def test_direct_emission_factor_and_unknown_shape(tmp_path):
    text = SHAPES["NO_2022_hourly.csv"][0]
    trace = load_trace(_write(tmp_path, "NO_2022_hourly.csv", text), emission_factor="direct")
    assert trace.signal_kind == "average-direct" and trace.actuals.iloc[0] == 33.11
    with pytest.raises(ValueError, match=r"does not recognise.*start_utc,gco2_per_kwh"):
        load_trace(_write(tmp_path, "odd.csv", "a,b\n1,2\n"))
    with pytest.raises(ValueError, match="emission_factor"):
        load_trace(_write(tmp_path, "x.csv", text), emission_factor="both")


def test_shipped_calibration_is_what_the_script_computes():
    shipped = json.loads(CALIBRATION_PATH.read_text())
    old = shipped["superseded"]["neso-gb-national"]  # the former 4-issue fit, kept beside the 91-issue one
    assert {k: v for k, v in old.items() if k not in ("error_calibration_days", "fitted_on")} == measure_neso(
        NESO_FW48H
    )
    assert old["error_calibration_days"] == 4
    assert shipped["error_calibration_days"]["neso-gb-national"] >= 90  # 91 issues, each with published actuals
    if SHARED_CARBONCAST.exists():
        assert shipped == compute()
    model = default_error_model()
    assert list(model.rel_rmse) == [v for v in shipped["pooled"]["rel_rmse"] if v is not None]
    assert 0 < model.phi_per_h < 1


def test_error_model_samples_have_the_calibrated_statistics():
    model = default_error_model()
    lead = np.arange(1, 49, dtype=float)
    actual = np.full((4000, len(lead)), 100.0)
    fc = model.sample(actual, lead, 1.0, np.random.default_rng(0))
    rel = fc / actual - 1
    rms = np.sqrt((rel**2).mean(axis=0))
    assert rms[2] == pytest.approx(model.sigma_rel(3.0), rel=0.1)
    assert rms[40] == pytest.approx(model.sigma_rel(41.0), rel=0.1)
    lag1 = np.corrcoef(rel[:, 30], rel[:, 31])[0, 1]
    assert lag1 == pytest.approx(model.phi_per_h, abs=0.03)


def test_replay_forecast_first_slot_contains_now():
    replay = ReplayProvider.default()
    now = datetime(2023, 3, 15, 3, 10, tzinfo=UTC)
    fc = replay.forecast("GB", now, 3600)
    assert fc.points[0].start <= now < fc.points[0].end
    assert fc.points[-1].start < now + timedelta(hours=1)
