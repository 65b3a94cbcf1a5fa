"""Scheduling policies of the cluster simulator. Every decision is delegated to carbonflow.planning / carbon.

* ``fifo`` — exclusive GPUs, default power limit, start as soon as the FIFO queue allows (baseline).
* ``power-limit`` — :func:`carbonflow.planning.choose_power_limit` per recurring family (Zeus-style:
  the first recurrence runs at the default limit and is the profile; later ones use the chosen limit).
* ``colocation`` — EaCO-style sharing of one GPU by two single-GPU jobs (a shared GPU runs at the
  default limit, the reference configuration the pair profiles are measured at, as in
  :func:`carbonflow.planning.plan_night`; a job left alone returns to its own limit): predicted slowdowns from
  :func:`carbonflow.planning.predict_pair_slowdown` (pair profile of the two job types + the jobs'
  predicted remaining work), the slowdown guard and the energy saving through
  :func:`carbonflow.planning.choose_colocation_pairs`. A type pair's profile is measured by the
  simulator the first time the planner considers it (EaCO's experiment-based prediction); pairs that
  cannot run together are then never tried again.
* ``carbon-shift`` — the start inside the job's finish-by window from
  :func:`carbonflow.carbon.windows.choose_start` on the replayed forecast, asked only while the cluster
  has no backlog (with a queue, a deferred job's GPUs go to a queued job that runs now instead), and
  using at most ``shift_slack_use`` (default half) of the job's slack, the rest kept for queueing.
* ``carbonflow`` — all three together.

What a policy knows about a job before it runs is what carbonflow would know: the longest of its
family's last ``history_runs`` realised durations (history), its job type's power curve (profile) and
its finish-by time. For co-location the engine offers one running job per job type as a partner. The first
recurrence of a family has no history, so it is neither co-located nor shifted (it is the profiling run).
"""

from __future__ import annotations

