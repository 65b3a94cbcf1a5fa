"""A faithful stand-in for nvidia-ml-py's ``pynvml`` for machines without an NVIDIA GPU (tests only).

It keeps the GPUs' state in a JSON file named by ``FAKE_PYNVML_STATE`` so that several processes
(the wrapper, a restore command, the test itself) see and change the same GPUs, as with a real
driver. It speaks the library's units (energy mJ, power and limits mW), raises ``NVMLError``
subclasses with the library's error codes, and covers the calls carbonflow makes:

state file::

    {"library": "present" | "absent" | "driver_not_loaded",
     "devices": [{"uuid", "name", "arch", "min_limit_mw", "max_limit_mw", "default_limit_mw",
                  "limit_mw", "load_power_mw", "energy_mj", "energy_t", "energy_supported",
                  "limits_supported", "set_permission", "set_failures", "mig_mode",
                  "mig_devices": ["MIG-..."]}],
     "set_calls": [[uuid, limit_mw, pid], ...]}

Power drawn is ``min(load_power_mw, limit_mw)``; the energy counter advances at that power with
wall-clock time whenever the state is touched.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` returns the matching ``NVMLError_<Name>`` subclass instance."""

    _classes: ClassVar[dict[int, type]] = {}

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN):
        if cls is NVMLError:
            cls = NVMLError._classes.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int = NVML_ERROR_UNKNOWN) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _make_error_classes() -> None:
    for name, value in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        cls_name = "NVMLError_" + "".join(p.capitalize() for p in name[len("NVML_ERROR_") :].split("_"))

        def _new(cls, *args, _v=value):
            return NVMLError.__new__(cls, _v)

        cls = type(cls_name, (NVMLError,), {"__new__": _new})
        NVMLError._classes[value] = cls
        globals()[cls_name] = cls


_make_error_classes()

_initialised = 0


class c_nvmlDevice_t:
    """A device handle: index of a physical GPU, optionally one of its MIG instances."""

    def __init__(self, index: int, mig_uuid: str | None = None) -> None:
        self.index = index
        self.mig_uuid = mig_uuid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, c_nvmlDevice_t) and (self.index, self.mig_uuid) == (other.index, other.mig_uuid)

    def __hash__(self) -> int:
        return hash((self.index, self.mig_uuid))


def _state_path() -> str:
    path = os.environ.get("FAKE_PYNVML_STATE")
    if not path:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    return path


