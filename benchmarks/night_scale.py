"""Platform scale: 50 recurring jobs a night on 8 simulated V100s for 30 nights, profiling overhead counted.

Jobs: 50 recurring jobs, job ``i`` of Gavel job type ``i mod 26`` (its pair interference is Gavel's
*measured* V100 table), training like the Zeus workload that type maps to (``GAVEL_TO_ZEUS``; speed and
power per power limit from Zeus's V100 measurements, replayed: every figure is **simulated**). Each job's
nightly work is one of Zeus's training paths to target, capped at ``--max-job-h`` hours at the default
limit (a warm-started retrain); finish-by is 12 h after the 18:00 submission. Grid: DE 2020 (Let's Wait
Awhile, lifecycle). The planner sees a forecast with the calibrated error model, as in
``nightly_carbon.py``, whose night realisation this reuses.

Each night the cluster runs what the product runs: ``plan_night`` plans every job (limit, start, pairs
among pairs it knows), and each GPU group then starts at its planned time or when one of the 8 GPUs is
free (a group task waits for a GPU lease), whichever is later.

Two pair-profiling policies, each charged for its own profiling, in GPU-seconds and in carbon at the
intensity of the hour it runs (start of the night):

* ``exhaustive`` — every pair that could share a GPU is profiled on the first night (1,225 pairs);
* ``budgeted`` — carbonflow: pairs are predicted from the solo profiles and recorded outcomes
  (``carbonflow.planning.pair_prediction``) and only the most promising unknown ones are profiled, at
  most ``--pair-budget`` pairs and ``--pair-budget-gpu-s`` GPU-seconds a night.

Profiling is charged as the product's profiler runs it: per solo profile ``--profile-startup-s`` (process
start, data loading) plus ``--profile-s-per-config`` per power limit swept, per pair profile
``--pair-profile-s``; these durations are the benchmark's assumptions (printed in the JSON), not
measurements. Solo profiles are refreshed when older than the job's ``profile_max_age_s`` (7 days).

Run: ``python benchmarks/night_scale.py [--nights 30]`` → benchmarks/results/night_scale.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nightly_carbon as nc

from carbonflow.carbon.calibration import default_error_model
from carbonflow.carbon.traces import load_trace
from carbonflow.carbon.windows import held_window_means
from carbonflow.models import JobSpec, Plan, Profile
from carbonflow.planning import JobHistory, PairProfile, plan_night
from carbonflow.planning.night_gpus import deadline_factors, fit_plans_to_gpus, gpu_groups
from carbonflow.planning.pair_prediction import (
    PairOutcome,
    fit_pair_predictor,
    pairs_to_profile,
    solo_features,
)
from carbonflow.profiling.refresh import ProfileState, profiles_to_refresh
from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.interference import load_pair_table
from carbonflow.units import emissions_g_from

RESULTS = Path(__file__).resolve().parent / "results"
REGION = "DE"


def scale_jobs(n_jobs: int) -> list[nc.JobType]:
    """``n_jobs`` recurring jobs: job i has Gavel type i mod 26 and the Zeus workload that type maps to."""
    pairs = load_pair_table()
    by_workload = {(t.dataset, t.network): t for t in nc.job_types()}
    jobs = []
    for i in range(n_jobs):
        g = i % len(pairs)
        base = by_workload[pairs.zeus_workload(g)]
        jobs.append(dataclasses.replace(base, name=f"job{i:03d}", gavel_index=g))
    return jobs


def solo_profile_gpu_s(profile: Profile, args: argparse.Namespace) -> float:
    """GPU-seconds the product's profiler spends on one job: start-up + each power limit at the job's batch size."""
    limits = {p.config.power_limit_w for p in profile.points}
    return args.profile_startup_s + len(limits) * args.profile_s_per_config


@dataclasses.dataclass
class PolicyState:
    name: str
    known_pairs: dict[frozenset[str], PairProfile] = dataclasses.field(default_factory=dict)
    profiled_at: dict[str, datetime] = dataclasses.field(default_factory=dict)
    history: JobHistory = dataclasses.field(default_factory=JobHistory)
    tally: nc.Tally = dataclasses.field(default_factory=nc.Tally)
    profiling_gpu_s: list[float] = dataclasses.field(default_factory=list)
    training_gpu_s: list[float] = dataclasses.field(default_factory=list)
    profiling_g: float = 0.0
    pairs_profiled: int = 0


def _pair_key(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def profile_solo(state: PolicyState, specs: dict[str, JobSpec], profiles, now: datetime, args) -> float:
    """Refresh solo profiles as the product does (``profiles_to_refresh``); GPU-seconds spent."""
    last_training_s = state.training_gpu_s[-1] if state.training_gpu_s else 0.0
    states = [
        ProfileState(
            name, spec.profile_max_age_s, solo_profile_gpu_s(profiles[name], args), state.profiled_at.get(name)
        )
        for name, spec in specs.items()
    ]
    refreshes = profiles_to_refresh(states, now, args.profile_budget_fraction * last_training_s)
    for r in refreshes:
        state.profiled_at[r.job] = now
    return sum(r.cost_gpu_s for r in refreshes)


def profile_pairs(state: PolicyState, all_pairs: dict[frozenset[str], PairProfile], profiles, args) -> float:
    """Add pair profiles by the policy's rule; GPU-seconds spent."""
    unknown = [k for k in all_pairs if k not in state.known_pairs]
    if state.name == "exhaustive":
        chosen = unknown
    else:
        solo = {n: solo_features(p) for n, p in profiles.items()}
        outcomes = [PairOutcome(p.job_a, p.job_b, p.speed_a, p.speed_b) for p in state.known_pairs.values()]
        predictor = fit_pair_predictor(solo, outcomes)
        predictions = [predictor.predict(solo[a], solo[b]) for a, b in (sorted(k) for k in unknown)]
        cost = {(p.job_a, p.job_b): args.pair_profile_s for p in predictions}
        picked = pairs_to_profile(predictions, cost, max_pairs=args.pair_budget, max_gpu_s=args.pair_budget_gpu_s)
        chosen = [_pair_key(c.job_a, c.job_b) for c in picked]
    for k in chosen:
        state.known_pairs[k] = all_pairs[k]
    state.pairs_profiled += len(chosen)
    return len(chosen) * args.pair_profile_s


