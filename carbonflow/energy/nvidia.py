"""The ``nvidia`` GPU vendor (:mod:`carbonflow.energy.vendors`): NVML GPUs, pinned by ``CUDA_VISIBLE_DEVICES``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from carbonflow.energy.device import Device
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.zeusd import ZEUSD_SOCK_ENV, ZeusdClient


class NvidiaVendor:
    """NVIDIA GPUs through NVML: the ``nvidia`` vendor of :mod:`carbonflow.energy.vendors`.

    It owns ``CUDA_VISIBLE_DEVICES``: discovery honours it, and a training is pinned by GPU UUID, so no
    enumeration order can point it elsewhere. With ``ZEUSD_SOCK_PATH`` set, power limits go through zeusd.
    """

    name = "nvidia"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    durable = True
    simulated = False

    def discover(self, *, visible: str | None = None, simulated: Any = None) -> list[Device]:
        zeusd = ZeusdClient(os.environ[ZEUSD_SOCK_ENV]) if os.environ.get(ZEUSD_SOCK_ENV) else None
        return list(nvml_devices(visible, zeusd=zeusd))

    def pin(self, env: Mapping[str, str], gpus: Sequence[Device]) -> dict[str, str]:
        return {**env, self.visible_devices_env: ",".join(g.id for g in gpus)}


NVIDIA = NvidiaVendor()
