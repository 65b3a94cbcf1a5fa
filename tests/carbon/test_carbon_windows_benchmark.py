"""The carbon_windows benchmark runs end to end on a real trace and writes the documented JSON rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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
    assert saved["vectorised_vs_choose_start_checks"] == 5
