"""The early-observation bound of a co-located pair: the slowest kept speed each job may show.

A co-located job's slowdown bound (``max_slowdown``) is about its whole run: time together plus the
tail it may run alone (see :func:`carbonflow.planning.colocation.pair_timeline`). A launcher can only
observe speeds while both work, so the planner turns each bound into the lowest fraction of solo
speed (``min_kept_speed``) the job may keep, the partner keeping its predicted speed, before the
pair must be separated (EaCO's early observation).
"""

from __future__ import annotations

from carbonflow.planning.colocation import pair_timeline


def _slowdown(solo_s: tuple[float, float], speeds: tuple[float, float], job: int) -> float:
    tl = pair_timeline(solo_s[0], solo_s[1], speeds[0], speeds[1])
    return (tl.total_a_s, tl.total_b_s)[job] / solo_s[job] - 1


def min_kept_speeds(
    solo_a_s: float, solo_b_s: float, speed_a: float, speed_b: float, bound_a: float, bound_b: float
) -> tuple[float, float]:
    """For each job, the lowest kept speed that still meets its bound, the other at its predicted speed.

    ``solo_*_s``: predicted durations alone; ``speed_*``: predicted kept speeds; ``bound_*``: allowed
    slowdowns (fractions). A job whose bound the prediction already breaks gets its predicted speed.
    """
    if not (0 < speed_a <= 1 and 0 < speed_b <= 1):
        raise ValueError(f"kept speeds must be in (0, 1]; got speed_a={speed_a}, speed_b={speed_b}")
    if bound_a < 0 or bound_b < 0:
        raise ValueError(f"bounds must be >= 0; got bound_a={bound_a}, bound_b={bound_b}")
    solo = (solo_a_s, solo_b_s)
    out = []
    for job, bound in ((0, bound_a), (1, bound_b)):
        predicted = (speed_a, speed_b)[job]

        def with_speed(s: float, job: int = job) -> tuple[float, float]:
            return (s, speed_b) if job == 0 else (speed_a, s)

        if _slowdown(solo, with_speed(predicted), job) > bound:
            out.append(predicted)
            continue
        lo, hi = 1e-3, predicted  # slowdown falls as the kept speed rises: bisect for the bound
        if _slowdown(solo, with_speed(lo), job) <= bound:
            out.append(lo)
            continue
        for _ in range(60):
            mid = (lo + hi) / 2
            if _slowdown(solo, with_speed(mid), job) <= bound:
                hi = mid
            else:
                lo = mid
        out.append(hi)
    return out[0], out[1]
