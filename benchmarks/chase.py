"""Chase's setting (Yang et al., ICLR 2023 CCAI workshop, arXiv 2303.02508) as a carbonflow benchmark.

Chase trains ResNet-50 on ImageNet on an NVIDIA A40 and, by choosing GPU power limits from the carbon
intensity, reports −13.6 % carbon for +2.5 % training time against training at the default (maximum) power
limit. This benchmark replays that setting with carbonflow's own planner:

* **Data (replayed, nothing hand-typed).** Zeus's A40 measurements (``summary_power_a40.csv``: time per epoch
  and mean GPU power at 100–300 W) for imagenet/resnet50, batch 256, adadelta (Zeus's b0); the epochs each of
  Zeus's 5 seeds needed to reach 65 % top-1 (``summary_train.csv``); the carbon intensity Chase used
  (``carbon_hist.csv``, column ``hist``, MISO Mason City, 2022-10-20..23, 30-min slots; ``--signal value``
  replays the other column). All under ``../shared/data/zeus`` (see its README for provenance).
* **Baseline.** Chase's: the default (maximum, 300 W) power limit, started at once.
* **Power limits alone.** ``plan_job`` with the ``carbon`` objective and ``max_slowdown`` = 0.025 (Chase's
  +2.5 %), handed a forecast window (:class:`carbonflow.carbon.replay.ReplayProvider`) that ends where the
  baseline run ends, so that every configuration's latest start is "now": the planner can only pick the limit.
  The choice is also checked against ``choose_power_limit`` (``planner_agrees_with_choose_power_limit``).
* **With a 12 h finish-by.** ``finish_by`` = the baseline's finish + 12 h; the forecast window reaches to it;
  ``plan_job`` picks the limit and the start jointly (``max_slowdown`` = the JobSpec default, 0.10; the same
  at 0.025 is reported too). A miss is a realised finish after ``finish_by``.
* **Forecasts.** The primary figures use the product's replayed forecast with synthetic lead-time error
  (``ReplayProvider(synthetic_error=True, seed=s)``, error seeds ``--error-seeds``; the error model is the
  product's default calibration, fitted on GB data, not on MISO); perfect foresight is reported beside them.
* **Scoring.** Every run is realised on the recorded intensity (``mean_intensity_gco2_per_kwh`` over the run
  it actually makes) with the measured time and power of the limit the planner chose, for the epochs that
  seed needed (the planner is told those epochs: Chase's evaluation replays known training paths too).
  Reductions are over the sum of all (start, seed) runs; one start per ``--every-slots`` slot from the
  trace's first slot while the whole window fits in the 3.5-day trace.

Not modelled: Chase changes the limit every 30 min from its SVR forecast; carbonflow sets one limit per run.
Energy is GPU energy only. Everything here is a **replay of recorded measurements**, not a live run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from carbonflow.carbon.replay import ReplayProvider
from carbonflow.carbon.traces import Trace, load_trace, to_datetime
from carbonflow.carbon.windows import mean_intensity_gco2_per_kwh
from carbonflow.domain import Config, Forecast, JobSpec, Plan, Profile, ProfilePoint
from carbonflow.planning import JobHistory, RealisedRun, choose_power_limit, plan_job
from carbonflow.units import J_PER_KWH

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data" / "zeus"
GPU, DATASET, NETWORK, BATCH_SIZE, OPTIMIZER, TARGET_ACCURACY = "A40", "imagenet", "resnet50", 256, "adadelta", 0.65
IMAGENET_TRAIN_SAMPLES = 1_281_167  # ILSVRC-2012 training set; only scales throughput, cancels in every ratio
CHASE_CARBON_REDUCTION, CHASE_TIME_INCREASE = 0.136, 0.025  # arXiv 2303.02508, abstract
FINISH_BY_SLACK_H = 12.0
FINISH_BY_TARGET = 2 * CHASE_CARBON_REDUCTION  # issue 23: "twice Chase's cut"
JOB = "chase-resnet50"
CEILING_MAX_SLOWDOWN = 10.0  # the JobSpec's largest: no slowdown bound
PER_PROVIDER = (
    "power_limit_only",
    "finish_by_12h",
    "finish_by_12h_max_slowdown_0.025",
    "finish_by_12h_epochs_from_history",
)
BOUND_SLACKS_H = (24.0, 36.0, 48.0)
"""Longer finish-by slacks the any-schedule bound is also computed for (the starts whose window the trace holds)."""
ZEUS_EPOCH_BUDGET = 100  # Zeus's max epochs for imagenet/resnet50 (run_alibaba.py, per the data README)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What the benchmark replays: measured limits, the seeds' epochs and the intensity trace."""

    limits_w: list[float]
    time_per_epoch_s: dict[float, float]
    power_w: dict[float, float]
    epochs_by_seed: dict[int, int]
    trace: Trace
    signal: str

    @property
    def max_limit_w(self) -> float:
        return max(self.limits_w)


