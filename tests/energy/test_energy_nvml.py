"""NVML GPUs driven through the fake pynvml (no GPU here): units, identity, counters, MIG, errors."""

from __future__ import annotations

import logging
import time

import pytest

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy import applied_power_limit, discover_devices
from carbonflow.energy.errors import EnergyError, NvmlUnavailable, PowerLimitNotPermitted
from carbonflow.energy.nvml import nvml_devices, nvml_init


def test_units_converted_mj_to_j_and_mw_to_w(fake_nvml):
    fake_nvml.setup(
        [
            {
                "energy_mj": 123456,
                "load_power_mw": 0,
                "min_limit_mw": 125000,
                "max_limit_mw": 275500,
                "default_limit_mw": 250000,
                "limit_mw": 240000,
            },
        ]
    )
    (gpu,) = nvml_devices()
    assert gpu.label == "measured" and gpu.kind == "gpu"
    assert gpu.energy_j() == pytest.approx(123.456)
    assert gpu.power_w() == 0.0
    assert gpu.power_limit_constraints_w() == (125.0, 275.5)
    assert gpu.default_power_limit_w() == 250.0
    assert gpu.power_limit_w() == 240.0
    fake_nvml.update(0, load_power_mw=87654)
    assert gpu.power_w() == pytest.approx(87.654)


def test_set_power_limit_sends_milliwatts_and_reads_back(fake_nvml):
    fake_nvml.setup([{}])
    (gpu,) = nvml_devices()
    gpu.set_power_limit_w(175.5)
    assert fake_nvml.limits_mw() == [175500]
    assert gpu.power_limit_w() == 175.5
    assert fake_nvml.state()["set_calls"][-1][:2] == [gpu.id, 175500]


def test_out_of_range_limit_names_value_and_range(fake_nvml):
    fake_nvml.setup([{}])
    (gpu,) = nvml_devices()
    with pytest.raises(ValueError, match=r"power_limit_w=50 .*100 W to 300 W"):
        gpu.set_power_limit_w(50)
    assert fake_nvml.limits_mw() == [300000]


def test_energy_counter_advances_with_power(fake_nvml):
    fake_nvml.setup([{"load_power_mw": 200000, "limit_mw": 150000}])
    (gpu,) = nvml_devices()
    e0 = gpu.energy_j()
    time.sleep(0.2)
    e1 = gpu.energy_j()
    # capped by the limit: 150 W over ~0.2 s
    assert 150 * 0.19 <= e1 - e0 <= 150 * 0.6


def test_counter_reset_keeps_energy_monotonic(fake_nvml, caplog):
    fake_nvml.setup([{"energy_mj": 5_000_000}])
    (gpu,) = nvml_devices()
    assert gpu.energy_j() == pytest.approx(5000.0)
    fake_nvml.update(0, energy_mj=1_000)  # driver reload: counter restarts near zero
    with caplog.at_level(logging.WARNING):
        after = gpu.energy_j()
    assert after == pytest.approx(5001.0)
    assert any("counter reset" in n for n in gpu.notes)
    fake_nvml.update(0, energy_mj=3_000)
    assert gpu.energy_j() == pytest.approx(5003.0)


def test_pre_volta_integrates_power_samples(fake_nvml):
    fake_nvml.setup([{"arch": 4, "name": "Tesla P100-PCIE-16GB", "load_power_mw": 100000}])
    (gpu,) = nvml_devices()
    assert any("integrated from power samples" in n for n in gpu.notes)
    e0 = gpu.energy_j()
    time.sleep(0.2)
    e1 = gpu.energy_j()
    assert 100 * 0.19 <= e1 - e0 <= 100 * 0.6
    assert gpu.label == "measured"


def test_counter_not_supported_falls_back_to_sampling(fake_nvml):
    fake_nvml.setup([{"energy_supported": False, "load_power_mw": 50000}])
    (gpu,) = nvml_devices()
    assert any("integrated" in n for n in gpu.notes)
    e0 = gpu.energy_j()
    time.sleep(0.1)
    assert gpu.energy_j() > e0


def test_cuda_visible_devices_indices_and_uuids(fake_nvml):
    state = fake_nvml.setup([{}, {}, {}])
    uuids = [d["uuid"] for d in state["devices"]]
    assert [g.id for g in nvml_devices("2,0")] == [uuids[2], uuids[0]]
    assert [g.index for g in nvml_devices("2,0")] == [2, 0]
    assert [g.id for g in nvml_devices(f"{uuids[1]},{uuids[0]}")] == [uuids[1], uuids[0]]
    # CUDA accepts unique UUID prefixes, with or without the GPU- prefix
    assert [g.id for g in nvml_devices(uuids[2][:14])] == [uuids[2]]
    assert [g.id for g in nvml_devices("")] == []
    assert [g.id for g in nvml_devices()] == uuids


def test_cuda_visible_devices_from_environment(fake_nvml, monkeypatch):
    state = fake_nvml.setup([{}, {}])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.id for g in nvml_devices()] == [state["devices"][1]["uuid"]]
    assert [g.id for g in nvml_devices(all_devices=True)] == [d["uuid"] for d in state["devices"]]


