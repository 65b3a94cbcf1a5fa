"""The early-observation bound of a co-located pair: the slowest kept speed each job may show.

A co-located job's slowdown bound (``max_slowdown``) is about its whole run: time together plus the
tail it may run alone (see :func:`carbonflow.planning.pairs.pair_timeline`). A launcher can only
observe speeds while both work, so the planner turns each bound into the lowest fraction of solo
speed (``min_kept_speed``) the job may keep, the partner keeping its predicted speed, before the
pair must be separated (EaCO's early observation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from carbonflow.domain import Plan
from carbonflow.planning.pairs import pair_timeline


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


def observed_slowdown(solo_throughput: float, observed_throughput: float) -> float:
    """Slowdown implied by an early observation: solo / observed throughput − 1."""
    if solo_throughput <= 0 or observed_throughput <= 0:
        raise ValueError(
            f"throughputs must be > 0; got solo_throughput={solo_throughput}, observed_throughput={observed_throughput}"
        )
    return solo_throughput / observed_throughput - 1


@dataclass
class Separation:
    """Plans after the early-observation check, and the groups that were split."""

    plans: list[Plan]
    separated: list[tuple[str, ...]] = field(default_factory=list)


def separate_if_slow(
    observed_slowdowns: Mapping[str, float],
    plans: Sequence[Plan],
    max_slowdowns: Mapping[str, float] | float = 0.10,
) -> Separation:
    """Split every co-location group in which a job's observed slowdown breaks its bound.

    Separated jobs keep their configuration without the group and get a reason saying why; the others are
    returned unchanged. Jobs without an observation are left as they are.
    """

    def bound(job: str) -> float:
        return max_slowdowns if isinstance(max_slowdowns, float | int) else max_slowdowns.get(job, 0.10)

    groups: dict[str, list[Plan]] = {}
    for plan in plans:
        if plan.config.colocation_group:
            groups.setdefault(plan.config.colocation_group, []).append(plan)
    broken: dict[str, str] = {}
    for group, members in groups.items():
        worst = [
            (observed_slowdowns[p.job], p.job) for p in members if observed_slowdowns.get(p.job, 0.0) > bound(p.job)
        ]
        if worst:
            slow, job = max(worst)
            broken[group] = (
                f"separated after early observation: {job} slowed {slow * 100:.0f} % > {bound(job) * 100:.0f} %"
            )
    out = []
    for plan in plans:
        group = plan.config.colocation_group
        if group in broken:
            out.append(
                plan.model_copy(
                    update={
                        "config": plan.config.model_copy(update={"colocation_group": None}),
                        "colocated_with": [],
                        "reason": f"{broken[group]} (was: {plan.reason})",
                    }
                )
            )
        else:
            out.append(plan)
    separated = [tuple(sorted(p.job for p in groups[g])) for g in sorted(broken)]
    return Separation(out, separated)