def load_setting(data_dir: Path, signal: str = "hist") -> Setting:
    """Read the A40 ResNet-50 measurements, the seeds' epochs to 65 % and Chase's intensity trace."""
    if signal not in ("hist", "value"):
        raise ValueError(f"signal={signal!r} is not allowed; use 'hist' (what Chase scored) or 'value'")
    power = pd.read_csv(data_dir / f"summary_power_{GPU.lower()}.csv")
    rows = power[
        (power.dataset == DATASET)
        & (power.network == NETWORK)
        & (power.batch_size == BATCH_SIZE)
        & (power.optimizer == OPTIMIZER)
    ].sort_values("power_limit")
    train = pd.read_csv(data_dir / "summary_train.csv")
    runs = train[
        (train.dataset == DATASET)
        & (train.network == NETWORK)
        & (train.batch_size == BATCH_SIZE)
        & (train.optimizer == OPTIMIZER)
        & np.isclose(train.target_metric, TARGET_ACCURACY)
    ].dropna(subset=["target_epoch"])
    if rows.empty or runs.empty:
        raise ValueError(f"data_dir={str(data_dir)!r} lacks the {GPU} {DATASET}/{NETWORK} b{BATCH_SIZE} rows")
    path = data_dir / "carbon_hist.csv"
    trace = load_trace(path)  # the product's reader (column `value`); Chase scored column `hist`
    if signal == "hist":
        raw = pd.read_csv(path)
        hist = pd.Series(raw["hist"].to_numpy(dtype=float), index=pd.to_datetime(raw["timestamp"], utc=True))
        trace = dataclasses.replace(trace, actuals=hist.reindex(trace.actuals.index), source=f"{trace.source} [hist]")
    limits = [float(x) for x in rows.power_limit]
    return Setting(
        limits_w=limits,
        time_per_epoch_s=dict(zip(limits, rows.time_per_epoch.astype(float), strict=True)),
        power_w=dict(zip(limits, rows.average_power.astype(float), strict=True)),
        epochs_by_seed={int(r): int(e) for r, e in zip(runs.run, runs.target_epoch, strict=True)},
        trace=trace,
        signal=signal,
    )


def profile_for(setting: Setting, now: datetime) -> Profile:
    """The job's profile: every measured A40 power limit (exact in this replay)."""
    points = []
    for pl in setting.limits_w:
        tput = IMAGENET_TRAIN_SAMPLES / setting.time_per_epoch_s[pl]
        points.append(
            ProfilePoint(
                config=Config(containers=1, power_limit_w=pl, batch_size=BATCH_SIZE),
                throughput_samples_per_s=tput,
                power_per_device_w={"a40": setting.power_w[pl]},
                energy_per_sample_j=setting.power_w[pl] / tput,
                duration_s=60,
                samples=int(tput * 60),
                label="simulated",
            )
        )
    return Profile(
        job=JOB,
        device_model=f"{GPU} (Zeus measurements, replayed)",
        device_kind="gpu",
        label="simulated",
        default_power_limit_w=setting.max_limit_w,
        max_power_w=setting.max_limit_w,
        samples_per_epoch=IMAGENET_TRAIN_SAMPLES,
        points=points,
        measured_at=now,
    )


def job_spec(
    setting: Setting, epochs: int, max_slowdown: float, finish_by: datetime | None, to_target: bool = False
) -> JobSpec:
    """The job; ``to_target``: trained to 65 % within Zeus's 100-epoch budget, its epochs learned from history."""
    return JobSpec(
        name=JOB,
        workload=f"{DATASET}/{NETWORK}",
        epochs=epochs,
        batch_size=BATCH_SIZE,
        region=setting.trace.region,
        objective="carbon",
        max_slowdown=max_slowdown,
        finish_by=finish_by,
        target_metric="top1" if to_target else None,
        target_value=TARGET_ACCURACY if to_target else None,
    )


