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
  (``carbonflow.planning.pairs``) and only the most promising unknown ones are profiled, at
  most ``--pair-budget`` pairs and ``--pair-budget-gpu-s`` GPU-seconds a night.

Profiling is charged at durations **measured** by the product's own profiler (:func:`measure_profiling_seconds`:
``profile_job`` and ``profile_pair`` with the LocalBackend on simulated V100s, three Zeus workloads, the
product's default profile settings): per solo profile a start-up (host wall time: wrapper and process start,
imports, data loading, teardown; the GPU is held meanwhile) plus seconds per power limit swept (the simulated
GPU's work-driven clock), per pair profile its start-up plus the pair's work on the simulated clock. The JSON
keeps the measurement under ``profiling_seconds_measured``; ``--profile-startup-s``, ``--profile-s-per-config``
and ``--pair-profile-s`` override it (default None: measured), ``--profiling-measured FILE`` reuses one.

Solo profiles are refreshed as the product refreshes them (``profiles_to_refresh``): at once when realised
runs drift from the profile's predictions (the product's ``drift_reason`` on each job's realised/predicted
energy since its profile; drift itself is modelled, :class:`DriftModel`, labelled simulated), else past the
job's ``profile_max_age_s`` (7 days) within a nightly budget.

Run: ``python benchmarks/night_scale.py [--nights 30]`` → benchmarks/results/night_scale.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
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
from carbonflow.domain import JobSpec, Plan, Profile
from carbonflow.planning import JobHistory, PairProfile, plan_night
from carbonflow.planning.night_gpus import deadline_factors, fit_plans_to_gpus, gpu_groups
from carbonflow.planning.pairs import (
    PairOutcome,
    fit_pair_predictor,
    pairs_to_profile,
    solo_features,
)
from carbonflow.profiling.profiler import DEFAULT_STEP_W
from carbonflow.profiling.refresh import ProfileState, drift_reason, profiles_to_refresh
from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.interference import load_pair_table
from carbonflow.units import emissions_g_from

RESULTS = Path(__file__).resolve().parent / "results"
REGION = "DE"


# Profiling seconds, measured: the product's profiler on simulated GPUs ----------------------------------------

PROFILED_WORKLOADS = (("cifar100", "shufflenetv2"), ("sentiment140", "bert_base_uncased"), ("imagenet", "resnet50"))
"""Zeus workloads whose profiles are measured (V100): the two the shipped demo jobs replay, and ImageNet."""


def _profiling_spec(dataset: str, network: str, name: str | None = None) -> JobSpec:
    """The shipped demo job (the real digits CNN on this CPU) on a simulated V100 replaying ``dataset/network``,
    one container, at the product's default profile settings (JobSpec's profile_* defaults)."""
    from carbonflow.workloads.catalog import DIGITS_CNN

    base = {k: v for k, v in DIGITS_CNN.items() if not k.startswith("profile_") and k != "max_containers"}
    sim = {**base["simulated_gpu"], "dataset": dataset, "network": network, "count": 1}
    return JobSpec(**{**base, "name": name or f"profile-{network}", "simulated_gpu": sim})


def _run_dirs(tmp: Path) -> set[Path]:
    """The wrappers' working folders (a solo run's and a pair's) under ``tmp``."""
    return set(tmp.glob("carbonflow-run-*")) | set(tmp.glob("carbonflow-shared-*"))


def _report_span(tmp: Path, before: set[Path]) -> list[tuple[float, float]]:
    """(first, last) host-monotonic time of the progress reports of each run the wrapper started since ``before``."""
    spans = []
    for d in sorted(set(_run_dirs(tmp)) - before):
        for f in sorted(d.rglob("progress.jsonl")):
            ts = [json.loads(line)["t_s"] for line in f.read_text().splitlines() if '"t_s"' in line]
            if ts:
                spans.append((min(ts), max(ts)))
    return spans


def _phase_gpu_s(step_s: float, warmup: int, spec: JobSpec) -> float:
    """One power limit's phase as a GPU runs it: the warm-up steps, then measured steps until both the
    product's ``profile_steps`` and ``profile_min_window_s`` are met (the wrapper's rule, on the GPU's time)."""
    measured = max(spec.profile_steps, math.ceil(spec.profile_min_window_s / step_s))
    return (warmup + measured) * step_s


