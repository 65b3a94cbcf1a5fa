"""carbonflow.energy: devices (NVML, simulated, CPU), monitor windows, power-limit control.

What a run's energy is charged, and its emissions, are in :mod:`carbonflow.accounting`.

Every energy figure carries a label: ``measured`` (hardware counter), ``estimated`` (a model) or
``simulated`` (replayed Zeus measurements). Nothing simulated or estimated is reported as measured.
"""

from carbonflow.energy.device import Device
from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.errors import EnergyError, NvmlUnavailable, PowerLimitNotPermitted, PowerLimitRestoreFailed
from carbonflow.energy.monitor import EnergyMonitor, Measurement, PowerSampler
from carbonflow.energy.simulated import SLOWDOWN_ENV, SimulatedGpu, ZeusPowerModel

_POWER_LIMIT_NAMES = (
    "PowerLimitOutcome", "applied_power_limit", "repair_leased_gpus", "restore_from_journal", "restore_stale_journals",
)  # fmt: skip


def __getattr__(name: str) -> object:
    """The power-limit names, imported on first use: ``python -m carbonflow.energy.power_limit restore`` (the
    restore pods' and operators' command) then runs that module once, without runpy's double-import warning."""
    if name in _POWER_LIMIT_NAMES:
        from carbonflow.energy import power_limit

        return getattr(power_limit, name)
    raise AttributeError(f"module 'carbonflow.energy' has no attribute {name!r}")


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
    "ZeusPowerModel",
    "applied_power_limit",
    "discover_devices",
    "repair_leased_gpus",
    "restore_from_journal",
    "restore_stale_journals",
]
