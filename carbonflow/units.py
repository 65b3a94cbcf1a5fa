"""Units carbonflow speaks, and the one way its human output writes them.

Every figure inside carbonflow is SI with the unit in its name (``_j``, ``_w``, ``_s``, ``_g``,
``_gco2_per_kwh``). Human output (CLI tables, the demo table, the Carbon page, plan reasons) writes
energy in one unit family, joules (J, kJ, MJ, GJ), chosen per value so the digits stay readable, and
emissions in grams CO2e (g, kg, t). kWh appears only where a grid intensity is per kWh and in the
``energy_total_kwh`` MLflow metric kept for MLflow users who compare in kWh.
"""

from __future__ import annotations

J_PER_KWH = 3.6e6
"""Joules in one kilowatt-hour."""

_ENERGY_PREFIXES = ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ"), (1.0, "J"))
_MASS_PREFIXES = ((1e6, "t"), (1e3, "kg"), (1.0, "g"))


def _scaled(value: float, prefixes: tuple[tuple[float, str], ...], digits: int) -> str:
    magnitude = abs(value)
    for factor, unit in prefixes:
        if magnitude >= factor:
            return f"{value / factor:.{digits}g} {unit}"
    factor, unit = prefixes[-1]
    return f"{value / factor:.{digits}g} {unit}"


def format_energy_j(energy_j: float | None, digits: int = 3) -> str:
    """``1234.5`` → ``'1.23 kJ'``; None → ``'–'``."""
    return "–" if energy_j is None else _scaled(float(energy_j), _ENERGY_PREFIXES, digits)


def format_emissions_g(emissions_g: float | None, digits: int = 3) -> str:
    """``0.0123`` → ``'0.0123 g'``, ``2500`` → ``'2.5 kg'`` (CO2e); None → ``'–'``."""
    return "–" if emissions_g is None else _scaled(float(emissions_g), _MASS_PREFIXES, digits)


def energy_unit_for(values_j: list[float]) -> tuple[str, float]:
    """One unit for a column of energies (the largest value's), as (unit, joules per unit)."""
    largest = max((abs(v) for v in values_j), default=0.0)
    for factor, unit in _ENERGY_PREFIXES:
        if largest >= factor:
            return unit, factor
    return "J", 1.0


def kwh_from_j(energy_j: float) -> float:
    """Joules to kilowatt-hours."""
    return energy_j / J_PER_KWH


def emissions_g_from(energy_j: float, intensity_gco2_per_kwh: float) -> float:
    """Grams CO2e of ``energy_j`` at a constant grid intensity."""
    return energy_j / J_PER_KWH * intensity_gco2_per_kwh
