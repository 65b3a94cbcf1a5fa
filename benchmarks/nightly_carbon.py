"""A year of nightly retraining batches: carbonflow's joint plan vs "start now at the default power limit".

Every evening (18:00 local time of the grid, by default) a batch of recurring jobs is submitted with
finish-by 12 h later: the 6 Zeus workloads on simulated V100s, two of them twice (8 jobs, so co-location
matters). Each job **trains to Zeus's target metric**: tonight's epochs to target are one of Zeus's training
paths (``summary_train.csv``, one seed drawn per night, job and batch size — the same draw for every
policy), and its speed/power per (batch size, power limit) is Zeus's V100 measurement
(``carbonflow.energy.simulated.ZeusPowerModel``). A warm-started nightly retrain of ImageNet or LibriSpeech
needs only a fraction of a full training (to target they take 20 h and 16 h at b0): every job's epochs are
scaled so that its expected run at b0 and the default limit is at most 4 h (ImageNet × 0.19, LibriSpeech
× 0.24, the others × 1). A job's epoch budget (``JobSpec.epochs``) is 2 × its expected epochs at b0 (at
most Zeus's ``max_epochs``, scaled): a run that has not reached its target by then stops (``target_misses``).
Replayed over a year of real grid intensity:

* GB and DE — Let's Wait Awhile 2020 (lifecycle, 30/15-min), ``carbon/lets-wait-awhile``;
* US-CAL-CISO — Electricity Maps 2022 hourly (lifecycle), ``carbon/electricitymaps-portal``.

The planner sees a *forecast*: the actual series times (1 + error), the error drawn from
``carbonflow.carbon.calibration.default_error_model()`` (relative RMSE by lead time and its correlation
along the horizon, calibrated on the real published NESO GB and CarbonCast California forecasts). What it
emits is computed on the actual series. Co-location: two jobs time-slice one GPU, each keeping the
fraction of its solo speed Gavel measured for the mapped job types (``carbonflow.simulation.interference``,
V100); the shared GPU draws the simulation's assumption ``DeviceModel.shared_power_w`` (the hungrier
job's solo power, capped at the limit). Everything here is **simulated** from published measurements.

Learning across recurrences (every policy but the baseline keeps its own ``JobHistory`` of the runs it
made): epochs to target per batch size (``carbonflow.planning.batch_size.expected_epochs``, the mean of the
last 40 runs), the deadline margin (the latest start is planned for the most epochs a run needed × a margin
learned tighter as runs accumulate: 1.5 × up to 30 runs, 1.25 × at 60, 1.1 × from 150 on; the whole budget
until 3 runs converged) and, where the job opts in (``batch_sizes`` = every size Zeus measured on the V100 for
the workload), the batch size: ``carbonflow.planning.batch_size.batch_size_explorer`` (a Gaussian-process curve
of epochs to target and the knowledge gradient over a rolling 60 nights, the product's default: the jobs declare
no ``recurrences``) chooses it night by night from the realised runs, **exploration included** — an exploratory
run is stopped at the explorer's threshold (where its expected remaining energy passes a fresh run at the best
batch size) and rerun at once at the best known batch size (the planner is told so, ``early_stop=True``, and
keeps room before finish-by for both), and all of it is counted. Nothing is known in hindsight except in the
``hindsight_plan``, ``oracle`` and bound rows. The simulation's profiles are exact, so the history's prediction
corrections are 1 (each record's prediction is for the epochs run).

Policies compared (all decisions by ``carbonflow.planning``):
``baseline`` start now, b0, default (max) power limit, one job per GPU; ``power_limit`` the limit alone
(objective energy, start now); ``start_time`` the start alone (default limit); ``colocation`` pairs alone
(default limit, start now); ``batch_size`` the learned batch size alone (default limit, start now);
``joint_without_batch_size`` — ``plan_night``: limit, start and pairs; ``joint`` — ``plan_night`` with
the batch size too (the figure the targets are about); ``hindsight_plan`` — ``plan_night`` with the actual
series as its forecast and each job's best batch size known in hindsight (the former "oracle": not a ceiling,
it keeps the planner's margins); ``oracle`` — the **true ceiling**, not a policy (:func:`ceiling_choice`):
the actual intensity and tonight's actual epochs to target at every batch size, exhaustive over batch size,
power limit and start, no margins, no co-location. Every policy keeps each job's ``max_slowdown`` (10 % over
b0 at the default limit) and finish-by.

The **target's reference** is the ``fair_reference`` (:func:`fair_choice`): what a planner could at best know —
the actual intensity and each batch size's exact *distribution* of epochs to target (Zeus's paths), not tonight's
draw — exhaustive over (batch size, power limit) within the same slowdown bound and over slot-boundary starts,
minimising expected emissions, every latest start leaving room for the worst path (so 0 misses). The ceiling
(``oracle``) picks tonight's luckiest path and cannot be reached; it is kept as information
(``joint_fraction_of_oracle``).

``GB-published``: the 91 evenings of NESO's national forecasts **as published** (``benchmarks/data/
neso-gb-published-2023``, 14 March – 24 June 2023): each night is submitted at the first half-hour after the
~18:01Z issue and planned on that issue (no error drawn), scored on the actuals NESO published (a window slot
without one holds its neighbour's value, counted in the row); the jobs start with no history.
``GB-published-after-GB-year`` is the same evenings with the job histories the GB year left (information).

Between the ceiling and the joint plan, three **bounds** (:func:`bound_choice`) give up one piece of knowledge
each — tonight's epochs (choosing on the exact expected epochs instead), the actual intensity (the planner's
forecast and robust start search instead), the freedom from deadline margins — so the distance from the
joint plan to the ceiling splits into parts (``decomposition`` in the JSON; ``why_not_met`` states it).

Per trace the JSON holds ``carbon_reduction`` (1 − joint / baseline emissions), ``deadline_misses`` and
``runtime_increase`` (Σ run time to target / Σ baseline run time − 1; waiting for a later start is not run
time), the same for each policy, reference and bound, ``joint_fraction_of_fair_reference`` (the target: ≥ 0.95 on
GB, DE and US-CAL-CISO, ≥ 0.93 on GB-published, with 0 misses and ≤ +10 % runtime), ``joint_fraction_of_oracle``
(information) and the decomposition. The night's intensity spread bounds what the start can gain (US-CAL-CISO's
low-carbon hours are midday solar, outside an 18:00–06:00 window).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from carbonflow.carbon.calibration import default_error_model, sample_biased
from carbonflow.carbon.traces import load_trace
from carbonflow.carbon.windows import held_window_means, search_starts
from carbonflow.domain import Config, Forecast, ForecastPoint, JobSpec, Plan, Profile, ProfilePoint
from carbonflow.energy.simulated import ZeusPowerModel, workload_defaults
from carbonflow.planning import JobHistory, PairProfile, RealisedRun, pair_timeline, plan_job, plan_night
from carbonflow.planning.batch_size import batch_size_explorer
from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.interference import GAVEL_TO_ZEUS, load_pair_table
from carbonflow.units import J_PER_KWH

DATA = Path("/work/shared/data")
RESULTS = Path(__file__).resolve().parent / "results"
TRACES = {
    "GB": (DATA / "carbon/lets-wait-awhile/gb_ci.csv", "Europe/London"),
    "DE": (DATA / "carbon/lets-wait-awhile/ger_ci.csv", "Europe/Berlin"),
    "US-CAL-CISO": (DATA / "carbon/electricitymaps-portal/US-CAL-CISO_2022_hourly.csv", "America/Los_Angeles"),
}
SAMPLES_PER_EPOCH = 10_000  # a unit: work is counted in epochs, so any size gives the same plans
WINDOW_H = 12
MAX_SLOWDOWN = 0.10
DUPLICATED = ("cifar100", "movielens-1m")  # two workloads run twice a night
EPOCH_BUDGET = 2.0
"""A job's epoch budget (``JobSpec.epochs``) is this × its expected epochs to target at b0 (at most Zeus's
``max_epochs``, both × the job's scale)."""
MAX_JOB_H = 4.0
"""A nightly retrain is warm-started: a job does its epochs to target, but at most this many hours of work at
the default limit (ImageNet and LibriSpeech to target take 20 h and 17 h on a V100)."""


