"""Scheduling policies of the cluster simulator. Every decision is delegated to carbonflow.planning / carbon.

* ``fifo`` — exclusive GPUs, default power limit, start as soon as the FIFO queue allows (baseline).
* ``power-limit`` — :func:`carbonflow.planning.choose_power_limit` per recurring family (Zeus-style:
  the first recurrence runs at the default limit and is the profile; later ones use the chosen limit).
* ``colocation`` — EaCO-style sharing of one GPU by two single-GPU jobs: predicted slowdowns from
  :func:`carbonflow.planning.predict_pair_slowdown` (pair profile of the two job types + the jobs'
  predicted remaining work), the slowdown guard and the energy saving through
  :func:`carbonflow.planning.choose_colocation_pairs`. A type pair's profile is measured by the
  simulator the first time the planner considers it (EaCO's experiment-based prediction); pairs that
  cannot run together are then never tried again.
* ``carbon-shift`` — the start inside the job's finish-by window from
  :func:`carbonflow.carbon.windows.choose_start` on the replayed forecast.
* ``carbonflow`` — all three together.

What a policy knows about a job before it runs is what carbonflow would know: its family's last
realised duration (history), its job type's power curve (profile) and its finish-by time. The first
recurrence of a family has no history, so it is neither co-located nor shifted (it is the profiling run).
"""

from __future__ import annotations

import math

from carbonflow.carbon.windows import choose_start
from carbonflow.planning import (
    PairProfile,
    choose_colocation_pairs,
    choose_power_limit,
    pair_timeline,
    predict_pair_slowdown,
)
from carbonflow.simulation.engine import SimContext

FORECAST_HORIZON_S = 48 * 3600.0


