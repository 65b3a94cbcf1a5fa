"""Errors raised by carbonflow.energy."""

from __future__ import annotations


class EnergyError(Exception):
    """Base class for energy measurement and power-limit errors."""


class NvmlUnavailable(EnergyError):
    """NVML cannot be used here (library absent, driver not loaded, no GPU)."""


class PowerLimitNotPermitted(EnergyError):
    """This process may not change the power limit (no privilege, unsupported device, MIG, ...).

    The run continues at the current limit and its result says "power limit not applied".
    """


class PowerLimitRestoreFailed(EnergyError):
    """A previous power limit could not be restored after retries (reported loudly)."""


class GpuLeaseUnavailable(EnergyError):
    """No GPU could be leased: every GPU the run may use is held by another run (the message says which)."""