def history_without(setting: Setting, seed: int, before: datetime) -> JobHistory:
    """The other seeds' runs at the default limit, as the planner's memory (leave-one-out): it does not know
    how many epochs tonight's seed will need."""
    pl = setting.max_limit_w
    key = Config(containers=1, power_limit_w=pl, batch_size=BATCH_SIZE).key()
    records = []
    for k, (other, epochs) in enumerate(sorted(setting.epochs_by_seed.items())):
        if other == seed:
            continue
        d = epochs * setting.time_per_epoch_s[pl]
        records.append(
            RealisedRun(job=JOB, config_key=key, finished_at=before - timedelta(days=10 - k), predicted_duration_s=d,
                        realised_duration_s=d, predicted_energy_j=d * setting.power_w[pl],
                        realised_energy_j=d * setting.power_w[pl], batch_size=BATCH_SIZE, power_limit_w=pl,
                        epochs=float(epochs), reached_target=True)
        )  # fmt: skip
    return JobHistory(records)


def window_ending(forecast: Forecast, end: datetime) -> Forecast:
    """The forecast cut at ``end`` (its last slot shortened): no start later than now is left for any run."""
    points = []
    for p in forecast.points:
        if p.start >= end:
            break
        length_s = min(p.length_s, (end - p.start).total_seconds())
        points.append(p.model_copy(update={"length_s": length_s}))
    return forecast.model_copy(update={"points": points})


@dataclasses.dataclass
class Run:
    """One realised run: start, power limit, duration (s), energy (J), carbon (g), finish_by (or None)."""

    start: datetime
    power_limit_w: float
    duration_s: float
    energy_j: float
    carbon_g: float
    finish_by: datetime | None = None

    @property
    def missed(self) -> bool:
        return self.finish_by is not None and self.start + timedelta(seconds=self.duration_s) > self.finish_by


def realise(setting: Setting, actuals, start: datetime, power_limit_w: float, epochs: int, finish_by=None) -> Run:
    """The run as it happens: measured time and power at that limit, the recorded intensity over the run."""
    duration = epochs * setting.time_per_epoch_s[power_limit_w]
    energy = duration * setting.power_w[power_limit_w]
    ci = mean_intensity_gco2_per_kwh(actuals, start, start + timedelta(seconds=duration))
    return Run(start, power_limit_w, duration, energy, energy / J_PER_KWH * ci, finish_by)


def planned(plan: Plan) -> float:
    pl = plan.config.power_limit_w
    assert pl is not None, f"plan {plan.reason!r} has no power limit"
    return float(pl)


def power_limit_only(setting, provider, profile, now, epochs, actuals, max_slowdown=CHASE_TIME_INCREASE) -> Run:
    """Chase's setting: the planner picks the limit; the forecast window ends with the baseline run."""
    base_s = epochs * setting.time_per_epoch_s[setting.max_limit_w]
    end = now + timedelta(seconds=base_s)
    forecast = window_ending(provider.forecast(setting.trace.region, now, horizon_s=base_s), end)
    plan = plan_job(job_spec(setting, epochs, max_slowdown, None), profile, forecast, now)
    assert plan.start == now, f"power limits alone must start at once; the plan starts {plan.start.isoformat()}"
    return realise(setting, actuals, now, planned(plan), epochs)


def with_finish_by(setting, provider, profile, now, epochs, actuals, max_slowdown=0.10) -> Run:
    """Power limit and start chosen jointly by plan_job under finish_by = baseline finish + 12 h."""
    base_s = epochs * setting.time_per_epoch_s[setting.max_limit_w]
    finish_by = now + timedelta(seconds=base_s + FINISH_BY_SLACK_H * 3600)
    horizon_s = (finish_by - now).total_seconds()
    forecast = window_ending(provider.forecast(setting.trace.region, now, horizon_s=horizon_s), finish_by)
    plan = plan_job(job_spec(setting, epochs, max_slowdown, finish_by), profile, forecast, now)
    return realise(setting, actuals, plan.start, planned(plan), epochs, finish_by)


