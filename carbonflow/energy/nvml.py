"""NVIDIA GPUs through NVML (``pynvml`` from nvidia-ml-py). Labelled ``measured``.

Units at the library boundary: energy in mJ, power and power limits in mW; everything carbonflow
exposes is J and W. Devices are identified by UUID and selected through ``CUDA_VISIBLE_DEVICES``
given as indices, GPU UUIDs (or unique UUID prefixes, as CUDA accepts) or MIG UUIDs.

* Energy: ``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer). Older GPUs (or any GPU whose
  counter says NOT_SUPPORTED) fall back to integrating ``nvmlDeviceGetPowerUsage`` samples
  (trapezoids between reads; read often, e.g. through ``PowerSampler``). A counter that goes
  backwards (driver reload, GPU reset) is treated as restarted from zero; nothing is lost or
  counted twice.
* Power limits: constraints, default and current limit; set with the v1 setter
  ``nvmlDeviceSetPowerManagementLimit`` and read back. No permission → ``PowerLimitNotPermitted``
  (the run continues at the current limit).
* MIG: a GPU in MIG mode (or a MIG instance named in ``CUDA_VISIBLE_DEVICES``) is flagged; its
  energy is device-level (all instances together), which the device's notes say.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from carbonflow.energy.device import LIMIT_TOLERANCE_W, Device
from carbonflow.energy.errors import EnergyError, NvmlUnavailable, PowerLimitNotPermitted

logger = logging.getLogger(__name__)

_init_lock = threading.Lock()
_initialised = False


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable("the pynvml module (package nvidia-ml-py) is not installed") from exc
    return pynvml


def _err_value(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def nvml_init() -> Any:
    """Initialise NVML once per process; raise NvmlUnavailable with the reason when it cannot work."""
    global _initialised
    pynvml = _pynvml()
    with _init_lock:
        if _initialised:
            return pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = _err_value(exc)
            if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                reason = "the NVIDIA driver library libnvidia-ml.so.1 is not installed (no NVIDIA GPU here)"
            elif code == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1):
                reason = "the NVIDIA driver is not loaded"
            elif code == getattr(pynvml, "NVML_ERROR_NO_PERMISSION", -1):
                reason = "no permission to access the NVIDIA driver"
            else:
                reason = f"nvmlInit failed: {exc}"
            raise NvmlUnavailable(f"NVML unavailable: {reason}") from exc
        _initialised = True
        return pynvml


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGpu(Device):
    """One physical NVIDIA GPU (MIG-flagged when partitioned). Energy and power are measured."""

    kind = "gpu"
    label = "measured"
    vendor = "nvidia"

    def __init__(self, handle: Any, index: int, mig_instance_uuid: str | None = None, zeusd: Any = None) -> None:
        super().__init__()
        self.zeusd = zeusd
        """Optional :class:`~carbonflow.energy.zeusd.ZeusdClient`: limits are set through the node daemon."""
        self._nv = nvml_init()
        self._handle = handle
        self.index = index
        self._lock = threading.Lock()
        nv = self._nv
        self.id = _as_str(nv.nvmlDeviceGetUUID(handle))
        self.model = _as_str(nv.nvmlDeviceGetName(handle))
        self.mig_instance_uuid = mig_instance_uuid
        self.mig = mig_instance_uuid is not None
        try:
            current_mode, _pending = nv.nvmlDeviceGetMigMode(handle)
            self.mig = self.mig or current_mode == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError:
            pass  # MIG not supported on this GPU
        if self.mig:
            self.notes.append(
                "MIG enabled: energy and power are device-level (all MIG instances of this GPU), not per instance"
            )
        try:
            arch = nv.nvmlDeviceGetArchitecture(handle)
        except nv.NVMLError:
            arch = None
        self._use_counter = arch is None or arch >= nv.NVML_DEVICE_ARCH_VOLTA
        self._offset_mj = 0
        self._last_raw_mj: int | None = None
        self._integrated_j = 0.0
        self._last_sample: tuple[float, float] | None = None
        if self._use_counter:
            try:
                self._last_raw_mj = int(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
            except nv.NVMLError as exc:
                if _err_value(exc) != nv.NVML_ERROR_NOT_SUPPORTED:
                    raise EnergyError(f"GPU {self.id}: cannot read the energy counter: {exc}") from exc
                self._use_counter = False
        if not self._use_counter:
            self.notes.append("no total-energy counter (pre-Volta): energy integrated from power samples")
            self._last_sample = (time.monotonic(), self._read_power_w())
        try:
            nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            self.supports_power_limit = True
        except nv.NVMLError:
            self.supports_power_limit = False
            self.notes.append("power limit constraints not readable: power limits not supported")

    # --- energy and power -----------------------------------------------------------------------
    def _read_power_w(self) -> float:
        try:
            return self._nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except self._nv.NVMLError as exc:
            raise EnergyError(f"GPU {self.id}: cannot read power: {exc}") from exc

    def energy_j(self) -> float:
        with self._lock:
            if self._use_counter:
                try:
                    raw = int(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                except self._nv.NVMLError as exc:
                    raise EnergyError(f"GPU {self.id}: cannot read the energy counter: {exc}") from exc
                if self._last_raw_mj is not None and raw < self._last_raw_mj:
                    # The counter restarted (driver reload / GPU reset): keep what was counted so far.
                    logger.warning(
                        "GPU %s energy counter went back from %d to %d mJ: counter reset",
                        self.id,
                        self._last_raw_mj,
                        raw,
                    )
                    self._offset_mj += self._last_raw_mj
                    note = "energy counter reset detected during the run; energy continued from the reset"
                    if note not in self.notes:
                        self.notes.append(note)
                self._last_raw_mj = raw
                return (self._offset_mj + raw) / 1000.0
            now, power = time.monotonic(), self._read_power_w()
            if self._last_sample is not None:
                t0, p0 = self._last_sample
                self._integrated_j += (now - t0) * (p0 + power) / 2.0
            self._last_sample = (now, power)
            return self._integrated_j

    def power_w(self) -> float:
        return self._read_power_w()

    # --- power limits ---------------------------------------------------------------------------
    def _limit_call(self, fn_name: str, *args: Any) -> Any:
        nv = self._nv
        try:
            return getattr(nv, fn_name)(self._handle, *args)
        except nv.NVMLError as exc:
            code = _err_value(exc)
            if code == nv.NVML_ERROR_NO_PERMISSION:
                raise PowerLimitNotPermitted(
                    f"GPU {self.id}: no permission to change the power limit ({fn_name}: {exc}); "
                    "run with CAP_SYS_ADMIN or through zeusd"
                ) from exc
            if code == nv.NVML_ERROR_NOT_SUPPORTED:
                raise PowerLimitNotPermitted(f"GPU {self.id}: power limits not supported ({fn_name}: {exc})") from exc
            raise EnergyError(f"GPU {self.id}: {fn_name} failed: {exc}") from exc

    def power_limit_constraints_w(self) -> tuple[float, float]:
        low, high = self._limit_call("nvmlDeviceGetPowerManagementLimitConstraints")
        return (low / 1000.0, high / 1000.0)

    def default_power_limit_w(self) -> float:
        return self._limit_call("nvmlDeviceGetPowerManagementDefaultLimit") / 1000.0

    def power_limit_w(self) -> float:
        return self._limit_call("nvmlDeviceGetPowerManagementLimit") / 1000.0

    def set_power_limit_w(self, limit_w: float) -> None:
        self.check_power_limit_w(limit_w)
        if self.zeusd is not None:
            host_index = self.zeusd.host_index(self.id, self.index, self._nv.nvmlDeviceGetCount())
            self.zeusd.set_power_limit_w([host_index], limit_w, block=True)
        else:
            self._limit_call("nvmlDeviceSetPowerManagementLimit", round(limit_w * 1000))
        now_w = self.power_limit_w()
        if abs(now_w - limit_w) > LIMIT_TOLERANCE_W:
            raise EnergyError(f"GPU {self.id}: set the power limit to {limit_w:g} W but it reads back {now_w:g} W")


def _parse_visible(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def nvml_devices(
    cuda_visible_devices: str | None = None, all_devices: bool = False, zeusd: Any = None
) -> list[NvmlGpu]:
    """The GPUs this process may use, in CUDA order, honouring ``CUDA_VISIBLE_DEVICES``.

    ``cuda_visible_devices`` defaults to the environment variable. Like CUDA, enumeration stops at
    the first entry that names no device (a warning says so); an empty string means no GPU.
    ``all_devices`` ignores the variable (restoring limits after a crash must reach every GPU).
    ``zeusd`` (a ZeusdClient) routes power-limit changes through the privileged node daemon.
    """
    nv = nvml_init()
    if all_devices:
        cuda_visible_devices = None
    elif cuda_visible_devices is None:
        cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = nv.nvmlDeviceGetCount()
    all_handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    all_uuids = [_as_str(nv.nvmlDeviceGetUUID(h)) for h in all_handles]
    if all_devices or cuda_visible_devices is None:
        return [NvmlGpu(h, i, zeusd=zeusd) for i, h in enumerate(all_handles)]
    devices: list[NvmlGpu] = []
    seen: set[str] = set()
    entries = _parse_visible(cuda_visible_devices)
    if any(e.isdigit() for e in entries) and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        names = {_as_str(nv.nvmlDeviceGetName(h)) for h in all_handles}
        if len(names) > 1:  # CUDA's default FASTEST_FIRST order may differ from NVML's PCI order
            logger.warning(
                "CUDA_VISIBLE_DEVICES=%r uses indices on a node with different GPU models (%s): indices are read in "
                "PCI bus order (NVML's); set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs the same way",
                cuda_visible_devices, ", ".join(sorted(names)),
            )  # fmt: skip
    for entry in entries:
        index: int | None = None
        mig_uuid: str | None = None
        if entry.lstrip("-").isdigit():
            value = int(entry)
            index = value if 0 <= value < count else None
        elif entry.startswith("MIG-"):
            try:
                mig_handle = nv.nvmlDeviceGetHandleByUUID(entry)
                parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_handle)
                index = all_uuids.index(_as_str(nv.nvmlDeviceGetUUID(parent)))
                mig_uuid = entry
            except (nv.NVMLError, ValueError):
                index = None
        else:
            wanted = entry if entry.startswith("GPU-") else f"GPU-{entry}"
            matches = [i for i, u in enumerate(all_uuids) if u.startswith(wanted)]
            index = matches[0] if len(matches) == 1 else None
        if index is None:
            logger.warning(
                "CUDA_VISIBLE_DEVICES=%r: entry %r names no single GPU (have %s); like CUDA, later entries are ignored",
                cuda_visible_devices,
                entry,
                ", ".join(all_uuids) or "none",
            )
            break
        if all_uuids[index] in seen:
            logger.warning(
                "CUDA_VISIBLE_DEVICES=%r names GPU %s twice; counting it once", cuda_visible_devices, all_uuids[index]
            )
            continue
        seen.add(all_uuids[index])
        devices.append(NvmlGpu(all_handles[index], index, mig_instance_uuid=mig_uuid, zeusd=zeusd))
    return devices
