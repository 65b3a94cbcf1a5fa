"""benchmarks/vs_zeus.py: both sides charged by one rule, as the product runs with in-run profiling (the first run
at a batch size sweeps its limits and keeps the work; carbonflow's probes are separate passes paid in full), the
targets read on seeds the explorer was not developed on, and Zeus's outcomes reused only where they are Zeus's."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from carbonflow.planning.costs import zeus_cost

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("/work/shared/data")


def _load():
    spec = importlib.util.spec_from_file_location("vs_zeus_bench", ROOT / "benchmarks" / "vs_zeus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _tiny(vz, epochs: float = 3.0):
    """One batch size (64), two limits: 100 W runs an epoch in 120 s at 90 W, 200 W in 100 s at 150 W; every
    path needs ``epochs`` epochs."""
    train = pd.DataFrame(
        {
            "dataset": "cifar100",
            "network": "net",
            "optimizer": "sgd",
            "batch_size": 64,
            "learning_rate": 0.1,
            "run": [1, 2],
            "target_metric": 0.5,
            "target_epoch": epochs,
        }
    )
    power = pd.DataFrame(
        {
            "dataset": "cifar100",
            "network": "net",
            "batch_size": 64,
            "optimizer": "sgd",
            "power_limit": [100, 200],
            "time_per_epoch": [120.0, 100.0],
            "average_power": [90.0, 150.0],
        }
    )
    return vz.Workload(train, power, ("cifar100", "net", "sgd", 0.5, 10, 64))


def test_vs_zeus_charges_both_sides_by_the_product_window_unless_told_otherwise():
    vz = _load()
    dataset = next(iter(vz.SAMPLES_PER_EPOCH))
    w = SimpleNamespace(power_limits=[100, 150, 200, 250], dataset=dataset)
    assert vz.PROFILING_RULE == "product"
    product = min(vz.PROFILE_STEPS * 64 / vz.SAMPLES_PER_EPOCH[dataset], 0.25)
    assert vz.profile_slice_epochs(w, 64) == pytest.approx(product)
    vz.PROFILING_RULE = "zeus"  # information only: Zeus's simulator's window, 1/|P| of an epoch per limit
    assert vz.profile_slice_epochs(w, 64) == pytest.approx(0.25)


def test_under_zeus_window_the_in_run_sweep_is_zeus_simulators_first_epoch():
    vz = _load()
    w = _tiny(vz)
    vz.PROFILING_RULE = "zeus"
    # Zeus's _run_job: the first epoch is the mean over the limits, the rest at the chosen limit
    energy, time_s = vz.sweep_extra(w, 64, 100)
    assert energy == pytest.approx((120 * 90 + 100 * 150) / 2 - 120 * 90)
    assert time_s == pytest.approx((120 + 100) / 2 - 120)


def test_carbonflow_sweeps_in_its_first_run_and_keeps_the_work():
    vz = _load()
    w = _tiny(vz)
    f = min(vz.PROFILE_STEPS * 64 / vz.SAMPLES_PER_EPOCH["cifar100"], 0.5)
    at = {pl: zeus_cost(3 * t * p, 3 * t, 0.5, 200.0) for pl, t, p in ((100, 120, 90), (200, 100, 150))}
    assert vz.chosen_limit(w, 64) == 100  # 0.5*32400 + 0.5*200*360 = 52 200 < 0.5*45000 + 0.5*200*300 = 52 500
    # by hand: the first run sweeps both limits for f of an epoch each, keeps that work (still 3 epochs) and pays
    # only what the 200 W window adds over running it at 100 W: f*(15000-10800) J and f*(100-120) s
    extra_e, extra_t = f * (100 * 150 - 120 * 90), f * (100 - 120)
    extra = zeus_cost(extra_e, extra_t, 0.5, 200.0)
    # the first night is planned from a probe of the default at its highest limit: a separate pass, paid in full
    probe = zeus_cost(f * 100 * 150, f * 100, 0.5, 200.0)
    out = vz.simulate_carbonflow(w, 4, seed=7, with_bs=False)
    assert (out.sweeps, out.profiles) == (1, 1) and out.profiling_cost == pytest.approx(probe)
    assert out.sweep_cost == pytest.approx(extra)
    assert out.cost == pytest.approx(probe + 4 * at[100] + extra)
    assert out.energy_j == pytest.approx(f * 100 * 150 + 4 * 3 * 120 * 90 + extra_e)
    assert out.configs == [(64, 100)] * 4
    # with the explorer (one batch size: nothing more to probe) the same bill
    full = vz.simulate_carbonflow(w, 4, seed=7, with_bs=True)
    assert full.cost == pytest.approx(out.cost) and full.profiles == 1 and full.sweeps == 1
    # the default pays no profile at all; one profile is the default batch size's probe and sweep extra
    assert vz.simulate_default(w, 4, seed=7).cost == pytest.approx(4 * at[200])
    assert vz.one_profile_cost(w, 64) == pytest.approx(probe + extra)


def test_a_probe_is_a_separate_pass_charged_in_full():
    vz = _load()
    w = _tiny(vz)
    out = vz.Outcome()
    f = min(vz.PROFILE_STEPS * 64 / vz.SAMPLES_PER_EPOCH["cifar100"], 0.5)
    cost = vz.probe_pass(w, 64, 200, out)
    assert cost == pytest.approx(zeus_cost(f * 100 * 150, f * 100, 0.5, 200.0))
    assert (out.cost, out.profiling_cost, out.profiles) == (pytest.approx(cost), pytest.approx(cost), 1)
    assert vz.probe_limit(w, 64, 180) == 200 and vz.probe_limit(w, 64, 150) == 200 and vz.probe_limit(w, 64, 110) == 100


def test_summary_targets_read_the_pairs_and_one_profile():
    vz = _load()

    def row(cf_zeus: float, cf_default: float, frac: float, steady: float) -> dict:
        return {
            "gpu": "V100",
            "workload": "x/y",
            "seeds": [4],
            "b0": 64,
            "power_limits_w": [100, 200],
            "best_fixed": {"config": [64, 100], "cumulative_cost": 0.94},
            "carbonflow_cumulative_over_zeus": cf_zeus,
            "carbonflow_cumulative_over_default": cf_default,
            "one_profile_cost_fraction": frac,
            "carbonflow_steady_over_best": steady,
            "zeus_cumulative_over_default": 1.0,
            "carbonflow_pl_cumulative_over_zeus_pl": None,
            "carbonflow_profiles_mean": 1.0,
            "carbonflow_profiling_passes_over_zeus": 0.01,
            "carbonflow_in_run_sweeps_over_zeus": 0.001,
            "per_seed_max": {"carbonflow_cumulative_over_zeus": cf_zeus},
            "zeus": {"cumulative_cost": 1.0, "final_configs": [[64, 100]]},
            "carbonflow": {"cumulative_cost": cf_zeus, "final_configs": [[64, 100]]},
            "zeus_pl": None,
            "carbonflow_pl": None,
            "default": {"cumulative_cost": 1.0},
        }

    good = vz.summarise_rows([row(0.95, 0.9, 0.01, 1.0), row(0.96, 1.004, 0.005, 1.01)])
    assert good["mean_carbonflow_cumulative_over_zeus"] == pytest.approx(0.955)
    assert good["max_one_profile_cost_fraction"] == pytest.approx(0.01)
    assert good["mean_best_fixed_cumulative_over_zeus"] == pytest.approx(0.94)  # information: the hindsight optimum
    assert good["mean_carbonflow_cumulative_over_best_fixed"] == pytest.approx(0.955 / 0.94)
    assert all(good["targets"].values()) and good["why_not_met"] == {}
    # 1.004 x the default is within 1 + the largest profile fraction, but not within its own pair's (0.003)
    bad = vz.summarise_rows([row(0.95, 0.9, 0.01, 1.0), row(1.02, 1.004, 0.003, 1.02)])
    assert bad["targets"] == {
        "mean_cumulative_le_0.96_zeus": False,
        "cumulative_le_1.01_zeus_every_pair": False,
        "cumulative_le_default_plus_one_profile": True,
        "cumulative_le_default_plus_own_profile_every_pair": False,
        "steady_le_1.01_best_every_pair": False,
    }
    assert set(bad["why_not_met"]) == {
        "mean_cumulative_le_0.96_zeus",
        "cumulative_le_1.01_zeus_every_pair",
        "steady_le_1.01_best_every_pair",
    }


def test_the_targets_are_never_judged_on_the_development_seeds():
    vz = _load()
    assert [1, 2, 3, *range(101, 131)] == vz.DEVELOPMENT_SEEDS and list(range(4, 24)) == vz.EVALUATION_SEEDS
    assert not set(vz.DEVELOPMENT_SEEDS) & set(vz.EVALUATION_SEEDS)
    with pytest.raises(SystemExit):
        vz.main(["--seeds", "3", "4", "--development-seeds", "1", "2", "3"])


def test_a_cached_zeus_outcome_is_reused_and_carbonflow_is_run_afresh(monkeypatch, tmp_path):
    vz = _load()
    w = _tiny(vz)
    monkeypatch.setattr(vz, "_workload", lambda gpu, i: (w, None, None))

    def never(*args, **kwargs):
        raise AssertionError("Zeus's simulator ran although its outcome was cached")

    monkeypatch.setattr(vz, "simulate_zeus", never)
    known = {"zeus": {"cost": 1.0, "energy_j": 2.0, "time_s": 3.0, "configs": [[64, 100]], "profiling_cost": 0.0}}
    key, out = vz.seed_outcomes(("v100", 0, 7, 1.0, vz.DATA, "zeus", known, False))
    assert key == ("v100", 0, 7)
    assert out["zeus"].cost == 1.0 and out["zeus"].configs == [(64, 100)]
    assert set(out) == {"default", "zeus", "carbonflow"}
    assert out["carbonflow"].cost == pytest.approx(vz.simulate_carbonflow(w, vz.recurrences(w), 7, True).cost)
    # without a cache entry Zeus's simulator is asked (and a failure fails the run)
    with pytest.raises(AssertionError, match="cached"):
        vz.seed_outcomes(("v100", 0, 7, 1.0, vz.DATA, "zeus", None, False))


@pytest.mark.skipif(not (DATA / "zeus/summary_train.csv").exists(), reason="shared Zeus data not present")
def test_vs_zeus_a_failed_zeus_seed_fails_the_run(monkeypatch):
    vz = _load()

    def broken(*args, **kwargs):
        raise RuntimeError("Zeus's simulator failed on this seed")

    monkeypatch.setattr(vz, "simulate_zeus", broken)
    train = pd.read_csv(DATA / "zeus/summary_train.csv")
    with pytest.raises(RuntimeError, match="failed on this seed"):
        vz.run_pair("v100", vz.WORKLOADS[4], train, [1], 0.05)


def test_the_run_is_not_early_stopped_without_a_threshold():
    vz = _load()
    w = _tiny(vz, epochs=math.nan)  # never reaches the target: runs the whole budget
    energy, time_s, reached, epochs = vz.run_config(w, 64, 200, np.random.default_rng(0), math.inf)
    assert (reached, epochs) == (False, 10)
    assert (energy, time_s) == pytest.approx((10 * 100 * 150, 10 * 100))


def test_a_path_is_drawn_as_pandas_sample_draws_it():
    vz = _load()
    w = _tiny(vz)
    w._paths[(64, 100)] = w._paths[(64, 100)].assign(target_epoch=[3.0, 7.0, 5.0, 4.0][: len(w._paths[(64, 100)])])
    ours, theirs = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(20):
        expected = float(w._paths[(64, 100)].sample(n=1, random_state=theirs).target_epoch.iloc[0])
        assert w.sample(64, 100, ours) == expected


def test_zeus_is_billed_its_sweep_by_the_product_window_and_decides_as_itself(monkeypatch):
    """Zeus's simulator (faked here: zeus is a benchmark extra) runs its own paths and decisions; under the product
    rule a sweeping run's bill is its path at the chosen limit plus the product window's extra, else unchanged."""
    from types import ModuleType

    vz = _load()
    w = _tiny(vz)
    calls: list[bool] = []

    class FakeSimulator:
        def __init__(self, *args, **kwargs):
            pass

        def _run_job(self, job, batch_size, power_limit, rng, cost_ub, eta_knob, profile_power):
            calls.append(profile_power)
            return 1000.0, 10.0, True

        def simulate_one_job(self, job, n, beta, eta):
            rng = np.random.default_rng(0)
            runs = [self._run_job(job, 64, 100, rng, math.inf, eta, profile_power=p) for p in (True, False)]
            return [SimpleNamespace(energy=e, time=t, reached=r, bs=64, pl=100) for e, t, r in runs]

    fakes = {
        "zeus._legacy.policy": SimpleNamespace(BatchSizeOptimizer=object),
        "zeus._legacy.policy.optimizer": SimpleNamespace(
            JITPowerLimitOptimizer=lambda **k: None, PruningGTSBatchSizeOptimizer=lambda **k: None
        ),
        "zeus._legacy.simulate": SimpleNamespace(Simulator=FakeSimulator),
        "zeus._legacy.job": SimpleNamespace(Job=lambda *a: None),
    }
    for name, fake in fakes.items():
        module = ModuleType(name)
        module.__dict__.update(vars(fake))
        monkeypatch.setitem(sys.modules, name, module)
    out = vz.simulate_zeus(w, None, None, 2, seed=1, full=True)
    assert calls == [False, False]  # its paths drawn as a plain run; the sweep billed by the rule
    extra_e, extra_t = vz.sweep_extra(w, 64, 100)
    assert out.energy_j == pytest.approx(2000.0 + extra_e) and out.time_s == pytest.approx(20.0 + extra_t)
    vz.PROFILING_RULE = "zeus"  # information rule: Zeus's simulator untouched
    calls.clear()
    vz.simulate_zeus(w, None, None, 2, seed=1, full=True)
    assert calls == [True, False]


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_docs_quote_the_results_committed():
    """Every vs_zeus figure in README.md and docs/how-carbonflow-decides.md is the one ``--print-docs`` writes from
    the committed JSON: a rerun that changes a figure fails here until the docs are updated from it."""
    vz = _load()
    import json

    result = json.loads((ROOT / "benchmarks/results/vs_zeus.json").read_text())
    information = json.loads((ROOT / "benchmarks/results/vs_zeus_zeus_profiling.json").read_text())
    texts = vz.docs_text(result, information)
    assert _words(texts["how-carbonflow-decides"]) in _words((ROOT / "docs/how-carbonflow-decides.md").read_text())
    assert _words(texts["readme"]) in _words((ROOT / "README.md").read_text())


def test_the_docs_text_says_not_met_and_why_when_a_target_fails():
    vz = _load()
    rows = [
        {
            "gpu": "V100",
            "workload": "w",
            "carbonflow_cumulative_over_zeus": 0.99,
            "carbonflow_cumulative_over_default": 0.9,
            "carbonflow_steady_over_best": 1.05,
            "carbonflow_profiling_passes_over_zeus": 0.001,
            "carbonflow_in_run_sweeps_over_zeus": 0.0,
        }
    ]
    summary = {
        "mean_carbonflow_cumulative_over_zeus": 0.99,
        "max_carbonflow_cumulative_over_zeus": 0.99,
        "max_carbonflow_cumulative_over_default": 0.9,
        "max_one_profile_cost_fraction": 0.001,
        "max_carbonflow_steady_over_best": 1.05,
        "mean_best_fixed_cumulative_over_zeus": 0.95,
        "mean_carbonflow_cumulative_over_best_fixed": 1.04,
        "per_seed_max": {"carbonflow_cumulative_over_zeus": 1.1, "carbonflow_steady_over_best": 1.2},
        "targets": {
            "mean_cumulative_le_0.96_zeus": False,
            "cumulative_le_1.01_zeus_every_pair": True,
            "cumulative_le_default_plus_one_profile": True,
            "steady_le_1.01_best_every_pair": False,
        },
        "why_not_met": {"steady_le_1.01_best_every_pair": "V100 w: ends elsewhere"},
    }
    result = {
        "zeus_version": "0.16.0",
        "eta": 0.5,
        "development_seeds": [1, 2, 3, 101, 102],
        "evaluation_seeds": list(range(4, 24)),
        "summary": summary,
        "rows": rows,
    }
    text = vz.docs_text(result, None)["how-carbonflow-decides"]
    assert "0.9900 × Zeus's cumulative cost on average (target ≤ 0.96, **not met**)" in text
    assert "target ≤ 1.01, **not met**: V100 w: ends elsewhere" in text
    assert "seeds 1–3 and 101–102" in text and "seeds 4–23" in text
    assert "Information only" not in text


def test_a_cached_carbonflow_outcome_is_stale_once_the_epochs_curve_changes(monkeypatch, tmp_path):
    """Finding: the cache's code hash left out the explorer's curve, so a changed hyperparameter reused outcomes."""
    import carbonflow.planning.epochs_curve as curve_module

    vz = _load()
    before = vz.code_version.__wrapped__()  # uncached: the run caches it once
    changed = tmp_path / "epochs_curve.py"
    changed.write_text(Path(curve_module.__file__).read_text() + "\nCURVE_SD = 0.3\n")
    monkeypatch.setattr(curve_module, "__file__", str(changed))
    assert vz.code_version.__wrapped__() != before
