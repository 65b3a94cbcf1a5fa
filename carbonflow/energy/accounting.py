"""Per-job energy and emissions: one total per run, nothing counted twice, labels carried along.

Shared-GPU split rule (co-located jobs, time-sliced on one GPU)
---------------------------------------------------------------
When jobs 1..n share one GPU, the GPU's measured energy ``E`` over the shared period is split by
what each job's *completed work would have cost alone*, calibrated from solo profiles:

    w_i = P_i × s_i          share_i = w_i / Σ_j w_j          E_i = share_i × E

* ``P_i`` — the GPU power job i draws when it runs alone (W, from its solo profile);
* ``s_i`` — the speed it keeps when paired: paired throughput / solo throughput (0 < s_i ≤ 1,
  observed during the co-located run).

In time ``T`` paired, job i does ``s_i × X_i × T`` samples, which alone would have taken
``s_i × T`` seconds at ``P_i`` watts, i.e. ``P_i × s_i × T`` joules. Shares sum to one, so the
GPU's energy is counted exactly once, idle and interference overhead included (split in the same
proportion). Unlike an SM-utilisation split (Kepler), a memory-bound job that draws high power
with low SM occupancy is charged for the power it actually causes; unlike CodeCarbon/MLflow
defaults, no job is charged the whole GPU.

Emissions
---------
``emissions_g`` sums, over energy intervals, energy × the carbon intensity of the time it was
used (each interval's energy spread evenly over its duration and split across the intensity slots
it overlaps). codecarbon's annual country average is used only as the last fallback, for time no
intensity point covers, and the result says so.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from carbonflow.energy.device import Device
from carbonflow.energy.monitor import Measurement
from carbonflow.models import DeviceEnergy, ForecastPoint
from carbonflow.units import J_PER_KWH

logger = logging.getLogger(__name__)


def device_energies(
    measurement: Measurement,
    devices: Sequence[Device],
    shares: Mapping[str, float] | None = None,
    power_limits_w: Mapping[str, float] | None = None,
) -> list[DeviceEnergy]:
    """One ``DeviceEnergy`` per device of the measurement: energy attributed to this job (J) and its label.

    ``shares`` (device id → fraction in [0, 1]) charges this job part of a shared device; the
    figure is ``share × measured``. Devices are keyed by id, so a device listed by several
    containers of one run is counted once.
    """
    shares = dict(shares or {})
    for dev_id, share in shares.items():
        if not 0 <= share <= 1:
            raise ValueError(f"shares[{dev_id!r}]={share} is not allowed; a share must be between 0 and 1")
    out: list[DeviceEnergy] = []
    seen: set[str] = set()
    for dev in devices:
        if dev.id in seen:
            continue
        seen.add(dev.id)
        if dev.id not in measurement.energy_j:
            raise ValueError(f"device {dev.id} is not in measurement {measurement.name!r}")
        share = shares.get(dev.id, 1.0)
        notes = list(dev.notes)
        if share < 1:
            notes.append(f"shared device: {share:.3f} of its {measurement.energy_j[dev.id]:.1f} J charged to this job")
        out.append(
            DeviceEnergy(
                device_id=dev.id,
                device_model=dev.model,
                kind=dev.kind,
                energy_j=measurement.energy_j[dev.id] * share,
                label=dev.label,
                share=share,
                power_limit_w=(power_limits_w or {}).get(dev.id),
                notes=notes,
            )
        )
    return out


def total_energy_j(energies: Sequence[DeviceEnergy]) -> tuple[float, list[str]]:
    """Total over devices, each counted once, with the distinct labels it contains."""
    by_id: dict[str, DeviceEnergy] = {}
    for e in energies:
        by_id.setdefault(e.device_id, e)
    return sum(e.energy_j for e in by_id.values()), sorted({e.label for e in by_id.values()})


@dataclass(frozen=True)
class SoloProfile:
    """A co-located job's calibration: GPU power alone (W) and speed kept when paired (fraction)."""

    job: str
    solo_power_w: float
    speed_kept: float

    def __post_init__(self) -> None:
        if not self.solo_power_w > 0:
            raise ValueError(f"solo_power_w={self.solo_power_w} for job {self.job!r} is not allowed; it must be > 0 W")
        if not 0 < self.speed_kept <= 1:
            raise ValueError(
                f"speed_kept={self.speed_kept} for job {self.job!r} is not allowed; "
                "use paired throughput / solo throughput, in (0, 1]"
            )


