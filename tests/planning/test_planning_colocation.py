"""Co-location guard, the night's plan and the early-observation split."""

from __future__ import annotations

from datetime import timedelta

import pytest
from planning_factories import NOW, make_forecast, make_profile, make_spec

from carbonflow.planning import (
    PairProfile,
    choose_colocation_pairs,
    observed_slowdown,
    pair_timeline,
    plan_night,
    predict_pair_slowdown,
    separate_if_slow,
)

# Two light jobs that share a GPU well (each keeps 95 % of its speed) and a heavy one that does not.
LIGHT = [(250, 100.0, 120.0), (200, 95.0, 105.0)]


def _night(pairs, max_slowdown=0.10, values=None):
    specs = [make_spec(n, max_slowdown=max_slowdown, epochs=2) for n in ("a", "b", "c")]
    profiles = {n: make_profile(rows=LIGHT, job=n) for n in ("a", "b", "c")}
    forecast = make_forecast(values or [200.0] * 96)
    return specs, plan_night(specs, profiles, {"GB": forecast}, NOW, pair_profiles=pairs)


def test_pair_timeline_tail_and_slowdowns():
    tl = pair_timeline(100.0, 300.0, 0.5, 0.5)
    assert tl.overlap_s == pytest.approx(200.0)  # a needs 100 s of solo work at half speed
    assert tl.total_b_s == pytest.approx(200.0 + 200.0)  # b did 100 s of its work, 200 s left alone
    assert tl.tail_job == "b" and tl.device_s == pytest.approx(400.0)
    assert predict_pair_slowdown(
        "a", "b", 100.0, 300.0, [PairProfile("b", "a", 0.5, 0.5, power_w=200)]
    ) == pytest.approx((1.0, 400 / 300 - 1))


def test_unknown_pair_is_never_colocated():
    assert predict_pair_slowdown("a", "b", 10, 10, [], None) is None
    chosen = choose_colocation_pairs(["a", "b"], {"a": 1, "b": 1}, {("a", "b"): None}, {("a", "b"): 5.0})
    assert chosen == []


def test_choose_pairs_respects_both_bounds_and_picks_the_best_saving():
    slow = {("a", "b"): (0.05, 0.05), ("a", "c"): (0.05, 0.30), ("b", "c"): (0.02, 0.08)}
    saving = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 20.0}
    chosen = choose_colocation_pairs(["a", "b", "c"], {"a": 0.1, "b": 0.1, "c": 0.1}, slow, saving)
    assert chosen == [("b", "c")]  # (a, c) breaks c's bound; (b, c) saves more than (a, b)


def test_plan_night_colocates_a_pair_that_stays_inside_the_bound_and_saves_carbon():
    pairs = [PairProfile("a", "b", 0.95, 0.95, power_w=130.0, label="simulated")]
    _, plans = _night(pairs)
    by = {p.job: p for p in plans}
    assert by["a"].colocated_with == ["b"] and by["b"].colocated_with == ["a"]
    assert by["a"].config.colocation_group == by["b"].config.colocation_group == "a+b"
    assert by["a"].start == by["b"].start
    assert not by["c"].colocated_with
    for p in (by["a"], by["b"]):
        assert p.start + timedelta(seconds=p.predicted_duration_s) <= p.finish_by
        assert "co-located with" in p.reason
    solo_total = sum(p.predicted_emissions_g for p in _night([])[1][:2])
    assert by["a"].predicted_emissions_g + by["b"].predicted_emissions_g < solo_total


def test_plan_night_refuses_a_pair_whose_slowdown_breaks_a_bound():
    pairs = [PairProfile("a", "b", 0.6, 0.95, power_w=130.0, label="simulated")]
    _, plans = _night(pairs)
    assert not any(p.colocated_with for p in plans)
    # With a looser bound the same pair is accepted.
    _, loose = _night(pairs, max_slowdown=0.8)
    assert any(p.colocated_with for p in loose)


def test_plan_night_needs_unique_names_and_profiles():
    spec = make_spec("a")
    with pytest.raises(ValueError, match="unique"):
        plan_night([spec, spec], {"a": make_profile(job="a")}, {}, NOW)
    with pytest.raises(ValueError, match="profiles"):
        plan_night([spec], {}, {}, NOW)