@dataclass(frozen=True)
class JobType:
    """One recurring job: a Zeus workload trained to its target on a simulated V100."""

    name: str
    dataset: str
    network: str
    b0: int
    scale: float
    """Fraction of a full training to target this nightly (warm-started) retrain needs (1 unless capped)."""
    budget_epochs: int
    """The job's epoch budget (``JobSpec.epochs``): a run that has not reached its target by then stops."""
    models: dict[int, ZeusPowerModel]
    paths: dict[int, np.ndarray]
    """Epochs to target of each of Zeus's training paths (seeds) per batch size, × ``scale``; NaN: never."""
    gavel_index: int

    @property
    def model(self) -> ZeusPowerModel:
        return self.models[self.b0]

    def hindsight(self) -> tuple[int, float]:
        """(batch size, max_slowdown relative to it) of the least expected energy to target within the job's
        10 % bound over b0 at the default limit: known only in hindsight (for the ``oracle`` row)."""
        ref_s = self.epochs * self.model.time_per_epoch_s(self.model.max_power_w)
        best = (math.inf, self.b0, ref_s)
        for bs, m in self.models.items():
            if np.isnan(self.paths[bs]).any():
                continue
            ep = float(np.mean(self.paths[bs]))
            for pl in m.power_limits_w:
                t = ep * m.time_per_epoch_s(pl)
                if t <= ref_s * (1 + MAX_SLOWDOWN) * (1 + 1e-9):
                    best = min(best, (t * m.average_power_w(pl), bs, ep * m.time_per_epoch_s(m.max_power_w)))
        _, bs, own_ref_s = best
        return bs, ref_s * (1 + MAX_SLOWDOWN) / own_ref_s - 1

    @property
    def epochs(self) -> float:
        """Expected epochs to target at b0."""
        return float(np.nanmean(self.paths[self.b0]))


def job_types() -> list[JobType]:
    """The night's jobs: Zeus workloads on V100, trained to Zeus's target; every batch size Zeus measured."""
    train = pd.read_csv(DATA / "zeus/summary_train.csv")
    power = pd.read_csv(DATA / "zeus/summary_power_v100.csv")
    pairs = load_pair_table()
    by_model: dict[tuple[str, str], int] = {}
    for i, model in enumerate(pairs.models):  # first Gavel type (sorted) of the model mapped to each workload
        by_model.setdefault(GAVEL_TO_ZEUS[model], i)
    out = []
    for (dataset, network), d in workload_defaults().items():
        model0 = ZeusPowerModel.load("V100", dataset, network)
        rows = train[
            (train.dataset == dataset)
            & (train.network == network)
            & (train.optimizer == model0.optimizer)
            & (train.target_metric == d["target_metric"])
        ]
        measured = set(power[(power.dataset == dataset) & (power.network == network)].batch_size)
        raw = {int(b): g.target_epoch.to_numpy(dtype=float) for b, g in rows.groupby("batch_size") if b in measured}
        b0 = model0.batch_size
        mean_b0 = float(np.nanmean(raw[b0]))
        full_s = mean_b0 * model0.time_per_epoch_s(model0.max_power_w)
        scale = min(1.0, MAX_JOB_H * 3600 / full_s)
        budget = min(math.ceil(d["max_epochs"] * scale), math.ceil(EPOCH_BUDGET * mean_b0 * scale))
        models = {b: ZeusPowerModel.load("V100", dataset, network, batch_size=b) for b in raw}
        paths = {b: v * scale for b, v in raw.items()}
        copies = 2 if dataset in DUPLICATED else 1
        for c in range(copies):
            out.append(
                JobType(
                    f"{dataset}-{c}", dataset, network, b0, scale, budget, models, paths, by_model[(dataset, network)]
                )
            )
    return out


def profile_for(jt: JobType, now: datetime) -> Profile:
    """The job's profile: every (batch size, power limit) Zeus measured on the V100 (exact in this simulation)."""
    points = []
    for bs, model in sorted(jt.models.items()):
        for pl in model.power_limits_w:
            tput = SAMPLES_PER_EPOCH / model.time_per_epoch_s(pl)
            power = model.average_power_w(pl)
            points.append(
                ProfilePoint(
                    config=Config(containers=1, power_limit_w=pl, batch_size=bs),
                    throughput_samples_per_s=tput,
                    power_per_device_w={"sim0": power},
                    energy_per_sample_j=power / tput,
                    duration_s=30,
                    samples=int(tput * 30),
                    label="simulated",
                )
            )
    return Profile(
        job=jt.name,
        device_model="V100 (simulated)",
        device_kind="gpu",
        label="simulated",
        default_power_limit_w=jt.model.max_power_w,
        max_power_w=jt.model.max_power_w,
        samples_per_epoch=SAMPLES_PER_EPOCH,
        points=points,
        measured_at=now,
    )


def pair_profiles(types: list[JobType], device: DeviceModel) -> list[PairProfile]:
    """Pairs measured at each job's reference configuration (b0, default limit)."""
    pairs = load_pair_table()
    out = []
    limit = device.default_power_limit_w
    for i, a in enumerate(types):
        for b in types[i + 1 :]:
            ka, kb = pairs.keep[a.gavel_index, b.gavel_index], pairs.keep[b.gavel_index, a.gavel_index]
            if not (np.isfinite(ka) and np.isfinite(kb)) or ka <= 0 or kb <= 0:
                continue
            pa, pb = a.model.average_power_w(limit), b.model.average_power_w(limit)
            out.append(
                PairProfile(
                    a.name,
                    b.name,
                    float(ka),
                    float(kb),
                    device.shared_power_w(pa, pb, limit),
                    label="simulated",
                    power_limit_w=limit,
                )
            )
    return out


