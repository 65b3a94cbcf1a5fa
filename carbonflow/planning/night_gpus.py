"""Fit a night's plans onto the GPUs there are: carbon-aware starts that do not all land in one hour.

``plan_night`` chooses each job's start alone, so on a shared cluster every job wants the same
low-carbon hour; fifty jobs on eight GPUs then queue there and miss their finish-by. This step books each
GPU group (a co-located pair, or one job on its containers' GPUs) on a :class:`CapacityLedger`, tightest
deadline first: a group keeps its planned start when its GPUs are free then, otherwise it moves to the
lowest-carbon start (by the same forecast) at which it fits and still finishes by its deadline.

When some group fits nowhere before its deadline, the night is over-committed by its predictions (a first
night predicts from the jobs' declared work, an upper bound): carbon shifting is dropped for the night and
every group starts now, to take a GPU as one frees, earliest deadline first (``gpu_groups`` order; the
operators give the group tasks priority weights in that order). Each plan's reason says which it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import numpy as np

from carbonflow.carbon.windows import held_window_means, search_starts
from carbonflow.domain import Forecast, JobSpec, Plan, Profile
from carbonflow.planning.batch_size import deadline_epochs
from carbonflow.planning.capacity import CapacityLedger
from carbonflow.planning.learning import JobHistory
from carbonflow.units import emissions_g_from

SLOT_S = 900.0
"""Start times considered when a group must move: every quarter hour."""


def gpu_groups(plans: Sequence[Plan]) -> list[list[Plan]]:
    """The night's GPU groups: each co-located pair once, every other job alone; in order of planned start."""
    by_name = {p.job: p for p in plans}
    groups: list[list[Plan]] = []
    seen: set[str] = set()
    for p in sorted(plans, key=lambda p: (p.start, p.finish_by or p.start + timedelta(days=3650))):
        if p.job not in seen:
            members = [p, *(by_name[o] for o in p.colocated_with if o in by_name)]
            seen.update(m.job for m in members)
            groups.append(members)
    return groups


def _duration_s(group: list[Plan]) -> float:
    return max(p.predicted_duration_s for p in group)


def deadline_factors(
    plans: Sequence[Plan], specs: Mapping[str, JobSpec], profiles: Mapping[str, Profile], history: JobHistory | None
) -> dict[str, float]:
    """Job → the factor (>= 1) its predicted duration is stretched by for deadline checks: the planner's own
    margin for jobs trained to a target (:func:`deadline_epochs` over the epochs the prediction expects)."""
    factors = {}
    for plan in plans:
        spec, profile = specs[plan.job], profiles[plan.job]
        point = next((pt for pt in profile.points if pt.config.key() == plan.config.key()), None)
        most = deadline_epochs(spec, history, plan.config.batch_size)
        if point is None or most is None or not profile.samples_per_epoch or plan.predicted_duration_s <= 0:
            factors[plan.job] = 1.0
            continue
        solo_s = profile.samples_per_epoch / point.throughput_samples_per_s
        factors[plan.job] = max(1.0, most * solo_s / plan.predicted_duration_s)
    return factors


def _gpus(group: list[Plan]) -> int:
    return 1 if len(group) > 1 else group[0].config.containers


def _latest_start_s(group: list[Plan], now: datetime, factors: Mapping[str, float]) -> float:
    """Latest start that still finishes by every member's finish-by, with the planner's deadline margin."""
    latest = [
        (p.finish_by - now).total_seconds() - p.predicted_duration_s * factors.get(p.job, 1.0)
        for p in group
        if p.finish_by is not None
    ]
    return min(latest, default=float("inf"))


