"""How long carbonflow's planner takes to decide: one job, and a night of 100 recurring jobs.

* ``one_job_ms``: :func:`carbonflow.planning.plan_job` for a job with 20 profiled configurations (5 power
  limits × 1–4 containers, speeds and powers from Zeus's V100 trace for cifar100/shufflenetv2) and a
  48 h half-hourly forecast (96 slots of the real GB 2020 trace, ``lets-wait-awhile/gb_ci.csv``); median
  of repeated runs. Target < 50 ms.
* ``night_100_jobs_s``: :func:`carbonflow.planning.plan_night` for 100 recurring jobs (the 6 Zeus workloads
  on simulated V100s, each with its own 7 power limits) with pair profiles for 200 job pairs, so that
  co-location is considered. Target < 2 s.

The planner does no I/O, so this is pure decision time on this machine (2 cores shared with others).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from carbonflow.domain import Config, Forecast, ForecastPoint, JobSpec, Profile, ProfilePoint
from carbonflow.energy.simulated import ZeusPowerModel, workload_defaults
from carbonflow.planning import PairProfile, plan_job, plan_night

DATA = Path("/work/shared/data")
RESULTS = Path(__file__).resolve().parent / "results"
NOW = datetime(2020, 3, 2, 18, 0, tzinfo=UTC)


def gb_forecast(start: datetime, hours: int = 48) -> Forecast:
    """96 half-hourly points of the real GB 2020 series (replayed as a perfect forecast)."""
    values: dict[datetime, float] = {}
    with open(DATA / "carbon/lets-wait-awhile/gb_ci.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            t = datetime.fromisoformat(row["Time"]).replace(tzinfo=UTC)
            if start <= t < start + timedelta(hours=hours):
                values[t] = float(row["Carbon Intensity"])
    points = [
        ForecastPoint(
            start=start + timedelta(minutes=30 * i),
            length_s=1800,
            gco2_per_kwh=values[start + timedelta(minutes=30 * i)],
        )
        for i in range(hours * 2)
    ]
    return Forecast(
        region="GB",
        provider="replay:lets-wait-awhile",
        signal_kind="average-lifecycle",
        issued_at=start,
        points=points,
        replay=True,
    )


def zeus_profile(job: str, dataset: str, network: str, containers: tuple[int, ...] = (1,), limits: int = 99) -> Profile:
    """A simulated profile from Zeus's V100 trace: samples/s relative (1 epoch = 1e5 samples)."""
    model = ZeusPowerModel.load("V100", dataset, network)
    samples_per_epoch = 100_000
    pls = model.power_limits_w[-limits:]
    points = []
    for c in containers:
        for pl in pls:
            tput = samples_per_epoch / model.time_per_epoch_s(pl) * c * 0.9 ** (c - 1)  # 90 % scaling per doubling
            power = model.average_power_w(pl)
            points.append(
                ProfilePoint(
                    config=Config(containers=c, power_limit_w=pl),
                    throughput_samples_per_s=tput,
                    power_per_device_w={f"sim{i}": power for i in range(c)},
                    energy_per_sample_j=power * c / tput,
                    duration_s=30,
                    samples=int(tput * 30),
                    label="simulated",
                )
            )
    return Profile(
        job=job,
        device_model="V100 (simulated)",
        device_kind="gpu",
        label="simulated",
        default_power_limit_w=model.max_power_w,
        max_power_w=model.max_power_w,
        samples_per_epoch=samples_per_epoch,
        points=points,
        measured_at=NOW,
    )


def one_job(forecast: Forecast, repeats: int) -> dict[str, float]:
    profile = zeus_profile("one", "cifar100", "shufflenetv2", containers=(1, 2, 3, 4), limits=5)
    assert len(profile.points) == 20
    spec = JobSpec(
        name="one",
        workload="w",
        epochs=1000,
        region="GB",
        finish_by=NOW + timedelta(hours=36),
        max_containers=4,
        max_slowdown=0.2,
    )
    plan_job(spec, profile, forecast, NOW)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_job(spec, profile, forecast, NOW)
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "one_job_ms": statistics.median(times),
        "one_job_ms_p95": float(np.percentile(times, 95)),
        "configurations": len(profile.points),
        "forecast_slots": len(forecast.points),
        "alternatives": len(plan.alternatives),
        "reason": plan.reason,
    }


def night(forecast: Forecast, repeats: int) -> dict[str, float]:
    workloads = list(workload_defaults())
    specs, profiles = [], {}
    base = {}
    for i, (dataset, network) in enumerate(workloads):
        base[i] = zeus_profile("x", dataset, network)
    for j in range(100):
        name = f"job-{j:03d}"
        w = j % len(workloads)
        profile = base[w].model_copy(update={"job": name})
        profiles[name] = profile
        specs.append(
            JobSpec(
                name=name,
                workload="w",
                epochs=100 + 50 * (j % 5),
                region="GB",
                finish_by=NOW + timedelta(hours=12),
                max_slowdown=0.1 + 0.3 * (j % 3),
            )
        )
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(200):
        a, b = rng.choice(100, size=2, replace=False)
        sa, sb = rng.uniform(0.55, 1.0, size=2)
        pairs.append(
            PairProfile(
                specs[a].name,
                specs[b].name,
                float(sa),
                float(sb),
                power_w=float(rng.uniform(200, 260)),
                label="simulated",
            )
        )
    times = []
    plans = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = plan_night(specs, profiles, {"GB": forecast}, NOW, pair_profiles=pairs)
        times.append(time.perf_counter() - t0)
    colocated = sum(1 for p in plans if p.colocated_with)
    return {
        "night_100_jobs_s": statistics.median(times),
        "jobs": len(specs),
        "pair_profiles": len(pairs),
        "jobs_colocated": colocated,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    forecast = gb_forecast(NOW)
    result = {"benchmark": "plan_latency", "label": "decision time only (profiles simulated from Zeus's V100 trace)"}
    result.update(one_job(forecast, 20 if args.quick else 200))
    result.update(night(forecast, 1 if args.quick else 3))
    result["targets"] = {
        "one_job_ms_lt_50": result["one_job_ms"] < 50,
        "night_100_jobs_s_lt_2": result["night_100_jobs_s"] < 2,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "plan_latency.json").write_text(json.dumps(result, indent=1))
    print(f"{'metric':24s} {'value':>10s}  target")
    print(f"{'one_job_ms':24s} {result['one_job_ms']:10.2f}  < 50")
    print(f"{'night_100_jobs_s':24s} {result['night_100_jobs_s']:10.3f}  < 2")
    print(f"co-located jobs: {result['jobs_colocated']} of 100; example reason: {result['reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