def recent_actuals(actual: pd.Series, now: datetime, slot_s: float) -> list[ForecastPoint]:
    """The last 14 days of actuals ended by ``now``: what the operator hands the planner as intensity history."""
    past = actual[(actual.index >= pd.Timestamp(now - timedelta(days=14))) & (actual.index < pd.Timestamp(now))]
    past = past[past.index + pd.Timedelta(seconds=slot_s) <= pd.Timestamp(now)].dropna()
    return [
        ForecastPoint(start=t.to_pydatetime(), length_s=slot_s, gco2_per_kwh=max(0.0, float(v)))
        for t, v in past.items()
    ]


def make_forecast(
    region: str, actual: pd.Series, now: datetime, slot_s: float, rng, model
) -> tuple[Forecast, Forecast]:
    """(forecast with calibrated error, the actual series as a 'perfect forecast') over the window + 12 h."""
    horizon = int((WINDOW_H + 12) * 3600 / slot_s)
    idx = actual.index.searchsorted(pd.Timestamp(now))
    window = actual.iloc[idx : idx + horizon].ffill().bfill()
    starts = [t.to_pydatetime() for t in window.index]
    values = window.to_numpy(dtype=float)
    lead_h = (np.arange(len(values)) + 1) * slot_s / 3600
    noisy = sample_biased(values[None, :], lead_h, slot_s / 3600, ERROR_OF[region], rng)[0]

    def fc(vals: np.ndarray, provider: str, mae: dict[float, float] | None) -> Forecast:
        return Forecast(
            region=region,
            provider=provider,
            signal_kind="average-lifecycle",
            issued_at=now,
            points=[
                ForecastPoint(start=s, length_s=slot_s, gco2_per_kwh=float(v))
                for s, v in zip(starts, vals, strict=True)
            ],
            replay=True,
            error_mae_by_lead_h=mae,
        )

    # The forecast states its own expected error (as the carbon chain's forecasts do), from the same model.
    mae = model.mae_by_lead_h(float(noisy.mean()))
    return fc(noisy, "replay+calibrated-error", mae), fc(values, "actual", None)


ERROR_OF = {"GB": "neso-gb-national", "DE": "neso-gb-national", "US-CAL-CISO": "carboncast-us-ciso"}
"""Whose published forecasts' error (bias included) each trace's forecast carries: its own grid's where one
was calibrated (GB: NESO, California: CarbonCast), NESO's (the larger) for DE, which has none."""

BOUNDS = ("bound_expected_epochs", "bound_expected_epochs_forecast", "bound_expected_epochs_forecast_margins")
"""Steps from the ceiling down toward the joint plan, each giving up one piece of knowledge (see
:func:`bound_choice`): tonight's epochs to target (the distribution is still known exactly), then the actual
intensity (the planner's forecast and robust start search instead), then the freedom from deadline margins."""
MARGIN_FLOOR = 1.1
"""The deadline margin ``bound_expected_epochs_forecast_margins`` plans for: this × the most epochs to target any
of Zeus's paths needs at the batch size (the planner's own margin shrinks to the same floor over its history,
``carbonflow.planning.batch_size.DEADLINE_MARGIN_FLOOR``)."""

POLICIES = (
    "baseline",
    "power_limit",
    "start_time",
    "colocation",
    "batch_size",
    "joint_without_batch_size",
    "joint",
    "hindsight_plan",
    "oracle",
    "fair_reference",
    *BOUNDS,
)


@dataclass
class Tally:
    emissions_g: float = 0.0
    energy_j: float = 0.0
    runtime_s: float = 0.0
    misses: int = 0
    target_misses: int = 0
    jobs: int = 0
    colocated: int = 0
    runs: int = 0
    early_stopped: int = 0
    batch_sizes: dict[str, dict[int, int]] = field(default_factory=dict)


class Night:
    """One night's realisation: sampled training paths (the same for every policy) and the actual intensity."""

    def __init__(self, n: int, seed: int, now: datetime, actual: Forecast, types: dict[str, JobType]):
        self.n, self.seed, self.now, self.actual, self.types = n, seed, now, actual, types
        self.finish_by = now + timedelta(hours=WINDOW_H)
        self._order = {name: i for i, name in enumerate(types)}

    def epochs_needed(self, job: str, bs: int, attempt: int = 0) -> float:
        """Epochs this night's run of ``job`` at ``bs`` needs to reach the target (NaN: never): one Zeus path,
        drawn with a generator seeded by (seed, night, job, batch size, attempt), so every policy sees the same."""
        paths = self.types[job].paths[bs]
        rng = np.random.default_rng([self.seed, self.n, self._order[job], bs, attempt])
        return float(paths[int(rng.integers(len(paths)))])

    def emissions_g(self, energy_j: float, start: datetime, duration_s: float) -> float:
        s = (start - self.now).total_seconds()
        return energy_j / J_PER_KWH * float(held_window_means(self.actual, self.now, s, duration_s)[0])


def run_solo(
    night: Night,
    plan: Plan,
    spec: JobSpec,
    profile: Profile,
    history: JobHistory | None,
    tally: Tally,
    attempt: int = 0,
) -> None:
    """Run one plan on the actual series: to the target, the epoch budget, or (an exploratory batch size of a
    job that learns it) the explorer's early-stop threshold; a stopped run is rerun at once at the best known
    batch size and the default limit. Records the run into ``history``."""
    jt = night.types[plan.job]
    bs = plan.config.batch_size or jt.b0
    model = jt.models[bs]
    pl = plan.config.power_limit_w or model.max_power_w
    t_epoch, p_w = model.time_per_epoch_s(pl), model.average_power_w(pl)
    needed = night.epochs_needed(plan.job, bs, attempt)
    cap = float(jt.budget_epochs)
    explorer = batch_size_explorer(spec, profile, history) if spec.batch_sizes else None
    stop_j = explorer.stop_threshold(bs) if explorer is not None else math.inf
    cap_by_cost = stop_j / (t_epoch * p_w) if math.isfinite(stop_j) else math.inf
    limit = min(cap, cap_by_cost)
    reached = bool(np.isfinite(needed) and needed <= limit)
    epochs = needed if reached else limit
    duration = epochs * t_epoch
    energy = duration * p_w
    end = plan.start + timedelta(seconds=duration)
    tally.runs += 1
    tally.energy_j += energy
    tally.emissions_g += night.emissions_g(energy, plan.start, duration)
    tally.runtime_s += duration
    tally.batch_sizes.setdefault(plan.job, {})
    tally.batch_sizes[plan.job][bs] = tally.batch_sizes[plan.job].get(bs, 0) + 1
    if history is not None:
        history.add(
            RealisedRun(
                job=plan.job,
                config_key=plan.config.key(),
                finished_at=end,
                # The simulation's profiles are exact: the prediction for the epochs run equals the realisation
                # (epochs to target are learned separately, by JobHistory.epochs_to_target and the explorer).
                predicted_duration_s=duration,
                realised_duration_s=duration,
                predicted_energy_j=energy,
                realised_energy_j=energy,
                batch_size=bs,
                power_limit_w=pl,
                epochs=epochs,
                reached_target=reached,
            )
        )
    if not reached and limit < cap and attempt < 3:  # early-stopped exploration: rerun at the best known size
        tally.early_stopped += 1
        best_bs = explorer.best_mean()[0] if explorer is not None else jt.b0
        late = spec.finish_by is not None and end >= spec.finish_by
        retry = spec.model_copy(
            update={"batch_size": best_bs, "batch_sizes": None, "finish_by": None if late else spec.finish_by}
        )
        replan = plan_job(retry, profile, None, end, history, on_infeasible="fastest", early_stop=True)
        run_solo(night, replan, retry, profile, history, tally, attempt + 1)
        return
    tally.jobs += 1
    tally.target_misses += not reached
    tally.misses += end > night.finish_by + timedelta(seconds=1)


