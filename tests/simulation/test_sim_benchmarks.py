"""Cluster sizing and the cluster benchmarks end to end on small files written here."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from carbonflow.simulation import (
    ClusterSpec,
    DeviceModel,
    Experiment,
    FifoPolicy,
    JobTrace,
    calibrate_gpus,
    constant_grid,
    load_pair_table,
    simulate,
)

REPO = Path(__file__).resolve().parents[2]


def _trace(n: int = 300, seed: int = 0) -> JobTrace:
    rng = np.random.default_rng(seed)
    return JobTrace(
        origin=datetime(2017, 10, 9, tzinfo=UTC),
        submit_s=np.cumsum(rng.exponential(120.0, n)),
        duration_s=rng.choice([300.0, 1200.0, 3600.0], n),
        num_gpus=rng.choice([1, 1, 2, 4], n).astype(np.int64),
        vc=rng.integers(0, 3, n).astype(np.int64),
        vc_names=["a", "b", "c"],
        source="test",
    )


def test_calibrated_cluster_is_the_smallest_meeting_the_queue_target() -> None:
    pairs = load_pair_table()
    exp = Experiment.build(_trace(), pairs, DeviceModel.for_pairs(pairs), constant_grid(100.0), ClusterSpec(gpus=4))
    target = 600.0
    g = calibrate_gpus(exp, target, statistic="mean", hi=400)

    def mean_queue(gpus: int) -> float:
        r = simulate(exp.context(ClusterSpec(gpus=gpus)), FifoPolicy())
        return float(np.mean(r.start_s - r.submit_s))

    assert mean_queue(g) <= target
    assert mean_queue(g - 1) > target
    with pytest.raises(ValueError, match="statistic='p99'"):
        calibrate_gpus(exp, target, statistic="p99")


def _write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    tr = _trace(400, seed=1)
    trace_csv = tmp_path / "philly.csv"
    with trace_csv.open("w") as fh:
        fh.write("timestamp,duration,num_gpus,gpu_time,cluster\n")
        for s, d, g, v in zip(tr.submit_s, tr.duration_s, tr.num_gpus, tr.vc, strict=True):
            ts = (tr.origin + timedelta(seconds=float(s))).strftime("%Y-%m-%d %H:%M:%S")
            fh.write(f"{ts},{d},{g},{d * g},{tr.vc_names[v]}\n")
    carbon_csv = tmp_path / "grid.csv"
    t0 = datetime(2020, 10, 8, tzinfo=UTC)
    rows = [
        f"{(t0 + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%MZ')},{300 + 150 * np.sin(h / 24 * 2 * np.pi):.1f}"
        for h in range(24 * 6)
    ]
    carbon_csv.write_text("start_utc,gco2_per_kwh\n" + "\n".join(rows) + "\n")
    return trace_csv, carbon_csv


@pytest.mark.slow
def test_cluster_benchmark_writes_its_table_json_and_plot(tmp_path: Path) -> None:
    trace_csv, carbon_csv = _write_inputs(tmp_path)
    out = tmp_path / "cluster.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "cluster.py"),
            "--trace",
            str(trace_csv),
            "--carbon",
            str(carbon_csv),
            "--gpus",
            "24",
            "--quick",
            "--start",
            "2017-10-09",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "carbonflow vs FIFO" in proc.stdout
    data = json.loads(out.read_text())
    assert set(data["policies"]) >= {"fifo", "power-limit", "colocation", "carbon-shift", "carbonflow"}
    for row in data["policies"].values():
        for key in ("energy_j", "emissions_g", "mean_jct_s", "p95_jct_s", "deadline_misses"):
            assert key in row
    assert data["energy_reduction_vs_fifo"] == pytest.approx(
        1 - data["policies"]["carbonflow"]["energy_j"] / data["policies"]["fifo"]["energy_j"]
    )
    assert "mean_jct_increase_vs_fifo" in data and data["cluster"]["gpus"] == 24
    # carbon beside GPU energy, with the capping-only row beside the joint one (the split)
    assert data["carbon_reduction_vs_fifo"] == pytest.approx(
        1 - data["policies"]["carbonflow"]["emissions_g"] / data["policies"]["fifo"]["emissions_g"]
    )
    assert data["capping_only_energy_reduction_vs_fifo"] == pytest.approx(
        1 - data["policies"]["power-limit-capacity"]["energy_j"] / data["policies"]["fifo"]["energy_j"]
    )
    assert set(data["split"]) >= {"power-limit-capacity", "carbonflow-no-shift", "carbonflow"}
    assert "carbon vs FIFO" in proc.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_published_cluster_replay_keeps_its_guards_and_reports_carbon() -> None:
    """The committed cluster.json (simulated): >= 5 % GPU energy, <= +3.2 % mean JCT, 0 misses; carbon beside."""
    data = json.loads((REPO / "benchmarks" / "results" / "cluster.json").read_text())
    assert data["energy_reduction_vs_fifo"] >= 0.05
    assert data["mean_jct_increase_vs_fifo"] <= 0.032
    assert data["deadline_misses"] == 0
    assert data["carbon_reduction_vs_fifo"] == data["policies"]["carbonflow"]["emissions_reduction_vs_fifo"] > 0
    assert "capping_only_carbon_reduction_vs_fifo" in data and "simulated" in data["label"]
    assert data["night_planner"]["run"] is False and "plan_night" in data["night_planner"]["why"]


@pytest.mark.slow
def test_cluster_scale_benchmark_reports_seconds(tmp_path: Path) -> None:
    trace_csv, carbon_csv = _write_inputs(tmp_path)
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "cluster_scale.py"),
            "--trace",
            str(trace_csv),
            "--carbon",
            str(carbon_csv),
            "--sizes",
            "2000",
            "20000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["jobs"] for r in data["rows"]] == [2000, 20000]
    assert data["seconds_1m_jobs"] is None  # not run here
    assert all(r["seconds"] > 0 for r in data["rows"])
