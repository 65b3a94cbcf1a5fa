"""The carbon_windows benchmark runs end to end on a real trace and writes the documented JSON rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = Path("/work/shared/data/carbon/electricitymaps-portal/NO_2022_hourly.csv")


@pytest.mark.slow
@pytest.mark.skipif(not TRACE.exists(), reason="shared Electricity Maps trace not present")
def test_benchmark_quick_on_one_trace(tmp_path):
    spec = importlib.util.spec_from_file_location("carbon_windows_bench", ROOT / "benchmarks" / "carbon_windows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "cw.json"
    doc = module.main(["--quick", "--trace", str(TRACE), "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(doc["summary"]))
    rows = saved["rows"]
    assert {(r["job_h"], r["slack_h"]) for r in rows} == {(j, s) for j in (1, 2, 4) for s in (6, 12, 24)}
    for r in rows:
        assert r["perfect"]["fraction_of_oracle"] == pytest.approx(1.0)
        for kind in ("perfect", "calibrated_error"):
            assert {
                "reduction_vs_run_now",
                "fraction_of_oracle",
                "robust_reduction_vs_run_now",
                "robust_fraction_of_oracle",
            } <= set(r[kind])
        assert r["calibrated_error"]["robust_above_run_now"] < 0.01
    assert saved["vectorised_vs_choose_start_checks"] == 30


def _load():
    spec = importlib.util.spec_from_file_location("carbon_windows_bench", ROOT / "benchmarks" / "carbon_windows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _long_file(path: Path, days: int = 3, error: float = 0.05) -> Path:
    """Hourly issues at 00:00Z, 48 h each, over a daily cycle; the forecast off by a seeded relative error."""
    from datetime import UTC, datetime, timedelta

    rng = np.random.default_rng(3)
    lines = ["issued_at,slot_start,lead_h,forecast_gco2_per_kwh,actual_gco2_per_kwh"]
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    for d in range(days):
        issued = t0 + timedelta(days=d)
        for k in range(48):
            slot = issued + timedelta(hours=k)
            actual = 200 + 80 * np.cos(2 * np.pi * slot.hour / 24)  # highest at the 00:00Z issue, lowest at noon
            forecast = actual * (1 + error * rng.standard_normal())
            lines.append(
                f"{issued:%Y-%m-%dT%H:%M:%SZ},{slot:%Y-%m-%dT%H:%M:%SZ},{k + 1:.3f},{forecast:.2f},{actual:.2f}"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_published_file_is_judged_on_the_products_own_call(tmp_path, monkeypatch):
    cw = _load()
    calls = []
    real = cw.plan_job
    monkeypatch.setattr(
        cw, "plan_job", lambda *a, **k: calls.append(k.get("intensity_history") is None) or real(*a, **k)
    )
    path = _long_file(tmp_path / "synthetic_published.csv")
    doc = cw.main(["--published", str(path), "--out", str(tmp_path / "cw.json")])
    summary = json.loads((tmp_path / "cw.json").read_text())["summary"]
    name = "synthetic_published"
    assert calls and any(calls) and not all(calls)  # plan_job itself, with and without history
    for key in ("product_published_fraction_of_oracle", "product_published_at_issue_fraction_of_oracle"):
        assert 0.5 < summary[key][name] <= 1.0 + 1e-9, (key, summary[key])
    assert 0.5 < summary["product_no_history_fraction_of_oracle"] <= 1.0 + 1e-9
    assert 0.0 <= summary["product_share_of_starts_worse_than_run_now_by_1pct_max"] <= 1.0
    assert summary["error_calibration_days"]["product"]["neso-gb-national"] >= 90
    assert summary["error_calibration_days"]["superseded"]["neso-gb-national"] == 4
    rows = [r for r in doc["rows"] if r["published"]]
    assert {(r["job_h"], r["slack_h"]) for r in rows} == {(j, s) for j in (1, 2, 4) for s in (6, 12, 24)}
    assert all(r["published"]["n_starts"] > 0 for r in rows)
    ages = summary["published_by_hours_since_issue"][name]  # every scored start in exactly one bucket
    assert sum(b["n_starts"] for b in ages.values()) == sum(r["published"]["n_starts"] for r in rows)
    assert "0-5h" in ages and all(b["product_replan_fraction_of_oracle"] <= 1.0 + 1e-9 for b in ages.values())


def test_published_asserts_on_a_start_outside_the_window_instead_of_clamping(tmp_path, monkeypatch):
    from datetime import timedelta

    cw = _load()
    trace = cw.load_published(_long_file(tmp_path / "one.csv", days=1))
    assert trace.slot_s == 3600.0 and trace.signal_kind == "average-direct"
    monkeypatch.setattr(cw, "JOBS_H", (1,))
    monkeypatch.setattr(cw, "SLACKS_H", (6,))
    monkeypatch.setattr(cw, "product_start", lambda fc, dur, now, finish_by, hist: finish_by + timedelta(hours=1))
    with pytest.raises(AssertionError, match="outside"):
        cw.published(trace, 0.0, at_issue_only=True)


def test_published_file_with_wrong_columns_is_refused(tmp_path):
    cw = _load()
    bad = tmp_path / "bad.csv"
    bad.write_text("issued_at,slot_start,forecast\n")
    with pytest.raises(ValueError, match="actual_gco2_per_kwh"):
        cw.load_published(bad)