def run_pair(
    night: Night, p: Plan, other: Plan, pairs: list[PairProfile], history: JobHistory | None, tally: Tally
) -> None:
    """A co-located pair at its reference configuration (b0, the plan's limit), both trained to target."""
    jt, ot = night.types[p.job], night.types[other.job]
    pair = next(x for x in pairs if x.speeds(p.job, other.job) is not None)
    sa, sb = pair.speeds(p.job, other.job)  # type: ignore[misc]
    pl = p.config.power_limit_w or jt.model.max_power_w
    eps = []
    for t in (jt, ot):
        needed = night.epochs_needed(t.name, t.b0)
        eps.append((needed, True) if np.isfinite(needed) and needed <= t.budget_epochs else (t.budget_epochs, False))
    da = eps[0][0] * jt.model.time_per_epoch_s(pl)
    db = eps[1][0] * ot.model.time_per_epoch_s(pl)
    tl = pair_timeline(da, db, sa, sb)
    tail_power = (ot if tl.tail_job == "b" else jt).model.average_power_w(pl)
    e_overlap, e_tail = pair.power_w * tl.overlap_s, tail_power * tl.tail_s
    tally.energy_j += e_overlap + e_tail
    tally.emissions_g += night.emissions_g(e_overlap, p.start, tl.overlap_s)
    tally.emissions_g += night.emissions_g(e_tail, p.start + timedelta(seconds=tl.overlap_s), tl.tail_s)
    share_a = sa / (sa + sb)
    for plan, t, total, solo, (epochs, reached), e_share in (
        (p, jt, tl.total_a_s, da, eps[0], e_overlap * share_a + (e_tail if tl.tail_job == "a" else 0.0)),
        (other, ot, tl.total_b_s, db, eps[1], e_overlap * (1 - share_a) + (e_tail if tl.tail_job == "b" else 0.0)),
    ):
        end = plan.start + timedelta(seconds=total)
        tally.runtime_s += total
        tally.misses += end > plan.finish_by + timedelta(seconds=1)
        tally.target_misses += not reached
        tally.jobs += 1
        tally.runs += 1
        tally.colocated += 1
        tally.batch_sizes.setdefault(t.name, {})
        tally.batch_sizes[t.name][t.b0] = tally.batch_sizes[t.name].get(t.b0, 0) + 1
        if history is not None:
            history.add(
                RealisedRun(
                    job=t.name,
                    config_key=plan.config.key(),
                    finished_at=end,
                    predicted_duration_s=total,
                    realised_duration_s=total,
                    predicted_energy_j=e_share,
                    realised_energy_j=e_share,
                    batch_size=t.b0,
                    power_limit_w=pl,
                    epochs=epochs,
                    reached_target=reached,
                    colocated_with=tuple(plan.colocated_with),
                    observed_slowdown=total / solo - 1,
                )
            )


def ceiling_choice(night: Night, jt: JobType, actual: Forecast) -> tuple[float, float, float, float]:
    """The true ceiling for one job tonight: (energy J, duration s, start offset s, emissions g) of the least-carbon
    (batch size, power limit, start), knowing the actual intensity and tonight's epochs to target at every batch
    size, exhaustive over configurations and slot-boundary starts, within the job's slowdown bound (over b0 at
    the default limit for tonight's epochs) and finish-by, with no margins. A job that reaches its target at
    no batch size tonight runs its budget at b0 and the default limit, started now."""
    window_s = (night.finish_by - night.now).total_seconds()
    b0 = jt.model
    ep0 = night.epochs_needed(jt.name, jt.b0)
    options = []  # (energy, duration)
    if np.isfinite(ep0):
        ref_s = ep0 * b0.time_per_epoch_s(b0.max_power_w)
        for bs, m in jt.models.items():
            ep = night.epochs_needed(jt.name, bs)
            if not np.isfinite(ep) or ep > jt.budget_epochs:
                continue
            for pl in m.power_limits_w:
                t = ep * m.time_per_epoch_s(pl)
                if t <= ref_s * (1 + MAX_SLOWDOWN) * (1 + 1e-9) and t <= window_s:
                    options.append((t * m.average_power_w(pl), t))
    if not options:
        t = (ep0 if np.isfinite(ep0) and ep0 <= jt.budget_epochs else jt.budget_epochs) * b0.time_per_epoch_s(
            b0.max_power_w
        )
        e = t * b0.average_power_w(b0.max_power_w)
        return e, t, 0.0, night.emissions_g(e, night.now, t)
    energy = np.array([o[0] for o in options])
    duration = np.array([o[1] for o in options])
    # a reference that knows the intensity: every start is ranked on it, no safer-start guard (guard_z=0)
    found = search_starts(actual, duration, night.now, window_s - duration, hold_edges=True, guard_z=0.0)
    grams = energy[found.run] / J_PER_KWH * found.mean_gco2_per_kwh
    k = int(np.lexsort((found.start_s, np.round(grams / max(float(grams.max()), 1e-300), 9)))[0])  # ties: earliest
    i = int(found.run[k])
    return float(energy[i]), float(duration[i]), float(found.start_s[k]), float(grams[k])


def run_ceiling(night: Night, jt: JobType, actual: Forecast, tally: Tally) -> None:
    """Tally the ceiling's run of one job tonight (see :func:`ceiling_choice`)."""
    energy, duration, start_s, grams = ceiling_choice(night, jt, actual)
    tally.runs += 1
    tally.jobs += 1
    tally.energy_j += energy
    tally.emissions_g += grams
    tally.runtime_s += duration
    tally.misses += start_s + duration > (night.finish_by - night.now).total_seconds() + 1


