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

:class:`IntensityIntegral` evaluates window means in O(log n) per window (vectorised over many windows
with numpy), which keeps the joint optimiser at O(configurations × slots).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from carbonflow.models import Forecast, parse_objective

J_PER_KWH = 3.6e6
EXTEND_S = 30 * 24 * 3600.0
"""How far beyond the forecast's last slot the last value is held (persistence), in seconds."""


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


class IntensityIntegral:
    """The running integral of a forecast's intensity, for O(log n) window means.

    The series is a step function: each point holds its value over [start, start+length); a gap between
    points holds the previous value; before the first point the first value holds and after the last
    point the last value holds for :data:`EXTEND_S` (persistence, stated in every plan that relies on it).
    Times are seconds relative to ``origin``.
    """

    def __init__(self, forecast: Forecast, origin: datetime) -> None:
        if not forecast.points:
            raise ValueError(f"forecast.points is empty (region={forecast.region!r}); a forecast needs points")
        self.origin = origin
        pts = forecast.points
        starts = np.array([(p.start - origin).total_seconds() for p in pts], dtype=float)
        values = np.array([p.gco2_per_kwh for p in pts], dtype=float)
        last_end = (pts[-1].end - origin).total_seconds()
        self.horizon_end_s = last_end
        self.first_start_s = float(starts[0])
        keep = np.concatenate(([True], np.diff(starts) > 0))  # duplicated starts: keep the first
        starts, values = starts[keep], values[keep]
        lead = min(starts[0], 0.0) - EXTEND_S
        # Breakpoints of the step function; value i holds on [t[i], t[i+1]).
        t = np.concatenate(([lead], starts, [last_end + EXTEND_S]))
        v = np.concatenate(([values[0]], values))
        self._t = t
        self._v = v
        cum = np.concatenate(([0.0], np.cumsum(v * np.diff(t))))
        self._cum = cum

    def integral(self, t_s: np.ndarray | float) -> np.ndarray:
        """∫ CI dt from the lead-in point to ``t_s`` (gCO2/kWh · s); exact, since CI is piecewise constant."""
        return np.interp(t_s, self._t, self._cum)

    def mean(self, start_s: np.ndarray | float, duration_s: np.ndarray | float) -> np.ndarray:
        """Mean intensity (gCO2/kWh) over [start, start+duration] for many windows at once."""
        start = np.asarray(start_s, dtype=float)
        dur = np.asarray(duration_s, dtype=float)
        safe = np.where(dur > 0, dur, 1.0)
        area = self.integral(start + dur) - self.integral(start)
        slot = np.clip(np.searchsorted(self._t, start, side="right") - 1, 0, len(self._v) - 1)
        point = self._v[slot]
        return np.where(dur > 0, area / safe, point)

    def breakpoints_s(self) -> np.ndarray:
        """Slot boundaries of the real forecast (starts and the last end), seconds from origin."""
        return np.append(self._t[1:-1], self.horizon_end_s)

    def beyond_horizon(self, end_s: float) -> bool:
        """Whether a window ending at ``end_s`` relies on the persistence extension."""
        return end_s > self.horizon_end_s + 1e-9


def shrink_forecast(forecast: Forecast, now: datetime) -> Forecast:
    """The forecast's values shrunk toward their mean by how much of their spread its own error explains.

    Choosing the lowest of noisy forecast values picks noise (the winner's curse): with an error standard
    deviation σ(lead) (``σ = MAE·√(π/2)`` from ``forecast.error_mae_by_lead_h``) and the spread ``s²`` of the
    forecast values, the expected actual given the forecast is ``μ + k·(f − μ)`` with
    ``k = max(0, 1 − σ²/s²)`` (empirical Bayes). Where the error is as large as the spread, every slot looks
    the same and the planner starts now. Returned unchanged when the forecast carries no error model.
    """
    if not forecast.error_mae_by_lead_h or len(forecast.points) < 2:
        return forecast
    values = np.array([p.gco2_per_kwh for p in forecast.points], dtype=float)
    mu = float(values.mean())
    spread = float(values.var())
    bounds = sorted(forecast.error_mae_by_lead_h)
    maes = [forecast.error_mae_by_lead_h[b] for b in bounds]
    points = []
    for p, v in zip(forecast.points, values, strict=True):
        lead_h = max(0.0, (p.end - now).total_seconds() / 3600)
        i = min(int(np.searchsorted(bounds, lead_h, side="left")), len(bounds) - 1)
        sigma = maes[i] * math.sqrt(math.pi / 2)
        k = max(0.0, 1.0 - sigma * sigma / spread) if spread > 0 else 0.0
        points.append(p.model_copy(update={"gco2_per_kwh": max(0.0, mu + k * (v - mu))}))
    note = "values shrunk toward their mean by the forecast's own error (winner's-curse correction)"
    return forecast.model_copy(update={"points": points, "notes": [*forecast.notes, note]})


def carbon_g(power_w: float, start: datetime, duration_s: float, forecast: Forecast) -> float:
    """``∫ P·CI dt`` for constant power over [start, start+duration] (grams CO2e)."""
    integral = IntensityIntegral(forecast, start)
    mean = float(integral.mean(0.0, duration_s))
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
