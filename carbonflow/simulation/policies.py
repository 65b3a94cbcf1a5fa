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
* ``capacity_aware=True`` (the ``carbonflow-capacity`` rows) — the same planner calls, bounded by the
  cluster's load through :mod:`carbonflow.planning.capacity`: a power cap only while nobody waits (running
  jobs are re-tuned to the default limit when a queue forms, and capped again when it empties); a job that
  would wait for a GPU may share one if its completion stays within ``(1 + max_slowdown)`` × what waiting
  (the recent mean wait) would give, and its partner may then slow by ``congestion_slowdown`` more, both
  within their deadlines; a start is deferred only by ``shift_jct_budget`` of the job's expected completion
  time, to the lowest-carbon start whose GPUs are not already booked by other deferred jobs.

What a policy knows about a job before it runs is what carbonflow would know: the longest of its
family's last ``history_runs`` realised durations (history), its job type's power curve (profile) and
its finish-by time. For co-location the engine offers one running job per job type as a partner. The first
recurrence of a family has no history, so it is neither co-located nor shifted (it is the profiling run).
"""

from __future__ import annotations

import math
from collections import deque

from carbonflow.carbon.windows import choose_start, search_starts
from carbonflow.planning import (
    CapacityLedger,
    ClusterLoad,
    PairProfile,
    choose_colocation_pairs,
    choose_power_limit,
    pair_timeline,
    predict_pair_slowdown,
)
from carbonflow.planning.capacity import (
    deferral_budget_s,
    partner_slowdown_bound,
    power_limit_under_load,
    power_limit_with_delay_cost,
    waiting_slowdown_bound,
)
from carbonflow.simulation.engine import SimContext
from carbonflow.units import kwh_from_j

FORECAST_HORIZON_S = 48 * 3600.0


class FifoPolicy:
    """Baseline: exclusive GPUs at the default power limit, no shifting."""

    name = "fifo"
    colocate = False
    retune_power = False

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
        capacity_aware: bool = False,
        headroom_gpus: int = 0,
        congestion_slowdown: float = 0.0,
        shift_jct_budget: float = 0.0,
        delay_cost_g_per_s: float = 0.0,
        delay_cost_w: float | None = None,
        queue_cost_w_per_gpu: float = math.inf,
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
        self.capacity_aware = capacity_aware
        self.retune_power = capacity_aware and power_limit
        self.headroom_gpus = headroom_gpus
        self.congestion_slowdown = congestion_slowdown
        self.shift_jct_budget = shift_jct_budget
        self.delay_cost_g_per_s = delay_cost_g_per_s
        self.delay_cost_w = delay_cost_w
        self.queue_cost_w_per_gpu = queue_cost_w_per_gpu

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
        self.long_waits: deque[float] = deque(maxlen=500)  # recent delays of jobs that did wait (s)
        self.ledger = CapacityLedger(ctx.cluster.gpus) if self.capacity_aware and self.shift else None
        self.booked: dict[int, tuple[float, float, int]] = {}  # deferred job -> its ledger booking

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
        wait = now_s - self.released_at.pop(job, now_s)
        self.waits.append(wait)
        if wait > 0:
            self.long_waits.append(wait)
        booking = self.booked.pop(job, None)
        if booking is not None and self.ledger is not None:
            self.ledger.remove(*booking)

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
        if self.capacity_aware:
            load = ClusterLoad(self.ctx.queued(), self.ctx.free_gpus(), self.ctx.cluster.gpus)
            if self.delay_cost_w is not None:
                dev = self.ctx.devices
                curve = [dev.solo(t, lim) for lim in dev.power_limits_w]
                return power_limit_with_delay_cost(
                    dev.power_limits_w,
                    [s for _, s in curve],
                    [p for p, _ in curve],
                    self.ctx.jobs.num_gpus[job],
                    self.delay_cost_w,
                    self.max_slowdown,
                    load,
                    self.queue_cost_w_per_gpu,
                )
            return power_limit_under_load(limit, self.default_limit_w, load, self.headroom_gpus)
        return limit

    # -- carbon shifting -------------------------------------------------------------------------------
    def _queue_margin_s(self) -> float:
        """A high quantile of recent queueing delays: time kept free before the deadline for the queue."""
        if not self.waits:
            return 0.0
        w = sorted(self.waits)
        return w[min(len(w) - 1, int(0.99 * len(w)))]

    def _expected_wait_s(self) -> float:
        """Mean delay of the recent jobs that had to wait for GPUs (0 before any did)."""
        return sum(self.long_waits) / len(self.long_waits) if self.long_waits else 0.0

    def _release_within_budget(self, job: int, now_s: float, pred: float) -> float:
        """Capacity-aware shifting: the lowest-carbon start within the job's deferral budget and free capacity."""
        jobs = self.ctx.jobs
        t = jobs.job_type[job]
        g = jobs.num_gpus[job]
        run_s = pred * self.ctx.devices.solo(t, self.limit_by_type.get(t, self.default_limit_w))[1]
        budget = deferral_budget_s(run_s, self.shift_jct_budget, self._expected_wait_s())
        latest = min(now_s + budget, jobs.deadline_s[job] - pred * (1 + self.max_slowdown) - self._queue_margin_s())
        step = self.decision_granularity_s
        if latest < now_s + step:
            return now_s
        busy = self.ctx.cluster.gpus - self.ctx.free_gpus()
        ledger = self.ledger
        grid = self.ctx.grid
        kwh = kwh_from_j(g * self.ctx.devices.solo(t, self.default_limit_w)[0] * run_s)
        found = search_starts(
            grid.forecast(now_s, latest - now_s + run_s + grid.step_s),
            [run_s],
            grid.to_datetime(now_s),
            [latest - now_s],
            step_s=step,
            delay_cost_per_s=self.delay_cost_g_per_s / max(kwh, 1e-12),
        )
        # the cheapest start with spare capacity then (deferring into congestion only queues); now always fits
        k = found.first_that(
            lambda off: off == 0.0 or busy + ledger.peak_gpus(now_s + off, now_s + off + run_s) + g <= ledger.total_gpus
        )
        start = now_s if k is None else now_s + float(found.start_s[k])
        if start > now_s:
            self.booked[job] = (start, start + run_s, g)
            ledger.add(start, start + run_s, g)
            self.released_at[job] = start
        return start

    def release_s(self, job: int, now_s: float) -> float:
        if self.shift and self.capacity_aware and self.ctx.queued() == 0:
            pred = self._predicted_duration_s(job)
            return now_s if pred is None else self._release_within_budget(job, now_s, pred)
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
            if self.capacity_aware and free_gpus < jobs.num_gpus[job]:
                # no GPU of its own now: sharing is weighed against waiting, and the partner may give a little
                # more while others wait; both still have to finish before their deadlines
                margin = self._queue_margin_s()
                bounds[me] = min(
                    waiting_slowdown_bound(solo_j, self._expected_wait_s(), self.max_slowdown),
                    (jobs.deadline_s[job] - now_s - margin) / solo_j - 1,
                )
                bounds[other] = partner_slowdown_bound(
                    solo_k,
                    now_s - self.started_at[k],
                    pred_k,
                    self.max_slowdown,
                    jobs.deadline_s[k] - now_s - margin,
                    self.congestion_slowdown,
                )
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


def standard_policies(
    objective: str = "energy", max_slowdown: float | None = None, capacity_aware: bool = False
) -> list[FifoPolicy]:
    """The five policies of the cluster benchmark, in table order.

    ``capacity_aware=True`` makes ``carbonflow`` the capacity-aware joint policy of the benchmark's headline
    (1 % deferral budget); the default is the load-blind joint policy.
    """
    joint = (
        PlannerPolicy(
            "carbonflow",
            power_limit=True,
            colocate=True,
            shift=True,
            objective=objective,
            max_slowdown=max_slowdown,
            capacity_aware=True,
            shift_jct_budget=0.01,
        )
        if capacity_aware
        else PlannerPolicy(
            "carbonflow", power_limit=True, colocate=True, shift=True, objective=objective, max_slowdown=max_slowdown
        )
    )
    return [
        FifoPolicy(),
        PlannerPolicy("power-limit", power_limit=True, objective=objective, max_slowdown=max_slowdown),
        PlannerPolicy("colocation", colocate=True, objective=objective, max_slowdown=max_slowdown),
        PlannerPolicy("carbon-shift", shift=True, objective="carbon", max_slowdown=max_slowdown),
        joint,
    ]