def bound_choice(
    night: Night,
    jt: JobType,
    intensity: Forecast,
    recent: list[ForecastPoint] | None = None,
    margin: float | None = None,
) -> tuple[float, float, float, float, bool, bool]:
    """One decomposition step for one job tonight: (energy J, emissions g, duration s, start offset s, deadline
    missed, target missed), all realised on the actual series and tonight's epochs to target.

    Chooses like the ceiling — exhaustive over (batch size, power limit) and starts within the slowdown bound
    and finish-by — but on the *expected* epochs to target of each batch size (the mean of Zeus's paths, known
    exactly: more than the planner learns), not tonight's draw; the start on ``intensity`` (the actual series,
    or the planner's forecast with ``recent`` actuals, ranked by the one robust start search). With ``margin``
    each configuration's latest start leaves room for ``margin`` × the most epochs any path needs at its batch
    size; without, none (a long night can then miss finish-by, and that is counted)."""
    window_s = (night.finish_by - night.now).total_seconds()
    b0 = jt.model
    ref_s = jt.epochs * b0.time_per_epoch_s(b0.max_power_w)
    options = []  # (expected energy, expected duration, latest start, bs, pl)
    for bs, m in jt.models.items():
        if np.isnan(jt.paths[bs]).any():
            continue
        ep = float(np.mean(jt.paths[bs]))
        most = float(np.max(jt.paths[bs])) * (margin or 0.0)
        if ep > jt.budget_epochs:
            continue
        for pl in m.power_limits_w:
            t = ep * m.time_per_epoch_s(pl)
            room = max(t, most * m.time_per_epoch_s(pl))
            if t <= ref_s * (1 + MAX_SLOWDOWN) * (1 + 1e-9) and room <= window_s:
                options.append((t * m.average_power_w(pl), t, window_s - room, bs, pl))
    if not options:  # nothing fits: b0 at the default limit, now
        options.append((ref_s * b0.average_power_w(b0.max_power_w), ref_s, 0.0, jt.b0, b0.max_power_w))
    energy = np.array([o[0] for o in options])
    duration = np.array([o[1] for o in options])
    # on the actual series (no recent actuals handed) the bound knows the intensity: no safer-start guard; on the
    # planner's forecast it ranks as the product does (the guard at its default)
    guard = 0.0 if recent is None else None
    found = search_starts(
        intensity, duration, night.now, [o[2] for o in options], history=recent, hold_edges=True, guard_z=guard
    )
    score = energy[found.run] / J_PER_KWH * found.score_gco2_per_kwh
    k = int(np.lexsort((found.start_s, np.round(score / max(float(score.max()), 1e-300), 9)))[0])
    _, _, _, bs, pl = options[int(found.run[k])]
    start_s = float(found.start_s[k])
    m = jt.models[bs]
    needed = night.epochs_needed(jt.name, bs)
    reached = bool(np.isfinite(needed) and needed <= jt.budget_epochs)
    t = (needed if reached else jt.budget_epochs) * m.time_per_epoch_s(pl)
    e = t * m.average_power_w(pl)
    grams = night.emissions_g(e, night.now + timedelta(seconds=start_s), t)
    return e, grams, t, start_s, start_s + t > window_s + 1, not reached


def fair_choice(night: Night, jt: JobType, actual: Forecast) -> tuple[float, float, float, float, bool, bool]:
    """The fair reference for one job tonight: (energy J, emissions g, duration s, start offset s, deadline missed,
    target missed), realised on the actual series and tonight's epochs to target.

    It knows what a planner could at best know: the actual intensity and each batch size's *distribution* of
    epochs to target exactly (Zeus's paths, each equally likely), not tonight's draw. Exhaustive over (batch
    size, power limit) within the slowdown bound (expected time over b0's expected time at the default limit,
    as the planner's) and over every slot-boundary start and the latest start, it minimises the *expected*
    emissions over the paths; every latest start leaves room for the worst path (so it never misses finish-by).
    A job that fits nowhere runs b0 at the default limit, now."""
    window_s = (night.finish_by - night.now).total_seconds()
    b0 = jt.model
    ref_s = jt.epochs * b0.time_per_epoch_s(b0.max_power_w)
    slot_s = min(p.length_s for p in actual.points)
    options = []  # (bs, pl, starts, path durations): one held_window_means call for all of them
    for bs, m in jt.models.items():
        paths = jt.paths[bs]
        if np.isnan(paths).any() or float(np.mean(paths)) > jt.budget_epochs:
            continue
        for pl in m.power_limits_w:
            t_ep = m.time_per_epoch_s(pl)
            latest = window_s - float(np.max(paths)) * t_ep
            if float(np.mean(paths)) * t_ep > ref_s * (1 + MAX_SLOWDOWN) * (1 + 1e-9) or latest < 0:
                continue
            options.append((bs, pl, np.unique(np.append(np.arange(0.0, latest, slot_s), latest)), paths * t_ep))
    best = (math.inf, 0.0, jt.b0, b0.max_power_w)  # (expected grams, start, bs, pl)
    if options:
        s = np.concatenate([np.repeat(st, d.size) for _, _, st, d in options])
        d = np.concatenate([np.tile(d, st.size) for _, _, st, d in options])
        means = held_window_means(actual, night.now, s, d)
        at = 0
        for bs, pl, starts, dur in options:
            n = starts.size * dur.size
            held = (means[at : at + n] * d[at : at + n]).reshape(starts.size, dur.size)
            at += n
            grams = held.mean(axis=1) * jt.models[bs].average_power_w(pl) / J_PER_KWH  # expected over the paths
            k = int(np.flatnonzero(grams <= grams.min() * (1 + 1e-12))[0])  # ties (to rounding): the earliest start
            if grams[k] < best[0] * (1 - 1e-12):
                best = (float(grams[k]), float(starts[k]), bs, pl)
    _, start_s, bs, pl = best
    m = jt.models[bs]
    needed = night.epochs_needed(jt.name, bs)
    reached = bool(np.isfinite(needed) and needed <= jt.budget_epochs)
    t = (needed if reached else jt.budget_epochs) * m.time_per_epoch_s(pl)
    e = t * m.average_power_w(pl)
    grams = night.emissions_g(e, night.now + timedelta(seconds=start_s), t)
    return e, grams, t, start_s, start_s + t > window_s + 1, not reached


def run_fair(night: Night, jt: JobType, actual: Forecast, tally: Tally) -> None:
    """Tally the fair reference's run of one job tonight (see :func:`fair_choice`)."""
    energy, grams, duration, _, missed, target_missed = fair_choice(night, jt, actual)
    tally.runs += 1
    tally.jobs += 1
    tally.energy_j += energy
    tally.emissions_g += grams
    tally.runtime_s += duration
    tally.misses += missed
    tally.target_misses += target_missed


def run_bound(
    night: Night, jt: JobType, intensity: Forecast, recent: list[ForecastPoint] | None, margin, tally: Tally
) -> None:
    """Tally one decomposition step's run of one job tonight (see :func:`bound_choice`)."""
    energy, grams, duration, _, missed, target_missed = bound_choice(night, jt, intensity, recent, margin)
    tally.runs += 1
    tally.jobs += 1
    tally.energy_j += energy
    tally.emissions_g += grams
    tally.runtime_s += duration
    tally.misses += missed
    tally.target_misses += target_missed


def decomposition(r: dict) -> dict[str, float]:
    """Where the joint plan's distance to the ceiling goes, in fractions of the ceiling's carbon reduction (the
    parts add up to ``1 − joint_fraction_of_oracle``): ``tonights_epochs`` — knowing tonight's epochs to target
    (no planner can); ``forecast`` — the forecast and robust start search instead of the actual intensity;
    ``deadline_margins`` — room left before finish-by for the most epochs a run may need; ``learning_and_rest``
    — what the joint plan loses beyond that: epochs and batch sizes learned from its own runs (exploration
    included), margins wider while its history is short, co-location."""
    ceiling = r["oracle"]["carbon_reduction"]
    steps = [ceiling, *(r[k]["carbon_reduction"] for k in BOUNDS), r["joint"]["carbon_reduction"]]
    names = ("tonights_epochs", "forecast", "deadline_margins", "learning_and_rest")
    return {n: (a - b) / ceiling for n, a, b in zip(names, steps[:-1], steps[1:], strict=True)}