def _best_start_s(
    group: list[Plan], ledger: CapacityLedger, forecast: Forecast | None, now: datetime, latest_s: float
) -> float | None:
    """The lowest-carbon start before ``latest_s`` at which the group fits (None: there is none), from
    carbonflow's one start search on a grid of the ledger's slots."""
    duration_s, gpus = _duration_s(group), _gpus(group)
    horizon_s = (len(ledger.demand) - 1) * ledger.slot_s
    latest_s = min(latest_s, horizon_s - ledger.slot_s)
    if latest_s < 0:
        return None
    if forecast is None:
        candidates = np.arange(0.0, latest_s + 1e-9, ledger.slot_s)
        return next((float(s) for s in candidates if ledger.fits(s, s + duration_s, gpus)), None)
    found = search_starts(forecast, [duration_s], now, [latest_s], step_s=ledger.slot_s, hold_edges=True)
    k = found.first_that(lambda s: s % ledger.slot_s < 1e-6 and ledger.fits(s, s + duration_s, gpus))
    return None if k is None else float(found.start_s[k])


def fit_plans_to_gpus(
    plans: Sequence[Plan],
    gpus: int,
    now: datetime,
    forecast: Forecast | None = None,
    deadline_factor: Mapping[str, float] | None = None,
) -> list[Plan]:
    """``plans`` with starts moved so that no more than ``gpus`` GPUs are ever busy; output order = input order.

    ``forecast`` is the forecast the plans were made with (None: no forecast, a moved group takes the
    earliest start that fits). Durations are the plans' predictions; a moved group keeps the planner's deadline
    margin (``deadline_factor``, from :func:`deadline_factors`; default 1).
    """
    factors = deadline_factor or {}
    if gpus < 1:
        raise ValueError(f"gpus={gpus} is not allowed; a night needs at least one GPU")
    horizon_s = max([_duration_s(g) + (g[0].start - now).total_seconds() for g in gpu_groups(plans)] + [86400.0])
    ledger = CapacityLedger(gpus, SLOT_S, 2 * horizon_s + SLOT_S)
    moved: dict[str, Plan] = {}
    for group in sorted(gpu_groups(plans), key=lambda g: (_latest_start_s(g, now, factors), g[0].start)):
        planned_s = max((group[0].start - now).total_seconds(), 0.0)
        duration_s, need = _duration_s(group), _gpus(group)
        start_s, note = planned_s, None
        if not ledger.fits(planned_s, planned_s + duration_s, need):
            start_s = _best_start_s(group, ledger, forecast, now, _latest_start_s(group, now, factors))
            if start_s is None:
                return _over_committed(plans, gpus, now)
            note = _move_note(group[0].start, now + timedelta(seconds=start_s), gpus)
        ledger.add(start_s, start_s + duration_s, need)
        for p in group:
            moved[p.job] = _moved(p, now + timedelta(seconds=start_s), note, forecast, now)
    return [moved[p.job] for p in plans]


def _move_note(planned: datetime, start: datetime, gpus: int) -> str:
    return f"moved from {planned:%H:%M} to {start:%H:%M} UTC: all {gpus} GPUs are booked at the planned start"


def _over_committed(plans: Sequence[Plan], gpus: int, now: datetime) -> list[Plan]:
    """Every group starts now and takes a GPU as one frees, earliest deadline first; no carbon shift tonight."""
    booked_h = sum(_duration_s(g) * _gpus(g) for g in gpu_groups(plans)) / 3600
    note = (
        f"tonight's predicted work ({booked_h:.1f} GPU-h) does not fit {gpus} GPUs before every finish-by: "
        "no carbon shift tonight, jobs start as GPUs free, earliest deadline first"
    )
    return [_moved(p, now, note, None, now) for p in plans]


def _moved(plan: Plan, start: datetime, note: str | None, forecast: Forecast | None, now: datetime) -> Plan:
    if note is None:
        return plan
    update: dict = {"start": start, "reason": f"{plan.reason} ({note})"}
    if forecast is not None:
        mean = float(held_window_means(forecast, now, (start - now).total_seconds(), plan.predicted_duration_s)[0])
        update["predicted_emissions_g"] = emissions_g_from(plan.predicted_energy_j, mean)
    return plan.model_copy(update=update)