import math
from collections import deque

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

    def pair_power_limit_w(self, job: int, other: int, now_s: float) -> float:
        return self.default_limit_w

    def pair_observed(self, job: int, other: int, keep_job: float, keep_other: float, now_s: float) -> bool:
        return True

    def job_started(self, job: int, now_s: float, power_limit_w: float) -> None:
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
        history_runs: int = 5,
        decision_granularity_s: float = 300.0,
        shift_slack_use: float = 0.5,
    ) -> None:
        if not 0 <= shift_slack_use <= 1:
            raise ValueError(f"shift_slack_use={shift_slack_use} is not allowed; it must be between 0 and 1")
        if history_runs < 1:
            raise ValueError(f"history_runs={history_runs} is not allowed; it must be >= 1")
        self.name = name
        self.use_power_limit = power_limit
        self.colocate = colocate
        self.shift = shift
        self.objective = objective
        self.max_slowdown_override = max_slowdown
        self.robust_shift = robust_shift
        self.history_runs = history_runs
        self.decision_granularity_s = decision_granularity_s
        self.shift_slack_use = shift_slack_use

    def bind(self, ctx: SimContext) -> None:
        super().bind(ctx)
        self.max_slowdown = (
            ctx.cluster.max_slowdown if self.max_slowdown_override is None else self.max_slowdown_override
        )
        self.type_names = ctx.pairs.types
        self.limit_by_type: dict[int, float] = {}
        self.recent: dict[int, deque[float]] = {}  # family -> realised durations of its last runs (s)
        self.predicted: dict[int, float] = {}  # running job -> predicted duration alone at the default limit (s)
        self.started_at: dict[int, float] = {}
        self.limit_of_job: dict[int, float] = {}
        self.waits: deque[float] = deque(maxlen=500)  # recent queueing delays (release -> start), s
        self.released_at: dict[int, float] = {}
        self.runnable_pair: dict[tuple[int, int], bool] = {}
        self.shift_cache: dict[tuple[int, int, int], float] = {}
        self.pair_decisions = 0

    # -- history ---------------------------------------------------------------------------------------
    def _predicted_duration_s(self, job: int) -> float | None:
        """The family's longest run among its recent recurrences (a conservative prediction), or None."""
        runs = self.recent.get(self.ctx.jobs.family[job])
        return max(runs) if runs else None

    def job_started(self, job: int, now_s: float, power_limit_w: float) -> None:
        self.started_at[job] = now_s
        self.limit_of_job[job] = power_limit_w
        pred = self._predicted_duration_s(job)
        if pred is not None:
            self.predicted[job] = pred
        self.waits.append(now_s - self.released_at.pop(job, now_s))

    def finished(self, job: int, now_s: float) -> None:
        # the work of this run in seconds alone at the default limit (what its progress reports give)
        fam = self.ctx.jobs.family[job]
        runs = self.recent.get(fam)
        if runs is None:
            runs = self.recent[fam] = deque(maxlen=self.history_runs)
        runs.append(self.ctx.jobs.duration_s[job])
        self.predicted.pop(job, None)
        self.started_at.pop(job, None)
        self.limit_of_job.pop(job, None)

    # -- power limit -----------------------------------------------------------------------------------
    def power_limit_w(self, job: int, now_s: float) -> float:
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
    def _queue_margin_s(self) -> float:
        """A high quantile of recent queueing delays: time kept free before the deadline for the queue."""
        if not self.waits:
            return 0.0
        w = sorted(self.waits)
        return w[min(len(w) - 1, int(0.99 * len(w)))]

    def release_s(self, job: int, now_s: float) -> float:
        if not self.shift or self.ctx.queued() > 0:
            # with a backlog, deferring a job only hands its GPUs to a queued job that runs now instead:
            # the cluster's work per slot is fixed by its capacity, so there is no carbon to gain
            return now_s
        pred = self._predicted_duration_s(job)
        if pred is None or pred >= FORECAST_HORIZON_S:
            return now_s
        jobs = self.ctx.jobs
        grid = self.ctx.grid
        t = jobs.job_type[job]
        run_s = pred * self.ctx.devices.solo(t, self.limit_by_type.get(t, self.default_limit_w))[1]
        # leave the slowdown allowance (co-location), and of the remaining slack keep the larger of the
        # queue's recent delays and (1 - shift_slack_use) of it free for queueing after the release
        slack_s = jobs.deadline_s[job] - pred * (1 + self.max_slowdown) - now_s
        keep_free_s = max(self._queue_margin_s(), (1 - self.shift_slack_use) * slack_s)
        finish_by_s = jobs.deadline_s[job] - pred * self.max_slowdown - keep_free_s
        if finish_by_s - run_s <= now_s:
            return now_s
        # jobs arriving in the same grid slot with about the same run time and finish-by share one decision:
        # the finish-by is floored to the slot (never later than the job's own) and the run time rounded up
        step = grid.step_s
        fb_slot = math.floor((finish_by_s + grid.offset_s) / step)
        run_key = math.ceil(run_s / self.decision_granularity_s)
        key = (math.floor((now_s + grid.offset_s) / step), run_key, fb_slot)
        start = self.shift_cache.get(key)
        if start is None:
            finish_by_key = fb_slot * step - grid.offset_s
            run_rounded = run_key * self.decision_granularity_s
            if finish_by_key - run_rounded <= now_s:
                return now_s
            forecast = grid.forecast(now_s, FORECAST_HORIZON_S)
            choice = choose_start(
                forecast,
                run_rounded,
                grid.to_datetime(now_s),
                grid.to_datetime(finish_by_key),
                robust=self.robust_shift,
            )
            start = (choice.start - grid.origin).total_seconds() if choice.start > grid.to_datetime(now_s) else -1.0
            if len(self.shift_cache) > 100_000:
                self.shift_cache.clear()
            self.shift_cache[key] = start
        release = max(now_s, start)
        if release > now_s:
            self.released_at[job] = release
        return release

    # -- co-location -----------------------------------------------------------------------------------
    def _runnable(self, a: int, b: int) -> bool:
        """Whether job types a and b can share a GPU: the pair profile, measured once when first needed."""
        key = (a, b) if a <= b else (b, a)
        ok = self.runnable_pair.get(key)
        if ok is None:
            keep = self.ctx.pairs.keep
            ok = bool(math.isfinite(keep[a, b]) and math.isfinite(keep[b, a]) and keep[a, b] > 0 and keep[b, a] > 0)
            self.runnable_pair[key] = ok
        return ok

    def choose_partner(self, job: int, candidates: dict[int, int], free_gpus: int, now_s: float) -> int | None:
        if not self.colocate:
            return None
        pred = self._predicted_duration_s(job)
        if pred is None:
            return None  # first recurrence: no history to predict the pair's slowdown from
        jobs = self.ctx.jobs
        dev = self.ctx.devices
        keep = self.ctx.pairs.keep
        tj = jobs.job_type[job]
        me = f"j{job}"
        names = [me]
        bounds = {me: 0.0}
        slowdowns: dict[tuple[str, str], tuple[float, float] | None] = {}
        savings: dict[tuple[str, str], float] = {}
        by_name: dict[str, int] = {}
        for tk, k in candidates.items():
            pred_k = self.predicted.get(k)
            if pred_k is None or not self._runnable(tj, tk):
                continue
            lim = self.pair_power_limit_w(job, k, now_s)
            pj, sj = dev.solo(tj, lim)
            pk, sk = dev.solo(tk, lim)
            rem_k = max(pred_k - self.ctx.progress_s(k, now_s), 1.0)
            solo_j, solo_k = pred * sj, rem_k * sk  # each alone at this GPU's power limit
            # a simulated pair profile of the two job types at this limit (speeds measured by Gavel)
            other = f"j{k}"
            prof = PairProfile(
                me,
                other,
                float(keep[tj, tk]),
                float(keep[tk, tj]),
                dev.shared_power_w(pj, pk, lim),
                label="simulated",
                power_limit_w=lim,
            )
            slow = predict_pair_slowdown(me, other, solo_j, solo_k, [prof])
            if slow is None:
                continue
            tl = pair_timeline(solo_j, solo_k, prof.speed_a, prof.speed_b)
            tail_w = pk if tl.tail_job == "b" else pj
            names.append(other)
            by_name[other] = k
            # slowdown budgets: each job must end within (1 + max_slowdown) x its predicted default run time
            bounds[me] = (1 + self.max_slowdown) / sj - 1
            bounds[other] = ((1 + self.max_slowdown) * pred_k - (now_s - self.started_at[k])) / solo_k - 1
            slowdowns[(me, other)] = slow
            savings[(me, other)] = pj * solo_j + pk * solo_k - (prof.power_w * tl.overlap_s + tail_w * tl.tail_s)
        if not slowdowns:
            return None
        self.pair_decisions += 1
        for a, b in choose_colocation_pairs(names, bounds, slowdowns, savings):
            if a == me:
                return by_name[b]
            if b == me:
                return by_name[a]
        return None

    def pair_observed(self, job: int, other: int, keep_job: float, keep_other: float, now_s: float) -> bool:
        if not (math.isfinite(keep_job) and math.isfinite(keep_other)):
            t = self.ctx.jobs.job_type
            a, b = sorted((t[job], t[other]))
            self.runnable_pair[(a, b)] = False
            return False
        return True


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
