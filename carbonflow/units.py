"""Units carbonflow speaks, and the one way its human output writes them.

Every figure inside carbonflow is SI with the unit in its name (``_j``, ``_w``, ``_s``, ``_g``,
``_gco2_per_kwh``). Human output (CLI tables, the demo table, the Carbon page, plan reasons) writes
energy in one unit family, joules (J, kJ, MJ, GJ), chosen per value so the digits stay readable, and
emissions in grams CO2e (mg, g, kg, t; a short CPU run's 5.19e-05 g reads 0.0519 mg).
kWh appears only where a grid intensity is per kWh and in the
``energy_total_kwh`` MLflow metric kept for MLflow users who compare in kWh.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

J_PER_KWH = 3.6e6
"""Joules in one kilowatt-hour."""

_ENERGY_PREFIXES = ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ"), (1.0, "J"))
_MASS_PREFIXES = ((1e6, "t"), (1e3, "kg"), (1.0, "g"), (1e-3, "mg"))


def _unit_for(magnitude: float, prefixes: tuple[tuple[float, str], ...]) -> tuple[str, float]:
    """The largest prefix ``magnitude`` reaches (the smallest below it; the base unit for zero), as (unit, base
    units per unit)."""
    if magnitude == 0:
        return next((u, f) for f, u in prefixes if f == 1.0)
    factor, unit = next(((f, u) for f, u in prefixes if magnitude >= f), prefixes[-1])
    return unit, factor


def _scaled(value: float, prefixes: tuple[tuple[float, str], ...], digits: int) -> str:
    unit, factor = _unit_for(abs(value), prefixes)
    return f"{value / factor:.{digits}g} {unit}"


def format_energy_j(energy_j: float | None, digits: int = 3) -> str:
    """``1234.5`` → ``'1.23 kJ'``; None → ``'–'``."""
    return "–" if energy_j is None else _scaled(float(energy_j), _ENERGY_PREFIXES, digits)


def format_emissions_g(emissions_g: float | None, digits: int = 3) -> str:
    """``0.0123`` → ``'12.3 mg'``, ``2500`` → ``'2.5 kg'`` (CO2e); None → ``'–'``."""
    return "–" if emissions_g is None else _scaled(float(emissions_g), _MASS_PREFIXES, digits)


def energy_unit_for(values_j: list[float]) -> tuple[str, float]:
    """One unit for a column of energies (the largest value's), as (unit, joules per unit)."""
    return _unit_for(max((abs(v) for v in values_j), default=0.0), _ENERGY_PREFIXES)


def emissions_unit_for(values_g: list[float]) -> tuple[str, float]:
    """One unit for a column of emissions (the largest value's), as (unit, grams per unit)."""
    return _unit_for(max((abs(v) for v in values_g), default=0.0), _MASS_PREFIXES)


def tidy_zero(value: float, reference: float = 0.0, rel: float = 1e-9) -> float:
    """``value``, or 0.0 when it is floating-point noise around zero (within ``rel`` of ``reference``'s size,
    or of 1e-12): a difference of two equal sums reads 0, not ``-8.67e-19``."""
    return 0.0 if abs(value) <= max(abs(reference) * rel, 1e-12) else value


def format_number(value: float | None, digits: int = 3) -> str:
    """A number in a column whose header carries the unit: ``digits`` significant digits, no ``-0``,
    no exponent for ordinary magnitudes; None → ``'–'``."""
    if value is None:
        return "–"
    value = float(value)
    if value == 0:
        return "0"
    text = f"{value:.{digits}g}"
    return f"{value:.0f}" if "e" in text and abs(value) >= 1 else text


def format_percent(fraction: float | None, digits: int = 1) -> str:
    """A fraction as a number of percent for a ``(%)`` column: ``0.1234`` → ``'12.3'``; noise → ``'0.0'``."""
    if fraction is None:
        return "–"
    value = round(100.0 * float(fraction), digits)
    return f"{value + 0.0:.{digits}f}"  # + 0.0 turns -0.0 into 0.0


def format_column(values: list[float | None], digits: int = 3) -> list[str]:
    """One column's numbers with one format: as many decimals as the column's largest value needs for ``digits``
    significant digits, the same for every row (``95.5``, ``58.0``, ``59.6``; ``0.00`` beside ``4.88``, never
    ``0`` beside ``4.88``); None → ``'–'``."""
    known = [abs(float(v)) for v in values if v is not None]
    largest = max(known, default=0.0)
    decimals = 0 if largest == 0 else max(0, digits - 1 - math.floor(math.log10(largest)))
    return ["–" if v is None else _fixed(float(v), decimals) for v in values]


def _fixed(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text  # no -0.00


def nearest_minute(when: datetime) -> datetime:
    """``when`` rounded to the nearest minute: a planned start of 01:59:59.9995 is shown 02:00 everywhere (the
    plan's reason, the ``dags test`` summary, the report), never 01:59 in one place and 02:00 in another."""
    return (when + timedelta(seconds=30)).replace(second=0, microsecond=0)


def emissions_g_from(energy_j: float, intensity_gco2_per_kwh: float) -> float:
    """Grams CO2e of ``energy_j`` at a constant grid intensity (numbers or numpy arrays)."""
    return energy_j / J_PER_KWH * intensity_gco2_per_kwh


def kwh_from_j(energy_j: float) -> float:
    """Kilowatt-hours in ``energy_j`` (numbers or numpy arrays). Also turns a sum of joules × g/kWh (energy
    weighted by intensity, e.g. over a run's windows) into grams CO2e: ``kwh_from_j(sum(e_j * ci))``."""
    return energy_j / J_PER_KWH


def j_from_kwh(energy_kwh: float) -> float:
    """Joules in ``energy_kwh``."""
    return energy_kwh * J_PER_KWH


def g_per_j(intensity_gco2_per_kwh: float) -> float:
    """Grams CO2e per joule at a grid intensity in g/kWh (numbers or numpy arrays)."""
    return intensity_gco2_per_kwh / J_PER_KWH
