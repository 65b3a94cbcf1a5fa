"""The pair predictor (solo part + history offsets) and the nightly pair-profiling budget."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from carbonflow.planning.pairs import (
    PairOutcome,
    PairPrediction,
    SoloFeatures,
    fit_pair_predictor,
    pairs_to_profile,
)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "pair_prediction.py"


def _solo(job: str, load: float, step_s: float = 0.1) -> SoloFeatures:
    return SoloFeatures(job, load, step_s)


def test_solo_part_recovers_a_linear_interference_law():
    # kept(a|b) = 1 - 0.5 * load_b, exactly: the fit must reproduce it for an unseen pair
    solo = {j: _solo(j, load) for j, load in {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.8, "e": 0.5}.items()}
    law = lambda b: 1 - 0.5 * solo[b].gpu_load  # noqa: E731
    known = [PairOutcome(x, y, law(y), law(x)) for x, y in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("a", "d")]]
    predictor = fit_pair_predictor(solo, known, shrinkage=1e9)
    p = predictor.predict(solo["e"], solo["b"])
    assert p.kept_speed_a == pytest.approx(law("b"), abs=0.02)
    assert p.kept_speed_b == pytest.approx(law("e"), abs=0.02)
    assert p.from_history  # b has history; e (new) does not
    assert not predictor.predict(solo["e"], solo["e"]).from_history


def test_history_offsets_learn_a_job_that_suffers_more_than_its_profile_says():
    solo = {j: _solo(j, 0.5) for j in "abcd"}
    # identical solo profiles; job "a" keeps only 0.5 next to anyone, the others 0.9
    known = [PairOutcome("a", x, 0.5, 0.9) for x in "bc"] + [PairOutcome("b", "c", 0.9, 0.9)]
    predictor = fit_pair_predictor(solo, known)
    with_a = predictor.predict(solo["a"], solo["d"])
    without_a = predictor.predict(solo["b"], solo["d"])
    assert with_a.from_history
    # "a" keeps 0.4 less than the others; with two outcomes its offset is shrunk by 2 / (2 + 2): 0.2 less
    assert with_a.kept_speed_a == pytest.approx(without_a.kept_speed_a - 0.2, abs=0.02)


def test_predictions_never_exceed_solo_speed():
    solo = {"a": _solo("a", 0.1), "b": _solo("b", 0.1)}
    predictor = fit_pair_predictor(solo, [PairOutcome("a", "b", 1.0, 1.0)])
    p = predictor.predict(solo["a"], solo["b"])
    assert p.kept_speed_a <= 1.0 and p.kept_speed_b <= 1.0


def test_no_outcomes_predicts_no_slowdown():
    solo = {"a": _solo("a", 0.9), "b": _solo("b", 0.9)}
    assert fit_pair_predictor(solo, []).predict(solo["a"], solo["b"]).combined_speed == 2.0


def test_outcome_of_a_job_without_a_solo_profile_is_refused_by_name():
    with pytest.raises(ValueError, match="'ghost'"):
        fit_pair_predictor({"a": _solo("a", 0.5)}, [PairOutcome("a", "ghost", 0.9, 0.9)])


def test_solo_features_refuse_impossible_values_naming_the_field():
    with pytest.raises(ValueError, match="gpu_load=0"):
        SoloFeatures("a", 0.0, 0.1)
    with pytest.raises(ValueError, match="step_time_s=-1"):
        SoloFeatures("a", 0.5, -1)


def _pred(a: str, b: str, combined: float) -> PairPrediction:
    return PairPrediction(a, b, combined / 2, combined / 2, False)


def test_pairs_to_profile_takes_the_most_promising_within_both_budgets():
    preds = [_pred("a", "b", 1.9), _pred("c", "d", 1.2), _pred("e", "f", 1.6), _pred("g", "h", 0.9)]
    cost = {(p.job_a, p.job_b): 60.0 for p in preds}
    chosen = pairs_to_profile(preds, cost, max_pairs=2, max_gpu_s=1000)
    assert [(c.job_a, c.job_b) for c in chosen] == [("a", "b"), ("e", "f")]
    by_time = pairs_to_profile(preds, cost, max_pairs=10, max_gpu_s=130)
    assert [(c.job_a, c.job_b) for c in by_time] == [("a", "b"), ("e", "f")]
    everything = pairs_to_profile(preds, cost, max_pairs=10, max_gpu_s=1e9)
    assert ("g", "h") not in [(c.job_a, c.job_b) for c in everything]  # predicted to lose: never profiled


def test_pairs_to_profile_refuses_a_negative_budget():
    with pytest.raises(ValueError, match="max_pairs=-1"):
        pairs_to_profile([], {}, max_pairs=-1, max_gpu_s=10)


def test_pair_prediction_benchmark_beats_the_mean_baseline_on_gavel(tmp_path):
    spec = importlib.util.spec_from_file_location("pair_prediction_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "pair_prediction.json"
    assert bench.main(["--out", str(out)]) == 0
    import json

    result = json.loads(out.read_text())
    assert result["job_types"] == 26 and result["pairs"] > 300
    assert result["pair_prediction_mae_kept_speed"] < result["baseline_mean_mae_kept_speed"]
    assert result["cold_job_mae_kept_speed"] < result["baseline_mean_mae_kept_speed"]