def with_finish_by_unknown_epochs(setting, provider, profile, now, seed, epochs, actuals) -> Run:
    """As :func:`with_finish_by`, but the planner learns the epochs from the other seeds' runs (the job's budget
    is Zeus's 100 epochs); the run then needs this seed's epochs. Tests the product's deadline margin."""
    base_s = epochs * setting.time_per_epoch_s[setting.max_limit_w]
    finish_by = now + timedelta(seconds=base_s + FINISH_BY_SLACK_H * 3600)
    horizon_s = (finish_by - now).total_seconds()
    forecast = window_ending(provider.forecast(setting.trace.region, now, horizon_s=horizon_s), finish_by)
    spec = job_spec(setting, ZEUS_EPOCH_BUDGET, 0.10, finish_by, to_target=True)
    plan = plan_job(spec, profile, forecast, now, history_without(setting, seed, now), on_infeasible="fastest")
    return realise(setting, actuals, plan.start, planned(plan), epochs, finish_by)


def starts(setting: Setting, every_slots: int, limit: int | None, slack_h: float = FINISH_BY_SLACK_H) -> list[datetime]:
    """Slot starts from the trace's first slot whose whole finish-by window (``slack_h`` after the baseline's
    finish) lies inside the trace."""
    index = setting.trace.actuals.dropna().index
    end = to_datetime(index.max()) + timedelta(seconds=setting.trace.slot_s)
    longest = max(setting.epochs_by_seed.values()) * setting.time_per_epoch_s[setting.max_limit_w]
    need = timedelta(seconds=longest + slack_h * 3600)
    out = [to_datetime(t) for t in index[::every_slots] if to_datetime(t) + need <= end]
    if not out:
        raise ValueError(f"the trace ({index.min()} .. {end}) is shorter than one finish-by window ({need})")
    return out[:limit] if limit else out


def exhaustive_ceiling(setting: Setting, actuals, pairs, base: list[Run], step_s: float = 60.0) -> float:
    """A reference, not the product: the least carbon of any measured limit at any start (every ``step_s``) that
    finishes by baseline finish + 12 h, on the recorded intensity; returned as the cut over the baseline."""
    t0 = np.array([p.start.timestamp() for p in actuals])
    t1 = t0 + np.array([p.length_s for p in actuals])
    edges = np.concatenate([t0, t1[-1:]])
    cum = np.concatenate([[0.0], np.cumsum((t1 - t0) * np.array([p.gco2_per_kwh for p in actuals]))])
    best_total = 0.0
    for (now, _, epochs), b in zip(pairs, base, strict=True):
        finish_by = now.timestamp() + b.duration_s + FINISH_BY_SLACK_H * 3600
        best = math.inf
        for pl in setting.limits_w:
            d = epochs * setting.time_per_epoch_s[pl]
            s = np.arange(now.timestamp(), finish_by - d + 1e-6, step_s)
            if s.size:
                mean = (np.interp(s + d, edges, cum) - np.interp(s, edges, cum)) / d
                best = min(best, float(mean.min()) * d * setting.power_w[pl] / J_PER_KWH)
        best_total += best
    return 1 - best_total / sum(r.carbon_g for r in base)


def any_schedule_bound(setting: Setting, actuals, pairs, base: list[Run], slack_h: float = FINISH_BY_SLACK_H) -> float:
    """A physical bound, not the product: the least carbon of *any* schedule that does each run's epochs between
    its start and baseline finish + ``slack_h`` on the recorded intensity — pausing and resuming at will and
    choosing any mix of the measured limits in every 30-min slot (a linear programme per run: seconds at each
    limit in each slot, at most the slot's length in all, adding up to the run's epochs; checkpoint and restart
    costs ignored). Returned as the cut over the baseline; no per-run plan can beat it."""
    from scipy.optimize import linprog

    t0 = np.array([p.start.timestamp() for p in actuals])
    t1 = t0 + np.array([p.length_s for p in actuals])
    ci = np.array([p.gco2_per_kwh for p in actuals])
    lim = setting.limits_w
    per_epoch = np.array([1 / setting.time_per_epoch_s[pl] for pl in lim])  # epochs per second at each limit
    watts = np.array([setting.power_w[pl] for pl in lim])
    best_total = 0.0
    for (now, _, epochs), b in zip(pairs, base, strict=True):
        lo, hi = now.timestamp(), now.timestamp() + b.duration_s + slack_h * 3600
        length = np.clip(np.minimum(t1, hi) - np.maximum(t0, lo), 0.0, None)
        keep = length > 0
        n, m = int(keep.sum()), len(lim)
        cost = (ci[keep][:, None] * watts[None, :] / J_PER_KWH).ravel()  # g per second at (slot, limit)
        slot_rows = np.kron(np.eye(n), np.ones((1, m)))  # seconds used in each slot <= its length
        work = np.tile(per_epoch, n)[None, :]  # epochs done == the run's epochs
        res = linprog(cost, A_ub=slot_rows, b_ub=length[keep], A_eq=work, b_eq=[epochs], bounds=(0, None),
                      method="highs")  # fmt: skip
        assert res.status == 0, f"no schedule does {epochs} epochs from {now.isoformat()}: {res.message}"
        best_total += float(res.fun)
    return 1 - best_total / sum(r.carbon_g for r in base)


