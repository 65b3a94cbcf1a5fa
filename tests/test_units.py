"""Human output's units: one family per quantity, no exponent where a prefix reads better."""

from __future__ import annotations

import pytest

from carbonflow.units import emissions_unit_for, energy_unit_for, format_emissions_g, format_energy_j, format_number

CASES = [(5.19e-05, "0.0519 mg"), (0.0123, "12.3 mg"), (1.5, "1.5 g"), (2500, "2.5 kg"), (3.2e6, "3.2 t"),
         (0.0, "0 g"), (None, "–")]  # fmt: skip


@pytest.mark.parametrize(("grams", "text"), CASES)
def test_emissions_take_the_prefix_that_keeps_digits_readable(grams, text):
    """User trial: a CPU job's summary showed ``5.19e-05`` in a CO2e (g) column beside plain numbers."""
    assert format_emissions_g(grams) == text


def test_a_column_of_tiny_emissions_is_in_mg_without_an_exponent():
    unit, per_unit = emissions_unit_for([5.19e-05, 2.0e-05])
    assert unit == "mg" and "e" not in format_number(5.19e-05 / per_unit)
    assert emissions_unit_for([0.4, 12.0]) == ("g", 1.0) and emissions_unit_for([0.0]) == ("g", 1.0)


def test_energy_stays_in_the_joule_family():
    assert format_energy_j(1234.5) == "1.23 kJ" and energy_unit_for([1.02, 7.77]) == ("J", 1.0)
