"""Where a plan's run may start, and the one start search over those starts.

Its own module so that a plan's start is found in one place: :func:`carbonflow.planning.optimizer.plan_job`
asks it for every configuration's latest start and candidate starts, and a co-located pair
(:mod:`carbonflow.planning.pairs`) for its joint starts; both end in
:func:`carbonflow.carbon.windows.search_starts`, carbonflow's one start search.

API others call::

    latest_starts(spec, forecast, now, durations_s, within, margin) -> (latest_s, squeezed)
    plan_starts(forecast, now, durations_s, latest_s, intensity_history, notes) -> StartSearch
    run_now_ci(forecast, now, duration_s) -> float
    pair_starts(forecast, now, overlap_s, device_s, latest_s) -> np.ndarray   # a co-located pair's joint starts
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from carbonflow.carbon.windows import StartSearch, search_starts, slot_boundaries_s
from carbonflow.domain import Forecast, ForecastPoint, JobSpec

_EPS = 1e-9


def latest_starts(
    spec: JobSpec,
    forecast: Forecast | None,
    now: datetime,
    durations_s: np.ndarray,
    within: np.ndarray,
    margin: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate run (``durations_s``; ``within``: inside the slowdown bound; ``margin``: the deadline margin
    of a target-trained job, see :func:`~carbonflow.planning.batch_size.deadline_margins`) the latest start (s after
    now; < 0: cannot meet finish_by even now) and whether it was left out for want of room for its likely most
    epochs."""
    durations = durations_s
    squeezed = np.zeros(durations.size, dtype=bool)
    if spec.finish_by is not None:
        finish_by_s = (spec.finish_by - now).total_seconds()
        latest = finish_by_s - durations
        if margin is not None:  # plan the latest start for the job's likely most epochs
            roomy = durations * margin <= finish_by_s + _EPS
            if np.any(roomy & within):  # configurations without room for them are left out
                squeezed = (latest >= -_EPS) & ~roomy
                latest = np.where(roomy, finish_by_s - durations * margin, -1.0)
            else:  # none has room: start now
                latest = np.where(latest >= -_EPS, np.maximum(0.0, finish_by_s - durations * margin), latest)
        return latest, squeezed
    if forecast is not None:
        return np.maximum(0.0, (forecast.points[-1].end - now).total_seconds() - durations), squeezed
    return np.zeros(durations.size), squeezed


def plan_starts(
    forecast: Forecast | None,
    now: datetime,
    durations_s: np.ndarray,
    latest_s: np.ndarray,
    intensity_history: Sequence[ForecastPoint] | None,
    notes: list[str],
) -> StartSearch:
    """Candidate starts of every configuration: carbonflow's one start search (carbon.windows.search_starts);
    a note says when the forecast was checked against the recent actuals."""
    latest_or_none = np.where(latest_s >= -_EPS, latest_s, -1.0)
    if forecast is None:
        return StartSearch(*_no_forecast_starts(latest_or_none), 0, 0.0)
    found = search_starts(forecast, durations_s, now, latest_or_none, history=intensity_history, hold_edges=True)
    if found.shrunk_slots:
        notes.append("forecast checked against the recent daily profile (robust to lead-time error)")
    return found


def run_now_ci(forecast: Forecast | None, now: datetime, duration_s: float) -> float:
    """The forecast's mean intensity over a run started now (edges held; 0 without a forecast)."""
    if forecast is None:
        return 0.0
    return float(search_starts(forecast, [duration_s], now, [0.0], hold_edges=True).mean_gco2_per_kwh[0])


def _no_forecast_starts(latest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Without a forecast every configuration that can still finish starts now, at intensity 0."""
    run = np.flatnonzero(latest >= -_EPS)
    zero = np.zeros(run.size)
    return run, zero, zero, zero


def pair_starts(
    forecast: Forecast | None, now: datetime, overlap_s: float, device_s: float, latest_s: float
) -> np.ndarray:
    """A co-located pair's candidate joint starts (s after now, ascending) in ``[0, latest_s]``: the one start
    search over a two-segment window, the overlap (both jobs) then the tail (one job alone) until ``device_s``
    (``search_starts(split_s=overlap_s)``), the forecast's edges held as a solo plan's are and its own slot
    boundaries kept as candidates (the pair's windows are scored on them). The pair scores the
    starts itself (each segment with its own energy, on each job's objective:
    :func:`carbonflow.planning.pairs.pair_option`), so the search's own ranking, its risk terms and its guard are
    not asked for. Starts are kept to the millisecond, the latest one rounded to it (as a pair's starts always
    were). Without a forecast every start costs the same and the pair starts now."""
    if forecast is None:
        return np.zeros(1)
    found = search_starts(
        forecast,
        [device_s],
        now,
        [round(latest_s, 3)],
        split_s=overlap_s,
        boundaries_s=slot_boundaries_s(forecast, now),
        hold_edges=True,
        risk_aversion=0.0,
        guard_z=0.0,
    )
    return found.start_s
