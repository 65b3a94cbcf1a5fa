"""Issue 24 finding: "The simulated V100's energy follows host wall time: 3118 J in 31 s one night, 1032 J in
11.7 s the next, for the same work and configuration." The simulated GPU now counts energy per sample trained at
the current limit, so the same job at the same configuration costs the same energy on an idle or a busy host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from carbonflow.energy.simulated import SimulatedGpu, ZeusPowerModel
from carbonflow.execution.wrapper import _feed_work
from carbonflow.models import SimulatedGpuSpec

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


def test_simulated_energy_follows_the_samples_trained_not_the_wall_time():
    clock = FrozenClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(gpu_model="V100"), clock=clock, busy=False)
    model = ZeusPowerModel.from_spec(SimulatedGpuSpec(gpu_model="V100"))
    gpu.set_power_limit_w(200)
    gpu.add_samples(1000)
    clock.t += 31.0  # a slow night on a busy host: the same 1000 samples
    assert gpu.energy_j() == pytest.approx(1000 * model.energy_per_epoch_j(200) / 50_000)
    gpu.set_power_limit_w(150)
    gpu.add_samples(500)
    assert gpu.energy_j() == pytest.approx(1000 * model.energy_per_sample_j(200) + 500 * model.energy_per_sample_j(150))
    with pytest.raises(Exception, match="samples=-1"):
        gpu.add_samples(-1)


def test_the_wrapper_feeds_the_samples_and_never_marks_a_work_fed_gpu_busy():
    clock = FrozenClock()
    gpus = [SimulatedGpu(SimulatedGpuSpec(), index=i, clock=clock, busy=False) for i in range(2)]
    fed = _feed_work(gpus, 600, 0)
    fed = _feed_work(gpus, 600, fed)  # the same report polled again adds nothing
    from carbonflow.execution.wrapper import _set_busy

    _set_busy(gpus, True)
    clock.t += 100.0
    per_sample = gpus[0].power_model.energy_per_sample_j(gpus[0].power_limit_w())
    assert fed == 600
    assert sum(g.energy_j() for g in gpus) == pytest.approx(600 * per_sample)


def test_simulated_energy_load_sensitivity_with_both_cores_busy():
    """The benchmark in a reduced form: the same small job idle, then next to two busy-loop processes."""
    result = _load_benchmark().simulated_energy_load_sensitivity(steps=150, burners=2)
    assert result["busy"]["samples"] == result["idle"]["samples"] > 0
    assert result["busy_over_idle_duration"] > 1.05  # the load was real: the training itself took longer
    assert result["simulated_energy_load_sensitivity"] <= 0.02, result
