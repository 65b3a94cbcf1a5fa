"""Emissions of a run's energy: each interval priced at the carbon intensity of the time it was used.

``emissions_g`` sums, over energy intervals, energy × the carbon intensity of the time it was
used (each interval's energy spread evenly over its duration and split across the intensity slots
it overlaps). codecarbon's annual country average is used only as the last fallback, for time no
intensity point covers, and the result says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from carbonflow.domain import ForecastPoint
from carbonflow.units import emissions_g_from, kwh_from_j

if TYPE_CHECKING:
    pass


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
        return self.emissions_g / kwh_from_j(self.energy_j) if self.energy_j > 0 else 0.0


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
                total_g += emissions_g_from(energy_j, hit.gco2_per_kwh)
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
            total_g += emissions_g_from(part_j, p.gco2_per_kwh)
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
        total_g += emissions_g_from(fallback_j, fallback_gco2_per_kwh)
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