def shared_gpu_shares(jobs: Sequence[SoloProfile]) -> dict[str, float]:
    """Each job's share of a shared GPU's energy: P_i·s_i / Σ P_j·s_j (see the module docstring)."""
    if not jobs:
        raise ValueError("jobs=[] is not allowed; give at least one job sharing the GPU")
    names = [j.job for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"jobs={names} names a job twice")
    weights = {j.job: j.solo_power_w * j.speed_kept for j in jobs}
    total = sum(weights.values())
    return {job: w / total for job, w in weights.items()}


def split_shared_gpu_energy_j(energy_j: float, jobs: Sequence[SoloProfile]) -> dict[str, float]:
    """Split one GPU's measured energy among the jobs sharing it (sums exactly to ``energy_j``)."""
    if energy_j < 0:
        raise ValueError(f"energy_j={energy_j} is not allowed; it must be >= 0")
    return {job: share * energy_j for job, share in shared_gpu_shares(jobs).items()}


@dataclass
class EmissionsBreakdown:
    """Emissions with how they were computed."""

    emissions_g: float
    energy_j: float
    covered_energy_j: float
    fallback_energy_j: float
    fallback_gco2_per_kwh: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def mean_intensity_gco2_per_kwh(self) -> float:
        return self.emissions_g / (self.energy_j / J_PER_KWH) if self.energy_j > 0 else 0.0


def emissions_breakdown(
    energy_intervals: Sequence[tuple[datetime, datetime, float]],
    intensity_points: Sequence[ForecastPoint],
    fallback_gco2_per_kwh: float | None = None,
) -> EmissionsBreakdown:
    """Σ over intervals and intensity slots of energy-in-slot × slot intensity (see ``emissions_g``)."""
    points = sorted(intensity_points, key=lambda p: p.start)
    total_g = covered_j = fallback_j = energy_total = 0.0
    for i, (start, end, energy_j) in enumerate(energy_intervals):
        for name, value in (("start", start), ("end", end)):
            if value.tzinfo is None:
                raise ValueError(f"energy_intervals[{i}] {name}={value.isoformat()} has no time zone; use UTC")
        if energy_j < 0:
            raise ValueError(f"energy_intervals[{i}] energy_j={energy_j} is not allowed; it must be >= 0")
        if end < start:
            raise ValueError(f"energy_intervals[{i}] ends ({end.isoformat()}) before it starts ({start.isoformat()})")
        energy_total += energy_j
        duration_s = (end - start).total_seconds()
        if duration_s == 0:
            # An instant: the slot containing it.
            hit = next((p for p in points if p.start <= start < p.end), None)
            if hit is not None:
                total_g += energy_j / J_PER_KWH * hit.gco2_per_kwh
                covered_j += energy_j
            else:
                fallback_j += energy_j
            continue
        covered_s = 0.0
        for p in points:
            overlap_s = (min(end, p.end) - max(start, p.start)).total_seconds()
            if overlap_s <= 0:
                continue
            part_j = energy_j * overlap_s / duration_s
            total_g += part_j / J_PER_KWH * p.gco2_per_kwh
            covered_j += part_j
            covered_s += overlap_s
        if covered_s < duration_s - 1e-6:
            fallback_j += energy_j * (duration_s - covered_s) / duration_s
    notes: list[str] = []
    if fallback_j > 1e-9:
        if fallback_gco2_per_kwh is None:
            raise ValueError(
                f"{fallback_j:.1f} J of {energy_total:.1f} J fall outside the carbon-intensity points "
                f"and fallback_gco2_per_kwh=None; give intensity points covering the run or a fallback"
            )
        total_g += fallback_j / J_PER_KWH * fallback_gco2_per_kwh
        notes.append(
            f"{fallback_j / max(energy_total, 1e-12):.0%} of the energy had no intensity point: "
            f"used the fallback {fallback_gco2_per_kwh:g} gCO2/kWh (annual average)"
        )
    return EmissionsBreakdown(total_g, energy_total, covered_j, fallback_j, fallback_gco2_per_kwh, notes)