@contextmanager
def _state(write: bool = True):
    path = _state_path()
    with open(path + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as fh:
                state = json.load(fh)
            now = time.time()
            for dev in state["devices"]:
                power = min(dev.get("load_power_mw", 0), dev["limit_mw"])
                last = dev.get("energy_t") or now
                dev["energy_mj"] = dev.get("energy_mj", 0) + power * max(0.0, now - last)
                dev["energy_t"] = now
            yield state
            if write:
                tmp = f"{path}.tmp{os.getpid()}"
                with open(tmp, "w") as fh:
                    json.dump(state, fh)
                os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _container_view(state: dict[str, Any]) -> list[int]:
    """Host indices of the GPUs this process's NVML enumerates.

    On the host NVML sees every GPU. In a container the NVIDIA runtime exposes only the GPUs given to it
    (``FAKE_NVML_CONTAINER_GPUS``: their host UUIDs) and NVML numbers them 0..k-1 there, so a container
    index is not a host index: what zeusd on the host would be told must be mapped by UUID.
    """
    exposed = os.environ.get("FAKE_NVML_CONTAINER_GPUS")
    if exposed is None:
        return list(range(len(state["devices"])))
    by_uuid = {dev["uuid"]: i for i, dev in enumerate(state["devices"])}
    return [by_uuid[u] for u in exposed.split(",") if u in by_uuid]


def _privileged() -> bool:
    """Changing a power limit needs CAP_SYS_ADMIN: ``FAKE_NVML_UNPRIVILEGED=1`` plays a process without it."""
    return os.environ.get("FAKE_NVML_UNPRIVILEGED", "") != "1"


def _check_init() -> None:
    if _initialised <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _device(state: dict[str, Any], handle: c_nvmlDevice_t) -> dict[str, Any]:
    _check_init()
    if not isinstance(handle, c_nvmlDevice_t) or not 0 <= handle.index < len(state["devices"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev = state["devices"][handle.index]
    if dev.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return dev


def nvmlInit() -> None:
    global _initialised
    try:
        path = _state_path()
        with open(path) as fh:
            library = json.load(fh).get("library", "present")
    except (OSError, ValueError):
        library = "absent"
    if library == "absent":
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if library == "driver_not_loaded":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    _initialised += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _initialised
    _check_init()
    _initialised -= 1


def nvmlDeviceGetCount() -> int:
    _check_init()
    with _state(write=False) as state:
        return len(_container_view(state))


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    _check_init()
    with _state(write=False) as state:
        view = _container_view(state)
        if not 0 <= index < len(view):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(view[index])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t:
    _check_init()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    with _state(write=False) as state:
        for i, dev in enumerate(state["devices"]):
            if i not in _container_view(state):
                continue
            if dev["uuid"] == uuid:
                return c_nvmlDevice_t(i)
            if uuid in dev.get("mig_devices", []):
                return c_nvmlDevice_t(i, mig_uuid=uuid)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    with _state(write=False) as state:
        dev = _device(state, handle)
        return handle.mig_uuid or dev["uuid"]


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    with _state(write=False) as state:
        return _device(state, handle)["name"]


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    with _state(write=False) as state:
        _device(state, handle)
        return _container_view(state).index(handle.index)


def nvmlDeviceGetArchitecture(handle: c_nvmlDevice_t) -> int:
    with _state(write=False) as state:
        return _device(state, handle).get("arch", NVML_DEVICE_ARCH_VOLTA)


def nvmlDeviceGetMigMode(handle: c_nvmlDevice_t) -> list[int]:
    with _state(write=False) as state:
        dev = _device(state, handle)
        if dev.get("arch", NVML_DEVICE_ARCH_VOLTA) < NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = dev.get("mig_mode", NVML_DEVICE_MIG_DISABLE)
        return [mode, mode]


def nvmlDeviceIsMigDeviceHandle(handle: c_nvmlDevice_t) -> int:
    return 1 if handle.mig_uuid else 0


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: c_nvmlDevice_t) -> c_nvmlDevice_t:
    _check_init()
    if not handle.mig_uuid:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(handle.index)


def nvmlDeviceGetTotalEnergyConsumption(handle: c_nvmlDevice_t) -> int:
    with _state() as state:
        dev = _device(state, handle)
        if dev.get("arch", NVML_DEVICE_ARCH_VOLTA) < NVML_DEVICE_ARCH_VOLTA or not dev.get("energy_supported", True):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(dev["energy_mj"])


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:
    with _state(write=False) as state:
        dev = _device(state, handle)
        return int(min(dev.get("load_power_mw", 0), dev["limit_mw"]))


def _limits_dev(state: dict[str, Any], handle: c_nvmlDevice_t) -> dict[str, Any]:
    dev = _device(state, handle)
    if not dev.get("limits_supported", True):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return dev


def nvmlDeviceGetPowerManagementLimitConstraints(handle: c_nvmlDevice_t) -> list[int]:
    with _state(write=False) as state:
        dev = _limits_dev(state, handle)
        return [dev["min_limit_mw"], dev["max_limit_mw"]]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: c_nvmlDevice_t) -> int:
    with _state(write=False) as state:
        return _limits_dev(state, handle)["default_limit_mw"]


def nvmlDeviceGetPowerManagementLimit(handle: c_nvmlDevice_t) -> int:
    with _state(write=False) as state:
        return _limits_dev(state, handle)["limit_mw"]


def nvmlDeviceGetEnforcedPowerLimit(handle: c_nvmlDevice_t) -> int:
    return nvmlDeviceGetPowerManagementLimit(handle)


def nvmlDeviceSetPowerManagementLimit(handle: c_nvmlDevice_t, limit: int) -> None:
    error = None
    with _state() as state:
        dev = _limits_dev(state, handle)
        if not dev.get("set_permission", True) or not _privileged():
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if dev.get("set_failures", 0) > 0:  # transient driver failure: recorded, then raised
            dev["set_failures"] -= 1
            state.setdefault("set_calls", []).append([dev["uuid"], int(limit), os.getpid(), "failed"])
            error = NVML_ERROR_UNKNOWN
        elif not dev["min_limit_mw"] <= limit <= dev["max_limit_mw"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        else:
            dev["limit_mw"] = int(limit)
            state.setdefault("set_calls", []).append([dev["uuid"], int(limit), os.getpid(), "ok"])
    if error is not None:
        raise NVMLError(error)


# ---- helpers for tests (not part of pynvml) --------------------------------------------------


def host_set_power_limit(path: str, host_index: int, limit_mw: int, caller: str = "zeusd") -> None:
    """What a privileged host process (zeusd) does: set a GPU's limit by its *host* index."""
    old = os.environ.get("FAKE_PYNVML_STATE")
    os.environ["FAKE_PYNVML_STATE"] = path
    try:
        with _state() as state:
            dev = state["devices"][host_index]
            if not dev["min_limit_mw"] <= limit_mw <= dev["max_limit_mw"]:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            dev["limit_mw"] = int(limit_mw)
            state.setdefault("set_calls", []).append([dev["uuid"], int(limit_mw), os.getpid(), caller])
    finally:
        if old is None:
            os.environ.pop("FAKE_PYNVML_STATE", None)
        else:
            os.environ["FAKE_PYNVML_STATE"] = old


def make_state(path: str, devices: list[dict[str, Any]], library: str = "present") -> dict[str, Any]:
    """Write a fresh state file; each device dict overrides a V100-like default."""
    out = []
    for i, overrides in enumerate(devices):
        dev = {
            "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}",
            "name": "Tesla V100-SXM2-32GB",
            "arch": NVML_DEVICE_ARCH_VOLTA,
            "min_limit_mw": 100000,
            "max_limit_mw": 300000,
            "default_limit_mw": 300000,
            "limit_mw": 300000,
            "load_power_mw": 0,
            "energy_mj": 0,
            "energy_t": None,
            "energy_supported": True,
            "limits_supported": True,
            "set_permission": True,
            "set_failures": 0,
            "mig_mode": NVML_DEVICE_MIG_DISABLE,
            "mig_devices": [],
        }
        dev.update(overrides)
        out.append(dev)
    state = {"library": library, "devices": out, "set_calls": []}
    with open(path, "w") as fh:
        json.dump(state, fh)
    return state


def read_state(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def update_device(path: str, index: int, **changes: Any) -> None:
    """Change a device's state as the hardware/driver would (e.g. a counter reset)."""
    os.environ.setdefault("FAKE_PYNVML_STATE", path)
    old = os.environ["FAKE_PYNVML_STATE"]
    os.environ["FAKE_PYNVML_STATE"] = path
    try:
        with _state() as state:
            state["devices"][index].update(changes)
    finally:
        os.environ["FAKE_PYNVML_STATE"] = old
