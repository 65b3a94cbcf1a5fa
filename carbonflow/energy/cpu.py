"""The CPU as an energy device: RAPL when readable (``measured``), otherwise codecarbon's model (``estimated``).

* RAPL: the package domains under ``/sys/class/powercap/intel-rapl:<N>`` (``energy_uj``, wrapping at
  ``max_energy_range_uj``). Labelled ``measured``.
* Estimate: codecarbon's CPU model in its ``cpu_load`` machine mode — the TDP looked up in
  codecarbon's CPU table (or its per-thread default when the model is unknown) scaled by the
  system CPU load read with psutil. Labelled ``estimated``; the estimate is never presented as a
  measurement. The counter integrates the model's power over the intervals between reads, so a
  sampler (``PowerSampler``) reading every 0.1-1 s gives a finer estimate than two window reads.
"""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import platform
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from carbonflow.energy.device import Device
from carbonflow.energy.errors import EnergyError
from carbonflow.units import j_from_kwh

logger = logging.getLogger(__name__)

POWERCAP_ROOT = "/sys/class/powercap"
_CPU_NAMESPACE = uuid.UUID("0b6e3a8e-3f0a-4c5e-8a7b-5b1d2f6c4e21")
_MIN_INTERVAL_S = 0.01
"""Reads closer together than this reuse the previous estimate (load over ~0 s is meaningless)."""


def _machine_key() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return socket.gethostname()


@dataclass
class RaplDomain:
    """One RAPL package domain (its energy file and wrap range)."""

    name: str
    energy_path: Path
    max_energy_range_uj: int


def find_rapl_domains(root: str | os.PathLike[str] = POWERCAP_ROOT) -> list[RaplDomain]:
    """Readable RAPL *package* domains under ``root`` (empty when powercap is absent or unreadable)."""
    domains = []
    for zone in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        if os.path.basename(zone).count(":") != 1:  # sub-zones (core, dram) are inside the package
            continue
        try:
            name = Path(zone, "name").read_text().strip()
            energy_path = Path(zone, "energy_uj")
            int(energy_path.read_text())
            max_range = int(Path(zone, "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            continue
        if name.startswith("package"):
            domains.append(RaplDomain(name=name, energy_path=energy_path, max_energy_range_uj=max_range))
    return domains


@contextlib.contextmanager
def _quiet_fds():
    """Silence stdout/stderr at the file-descriptor level (codecarbon's GPU probes print from C)."""
    saved = []
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    try:
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(devnull, fd)
            except OSError:
                pass
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def _cpu_model_name() -> str:
    try:
        with _quiet_fds():
            cc_logger = logging.getLogger("codecarbon")
            old_level = cc_logger.level
            cc_logger.setLevel(logging.ERROR)
            try:
                from codecarbon.core.util import detect_cpu_model

                name = detect_cpu_model()
            finally:
                cc_logger.setLevel(old_level)
        if name:
            return str(name)
    except Exception:  # codecarbon absent or cpuinfo failing: fall back to the platform string
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


class CpuDevice(Device):
    """All CPU packages of this machine as one device (RAPL measured, else codecarbon estimate)."""

    kind = "cpu"
    supports_power_limit = False

    def __init__(self, powercap_root: str | os.PathLike[str] = POWERCAP_ROOT, force_estimate: bool = False) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.model = _cpu_model_name()
        self.id = f"CPU-{uuid.uuid5(_CPU_NAMESPACE, _machine_key() + ':' + self.model)}"
        self._domains = [] if force_estimate else find_rapl_domains(powercap_root)
        self._last_power_w = 0.0
        self._accum_j = 0.0
        self._last_t = time.monotonic()
        if self._domains:
            self.label = "measured"
            self._last_raw = [self._read_uj(d) for d in self._domains]
            self.notes = [f"RAPL package domains: {', '.join(d.name for d in self._domains)}"]
            self.tdp_w = None
        else:
            self.label = "estimated"
            self._init_estimate()

    # --- RAPL -----------------------------------------------------------------------------------
    @staticmethod
    def _read_uj(domain: RaplDomain) -> int:
        try:
            return int(domain.energy_path.read_text())
        except (OSError, ValueError) as exc:
            raise EnergyError(f"cannot read RAPL counter {domain.energy_path}: {exc}") from exc

    def _update_rapl(self) -> None:
        now = time.monotonic()
        delta_j = 0.0
        for i, domain in enumerate(self._domains):
            raw = self._read_uj(domain)
            diff = raw - self._last_raw[i]
            if diff < 0:  # counter wrapped at max_energy_range_uj
                diff += domain.max_energy_range_uj + 1
            delta_j += diff / 1e6
            self._last_raw[i] = raw
        dt = now - self._last_t
        if dt >= _MIN_INTERVAL_S:
            self._last_power_w = delta_j / dt
        self._accum_j += delta_j
        self._last_t = now

    # --- estimate (codecarbon) ------------------------------------------------------------------
    def _init_estimate(self) -> None:
        cc_logger = logging.getLogger("codecarbon")
        old_level = cc_logger.level
        cc_logger.setLevel(logging.ERROR)
        try:
            # codecarbon probes AMD/NVIDIA GPU libraries on import and prints when they are absent.
            with _quiet_fds():
                from codecarbon.core.cpu import TDP
                from codecarbon.external.hardware import CPU, MODE_CPU_LOAD
            tdp = TDP()
            in_table = None
            with contextlib.suppress(Exception):
                in_table = tdp._get_cpu_power_from_registry(tdp.model)
            self.tdp_w = float(tdp.tdp) if tdp.tdp else None
            if self.tdp_w is None:
                raise EnergyError(
                    f"codecarbon could not estimate a TDP for CPU {self.model!r} (psutil unavailable?); "
                    "no CPU energy estimate is possible"
                )
            self._cc_dir = tempfile.mkdtemp(prefix="carbonflow-cc-")
            self._cc_cpu = CPU.from_utils(
                output_dir=self._cc_dir, mode=MODE_CPU_LOAD, model=tdp.model, tdp=self.tdp_w, tracking_mode="machine"
            )
            self._cc_cpu.start()
        finally:
            cc_logger.setLevel(old_level)
        source = (
            "codecarbon CPU table" if in_table else "codecarbon's default per-thread power (model not in its table)"
        )
        self.notes = [
            f"estimated with codecarbon's cpu_load model: TDP {self.tdp_w:g} W from {source}, "
            "scaled by system CPU load (psutil); not a measurement"
        ]

    def _update_estimate(self) -> None:
        now = time.monotonic()
        dt = now - self._last_t
        if dt < _MIN_INTERVAL_S:
            return
        power, energy = self._cc_cpu.measure_power_and_energy(last_duration=dt)
        self._last_power_w = float(power.W)
        self._accum_j += j_from_kwh(float(energy.kWh))
        self._last_t = now

    # --- Device ---------------------------------------------------------------------------------
    def _update(self) -> None:
        if self._domains:
            self._update_rapl()
        else:
            self._update_estimate()

    def energy_j(self) -> float:
        with self._lock:
            self._update()
            return self._accum_j

    def power_w(self) -> float:
        """Average power over the interval since the previous read (W)."""
        with self._lock:
            self._update()
            return self._last_power_w