def emissions_g(
    energy_intervals: Sequence[tuple[datetime, datetime, float]],
    intensity_points: Sequence[ForecastPoint],
    fallback_gco2_per_kwh: float | None = None,
) -> float:
    """Emissions (g CO2e) = Σ energy(t) × intensity(t) over ``(start_utc, end_utc, energy_j)`` intervals.

    ``fallback_gco2_per_kwh`` (e.g. :func:`codecarbon_annual_average_gco2_per_kwh`) prices only the
    energy no intensity point covers; without it, uncovered energy is an error naming how much.
    """
    return emissions_breakdown(energy_intervals, intensity_points, fallback_gco2_per_kwh).emissions_g


def codecarbon_annual_average_gco2_per_kwh(country: str) -> float:
    """codecarbon's annual average grid intensity of a country (ISO 3166 alpha-2 or alpha-3, e.g. GB, DEU).

    A last-resort fallback: it ignores the hour, the season and the grid region.
    """
    from codecarbon.input import DataSource

    code = country.strip().upper().split("-")[0].split(":")[-1]
    mix = DataSource().get_global_energy_mix_data()
    if len(code) == 2:
        try:
            import pycountry

            found = pycountry.countries.get(alpha_2=code)
            code = found.alpha_3 if found else code
        except ImportError:  # pragma: no cover - pycountry comes with codecarbon's dependencies
            pass
    if code not in mix:
        raise ValueError(
            f"country={country!r} has no codecarbon annual average; use an ISO 3166 country code such as GB or DEU"
        )
    return float(mix[code]["carbon_intensity"])


def energy_intervals_from_measurement(measurement: Measurement) -> list[tuple[datetime, datetime, float]]:
    """One interval covering the window with all its energy (spread evenly over it by ``emissions_g``)."""
    return [(measurement.start_utc, measurement.end_utc, measurement.total_j)]


def energy_intervals_from_trace(
    csv_path: str | Path, device_ids: Sequence[str] | None = None
) -> list[tuple[datetime, datetime, float]]:
    """Intervals (start_utc, end_utc, energy_j) between successive samples of a ``PowerSampler`` trace.

    Energy is the counter difference of each device between two of its samples (never negative),
    summed over devices (optionally only ``device_ids``), so emissions follow the power over time.
    """
    last: dict[str, tuple[datetime, float]] = {}
    buckets: dict[tuple[datetime, datetime], float] = {}
    wanted = set(device_ids) if device_ids is not None else None
    with Path(csv_path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            dev = row["device_id"]
            if wanted is not None and dev not in wanted:
                continue
            t = datetime.fromisoformat(row["timestamp_utc"])
            energy = float(row["energy_j"])
            if dev in last:
                t0, e0 = last[dev]
                if t > t0:
                    key = (t0, t)
                    buckets[key] = buckets.get(key, 0.0) + max(0.0, energy - e0)
            last[dev] = (t, energy)
    return [(a, b, e) for (a, b), e in sorted(buckets.items())]


def merge_measurements(measurements: Sequence[Measurement]) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """One total per run from several containers' measurements, each device counted once.

    Containers on one node all measure that node's CPU (and may list the same GPU). A device seen in
    several measurements whose windows overlap is counted from the measurement with the most energy
    for it (the widest view of the same counter); disjoint windows add up. Returns
    (energy per device id, label per device id, notes).
    """
    per_dev: dict[str, list[tuple[datetime, datetime, float]]] = {}
    labels: dict[str, str] = {}
    for m in measurements:
        for dev, energy in m.energy_j.items():
            per_dev.setdefault(dev, []).append((m.start_utc, m.end_utc, energy))
            labels[dev] = m.labels[dev]
    totals: dict[str, float] = {}
    notes: list[str] = []
    for dev, spans in per_dev.items():
        spans.sort()
        total = 0.0
        group_end: datetime | None = None
        group_max = 0.0
        merged = 0
        for start, end, energy in spans:
            if group_end is not None and start < group_end:  # overlaps the current group: same counter
                group_max = max(group_max, energy)
                group_end = max(group_end, end)
                merged += 1
            else:
                total += group_max
                group_end, group_max = end, energy
        total += group_max
        totals[dev] = total
        if merged:
            notes.append(f"device {dev} was measured by {merged + 1} overlapping containers: counted once")
    return totals, labels, notes
