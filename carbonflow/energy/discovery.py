"""Which devices a run measures: the GPUs of the first GPU vendor that finds any, plus the CPU.

The vendors (NVIDIA through NVML, simulated GPUs, any registered one) live in :mod:`carbonflow.energy.vendors`.
"""

from __future__ import annotations

import logging

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.device import Device

logger = logging.getLogger(__name__)


def discover_devices(
    simulated: SimulatedGpuSpec | None = None,
    include_cpu: bool = True,
    cuda_visible_devices: str | None = None,
    prefer_simulated: bool = False,
) -> list[Device]:
    """The GPUs of the first registered vendor that finds any (NVML first, honouring CUDA_VISIBLE_DEVICES), else
    ``simulated.count`` simulated GPUs when a spec is given, else no GPU; plus the CPU device when ``include_cpu``.

    ``cuda_visible_devices``: the visible-devices value handed to the vendor (default: its own variable).
    ``prefer_simulated`` replays the spec even where NVML works (benchmarks, demos on GPU hosts).
    With ``ZEUSD_SOCK_PATH`` set, NVML GPUs change power limits through zeusd (no privilege needed here).
    Every device carries its label (measured / estimated / simulated).
    """
    from carbonflow.energy.cpu import CpuDevice
    from carbonflow.energy.vendors import get_gpus

    devices: list[Device] = get_gpus(simulated, visible=cuda_visible_devices, prefer_simulated=prefer_simulated)
    if include_cpu:
        devices.append(CpuDevice())
    return devices