def summarise(base: list[Run], runs: list[Run]) -> dict:
    """Carbon cut and time increase over the sum of runs, with per-run extremes."""
    b_c, r_c = sum(r.carbon_g for r in base), sum(r.carbon_g for r in runs)
    b_t, r_t = sum(r.duration_s for r in base), sum(r.duration_s for r in runs)
    b_e, r_e = sum(r.energy_j for r in base), sum(r.energy_j for r in runs)
    per_run = [1 - r.carbon_g / b.carbon_g for b, r in zip(base, runs, strict=True)]
    delays_h = [(r.start - b.start).total_seconds() / 3600 for b, r in zip(base, runs, strict=True)]
    limits = sorted({r.power_limit_w for r in runs})
    return {
        "carbon_reduction": 1 - r_c / b_c,
        "energy_reduction": 1 - r_e / b_e,
        "time_to_accuracy_increase": r_t / b_t - 1,
        "time_to_accuracy_increase_max": max(r.duration_s / b.duration_s - 1 for b, r in zip(base, runs, strict=True)),
        "carbon_reduction_per_run_min": min(per_run),
        "carbon_reduction_per_run_max": max(per_run),
        "mean_start_delay_h": float(np.mean(delays_h)),
        "misses": sum(r.missed for r in runs),
        "power_limits_chosen_w": limits,
        "runs": len(runs),
    }


def run(data_dir: Path, *, signal="hist", every_slots=1, limit_starts=None, error_seeds=(0, 1, 2)) -> dict:
    """The whole benchmark; returns the JSON document (see the module docstring)."""
    setting = load_setting(data_dir, signal)
    region = setting.trace.region
    times = starts(setting, every_slots, limit_starts)
    profile = profile_for(setting, times[0])
    oracle = ReplayProvider([setting.trace], synthetic_error=False)
    actuals = oracle.actuals(region, times[0], to_datetime(setting.trace.actuals.index.max()) + timedelta(days=1))
    forecasts = {"perfect": [oracle]} | {
        "synthetic_error": [ReplayProvider([setting.trace], seed=s) for s in error_seeds]
    }
    pairs = [(now, seed, e) for now in times for seed, e in sorted(setting.epochs_by_seed.items())]
    base = [realise(setting, actuals, now, setting.max_limit_w, e) for now, _, e in pairs]
    out: dict[str, dict] = {}
    for kind, providers in forecasts.items():
        arms: dict[str, list[Run]] = {name: [] for name in PER_PROVIDER}
        for provider in providers:
            for now, seed, e in pairs:
                arms["power_limit_only"].append(power_limit_only(setting, provider, profile, now, e, actuals))
                arms["finish_by_12h"].append(with_finish_by(setting, provider, profile, now, e, actuals))
                arms["finish_by_12h_max_slowdown_0.025"].append(
                    with_finish_by(setting, provider, profile, now, e, actuals, CHASE_TIME_INCREASE)
                )
                arms["finish_by_12h_epochs_from_history"].append(
                    with_finish_by_unknown_epochs(setting, provider, profile, now, seed, e, actuals)
                )
        if kind == "perfect":  # the product near its ceiling: any limit (no slowdown bound), known intensity (its
            # safer-start guard still asks a later start to beat the error its model assumes)
            arms["finish_by_12h_ceiling_any_slowdown"] = [
                with_finish_by(setting, oracle, profile, now, e, actuals, CEILING_MAX_SLOWDOWN) for now, _, e in pairs
            ]
        out[kind] = {
            name: summarise(base * (len(providers) if name in PER_PROVIDER else 1), rs) for name, rs in arms.items()
        }
    t = setting.time_per_epoch_s
    alone = choose_power_limit(
        setting.limits_w,
        [t[pl] for pl in setting.limits_w],
        [setting.power_w[pl] for pl in setting.limits_w],
        objective="carbon",
        max_slowdown=CHASE_TIME_INCREASE,
    )
    doc = document(setting, times, error_seeds, out, alone, every_slots)
    doc["finish_by_12h_exhaustive_ceiling_carbon_reduction"] = exhaustive_ceiling(setting, actuals, pairs, base)
    doc["finish_by_12h_any_schedule_bound_carbon_reduction"] = any_schedule_bound(setting, actuals, pairs, base)
    doc["any_schedule_bound_by_finish_by_slack_h"] = {}
    for slack_h in BOUND_SLACKS_H:
        try:
            at = starts(setting, every_slots, limit_starts, slack_h)
        except ValueError:  # the 3.5-day trace holds no window this long
            continue
        sp = [(now, seed, e) for now in at for seed, e in sorted(setting.epochs_by_seed.items())]
        sb = [realise(setting, actuals, now, setting.max_limit_w, e) for now, _, e in sp]
        doc["any_schedule_bound_by_finish_by_slack_h"][f"{slack_h:g}"] = {
            "starts": len(at),
            "carbon_reduction": any_schedule_bound(setting, actuals, sp, sb, slack_h),
        }
    doc["why_not_met"] = why_not_met(setting, doc)
    return doc


