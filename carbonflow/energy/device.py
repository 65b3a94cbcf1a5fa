"""One interface for every energy-measuring device (DESIGN.md "Devices").

A device has a stable identity (``id``: NVML UUID, or a UUID-like id for simulated and CPU
devices), a human ``model`` name, a ``kind`` (gpu/cpu) and a ``label`` saying how its energy is
obtained: ``measured`` (hardware counter), ``estimated`` (a model, e.g. codecarbon's CPU model)
or ``simulated`` (replayed Zeus measurements). Energy is a cumulative counter in joules that
never goes backwards; windows subtract two readings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from carbonflow.domain import DeviceKind, EnergyLabel
from carbonflow.energy.errors import PowerLimitNotPermitted

LIMIT_TOLERANCE_W = 0.5
"""Read-back tolerance when checking a limit that was just set (NVML rounds to whole mW/W)."""


class Device(ABC):
    """An energy-measuring device: a GPU (NVML or simulated) or the CPU package(s)."""

    id: str
    model: str
    kind: DeviceKind
    label: EnergyLabel
    vendor: str = ""
    """The GPU vendor's name in :mod:`carbonflow.energy.vendors` (``nvidia``, ``simulated``, ...); empty for a CPU."""
    supports_power_limit: bool = False
    mig: bool = False
    """True when the GPU runs in MIG mode: energy is device-level (all instances), not per instance."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @abstractmethod
    def energy_j(self) -> float:
        """Cumulative energy since an arbitrary origin (J); monotonic non-decreasing."""

    @abstractmethod
    def power_w(self) -> float:
        """Current (or most recent interval's) power draw (W)."""

    # Power limits: GPUs override these; devices without limits refuse clearly.
    def power_limit_constraints_w(self) -> tuple[float, float]:
        """(min, max) power limit this device accepts (W)."""
        raise PowerLimitNotPermitted(f"{self.describe()} has no settable power limit")

    def default_power_limit_w(self) -> float:
        """The device's default power limit (W)."""
        raise PowerLimitNotPermitted(f"{self.describe()} has no settable power limit")

    def power_limit_w(self) -> float:
        """The power limit in force now (W)."""
        raise PowerLimitNotPermitted(f"{self.describe()} has no settable power limit")

    def set_power_limit_w(self, limit_w: float) -> None:
        """Set the power limit (W); raises PowerLimitNotPermitted or ValueError (out of range)."""
        raise PowerLimitNotPermitted(f"{self.describe()} has no settable power limit")

    def check_power_limit_w(self, limit_w: float) -> None:
        """Raise ValueError naming the value and the allowed range if ``limit_w`` is not accepted."""
        low, high = self.power_limit_constraints_w()
        if not isinstance(limit_w, int | float) or limit_w != limit_w:  # NaN
            raise ValueError(f"power_limit_w={limit_w!r} is not a number; use watts between {low:g} and {high:g}")
        if not low - 1e-9 <= limit_w <= high + 1e-9:
            raise ValueError(
                f"power_limit_w={limit_w:g} is outside the allowed range of {self.describe()}: {low:g} W to {high:g} W"
            )

    def describe(self) -> str:
        """Short human description, e.g. ``gpu GPU-1234… (Tesla V100, measured)``."""
        return f"{self.kind} {self.id} ({self.model}, {self.label})"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"
