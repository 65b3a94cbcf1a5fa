"""Does the simulated GPU reproduce the Zeus traces it replays?

For every GPU model × workload (dataset, network, batch size, optimizer) × measured power limit in
the shipped Zeus power traces, a ``SimulatedGpu`` is set to that limit and runs one emulated
epoch: the epoch lasts ``time_per_epoch(max limit) × slowdown_factor()`` on a controlled clock and
the energy is the device counter's increase over it. Both are compared with the trace row
(time_per_epoch, time_per_epoch × average_power). Target: ``max_relative_error`` < 0.01.

Also reported (not a target): leave-one-out interpolation error — each interior measured limit
predicted from its two neighbours only — i.e. how far the linear interpolation used between
measured limits can be from a real measurement.

Run: ``python benchmarks/simulated_gpu_fidelity.py [--quick]`` → ``benchmarks/results/simulated_gpu_fidelity.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.simulated import GPU_FILES, SimulatedGpu, ZeusPowerModel, load_trace, workloads

RESULTS = Path(__file__).resolve().parent / "results"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def run(quick: bool = False) -> dict:
    started = time.perf_counter()
    per_gpu: dict[str, dict] = {}
    worst = {"relative_error": -1.0}
    checks = 0
    loo_errors: list[float] = []
    for gpu_model in GPU_FILES:
        trace = {(r.dataset, r.network, r.batch_size, r.optimizer, r.power_limit_w): r for r in load_trace(gpu_model)}
        gpu_max = 0.0
        n_work = 0
        for dataset, network, bs, opt in workloads(gpu_model):
            if quick and bs not in (8, 32, 128, 1024):
                continue
            n_work += 1
            clock = _Clock()
            spec = SimulatedGpuSpec(gpu_model=gpu_model, dataset=dataset, network=network, batch_size=bs, optimizer=opt)
            gpu = SimulatedGpu(spec, clock=clock)
            model = gpu.power_model
            t_max = model.time_per_epoch_s(model.max_power_w)
            for limit in model.power_limits_w:
                row = trace[(dataset, network, bs, opt, limit)]
                gpu.set_power_limit_w(limit)
                epoch_s = t_max * gpu.slowdown_factor()
                e0 = gpu.energy_j()
                clock.t += epoch_s
                energy = gpu.energy_j() - e0
                err_t = _rel(epoch_s, row.time_per_epoch_s)
                err_e = _rel(energy, row.energy_per_epoch_j)
                checks += 1
                gpu_max = max(gpu_max, err_t, err_e)
                if max(err_t, err_e) > worst["relative_error"]:
                    worst = {
                        "relative_error": max(err_t, err_e),
                        "gpu": gpu_model,
                        "workload": model.workload_key,
                        "power_limit_w": limit,
                    }
            # leave-one-out: predict each interior limit from its neighbours
            xs, ps, ts = model.power_limits_w, model.average_powers_w, model.times_per_epoch_s
            for i in range(1, len(xs) - 1):
                sub = ZeusPowerModel(
                    gpu_model,
                    dataset,
                    network,
                    bs,
                    opt,
                    power_limits_w=[xs[i - 1], xs[i + 1]],
                    average_powers_w=[ps[i - 1], ps[i + 1]],
                    times_per_epoch_s=[ts[i - 1], ts[i + 1]],
                )
                loo_errors.append(_rel(sub.energy_per_epoch_j(xs[i]), ps[i] * ts[i]))
                loo_errors.append(_rel(sub.time_per_epoch_s(xs[i]), ts[i]))
        per_gpu[gpu_model] = {"workloads": n_work, "max_relative_error": gpu_max}
    loo_errors.sort()
    result = {
        "benchmark": "simulated_gpu_fidelity",
        "label": "simulated (replay of Zeus NSDI'23 measured traces)",
        "quick": quick,
        "checks": checks,
        "max_relative_error": worst["relative_error"],
        "target_max_relative_error": 0.01,
        "meets_target": worst["relative_error"] < 0.01,
        "worst_case": worst,
        "per_gpu": per_gpu,
        "leave_one_out_interpolation": {
            "points": len(loo_errors),
            "median_relative_error": loo_errors[len(loo_errors) // 2] if loo_errors else None,
            "p90_relative_error": loo_errors[int(0.9 * (len(loo_errors) - 1))] if loo_errors else None,
            "max_relative_error": loo_errors[-1] if loo_errors else None,
        },
        "runtime_s": time.perf_counter() - started,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only batch sizes 8, 32, 128, 1024")
    args = parser.parse_args()
    result = run(quick=args.quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "simulated_gpu_fidelity.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"{'GPU':<8} {'workloads':>9} {'max rel. error':>15}")
    for gpu, row in result["per_gpu"].items():
        print(f"{gpu:<8} {row['workloads']:>9} {row['max_relative_error']:>15.2e}")
    print(f"checks (GPU x workload x measured limit): {result['checks']}")
    print(
        f"max_relative_error: {result['max_relative_error']:.2e} (target < 0.01: "
        f"{'met' if result['meets_target'] else 'NOT met'})"
    )
    loo = result["leave_one_out_interpolation"]
    print(
        f"leave-one-out interpolation error (between measured limits): median {loo['median_relative_error']:.3f}, "
        f"p90 {loo['p90_relative_error']:.3f}, max {loo['max_relative_error']:.3f} over {loo['points']} points"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