def why_not_met(setting: Setting, doc: dict) -> dict[str, str]:
    """One sentence per unmet target, from the figures (empty when all are met)."""
    e = {pl: setting.time_per_epoch_s[pl] * setting.power_w[pl] for pl in setting.limits_w}
    least = min(e, key=e.__getitem__)
    cut_e = 1 - e[least] / e[setting.max_limit_w]
    ci = setting.trace.actuals.dropna()
    out = {}
    if not doc["met"]["finish_by_12h_carbon_reduction"]:
        longer = ", ".join(
            f"{h} h: {v['carbon_reduction']:.1%}" for h, v in doc["any_schedule_bound_by_finish_by_slack_h"].items()
        )
        out["finish_by_12h_carbon_reduction"] = (
            f"physically unreachable in this setting: the least-energy limit ({least:g} W) cuts energy by "
            f"{cut_e:.1%}, and the recorded intensity varies little ({ci.min():.0f}..{ci.max():.0f} gCO2/kWh over "
            f"3.5 days), so the best single limit at the best start with known intensity (exhaustive search) cuts "
            f"{doc['finish_by_12h_exhaustive_ceiling_carbon_reduction']:.1%}, and the best of *any* schedule "
            f"(pausing at will, any mix of limits in every 30-min slot, known intensity: a linear programme per "
            f"run, so no re-planning can beat it) cuts {doc['finish_by_12h_any_schedule_bound_carbon_reduction']:.1%}"
            f", below {FINISH_BY_TARGET:.1%}; with a longer finish-by it stays below too ({longer})"
        )
    for key in ("power_limit_only_carbon_reduction", "time_to_accuracy_increase", "finish_by_12h_misses"):
        if not doc["met"][key]:
            out[key] = f"{key}={doc[key]} against target {doc['targets'][key]}"
    return out


