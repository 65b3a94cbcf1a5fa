"""Objectives as selector objects: one vectorised formula each, selected under the slowdown constraint."""

from __future__ import annotations

import numpy as np
import pytest

from carbonflow.objectives import (
    EDP,
    EDS,
    Carbon,
    Energy,
    Gain,
    Reference,
    SlowdownConstraint,
    Time,
    ZeusCost,
    objective_for,
)

REF = Reference(energy_j=1000.0, time_s=10.0, max_power_w=250.0)
E = np.array([1000.0, 800.0, 700.0])
T = np.array([10.0, 11.0, 14.0])
G = np.array([3.0, 2.0, 2.5])


def test_each_selector_by_hand():
    assert Energy().select(E, T, G, REF) == 2
    assert Time().select(E, T, G, REF) == 0
    assert Carbon().select(E, T, G, REF) == 1
    assert EDP().cost(E, T, G, REF).tolist() == [10000.0, 8800.0, 9800.0]
    # EDS(2): 0.5 E/1000 + 0.5 T/10 -> 1.0, 0.95, 1.05
    assert EDS(2).cost(E, T, G, REF) == pytest.approx([1.0, 0.95, 1.05])
    # Zeus eta 0.5: 0.5 E + 0.5 x 250 x T -> 1750, 1775, 2100
    assert ZeusCost(0.5).cost(E, T, G, REF) == pytest.approx([1750.0, 1775.0, 2100.0])
    # gain: energy gain % - time loss %: 0, 20 - 10 = 10, 30 - 40 = -10 (negated as a cost)
    assert Gain().cost(E, T, G, REF) == pytest.approx([0.0, -10.0, 10.0])


def test_the_slowdown_constraint_bounds_every_objective():
    allowed = SlowdownConstraint(0.15).allowed(T, REF)
    assert allowed.tolist() == [True, True, False]
    assert Energy().select(E, T, G, REF, allowed) == 1
    assert SlowdownConstraint(None).allowed(T, REF).all()


def test_objective_text_becomes_a_selector_once():
    assert objective_for("eds:1.5") == EDS(1.5) and objective_for("zeus:0.3") == ZeusCost(0.3)
    assert isinstance(objective_for("carbon"), Carbon) and isinstance(objective_for("gain"), Gain)
    with pytest.raises(ValueError, match="objective='fast'"):
        objective_for("fast")