def realise(
    night: Night,
    plans: list[Plan],
    specs: dict[str, JobSpec],
    profiles: dict[str, Profile],
    pairs: list[PairProfile],
    history: JobHistory | None,
    tally: Tally,
) -> None:
    """What the plans really emit and take on the actual series (the night's sampled epochs to target)."""
    by_name = {p.job: p for p in plans}
    done: set[str] = set()
    for p in plans:
        if p.job in done:
            continue
        if p.colocated_with:
            other = by_name[p.colocated_with[0]]
            run_pair(night, p, other, pairs, history, tally)
            done.update((p.job, other.job))
            continue
        run_solo(night, p, specs[p.job], profiles[p.job], history, tally)
        done.add(p.job)


Evening = tuple[int, datetime, Forecast, Forecast, list[ForecastPoint]]
"""(night number, submit time, the planner's forecast, the actual series, the recent actuals handed the planner)."""


def trace_evenings(
    region: str, actual: pd.Series, slot_s: float, tz: str, nights: int, every: int, seed: int, utc_evening: bool
) -> Iterator[Evening]:
    """A year of evenings on a replayed trace: 18:00 local (or UTC), the forecast drawn with the calibrated error."""
    model = default_error_model()
    rng = np.random.default_rng(seed)
    day0 = (actual.index[0].to_pydatetime() + timedelta(days=1)).date()
    for n in range(0, nights, every):
        day = day0 + timedelta(days=n)
        if utc_evening:
            now = datetime(day.year, day.month, day.day, 18, tzinfo=UTC)
        else:
            now = datetime(day.year, day.month, day.day, 18, tzinfo=ZoneInfo(tz)).astimezone(UTC)
        if pd.Timestamp(now + timedelta(hours=WINDOW_H + 12)) > actual.index[-1]:
            break
        forecast, perfect = make_forecast(region, actual, now, slot_s, rng, model)
        yield n, now, forecast, perfect, recent_actuals(actual, now, slot_s)


PUBLISHED = Path(__file__).resolve().parent / "data/neso-gb-published-2023"
PUBLISHED_FILE = PUBLISHED / "gb_national_fw48h_evening_forecasts_2023-03-14_to_2023-06-24.csv"
PUBLISHED_SLOT_S = 1800.0


def published_actuals(path: Path = PUBLISHED_FILE) -> tuple[pd.DataFrame, pd.Series]:
    """The archive's rows and its actual intensity per half-hour (every slot from the first to the last, NaN
    where NESO published none)."""
    d = pd.read_csv(path)
    need = {"issued_at", "slot_start", "lead_h", "forecast_gco2_per_kwh", "actual_gco2_per_kwh"}
    if missing := need - set(d.columns):
        raise ValueError(f"{path}: columns {sorted(missing)} are missing; the long format has {sorted(need)}")
    d["issued_at"] = pd.to_datetime(d["issued_at"], utc=True)
    d["slot_start"] = pd.to_datetime(d["slot_start"], utc=True)
    per_slot = d.groupby("slot_start")["actual_gco2_per_kwh"]
    assert (per_slot.nunique() <= 1).all(), f"{path}: a slot has two different actuals"
    actual = per_slot.first().sort_index()
    full = pd.date_range(actual.index[0], actual.index[-1], freq=f"{int(PUBLISHED_SLOT_S)}s")
    return d, actual.reindex(full)


def published_evenings(path: Path = PUBLISHED_FILE, filled: list[int] | None = None) -> Iterator[Evening]:
    """NESO's evening forecasts as published (one issue about 18:01Z a day): each night is submitted at the first
    half-hour after the issue and planned on that issue's forecast (no error drawn, no stated error); it is
    scored on the actuals NESO published. Slots of the window without an actual hold the neighbouring value (as
    the replayed traces do); their count per night is appended to ``filled``."""
    d, actual = published_actuals(path)
    horizon = int((WINDOW_H + 12) * 3600 / PUBLISHED_SLOT_S)
    for n, (issued, rows) in enumerate(d.groupby("issued_at", sort=True)):
        now = issued.ceil(f"{int(PUBLISHED_SLOT_S)}s").to_pydatetime()
        sel = rows[rows["slot_start"] >= now].sort_values("slot_start").iloc[:horizon]
        step = sel["slot_start"].diff().dropna()
        assert len(sel) == horizon and (step == pd.Timedelta(seconds=PUBLISHED_SLOT_S)).all(), (
            f"{path}: the issue of {issued} does not cover {WINDOW_H + 12} h of whole half-hours from {now}"
        )
        window = actual.reindex(pd.DatetimeIndex(sel["slot_start"]))
        if filled is not None:
            filled.append(int(window.iloc[: int(WINDOW_H * 3600 / PUBLISHED_SLOT_S)].isna().sum()))
        window = window.ffill().bfill()

        starts = [t.to_pydatetime() for t in sel["slot_start"]]
        forecast = _series(starts, sel["forecast_gco2_per_kwh"], issued.to_pydatetime(), "neso-gb-national published")
        perfect = _series(starts, window, issued.to_pydatetime(), "actual")
        yield n, now, forecast, perfect, recent_actuals(actual, now, PUBLISHED_SLOT_S)


def _series(starts: list[datetime], values, issued: datetime, provider: str) -> Forecast:
    return Forecast(
        region="GB",
        provider=provider,
        signal_kind="average-direct",
        issued_at=issued,
        points=[
            ForecastPoint(start=t, length_s=PUBLISHED_SLOT_S, gco2_per_kwh=max(0.0, float(v)))
            for t, v in zip(starts, np.asarray(values, dtype=float), strict=True)
        ],
        replay=True,
    )


def run_trace(
    region: str,
    path: Path,
    tz: str,
    nights: int,
    every: int,
    seed: int,
    utc_evening: bool,
    histories: dict[str, JobHistory] | None = None,
) -> dict:
    trace = load_trace(path, region=region)
    actual = trace.actuals.sort_index()
    evenings = trace_evenings(region, actual, trace.slot_s, tz, nights, every, seed, utc_evening)
    out = run_evenings(region, evenings, seed, histories)
    out |= {"trace": str(path.relative_to(DATA)), "signal_kind": trace.signal_kind}
    out["forecast_error_provider"] = ERROR_OF[region]
    return out


def run_published(
    path: Path, seed: int, every: int = 1, histories: dict[str, JobHistory] | None = None, name: str = "GB-published"
) -> dict:
    """The ``GB-published`` row: the 91 evenings of NESO's forecasts as published. With ``histories`` (the GB
    year's), the jobs arrive with what a year of nights taught the planner, else with no history."""
    filled: list[int] = []
    evenings = (e for e in published_evenings(path, filled) if e[0] % every == 0)
    out = run_evenings("GB", evenings, seed, histories)
    out |= {
        "region": name,
        "job_histories": "carried over from the GB year's policies" if histories else "none at the first night",
        "trace": str(path.relative_to(path.parents[2])),
        "signal_kind": "average-direct (NESO national)",
        "forecast_error_provider": "none drawn: NESO's forecasts as published",
        "window_slots_without_actual_held": int(sum(filled)),
        "nights_with_a_held_slot": int(sum(1 for f in filled if f)),
    }
    return out