def measure_profiling_seconds(workdir: Path) -> dict:
    """Run the product's profiler (``profile_job``, then ``profile_pair``) with the LocalBackend on simulated V100s.

    * seconds per power limit — on the simulated GPU's clock (work-driven: the Zeus trace's time per sample at
      each limit): each window's measured time per step, turned into the phase a GPU runs (warm-up + measured
      steps until ``profile_steps`` and ``profile_min_window_s`` are met; on the simulated GPU the host's
      slower CPU steps decide when a window is long enough, so the raw windows are shorter than a GPU's);
    * start-up — host wall time from the call to the training's first progress report (wrapper and process
      start, imports, data loading), plus the time after its last report (evaluation, saving, teardown): the
      GPU is held and idle meanwhile. It is this host's, under its load (recorded);
    * pair profile — start-up the same way, plus the pair run's work on the simulated clock.
    """
    import os
    import tempfile

    from carbonflow.energy.discovery import discover_devices
    from carbonflow.execution.commands import samples_per_epoch
    from carbonflow.execution.local import LocalBackend
    from carbonflow.profiling.profiler import profile_job, profile_pair

    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    old_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), None
    rows, specs, profiles = [], {}, {}
    try:
        for dataset, network in PROFILED_WORKLOADS:
            spec = _profiling_spec(dataset, network)
            backend = LocalBackend(workdir / spec.name)
            devices = discover_devices(spec.simulated_gpu, include_cpu=True, prefer_simulated=True)
            runs, calls = [], []
            execute = backend.execute

            def timed(*a, _execute=execute, _runs=runs, _calls=calls, **k):
                before, t0 = set(_run_dirs(tmp)), time.monotonic()
                run = _execute(*a, **k)
                _runs.append(run)
                _calls.append((t0, time.monotonic(), _report_span(tmp, before)))
                return run

            backend.execute = timed
            profile = profile_job(spec, backend, devices, samples_per_epoch=samples_per_epoch(spec))
            specs[spec.name], profiles[spec.name] = spec, profile
            [run], [(t0, t1, [(first, last)])] = runs, calls
            assert run.windows, f"{spec.name}: the profile measured no window"
            phases = []
            for i, w in enumerate(run.windows):
                warmup = 3 * spec.profile_warmup_steps if i == 0 else spec.profile_warmup_steps
                phases.append(_phase_gpu_s(w.window_s / w.steps, warmup, spec))
            rows.append({
                "workload": f"V100 {dataset}/{network} (simulated)", "limits_swept": len(run.windows),
                "startup_host_s": round((first - t0) + (t1 - last), 2),
                "to_first_report_host_s": round(first - t0, 2), "after_last_report_host_s": round(t1 - last, 2),
                "s_per_limit_gpu": round(float(np.mean(phases)), 3),
                "raw_windows_simulated_s": round(sum(w.window_s for w in run.windows), 3),
                "run_simulated_s": round(run.duration_s, 3), "run_host_s": round(t1 - t0, 2),
            })  # fmt: skip
        a, b = (specs[f"profile-{n}"] for _, n in PROFILED_WORKLOADS[:2])
        backend = LocalBackend(workdir / "pair")
        before, t0 = set(_run_dirs(tmp)), time.monotonic()
        calls = []
        shared = backend.execute_shared

        def timed_shared(*args, **k):
            run = shared(*args, **k)
            calls.append(run)
            return run

        backend.execute_shared = timed_shared
        pair = profile_pair(a, b, profiles[a.name], profiles[b.name], backend)
        t1 = time.monotonic()
        spans = _report_span(tmp, before)
        first, last = max(s[0] for s in spans), max(s[1] for s in spans)  # the later member's first report
        pair_gpu_s = max(m.duration_s for m in calls[0].members)
        pair_row = {
            "pair": f"{a.name}+{b.name}", "kept_speeds": [round(pair.speed_a, 3), round(pair.speed_b, 3)],
            "startup_host_s": round((first - t0) + (t1 - last), 2), "run_simulated_s": round(pair_gpu_s, 3),
            "run_host_s": round(t1 - t0, 2),
        }  # fmt: skip
    finally:
        if old_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmp
        tempfile.tempdir = None
    startup = float(np.mean([r["startup_host_s"] for r in rows]))
    return {
        "label": "measured: the product's profiler (profile_job, profile_pair; LocalBackend) on simulated V100s",
        "how": measure_profiling_seconds.__doc__.split("\n\n", 1)[1].strip(),
        "profile_settings": {k: getattr(a, k) for k in ("profile_steps", "profile_warmup_steps",
                                                        "profile_min_window_s")} | {"step_w": DEFAULT_STEP_W},
        "host_load_average_1m": round(os.getloadavg()[0], 1), "host_cpus": os.cpu_count(),
        "solo": rows, "pair": pair_row,
        "profile_startup_s": round(startup, 2),
        "profile_s_per_config": round(float(np.mean([r["s_per_limit_gpu"] for r in rows])), 3),
        "pair_profile_s": round(pair_row["startup_host_s"] + pair_row["run_simulated_s"], 2),
    }  # fmt: skip


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
    profiled_night: dict[str, int] = dataclasses.field(default_factory=dict)
    ratios: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Each job's realised/predicted energy per run since its profile was measured (what drift_reason reads)."""
    refreshes: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"first": 0, "drift": 0, "drift_false_alarm": 0, "age": 0}
    )
    drift_lags: list[int] = dataclasses.field(default_factory=list)
    """Nights from a drifting job's onset to the refresh its drift triggered."""


