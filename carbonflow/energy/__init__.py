"""carbonflow.energy: devices (NVML, simulated, CPU), monitor windows, power-limit control, accounting.

Every energy figure carries a label: ``measured`` (hardware counter), ``estimated`` (a model) or
``simulated`` (replayed Zeus measurements). Nothing simulated or estimated is reported as measured.
"""

from carbonflow.energy.accounting import (
    SoloProfile,
    codecarbon_annual_average_gco2_per_kwh,
    device_energies,
    emissions_breakdown,
    emissions_g,
    energy_intervals_from_measurement,
    energy_intervals_from_trace,
    merge_measurements,
    shared_gpu_shares,
    split_shared_gpu_energy_j,
    total_energy_j,
)
from carbonflow.energy.device import Device
from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.errors import EnergyError, NvmlUnavailable, PowerLimitNotPermitted, PowerLimitRestoreFailed
from carbonflow.energy.monitor import EnergyMonitor, Measurement, PowerSampler
from carbonflow.energy.power_limit import (
    PowerLimitOutcome,
    applied_power_limit,
    repair_leased_gpus,
    restore_from_journal,
    restore_stale_journals,
)
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
    "codecarbon_annual_average_gco2_per_kwh",
    "device_energies",
    "discover_devices",
    "emissions_breakdown",
    "emissions_g",
    "energy_intervals_from_measurement",
    "energy_intervals_from_trace",
    "merge_measurements",
    "repair_leased_gpus",
    "restore_from_journal",
    "restore_stale_journals",
    "shared_gpu_shares",
    "split_shared_gpu_energy_j",
    "total_energy_j",
]
