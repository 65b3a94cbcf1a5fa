"""How the cluster simulator scales: 10k, 100k and 1M synthetic jobs under the FIFO baseline, one core.

Jobs are **synthetic**, drawn from the Philly slice's distributions (inter-arrival gaps resampled;
run time, GPU count and virtual cluster resampled jointly per job). The cluster size keeps the
offered load of the real slice: GPUs = ceil(mean GPU demand / ``--load``) (default load 0.8).
Timed: trace synthesis, family derivation, job-type draw and the event-driven simulation, end to end.
``--policy carbonflow-no-shift`` times the planner-backed policy instead. Wall seconds and CPU seconds
of this process are both reported (the machine may be shared).

Run: ``python benchmarks/cluster_scale.py [--sizes 10000 100000 1000000]``.
Writes benchmarks/results/cluster_scale.json with ``seconds_1m_jobs``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import sys
import time
from pathlib import Path

from carbonflow.simulation import (
    ClusterSpec,
    DeviceModel,
    Experiment,
    FifoPolicy,
    PlannerPolicy,
    constant_grid,
    grid_from_trace_file,
    load_pair_table,
    load_philly_csv,
    simulate,
    synthetic_trace,
)

ROOT = Path(__file__).resolve().parent
DATA = Path("/work/shared/data")
DEFAULT_TRACE = DATA / "traces/philly_pollux/philly_jobs_until_2017-11-30.csv"
DEFAULT_CARBON = DATA / "carbon/lets-wait-awhile/ger_ci.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--carbon", type=Path, default=DEFAULT_CARBON)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--load", type=float, default=0.8, help="offered load the cluster is sized for")
    ap.add_argument("--policy", choices=["fifo", "carbonflow-no-shift"], default="fifo")
    ap.add_argument("--profile", action="store_true", help="print the top functions of the largest run (cProfile)")
    ap.add_argument("--quick", action="store_true", help="10k and 100k jobs only")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cluster_scale.json")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes if s <= 100_000] if args.quick else args.sizes

    base = load_philly_csv(args.trace)
    pairs = load_pair_table()
    devices = DeviceModel.for_pairs(pairs)
    grid = grid_from_trace_file(args.carbon, origin=base.origin) if args.carbon.exists() else constant_grid(300.0)
    demand = base.gpu_seconds / float(base.submit_s[-1])
    gpus = max(math.ceil(demand / args.load), int(base.num_gpus.max()))
    print(f"base trace: {len(base)} Philly jobs; mean GPU demand {demand:.0f} -> {gpus} GPUs (load {args.load})")
    print(
        f"{'jobs':>10s} {'seconds':>9s} {'CPU s':>7s} {'of which sim':>12s} {'us/job':>8s} {'energy MWh':>11s} "
        f"{'mean JCT h':>11s}"
    )
    rows = []
    profile_text = ""
    for n in sizes:
        t0 = time.perf_counter()
        c0 = time.process_time()
        trace = synthetic_trace(base, n, seed=1)
        exp = Experiment.build(trace, pairs, devices, grid, ClusterSpec(gpus=gpus))
        ctx = exp.context()
        policy = FifoPolicy() if args.policy == "fifo" else PlannerPolicy(args.policy, power_limit=True, colocate=True)
        prof = cProfile.Profile() if args.profile and n == max(sizes) else None
        t1 = time.perf_counter()
        if prof:
            prof.enable()
        result = simulate(ctx, policy)
        if prof:
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
            profile_text = buf.getvalue()
        t2 = time.perf_counter()
        c2 = time.process_time()
        s = result.summary()
        row = {
            "jobs": n,
            "seconds": t2 - t0,
            "simulate_seconds": t2 - t1,
            "setup_seconds": t1 - t0,
            "cpu_seconds": (c2 - c0),
            "us_per_job": (t2 - t0) / n * 1e6,
            "energy_kwh": s["energy_kwh"],
            "mean_jct_s": s["mean_jct_s"],
            "label": s["label"],
        }
        rows.append(row)
        print(
            f"{n:10d} {row['seconds']:9.2f} {row['cpu_seconds']:7.2f} {row['simulate_seconds']:12.2f} "
            f"{row['us_per_job']:8.1f} "
            f"{s['energy_kwh'] / 1e3:11.1f} {s['mean_jct_s'] / 3600:11.2f}",
            flush=True,
        )
    if profile_text:
        print(profile_text)
    by_n = {r["jobs"]: r for r in rows}
    out = {
        "benchmark": "cluster_scale",
        "label": "simulated; synthetic jobs drawn from the Philly slice's distributions; one process, one core",
        "policy": args.policy,
        "gpus": gpus,
        "load": args.load,
        "rows": rows,
        "seconds_1m_jobs": by_n[1_000_000]["seconds"] if 1_000_000 in by_n else None,
        "cpu_seconds_1m_jobs": by_n[1_000_000]["cpu_seconds"] if 1_000_000 in by_n else None,
        "target_seconds_1m_jobs": 60.0,
        "linear_fit_us_per_job": rows[-1]["us_per_job"] if rows else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    if out["seconds_1m_jobs"] is not None:
        print(f"1M jobs in {out['seconds_1m_jobs']:.1f} s wall, {out['cpu_seconds_1m_jobs']:.1f} s CPU (target < 60 s)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
