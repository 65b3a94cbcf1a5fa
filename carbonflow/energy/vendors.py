"""The GPU-vendor seam: which vendor's GPUs a run measures, and how a training is pinned to them.

As in Zeus (``get_gpus()``), discovery asks the registered vendors in order and the first whose GPUs are found
wins; the vendor owns its visible-devices variable (NVIDIA: ``CUDA_VISIBLE_DEVICES``; an AMD vendor would own
``HIP_VISIBLE_DEVICES``). Built in: ``nvidia`` (NVML, :mod:`carbonflow.energy.nvidia`) and ``simulated`` (replayed
Zeus measurements, used when a job asks for simulated GPUs and no hardware vendor found any).

A new vendor is one module defining a :class:`GpuVendor` and one line, ``register_gpu_vendor(MyVendor())``
(see docs/architecture.md, "Extending carbonflow"). The built-in vendors are named here as ``module:attribute``
and imported on first use, so this module imports none of them (no import circle).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.device import Device
from carbonflow.energy.errors import EnergyError

logger = logging.getLogger(__name__)


class GpuVendorUnavailable(EnergyError):
    """A vendor's library or driver cannot be used here (discovery moves on to the next vendor)."""


@runtime_checkable
class GpuVendor(Protocol):
    """One GPU vendor: how its GPUs are found and how a training is pinned to some of them.

    ``visible_devices_env``: the variable its runtime reads to pick GPUs (None: nothing to pin). ``durable``: its
    GPUs' state (power limits) outlives the process, so runs lease them. ``simulated``: discovery uses it only for
    a job that asks for simulated GPUs, after the hardware vendors found none.
    """

    name: str
    visible_devices_env: str | None
    durable: bool
    simulated: bool

    def discover(self, *, visible: str | None = None, simulated: SimulatedGpuSpec | None = None) -> list[Device]:
        """The GPUs this process may use (``visible``: the visible-devices value, default the environment's);
        raises :class:`GpuVendorUnavailable` (or ``NvmlUnavailable``) when the vendor's library cannot be used."""
        ...

    def pin(self, env: Mapping[str, str], gpus: Sequence[Device]) -> dict[str, str]:
        """``env`` with a training pinned to exactly ``gpus`` (all of this vendor)."""
        ...


_BUILTIN: dict[str, str] = {
    "nvidia": "carbonflow.energy.nvidia:NVIDIA",
    "simulated": "carbonflow.energy.vendors:SIMULATED",
}
GPU_VENDORS: dict[str, GpuVendor | str] = dict(_BUILTIN)
"""Every vendor by name, in discovery order: an instance, or ``module:attribute`` imported on first use."""


def register_gpu_vendor(vendor: GpuVendor, *, first: bool = False) -> None:
    """Make ``vendor`` known to discovery and pinning (``first``: ask it before the others). A name taken by
    another vendor is refused."""
    if not isinstance(vendor, GpuVendor):
        raise TypeError(f"{vendor!r} is not a GpuVendor; it needs name, visible_devices_env, durable, simulated, "
                        "discover() and pin()")  # fmt: skip
    known = GPU_VENDORS.get(vendor.name)
    if known is not None and known is not vendor:
        raise ValueError(f"GPU vendor name={vendor.name!r} is taken; choose another name")
    if first:
        others = {k: v for k, v in GPU_VENDORS.items() if k != vendor.name}
        GPU_VENDORS.clear()
        GPU_VENDORS.update({vendor.name: vendor, **others})
    else:
        GPU_VENDORS[vendor.name] = vendor


def unregister_gpu_vendor(name: str) -> None:
    """Remove a registered vendor (for tests that register a toy one); the built-in ones stay."""
    if name in _BUILTIN:
        raise ValueError(f"GPU vendor {name!r} is built in and cannot be unregistered")
    GPU_VENDORS.pop(name, None)


def gpu_vendor(name: str) -> GpuVendor:
    """The vendor called ``name``."""
    entry = GPU_VENDORS.get(name)
    if entry is None:
        raise ValueError(f"GPU vendor={name!r} is not allowed; use one of {', '.join(GPU_VENDORS)}")
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = GPU_VENDORS[name] = getattr(importlib.import_module(module), attr)
    return entry


def gpu_vendors() -> list[GpuVendor]:
    """Every vendor, in discovery order."""
    return [gpu_vendor(name) for name in list(GPU_VENDORS)]


def vendor_of(gpu: Any) -> GpuVendor:
    """The vendor of a discovered GPU: its ``vendor`` attribute, else ``simulated`` for a simulated-labelled GPU
    and ``nvidia`` otherwise (GPUs made before vendors had names)."""
    name = getattr(gpu, "vendor", None) or ("simulated" if getattr(gpu, "label", "") == "simulated" else "nvidia")
    return gpu_vendor(name)


def get_gpus(
    simulated: SimulatedGpuSpec | None = None, *, visible: str | None = None, prefer_simulated: bool = False
) -> list[Device]:
    """The GPUs a run measures: those of the first hardware vendor that finds any (honouring its visible-devices
    variable, or ``visible``), else the simulated vendor's when ``simulated`` is given, else none.
    ``prefer_simulated`` skips the hardware vendors when ``simulated`` is given (benchmarks, demos on GPU hosts)."""
    vendors = gpu_vendors()
    if not (prefer_simulated and simulated is not None):
        for vendor in (v for v in vendors if not v.simulated):
            try:
                gpus = vendor.discover(visible=visible, simulated=None)
            except EnergyError as exc:  # NvmlUnavailable, GpuVendorUnavailable: this vendor cannot be used here
                logger.info("%s", exc)
                continue
            if gpus:
                return list(gpus)
    if simulated is None:
        return []
    for vendor in (v for v in vendors if v.simulated):
        gpus = vendor.discover(visible=None, simulated=simulated)
        if gpus:
            return list(gpus)
    return []


def pin(env: Mapping[str, str], gpus: Sequence[Any]) -> dict[str, str]:
    """``env`` with the training pinned to ``gpus``, each vendor setting its own visible-devices variable."""
    out = dict(env)
    by_vendor: dict[str, list[Any]] = {}
    for gpu in gpus:
        by_vendor.setdefault(vendor_of(gpu).name, []).append(gpu)
    for name, group in by_vendor.items():
        out = gpu_vendor(name).pin(out, group)
    return out


class SimulatedVendor:
    """Simulated GPUs replaying Zeus's measurements: nothing to pin (their state lives in the wrapper)."""

    name = "simulated"
    visible_devices_env = None
    durable = False
    simulated = True

    def discover(self, *, visible: str | None = None, simulated: SimulatedGpuSpec | None = None) -> list[Device]:
        if simulated is None:
            return []
        from carbonflow.energy.simulated import SimulatedGpu

        return [SimulatedGpu(simulated, index=i) for i in range(simulated.count)]

    def pin(self, env: Mapping[str, str], gpus: Sequence[Device]) -> dict[str, str]:
        return dict(env)


SIMULATED = SimulatedVendor()
