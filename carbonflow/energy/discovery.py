"""Which devices a run measures: NVML GPUs when NVML works, else simulated GPUs if asked, plus the CPU."""

from __future__ import annotations

import logging
import os

from carbonflow.energy.device import Device
from carbonflow.energy.errors import NvmlUnavailable
from carbonflow.energy.zeusd import ZEUSD_SOCK_ENV, ZeusdClient
from carbonflow.models import SimulatedGpuSpec

logger = logging.getLogger(__name__)


def discover_devices(
    simulated: SimulatedGpuSpec | None = None,
    include_cpu: bool = True,
    cuda_visible_devices: str | None = None,
    prefer_simulated: bool = False,
) -> list[Device]:
    """NVML GPUs when NVML works (honouring CUDA_VISIBLE_DEVICES), else ``simulated.count`` simulated GPUs
    when a spec is given, else no GPU; plus the CPU device when ``include_cpu``.

    ``prefer_simulated`` replays the spec even where NVML works (benchmarks, demos on GPU hosts).
    With ``ZEUSD_SOCK_PATH`` set, NVML GPUs change power limits through zeusd (no privilege needed here).
    Every device carries its label (measured / estimated / simulated).
    """
    from carbonflow.energy.cpu import CpuDevice
    from carbonflow.energy.nvml import nvml_devices
    from carbonflow.energy.simulated import SimulatedGpu

    devices: list[Device] = []
    gpus: list[Device] = []
    if not (prefer_simulated and simulated is not None):
        try:
            zeusd = None
            if os.environ.get(ZEUSD_SOCK_ENV):
                zeusd = ZeusdClient(os.environ[ZEUSD_SOCK_ENV])
            gpus = list(nvml_devices(cuda_visible_devices, zeusd=zeusd))
        except NvmlUnavailable as exc:
            logger.info("%s", exc)
    if not gpus and simulated is not None:
        gpus = [SimulatedGpu(simulated, index=i) for i in range(simulated.count)]
    devices.extend(gpus)
    if include_cpu:
        devices.append(CpuDevice())
    return devices
