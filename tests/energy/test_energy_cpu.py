"""CPU device: RAPL through a powercap tree (same layout as sysfs) when readable, else codecarbon's estimate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from carbonflow.energy.cpu import CpuDevice, find_rapl_domains
from carbonflow.energy.errors import PowerLimitNotPermitted


def _zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 262143328850) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_packages_measured_with_wraparound(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, max_uj=10_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000, max_uj=10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 999)  # sub-zone: inside package-0, not added
    assert [d.name for d in find_rapl_domains(tmp_path)] == ["package-0", "package-1"]
    cpu = CpuDevice(powercap_root=tmp_path)
    assert cpu.label == "measured" and cpu.kind == "cpu"
    e0 = cpu.energy_j()
    (p0 / "energy_uj").write_text("3000000\n")  # +2 J
    (p1 / "energy_uj").write_text("1000000\n")  # wrapped: +(10_000_000 - 5_000_000 + 1 + 1_000_000) uJ
    assert cpu.energy_j() - e0 == pytest.approx(2.0 + 6.000001)


def test_unreadable_powercap_falls_back_to_estimate(tmp_path):
    zone = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (zone / "energy_uj").unlink()  # as when energy_uj is root-only (not readable)
    cpu = CpuDevice(powercap_root=tmp_path)
    assert cpu.label == "estimated"


def test_estimate_on_this_machine_is_labelled_and_bounded():
    cpu = CpuDevice()  # no /sys/class/powercap here
    assert cpu.label == "estimated"
    assert "codecarbon" in cpu.notes[0] and "not a measurement" in cpu.notes[0]
    assert cpu.tdp_w and cpu.tdp_w > 0
    e0 = cpu.energy_j()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    e1 = cpu.energy_j()
    elapsed = 0.3
    # codecarbon's cpu_load model: between 10 % of TDP and TDP
    assert 0.1 * cpu.tdp_w * elapsed * 0.9 <= e1 - e0 <= cpu.tdp_w * (elapsed + 0.2)
    assert 0.1 * cpu.tdp_w * 0.99 <= cpu.power_w() <= cpu.tdp_w * 1.01


def test_cpu_has_no_power_limit():
    cpu = CpuDevice(force_estimate=True)
    assert not cpu.supports_power_limit
    with pytest.raises(PowerLimitNotPermitted):
        cpu.set_power_limit_w(50)


def test_cpu_id_stable():
    assert CpuDevice(force_estimate=True).id == CpuDevice(force_estimate=True).id
