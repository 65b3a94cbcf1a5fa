"""Issue 24 finding: "The simulated V100's energy follows host wall time: 3118 J in 31 s one night, 1032 J in
11.7 s the next, for the same work and configuration." The simulated GPU now keeps its own clock, driven by the
work: each sample takes the trace's time per sample at the current limit and draws the trace's power meanwhile.
A simulated run's energy, duration and profile windows are read on that clock, so the host's load changes none."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.simulated import SimulatedGpu, ZeusPowerModel
from carbonflow.execution.wrapper import _feed_work, _set_busy, _simulated_window_s

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("simulated_load_bench", ROOT / "benchmarks" / "simulated_load.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class FrozenClock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_simulated_clock_follows_the_work_at_the_current_limit_not_the_host_clock():
    clock = FrozenClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(gpu_model="V100"), clock=clock, busy=False)
    model = ZeusPowerModel.from_spec(SimulatedGpuSpec(gpu_model="V100"))
    gpu.follow_work()
    gpu.set_busy(True)
    gpu.set_power_limit_w(200)
    seconds = gpu.add_work(1000)
    clock.t += 31.0  # a slow night on a busy host: the same 1000 samples
    assert seconds == pytest.approx(1000 * model.time_per_epoch_s(200) / 50_000)  # CIFAR-100: 50,000 per epoch
    assert gpu.simulated_s() == pytest.approx(seconds)
    assert gpu.energy_j() == pytest.approx(seconds * model.average_power_w(200))
    assert gpu.power_w() == pytest.approx(model.average_power_w(200))  # power traces show it training
    gpu.set_power_limit_w(150)
    gpu.add_work(500)
    clock.t += 5.0
    assert gpu.energy_j() == pytest.approx(1000 * model.energy_per_sample_j(200) + 500 * model.energy_per_sample_j(150))
    expected_s = 1000 * model.seconds_per_sample(200) + 500 * model.seconds_per_sample(150)
    assert gpu.simulated_s() == pytest.approx(expected_s)
    assert any("simulated clock" in note for note in gpu.notes)
    with pytest.raises(Exception, match="samples=-1"):
        gpu.add_work(-1)


def test_a_gpu_not_following_work_still_integrates_the_host_clock():
    """The clocked mode (busy/idle over the host's clock) is unchanged for callers that never feed work."""
    clock = FrozenClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(gpu_model="V100"), clock=clock, busy=True)
    clock.t += 2.0
    assert gpu.energy_j() == pytest.approx(2.0 * gpu.power_model.average_power_w(gpu.power_limit_w()))


def test_the_wrapper_splits_the_work_between_the_run_gpus_and_a_report_polled_twice_counts_once():
    clock = FrozenClock()
    gpus = [SimulatedGpu(SimulatedGpuSpec(), index=i, clock=clock, busy=False) for i in range(2)]
    for gpu in gpus:
        gpu.follow_work()
    fed = _feed_work(gpus, 600, 0)
    fed = _feed_work(gpus, 600, fed)  # the same report polled again adds nothing
    _set_busy(gpus, True)
    clock.t += 100.0  # host time passes: nothing accrues on the host clock
    per_sample = gpus[0].power_model.energy_per_sample_j(gpus[0].power_limit_w())
    assert fed == 600
    assert sum(g.energy_j() for g in gpus) == pytest.approx(600 * per_sample)
    assert max(g.simulated_s() for g in gpus) == pytest.approx(_simulated_window_s(gpus, 600))  # 300 samples each


def test_simulated_energy_and_duration_ignore_both_cores_busy():
    """The benchmark in a reduced form: the same small job idle, then next to busy-loop processes (two per core of
    a 2-core machine, so the load shows even where other processes already keep the cores busy)."""
    result = _load_benchmark().simulated_energy_load_sensitivity(steps=300, burners=4)
    assert result["busy"]["samples"] == result["idle"]["samples"] > 0
    assert result["simulated_energy_load_sensitivity"] <= 0.02, result
    assert result["simulated_duration_load_sensitivity"] <= 0.02, result
    assert result["idle"]["duration_s"] == pytest.approx(
        300 * 32 * ZeusPowerModel.from_spec(SimulatedGpuSpec()).seconds_per_sample(200)
    )
