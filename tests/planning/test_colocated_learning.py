"""Co-location and fixed costs: one formula from kept speed to slowdown, a pair's timeline with fixed parts, and a
night spent sharing a GPU that still teaches each job's fixed costs (so the next shared night is predicted right)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from planning_factories import NOW, make_forecast, make_profile, make_spec

from carbonflow.planning import PairProfile, RealisedRun, pair_timeline, plan_night, predict_pair_slowdown
from carbonflow.planning.learning import JobHistory, kept_speed_from_slowdown, slowdown_from_kept_speed
from carbonflow.planning.optimizer import predict_candidates
from carbonflow.planning.pairs import pair_timeline_with_fixed

ROW = [(250, 100.0, 120.0)]  # one configuration: 100 samples/s at 120 W (the reference a pair runs at)
FIXED_S, FIXED_J = 300.0, 3_000.0  # start-up, data loading, evaluation: the same every run
KEPT = (1.0, 0.75)  # a keeps its speed next to b, b keeps 0.75 next to a (Gavel's ResNet-18 / A3C: 1.00 / 0.75)
PAIR_POWER_W = 150.0


def test_one_formula_from_a_kept_speed_to_a_slowdown():
    assert slowdown_from_kept_speed(0.75) == pytest.approx(1 / 3)
    assert slowdown_from_kept_speed(1.0) == 0.0
    assert slowdown_from_kept_speed(0.33) == pytest.approx(2.0303, abs=1e-4)  # not 124 %, not 48 %: 203 %
    for kept in (0.2, 0.5, 0.746, 1.0):
        assert kept_speed_from_slowdown(slowdown_from_kept_speed(kept)) == pytest.approx(kept)
    with pytest.raises(ValueError, match="kept=0"):
        slowdown_from_kept_speed(0)


def test_a_pairs_timeline_slows_only_the_per_sample_parts():
    # 10 s runs, 4 s of each fixed; a keeps 1.0, b 0.5: a's 6 s of steps end at 6 s, by then b did 3 of its 6
    tl = pair_timeline_with_fixed(10.0, 10.0, 4.0, 4.0, 1.0, 0.5)
    assert (tl.total_a_s, tl.total_b_s) == pytest.approx((10.0, 13.0))
    assert (tl.overlap_s, tl.tail_s, tl.tail_job) == pytest.approx((10.0, 3.0, "b"))
    # no fixed part: the plain timeline; the whole 10 s slowed would have made b 15 s
    assert pair_timeline_with_fixed(10.0, 10.0, 0.0, 0.0, 1.0, 0.5) == pair_timeline(10.0, 10.0, 1.0, 0.5)
    pair = [PairProfile("a", "b", 1.0, 0.5, power_w=100.0)]
    assert predict_pair_slowdown("a", "b", 10.0, 10.0, pair, None, 4.0, 4.0) == pytest.approx((0.0, 0.3))
    assert predict_pair_slowdown("a", "b", 10.0, 10.0, pair) == pytest.approx((0.0, 0.5))


def _specs():
    # a: 2 epochs = 1000 s of steps alone; b: 1 epoch = 500 s; both may run 30 % longer
    return [make_spec("a", epochs=2, max_slowdown=0.3), make_spec("b", epochs=1, max_slowdown=0.3)]


def _shared_night(night: int, with_figures: bool = True) -> list[RealisedRun]:
    """What a night of the pair sharing one GPU really costs (the simulated workload's truth), as the pair's
    wrapper records it: b's 500 s of steps take 667 s at 0.75 beside a, a's 1000 s are not slowed (1.00)."""
    steps = {"a": 1000.0, "b": 500.0}
    shared_s = steps["b"] / KEPT[1]  # both step until b is done
    weight = {"a": 120.0 * KEPT[0], "b": 120.0 * KEPT[1]}  # the wrapper splits by solo power × kept speed
    runs = []
    for job, kept in zip(("a", "b"), KEPT, strict=True):
        share = weight[job] / sum(weight.values())
        alone_s = steps[job] - kept * shared_s  # a's tail after b is done
        charged_j = share * PAIR_POWER_W * shared_s
        runs.append(
            RealisedRun(
                job=job,
                config_key="c1-pl250-ga+b",
                finished_at=NOW + timedelta(days=night, hours=1),
                predicted_duration_s=1.0,
                realised_duration_s=FIXED_S + shared_s + alone_s,
                predicted_energy_j=1.0,
                realised_energy_j=FIXED_J + charged_j + 120.0 * alone_s,
                power_limit_w=250,
                colocated_with=("b" if job == "a" else "a",),
                sharing_lost_s=(1 - kept) * shared_s if with_figures else None,
                sharing_energy_j=charged_j - 120.0 * kept * shared_s if with_figures else None,
            )
        )
    return runs


def test_a_colocated_run_says_what_the_job_costs_alone():
    a, b = _shared_night(0)
    assert a.alone() is not None and b.alone() is not None
    assert b.alone().config_key == "c1-pl250" and b.alone().colocated_with == ()  # type: ignore[union-attr]
    assert b.alone().realised_duration_s == pytest.approx(FIXED_S + 500.0)  # type: ignore[union-attr]
    assert b.alone().realised_energy_j == pytest.approx(FIXED_J + 120.0 * 500.0)  # type: ignore[union-attr]
    assert a.alone().realised_duration_s == pytest.approx(FIXED_S + 1000.0)  # type: ignore[union-attr]
    # a co-located run without the wrapper's sharing figures (e.g. two pods) says nothing about the job alone
    assert all(r.alone() is None for r in _shared_night(0, with_figures=False))


def test_a_night_spent_sharing_teaches_fixed_costs():
    specs = {s.name: s for s in _specs()}
    history = JobHistory(_shared_night(0))
    for job, steps in (("a", 1000.0), ("b", 500.0)):
        _, ref, _ = predict_candidates(specs[job], make_profile(rows=ROW, job=job), history)
        assert ref.fixed_s == pytest.approx(FIXED_S) and ref.fixed_j == pytest.approx(FIXED_J)
        assert ref.duration_s == pytest.approx(FIXED_S + steps)
        assert ref.energy_j == pytest.approx(FIXED_J + 120.0 * steps)
    # without the sharing figures nothing is learned (the runs are skipped, not mistaken for solo runs)
    _, ref, _ = predict_candidates(specs["b"], make_profile(rows=ROW, job="b"), JobHistory(_shared_night(0, False)))
    assert ref.fixed_s == 0.0 and ref.duration_s == pytest.approx(500.0)


def test_the_next_shared_night_is_predicted_as_it_runs():
    specs = _specs()
    profiles = {n: make_profile(rows=ROW, job=n) for n in ("a", "b")}
    pairs = [PairProfile("a", "b", *KEPT, power_w=PAIR_POWER_W, label="simulated")]
    plans = plan_night(
        specs, profiles, {"GB": make_forecast([200.0] * 96)}, NOW, pair_profiles=pairs,
        history=JobHistory(_shared_night(0)),
    )  # fmt: skip
    truth = {r.job: r for r in _shared_night(1)}
    for plan in plans:
        assert plan.colocated_with, plan.reason
        assert plan.predicted_duration_s == pytest.approx(truth[plan.job].realised_duration_s, rel=1e-6)
        assert plan.predicted_energy_j == pytest.approx(truth[plan.job].realised_energy_j, rel=1e-6)
    reason = next(p.reason for p in plans if p.job == "b")
    # the kept speed and the slowdown it means (1 / 0.75 − 1) while both run, then the run's own extension
    assert "keeps 0.75 of its solo speed while both run (33 % slower; simulated)" in reason
    assert "predicted run 21 % longer" in reason  # (300 + 667) / 800 − 1: the fixed part is not slowed
