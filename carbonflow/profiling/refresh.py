"""Which solo profiles to refresh tonight, so that profiling stays a few percent of a platform's GPU time.

A profile is reused until something says it no longer describes the job:

* **must refresh** — there is no profile, or the job's code version or the GPU model changed since it was
  measured, or realised runs drift from its predictions (the history's drift flag);
* **may refresh** — it is older than the job's ``profile_max_age_s``. Age alone is not urgent: these are
  refreshed oldest first within a nightly budget of GPU-seconds, so fifty profiles measured on one first
  night do not all expire, and all rerun, on the same night a week later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ProfileState:
    """What is known about one job's current solo profile (None fields: no profile yet)."""

    job: str
    max_age_s: float
    cost_gpu_s: float
    """GPU-seconds a new profile of this job costs (start-up + each configuration swept)."""
    measured_at: datetime | None = None
    code_version: str | None = None
    gpu_model: str | None = None
    current_code_version: str | None = None
    current_gpu_model: str | None = None
    drifting: bool = False


@dataclass(frozen=True)
class Refresh:
    job: str
    reason: str
    cost_gpu_s: float
    required: bool


def must_refresh_reason(state: ProfileState) -> str | None:
    """Why the profile cannot be reused at all (None: it can)."""
    if state.measured_at is None:
        return "no profile yet"
    if state.current_code_version is not None and state.code_version != state.current_code_version:
        return f"code version changed ({state.code_version} → {state.current_code_version})"
    if state.current_gpu_model is not None and state.gpu_model != state.current_gpu_model:
        return f"GPU model changed ({state.gpu_model} → {state.current_gpu_model})"
    if state.drifting:
        return "realised runs drift from the profile's predictions"
    return None


def profiles_to_refresh(states: Sequence[ProfileState], now: datetime, budget_gpu_s: float) -> list[Refresh]:
    """Every required refresh, then profiles past their age oldest first while the budget lasts."""
    if budget_gpu_s < 0:
        raise ValueError(f"budget_gpu_s={budget_gpu_s} is not allowed; it must be >= 0")
    required = [Refresh(s.job, r, s.cost_gpu_s, True) for s in states if (r := must_refresh_reason(s)) is not None]
    done = {r.job for r in required}
    aged = sorted(
        (s for s in states if s.job not in done and (now - s.measured_at).total_seconds() >= s.max_age_s),
        key=lambda s: s.measured_at,
    )
    optional: list[Refresh] = []
    spent_s = 0.0
    for s in aged:
        if spent_s + s.cost_gpu_s > budget_gpu_s:
            break
        age_d = (now - s.measured_at).total_seconds() / 86400
        optional.append(Refresh(s.job, f"profile is {age_d:.1f} days old (max_age {s.max_age_s / 86400:.1f})",
                                s.cost_gpu_s, False))  # fmt: skip
        spent_s += s.cost_gpu_s
    return required + optional


DRIFT_RECENT_RUNS = 3
DRIFT_THRESHOLD = 0.25


def drift_reason(
    ratios: Sequence[float], recent: int = DRIFT_RECENT_RUNS, threshold: float = DRIFT_THRESHOLD
) -> str | None:
    """Why a job's realised runs have drifted from its profile's predictions (None: they have not).

    ``ratios`` are realised / predicted energy per run, oldest first. A steady ratio (fixed costs the
    profile never sees) is what the planner learns; a *moving* one is drift: the median of the last
    ``recent`` runs differs from the earlier runs' median by more than ``threshold`` (relative).
    """
    if len(ratios) < 2 * recent:
        return None
    earlier, latest = sorted(ratios[:-recent]), sorted(ratios[-recent:])
    before, now = earlier[len(earlier) // 2], latest[len(latest) // 2]
    if before <= 0 or abs(now / before - 1) <= threshold:
        return None
    return (f"realised/predicted energy moved from {before:.2f} to {now:.2f} over the last {recent} runs "
            f"(more than {threshold:.0%}): the profile no longer describes the job")  # fmt: skip
