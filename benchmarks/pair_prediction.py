"""How well carbonflow predicts a pair's kept speeds without profiling it: leave-one-out on Gavel's V100 pairs.

Ground truth is Gavel's *measured* V100 co-location table (26 job types, every ordered pair; MIT,
shipped as carbonflow/simulation/data/gavel_pairs_v100.csv). Each job type's solo features are what
its solo profile would give carbonflow: step time from Gavel's measured solo throughput, and GPU load
(average power / limit) from the Zeus measurement of the workload the simulator maps it to
(``GAVEL_TO_ZEUS``; *simulated* power — Gavel measured speed, not power).

Three figures, each an MAE of kept speed over both jobs of every runnable pair:

* ``pair_prediction_mae_kept_speed`` — leave-one-pair-out: the pair is unknown, both jobs have
  history with others (the steady state of a platform where jobs recur);
* ``cold_job_mae_kept_speed`` — leave-one-job-type-out: every pair of a new job type is unknown and
  the new job has no history at all (its first night);
* ``baseline_mean_mae_kept_speed`` — predicting the mean kept speed of the training pairs (what a
  model that ignores both jobs would do), for scale.

Run: ``python benchmarks/pair_prediction.py`` → benchmarks/results/pair_prediction.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np

from carbonflow.energy.simulated import GAVEL_PAIRS_CSV
from carbonflow.planning.pairs import PairOutcome, SoloFeatures, fit_pair_predictor
from carbonflow.simulation import DeviceModel, load_pair_table

ROOT = Path(__file__).resolve().parent


def gavel_solo_features() -> dict[str, SoloFeatures]:
    """Solo features of every Gavel V100 job type (see the module docstring for where each comes from)."""
    pairs = load_pair_table()
    device = DeviceModel.for_pairs(pairs)
    limit_w = device.default_power_limit_w
    text = resources.files("carbonflow").joinpath(*GAVEL_PAIRS_CSV).read_text()
    steps_per_s = {r["job_a"]: float(r["solo_tput_a"]) for r in csv.DictReader(text.splitlines())}
    return {
        t: SoloFeatures(t, device.solo(i, limit_w)[0] / limit_w, 1.0 / steps_per_s[t])
        for i, t in enumerate(pairs.types)
    }


def gavel_outcomes() -> list[PairOutcome]:
    """One outcome per unordered pair of job types Gavel could run in both orders (self-pairs included)."""
    pairs = load_pair_table()
    n = len(pairs)
    return [
        PairOutcome(pairs.types[a], pairs.types[b], float(pairs.keep[a, b]), float(pairs.keep[b, a]))
        for a in range(n)
        for b in range(a, n)
        if pairs.runnable(a, b)
    ]


def _errors(predictor, solo: dict[str, SoloFeatures], held: PairOutcome) -> list[float]:
    p = predictor.predict(solo[held.job_a], solo[held.job_b])
    return [abs(p.kept_speed_a - held.kept_speed_a), abs(p.kept_speed_b - held.kept_speed_b)]


def leave_one_pair_out_mae(solo: dict[str, SoloFeatures], outcomes: list[PairOutcome]) -> float:
    errors: list[float] = []
    for i, held in enumerate(outcomes):
        predictor = fit_pair_predictor(solo, outcomes[:i] + outcomes[i + 1 :])
        errors += _errors(predictor, solo, held)
    return float(np.mean(errors))


def leave_one_job_out_mae(solo: dict[str, SoloFeatures], outcomes: list[PairOutcome]) -> float:
    errors: list[float] = []
    for job in solo:
        train = [o for o in outcomes if job not in (o.job_a, o.job_b)]
        predictor = fit_pair_predictor(solo, train)
        for held in (o for o in outcomes if job in (o.job_a, o.job_b)):
            errors += _errors(predictor, solo, held)
    return float(np.mean(errors))


def baseline_mean_mae(outcomes: list[PairOutcome]) -> float:
    errors: list[float] = []
    for i, held in enumerate(outcomes):
        rest = outcomes[:i] + outcomes[i + 1 :]
        mean = float(np.mean([k for o in rest for k in (o.kept_speed_a, o.kept_speed_b)]))
        errors += [abs(mean - held.kept_speed_a), abs(mean - held.kept_speed_b)]
    return float(np.mean(errors))


def run() -> dict:
    solo = gavel_solo_features()
    outcomes = gavel_outcomes()
    return {
        "source": "Gavel measured V100 pairs (MIT); GPU load from the Zeus-measured workload each type maps to "
        "(simulated power)",
        "job_types": len(solo),
        "pairs": len(outcomes),
        "pair_prediction_mae_kept_speed": round(leave_one_pair_out_mae(solo, outcomes), 4),
        "cold_job_mae_kept_speed": round(leave_one_job_out_mae(solo, outcomes), 4),
        "baseline_mean_mae_kept_speed": round(baseline_mean_mae(outcomes), 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "pair_prediction.json")
    args = ap.parse_args(argv)
    result = run()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