def run_evenings(
    region: str, evenings: Iterable[Evening], seed: int, histories: dict[str, JobHistory] | None = None
) -> dict:
    """Every policy, reference and bound over the evenings; ``histories`` (filled in place) are the policies' job
    histories to start from (empty if not given)."""
    types = job_types()
    by_name = {t.name: t for t in types}
    device = DeviceModel.for_pairs(load_pair_table(), "V100")
    pairs = pair_profiles(types, device)
    hind = {t.name: t.hindsight() for t in types}
    tallies = {k: Tally() for k in POLICIES}
    if histories is None:
        histories = {}
    for k in POLICIES:
        if k not in ("baseline", "oracle", "fair_reference", *BOUNDS):
            histories.setdefault(k, JobHistory())
    t0 = time.perf_counter()
    for n, now, forecast, perfect, recent in evenings:
        night = Night(n, seed, now, perfect, by_name)
        finish_by = now + timedelta(hours=WINDOW_H)
        profiles = {t.name: profile_for(t, now) for t in types}

        def spec(
            t: JobType,
            objective: str = "carbon",
            fixed_pl: float | None = None,
            bs: bool = False,
            finish_by: datetime = finish_by,
        ) -> JobSpec:
            return JobSpec(
                name=t.name,
                workload="zeus-replay",
                epochs=t.budget_epochs,
                batch_size=t.b0,
                batch_sizes=sorted(t.models) if bs else None,
                target_metric="zeus-target",
                region=region,
                finish_by=finish_by,
                objective=objective,
                max_slowdown=MAX_SLOWDOWN,
                power_limit_w=fixed_pl,
            )

        specs = {
            "baseline": {t.name: spec(t, "time", t.model.max_power_w) for t in types},
            "power_limit": {t.name: spec(t, "energy") for t in types},
            "start_time": {t.name: spec(t, "carbon", t.model.max_power_w) for t in types},
            "colocation": {t.name: spec(t, "energy", t.model.max_power_w) for t in types},
            "batch_size": {t.name: spec(t, "energy", t.model.max_power_w, bs=True) for t in types},
            "joint_without_batch_size": {t.name: spec(t) for t in types},
            "joint": {t.name: spec(t, bs=True) for t in types},
            "hindsight_plan": {
                t.name: spec(t).model_copy(update={"batch_size": hind[t.name][0], "max_slowdown": hind[t.name][1]})
                for t in types
            },
        }
        h = histories
        plans = {
            "baseline": [plan_job(s, profiles[k], None, now) for k, s in specs["baseline"].items()],
            "power_limit": [
                plan_job(s, profiles[k], None, now, h["power_limit"]) for k, s in specs["power_limit"].items()
            ],
            "start_time": [
                plan_job(s, profiles[k], forecast, now, h["start_time"], intensity_history=recent)
                for k, s in specs["start_time"].items()
            ],
            "colocation": plan_night(
                list(specs["colocation"].values()), profiles, {region: None}, now, pairs, h["colocation"]
            ),
            "batch_size": [
                plan_job(s, profiles[k], None, now, h["batch_size"], early_stop=True)
                for k, s in specs["batch_size"].items()
            ],
            "joint_without_batch_size": plan_night(
                list(specs["joint_without_batch_size"].values()),
                profiles,
                {region: forecast},
                now,
                pairs,
                h["joint_without_batch_size"],
                intensity_history={region: recent},
            ),
            "joint": plan_night(
                list(specs["joint"].values()),
                profiles,
                {region: forecast},
                now,
                pairs,
                h["joint"],
                intensity_history={region: recent},
                early_stop=True,
            ),
            "hindsight_plan": plan_night(
                list(specs["hindsight_plan"].values()), profiles, {region: perfect}, now, pairs, h["hindsight_plan"]
            ),
        }
        for key, ps in plans.items():
            realise(night, ps, specs[key], profiles, pairs, histories.get(key), tallies[key])
        for t in types:
            run_ceiling(night, t, perfect, tallies["oracle"])
            run_fair(night, t, perfect, tallies["fair_reference"])
            run_bound(night, t, perfect, None, None, tallies["bound_expected_epochs"])
            run_bound(night, t, forecast, recent, None, tallies["bound_expected_epochs_forecast"])
            run_bound(night, t, forecast, recent, MARGIN_FLOOR, tallies["bound_expected_epochs_forecast_margins"])
    base = tallies["baseline"]
    out: dict[str, object] = {
        "region": region,
        "nights": base.jobs // len(types),
        "jobs_per_night": len(types),
        "elapsed_s": time.perf_counter() - t0,
    }
    for key, t in tallies.items():
        out[key] = {
            "emissions_kg": t.emissions_g / 1000,
            "energy_kwh": t.energy_j / J_PER_KWH,
            "carbon_reduction": 1 - t.emissions_g / base.emissions_g,
            "energy_reduction": 1 - t.energy_j / base.energy_j,
            "deadline_misses": t.misses,
            "target_misses": t.target_misses,
            "runtime_increase": t.runtime_s / base.runtime_s - 1,
            "colocated_job_runs": t.colocated,
            "runs": t.runs,
            "early_stopped_runs": t.early_stopped,
            "batch_size_runs": {job: {str(b): c for b, c in sorted(bs.items())} for job, bs in t.batch_sizes.items()},
        }
    joint = out["joint"]
    out["carbon_reduction"] = joint["carbon_reduction"]  # type: ignore[index]
    out["deadline_misses"] = joint["deadline_misses"]  # type: ignore[index]
    out["runtime_increase"] = joint["runtime_increase"]  # type: ignore[index]
    out["joint_fraction_of_oracle"] = fraction_of_oracle(out)
    out["joint_fraction_of_fair_reference"] = fraction_of_fair(out)
    ceiling = out["oracle"]["carbon_reduction"]  # type: ignore[index]
    out["fair_reference_fraction_of_oracle"] = out["fair_reference"]["carbon_reduction"] / ceiling  # type: ignore[index]
    out["bound_fraction_of_oracle"] = {k: out[k]["carbon_reduction"] / ceiling for k in BOUNDS}  # type: ignore[index]
    out["decomposition"] = decomposition(out)
    return out


def fraction_of_oracle(r: dict) -> float:
    """``joint.carbon_reduction / oracle.carbon_reduction``: how much of the true ceiling's reduction is kept."""
    return r["joint"]["carbon_reduction"] / r["oracle"]["carbon_reduction"]


def fraction_of_fair(r: dict) -> float:
    """``joint.carbon_reduction / fair_reference.carbon_reduction``: the target (>= FAIR_TARGET)."""
    return r["joint"]["carbon_reduction"] / r["fair_reference"]["carbon_reduction"]


