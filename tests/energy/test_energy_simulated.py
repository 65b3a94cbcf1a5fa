"""The simulated GPU replays the shipped Zeus traces exactly at measured limits and interpolates between."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from carbonflow.contract import sim_slowdown
from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.simulated import SLOWDOWN_ENV, SimulatedGpu, ZeusPowerModel, workloads

DATA = Path(__file__).resolve().parents[2] / "carbonflow" / "energy" / "data"
SHARED = Path("/work/shared/data/zeus")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _rows(gpu: str) -> list[dict[str, str]]:
    with (DATA / f"summary_power_{gpu}.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.skipif(not SHARED.exists(), reason="shared data folder not mounted")
@pytest.mark.parametrize("gpu", ["v100", "a40", "rtx6000", "p100"])
def test_shipped_copy_is_byte_identical(gpu):
    assert (DATA / f"summary_power_{gpu}.csv").read_bytes() == (SHARED / f"summary_power_{gpu}.csv").read_bytes()


def test_notice_ships_with_data():
    text = (DATA / "NOTICE.md").read_text()
    assert "Apache License 2.0" in text and "NSDI 2023" in text


def test_exact_at_measured_limits():
    row = next(r for r in _rows("v100") if r["dataset"] == "imagenet" and r["batch_size"] == "128")
    model = ZeusPowerModel.load("V100", "imagenet", "resnet50", 128, "adadelta")
    limit = float(row["power_limit"])
    assert model.average_power_w(limit) == float(row["average_power"])
    assert model.time_per_epoch_s(limit) == float(row["time_per_epoch"])


def test_interpolates_between_limits_and_slowdown():
    model = ZeusPowerModel.load("A40", "cifar100", "shufflenetv2")
    assert model.batch_size == 1024 and model.optimizer == "adadelta"  # Zeus defaults
    lo, hi = model.power_limits_w[0], model.power_limits_w[1]
    mid = (lo + hi) / 2
    assert model.time_per_epoch_s(mid) == pytest.approx((model.times_per_epoch_s[0] + model.times_per_epoch_s[1]) / 2)
    assert model.average_power_w(mid) == pytest.approx((model.average_powers_w[0] + model.average_powers_w[1]) / 2)
    assert model.max_power_w == 300
    assert model.slowdown(300) == 1.0
    assert model.slowdown(100) == pytest.approx(model.times_per_epoch_s[0] / model.times_per_epoch_s[-1])
    assert model.slowdown(100) > 1


def test_bad_workload_inputs_name_value_and_allowed():
    with pytest.raises(ValueError, match=r"dataset/network=mnist/lenet .*cifar100/shufflenetv2"):
        ZeusPowerModel.load("V100", "mnist", "lenet")
    with pytest.raises(ValueError, match=r"batch_size=3 .*use one of"):
        ZeusPowerModel.load("V100", "cifar100", "shufflenetv2", batch_size=3)
    with pytest.raises(ValueError, match=r"optimizer='sgd'"):
        ZeusPowerModel.load("V100", "cifar100", "shufflenetv2", optimizer="sgd")
    with pytest.raises(ValueError, match=r"gpu_model='H100'"):
        ZeusPowerModel.load("H100", "cifar100", "shufflenetv2")
    model = ZeusPowerModel.load("V100", "cifar100", "shufflenetv2")
    with pytest.raises(ValueError, match=r"power_limit_w=260 .*100 W to 250 W"):
        model.average_power_w(260)


def test_default_batch_size_not_measured_falls_back_with_note():
    model = ZeusPowerModel.load("V100", "librispeech", "deepspeech2")  # Zeus b0=256 not in the trace
    assert model.batch_size == 192
    assert "256" in model.notes[0]


def test_every_workload_loads():
    for gpu in ("V100", "A40", "RTX6000", "P100"):
        for dataset, network, bs, opt in workloads(gpu):
            model = ZeusPowerModel.load(gpu, dataset, network, bs, opt)
            assert len(model.power_limits_w) >= 2  # RTX6000 movielens b4 was measured at 250 and 260 W only


def test_energy_counter_advances_with_clock_and_limit():
    clock = FakeClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(gpu_model="V100"), clock=clock)
    model = gpu.power_model
    assert gpu.label == "simulated" and gpu.model == "Tesla V100 (simulated)" and gpu.kind == "gpu"
    assert gpu.power_limit_w() == 250 and gpu.default_power_limit_w() == 250
    e0 = gpu.energy_j()
    clock.t += 10
    assert gpu.energy_j() - e0 == pytest.approx(10 * model.average_power_w(250))
    gpu.set_power_limit_w(150)
    clock.t += 4
    assert gpu.energy_j() - e0 == pytest.approx(10 * model.average_power_w(250) + 4 * model.average_power_w(150))
    assert gpu.power_w() == model.average_power_w(150)
    assert gpu.slowdown_factor() == pytest.approx(model.time_per_epoch_s(150) / model.time_per_epoch_s(250))


def test_idle_accrues_nothing():
    clock = FakeClock()
    gpu = SimulatedGpu(SimulatedGpuSpec(), clock=clock, busy=False)
    clock.t += 100
    assert gpu.energy_j() == 0 and gpu.power_w() == 0
    gpu.set_busy(True)
    clock.t += 1
    assert gpu.energy_j() == pytest.approx(gpu.power_model.average_power_w(250))


def test_ids_stable_and_distinct():
    a = SimulatedGpu(SimulatedGpuSpec(), index=0)
    b = SimulatedGpu(SimulatedGpuSpec(), index=1)
    assert a.id == SimulatedGpu(SimulatedGpuSpec(), index=0).id
    assert a.id != b.id and a.id.startswith("SIM-GPU-")


def test_slowdown_env():
    """The training side's one reading of the fixed slowdown (carbonflow.training paces its steps by it)."""
    assert sim_slowdown({}) == 1.0
    assert sim_slowdown({SLOWDOWN_ENV: "1.25"}) == 1.25
    with pytest.raises(ValueError, match="CARBONFLOW_SIM_SLOWDOWN='fast'"):
        sim_slowdown({SLOWDOWN_ENV: "fast"})
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="positive"):
            sim_slowdown({SLOWDOWN_ENV: bad})