def document(setting: Setting, times, error_seeds, out: dict, alone_w: float, every_slots: int) -> dict:
    primary = out["synthetic_error"]
    plo, fb = primary["power_limit_only"], primary["finish_by_12h"]
    met = {
        "power_limit_only_carbon_reduction": plo["carbon_reduction"] >= CHASE_CARBON_REDUCTION,
        "time_to_accuracy_increase": plo["time_to_accuracy_increase"] <= CHASE_TIME_INCREASE,
        "finish_by_12h_carbon_reduction": fb["carbon_reduction"] >= FINISH_BY_TARGET,
        "finish_by_12h_misses": fb["misses"] == 0,
    }
    return {
        "benchmark": "chase",
        "label": (
            "replayed: Zeus's measured A40 time/power per power limit (imagenet/resnet50 b256 adadelta) and epochs "
            f"to {TARGET_ACCURACY:.0%} per seed, Chase's recorded MISO intensity (column {setting.signal!r}); "
            "forecasts replayed from the recorded actuals (with the product's synthetic lead-time error, or perfect); "
            "GPU energy only; no GPU ran"
        ),
        "data": {
            "power": f"zeus/summary_power_{GPU.lower()}.csv",
            "epochs": "zeus/summary_train.csv",
            "carbon": f"zeus/carbon_hist.csv column {setting.signal!r} ({setting.trace.signal_kind}, "
            f"{setting.trace.region})",
            "trace_days": [str(d) for d in sorted({t.date() for t in setting.trace.actuals.dropna().index})],
        },
        "seeds": sorted(setting.epochs_by_seed),
        "epochs_by_seed": {str(k): v for k, v in sorted(setting.epochs_by_seed.items())},
        "forecast_error_seeds": list(error_seeds),
        "starts": {
            "first": times[0].isoformat(),
            "last": times[-1].isoformat(),
            "count": len(times),
            "every_slots": every_slots,
        },
        "baseline": f"{setting.max_limit_w:g} W (the default, maximum limit), started at once",
        "chase_published": {"carbon_reduction": CHASE_CARBON_REDUCTION, "time_increase": CHASE_TIME_INCREASE},
        "power_limit_only_carbon_reduction": plo["carbon_reduction"],
        "time_to_accuracy_increase": plo["time_to_accuracy_increase"],
        "finish_by_12h_carbon_reduction": fb["carbon_reduction"],
        "finish_by_12h_misses": fb["misses"],
        "finish_by_12h_time_to_accuracy_increase": fb["time_to_accuracy_increase"],
        "finish_by_12h_epochs_from_history_carbon_reduction": primary["finish_by_12h_epochs_from_history"][
            "carbon_reduction"
        ],
        "finish_by_12h_epochs_from_history_misses": primary["finish_by_12h_epochs_from_history"]["misses"],
        "targets": {
            "power_limit_only_carbon_reduction": CHASE_CARBON_REDUCTION,
            "time_to_accuracy_increase": CHASE_TIME_INCREASE,
            "finish_by_12h_carbon_reduction": FINISH_BY_TARGET,
            "finish_by_12h_misses": 0,
        },
        "met": met,
        "choose_power_limit_w": alone_w,
        "planner_agrees_with_choose_power_limit": plo["power_limits_chosen_w"] == [alone_w],
        "finish_by_12h_ceiling_carbon_reduction": out["perfect"]["finish_by_12h_ceiling_any_slowdown"][
            "carbon_reduction"
        ],
        "primary_forecast": "synthetic_error",
        "by_forecast": out,
        "not_modelled": [
            "Chase re-chooses the limit every 30 min from its SVR forecast; carbonflow sets one limit per run",
            "the primary finish-by arm tells the planner each seed's epochs (a known training path, as in Chase's "
            "replay); finish_by_12h_epochs_from_history learns them from the other 4 seeds instead",
            "the synthetic forecast error is the product's default calibration (GB), not fitted on MISO",
            "3.5 days of intensity: too short for the recent-actuals shrinkage (intensity_history not given)",
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="the zeus data folder")
    parser.add_argument("--signal", default="hist", choices=["hist", "value"], help="carbon_hist.csv column")
    parser.add_argument("--every-slots", type=int, default=1, help="one start every N 30-min slots")
    parser.add_argument("--limit-starts", type=int, default=None, help="at most this many starts (quick runs)")
    parser.add_argument("--error-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS / "chase.json")
    args = parser.parse_args(argv)
    if args.every_slots < 1:
        raise SystemExit(f"--every-slots={args.every_slots} is not allowed; give 1 or more")
    doc = run(args.data_dir, signal=args.signal, every_slots=args.every_slots, limit_starts=args.limit_starts,
              error_seeds=tuple(args.error_seeds))  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    for kind, arms in doc["by_forecast"].items():
        for name, s in arms.items():
            print(
                f"{kind:16s} {name:34s} carbon {-s['carbon_reduction']:+.1%} time {s['time_to_accuracy_increase']:+.1%}"
                f" delay {s['mean_start_delay_h']:.1f} h misses {s['misses']} limits {s['power_limits_chosen_w']}"
            )
    print(f"met: {doc['met']}")
    return 0 if math.isfinite(doc["power_limit_only_carbon_reduction"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
