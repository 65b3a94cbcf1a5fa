"""Seeded random nights for the plan-equality check (tests/planning/test_pair_plans_unchanged.py).

Each night: two to four jobs of the five objectives, one or two regions, pair profiles for every pair, random
deadlines (some none), a random forecast whose first slot starts at or before a ``now`` with a fractional second
(some nights none; some forecasts end before the deadlines, with their last slot the cheapest, or start after
``now``: where the held edges make starts tie), and on some nights recent actuals (the robust start search) or a
run history (fixed costs).
``night_record`` keeps what a plan decides: configuration, start, predictions, partner and reason.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
from planning_factories import NOW, make_forecast, make_profile, make_spec

from carbonflow.domain import ForecastPoint, Plan
from carbonflow.planning import JobHistory, PairProfile, RealisedRun, plan_night

OBJECTIVES = ("carbon", "energy", "time", "edp", "eds:2", "eds:50", "zeus:0.5", "zeus:1")
NIGHTS = 120


def _rows(rng: np.random.Generator) -> list[tuple[float, float, float]]:
    speed, power = float(rng.uniform(60, 140)), float(rng.uniform(150, 240))
    limits = (250, 225, 200, 175)[: int(rng.integers(1, 5))]
    return [(pl, speed * (pl / 250) ** 0.3, power * (pl / 250) ** 0.9) for pl in limits]


def _actuals(rng: np.random.Generator, now) -> list[ForecastPoint]:
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=7)
    hours = np.arange(7 * 24)
    values = 200 + 80 * np.sin(2 * np.pi * hours / 24) + rng.normal(0, 20, hours.size)
    return [
        ForecastPoint(start=start + timedelta(hours=int(h)), length_s=3600, gco2_per_kwh=float(v))
        for h, v in zip(hours, values, strict=True)
    ]


def _history(rng: np.random.Generator, names: list[str], now) -> JobHistory:
    records = [
        RealisedRun(
            job=job,
            config_key="c1-pl250",
            finished_at=now - timedelta(days=d),
            predicted_duration_s=1000.0 * d,
            realised_duration_s=1000.0 * d * float(rng.uniform(1.0, 1.3)) + 60,
            predicted_energy_j=1e5 * d,
            realised_energy_j=1e5 * d * float(rng.uniform(1.0, 1.3)) + 5e3,
        )
        for job in names
        for d in (1, 2, 3)
    ]
    return JobHistory(records)


def random_night(seed: int) -> dict[str, Any]:
    """The arguments of one seeded night's ``plan_night``."""
    rng = np.random.default_rng([22, 4, seed])
    now = NOW + timedelta(seconds=float(rng.uniform(0, 1800)))
    names = [f"j{i}" for i in range(int(rng.integers(2, 5)))]
    regions = ["GB"] * len(names) if rng.random() < 0.8 else [str(rng.choice(["GB", "FR"])) for _ in names]
    specs = []
    for name, region in zip(names, regions, strict=True):
        hours = float(rng.uniform(0.4, 14)) if rng.random() < 0.8 else None
        extra = {"finish_by": None} if hours is None else {}
        specs.append(
            make_spec(
                name,
                hours=hours or 1.0,
                epochs=int(rng.integers(1, 5)),
                objective=str(rng.choice(OBJECTIVES)),
                max_slowdown=float(rng.choice([0.1, 0.3, 1.0])),
                region=region,
                **extra,
            )
        )
    specs = [s.model_copy(update={"finish_by": s.finish_by and s.finish_by + (now - NOW)}) for s in specs]
    profiles = {n: make_profile(rows=_rows(rng), job=n) for n in names}
    slot_s = float(rng.choice([900.0, 1800.0, 3600.0]))
    start = now - timedelta(seconds=float(rng.uniform(0, slot_s)))
    forecasts = {}
    for region in sorted(set(regions)):
        values = rng.uniform(50, 400, int(rng.integers(8, 49)))
        edge = rng.choice(["none", "short", "late", "cheap end"], p=[0.55, 0.15, 0.15, 0.15])
        if edge != "none":  # a forecast that ends before the deadlines (its last slot the cheapest), or starts late
            values = values[: max(2, values.size // 4)]
            values[-1] = 10.0 if edge == "cheap end" else values[-1]
        first = start + timedelta(seconds=float(rng.uniform(0, 3600))) if edge == "late" else start
        forecast = make_forecast(list(values), start=first, slot_s=slot_s, region=region)
        forecasts[region] = forecast if rng.random() < 0.9 else None
    pairs = [
        PairProfile(a, b, float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.5, 1.0)), float(rng.uniform(150, 300)))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    actuals = {r: _actuals(rng, now) for r in forecasts} if rng.random() < 0.3 else None
    history = _history(rng, names, now) if rng.random() < 0.3 else None
    return {
        "specs": specs,
        "profiles": profiles,
        "forecasts": forecasts,
        "now": now,
        "pair_profiles": pairs,
        "history": history,
        "intensity_history": actuals,
    }


def night_record(plans: list[Plan]) -> list[dict[str, Any]]:
    """What each plan decides, exactly (floats as Python writes them, times to the microsecond)."""
    return [
        {
            "job": p.job,
            "config": p.config.model_dump(mode="json"),
            "start": p.start.isoformat(),
            "duration_s": repr(p.predicted_duration_s),
            "energy_j": repr(p.predicted_energy_j),
            "emissions_g": repr(p.predicted_emissions_g),
            "colocated_with": list(p.colocated_with),
            "reason": p.reason,
        }
        for p in plans
    ]


def plan_random_night(seed: int, planner: Any = plan_night) -> list[dict[str, Any]]:
    return night_record(planner(**random_night(seed)))