def run_on_gpus(night: nc.Night, plans: list[Plan], specs, profiles, state: PolicyState, gpus: int) -> float:
    """Run the night on ``gpus`` GPUs: each group starts at its planned time or when a GPU frees, whichever is
    later (a group task waits for a GPU lease); a GPU frees when its group really ends. Returns GPU-seconds."""
    free_at = [night.now] * gpus
    busy_s = 0.0
    for members in gpu_groups(plans):
        start = max(members[0].start, heapq.heappop(free_at))
        moved = [m.model_copy(update={"start": start}) for m in members]
        nc.realise(night, moved, specs, profiles, list(state.known_pairs.values()), state.history, state.tally)
        end = max(state.history.for_job(m.job)[-1].finished_at for m in members)
        heapq.heappush(free_at, end)
        busy_s += (end - start).total_seconds()
    return busy_s


def run(args: argparse.Namespace) -> dict:
    nc.MAX_JOB_H = args.max_job_h
    path, _ = nc.TRACES[REGION]
    trace = load_trace(path, region=REGION)
    actual = trace.actuals.sort_index()
    error_model = default_error_model()
    rng = np.random.default_rng(args.seed)
    jobs = scale_jobs(args.jobs)
    by_name = {j.name: j for j in jobs}
    device = DeviceModel.for_pairs(load_pair_table(), "V100")
    all_pairs = {_pair_key(p.job_a, p.job_b): p for p in nc.pair_profiles(jobs, device)}
    states = {k: PolicyState(k) for k in ("exhaustive", "budgeted")}
    plan_s: list[float] = []
    day0 = (actual.index[0].to_pydatetime() + timedelta(days=1)).date()
    for n in range(args.nights):
        day = day0 + timedelta(days=n)
        now = datetime(day.year, day.month, day.day, 17, tzinfo=UTC)  # 18:00 Berlin (CET)
        forecast, perfect = nc.make_forecast(REGION, actual, now, trace.slot_s, rng, error_model)
        night = nc.Night(n, args.seed, now, perfect, by_name)
        finish_by = now + timedelta(hours=nc.WINDOW_H)
        profiles = {j.name: nc.profile_for(j, now) for j in jobs}
        specs = {j.name: _spec(j, finish_by) for j in jobs}
        intensity_now = float(held_window_means(perfect, now, 0.0, 3600.0)[0])
        recent = {REGION: nc.recent_actuals(actual, now, trace.slot_s)}  # as the night operator passes them
        for state in states.values():
            spent = profile_solo(state, specs, profiles, now, args) + profile_pairs(state, all_pairs, profiles, args)
            state.profiling_gpu_s.append(spent)
            state.profiling_g += emissions_g_from(spent * args.profile_power_w, intensity_now)
            t0 = time.perf_counter()
            plans = plan_night(list(specs.values()), profiles, {REGION: forecast}, now,
                               list(state.known_pairs.values()), state.history, intensity_history=recent)  # fmt: skip
            margin = deadline_factors(plans, specs, profiles, state.history)
            plans = fit_plans_to_gpus(plans, args.gpus, now, forecast, margin)
            plan_s.append(time.perf_counter() - t0)
            state.training_gpu_s.append(run_on_gpus(night, plans, specs, profiles, state, args.gpus))
    return summarise(states, plan_s, args)


