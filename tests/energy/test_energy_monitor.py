"""Named nestable windows and the background power sampler."""

from __future__ import annotations

import csv
import time

import pytest

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.cpu import CpuDevice
from carbonflow.energy.monitor import EnergyMonitor, PowerSampler
from carbonflow.energy.simulated import SimulatedGpu


class FakeClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def test_nested_windows_per_device_with_labels():
    clock = FakeClock()
    gpus = [SimulatedGpu(SimulatedGpuSpec(), index=i, clock=clock) for i in range(2)]
    p = gpus[0].power_model.average_power_w(250)
    mon = EnergyMonitor(gpus, clock=clock)
    mon.begin_window("run")
    clock.t += 2
    mon.begin_window("epoch1")
    clock.t += 3
    inner = mon.end_window("epoch1")
    clock.t += 1
    outer = mon.end_window("run")
    assert inner.elapsed_s == pytest.approx(3) and outer.elapsed_s == pytest.approx(6)
    assert inner.energy_j == {g.id: pytest.approx(3 * p) for g in gpus}
    assert outer.total_j == pytest.approx(2 * 6 * p)
    assert outer.labels == {g.id: "simulated" for g in gpus}
    assert outer.total_labels == ["simulated"]
    assert outer.energy_by_kind_j() == {"gpu": pytest.approx(12 * p)}
    assert outer.mean_power_w()[gpus[0].id] == pytest.approx(p)
    assert outer.start_utc.tzinfo is not None and outer.end_utc >= outer.start_utc


def test_a_window_read_while_open_stays_open():
    clock = FakeClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(), clock=clock)
    p = gpu.power_model.average_power_w(250)
    mon = EnergyMonitor([gpu], clock=clock)
    mon.begin_window("run")
    clock.t += 2
    so_far = mon.read_window("run")  # a budgeted run's energy while it runs
    clock.t += 3
    assert so_far.elapsed_s == pytest.approx(2) and so_far.total_j == pytest.approx(2 * p)
    assert mon.open_windows == ["run"]
    assert mon.end_window("run").total_j == pytest.approx(5 * p)
    with pytest.raises(ValueError, match="window name='run' is not open"):
        mon.read_window("run")


def test_mixed_labels_are_kept_apart():
    gpu = SimulatedGpu(SimulatedGpuSpec())
    cpu = CpuDevice(force_estimate=True)
    mon = EnergyMonitor([gpu, cpu])
    mon.begin_window("w")
    time.sleep(0.05)
    m = mon.end_window("w")
    assert m.total_labels == ["estimated", "simulated"]
    by_label = m.energy_by_label_j()
    assert set(by_label) == {"estimated", "simulated"}
    assert by_label["simulated"] == m.energy_j[gpu.id]


def test_window_name_errors():
    mon = EnergyMonitor([SimulatedGpu(SimulatedGpuSpec())])
    mon.begin_window("a")
    with pytest.raises(ValueError, match="name='a' is already open"):
        mon.begin_window("a")
    with pytest.raises(ValueError, match="name='b' is not open; open windows: \\['a'\\]"):
        mon.end_window("b")
    mon.end_window("a")
    assert mon.open_windows == []


def test_duplicate_device_rejected():
    g = SimulatedGpu(SimulatedGpuSpec())
    with pytest.raises(ValueError, match="lists a device twice"):
        EnergyMonitor([g, g])


def test_window_context_manager():
    mon = EnergyMonitor([SimulatedGpu(SimulatedGpuSpec())])
    with mon.window("train") as out:
        time.sleep(0.01)
    assert out["measurement"].elapsed_s >= 0.01


def test_power_sampler_writes_trace(tmp_path):
    gpus = [SimulatedGpu(SimulatedGpuSpec(gpu_model="P100"), index=i) for i in range(2)]
    gpus[1].set_power_limit_w(150)
    path = tmp_path / "trace" / "power.csv"
    with PowerSampler(gpus, 0.05, path) as sampler:
        time.sleep(0.33)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["timestamp_utc", "device_id", "label", "power_w", "energy_j"]
    assert 5 <= sampler.samples <= 10
    assert len(rows) == 2 * sampler.samples
    by_dev = {g.id: [r for r in rows if r["device_id"] == g.id] for g in gpus}
    assert float(by_dev[gpus[1].id][0]["power_w"]) == pytest.approx(gpus[1].power_model.average_power_w(150), abs=1e-3)
    energies = [float(r["energy_j"]) for r in by_dev[gpus[0].id]]
    assert energies == sorted(energies) and energies[-1] > energies[0]
    assert all(r["label"] == "simulated" for r in rows)
    assert rows[0]["timestamp_utc"].endswith("+00:00")


def test_sampler_rejects_bad_interval(tmp_path):
    with pytest.raises(ValueError, match="interval_s=0 "):
        PowerSampler([], 0, tmp_path / "x.csv")
