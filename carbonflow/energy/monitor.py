"""Named, nestable measurement windows and a background power sampler.

``EnergyMonitor(devices)``: ``begin_window(name)`` / ``end_window(name)`` return the elapsed time
and the energy of every device over the window, each with its label, so a simulated or estimated
figure is never summed into a measured one without saying so. Windows may nest and overlap;
names must be unique among open windows.

``PowerSampler(devices, interval_s, csv_path)`` writes a power trace CSV
(timestamp_utc, device_id, label, power_w, energy_j) from a background thread. Reading the
counters often also refines devices that integrate (NVML power fallback, CPU estimate).
"""

from __future__ import annotations

import csv
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from carbonflow.domain import EnergyLabel
from carbonflow.energy.device import Device
from carbonflow.energy.errors import EnergyError

logger = logging.getLogger(__name__)


@dataclass
class Measurement:
    """Time and energy of one window, per device."""

    name: str
    start_utc: datetime
    end_utc: datetime
    elapsed_s: float
    energy_j: dict[str, float]
    labels: dict[str, EnergyLabel]
    models: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    @property
    def total_j(self) -> float:
        """Energy of all devices together (J); see ``total_labels`` for what it contains."""
        return sum(self.energy_j.values())

    @property
    def total_labels(self) -> list[EnergyLabel]:
        """The distinct labels of the figures inside ``total_j`` (sorted)."""
        return sorted(set(self.labels.values()))

    def energy_by_label_j(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for dev, value in self.energy_j.items():
            out[self.labels[dev]] = out.get(self.labels[dev], 0.0) + value
        return out

    def energy_by_kind_j(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for dev, value in self.energy_j.items():
            kind = self.kinds.get(dev, "unknown")
            out[kind] = out.get(kind, 0.0) + value
        return out

    def mean_power_w(self) -> dict[str, float]:
        if self.elapsed_s <= 0:
            return dict.fromkeys(self.energy_j, 0.0)
        return {dev: e / self.elapsed_s for dev, e in self.energy_j.items()}


@dataclass
class _Open:
    start_utc: datetime
    start_t: float
    energies: list[float]


class EnergyMonitor:
    """Named, nestable energy windows over a fixed set of devices."""

    def __init__(self, devices: Sequence[Device], clock: Callable[[], float] = time.monotonic) -> None:
        ids = [d.id for d in devices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"devices={ids} lists a device twice; each device must appear once")
        self.devices = list(devices)
        self._clock = clock
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def begin_window(self, name: str) -> None:
        """Start window ``name`` (must not be open already)."""
        with self._lock:
            if name in self._open:
                raise ValueError(f"window name={name!r} is already open; end it first or use another name")
            energies = [d.energy_j() for d in self.devices]
            self._open[name] = _Open(datetime.now(UTC), self._clock(), energies)

    def end_window(self, name: str) -> Measurement:
        """End window ``name`` and return its measurement."""
        return self._measure(name, close=True)

    def read_window(self, name: str) -> Measurement:
        """Window ``name`` so far, left open (e.g. a run's energy while it runs, to stop it at a budget)."""
        return self._measure(name, close=False)

    def _measure(self, name: str, close: bool) -> Measurement:
        with self._lock:
            if name not in self._open:
                raise ValueError(f"window name={name!r} is not open; open windows: {sorted(self._open)}")
            energies = [d.energy_j() for d in self.devices]
            t = self._clock()
            start = self._open.pop(name) if close else self._open[name]
        return Measurement(
            name=name,
            start_utc=start.start_utc,
            end_utc=datetime.now(UTC),
            elapsed_s=t - start.start_t,
            energy_j={
                d.id: max(0.0, e1 - e0) for d, e0, e1 in zip(self.devices, start.energies, energies, strict=True)
            },
            labels={d.id: d.label for d in self.devices},
            models={d.id: d.model for d in self.devices},
            kinds={d.id: d.kind for d in self.devices},
        )

    @property
    def open_windows(self) -> list[str]:
        return sorted(self._open)

    @contextmanager
    def window(self, name: str) -> Iterator[dict[str, Measurement]]:
        """``with monitor.window("train") as out: ...`` then ``out["measurement"]``."""
        out: dict[str, Measurement] = {}
        self.begin_window(name)
        try:
            yield out
        finally:
            out["measurement"] = self.end_window(name)


TRACE_COLUMNS = ["timestamp_utc", "device_id", "label", "power_w", "energy_j"]


class PowerSampler:
    """Background thread writing a power trace CSV every ``interval_s`` (a context manager)."""

    def __init__(self, devices: Sequence[Device], interval_s: float, csv_path: str | Path) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r} is not allowed; use a positive number of seconds, e.g. 0.5")
        self.devices = list(devices)
        self.interval_s = float(interval_s)
        self.csv_path = Path(csv_path)
        self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self, writer: csv.writer) -> None:
        stamp = datetime.now(UTC).isoformat()
        for dev in self.devices:
            try:
                power = dev.power_w()
                energy = dev.energy_j()
            except EnergyError as exc:
                if len(self.errors) < 20:
                    self.errors.append(f"{dev.id}: {exc}")
                continue
            writer.writerow([stamp, dev.id, dev.label, f"{power:.3f}", f"{energy:.3f}"])
        self.samples += 1

    def _run(self) -> None:
        with self.csv_path.open("a", newline="") as fh:
            writer = csv.writer(fh)
            if fh.tell() == 0:
                writer.writerow(TRACE_COLUMNS)
            next_t = time.monotonic()
            while True:
                self._sample(writer)
                fh.flush()
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (slow device): skip missed ticks rather than burst
                    next_t = time.monotonic()
                    delay = 0.0
                if self._stop.wait(delay):
                    self._sample(writer)
                    break

    def start(self) -> PowerSampler:
        if self._thread is not None:
            raise RuntimeError("PowerSampler already started")
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="carbonflow-power-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 5 * self.interval_s))
        if self._thread.is_alive():
            logger.error("power sampler thread did not stop within %.1f s", max(5.0, 5 * self.interval_s))
        self._thread = None

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