@dataclasses.dataclass(frozen=True)
class DriftModel:
    """Simulated drift: a job's realised / predicted energy per run, night by night.

    A drifting job (``share`` of the jobs, onset night drawn uniformly) costs ``step`` more energy per sample
    from its onset night (its data or model changed; the profile does not know), and ``per_night`` more each
    night after, so its runs' ratio against a profile measured on night ``p`` is level(n) / level(p). Every
    job's ratio also carries run-to-run noise (lognormal, ``noise``). Only the refresh trigger reads the
    ratios: the planner's and the realisation's energies are the simulation's own (unchanged by drift).
    """

    onset: dict[str, int]
    step: float
    per_night: float
    noise: float
    seed: int

    @classmethod
    def draw(cls, jobs: list[str], nights: int, share: float, step: float, per_night: float, noise: float, seed: int):
        rng = np.random.default_rng([seed, 23])
        drifting = rng.choice(len(jobs), size=round(share * len(jobs)), replace=False)
        onset = {jobs[i]: int(rng.integers(1, max(nights, 2))) for i in sorted(drifting)}
        return cls(onset, step, per_night, noise, seed)

    def level(self, job: str, night: int) -> float:
        onset = self.onset.get(job)
        if onset is None or night < onset:
            return 1.0
        return 1.0 + self.step + self.per_night * (night - onset)

    def ratio(self, job: str, index: int, night: int, profiled_night: int) -> float:
        rng = np.random.default_rng([self.seed, night, index])
        return self.level(job, night) / self.level(job, profiled_night) * float(np.exp(rng.normal(0, self.noise)))


def _pair_key(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def profile_solo(
    state: PolicyState, specs: dict[str, JobSpec], profiles, now: datetime, night: int, drift: DriftModel, args
) -> float:
    """Refresh solo profiles as the product does: ``profiles_to_refresh``, with each job's drift flag from the
    product's ``drift_reason`` on its runs' realised/predicted ratios; GPU-seconds spent."""
    last_training_s = state.training_gpu_s[-1] if state.training_gpu_s else 0.0
    states = [
        ProfileState(
            name, spec.profile_max_age_s, solo_profile_gpu_s(profiles[name], args), state.profiled_at.get(name),
            drifting=drift_reason(state.ratios.get(name, [])) is not None,
        )
        for name, spec in specs.items()
    ]  # fmt: skip
    refreshes = profiles_to_refresh(states, now, args.profile_budget_fraction * last_training_s)
    for r in refreshes:
        kind = "first" if r.job not in state.profiled_at else ("drift" if r.required else "age")
        if kind == "drift" and r.job not in drift.onset:
            kind = "drift_false_alarm"  # noise alone moved the ratio past the rule's threshold
        state.refreshes[kind] += 1
        if kind == "drift":
            state.drift_lags.append(night - drift.onset[r.job])
        state.profiled_at[r.job], state.profiled_night[r.job], state.ratios[r.job] = now, night, []
    return sum(r.cost_gpu_s for r in refreshes)


def record_drift(state: PolicyState, jobs: list[str], night: int, drift: DriftModel) -> None:
    """Each job's run tonight, as its realised/predicted energy against the profile it was planned from."""
    for i, job in enumerate(jobs):
        state.ratios[job].append(drift.ratio(job, i, night, state.profiled_night[job]))


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


PROFILING_FLAGS = ("profile_startup_s", "profile_s_per_config", "pair_profile_s")


def profiling_seconds(args: argparse.Namespace) -> dict | None:
    """Measure the profiling seconds (or reuse ``--profiling-measured``'s), unless every flag overrides them;
    fills the flags left None with the measured figures. Returns the measurement (None: all overridden)."""
    if all(getattr(args, k) is not None for k in PROFILING_FLAGS):
        return None
    if args.profiling_measured is not None:
        measured = json.loads(args.profiling_measured.read_text())
        measured = measured.get("profiling_seconds_measured", measured)
        assert all(k in measured for k in PROFILING_FLAGS), f"{args.profiling_measured} holds no measured seconds"
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="night-scale-profiling-") as d:
            measured = measure_profiling_seconds(Path(d))
    for k in PROFILING_FLAGS:
        if getattr(args, k) is None:
            setattr(args, k, measured[k])
    return measured


