"""carbonflow's optimiser vs Zeus's own trace-driven simulator, side by side on Zeus's traces.

Runs, in one process and with the same seeds, for the 6 Zeus workloads × V100/A40/RTX6000/P100
(``/work/shared/data/zeus`` or ``--data``):

* ``default``     — the job's b0 at the maximum power limit, every recurrence (no early stop);
* ``zeus_pl``     — Zeus (``zeus==0.16.0``, ``zeus._legacy.simulate.Simulator``) with its JIT power-limit
                    optimiser and the batch size fixed at b0;
* ``zeus``        — full Zeus: ``PruningGTSBatchSizeOptimizer`` + ``JITPowerLimitOptimizer``, β = 2;
* ``carbonflow_pl`` — carbonflow's power-limit choice (``carbonflow.planning.choose_power_limit``,
                    objective ``zeus:0.5``) with the batch size fixed at b0;
* ``carbonflow``  — carbonflow with batch size: ``carbonflow.planning.learning.BatchSizeExplorer``
                    (profile-ordered Thompson sampling with optimistic pruning and early stop) + the same
                    power-limit choice;
* ``best_fixed``  — the fixed (batch size, power limit) with the lowest expected cost, known in hindsight.

Both simulators follow the same rules (Zeus's ``Simulator`` semantics, re-implemented for carbonflow's
policies): each run samples one training path (a ``run`` row of ``summary_train.csv``) for its batch size
with ``DataFrame.sample(random_state=rng)`` from ``numpy.random.default_rng(seed)``; a run that fails to
reach the target (or is early-stopped) is paid for and retried within the recurrence. Cost is Zeus's
``η·ETA + (1−η)·MAXPOWER·TTA`` with η = 0.5, MAXPOWER = the GPU's highest power limit.

What carbonflow pays for its knowledge (nothing is free):
* power-limit profiling: JIT in the first epoch of a new batch size as Zeus does, charged by the same rule
  as Zeus's simulator charges its own (1/|P| of the first epoch per limit; ``--profiling own`` charges
  carbonflow's real profiler window instead, 35 steps, at most 1/|P| of an epoch, written to
  ``vs_zeus_own_profiling.json`` for comparison) at every limit (pruning after
  two worse limits was tried and dropped: the traces' cost curves have plateaus that hide the optimum); the
  profiled steps count as training, the rest of that epoch runs at the chosen limit;
* with batch size: the default batch size is profiled JIT in its first run (as above); any other batch
  size lazily, once the explorer would weigh it (a neighbour of a batch size known to converge), the same
  windows, charged as pure overhead (its work is discarded) and against the explorer's budget, and only while
  that budget covers one (priced as the default's profile cost: where the default is already the best
  configuration nothing has been saved to pay for profiling); the default's cost per epoch (b0 at the highest
  limit, measured by that profile) sets the budget. What the explorer learns from a run is the run at its
  chosen limit — carbonflow measures runs apart from their profile — while the profiling slices of a JIT first
  run are charged to the budget (the cumulative cost counts everything either way). Window sizes
  in epochs need each dataset's training-set size, which Zeus's traces do not hold: SAMPLES_PER_EPOCH gives
  the public figures.

Steady state = the expected cost per recurrence (expectation over the trace's seeds, counting retries of
failing paths) of the configurations a policy used in the last 25 % of recurrences — decision quality,
free of path-sampling noise. Cumulative = the realised total over all recurrences (2·|B|·|P| as in the
paper's ``run_single.py``), mean over seeds. ``held_out`` reruns carbonflow and the default alone on 20
further seeds (4–23; ``--held-out``) and counts, pair by pair, the seeds where a target fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from carbonflow.planning import choose_power_limit
from carbonflow.planning.batch_size import BatchSizeExplorer
from carbonflow.planning.costs import zeus_cost

DATA = Path("/work/shared/data/zeus")
RESULTS = Path(__file__).resolve().parent / "results"
GPUS = ["v100", "a40", "rtx6000", "p100"]
ETA = 0.5
BETA = 2.0
# Paper defaults as in Zeus's run_alibaba.py (see /work/shared/data/zeus/README.md).
PROFILE_STEPS = 35
"""carbonflow's profiler window per configuration: JobSpec.profile_warmup_steps (5) + profile_steps (30)."""
SAMPLES_PER_EPOCH = {
    # Training-set sizes from the datasets' own documentation (not in Zeus's traces). They only size the
    # profiling windows below (35 steps × batch size / samples per epoch, at most 1/|P| of an epoch).
    "cifar100": 50_000,  # CIFAR-100 train split
    "imagenet": 1_281_167,  # ILSVRC-2012 train split
    "squad": 87_599,  # SQuAD v1.1 train questions
    "librispeech": 281_241,  # LibriSpeech 960 h train utterances
    "movielens-1m": 1_000_209,  # MovieLens-1M ratings
    "sentiment140": 1_600_000,  # Sentiment140 training tweets
}
WORKLOADS = [
    ("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024),
    ("imagenet", "resnet50", "adadelta", 0.65, 100, 256),
    ("squad", "bert_base_uncased", "adamw", 84.0, 6, 32),
    ("librispeech", "deepspeech2", "adamw", 40.0, 16, 256),
    ("movielens-1m", "ncf", "adam", 0.41, 100, 1024),
    ("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128),
]


@dataclass
class Outcome:
    cost: float = 0.0
    energy_j: float = 0.0
    time_s: float = 0.0
    configs: list[tuple[int, int]] = field(default_factory=list)  # (bs, pl) of each recurrence's final run
    profiling_cost: float = 0.0
    """Of ``cost``: separate profiling passes whose work is discarded (carbonflow's lazily profiled batch sizes)."""


class Workload:
    """One workload on one GPU: the merged trace and per-(bs, pl) expectations."""

    def __init__(self, train: pd.DataFrame, power: pd.DataFrame, spec: tuple) -> None:
        self.dataset, self.network, self.optimizer, self.target, self.max_epochs, b0 = spec
        df = train.merge(power, how="inner")
        df["TTA"] = df.target_epoch * df.time_per_epoch
        df["ETA"] = df.TTA * df.average_power
        df["energy_per_epoch"] = df.time_per_epoch * df.average_power
        self.max_power = float(df.power_limit.max())
        self.df = df.loc[
            (df.dataset == self.dataset)
            & (df.network == self.network)
            & (df.optimizer == self.optimizer)
            & (df.target_metric == self.target)
        ]
        every = df.loc[(df.dataset == self.dataset) & (df.network == self.network) & (df.optimizer == self.optimizer)]
        self.batch_sizes = sorted(int(b) for b in every.batch_size.unique())
        self.b0 = b0 if b0 in self.batch_sizes else max([b for b in self.batch_sizes if b <= b0] or self.batch_sizes)
        self.power_limits = sorted(int(p) for p in self.df.power_limit.unique())
        self._paths = {(int(b), int(p)): g for (b, p), g in self.df.groupby(["batch_size", "power_limit"])}
        self._bs_rows = {int(b): g for b, g in self.df.groupby("batch_size")}

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.network}"

    def zeus_job(self):
        from zeus._legacy.job import Job

        return Job(self.dataset, self.network, self.optimizer, self.target, self.max_epochs, self.b0)

    def epoch(self, bs: int, pl: int) -> tuple[float, float]:
        rows = self._paths[(bs, pl)]
        return float(rows.time_per_epoch.iloc[0]), float(rows.average_power.iloc[0])

    def epoch_cost(self, bs: int, pl: int) -> float:
        t, p = self.epoch(bs, pl)
        return zeus_cost(t * p, t, ETA, self.max_power)

    def pls_for(self, bs: int) -> list[int]:
        return sorted(p for (b, p) in self._paths if b == bs)

    def expected(self, bs: int, pl: int) -> tuple[float, float, float]:
        """Expected (cost, energy, time) per recurrence at a fixed config; failing paths retried (geometric)."""
        rows = self._paths.get((bs, pl))
        if rows is None or rows.empty:
            return math.inf, math.inf, math.inf
        t, p = self.epoch(bs, pl)
        epochs = rows.target_epoch.to_numpy(dtype=float)
        ok = ~np.isnan(epochs)
        p_fail = 1 - ok.mean()
        if p_fail >= 1:
            return math.inf, math.inf, math.inf
        mean_ok = epochs[ok].mean()
        n_epochs = (mean_ok * (1 - p_fail) + self.max_epochs * p_fail) / (1 - p_fail)
        return zeus_cost(n_epochs * t * p, n_epochs * t, ETA, self.max_power), n_epochs * t * p, n_epochs * t

    def best_fixed(self) -> tuple[tuple[int, int], tuple[float, float, float]]:
        options = [((b, p), self.expected(b, p)) for (b, p) in self._paths]
        return min(options, key=lambda o: (o[1][0], o[0]))

    def sample(self, bs: int, pl: int, rng: np.random.Generator) -> float:
        """Epochs to target of one sampled path (NaN: never reached), sampled as Zeus's simulator does."""
        path = self._paths[(bs, pl)].sample(n=1, random_state=rng)
        return float(path.target_epoch.iloc[0])


# ---------------------------------------------------------------------------------------------------------
# carbonflow's side


PROFILING_RULE = "zeus"
"""How carbonflow's profiling is charged: ``zeus`` (default, the figure that counts) — as Zeus's simulator
charges its own, 1/|P| of the first epoch per power limit (the whole first epoch spent profiling);
``own`` — carbonflow's real profiler window (35 steps per limit, at most 1/|P| of an epoch)."""


def profile_slice_epochs(w: Workload, bs: int) -> float:
    """Epochs spent at each power limit while profiling, by ``PROFILING_RULE``."""
    zeus_slice = 1 / len(w.power_limits)
    if PROFILING_RULE == "zeus":
        return zeus_slice
    return min(PROFILE_STEPS * bs / SAMPLES_PER_EPOCH[w.dataset], zeus_slice)


def profile_power(w: Workload, bs: int) -> tuple[int, float, float, float]:
    """Profiling every limit, highest first; returns (chosen pl, slices' energy, time, epochs).

    Each limit gets a window of PROFILE_STEPS steps, at most 1/|P| of an epoch (Zeus's JIT slice).
    """
    pls = w.pls_for(bs)
    slice_epochs = profile_slice_epochs(w, bs)
    seen_pl, seen_t, seen_p = [], [], []
    for pl in sorted(pls, reverse=True):
        t, p = w.epoch(bs, pl)
        seen_pl.append(pl)
        seen_t.append(t)
        seen_p.append(p)
    chosen = int(
        choose_power_limit(seen_pl, seen_t, seen_p, objective=f"zeus:{ETA}", max_slowdown=None, max_power_w=w.max_power)
    )
    energy = sum(t * p for t, p in zip(seen_t, seen_p, strict=True)) * slice_epochs
    time_s = sum(seen_t) * slice_epochs
    return chosen, energy, time_s, len(seen_pl) * slice_epochs


def run_config(
    w: Workload, bs: int, pl: int, rng: np.random.Generator, cost_ub: float, jit: tuple | None
) -> tuple[float, float, bool, float]:
    """One run: (energy, time, reached, epochs run); early-stopped at cost_ub as Zeus's simulator does."""
    epochs_needed = w.sample(bs, pl, rng)
    t, p = w.epoch(bs, pl)
    c_epoch = zeus_cost(t * p, t, ETA, w.max_power)
    max_epochs = w.max_epochs if cost_ub == math.inf else min(cost_ub // c_epoch, w.max_epochs)
    if max_epochs == 0:
        return 0.0, 0.0, False, 0.0
    reached = not math.isnan(epochs_needed) and epochs_needed <= max_epochs
    n = epochs_needed if reached else max_epochs
    energy, time_s = n * t * p, n * t
    if jit is not None:  # first epoch partly spent in profiling slices; their work counts as training
        _, e_slices, t_slices, frac = jit
        energy += e_slices - frac * t * p
        time_s += t_slices - frac * t
    return energy, time_s, reached, n


def split_jit_cost(w: Workload, bs: int, pl: int, epochs: float, cost: float) -> tuple[float, float]:
    """(the run's cost at its chosen limit, the rest): what carbonflow's explorer learns from a run and what it
    charges to its budget. carbonflow measures a run apart from its profile (the profiler is a separate pass),
    so a batch size's cost to target must not carry the profiling slices of its first run — at low limits they
    cost several times an epoch at the chosen one. The total charged (``cost``) is unchanged."""
    t, p = w.epoch(bs, pl)
    run_cost = zeus_cost(epochs * t * p, epochs * t, ETA, w.max_power)
    return run_cost, cost - run_cost


def simulate_carbonflow(w: Workload, n_rec: int, seed: int, with_bs: bool) -> Outcome:
    rng = np.random.default_rng(seed)
    rng_bso = np.random.default_rng([seed, 1])
    out = Outcome()
    chosen_pl: dict[int, int] = {}
    pending_jit: dict[int, tuple] = {}
    if with_bs:
        # The default batch size is profiled JIT in its first run (as carbonflow_pl does); the profile's
        # highest limit there is the default configuration: its cost per epoch bounds the exploration budget.
        jit0 = profile_power(w, w.b0)
        jit0_cost = zeus_cost(jit0[1], jit0[2], ETA, w.max_power)
        chosen_pl[w.b0] = jit0[0]
        pending_jit[w.b0] = jit0
        prior = {w.b0: w.epoch_cost(w.b0, jit0[0])}
        sizes = [b for b in w.batch_sizes if w.pls_for(b)]
        default_per_epoch = w.epoch_cost(w.b0, max(w.pls_for(w.b0)))
        explorer = BatchSizeExplorer(
            sizes, w.b0, prior, beta=BETA, horizon=n_rec, default_cost_per_epoch=default_per_epoch
        )
    for _ in range(n_rec):
        for attempt in range(20):
            if not with_bs:
                bs = w.b0
            elif attempt == 0:
                # lazily: only what the explorer would weigh next, and only while its budget covers a profile
                # (priced as profiling the default batch size cost)
                for b in explorer.unprofiled(profile_cost=jit0_cost):
                    pl_b, e, t, _ = profile_power(w, b)  # its work is discarded: pure overhead
                    overhead = zeus_cost(e, t, ETA, w.max_power)
                    out.cost += overhead
                    out.profiling_cost += overhead
                    out.energy_j += e
                    out.time_s += t
                    explorer.charge(overhead)
                    chosen_pl[b] = pl_b
                    explorer.add_profile(b, w.epoch_cost(b, pl_b))
                bs = explorer.choose(rng_bso)
            else:  # a retry exploits the best known batch size
                bs = explorer.best_mean()[0]
            jit = pending_jit.pop(bs, None)
            if bs not in chosen_pl:
                jit = profile_power(w, bs)
                chosen_pl[bs] = jit[0]
            pl = chosen_pl[bs]
            cost_ub = explorer.stop_threshold(bs) if with_bs else math.inf
            energy, time_s, reached, epochs = run_config(w, bs, pl, rng, cost_ub, jit)
            cost = zeus_cost(energy, time_s, ETA, w.max_power)
            if with_bs:
                run_cost, profiling_extra = split_jit_cost(w, bs, pl, epochs, cost)
                explorer.observe(bs, run_cost, reached, epochs if reached else None)
                explorer.charge(profiling_extra)
            if energy == 0 and time_s == 0 and not reached:
                continue
            out.cost += cost
            out.energy_j += energy
            out.time_s += time_s
            if reached:
                out.configs.append((bs, pl))
                break
        else:
            raise RuntimeError(f"{w.name}: carbonflow did not reach the target in 20 tries")
    return out


def simulate_default(w: Workload, n_rec: int, seed: int) -> Outcome:
    rng = np.random.default_rng(seed)
    out = Outcome()
    pl = max(w.pls_for(w.b0))
    for _ in range(n_rec):
        for _attempt in range(20):
            energy, time_s, reached, _ = run_config(w, w.b0, pl, rng, math.inf, None)
            out.cost += zeus_cost(energy, time_s, ETA, w.max_power)
            out.energy_j += energy
            out.time_s += time_s
            if reached:
                out.configs.append((w.b0, pl))
                break
    return out


# ---------------------------------------------------------------------------------------------------------
# Zeus's side (its own simulator and policies)


def simulate_zeus(w: Workload, train: pd.DataFrame, power: pd.DataFrame, n_rec: int, seed: int, full: bool) -> Outcome:
    from zeus._legacy.policy import BatchSizeOptimizer
    from zeus._legacy.policy.optimizer import JITPowerLimitOptimizer, PruningGTSBatchSizeOptimizer
    from zeus._legacy.simulate import Simulator

    class DefaultBatchSize(BatchSizeOptimizer):
        """Power-limit-only Zeus: the batch size stays at b0."""

        @property
        def name(self) -> str:
            return "default BS"

        def register_job(self, job, batch_sizes):
            self.b0 = job.default_bs

        def predict(self, job):
            return self.b0

        def observe(self, job, batch_size, cost, converged=None):
            return None

    bso = PruningGTSBatchSizeOptimizer(seed=seed, verbose=False) if full else DefaultBatchSize()
    sim = Simulator(train, power, bso, JITPowerLimitOptimizer(verbose=False), seed=seed, verbose=False)
    with contextlib.redirect_stdout(io.StringIO()):  # _run_job prints early-stop notices unconditionally
        history = sim.simulate_one_job(w.zeus_job(), n_rec, BETA, ETA)
    out = Outcome()
    for h in history:
        out.cost += zeus_cost(h.energy, h.time, ETA, w.max_power)
        out.energy_j += h.energy
        out.time_s += h.time
        if h.reached:
            out.configs.append((int(h.bs), int(h.pl)))
    return out


# ---------------------------------------------------------------------------------------------------------


def steady(w: Workload, outcomes: list[Outcome]) -> dict[str, float]:
    vals = []
    for o in outcomes:
        tail = o.configs[-max(1, len(o.configs) // 4) :]
        vals.extend(w.expected(b, p) for b, p in tail)
    arr = np.array(vals)
    return {"cost": float(arr[:, 0].mean()), "energy_j": float(arr[:, 1].mean()), "time_s": float(arr[:, 2].mean())}


def summarise(w: Workload, outcomes: list[Outcome]) -> dict[str, object]:
    return {
        "cumulative_cost": float(np.mean([o.cost for o in outcomes])),
        "cumulative_profiling_pass_cost": float(np.mean([o.profiling_cost for o in outcomes])),
        "cumulative_energy_j": float(np.mean([o.energy_j for o in outcomes])),
        "cumulative_time_s": float(np.mean([o.time_s for o in outcomes])),
        "steady": steady(w, outcomes),
        "final_configs": [list(o.configs[-1]) for o in outcomes],
    }


def recurrences(w: Workload, rec_scale: float = 1.0) -> int:
    """2·|B|·|P| recurrences, as the paper's ``run_single.py``."""
    return max(4, round(2 * len(w.batch_sizes) * len(w.power_limits) * rec_scale))


def held_out(gpus: list[str], train: pd.DataFrame, seeds: list[int]) -> dict[str, object]:
    """carbonflow against the default and the hindsight best on seeds the policy was not tuned on.

    Zeus is not rerun here (its simulator is the slow part); this measures how often carbonflow's own targets
    (steady state within 1 % of the best fixed configuration, never above the default's cumulative cost) hold
    seed by seed rather than on the mean of three.
    """
    rows = []
    for gpu in gpus:
        power = pd.read_csv(DATA / f"summary_power_{gpu}.csv")
        for spec in WORKLOADS:
            w = Workload(train, power, spec)
            n_rec = recurrences(w)
            _, (best_cost, _, _) = w.best_fixed()
            steady_ratio, over_default = [], []
            for seed in seeds:
                cf = simulate_carbonflow(w, n_rec, seed, with_bs=True)
                steady_ratio.append(steady(w, [cf])["cost"] / best_cost)
                over_default.append(cf.cost / simulate_default(w, n_rec, seed).cost)
            rows.append(
                {
                    "workload": w.name,
                    "gpu": gpu.upper(),
                    "steady_over_best_mean": float(np.mean(steady_ratio)),
                    "steady_over_best_max": float(np.max(steady_ratio)),
                    "share_steady_above_1.01": float(np.mean(np.array(steady_ratio) > 1.01)),
                    "cumulative_over_default_mean": float(np.mean(over_default)),
                    "cumulative_over_default_max": float(np.max(over_default)),
                    "share_above_default": float(np.mean(np.array(over_default) > 1.0)),
                }
            )
    return {
        "seeds": seeds,
        "share_steady_above_1.01": float(np.mean([r["share_steady_above_1.01"] for r in rows])),
        "share_above_default": float(np.mean([r["share_above_default"] for r in rows])),
        "mean_steady_over_best": float(np.mean([r["steady_over_best_mean"] for r in rows])),
        "mean_cumulative_over_default": float(np.mean([r["cumulative_over_default_mean"] for r in rows])),
        "rows": rows,
    }


def run_pair(gpu: str, spec: tuple, train: pd.DataFrame, seeds: list[int], rec_scale: float) -> dict[str, object]:
    power = pd.read_csv(DATA / f"summary_power_{gpu}.csv")
    w = Workload(train, power, spec)
    n_rec = recurrences(w, rec_scale)
    policies: dict[str, list[Outcome]] = {k: [] for k in ("default", "zeus_pl", "zeus", "carbonflow_pl", "carbonflow")}
    errors: list[str] = []  # kept in the JSON for its shape: a failing seed now raises instead
    for seed in seeds:
        policies["default"].append(simulate_default(w, n_rec, seed))
        for key, full in (("zeus_pl", False), ("zeus", True)):
            policies[key].append(simulate_zeus(w, train, power, n_rec, seed, full))  # a failed seed fails the run
        policies["carbonflow_pl"].append(simulate_carbonflow(w, n_rec, seed, with_bs=False))
        policies["carbonflow"].append(simulate_carbonflow(w, n_rec, seed, with_bs=True))
    (bb, bp), (bc, be, bt) = w.best_fixed()
    row: dict[str, object] = {
        "workload": w.name,
        "gpu": gpu.upper(),
        "b0": w.b0,
        "recurrences": n_rec,
        "seeds": seeds,
        "batch_sizes": w.batch_sizes,
        "power_limits_w": w.power_limits,
        "best_fixed": {
            "config": [bb, bp],
            "cumulative_cost": bc * n_rec,
            "cumulative_energy_j": be * n_rec,
            "cumulative_time_s": bt * n_rec,
            "steady": {"cost": bc, "energy_j": be, "time_s": bt},
        },
        "errors": errors,
    }
    for key, outs in policies.items():
        row[key] = summarise(w, outs) if outs else None

    def cum(key: str) -> float:
        entry = row[key]
        return float(entry["cumulative_cost"]) if entry else math.nan  # type: ignore[index]

    row["carbonflow_steady_over_best"] = row["carbonflow"]["steady"]["cost"] / bc  # type: ignore[index]
    row["carbonflow_cumulative_over_zeus"] = cum("carbonflow") / cum("zeus")
    row["carbonflow_cumulative_over_default"] = cum("carbonflow") / cum("default")
    row["carbonflow_pl_cumulative_over_zeus_pl"] = cum("carbonflow_pl") / cum("zeus_pl")
    row["zeus_cumulative_over_default"] = cum("zeus") / cum("default")
    passes = float(row["carbonflow"]["cumulative_profiling_pass_cost"])  # type: ignore[index]
    row["carbonflow_profiling_passes_over_zeus"] = passes / cum("zeus")
    return row


def why_not_met(rows: list[dict], summary: dict) -> dict[str, str]:
    """Per unmet target against Zeus, the measured reason: how much of carbonflow's cumulative cost is separate
    profiling passes of batch sizes (charged, by Zeus's rule, an epoch's worth of discarded work each, where
    Zeus profiles inside its first run at a size and keeps that work)."""
    out: dict[str, str] = {}
    t = summary["targets"]
    share = [r["carbonflow_profiling_passes_over_zeus"] for r in rows]
    without = [r["carbonflow_cumulative_over_zeus"] - s for r, s in zip(rows, share, strict=True)]
    if not t["cumulative_mean_le_0.97_zeus"]:
        out["cumulative_mean_le_0.97_zeus"] = (
            f"mean {summary['mean_carbonflow_cumulative_over_zeus']:.4f} x Zeus; of it, carbonflow's separate "
            f"profiling passes of batch sizes are {np.mean(share):.4f} x Zeus's cost on average (profiling rule "
            f"{PROFILING_RULE!r}); the rest of its cost is {np.mean(without):.4f} x Zeus's"
        )
    if not t["cumulative_le_1.02_zeus_every_pair"]:
        worst = max(rows, key=lambda r: r["carbonflow_cumulative_over_zeus"])
        out["cumulative_le_1.02_zeus_every_pair"] = (
            f"{worst['gpu']} {worst['workload']}: {worst['carbonflow_cumulative_over_zeus']:.4f} x Zeus; both "
            f"explore every batch size there, carbonflow's separate profiling passes are "
            f"{worst['carbonflow_profiling_passes_over_zeus']:.4f} x Zeus's cost"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--quick", action="store_true", help="one seed, V100 only")
    parser.add_argument("--gpus", nargs="+", default=GPUS, choices=GPUS)
    parser.add_argument(
        "--held-out", type=int, default=20, help="also run carbonflow alone on seeds 4..3+N (0: skip; --quick: 0)"
    )
    parser.add_argument("--profiling", choices=("zeus", "own"), default="zeus", help="see PROFILING_RULE")
    args = parser.parse_args(argv)
    global PROFILING_RULE
    PROFILING_RULE = args.profiling
    DATA = args.data
    seeds = [1] if args.quick else args.seeds
    gpus = ["v100"] if args.quick else args.gpus
    try:
        import zeus  # noqa: F401
    except ImportError:
        print("zeus==0.16.0 is needed: pip install 'carbonflow[bench]'", file=sys.stderr)
        return 2
    train = pd.read_csv(DATA / "summary_train.csv")
    t0 = time.perf_counter()
    rows = []
    for gpu in gpus:
        for spec in WORKLOADS:
            rows.append(run_pair(gpu, spec, train, seeds, 1.0))
            r = rows[-1]
            print(
                f"{r['gpu']:8s} {r['workload']:32s} rec={r['recurrences']:4d} "
                f"steady/best={r['carbonflow_steady_over_best']:.3f} "
                f"cf/zeus={r['carbonflow_cumulative_over_zeus']:.3f} "
                f"cf/default={r['carbonflow_cumulative_over_default']:.3f} "
                f"zeus/default={r['zeus_cumulative_over_default']:.3f} "
                f"cfPL/zeusPL={r['carbonflow_pl_cumulative_over_zeus_pl']:.4f}",
                flush=True,
            )
    ratio = [r["carbonflow_cumulative_over_zeus"] for r in rows]
    summary = {
        "pairs": len(rows),
        "mean_carbonflow_cumulative_over_zeus": float(np.nanmean(ratio)),
        "max_carbonflow_cumulative_over_zeus": float(np.nanmax(ratio)),
        "max_carbonflow_steady_over_best": float(max(r["carbonflow_steady_over_best"] for r in rows)),
        "max_carbonflow_cumulative_over_default": float(max(r["carbonflow_cumulative_over_default"] for r in rows)),
        "max_zeus_cumulative_over_default": float(np.nanmax([r["zeus_cumulative_over_default"] for r in rows])),
        "max_carbonflow_pl_cumulative_over_zeus_pl": float(
            np.nanmax([r["carbonflow_pl_cumulative_over_zeus_pl"] for r in rows])
        ),
    }
    for key in ("zeus", "carbonflow", "zeus_pl", "carbonflow_pl"):
        summary[f"mean_{key}_cumulative_over_default"] = float(
            np.nanmean([r[key]["cumulative_cost"] / r["default"]["cumulative_cost"] for r in rows if r[key]])
        )
    # Where the default (b0 at the highest limit) is itself the best fixed configuration in hindsight, any
    # information costs: even power-limit profiling alone ends above the default there.
    summary["pairs_above_default"] = [
        {
            "pair": f"{r['gpu']} {r['workload']}",
            "carbonflow_cumulative_over_default": r["carbonflow_cumulative_over_default"],
            "carbonflow_pl_cumulative_over_default": r["carbonflow_pl"]["cumulative_cost"]
            / r["default"]["cumulative_cost"],
            "default_is_best_fixed": r["best_fixed"]["config"] == [r["b0"], max(r["power_limits_w"])],
        }
        for r in rows
        if r["carbonflow_cumulative_over_default"] > 1.0
    ]
    summary["targets"] = {
        "steady_le_1.01_best_every_pair": summary["max_carbonflow_steady_over_best"] <= 1.01,
        "cumulative_mean_le_0.97_zeus": summary["mean_carbonflow_cumulative_over_zeus"] <= 0.97,
        "cumulative_le_1.02_zeus_every_pair": summary["max_carbonflow_cumulative_over_zeus"] <= 1.02,
        "le_1.001_default_every_pair": summary["max_carbonflow_cumulative_over_default"] <= 1.001,
        # equal within float noise counts as equal (with the same profiling rule both choose the same limits)
        "pl_only_le_zeus_pl_every_pair": summary["max_carbonflow_pl_cumulative_over_zeus_pl"] <= 1.0 + 1e-9,
    }
    summary["why_not_met"] = why_not_met(rows, summary)
    result = {
        "benchmark": "vs_zeus",
        "label": "simulated (trace-driven replay of Zeus's published measurements)",
        "zeus_version": __import__("importlib.metadata").metadata.version("zeus"),
        "eta": ETA,
        "beta": BETA,
        "seeds": seeds,
        "quick": args.quick,
        "profiling_rule": PROFILING_RULE,
        "profiling_rule_note": (
            "zeus: carbonflow's profiling charged as Zeus's simulator charges Zeus's, 1/|P| of an epoch per limit "
            "(equal accounting: the figure that counts; vs_zeus.json); own: carbonflow's real profiler window, "
            "35 steps per limit (vs_zeus_own_profiling.json), stated beside it"
        ),
        "elapsed_s": time.perf_counter() - t0,
        "summary": summary,
        "rows": rows,
    }
    held = 0 if args.quick else args.held_out
    if held > 0:
        result["held_out"] = held_out(gpus, train, list(range(4, 4 + held)))
        result["elapsed_s"] = time.perf_counter() - t0
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("vs_zeus.json" if PROFILING_RULE == "zeus" else "vs_zeus_own_profiling.json")
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    if "held_out" in result:
        print(json.dumps({k: v for k, v in result["held_out"].items() if k != "rows"}, indent=1))
    print(f"wrote {out} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
