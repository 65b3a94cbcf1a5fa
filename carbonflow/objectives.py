"""What the planner minimises, as selector objects (after Zeus's ``optimizer/power_limit.py``).

Each objective holds its parameters and one vectorised formula, ``cost(energy_j, time_s, emissions_g, ref)``
(arrays in, array of costs out, lower is better); :meth:`Objective.select` picks the cheapest allowed
candidate. :class:`SlowdownConstraint` is the bound every objective is selected under. The objective text
of a JobSpec (``carbon``, ``energy``, ``time``, ``edp``, ``eds:k``, ``zeus:η``; plus ``gain`` for reports)
becomes an object once, in :func:`objective_for`. :func:`choose_power_limit` picks one device's power limit by an
objective from per-limit time and power of the same work (the planner's rule, and the wrapper's when a training
sweeps its limits inside itself). Below planning and execution both: the planner and the wrapper import it from
here.

* ``Energy`` E; ``Time`` T; ``Carbon`` grams CO2e (E × mean intensity over the run);
* ``EDP`` E·T; ``EDS(k)`` α·E + β·T with α = (k−1)/(k·E_ref), β = 1/(k·T_ref) (Koszczał et al., Euro-Par
  2023), 1.0 at the reference;
* ``ZeusCost(η)`` η·E + (1−η)·MAXPOWER·T (You et al., NSDI 2023);
* ``Gain`` −(percentage energy gain − percentage time loss) against the reference (negated: a cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from carbonflow.domain import parse_objective


@dataclass(frozen=True)
class Reference:
    """The reference run of the relative metrics: the default configuration (J, s) and MAXPOWER (W)."""

    energy_j: float
    time_s: float
    max_power_w: float


def _a(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=float)


@dataclass(frozen=True)
class Objective:
    """Base selector: subclasses give ``cost``; ``select`` is the same for all."""

    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        raise NotImplementedError

    def select(self, energy_j, time_s, emissions_g, ref: Reference, allowed=None) -> int:
        """Index of the cheapest candidate among ``allowed`` (all when None); ties to the lower index."""
        cost = self.cost(energy_j, time_s, emissions_g, ref)
        ok = np.ones(cost.shape, dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
        if not ok.any():
            raise ValueError("no candidate is allowed; relax the constraint or add candidates")
        return int(np.argmin(np.where(ok, cost, np.inf)))


@dataclass(frozen=True)
class Energy(Objective):
    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        return _a(energy_j) + 0.0 * _a(time_s)


@dataclass(frozen=True)
class Time(Objective):
    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        return _a(time_s) + 0.0 * _a(energy_j)


@dataclass(frozen=True)
class Carbon(Objective):
    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        return _a(emissions_g) + 0.0 * _a(energy_j)


@dataclass(frozen=True)
class EDP(Objective):
    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        return _a(energy_j) * _a(time_s)


@dataclass(frozen=True)
class EDS(Objective):
    k: float

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k={self.k} is not allowed; EDS needs k >= 1")

    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        if ref.energy_j <= 0 or ref.time_s <= 0:
            raise ValueError(
                f"energy_ref_j={ref.energy_j}, time_ref_s={ref.time_s}: EDS needs a positive reference energy and time"
            )
        alpha = (self.k - 1) / (self.k * ref.energy_j)
        beta = 1 / (self.k * ref.time_s)
        return alpha * _a(energy_j) + beta * _a(time_s)


@dataclass(frozen=True)
class ZeusCost(Objective):
    eta: float

    def __post_init__(self) -> None:
        if not 0 <= self.eta <= 1:
            raise ValueError(f"eta={self.eta} is not allowed; it must be between 0 and 1")

    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        return self.eta * _a(energy_j) + (1 - self.eta) * ref.max_power_w * _a(time_s)


@dataclass(frozen=True)
class Gain(Objective):
    """Percentage energy gain − percentage time loss against the reference, negated (a cost)."""

    def cost(self, energy_j, time_s, emissions_g, ref: Reference) -> np.ndarray:
        if ref.energy_j <= 0 or ref.time_s <= 0:
            raise ValueError(
                f"energy_ref_j={ref.energy_j}, time_ref_s={ref.time_s}: the metric needs positive reference values"
            )
        gain = 100.0 * (ref.energy_j - _a(energy_j)) / ref.energy_j
        loss = 100.0 * (_a(time_s) - ref.time_s) / ref.time_s
        return -(gain - loss)


@dataclass(frozen=True)
class SlowdownConstraint:
    """Zeus's slowdown bound: a candidate is allowed when ``time ≤ (1 + max_slowdown) × reference time``
    (``max_slowdown=None``: every candidate)."""

    max_slowdown: float | None

    def allowed(self, time_s, ref: Reference) -> np.ndarray:
        t = _a(time_s)
        if self.max_slowdown is None:
            return np.ones(t.shape, dtype=bool)
        return t <= ref.time_s * (1 + self.max_slowdown) * (1 + 1e-9)


def objective_for(text: str) -> Objective:
    """The selector for an objective text (``gain`` included); ValueError naming the value otherwise."""
    if text == "gain":
        return Gain()
    name, param = parse_objective(text)
    simple = {"carbon": Carbon, "energy": Energy, "time": Time, "edp": EDP}
    if name in simple:
        return simple[name]()
    if name == "eds":
        return EDS(float(param))  # type: ignore[arg-type]
    return ZeusCost(float(param))  # type: ignore[arg-type]


def choose_power_limit(
    power_limits_w: Sequence[float],
    time_s: Sequence[float],
    power_w: Sequence[float],
    *,
    objective: str = "energy",
    max_slowdown: float | None = 0.10,
    default_power_limit_w: float | None = None,
    max_power_w: float | None = None,
) -> float:
    """The best power limit for one device/job from its per-limit time and power for the same work.

    ``time_s[i]`` and ``power_w[i]`` are the time and mean power of the same amount of work at
    ``power_limits_w[i]``. The reference is ``default_power_limit_w`` (else the highest limit); limits slower
    than ``(1 + max_slowdown) ×`` the reference are excluded (``max_slowdown=None``: no bound). Under a fixed
    intensity the ``carbon`` objective equals ``energy``. Ties go to the higher limit (less slowdown).
    O(len(power_limits_w)).
    """
    if not (len(power_limits_w) == len(time_s) == len(power_w)) or not power_limits_w:
        raise ValueError(
            f"power_limits_w, time_s, power_w must be non-empty and of equal length; got "
            f"{len(power_limits_w)}, {len(time_s)}, {len(power_w)}"
        )
    pls = np.asarray(power_limits_w, dtype=float)
    t = np.asarray(time_s, dtype=float)
    e = t * np.asarray(power_w, dtype=float)
    ref_i = (
        int(np.argmax(pls)) if default_power_limit_w is None else int(np.argmin(np.abs(pls - default_power_limit_w)))
    )
    ref = Reference(energy_j=float(e[ref_i]), time_s=float(t[ref_i]), max_power_w=float(max_power_w or pls.max()))
    obj = objective_for("energy" if parse_objective(objective)[0] == "carbon" else objective)
    cost = obj.cost(e, t, e, ref)
    ok = SlowdownConstraint(max_slowdown).allowed(t, ref)
    scale = max(float(np.max(np.abs(cost))), 1e-300)
    order = np.lexsort((-pls, np.round(cost / scale, 12), ~ok))
    return float(pls[int(order[0])])