FAIR_TARGET = {"GB": 0.95, "DE": 0.95, "US-CAL-CISO": 0.95, "GB-published": 0.93, "GB-published-after-GB-year": 0.93}
"""``joint_fraction_of_fair_reference`` each row must reach (issue #23)."""
RUNTIME_LE = 0.10


def targets_met(r: dict) -> dict[str, bool]:
    return {
        "joint_fraction_of_fair_reference": fraction_of_fair(r) >= FAIR_TARGET[r["region"]],
        "deadline_misses": r["deadline_misses"] == 0,
        "runtime_increase": r["runtime_increase"] <= RUNTIME_LE,
    }


def why_not_met(r: dict) -> str | None:
    """A plain statement, from the figures, of why a row misses its target against the fair reference (None:
    met): how much of the distance is the forecast (the same exhaustive choice on the planner's forecast with
    the robust start search, margins of 1.1 x the worst path) and how much the rest of the joint plan."""
    met = targets_met(r)
    if all(met.values()):
        return None
    frac = fraction_of_fair(r)
    fair = r["fair_reference"]["carbon_reduction"]
    fc = r["bound_expected_epochs_forecast_margins"]["carbon_reduction"]
    joint = r["joint"]["carbon_reduction"]
    return (
        f"joint keeps {frac:.3f} of the fair reference's reduction ({joint:.3f} vs {fair:.3f}; target "
        f"{FAIR_TARGET[r['region']]}; misses {r['deadline_misses']}, runtime {r['runtime_increase']:+.3f}). "
        f"Choosing exhaustively on the exact expected epochs but on the planner's forecast (robust start search, "
        f"room for 1.1 x the worst path) keeps {fc / fair:.3f}: {(fair - fc) / fair:.3f} of the fair reduction is "
        f"the forecast error; the remaining {(fc - joint) / fair:.3f} is learning epochs and batch sizes from the "
        f"plan's own runs (exploration included), wider margins while its history is short, and co-location."
    )


def document(rows: list[dict], *, quick: bool, utc_evening: bool) -> dict:
    return {
        "benchmark": "nightly_carbon",
        "label": "simulated: Zeus V100 measurements, Gavel pair speeds, real grid traces, calibrated forecast error "
        "(GB-published: NESO's forecasts as published, replayed)",
        "submit": "18:00 UTC"
        if utc_evening
        else "18:00 local time (GB-published: the first half-hour after each evening issue, about 18:30Z)",
        "window_h": WINDOW_H,
        "max_slowdown": MAX_SLOWDOWN,
        "quick": quick,
        "intensity_history": "the last 14 days of actuals, as the operators pass them",
        "forecast_error": "per-provider calibration with its bias ("
        + ", ".join(f"{k}: {v}" for k, v in ERROR_OF.items())
        + "); carbonflow/carbon/data/error_calibration.json as committed; GB-published: none drawn",
        "error_calibration_days": error_calibration_days(),
        "fair_reference": "the target's reference: the actual intensity and each batch size's exact distribution "
        "of epochs to target (Zeus's paths, not tonight's draw), exhaustive over (batch size, power limit) within "
        "the slowdown bound and over slot-boundary starts, minimising expected emissions, every latest start "
        "leaving room for the worst path (0 misses); no co-location",
        "oracle": "information only, the clairvoyant ceiling (no planner can reach it): actual intensity, "
        "tonight's epochs to target, exhaustive over (batch size, power limit) and slot-boundary starts within "
        "the slowdown bound and finish-by, no margins, no co-location",
        "bounds": {
            "bound_expected_epochs": "as the ceiling, but choosing on each batch size's expected epochs to target "
            "(the mean of Zeus's paths, known exactly) instead of tonight's; realised on tonight's; no margins",
            "bound_expected_epochs_forecast": "the same with the planner's forecast (calibrated error with its "
            "bias) ranked by the one robust start search with the last 14 days of actuals",
            "bound_expected_epochs_forecast_margins": f"the same, each latest start leaving room for {MARGIN_FLOOR}"
            " x the most epochs any path needs at the batch size (the planner's margin floor)",
        },
        "product_calls": "every policy row but baseline's choice is plan_job's or plan_night's (the product's), "
        "called each night; fair_reference, oracle and the bounds are references (they call search_starts / "
        "held_window_means only)",
        "decomposition": "per trace, fractions of the ceiling's carbon reduction lost at each step ceiling -> "
        "bounds -> joint; they add up to 1 - joint_fraction_of_oracle",
        "targets": {
            "joint_fraction_of_fair_reference_ge": FAIR_TARGET,
            "deadline_misses": 0,
            "runtime_increase_le": RUNTIME_LE,
        },
        "traces": {r["region"]: r for r in rows},
        "targets_met": {r["region"]: targets_met(r) for r in rows},
        "why_not_met": {r["region"]: why for r in rows if (why := why_not_met(r))},
    }


def error_calibration_days() -> dict[str, object]:
    """The days each provider's error model was fitted on, as the calibration file records them."""
    path = Path(__file__).resolve().parents[1] / "carbonflow/carbon/data/error_calibration.json"
    doc = json.loads(path.read_text())
    return doc.get("error_calibration_days") or {k: v.get("days") for k, v in doc.get("sources", {}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", nargs="*", choices=list(TRACES), default=list(TRACES))
    parser.add_argument("--no-published", action="store_true", help="leave out the GB-published row")
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--quick", action="store_true", help="every 7th night")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--utc-evening", action="store_true", help="submit at 18:00 UTC instead of 18:00 local time")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default results/nightly_carbon.json)")
    parser.add_argument("--merge", type=Path, nargs="+", help="only combine the rows of these result files")
    args = parser.parse_args(argv)
    every = 7 if args.quick else 1
    rows = []
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(f.read_text())["traces"].values()]
    learned: dict[str, JobHistory] = {}
    for region in [] if args.merge else args.trace:
        path, tz = TRACES[region]
        hist = learned if region == "GB" else None
        rows.append(run_trace(region, path, tz, args.nights, every, args.seed, args.utc_evening, hist))
        _print_row(rows[-1])
    if not args.merge and not args.no_published and not args.utc_evening:
        rows.append(run_published(PUBLISHED_FILE, args.seed, every))
        _print_row(rows[-1])
        if learned:
            rows.append(run_published(PUBLISHED_FILE, args.seed, every, learned, "GB-published-after-GB-year"))
            _print_row(rows[-1])
    result = document(rows, quick=args.quick, utc_evening=args.utc_evening)
    name = "nightly_carbon" + ("_utc" if args.utc_evening else "") + ".json"
    out = args.out or RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["targets_met"], indent=1))
    return 0


def _print_row(r: dict) -> None:
    print(
        f"{r['region']:12s} nights={r['nights']:3d} joint/fair={fraction_of_fair(r):.3f} "
        f"joint/oracle={fraction_of_oracle(r):.3f}  "
        + "  ".join(
            f"{k}: {r[k]['carbon_reduction']:+.3f} carbon, {r[k]['runtime_increase']:+.3f} runtime, "
            f"{r[k]['deadline_misses']} misses"
            for k in POLICIES[1:]
        ),
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
