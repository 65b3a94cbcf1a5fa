"""Inputs of the cluster simulator: Philly-format traces, families, the shipped Gavel table, devices, grids."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from carbonflow.energy.simulated import ZeusPowerModel
from carbonflow.simulation import (
    GAVEL_TO_ZEUS,
    CarbonGrid,
    DeviceModel,
    TraceError,
    constant_grid,
    derive_families,
    grid_from_trace_file,
    load_pair_table,
    load_philly_csv,
    synthetic_trace,
)
from carbonflow.simulation.families import assign_job_types

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def write_trace(path: Path, rows: list[tuple[str, float, int, str]]) -> Path:
    with path.open("w") as fh:
        fh.write(HEADER)
        for ts, dur, g, vc in rows:
            fh.write(f"{ts},{dur},{g},{dur * g},{vc}\n")
    return path


def test_philly_trace_is_sorted_windowed_and_zero_based(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.csv",
        [
            ("2017-10-09 10:00:00", 100.0, 1, "vcA"),
            ("2017-10-09 09:00:00", 50.0, 2, "vcB"),
            ("2017-10-10 09:00:00", 70.0, 1, "vcA"),
            ("2017-10-09 11:00:00", 0.0, 1, "vcA"),
        ],
    )
    tr = load_philly_csv(path, start=datetime(2017, 10, 9, tzinfo=UTC), end=datetime(2017, 10, 10, tzinfo=UTC))
    assert len(tr) == 3
    assert tr.origin == datetime(2017, 10, 9, 9, tzinfo=UTC)
    assert tr.submit_s.tolist() == [0.0, 3600.0, 7200.0]
    assert tr.duration_s.tolist() == [50.0, 100.0, 1.0]  # a 0 s job holds its GPU for the 1 s resolution
    assert tr.num_gpus.tolist() == [2, 1, 1]
    assert [tr.vc_names[v] for v in tr.vc] == ["vcB", "vcA", "vcA"]
    assert tr.label == "replayed"


def test_philly_trace_drops_jobs_larger_than_the_cluster(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.csv", [("2017-10-09 10:00:00", 10.0, 1, "a"), ("2017-10-09 10:01:00", 10.0, 64, "a")]
    )
    tr = load_philly_csv(path, max_gpus=8)
    assert tr.num_gpus.tolist() == [1]
    assert any("more than 8 GPUs" in n for n in tr.notes)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("timestamp,duration,num_gpus\n2017-10-09 10:00:00,1,1\n", "cluster"),
        (HEADER + "yesterday,1,1,1,a\n", "timestamp='yesterday'"),
        (HEADER + "2017-10-09 10:00:00,abc,1,1,a\n", "duration/num_gpus"),
        (HEADER + "2017-10-09 10:00:00,5,0,0,a\n", "num_gpus=0"),
        (HEADER, "no jobs"),
    ],
)
def test_bad_trace_files_name_the_problem(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_philly_csv(path)


def test_missing_trace_and_naive_window_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a readable file"):
        load_philly_csv(tmp_path / "nope.csv")
    path = write_trace(tmp_path / "t.csv", [("2017-10-09 10:00:00", 10.0, 1, "a")])
    with pytest.raises(TraceError, match=r"start=.*no time zone"):
        load_philly_csv(path, start=datetime(2017, 10, 9))


def test_synthetic_trace_draws_from_the_base_distributions(tmp_path: Path) -> None:
    rows = [(f"2017-10-09 10:{m:02d}:00", 60.0 * (m + 1), 1 + (m % 2), "ab"[m % 2]) for m in range(20)]
    base = load_philly_csv(write_trace(tmp_path / "t.csv", rows))
    syn = synthetic_trace(base, 500, seed=3)
    assert len(syn) == 500 and syn.label == "synthetic"
    assert np.all(np.diff(syn.submit_s) >= 0)
    assert set(np.unique(np.diff(syn.submit_s))) <= set(np.unique(np.diff(base.submit_s)))
    pairs_base = set(zip(base.duration_s.tolist(), base.num_gpus.tolist(), strict=True))
    assert set(zip(syn.duration_s.tolist(), syn.num_gpus.tolist(), strict=True)) <= pairs_base
    with pytest.raises(TraceError, match="n_jobs=0"):
        synthetic_trace(base, 0)


def test_families_group_same_vc_gpus_and_similar_duration(tmp_path: Path) -> None:
    rows = [
        ("2017-10-09 10:00:00", 900.0, 1, "a"),
        ("2017-10-09 11:00:00", 910.0, 1, "a"),  # same family: same VC, GPUs, duration bucket
        ("2017-10-09 12:00:00", 900.0, 1, "b"),  # other VC
        ("2017-10-09 13:00:00", 900.0, 2, "a"),  # other GPU count
        ("2017-10-09 14:00:00", 5000.0, 1, "a"),  # other duration
        ("2017-10-09 15:00:00", 905.0, 1, "a"),
    ]
    tr = load_philly_csv(write_trace(tmp_path / "t.csv", rows))
    fam = derive_families(tr)
    f = fam.family.tolist()
    assert f[0] == f[1] == f[5]
    assert len({f[0], f[2], f[3], f[4]}) == 4
    assert fam.recurrence.tolist() == [0, 1, 0, 0, 0, 2]
    assert fam.recurring_share == pytest.approx(3 / 6)
    types = assign_job_types(fam, 26, seed=1)
    assert types[0] == types[1] == types[5]
    with pytest.raises(TraceError, match="duration_ratio=1"):
        derive_families(tr, duration_ratio=1.0)


def test_shipped_gavel_table_matches_its_csv() -> None:
    pairs = load_pair_table()
    text = (resources.files("carbonflow.simulation") / "data" / "gavel_pairs_v100.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    assert len(pairs) == 26 and len(rows) == 26 * 26
    assert int(np.sum(~np.isfinite(pairs.keep))) == sum(r["pair_ok"] == "0" for r in rows)
    for r in rows[::37]:
        a, b = pairs.index(r["job_a"]), pairs.index(r["job_b"])
        if r["pair_ok"] == "1":
            assert pairs.keep[a, b] == pytest.approx(float(r["norm_tput_a"]))
            assert pairs.runnable(a, b)
        else:
            assert not np.isfinite(pairs.keep[a, b])
    assert set(pairs.models) <= set(GAVEL_TO_ZEUS)
    with pytest.raises(ValueError, match="job_type='nope'"):
        pairs.index("nope")


def test_devices_replay_zeus_curves_and_cap_shared_power() -> None:
    pairs = load_pair_table()
    dev = DeviceModel.for_pairs(pairs, shared_power_factor=1.2)
    t = pairs.index("ResNet-50 (batch size 64)")
    zeus = ZeusPowerModel.load("V100", *GAVEL_TO_ZEUS["ResNet-50"])
    assert dev.default_power_limit_w == zeus.max_power_w
    p, slow = dev.solo(t, 150.0)
    assert p == pytest.approx(zeus.average_power_w(150.0))
    assert slow == pytest.approx(zeus.time_per_epoch_s(150.0) / zeus.time_per_epoch_s(zeus.max_power_w))
    assert slow > 1.0
    assert dev.shared_power_w(100.0, 80.0, 250.0) == pytest.approx(120.0)
    assert dev.shared_power_w(200.0, 180.0, 150.0) == 150.0  # never above the power limit
    with pytest.raises(ValueError, match=r"shared_power_factor=0\.5"):
        DeviceModel.for_pairs(pairs, shared_power_factor=0.5)


def test_grid_integrals_wrap_and_vectorise() -> None:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    grid = CarbonGrid(start, 3600.0, np.array([100.0, 300.0]), "X", "average-lifecycle", "test")
    assert grid.integral(0, 3600) == pytest.approx(100 * 3600)
    assert grid.integral(1800, 5400) == pytest.approx(100 * 1800 + 300 * 1800)
    assert grid.integral(0, 3 * 7200) == pytest.approx(3 * 400 * 3600)  # repeats after its end
    t0 = np.array([0.0, 1800.0, 100.0])
    t1 = np.array([3600.0, 5400.0, 20000.0])
    assert grid.integral_many(t0, t1) == pytest.approx([grid.integral(a, b) for a, b in zip(t0, t1, strict=True)])
    assert grid.emissions_g(1000.0, 0, 3600) == pytest.approx(1.0 * 100)  # 1 kWh at 100 g/kWh
    grid.align(datetime(2017, 1, 1, 1, tzinfo=UTC))  # same calendar position in 2020: the second slot
    assert grid.intensity_at(0) == 300.0
    flat = constant_grid(250.0)
    assert flat.integral(0, 10) == pytest.approx(2500.0)


def test_grid_from_a_carbon_csv_and_its_forecast(tmp_path: Path) -> None:
    path = tmp_path / "gb.csv"
    t = datetime(2020, 10, 9, tzinfo=UTC)
    lines = ["start_utc,gco2_per_kwh"] + [
        f"{(t + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%MZ')},{100 + 10 * h}" for h in range(72)
    ]
    path.write_text("\n".join(lines) + "\n")
    grid = grid_from_trace_file(path, origin=datetime(2017, 10, 9, 2, tzinfo=UTC))
    assert grid.step_s == 3600.0
    assert grid.intensity_at(0) == pytest.approx(120.0)  # 2017-10-09 02:00 -> 2020-10-09 02:00
    fc = grid.forecast(0.0, 6 * 3600)
    assert fc.replay and fc.points[0].gco2_per_kwh == pytest.approx(120.0)
    assert fc.points[0].start == datetime(2017, 10, 9, 2, tzinfo=UTC)
    assert grid.forecast(10.0, 6 * 3600) is fc  # one object per slot