def test_separate_if_slow_splits_only_groups_that_break_their_bound():
    pairs = [PairProfile("a", "b", 0.95, 0.95, power_w=130.0, label="simulated")]
    _, plans = _night(pairs)
    kept = separate_if_slow({"a": 0.04, "b": 0.05}, plans, 0.10)
    assert kept.separated == [] and kept.plans == plans
    split = separate_if_slow({"a": observed_slowdown(100.0, 80.0)}, plans, {"a": 0.10, "b": 0.10})
    assert split.separated == [("a", "b")]
    by = {p.job: p for p in split.plans}
    assert not by["a"].colocated_with and by["a"].config.colocation_group is None
    assert "separated after early observation: a slowed 25 %" in by["a"].reason
    assert by["c"] == {p.job: p for p in plans}["c"]


def test_observed_slowdown_validates():
    assert observed_slowdown(100, 50) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="throughputs"):
        observed_slowdown(0, 1)


def test_a_colocated_pair_trained_to_target_plans_finish_by_for_its_most_epochs():
    from carbonflow.planning import JobHistory, RealisedRun
    from carbonflow.planning.batch_size import DEADLINE_EPOCH_MARGIN

    # 500 s per epoch; 2, 2, 3 epochs to target seen: expected 7/3, planned for 1.5 x 3 = 4.5 epochs.
    records = [
        RealisedRun(
            job=job,
            config_key="c1-pl250",
            finished_at=NOW - timedelta(days=d),
            predicted_duration_s=0.0,  # not recorded: the fit skips it
            realised_duration_s=0.0,
            predicted_energy_j=1.0,
            realised_energy_j=1.0,
            batch_size=64,
            epochs=e,
            reached_target=True,
        )
        for job in ("a", "b")
        for d, e in ((3, 2.0), (2, 2.0), (1, 3.0))
    ]
    specs = [make_spec(n, hours=2.0, epochs=6, target_metric="accuracy") for n in ("a", "b")]
    profiles = {n: make_profile(rows=LIGHT, job=n) for n in ("a", "b")}
    forecast = make_forecast([400.0] * 3 + [50.0] * 4)  # low only in the last half hour before finish_by
    pairs = [PairProfile("a", "b", 0.95, 0.95, power_w=130.0, label="simulated")]
    plans = plan_night(specs, profiles, {"GB": forecast}, NOW, pair_profiles=pairs, history=JobHistory(records))
    assert all(p.colocated_with for p in plans)
    worst_s = DEADLINE_EPOCH_MARGIN * 3.0 * 500.0 / 0.95  # both at 95 % of their speed the whole time
    for p in plans:
        assert p.start + timedelta(seconds=worst_s) <= p.finish_by + timedelta(seconds=1)  # starts kept to the ms


def test_a_job_trying_an_untried_batch_size_tonight_is_not_colocated():
    from carbonflow.planning import JobHistory, RealisedRun

    records = [
        RealisedRun(
            job=job,
            config_key="c1-pl250-b64",
            finished_at=NOW - timedelta(days=d),
            predicted_duration_s=0.0,  # not recorded: the fit skips it
            realised_duration_s=0.0,
            predicted_energy_j=1.2e6,
            realised_energy_j=1.2e6,
            batch_size=64,
            epochs=10.0,
            reached_target=True,
        )
        for job in ("a", "b")
        for d in (3, 2, 1)
    ]
    profiles = {n: make_profile(rows=LIGHT, job=n, batch_sizes=(64, 256), bs_speed={64: 1.0, 256: 3.0}) for n in "ab"}
    pairs = [PairProfile("a", "b", 0.95, 0.95, power_w=130.0, label="simulated")]
    forecast = make_forecast([200.0] * 96)

    def night(batch_sizes):
        specs = [
            make_spec(n, epochs=20, batch_size=64, batch_sizes=batch_sizes, target_metric="accuracy", max_slowdown=1)
            for n in "ab"
        ]
        return plan_night(specs, profiles, {"GB": forecast}, NOW, pair_profiles=pairs, history=JobHistory(records))

    fixed = night(None)  # batch size not opted in: the pair saves energy and is taken
    assert all(p.colocated_with for p in fixed)
    exploring = night([64, 256])  # both want to try 256 tonight: no pair at the reference batch size
    assert [p.config.batch_size for p in exploring] == [256, 256]
    assert not any(p.colocated_with for p in exploring)
