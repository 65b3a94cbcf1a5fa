"""Per-job energy, the shared-GPU split rule and emissions over time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carbonflow.accounting.emissions import (
    emissions_breakdown,
    emissions_g,
)
from carbonflow.accounting.energy import (
    SoloProfile,
    device_energies,
    shared_gpu_shares,
    split_shared_gpu_energy_j,
)
from carbonflow.domain import ForecastPoint, SimulatedGpuSpec
from carbonflow.energy.monitor import EnergyMonitor
from carbonflow.energy.simulated import SimulatedGpu

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def _points(*values: float, length_s: float = 1800) -> list[ForecastPoint]:
    return [
        ForecastPoint(start=T0 + timedelta(seconds=i * length_s), length_s=length_s, gco2_per_kwh=v)
        for i, v in enumerate(values)
    ]


def test_device_energies_labels_shares_and_no_double_count():
    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    gpus = [SimulatedGpu(SimulatedGpuSpec(), index=i, clock=clock) for i in range(2)]
    mon = EnergyMonitor(gpus, clock=clock)
    mon.begin_window("run")
    clock.t = 10
    m = mon.end_window("run")
    out = device_energies(m, [*gpus, gpus[0]], shares={gpus[1].id: 0.25}, power_limits_w={gpus[0].id: 250})
    assert [e.device_id for e in out] == [gpus[0].id, gpus[1].id]
    assert out[0].energy_j == pytest.approx(m.energy_j[gpus[0].id]) and out[0].label == "simulated"
    assert out[1].energy_j == pytest.approx(0.25 * m.energy_j[gpus[1].id]) and out[1].share == 0.25
    assert any("shared device" in n for n in out[1].notes)
    assert out[0].power_limit_w == 250
    with pytest.raises(ValueError, match=r"shares\[.*\]=1.5"):
        device_energies(m, gpus, shares={gpus[0].id: 1.5})


def test_shared_gpu_split_rule_power_alone_times_speed_kept():
    # A memory-bound job drawing 250 W alone that keeps 60 % speed vs a compute job at 150 W keeping 40 %
    jobs = [SoloProfile("memory_bound", 250, 0.6), SoloProfile("compute", 150, 0.4)]
    shares = shared_gpu_shares(jobs)
    assert shares["memory_bound"] == pytest.approx(150 / 210)
    assert shares["compute"] == pytest.approx(60 / 210)
    split = split_shared_gpu_energy_j(1000.0, jobs)
    assert sum(split.values()) == pytest.approx(1000.0)


@given(
    st.lists(
        st.tuples(st.floats(1, 700), st.floats(0.01, 1)),
        min_size=1,
        max_size=6,
    ),
    st.floats(0, 1e7),
)
def test_split_never_counts_twice(params, energy):
    jobs = [SoloProfile(f"j{i}", p, s) for i, (p, s) in enumerate(params)]
    split = split_shared_gpu_energy_j(energy, jobs)
    assert sum(split.values()) == pytest.approx(energy, rel=1e-9, abs=1e-9)
    assert all(v >= 0 for v in split.values())


def test_split_input_errors():
    with pytest.raises(ValueError, match=r"speed_kept=1\.2"):
        SoloProfile("a", 100, 1.2)
    with pytest.raises(ValueError, match="solo_power_w=0"):
        SoloProfile("a", 0, 0.5)
    with pytest.raises(ValueError, match="names a job twice"):
        shared_gpu_shares([SoloProfile("a", 1, 1), SoloProfile("a", 1, 1)])


@given(
    st.lists(st.tuples(st.floats(0, 7200), st.floats(0, 3600), st.floats(0, 1e7)), min_size=1, max_size=8),
    st.floats(0, 1000),
)
def test_constant_intensity_gives_energy_times_intensity(spans, intensity):
    points = _points(*([intensity] * 8))  # 4 h of half-hour slots, all equal
    intervals = [(T0 + timedelta(seconds=a), T0 + timedelta(seconds=a + d), e) for a, d, e in spans]
    total_kwh = sum(e for _, _, e in spans) / 3.6e6
    assert emissions_g(intervals, points) == pytest.approx(total_kwh * intensity, rel=1e-9, abs=1e-9)


def test_emissions_integrate_over_slots():
    # 3.6 MJ (1 kWh) spread over 1 h crossing two half-hour slots at 100 and 300 g/kWh
    intervals = [(T0, T0 + timedelta(hours=1), 3.6e6)]
    assert emissions_g(intervals, _points(100, 300)) == pytest.approx(0.5 * 100 + 0.5 * 300)
    # two intervals with different energy
    intervals = [(T0, T0 + timedelta(minutes=30), 3.6e6), (T0 + timedelta(minutes=30), T0 + timedelta(hours=1), 0.0)]
    assert emissions_g(intervals, _points(100, 300)) == pytest.approx(100)
    # an instant inside the second slot
    assert emissions_g([(T0 + timedelta(minutes=40),) * 2 + (3.6e6,)], _points(100, 300)) == pytest.approx(300)


def test_fallback_only_for_uncovered_time_and_said():
    intervals = [(T0 + timedelta(minutes=30), T0 + timedelta(minutes=90), 3.6e6)]
    result = emissions_breakdown(intervals, _points(100, 300), fallback_gco2_per_kwh=500)
    assert result.emissions_g == pytest.approx(0.5 * 300 + 0.5 * 500)
    assert result.fallback_energy_j == pytest.approx(1.8e6)
    assert "fallback 500 gCO2/kWh" in result.notes[0]
    with pytest.raises(ValueError, match="fall outside the carbon-intensity points"):
        emissions_g(intervals, _points(100, 300))


def test_naive_datetimes_rejected():
    with pytest.raises(ValueError, match="has no time zone"):
        emissions_g([(datetime(2024, 1, 1), datetime(2024, 1, 1, 1), 1.0)], [])
