"""Choose when to run a deferrable job from a carbon-intensity forecast (pure: no I/O, no clock).

* :func:`mean_intensity_gco2_per_kwh` — time-weighted mean intensity of a series over ``[start, end)``.
* :func:`choose_start` — the contiguous start in ``[earliest, finish_by - duration]`` with the lowest expected
  intensity. The robust variant (default) does not take a far-ahead forecast at face value: forecast error grows
  with lead time (calibrated on real published forecasts, see :mod:`carbonflow.carbon.calibration`), so each
  slot's forecast is shrunk toward the recent daily profile (the same hour on the last 7 days of actuals,
  level-matched to the forecast) in proportion to its error variance against the profile's day-to-day
  variance — a per-slot Bayesian update. Near slots keep their forecast; far, noisy slots lean on the profile.
  An optional ``risk_aversion`` also penalises the uncertainty of the gain over running at once.

Every choice meets ``finish_by`` when that is possible; with no usable forecast it starts at once and says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from pydantic import BaseModel, ConfigDict

from carbonflow.carbon.base import require_utc
from carbonflow.carbon.calibration import LeadTimeErrorModel, default_error_model
from carbonflow.domain import Forecast, ForecastPoint
from carbonflow.settings import start_guard_z

DEFAULT_RISK_AVERSION = 0.0
START_GUARD_Z = 1.0
"""Safer starts: a later start is preferred to running at once only when its expected gain exceeds this many
standard deviations of (its error - run-now's error), less ``START_GUARD_TOLERANCE`` of run-now's intensity."""
START_GUARD_TOLERANCE = 0.01
"""The loss against running at once that the guard tolerates (a fraction of run-now's expected intensity)."""
NOWCAST = True
"""With recent actuals, the newest one that ended by the decision corrects the forecast's level (:func:`nowcast`).
Chosen, with ``NOWCAST_GUARD`` and ``START_GUARD_Z``, on the simulated traces only by
``benchmarks/choose_start_guard.py`` (rule and table in ``benchmarks/results/start_guard_choice.json``)."""
NOWCAST_GUARD = False
"""Whether the nowcast also narrows the error the safer-start guard allows for (the AR(1) conditional variance);
off: on the simulated traces it needed a larger z for the same share of worse starts and kept less of the cut."""
NOWCAST_MAX_AGE_S = 3600.0
"""The newest actual corrects the forecast (:func:`nowcast`) only when it ended at most this long before the
decision (an hourly series' last slot; older, the forecast is left as issued)."""
HISTORY_DAYS = 7
HISTORY_MAX_BACK_DAYS = 14
_DAY_S = 86400.0
_COVERED = 0.999
_MAE_TO_SIGMA = math.sqrt(math.pi / 2.0)


class WindowChoice(BaseModel):
    """When to start, what the forecast expects, and why (one line a person can read)."""

    model_config = ConfigDict(frozen=True)

    start: datetime
    end: datetime
    expected_gco2_per_kwh: float | None
    run_now_gco2_per_kwh: float | None
    reason: str
    fallback: bool
    robust: bool = False
    provider: str | None = None
    signal_kind: str | None = None


_SERIES_CACHE: dict[int, tuple[Sequence[ForecastPoint], datetime, np.ndarray, np.ndarray, np.ndarray]] = {}
_SERIES_CACHE_SIZE = 32


def _series(points: Sequence[ForecastPoint]) -> tuple[datetime, np.ndarray, np.ndarray, np.ndarray]:
    """(first slot start, starts and ends in exact seconds after it, values), overlaps cut; remembered for the
    last few point lists (by identity: a night plans many jobs and pairs on the same forecast)."""
    hit = _SERIES_CACHE.get(id(points))
    if hit is not None and hit[0] is points:
        return hit[1], hit[2], hit[3], hit[4]
    pts = sorted(points, key=lambda p: p.start)
    first = pts[0].start
    t0 = np.array([(p.start - first).total_seconds() for p in pts], dtype=float)
    t1 = np.array([(p.end - first).total_seconds() for p in pts], dtype=float)
    val = np.array([p.gco2_per_kwh for p in pts], dtype=float)
    if len(pts) > 1:  # drop overlaps: a slot starting before the previous one ended is cut
        t0[1:] = np.maximum(t0[1:], t1[:-1])
        keep = t1 > t0
        t0, t1, val = t0[keep], t1[keep], val[keep]
    if len(_SERIES_CACHE) >= _SERIES_CACHE_SIZE:
        _SERIES_CACHE.pop(next(iter(_SERIES_CACHE)))
    _SERIES_CACHE[id(points)] = (points, first, t0, t1, val)  # holds the list, so its id is not reused
    return first, t0, t1, val


def _arrays(
    points: Sequence[ForecastPoint], origin: datetime | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slot starts, ends (epoch seconds, or exact seconds after ``origin``) and values, overlaps cut."""
    first, t0, t1, val = _series(points)
    shift = first.timestamp() if origin is None else (first - origin).total_seconds()
    return t0 + shift, t1 + shift, val.copy()


def _cumulative(t0: np.ndarray, t1: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Breakpoints x and the cumulative integral F(x) and covered time C(x) (constant across gaps)."""
    length = t1 - t0
    energy = np.concatenate([[0.0], np.cumsum(val * length)])
    cover = np.concatenate([[0.0], np.cumsum(length)])
    x = np.empty(2 * len(t0))
    x[0::2], x[1::2] = t0, t1
    f = np.empty_like(x)
    f[0::2], f[1::2] = energy[:-1], energy[1:]
    c = np.empty_like(x)
    c[0::2], c[1::2] = cover[:-1], cover[1:]
    return x, f, c


def _window_stats(x: np.ndarray, f: np.ndarray, c: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    integral = np.interp(ends, x, f) - np.interp(starts, x, f)
    covered = np.interp(ends, x, c) - np.interp(starts, x, c)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(covered > 0, integral / np.where(covered > 0, covered, 1.0), np.nan)
    return mean, covered / np.maximum(ends - starts, 1e-9)


def mean_intensity_gco2_per_kwh(points: Sequence[ForecastPoint], start: datetime, end: datetime) -> float:
    """Time-weighted mean intensity over ``[start, end)`` of the slots that cover it.

    Raises ValueError when ``end <= start`` or no slot overlaps the interval.
    """
    start = require_utc("start", start)
    end = require_utc("end", end)
    if end <= start:
        raise ValueError(f"end={end.isoformat()} is not allowed; it must be after start={start.isoformat()}")
    if not points:
        raise ValueError("points=[] is not allowed; give at least one slot overlapping the interval")
    x, f, c = _cumulative(*_arrays(points))
    mean, _ = _window_stats(x, f, c, np.array([start.timestamp()]), np.array([end.timestamp()]))
    if not np.isfinite(mean[0]):
        raise ValueError(
            f"no slot overlaps {start.isoformat()} .. {end.isoformat()}; the series covers "
            f"{datetime.fromtimestamp(x[0], UTC).isoformat()} .. {datetime.fromtimestamp(x[-1], UTC).isoformat()}"
        )
    return float(mean[0])


def _sigma_abs(
    forecast: Forecast, t1: np.ndarray, val: np.ndarray, error_model: LeadTimeErrorModel | None
) -> np.ndarray:
    """Absolute error standard deviation of each slot, from the forecast's own error table or the calibration."""
    lead_h = np.maximum((t1 - forecast.issued_at.timestamp()) / 3600.0, 0.0)
    if forecast.error_mae_by_lead_h and error_model is None:
        bounds = np.array(sorted(forecast.error_mae_by_lead_h))
        mae = np.array([forecast.error_mae_by_lead_h[b] for b in bounds])
        idx = np.clip(np.searchsorted(bounds, lead_h, side="left"), 0, len(bounds) - 1)
        return mae[idx] * _MAE_TO_SIGMA
    model = error_model or default_error_model()
    return model.sigma_rel(lead_h) * val


def robust_penalty(
    sigma_window: np.ndarray, offset_s: np.ndarray, phi_per_h: float, risk_aversion: float
) -> np.ndarray:
    """``risk_aversion`` x the standard deviation of (error of a candidate window - error of running at once).

    ``sigma_window[..., 0]`` is the run-at-once window; errors of windows ``offset_s`` apart are correlated with
    ``phi_per_h ** hours`` (the calibrated AR(1) correlation), so nearby windows share most of their error and
    only the part that differs counts against moving. Works on 1-D candidates or (starts x candidates) arrays.
    """
    sig0 = sigma_window[..., :1]
    rho = float(phi_per_h) ** (np.abs(offset_s) / 3600.0)
    var = sigma_window**2 + sig0**2 - 2.0 * rho * sigma_window * sig0
    return risk_aversion * np.sqrt(np.maximum(var, 0.0))


def daily_profile(
    slot_start_s: np.ndarray,
    slot_length_s: np.ndarray,
    history: Sequence[ForecastPoint],
    now_s: float,
    days: int = HISTORY_DAYS,
) -> tuple[np.ndarray, np.ndarray]:
    """Per slot: mean and day-to-day variance of the actuals at the same time on the ``days`` latest days known at
    ``now_s`` (looking back at most ``HISTORY_MAX_BACK_DAYS``); NaN where fewer than two days are known."""
    n = len(slot_start_s)
    nan = np.full(n, np.nan)
    if not history or n == 0:
        return nan, nan.copy()
    x, f, c = _cumulative(*_arrays(history))
    back = np.arange(1, HISTORY_MAX_BACK_DAYS + 1, dtype=float)
    s0 = slot_start_s[:, None] - back[None, :] * _DAY_S
    s1 = s0 + slot_length_s[:, None]
    mean, cov = _window_stats(x, f, c, s0.ravel(), s1.ravel())
    mean, cov = mean.reshape(s0.shape), cov.reshape(s0.shape)
    valid = (s1 <= now_s + 1e-6) & (cov >= _COVERED) & np.isfinite(mean)
    valid &= np.cumsum(valid, axis=1) <= days
    return _profile_stats(mean, valid)


def _profile_stats(samples: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count = valid.sum(axis=-1)
    vals = np.where(valid, samples, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = vals.sum(axis=-1) / count
        var = (np.where(valid, (samples - mean[..., None]) ** 2, 0.0)).sum(axis=-1) / (count - 1)
    ok = count >= 2
    return np.where(ok, mean, np.nan), np.where(ok, var, np.nan)


def shrink_toward_profile(
    forecast: np.ndarray, sigma_abs: np.ndarray, profile: np.ndarray, profile_var: np.ndarray
) -> np.ndarray:
    """Posterior intensity per slot (last axis): ``(f V + P' N) / (V + N)`` with N the forecast's error variance
    and V the profile's day-to-day variance; ``P'`` is the profile shifted to the forecast's mean level over the
    slots where it is known (only its shape is trusted). Slots without a profile keep the forecast."""
    known = np.isfinite(profile) & np.isfinite(profile_var)
    if not known.any():
        return forecast
    with np.errstate(invalid="ignore", divide="ignore"):
        p_level = np.nanmean(np.where(known, profile, np.nan), axis=-1, keepdims=True)
        f_level = np.nanmean(np.where(known, forecast, np.nan), axis=-1, keepdims=True)
        shifted = profile - p_level + f_level
        v = np.maximum(profile_var, 1e-6)
        n = sigma_abs**2
        post = (forecast * v + shifted * n) / (v + n)
    return np.where(known, post, forecast)


def _fmt(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _fallback(earliest: datetime, duration_s: float, reason: str, forecast: Forecast | None, run_now=None):
    return WindowChoice(
        start=earliest,
        end=earliest + timedelta(seconds=duration_s),
        expected_gco2_per_kwh=run_now,
        run_now_gco2_per_kwh=run_now,
        reason=reason,
        fallback=True,
        provider=forecast.provider if forecast else None,
        signal_kind=forecast.signal_kind if forecast else None,
    )


def _validate(duration_s: float, earliest: datetime, finish_by: datetime, step_s: float | None):
    if not duration_s or duration_s <= 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration_s={duration_s!r} is not allowed; it must be a positive number of seconds")
    if step_s is not None and (step_s <= 0 or not math.isfinite(step_s)):
        raise ValueError(f"step_s={step_s!r} is not allowed; give a positive number of seconds or None")
    return require_utc("earliest", earliest), require_utc("finish_by", finish_by)


def nowcast(
    t0: np.ndarray,
    t1: np.ndarray,
    val: np.ndarray,
    history: Sequence[ForecastPoint] | None,
    now_s: float,
    phi_per_h: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(the forecast corrected by the newest actual, the share of each slot's error variance left).

    The forecast's error is an AR(1) process along the lead time (the calibration's ``phi_per_h``), so the error
    seen now carries over to a slot ``h`` hours later with weight ``phi ** h``: with ``r`` = log(newest actual
    that ended by ``now_s``, at most ``NOWCAST_MAX_AGE_S`` before it / the forecast of the slot holding now), each
    slot becomes ``value x exp(r phi ** h)`` and keeps ``1 - phi ** 2h`` of its error variance. An old issue's
    level is corrected where the next hours are concerned and left alone far ahead. No actual ended by now (or
    none recent, or a value <= 0): the forecast unchanged. Actuals after ``now_s`` are never read."""
    left = np.ones_like(val)
    if not history or val.size == 0:
        return val, left
    h0, h1, hv = _arrays(history)
    known = (h1 <= now_s + 1e-6) & (h1 >= now_s - NOWCAST_MAX_AGE_S) & (hv > 0)
    ahead = np.flatnonzero(t1 > now_s + 1e-6)
    if not known.any() or not ahead.size or val[ahead[0]] <= 0:
        return val, left
    j = int(np.flatnonzero(known)[-1])
    lag_h = np.maximum(0.5 * (t0 + t1) - 0.5 * (h0[j] + h1[j]), 0.0) / 3600.0
    weight = float(phi_per_h) ** lag_h
    return val * np.exp(math.log(hv[j] / val[ahead[0]]) * weight), 1.0 - weight**2


def _robust_series(
    forecast: Forecast,
    t0: np.ndarray,
    t1: np.ndarray,
    val: np.ndarray,
    window: tuple[float, float],
    history: Sequence[ForecastPoint] | None,
    error_model: LeadTimeErrorModel | None,
    now_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(posterior values, per-slot error sigma, number of slots shrunk) for the slots overlapping ``window``;
    with ``now_s`` (the decision time) the forecast is first corrected by the newest actual (:func:`nowcast`)."""
    sig = _sigma_abs(forecast, t1, val, error_model)
    if not history:
        return val, sig, 0
    if now_s is not None and NOWCAST:
        phi = (error_model or default_error_model()).phi_per_h
        val, left = nowcast(t0, t1, val, history, now_s, phi)
        sig = sig * np.sqrt(left) if NOWCAST_GUARD else sig
    sel = (t1 > window[0]) & (t0 < window[1])
    profile, pvar = daily_profile(t0[sel], t1[sel] - t0[sel], history, forecast.issued_at.timestamp())
    post = val.copy()
    post[sel] = shrink_toward_profile(val[sel], sig[sel], profile, pvar)
    return post, sig, int(np.isfinite(profile).sum())


@dataclass(frozen=True)
class StartSearch:
    """Every candidate (run, start) of :func:`search_starts`, as parallel arrays.

    ``run[k]`` indexes the duration (a configuration's run) of candidate ``k``; ``start_s[k]`` is its start in
    seconds after ``earliest``; ``mean_gco2_per_kwh`` is the forecast's own mean intensity over the run;
    ``score_gco2_per_kwh`` the intensity it is ranked by (the robust posterior, plus the risk and delay terms).
    """

    run: np.ndarray
    start_s: np.ndarray
    mean_gco2_per_kwh: np.ndarray
    score_gco2_per_kwh: np.ndarray
    shrunk_slots: int
    horizon_end_s: float

    def ranked(self) -> np.ndarray:
        """Candidate indices by score, ties to the earliest start (then the lower run index)."""
        return np.lexsort((self.run, self.start_s, np.round(self.score_gco2_per_kwh, 9)))

    def best(self) -> int:
        """Index of the lowest score, ties to the earliest start (then the lower run index)."""
        return int(self.ranked()[0])

    def first_that(self, fits: Callable[[float], bool]) -> int | None:
        """The best-ranked candidate whose start ``fits`` (e.g. spare GPUs then); None when none does."""
        return next((int(k) for k in self.ranked() if fits(float(self.start_s[k]))), None)


def _held(t0: np.ndarray, t1: np.ndarray, val: np.ndarray, lo: float, hi: float):
    """The series with gaps holding the previous value, the first value held back to ``lo`` and the last one
    forward to ``hi`` (persistence; a plan that relies on it says so)."""
    t1 = t1.copy()
    t1[:-1] = np.maximum(t1[:-1], t0[1:])
    t0 = t0.copy()
    t0[0] = min(t0[0], lo)
    t1[-1] = max(t1[-1], hi)
    return t0, t1, val


def held_window_means(
    forecast: Forecast,
    origin: datetime,
    start_s: np.ndarray | float,
    duration_s: np.ndarray | float,
    *,
    history: Sequence[ForecastPoint] | None = None,
    error_model: LeadTimeErrorModel | None = None,
) -> np.ndarray:
    """Mean forecast intensity over ``[origin + start, origin + start + duration)`` for many windows, the first
    and last values held beyond the forecast and gaps holding the previous value (as :func:`search_starts`
    with ``hold_edges``); a zero-length window gets the value at its start.

    With ``history`` (recent actuals) the means are of the robust posterior :func:`search_starts` ranks by (the
    forecast shrunk toward the recent daily profile by lead-time error), so windows found some other way (a
    co-located pair's overlap and tail) are ranked on the same footing as the one start search's."""
    start = np.atleast_1d(np.asarray(start_s, dtype=float))
    dur = np.broadcast_to(np.asarray(duration_s, dtype=float), start.shape)
    t0, t1, val = _arrays(forecast.points, origin)
    lo = min(0.0, float(start.min(initial=0.0))) - 1.0
    hi = float(np.max(start + dur, initial=0.0))
    t0, t1, val = _held(t0, t1, val, lo, hi + 1.0)
    if history:
        o = origin.timestamp()
        val, _, _ = _robust_series(forecast, t0 + o, t1 + o, val, (o + lo, o + hi + 1.0), history, error_model, now_s=o)
    x, f, c = _cumulative(t0, t1, val)  # seconds after origin: no precision lost to epoch timestamps
    mean, _ = _window_stats(x, f, c, start, start + np.maximum(dur, 1e-6))
    return mean


def slot_boundaries_s(forecast: Forecast, origin: datetime) -> np.ndarray:
    """Every slot start and end of the forecast, seconds after ``origin`` (where window optima lie)."""
    t0, t1, _ = _arrays(forecast.points)
    return np.unique(np.concatenate([t0, t1]) - origin.timestamp())


def search_starts(
    forecast: Forecast,
    durations_s: Sequence[float] | np.ndarray,
    earliest: datetime,
    latest_s: Sequence[float] | np.ndarray,
    *,
    history: Sequence[ForecastPoint] | None = None,
    error_model: LeadTimeErrorModel | None = None,
    step_s: float | None = None,
    hold_edges: bool = False,
    risk_aversion: float = DEFAULT_RISK_AVERSION,
    delay_cost_per_s: Sequence[float] | np.ndarray | float = 0.0,
    guard_z: float | None = None,
    split_s: Sequence[float] | np.ndarray | float | None = None,
    boundaries_s: Sequence[float] | np.ndarray | None = None,
) -> StartSearch:
    """carbonflow's one start search: every run ``i`` (``durations_s[i]``) at every candidate start in
    ``[0, latest_s[i]]`` seconds after ``earliest`` (runs with ``latest_s < 0`` get none), vectorised.

    Candidates are 0, the latest start, and every start where the run begins or ends on a slot boundary (the
    optimum of a piecewise-constant series lies on one), or a grid of ``step_s``. **Robustness** (the one
    meaning): when ``history`` (recent actuals) is given, each slot's forecast is shrunk toward the recent daily
    profile in proportion to its lead-time error variance (see :func:`shrink_toward_profile`); without history
    the forecast is taken at face value. ``risk_aversion`` adds that many standard deviations of the error of
    (candidate − the run's start at 0); ``delay_cost_per_s`` (score units per second, per run or one number)
    prices waiting. ``hold_edges`` holds the first/last value beyond the forecast and across gaps; otherwise a
    candidate the forecast does not cover is dropped.

    **Safer starts** (``guard_z``, default ``START_GUARD_Z``; 0 turns it off): a later start of run ``i`` whose
    expected gain over the run's start at 0 is below ``guard_z`` standard deviations of the error of that gain
    (the lead-time error model, errors correlated by ``phi_per_h``) less ``START_GUARD_TOLERANCE`` of the
    run-now intensity ranks after starting at once (by its shortfall): a move has to beat the forecast's own
    error, so a start rarely turns out worse than starting at once.

    **Two-segment windows** (``split_s``, per run or one number): run ``i`` is a first segment of ``split_s[i]``
    seconds, then the rest, each segment with its own energy (a co-located pair: both jobs while both work, then
    the tail job alone). Its candidates then also include every start where the first segment ends on a slot
    boundary, so the best start for any energy-weighted mix of the two segments' intensities is among them
    (each segment's mean is piecewise linear in the start, with breaks only there). The means and scores
    returned are over the whole run; a caller that weighs the segments scores the starts itself
    (:func:`carbonflow.planning.start_search.pair_starts`). ``boundaries_s`` (seconds after ``earliest``): the slot
    boundaries the candidates align to, by default the series' own after holding its edges; a caller that scores
    its windows on the forecast's own slots passes :func:`slot_boundaries_s`, which also keeps the forecast's
    first start and last end as candidates where edges are held.
    """
    durations = np.atleast_1d(np.asarray(durations_s, dtype=float))
    splits = None if split_s is None else np.broadcast_to(np.asarray(split_s, dtype=float), durations.shape)
    latest = np.atleast_1d(np.asarray(latest_s, dtype=float))
    delay = np.broadcast_to(np.asarray(delay_cost_per_s, dtype=float), durations.shape)
    e0 = earliest.timestamp()
    t0, t1, val = _arrays(forecast.points, earliest)  # seconds after earliest: no precision lost to epochs
    horizon_end_s = float(t1[-1])
    if hold_edges:
        t0, t1, val = _held(t0, t1, val, 0.0, float(np.max(np.maximum(latest, 0.0) + durations, initial=0.0)))
    x, f, c = _cumulative(t0, t1, val)
    runs, starts = [], []
    bounds = np.concatenate([t0, t1]) if boundaries_s is None else np.asarray(boundaries_s, dtype=float)
    for i, (d, hi) in enumerate(zip(durations, latest, strict=True)):
        if hi < -1e-9:
            continue
        hi = max(0.0, float(hi))
        if step_s is None:
            segment_ends = [] if splits is None else [bounds - splits[i]]
            cand = np.concatenate([[0.0, hi], bounds, bounds - d, *segment_ends])
        else:
            cand = np.concatenate([step_s * np.arange(int(hi // step_s) + 1), [hi]])
        cand = np.unique(np.round(cand[(cand >= -1e-9) & (cand <= hi + 1e-9)], 3))
        runs.append(np.full(cand.size, i))
        starts.append(np.clip(cand, 0.0, hi))
    if not runs:
        empty = np.array([])
        return StartSearch(empty.astype(int), empty, empty, empty, 0, horizon_end_s)
    run, start = np.concatenate(runs), np.concatenate(starts)
    dur = durations[run]
    mean, cov = _window_stats(x, f, c, start, start + dur)
    ok = np.isfinite(mean) & (cov >= _COVERED)
    run, start, dur, mean = run[ok], start[ok], dur[ok], mean[ok]
    score, shrunk = mean, 0
    z = start_guard_z(START_GUARD_Z) if guard_z is None else float(guard_z)
    if z < 0 or not math.isfinite(z):
        raise ValueError(f"guard_z={guard_z!r} is not allowed; give a number >= 0 (0 turns the guard off)")
    if run.size and (history or risk_aversion > 0 or z > 0):
        window = (e0, e0 + float(np.max(start + dur)))
        post, sig, shrunk = _robust_series(forecast, t0 + e0, t1 + e0, val, window, history, error_model, e0)
        xp, fp, cp = _cumulative(t0, t1, post)
        score, _ = _window_stats(xp, fp, cp, start, start + dur)
        if risk_aversion > 0 or z > 0:
            model = error_model or default_error_model()
            xs, fs, cs = _cumulative(t0, t1, sig)
            sig_w, _ = _window_stats(xs, fs, cs, start, start + dur)
            sig_now, _ = _window_stats(xs, fs, cs, np.zeros(durations.size), durations)
            pair = np.stack([np.nan_to_num(sig_now[run]), np.nan_to_num(sig_w)], axis=-1)
            offsets = np.stack([np.zeros_like(start), start], -1)
            sd_gain = robust_penalty(pair, offsets, model.phi_per_h, 1.0)[..., 1]
            if risk_aversion > 0:
                score = score + risk_aversion * sd_gain
            if z > 0:
                now_score, _ = _window_stats(xp, fp, cp, np.zeros(durations.size), durations)
                score = safer_scores(score, now_score[run], sd_gain, start > 0, z)
    score = score + delay[run] * start
    return StartSearch(run, start, mean, score, shrunk, horizon_end_s)


def safer_scores(
    score: np.ndarray, now_score: np.ndarray, sd_gain: np.ndarray, later: np.ndarray, z: float = START_GUARD_Z
) -> np.ndarray:
    """The safer-start rule of :func:`search_starts` on broadcastable arrays: a ``later`` candidate whose gain over
    starting at once (``now_score - score``) is short of ``z`` x ``sd_gain`` - ``START_GUARD_TOLERANCE`` x
    ``now_score`` ranks just after starting at once, by its shortfall (NaN ``now_score``: no guard)."""
    known = np.isfinite(now_score)
    ref = np.where(known, now_score, 0.0)
    short = z * sd_gain - START_GUARD_TOLERANCE * ref - (ref - score)
    blocked = known & later & (short > 0)
    return np.where(blocked, ref + np.maximum(short, 1e-9), score)


def choose_start(
    forecast: Forecast | None,
    duration_s: float,
    earliest: datetime,
    finish_by: datetime,
    *,
    robust: bool = True,
    step_s: float | None = None,
    history: Sequence[ForecastPoint] | None = None,
    risk_aversion: float = DEFAULT_RISK_AVERSION,
    error_model: LeadTimeErrorModel | None = None,
    guard_z: float | None = None,
) -> WindowChoice:
    """The contiguous start minimising expected emissions that still finishes by ``finish_by``: one run of
    :func:`search_starts` (the search ``plan_job`` uses), with a reason a person can read.

    ``robust`` (default) hands ``history`` (recent actuals, e.g. ``ForecastChain.history``) to the search, which
    shrinks the forecast toward its daily profile by lead-time error; without history the forecast is used as
    is, and the reason says so. ``expected_gco2_per_kwh`` and ``run_now_gco2_per_kwh`` are always the
    forecast's own numbers. Ties go to the earliest start. ``robust`` also applies the safer-start rule
    (``guard_z``, default ``START_GUARD_Z``; see :func:`search_starts`).
    """
    earliest, finish_by = _validate(duration_s, earliest, finish_by, step_s)
    latest = finish_by - timedelta(seconds=duration_s)
    if forecast is None or not forecast.points:
        why = "no forecast" if forecast is None else f"forecast from {forecast.provider} has no points"
        return _fallback(earliest, duration_s, f"{why}: starting at once ({_fmt(earliest)})", forecast)
    if risk_aversion < 0 or not math.isfinite(risk_aversion):
        raise ValueError(f"risk_aversion={risk_aversion!r} is not allowed; give a number >= 0")
    t0, t1, val = _arrays(forecast.points)
    x, f, c = _cumulative(t0, t1, val)
    e0, lat = earliest.timestamp(), latest.timestamp()
    run_now_arr, now_cov = _window_stats(x, f, c, np.array([e0]), np.array([e0 + duration_s]))
    run_now = float(run_now_arr[0]) if np.isfinite(run_now_arr[0]) else None
    if lat < e0:
        late_s = e0 - lat
        return _fallback(
            earliest,
            duration_s,
            f"finish_by {_fmt(finish_by)} cannot be met (the job needs {duration_s / 3600:.2f} h): starting at "
            f"once, {late_s / 3600:.2f} h late",
            forecast,
            run_now,
        )
    found = search_starts(
        forecast,
        [duration_s],
        earliest,
        [lat - e0],
        history=history if robust else None,
        error_model=error_model,
        step_s=step_s,
        risk_aversion=risk_aversion if robust else 0.0,
        guard_z=guard_z if robust else 0.0,
    )
    if not found.start_s.size:
        return _fallback(
            earliest,
            duration_s,
            f"forecast from {forecast.provider} covers {_fmt(datetime.fromtimestamp(x[0], UTC))} .. "
            f"{_fmt(datetime.fromtimestamp(x[-1], UTC))}, not a whole run between {_fmt(earliest)} and "
            f"{_fmt(finish_by)}: starting at once",
            forecast,
            run_now,
        )
    best = found.best()
    start = earliest + timedelta(seconds=float(found.start_s[best]))
    expected = float(found.mean_gco2_per_kwh[best])
    raw_best = float(found.mean_gco2_per_kwh.min())
    shrunk = found.shrunk_slots
    note = ""
    if run_now is None or now_cov[0] < _COVERED:
        note = " (the forecast does not cover a run started at once)"
    if start == earliest:
        reason = f"start at once ({_fmt(start)}): {expected:.0f} gCO2/kWh expected, no later start is better"
        if robust and raw_best < expected - 1e-9:
            reason += (
                f" once lead-time error is allowed for (the raw forecast's best, {raw_best:.0f} gCO2/kWh, "
                "is further ahead and less certain)"
            )
    else:
        wait_h = (start - earliest).total_seconds() / 3600.0
        cut = f" ({(1 - expected / run_now) * 100:.0f} % lower)" if run_now else ""
        reason = (
            f"start {_fmt(start)} ({wait_h:.1f} h after {_fmt(earliest)}): {expected:.0f} gCO2/kWh expected vs "
            f"{run_now:.0f} if run at once{cut}"
            if run_now is not None
            else f"start {_fmt(start)} ({wait_h:.1f} h after {_fmt(earliest)}): {expected:.0f} gCO2/kWh expected"
        )
    reason += f"; forecast {forecast.provider}"
    if forecast.replay:
        reason += " (replayed data)"
    if robust:
        reason += (
            ", robust to lead-time error (shrunk toward the recent daily profile)"
            if shrunk
            else ", taken at face value (no recent actuals to check it against)"
        )
    return WindowChoice(
        start=start,
        end=start + timedelta(seconds=duration_s),
        expected_gco2_per_kwh=expected,
        run_now_gco2_per_kwh=run_now,
        reason=reason + note,
        fallback=False,
        robust=robust and shrunk > 0,
        provider=forecast.provider,
        signal_kind=forecast.signal_kind,
    )