def test_mixed_models_with_indices_warn_about_cuda_device_order(fake_nvml, monkeypatch, caplog):
    fake_nvml.setup([{"name": "NVIDIA A40"}, {"name": "Tesla V100-SXM2-32GB"}])
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with caplog.at_level(logging.WARNING):
        nvml_devices("1")
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in caplog.text
    caplog.clear()
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    with caplog.at_level(logging.WARNING):
        nvml_devices("1")
    assert "CUDA_DEVICE_ORDER" not in caplog.text


def test_invalid_visible_entry_stops_enumeration_like_cuda(fake_nvml, caplog):
    state = fake_nvml.setup([{}, {}])
    with caplog.at_level(logging.WARNING):
        gpus = nvml_devices("1,7,0")
    assert [g.id for g in gpus] == [state["devices"][1]["uuid"]]
    assert "names no single GPU" in caplog.text


def test_mig_mode_flagged_device_level(fake_nvml):
    state = fake_nvml.setup(
        [
            {"arch": 7, "name": "NVIDIA A100-SXM4-40GB", "mig_mode": 1, "mig_devices": ["MIG-1111-2222"]},
            {"arch": 7, "name": "NVIDIA A100-SXM4-40GB"},
        ]
    )
    gpus = nvml_devices()
    assert gpus[0].mig and not gpus[1].mig
    assert any("device-level" in n for n in gpus[0].notes)
    # a MIG instance named in CUDA_VISIBLE_DEVICES resolves to its parent GPU, flagged
    (mig,) = nvml_devices("MIG-1111-2222")
    assert mig.id == state["devices"][0]["uuid"] and mig.mig and mig.mig_instance_uuid == "MIG-1111-2222"


def test_mig_limit_note(fake_nvml, journal_dir):
    fake_nvml.setup([{"arch": 7, "mig_mode": 1}])
    with applied_power_limit(nvml_devices(), 200) as outcome:
        assert outcome.applied and "whole GPU, all instances" in outcome.notes[-1]


def test_no_permission_is_surfaced(fake_nvml):
    fake_nvml.setup([{"set_permission": False}])
    (gpu,) = nvml_devices()
    with pytest.raises(PowerLimitNotPermitted, match="no permission"):
        gpu.set_power_limit_w(200)


def test_no_permission_degrades_plan_without_crash(fake_nvml, journal_dir):
    fake_nvml.setup([{}, {"set_permission": False}])
    gpus = nvml_devices()
    with applied_power_limit(gpus, 200) as outcome:
        assert not outcome.applied
        assert any(n.startswith("power limit not applied") for n in outcome.notes)
        # the first GPU was put back at once: the run continues at the current limits
        assert fake_nvml.limits_mw() == [300000, 300000]
    assert fake_nvml.limits_mw() == [300000, 300000]


def test_limits_not_supported(fake_nvml):
    fake_nvml.setup([{"limits_supported": False}])
    (gpu,) = nvml_devices()
    assert not gpu.supports_power_limit
    with pytest.raises(PowerLimitNotPermitted, match="not supported"):
        gpu.power_limit_w()
    with applied_power_limit([gpu], 200) as outcome:
        assert not outcome.applied and "does not support" in outcome.notes[0]


def test_library_absent_real_pynvml_gives_clear_error(monkeypatch):
    """On this machine the real nvidia-ml-py cannot find libnvidia-ml.so.1."""
    from carbonflow.energy import nvml

    monkeypatch.setattr(nvml, "_initialised", False)
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 is not installed"):
        nvml_init()


def test_fake_library_absent_and_driver_not_loaded(fake_nvml):
    fake_nvml.setup([{}], library="absent")
    with pytest.raises(NvmlUnavailable, match="not installed"):
        nvml_init()
    fake_nvml.setup([{}], library="driver_not_loaded")
    with pytest.raises(NvmlUnavailable, match="driver is not loaded"):
        nvml_init()


def test_discovery_prefers_nvml_then_simulated(fake_nvml):
    fake_nvml.setup([{}, {}])
    devs = discover_devices(SimulatedGpuSpec(count=3), include_cpu=False)
    assert [d.label for d in devs] == ["measured", "measured"]
    sims = discover_devices(SimulatedGpuSpec(count=3), include_cpu=False, prefer_simulated=True)
    assert [d.label for d in sims] == ["simulated"] * 3


def test_discovery_without_nvml_uses_simulated_or_nothing(fake_nvml):
    fake_nvml.setup([], library="absent")
    devs = discover_devices(SimulatedGpuSpec(count=2), include_cpu=False)
    assert [d.label for d in devs] == ["simulated", "simulated"]
    assert len({d.id for d in devs}) == 2
    assert discover_devices(None, include_cpu=False) == []


def test_lost_gpu_reads_raise_energy_error(fake_nvml):
    fake_nvml.setup([{}])
    (gpu,) = nvml_devices()
    fake_nvml.update(0, lost=True)
    with pytest.raises(EnergyError, match="cannot read"):
        gpu.energy_j()