def _spec(job: nc.JobType, finish_by: datetime) -> JobSpec:
    return JobSpec(
        name=job.name, workload="zeus-replay", epochs=job.budget_epochs, batch_size=job.b0,
        target_metric="zeus-target", region=REGION, finish_by=finish_by, objective="carbon",
        max_slowdown=nc.MAX_SLOWDOWN,
    )  # fmt: skip


def summarise(states: dict[str, PolicyState], plan_s: list[float], args: argparse.Namespace) -> dict:
    def totals(s: PolicyState) -> dict:
        later = [p / t for p, t in zip(s.profiling_gpu_s[1:], s.training_gpu_s[1:], strict=True)]
        return {
            "profiling_gpu_s_first_night": round(s.profiling_gpu_s[0], 1),
            "training_gpu_s_first_night": round(s.training_gpu_s[0], 1),
            "profiling_over_training_first_night": round(s.profiling_gpu_s[0] / s.training_gpu_s[0], 4),
            "profiling_over_training_nights_2_30": round(max(later), 4) if later else None,
            "pairs_profiled": s.pairs_profiled,
            "colocated_job_runs": s.tally.colocated,
            "deadline_misses": s.tally.misses,
            "training_emissions_kg": round(s.tally.emissions_g / 1000, 3),
            "profiling_emissions_kg": round(s.profiling_g / 1000, 3),
        }

    ours, exhaustive = states["budgeted"], states["exhaustive"]
    ours_g = ours.tally.emissions_g + ours.profiling_g
    exhaustive_g = exhaustive.tally.emissions_g + exhaustive.profiling_g
    pair_mae = json.loads((RESULTS / "pair_prediction.json").read_text())["pair_prediction_mae_kept_speed"]
    budgeted = totals(ours)
    return {
        "label": "simulated (Zeus V100 power/speed, Gavel V100 pairs, DE 2020 grid, calibrated forecast error)",
        "jobs": args.jobs, "gpus": args.gpus, "nights": args.nights, "max_job_h": args.max_job_h,
        "offered_load_first_night": round(budgeted["training_gpu_s_first_night"] / (args.gpus * nc.WINDOW_H * 3600), 3),
        "assumptions": {k: getattr(args, k) for k in ("profile_startup_s", "profile_s_per_config", "pair_profile_s",
                                                       "profile_power_w", "pair_budget", "pair_budget_gpu_s",
                                                       "profile_budget_fraction")},
        **{k: budgeted[k] for k in ("profiling_gpu_s_first_night", "training_gpu_s_first_night",
                                    "profiling_over_training_nights_2_30", "deadline_misses")},
        "carbon_reduction_vs_exhaustive_pair_profiling": round(1 - ours_g / exhaustive_g, 4),
        "pair_prediction_mae_kept_speed": pair_mae,
        "night_plan_s": round(max(plan_s), 3),
        "policies": {"budgeted": budgeted, "exhaustive": totals(exhaustive)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-job-h", type=float, default=1.5, help="a job's nightly work, at most, at the default limit")
    ap.add_argument("--profile-startup-s", type=float, default=30.0)
    ap.add_argument("--profile-s-per-config", type=float, default=10.0)
    ap.add_argument("--pair-profile-s", type=float, default=20.0)
    ap.add_argument("--profile-power-w", type=float, default=250.0, help="GPU power charged while profiling")
    ap.add_argument("--pair-budget", type=int, default=25, help="pair profiles a night, at most")
    ap.add_argument("--pair-budget-gpu-s", type=float, default=600.0, help="pair-profiling GPU-seconds a night")
    ap.add_argument(
        "--profile-budget-fraction",
        type=float,
        default=0.01,
        help="age-based solo-profile refreshes a night, at most this fraction of last night's training GPU-s",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "night_scale.json")
    args = ap.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
