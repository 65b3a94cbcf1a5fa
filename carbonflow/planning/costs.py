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
* carbon ``∫ P(t)·CI(t) dt`` over the planned window, from a :class:`carbonflow.models.Forecast`
  (constant power over the run, so it is ``E × mean CI over [start, start+T]``).

Window means of a forecast come from :mod:`carbonflow.carbon.windows` (the one start search and its series).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from carbonflow.carbon.windows import held_window_means
from carbonflow.models import Forecast, parse_objective
from carbonflow.units import J_PER_KWH


def edp(energy_j: float, time_s: float) -> float:
    """Energy-delay product (J·s)."""
    return energy_j * time_s


def eds(energy_j: float, time_s: float, k: float, energy_ref_j: float, time_ref_s: float) -> float:
    """Energy-delay sum ``α·E + β·T``, α = (k−1)/(k·E_ref), β = 1/(k·t_ref); dimensionless, 1.0 at the reference."""
    if k < 1:
        raise ValueError(f"k={k} is not allowed; EDS needs k >= 1")
    if energy_ref_j <= 0 or time_ref_s <= 0:
        raise ValueError(
            f"energy_ref_j={energy_ref_j}, time_ref_s={time_ref_s}: EDS needs a positive reference energy and time"
        )
    alpha = (k - 1) / (k * energy_ref_j)
    beta = 1 / (k * time_ref_s)
    return alpha * energy_j + beta * time_s


def energy_gain_minus_time_loss_pct(energy_j: float, time_s: float, energy_ref_j: float, time_ref_s: float) -> float:
    """Percentage energy gain minus percentage time loss against the reference (higher is better)."""
    if energy_ref_j <= 0 or time_ref_s <= 0:
        raise ValueError(
            f"energy_ref_j={energy_ref_j}, time_ref_s={time_ref_s}: the metric needs positive reference values"
        )
    return 100.0 * (energy_ref_j - energy_j) / energy_ref_j - 100.0 * (time_s - time_ref_s) / time_ref_s


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus's cost ``η·E + (1−η)·MAXPOWER·T`` in J."""
    if not 0 <= eta <= 1:
        raise ValueError(f"eta={eta} is not allowed; it must be between 0 and 1")
    return eta * energy_j + (1 - eta) * max_power_w * time_s


def emissions_g(energy_j: float, mean_intensity_gco2_per_kwh: float) -> float:
    """Grams CO2e of ``energy_j`` drawn at a mean intensity."""
    return energy_j / J_PER_KWH * mean_intensity_gco2_per_kwh


def carbon_g(power_w: float, start: datetime, duration_s: float, forecast: Forecast) -> float:
    """``∫ P·CI dt`` for constant power over [start, start+duration] (grams CO2e)."""
    mean = float(held_window_means(forecast, start, 0.0, duration_s)[0])
    return emissions_g(power_w * duration_s, mean)


@dataclass(frozen=True)
class Reference:
    """The reference run of the relative metrics: the default configuration (J, s) and MAXPOWER (W)."""

    energy_j: float
    time_s: float
    max_power_w: float


def objective_cost(
    objective: str,
    *,
    energy_j: float,
    time_s: float,
    emissions_g: float,
    reference: Reference,
) -> float:
    """The scalar cost (lower is better) of one candidate under an objective string.

    ``objective`` is one of ``carbon``, ``energy``, ``time``, ``edp``, ``eds:<k>``, ``zeus:<eta>`` (parsed by
    :func:`carbonflow.models.parse_objective`) or ``gain`` ("percentage energy gain − percentage time loss",
    returned negated so that lower is better).
    """
    if objective == "gain":
        return -energy_gain_minus_time_loss_pct(energy_j, time_s, reference.energy_j, reference.time_s)
    name, param = parse_objective(objective)
    if name == "carbon":
        return emissions_g
    if name == "energy":
        return energy_j
    if name == "time":
        return time_s
    if name == "edp":
        return edp(energy_j, time_s)
    if name == "eds":
        assert param is not None
        return eds(energy_j, time_s, param, reference.energy_j, reference.time_s)
    assert name == "zeus" and param is not None
    return zeus_cost(energy_j, time_s, param, reference.max_power_w)


def objective_costs(
    objective: str,
    energy_j: np.ndarray,
    time_s: np.ndarray,
    emissions_g_: np.ndarray,
    reference: Reference,
) -> np.ndarray:
    """Vectorised :func:`objective_cost` over numpy arrays (same formulas)."""
    if objective == "gain":
        return -(
            100.0 * (reference.energy_j - energy_j) / reference.energy_j
            - 100.0 * (time_s - reference.time_s) / reference.time_s
        )
    name, param = parse_objective(objective)
    if name == "carbon":
        return np.asarray(emissions_g_, dtype=float)
    if name == "energy":
        return np.asarray(energy_j, dtype=float)
    if name == "time":
        return np.asarray(time_s, dtype=float)
    if name == "edp":
        return energy_j * time_s
    if name == "eds":
        assert param is not None
        alpha = (param - 1) / (param * reference.energy_j)
        beta = 1 / (param * reference.time_s)
        return alpha * energy_j + beta * time_s
    assert param is not None
    return param * energy_j + (1 - param) * reference.max_power_w * time_s


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
