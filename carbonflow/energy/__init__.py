"""carbonflow.energy: devices (NVML, simulated, CPU), monitor windows, power-limit control, accounting.

Every energy figure carries a label: ``measured`` (hardware counter), ``estimated`` (a model) or
``simulated`` (replayed Zeus measurements). Nothing simulated or estimated is reported as measured.
"""

from carbonflow.energy.accounting import (
    SoloProfile,
    device_energies,
    emissions_breakdown,
    emissions_g,
    shared_gpu_shares,
    split_shared_gpu_energy_j,
)
from carbonflow.energy.device import Device
from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.errors import EnergyError, NvmlUnavailable, PowerLimitNotPermitted, PowerLimitRestoreFailed
from carbonflow.energy.monitor import EnergyMonitor, Measurement, PowerSampler
from carbonflow.energy.power_limit import PowerLimitOutcome, applied_power_limit, restore_from_journal
from carbonflow.energy.simulated import SLOWDOWN_ENV, SimulatedGpu, ZeusPowerModel

__all__ = [
    "SLOWDOWN_ENV",
    "Device",
    "EnergyError",
    "EnergyMonitor",
    "Measurement",
    "NvmlUnavailable",
    "PowerLimitNotPermitted",
    "PowerLimitOutcome",
    "PowerLimitRestoreFailed",
    "PowerSampler",
    "SimulatedGpu",
    "SoloProfile",
    "ZeusPowerModel",
    "applied_power_limit",
    "device_energies",
    "discover_devices",
    "emissions_breakdown",
    "emissions_g",
    "restore_from_journal",
    "shared_gpu_shares",
    "split_shared_gpu_energy_j",
]