class FifoPolicy:
    """Baseline: exclusive GPUs at the default power limit, no shifting."""

    name = "fifo"
    colocate = False

    def bind(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self.default_limit_w = ctx.devices.default_power_limit_w

    def release_s(self, job: int, now_s: float) -> float:
        return now_s

    def power_limit_w(self, job: int, now_s: float) -> float:
        return self.default_limit_w

    def choose_partner(self, job: int, candidates: dict[int, int], free_gpus: int, now_s: float) -> int | None:
        return None

    def pair_observed(self, job: int, other: int, keep_job: float, keep_other: float, now_s: float) -> bool:
        return True

    def job_started(self, job: int, now_s: float) -> None:
        return None

    def finished(self, job: int, now_s: float) -> None:
        return None


class PlannerPolicy(FifoPolicy):
    """A policy whose decisions all come from carbonflow.planning (and carbon.windows for the start)."""

    def __init__(
        self,
        name: str,
        *,
        power_limit: bool = False,
        colocate: bool = False,
        shift: bool = False,
        objective: str = "energy",
        max_slowdown: float | None = None,
        robust_shift: bool = True,
    ) -> None:
        self.name = name
        self.use_power_limit = power_limit
        self.colocate = colocate
        self.shift = shift
        self.objective = objective
        self.max_slowdown_override = max_slowdown
        self.robust_shift = robust_shift

    def bind(self, ctx: SimContext) -> None:
        super().bind(ctx)
        cl = ctx.cluster
        self.max_slowdown = cl.max_slowdown if self.max_slowdown_override is None else self.max_slowdown_override
        self.type_names = ctx.pairs.types
        self.limit_by_type: dict[int, float] = {}
        self.last_duration: dict[int, float] = {}  # family -> realised duration of its last finished run (s)
        self.predicted: dict[int, float] = {}  # running job -> predicted solo duration at the default limit (s)
        self.started_at: dict[int, float] = {}
        self.pair_profiles: dict[tuple[int, int], PairProfile | None] = {}
        self.pair_decisions = 0

    # -- history ---------------------------------------------------------------------------------------
    def _predicted_duration_s(self, job: int) -> float | None:
        return self.last_duration.get(self.ctx.jobs.family[job])

    def finished(self, job: int, now_s: float) -> None:
        # the realised work of this run, at the default limit and alone (what the job's progress reports give)
        self.last_duration[self.ctx.jobs.family[job]] = self.ctx.jobs.duration_s[job]
        self.predicted.pop(job, None)
        self.started_at.pop(job, None)

    # -- power limit -----------------------------------------------------------------------------------
    def power_limit_w(self, job: int, now_s: float) -> float:
        self.started_at[job] = now_s
        if not self.use_power_limit or self.ctx.jobs.recurrence[job] == 0:
            return self.default_limit_w  # the first recurrence is the profiling run at the default limit
        t = self.ctx.jobs.job_type[job]
        limit = self.limit_by_type.get(t)
        if limit is None:
            dev = self.ctx.devices
            limits = dev.power_limits_w
            curve = [dev.solo(t, lim) for lim in limits]
            limit = choose_power_limit(
                limits,
                [s for _, s in curve],
                [p for p, _ in curve],
                objective=self.objective,
                max_slowdown=self.max_slowdown,
                default_power_limit_w=self.default_limit_w,
            )
            self.limit_by_type[t] = limit
        return limit

    # -- carbon shifting -------------------------------------------------------------------------------
    def release_s(self, job: int, now_s: float) -> float:
        if not self.shift:
            return now_s
        pred = self._predicted_duration_s(job)
        if pred is None or pred >= FORECAST_HORIZON_S:
            return now_s
        jobs = self.ctx.jobs
        grid = self.ctx.grid
        t = jobs.job_type[job]
        slow = self.ctx.devices.solo(t, self.limit_by_type.get(t, self.default_limit_w))[1]
        run_s = pred * slow
        # keep the slowdown allowance for queueing and co-location: shift only inside the slack
        finish_by_s = jobs.deadline_s[job] - pred * (1 + self.max_slowdown) + run_s
        if finish_by_s - run_s <= now_s:
            return now_s
        forecast = grid.forecast(now_s, FORECAST_HORIZON_S)
        choice = choose_start(
            forecast, run_s, grid.to_datetime(now_s), grid.to_datetime(finish_by_s), robust=self.robust_shift
        )
        return max(now_s, (choice.start - grid.origin).total_seconds())

    # -- co-location -----------------------------------------------------------------------------------
    def _pair_profile(self, a: int, b: int) -> PairProfile | None:
        """The profile of job types a and b together, measured once (simulated) when first needed."""
        key = (a, b) if a <= b else (b, a)
        if key not in self.pair_profiles:
            keep = self.ctx.pairs.keep
            ka, kb = keep[key[0], key[1]], keep[key[1], key[0]]
            if not (math.isfinite(ka) and math.isfinite(kb)) or ka <= 0 or kb <= 0:
                self.pair_profiles[key] = None
            else:
                dev = self.ctx.devices
                pa, pb = dev.solo(key[0], self.default_limit_w)[0], dev.solo(key[1], self.default_limit_w)[0]
                self.pair_profiles[key] = PairProfile(
                    self.type_names[key[0]],
                    self.type_names[key[1]],
                    float(ka),
                    float(kb),
                    dev.shared_power_w(pa, pb, self.default_limit_w),
                    label="simulated",
                    power_limit_w=self.default_limit_w,
                )
        return self.pair_profiles[key]

    def choose_partner(self, job: int, candidates: dict[int, int], free_gpus: int, now_s: float) -> int | None:
        if not self.colocate:
            return None
        pred = self._predicted_duration_s(job)
        if pred is None:
            return None  # first recurrence: no history to predict the pair's slowdown from
        jobs = self.ctx.jobs
        dev = self.ctx.devices
        tj = jobs.job_type[job]
        me = f"j{job}"
        names = [me]
        slowdowns: dict[tuple[str, str], tuple[float, float] | None] = {}
        savings: dict[tuple[str, str], float] = {}
        by_name: dict[str, int] = {}
        for tk, k in candidates.items():
            profile = self._pair_profile(tj, tk)
            if profile is None:
                continue
            pred_k = self.predicted.get(k)
            if pred_k is None:
                continue
            done_k = self.ctx.progress_s(k, now_s)
            rem_k = max(pred_k - done_k, 1.0)
            other = f"j{k}"
            # the profile is about the job types; ask the planner about these two jobs
            prof = PairProfile(
                me,
                other,
                *(profile.speeds(self.type_names[tj], self.type_names[tk]) or (profile.speed_a, profile.speed_b)),
                profile.power_w,
                label="simulated",
                power_limit_w=profile.power_limit_w,
            )
            slow = predict_pair_slowdown(me, other, pred, rem_k, [prof])
            if slow is None:
                continue
            tl = pair_timeline(pred, rem_k, prof.speed_a, prof.speed_b)
            pj, pk = dev.solo(tj, self.default_limit_w)[0], dev.solo(tk, self.default_limit_w)[0]
            tail_w = pk if tl.tail_job == "b" else pj
            saving_j = pj * pred + pk * rem_k - (prof.power_w * tl.overlap_s + tail_w * tl.tail_s)
            names.append(other)
            by_name[other] = k
            slowdowns[(me, other)] = slow
            savings[(me, other)] = saving_j
        if not slowdowns:
            return None
        self.pair_decisions += 1
        bounds = dict.fromkeys(names, self.max_slowdown)
        chosen = choose_colocation_pairs(names, bounds, slowdowns, savings)
        for a, b in chosen:
            if a == me:
                return by_name[b]
            if b == me:
                return by_name[a]
        return None

    def pair_observed(self, job: int, other: int, keep_job: float, keep_other: float, now_s: float) -> bool:
        if not (math.isfinite(keep_job) and math.isfinite(keep_other)):
            t = self.ctx.jobs.job_type
            a, b = sorted((t[job], t[other]))
            self.pair_profiles[(a, b)] = None
            return False
        return True

    def job_started(self, job: int, now_s: float) -> None:
        pred = self._predicted_duration_s(job)
        if pred is not None:
            self.predicted[job] = pred


def standard_policies(objective: str = "energy", max_slowdown: float | None = None) -> list[FifoPolicy]:
    """The five policies of the cluster benchmark, in table order."""
    return [
        FifoPolicy(),
        PlannerPolicy("power-limit", power_limit=True, objective=objective, max_slowdown=max_slowdown),
        PlannerPolicy("colocation", colocate=True, objective=objective, max_slowdown=max_slowdown),
        PlannerPolicy("carbon-shift", shift=True, objective="carbon", max_slowdown=max_slowdown),
        PlannerPolicy(
            "carbonflow", power_limit=True, colocate=True, shift=True, objective=objective, max_slowdown=max_slowdown
        ),
    ]