def run(args: argparse.Namespace) -> dict:
    measured = profiling_seconds(args)
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
    drift = DriftModel.draw([j.name for j in jobs], args.nights, args.drift_share, args.drift_step,
                            args.drift_per_night, args.drift_noise, args.seed)  # fmt: skip
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
            spent = profile_solo(state, specs, profiles, now, n, drift, args)
            spent += profile_pairs(state, all_pairs, profiles, args)
            state.profiling_gpu_s.append(spent)
            state.profiling_g += emissions_g_from(spent * args.profile_power_w, intensity_now)
            t0 = time.perf_counter()
            plans = plan_night(list(specs.values()), profiles, {REGION: forecast}, now,
                               list(state.known_pairs.values()), state.history, intensity_history=recent)  # fmt: skip
            margin = deadline_factors(plans, specs, profiles, state.history)
            plans = fit_plans_to_gpus(plans, args.gpus, now, forecast, margin)
            plan_s.append(time.perf_counter() - t0)
            state.training_gpu_s.append(run_on_gpus(night, plans, specs, profiles, state, args.gpus))
            record_drift(state, list(specs), n, drift)
    return summarise(states, plan_s, args, measured, drift)


def _spec(job: nc.JobType, finish_by: datetime) -> JobSpec:
    return JobSpec(
        name=job.name, workload="zeus-replay", epochs=job.budget_epochs, batch_size=job.b0,
        target_metric="zeus-target", region=REGION, finish_by=finish_by, objective="carbon",
        max_slowdown=nc.MAX_SLOWDOWN,
    )  # fmt: skip


def summarise(
    states: dict[str, PolicyState],
    plan_s: list[float],
    args: argparse.Namespace,
    measured: dict | None,
    drift: DriftModel,
) -> dict:
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
            "solo_refreshes": dict(s.refreshes),
            "drift_refresh_lag_nights_mean": round(float(np.mean(s.drift_lags)), 2) if s.drift_lags else None,
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
        "profiling_seconds_measured": measured,
        "profiling_seconds_used": {k: getattr(args, k) for k in PROFILING_FLAGS} | {
            "source": {k: "measured" if measured is not None and getattr(args, k) == measured[k] else "override"
                       for k in PROFILING_FLAGS}},
        "assumptions": {k: getattr(args, k) for k in ("profile_power_w", "pair_budget", "pair_budget_gpu_s",
                                                       "profile_budget_fraction")},
        "drift_model": {"label": "simulated", "rule": "carbonflow.profiling.refresh.drift_reason on each job's runs "
                        "since its profile (realised/predicted energy), into profiles_to_refresh's drifting flag",
                        "share": args.drift_share, "step": args.drift_step,
                        "per_night": args.drift_per_night, "noise": args.drift_noise,
                        "drifting_jobs": len(drift.onset)},
        **{k: budgeted[k] for k in ("profiling_gpu_s_first_night", "training_gpu_s_first_night",
                                    "profiling_over_training_nights_2_30", "deadline_misses")},
        "carbon_reduction_vs_exhaustive_pair_profiling": round(1 - ours_g / exhaustive_g, 4),
        "pair_prediction_mae_kept_speed": pair_mae,
        "night_plan_s": round(max(plan_s), 3),
        "night_plan_s_median": round(float(np.median(plan_s)), 3),
        "policies": {"budgeted": budgeted, "exhaustive": totals(exhaustive)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-job-h", type=float, default=1.5, help="a job's nightly work, at most, at the default limit")
    ap.add_argument("--profile-startup-s", type=float, default=None, help="override (default: measured)")
    ap.add_argument("--profile-s-per-config", type=float, default=None, help="override (default: measured)")
    ap.add_argument("--pair-profile-s", type=float, default=None, help="override (default: measured)")
    ap.add_argument(
        "--profiling-measured",
        type=Path,
        default=None,
        help="reuse a night_scale.json's profiling_seconds_measured instead of measuring again",
    )
    ap.add_argument("--drift-share", type=float, default=0.2, help="share of the jobs whose cost drifts")
    ap.add_argument("--drift-step", type=float, default=0.4, help="a drifting job's extra energy from its onset")
    ap.add_argument("--drift-per-night", type=float, default=0.01, help="and its extra energy each night after")
    ap.add_argument("--drift-noise", type=float, default=0.03, help="run-to-run noise of realised/predicted")
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
