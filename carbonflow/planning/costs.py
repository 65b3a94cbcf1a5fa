"""Cost metrics the planner minimises, and the Pareto set over time, energy and carbon.

Pure functions, no I/O. Every metric is a *cost* (lower is better) except
:func:`energy_gain_minus_time_loss_pct`, which is a gain (Koszczał et al. report it that way);
:func:`objective_cost` turns it into a cost by negating it.

Metrics (E in J, T in s, all relative to a reference run where one is needed):

* energy ``E``; time ``T``; EDP ``E·T``;
* EDS(k) ``α·E + β·T`` with ``α = (k−1)/(k·E_ref)`` and ``β = 1/(k·t_ref)``, the reference being the
  default configuration (Koszczał et al., Euro-Par 2023, after Krzywaniak & Czarnul). k = 1 is pure time,
  k → ∞ pure energy; EDS(ref) = 1;
* "percentage energy gain − percentage time loss" ``100·(E_ref−E)/E_ref − 100·(T−T_ref)/T_ref``;
* Zeus's cost ``η·E + (1−η)·MAXPOWER·T`` (You et al., NSDI 2023), MAXPOWER in W;
* carbon ``∫ P(t)·CI(t) dt`` over the planned window, from a :class:`carbonflow.domain.Forecast`
  (constant power over the run, so it is ``E × mean CI over [start, start+T]``).

Window means of a forecast come from :mod:`carbonflow.carbon.windows` (the one start search and its series).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from carbonflow.carbon.windows import held_window_means
from carbonflow.domain import Forecast
from carbonflow.objectives import (
    EDP,
    EDS,
    Gain,
    Objective,
    Reference,
    ZeusCost,
    objective_for,
)
from carbonflow.units import emissions_g_from


def edp(energy_j: float, time_s: float) -> float:
    """Energy-delay product (J·s)."""
    return _one(EDP(), energy_j, time_s, Reference(1.0, 1.0, 0.0))


def eds(energy_j: float, time_s: float, k: float, energy_ref_j: float, time_ref_s: float) -> float:
    """Energy-delay sum ``α·E + β·T``, α = (k−1)/(k·E_ref), β = 1/(k·t_ref); dimensionless, 1.0 at the reference."""
    return _one(EDS(k), energy_j, time_s, Reference(energy_ref_j, time_ref_s, 0.0))


def energy_gain_minus_time_loss_pct(energy_j: float, time_s: float, energy_ref_j: float, time_ref_s: float) -> float:
    """Percentage energy gain minus percentage time loss against the reference (higher is better)."""
    return -_one(Gain(), energy_j, time_s, Reference(energy_ref_j, time_ref_s, 0.0))


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus's cost ``η·E + (1−η)·MAXPOWER·T`` in J."""
    return _one(ZeusCost(eta), energy_j, time_s, Reference(1.0, 1.0, max_power_w))


def _one(objective: Objective, energy_j: float, time_s: float, ref: Reference, emissions_g: float = 0.0) -> float:
    return float(objective.cost(np.array([energy_j]), np.array([time_s]), np.array([emissions_g]), ref)[0])


def carbon_g(power_w: float, start: datetime, duration_s: float, forecast: Forecast) -> float:
    """``∫ P·CI dt`` for constant power over [start, start+duration] (grams CO2e)."""
    mean = float(held_window_means(forecast, start, 0.0, duration_s)[0])
    return emissions_g_from(power_w * duration_s, mean)


def objective_cost(
    objective: str,
    *,
    energy_j: float,
    time_s: float,
    emissions_g: float,
    reference: Reference,
) -> float:
    """The scalar cost (lower is better) of one candidate under an objective text (see
    :func:`carbonflow.objectives.objective_for`; ``gain`` is returned negated)."""
    return _one(objective_for(objective), energy_j, time_s, reference, emissions_g)


def pareto_front(points: Sequence[tuple[float, ...]]) -> list[int]:
    """Indices of the non-dominated points (minimisation in every coordinate), in input order.

    A point is dominated when another is no worse in every coordinate and better in one. Equal points are
    all kept. Used over (time, energy, carbon) of the candidates a plan considered.
    """
    arr = np.asarray(points, dtype=float)
    if arr.size == 0:
        return []
    keep: list[int] = []
    for i in range(len(arr)):
        no_worse = np.all(arr <= arr[i], axis=1)
        better = np.any(arr < arr[i], axis=1)
        if not np.any(no_worse & better):
            keep.append(i)
    return keep
