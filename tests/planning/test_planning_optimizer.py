"""The joint optimiser: deadlines, slowdown bound, flat vs dipping forecasts, determinism, properties."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from planning_factories import NOW, make_forecast, make_profile, make_spec
from planning_factories import make_target_run as _target_run

from carbonflow.carbon.windows import held_window_means
from carbonflow.domain import Config, JobSpec
from carbonflow.planning import (
    DeadlineError,
    JobHistory,
    RealisedRun,
    choose_power_limit,
    plan_job,
    predict_candidates,
    work_samples,
)
from carbonflow.settings import START_GUARD_Z_ENV


def _energy_optimal(spec, profile):
    candidates, _, _ = predict_candidates(spec, profile)
    return min((c for c in candidates if c.within_slowdown), key=lambda c: c.energy_j).config


def test_flat_forecast_picks_the_energy_optimal_configuration_and_starts_now():
    spec = make_spec(max_slowdown=0.5, max_containers=2)
    profile = make_profile(containers=(1, 2))
    plan = plan_job(spec, profile, make_forecast([250.0] * 96), NOW)
    assert plan.config.key() == _energy_optimal(spec, profile).key()
    assert plan.config.power_limit_w == 175  # 163 W / 84 samples/s is the least J per sample within +50 %
    assert plan.start == NOW  # ties in carbon go to the earliest start
    assert plan.predicted_emissions_g == pytest.approx(plan.predicted_energy_j / 3.6e6 * 250.0)


def test_forecast_that_dips_later_moves_the_start_into_the_dip():
    values = [300.0] * 96
    for i in range(14, 22):  # 01:00-05:00 UTC
        values[i] = 100.0
    plan = plan_job(make_spec(), make_profile(), make_forecast(values), NOW)
    assert NOW + timedelta(hours=7) <= plan.start
    assert plan.start + timedelta(seconds=plan.predicted_duration_s) <= NOW + timedelta(hours=11)
    assert plan.baseline is not None and plan.baseline.start == NOW
    assert plan.predicted_emissions_g < 0.5 * plan.baseline.predicted_emissions_g
    assert "carbon vs start now at 250 W" in plan.reason and "before" in plan.reason


def test_slowdown_bound_excludes_slow_power_limits():
    spec = make_spec(max_slowdown=0.05)
    plan = plan_job(spec, make_profile(), make_forecast([250.0] * 96), NOW)
    # 200 W is 7.5 % slower than 250 W, 225 W is 2 % slower: only 225/250 allowed.
    assert plan.config.power_limit_w == 225
    slow = [a for a in plan.alternatives if not a.feasible and a.why_not]
    assert {a.config.power_limit_w for a in slow} >= {150, 175, 200}
    assert all("max_slowdown" in a.why_not for a in slow)


def test_deadline_that_cannot_be_met_raises_naming_finish_by_or_runs_fastest_with_a_warning():
    spec = make_spec(hours=1.0)  # the fastest config needs 5000 s
    with pytest.raises(DeadlineError, match="finish_by"):
        plan_job(spec, make_profile(), make_forecast([200.0] * 96), NOW)
    plan = plan_job(spec, make_profile(), make_forecast([200.0] * 96), NOW, on_infeasible="fastest")
    assert plan.reason.startswith("DEADLINE AT RISK")
    assert plan.start == NOW and plan.config.power_limit_w == 250


def test_finish_by_in_the_past_is_rejected():
    with pytest.raises(ValueError, match="finish_by"):
        plan_job(make_spec(hours=-1), make_profile(), None, NOW)


def test_no_forecast_starts_now_and_says_why():
    plan = plan_job(make_spec(max_slowdown=0.5), make_profile(), None, NOW)
    assert plan.start == NOW and plan.forecast_provider == "none"
    assert "no forecast" in plan.reason
    assert plan.config.power_limit_w == 175  # carbon → energy


def test_work_in_steps_and_missing_samples_per_epoch():
    spec = make_spec(epochs=None, steps=1000, batch_size=128)
    assert work_samples(spec, make_profile()) == 128_000
    profile = make_profile()
    profile.samples_per_epoch = None
    with pytest.raises(ValueError, match="samples_per_epoch"):
        work_samples(make_spec(), profile)


def test_profile_without_matching_points_names_the_field():
    with pytest.raises(ValueError, match=r"profile\.points"):
        plan_job(make_spec(min_containers=2, max_containers=2), make_profile(), None, NOW)


def test_objectives_choose_their_own_optimum():
    profile = make_profile()
    flat = make_forecast([200.0] * 96)
    assert plan_job(make_spec(objective="time"), profile, flat, NOW).config.power_limit_w == 250
    assert plan_job(make_spec(objective="energy", max_slowdown=1), profile, flat, NOW).config.power_limit_w == 175
    zeus_time = plan_job(make_spec(objective="zeus:0.0", max_slowdown=1), profile, flat, NOW)
    assert zeus_time.config.power_limit_w == 250
    eds = plan_job(make_spec(objective="eds:1.0", max_slowdown=1), profile, flat, NOW)
    assert eds.config.power_limit_w == 250  # k = 1 weighs time only


def test_plan_is_deterministic_and_lists_alternatives():
    values = [200.0 + 50 * ((i * 7) % 5) for i in range(96)]
    spec = make_spec(max_containers=2)
    a = plan_job(spec, make_profile(containers=(1, 2)), make_forecast(values), NOW)
    b = plan_job(spec, make_profile(containers=(1, 2)), make_forecast(values), NOW)
    assert a.model_dump() == b.model_dump()
    keys = {alt.config.key() for alt in a.alternatives}
    assert len(keys) >= 5
    assert all(alt.cost >= a.predicted_emissions_g - 1e-9 for alt in a.alternatives if alt.feasible)


def test_batch_size_opt_in_chooses_among_batch_sizes():
    profile = make_profile(batch_sizes=(64, 256), bs_speed={64: 1.0, 256: 1.6})
    spec = make_spec(batch_size=64, batch_sizes=[64, 256], max_slowdown=0.3)
    plan = plan_job(spec, profile, make_forecast([200.0] * 96), NOW)
    assert plan.config.batch_size == 256
    no_opt_in = plan_job(make_spec(batch_size=64, max_slowdown=0.3), profile, make_forecast([200.0] * 96), NOW)
    assert no_opt_in.config.batch_size == 64


def test_choose_power_limit_respects_slowdown_and_objective():
    pls = [100, 150, 200, 250]
    time_s = [200.0, 130.0, 110.0, 100.0]
    power_w = [90.0, 130.0, 180.0, 240.0]
    assert choose_power_limit(pls, time_s, power_w, objective="energy", max_slowdown=None) == 150
    assert choose_power_limit(pls, time_s, power_w, objective="energy", max_slowdown=0.1) == 200
    assert choose_power_limit(pls, time_s, power_w, objective="time") == 250
    with pytest.raises(ValueError, match="equal length"):
        choose_power_limit(pls, time_s[:2], power_w)


# ---------------------------------------------------------------------------------------------------------
# Properties on random profiles and forecasts.

rows_strategy = st.lists(
    st.tuples(
        st.sampled_from([100, 125, 150, 175, 200, 225, 250, 275, 300]),
        st.floats(10, 500),
        st.floats(50, 300),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda r: r[0],
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy,
    containers=st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True),
    values=st.lists(st.floats(0, 800), min_size=1, max_size=120),
    slot_s=st.sampled_from([900.0, 1800.0, 3600.0]),
    hours=st.floats(0.5, 48),
    max_slowdown=st.floats(0, 1),
    objective=st.sampled_from(["carbon", "energy", "time", "edp", "eds:1.5", "eds:2", "zeus:0.5"]),
    offset_s=st.floats(-7200, 7200),
)
def test_plan_never_misses_finish_by_nor_breaks_the_slowdown_bound(
    rows, containers, values, slot_s, hours, max_slowdown, objective, offset_s
):
    profile = make_profile(rows=rows, containers=containers, samples_per_epoch=20_000)
    spec = make_spec(
        hours=hours,
        max_slowdown=max_slowdown,
        objective=objective,
        epochs=3,
        min_containers=min(containers),
        max_containers=max(containers),
    )
    forecast = make_forecast(values, start=NOW + timedelta(seconds=offset_s), slot_s=slot_s)
    try:
        plan = plan_job(spec, profile, forecast, NOW)
    except DeadlineError:
        candidates, _, _ = predict_candidates(spec, profile)
        assert min(c.duration_s for c in candidates) > hours * 3600 * (1 - 1e-9)
        return
    candidates, ref, _ = predict_candidates(spec, profile)
    assert plan.start >= NOW
    assert plan.start + timedelta(seconds=plan.predicted_duration_s) <= spec.finish_by + timedelta(milliseconds=5)
    assert plan.predicted_duration_s <= ref.duration_s * (1 + max_slowdown) * (1 + 1e-6)
    # The emissions it reports are the integral of the forecast over its window.
    mean = float(held_window_means(forecast, NOW, (plan.start - NOW).total_seconds(), plan.predicted_duration_s)[0])
    assert plan.predicted_emissions_g == pytest.approx(plan.predicted_energy_j / 3.6e6 * mean, rel=1e-6, abs=1e-9)
    # No feasible alternative beats it on the objective.
    costs = [a.cost for a in plan.alternatives if a.feasible]
    if costs and objective == "carbon":
        # Costs within 1e-9 of the largest candidate's count as ties (documented): allow a microgram.
        assert plan.predicted_emissions_g <= min(costs) * (1 + 1e-6) + 1e-6


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(1, 800), min_size=4, max_size=96), hours=st.floats(3, 48))
@example(values=[264.0, 254.0, 251.0, 250.0], hours=3.0)  # a dip within the forecast's error: the guard stops short
def test_carbon_plan_is_no_worse_than_any_start_on_a_fine_grid(values, hours):
    """Brute force: with the safer-start guard off, starting the chosen config at any 5-minute offset never gives
    less carbon; with it on (the default) the plan may give up part of a dip that is within the forecast's error,
    but is never worse on the forecast than starting at once."""
    profile = make_profile(rows=[(250, 100.0, 236.0)])
    spec = make_spec(hours=hours, epochs=2)
    forecast = make_forecast(values)
    for guard_z in ("0", None):
        with _start_guard_z(guard_z):
            plan = plan_job(spec, profile, forecast, NOW)
        latest = hours * 3600 - plan.predicted_duration_s
        offsets = np.array([i * 300.0 for i in range(int(latest // 300) + 1)])
        brute = float(held_window_means(forecast, NOW, offsets, plan.predicted_duration_s).min())
        start_s = (plan.start - NOW).total_seconds()
        chosen = float(held_window_means(forecast, NOW, start_s, plan.predicted_duration_s)[0])
        if guard_z == "0":
            assert chosen <= brute * (1 + 1e-9) + 1e-9, plan.reason
        else:  # the guard may give up part of a dip within the forecast's error, never plan worse than at once
            run_now = float(held_window_means(forecast, NOW, 0.0, plan.predicted_duration_s)[0])
            assert brute * (1 - 1e-9) - 1e-9 <= chosen <= run_now * (1 + 1e-9) + 1e-9, plan.reason


@contextmanager
def _start_guard_z(value: str | None) -> Iterator[None]:
    """``$CARBONFLOW_START_GUARD_Z`` set to ``value`` (None: unset, the default guard) for the block."""
    saved = os.environ.pop(START_GUARD_Z_ENV, None)
    if value is not None:
        os.environ[START_GUARD_Z_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(START_GUARD_Z_ENV, None)
        if saved is not None:
            os.environ[START_GUARD_Z_ENV] = saved


def test_history_correction_changes_the_prediction():
    from carbonflow.planning import JobHistory, RealisedRun

    spec = make_spec()
    profile = make_profile()
    plan = plan_job(spec, profile, make_forecast([200.0] * 96), NOW)
    history = JobHistory(
        [
            RealisedRun(
                job=spec.name,
                config_key=plan.config.key(),
                finished_at=NOW - timedelta(days=d),
                predicted_duration_s=plan.predicted_duration_s,
                realised_duration_s=plan.predicted_duration_s * 1.2,
                predicted_energy_j=plan.predicted_energy_j,
                realised_energy_j=plan.predicted_energy_j * 1.1,
            )
            for d in (1, 2, 3)
        ]
    )
    corrected = plan_job(spec, profile, make_forecast([200.0] * 96), NOW, history)
    same = [a for a in corrected.alternatives if a.config.key() == plan.config.key()] or [corrected]
    assert same[0].predicted_duration_s == pytest.approx(plan.predicted_duration_s * 1.2)
    assert Config(containers=1, power_limit_w=250).key() == "c1-pl250"


def test_batch_size_is_learned_across_recurrences_from_history():
    from carbonflow.planning import JobHistory, RealisedRun, choose_batch_size

    profile = make_profile(batch_sizes=(64, 256), bs_speed={64: 1.0, 256: 3.0})
    spec = make_spec(batch_size=64, batch_sizes=[64, 256], target_metric="accuracy", target_value=0.9, max_slowdown=1)
    # No history: the default batch size first (exploration starts from what the user runs today).
    empty = JobHistory([])
    assert choose_batch_size(spec, profile, empty) == 64
    assert plan_job(spec, profile, make_forecast([200.0] * 96), NOW, empty).config.batch_size == 64

    def run(day: int, bs: int, energy: float, epochs: float) -> RealisedRun:
        return RealisedRun(
            job=spec.name,
            config_key=f"c1-pl250-b{bs}",
            finished_at=NOW - timedelta(days=day),
            predicted_duration_s=0.0,  # not recorded: the fit skips it
            realised_duration_s=0.0,
            predicted_energy_j=energy,
            realised_energy_j=energy,
            batch_size=bs,
            epochs=epochs,
            reached_target=True,
        )

    # 64 converged in 10 epochs; 256 is 3x cheaper per epoch, so even at sqrt(4) = 2x the epochs (the prior for
    # a larger batch) it is predicted cheaper and gets tried next.
    after_one = JobHistory([run(3, 64, 1_000_000.0, 10)])
    assert choose_batch_size(spec, profile, after_one) == 256
    plan = plan_job(spec, profile, make_forecast([200.0] * 96), NOW, after_one)
    assert plan.config.batch_size == 256 and "chosen by the explorer from the job's 1 run" in plan.reason
    # 256 turned out to need 4x the epochs: the explorer goes back to 64.
    after_two = JobHistory([run(3, 64, 1_000_000.0, 10), run(2, 256, 2_500_000.0, 40)])
    assert choose_batch_size(spec, profile, after_two) == 64
    # Not opted in: no learned batch size.
    assert choose_batch_size(make_spec(), profile, after_two) is None


def test_pareto_alternatives_are_non_dominated_and_include_the_choice():
    from carbonflow.planning import pareto_alternatives

    values = [300.0] * 10 + [120.0] * 30 + [300.0] * 56
    plan = plan_job(
        make_spec(max_containers=2, max_slowdown=0.5), make_profile(containers=(1, 2)), make_forecast(values), NOW
    )
    front = pareto_alternatives(plan)
    assert any(a.config.key() == plan.config.key() and a.start == plan.start for a in front)
    triples = [(a.predicted_duration_s, a.predicted_energy_j, a.predicted_emissions_g) for a in front]
    for i, x in enumerate(triples):
        for j, y in enumerate(triples):
            if i != j:
                assert not (
                    all(b <= a for a, b in zip(x, y, strict=True)) and any(b < a for a, b in zip(x, y, strict=True))
                )
    assert front[0].predicted_emissions_g == min(t[2] for t in triples)
    assert len(front) >= 2  # faster two-container runs trade carbon for time


def test_target_trained_job_plans_its_deadline_for_its_most_epochs_not_the_mean():
    from carbonflow.planning.batch_size import DEADLINE_EPOCH_MARGIN, deadline_epochs

    # 500 s per epoch at 250 W; a forecast that is low only in the last half hour pulls the start late.
    profile = make_profile(batch_sizes=(64,))
    forecast = make_forecast([400.0] * 7 + [50.0] + [400.0] * 40)
    spec = make_spec(hours=4.0, epochs=20, batch_size=64, target_metric="accuracy", max_slowdown=0.0)
    history = JobHistory([_target_run(spec.name, d, 64, e) for d, e in ((3, 4.0), (2, 4.0), (1, 6.0))])
    assert deadline_epochs(spec, history, 64) == pytest.approx(DEADLINE_EPOCH_MARGIN * 6.0)
    plan = plan_job(spec, profile, forecast, NOW, history)
    per_epoch_s = plan.predicted_duration_s / (14.0 / 3)  # expected epochs: the mean of 4, 4, 6
    assert plan.start + timedelta(seconds=per_epoch_s * DEADLINE_EPOCH_MARGIN * 6.0) <= spec.finish_by
    # Without the target (a fixed amount of work) the same job would end at the low slot, i.e. start later.
    fixed = plan_job(spec.model_copy(update={"target_metric": None, "epochs": 5}), profile, forecast, NOW, history)
    assert fixed.start > plan.start
    # Fewer than DEADLINE_MIN_RUNS converged runs: the whole budget is planned for.
    assert deadline_epochs(spec, JobHistory(history.records[:2]), 64) == 20.0


def test_a_target_trained_job_no_run_of_which_reached_its_target_says_it_is_predicted_for_its_most_epochs():
    """Finding (user trial): night 1 predicted 2.06 kJ and measured 0.409 kJ: the plan counts the job's `epochs`
    (the most a run may train) until a run reached the target, and did not say that it is an upper bound."""
    profile = make_profile(batch_sizes=(64,))
    spec = make_spec(hours=24.0, epochs=20, batch_size=64, target_metric="accuracy", target_value=0.9)
    for history in (None, JobHistory([])):
        first = plan_job(spec, profile, None, NOW, history)
        assert "predicted for its most epochs (20), an upper bound: no run has reached accuracy >= 0.9 yet" in (
            first.reason
        )
    later = plan_job(spec, profile, None, NOW, JobHistory([_target_run(spec.name, 1, 64, 4.0)]))
    assert "upper bound" not in later.reason and later.predicted_energy_j < first.predicted_energy_j / 2
    assert "upper bound" not in plan_job(spec.model_copy(update={"target_metric": None}), profile, None, NOW).reason


def test_exploration_only_when_an_early_stop_and_a_rerun_still_fit_before_finish_by():
    # 256 is 3x faster per epoch: the explorer wants to try it after three runs of 64 at 10 epochs each.
    profile = make_profile(batch_sizes=(64, 256), bs_speed={64: 1.0, 256: 3.0})

    def spec(hours: float) -> JobSpec:
        return make_spec(
            hours=hours, epochs=20, batch_size=64, batch_sizes=[64, 256], target_metric="accuracy", max_slowdown=1
        )

    # 64 at 250 W: 10 epochs = 5000 s, 236 W → 1.18 MJ per run.
    history = JobHistory([_target_run("job-a", d, 64, 10.0, energy_j=1.18e6) for d in (3, 2, 1)])
    forecast = make_forecast([200.0] * 96)
    roomy = plan_job(spec(6.0), profile, forecast, NOW, history, early_stop=True)
    assert roomy.config.batch_size == 256
    # 3 h, the caller stopping a run at the explorer's threshold and rerunning it: 256's worst case (its
    # 20-epoch budget, 3333 s) plus a rerun at 64 planned for 15 epochs (7500 s) does not fit, although 64
    # alone does: no exploration tonight.
    tight = plan_job(spec(3.0), profile, forecast, NOW, history, early_stop=True)
    assert tight.config.batch_size == 64
    assert "does not fit" in tight.reason
    assert tight.start + timedelta(seconds=7500) <= spec(3.0).finish_by
    # A caller that does not stop runs early: no rerun to reserve for; 256 is planned for its whole budget.
    no_stop = plan_job(spec(3.0), profile, forecast, NOW, history)
    assert no_stop.config.batch_size == 256
    assert no_stop.start + timedelta(seconds=20 * 50_000 / 300.0) <= spec(3.0).finish_by


def test_a_configuration_without_room_for_its_most_epochs_is_left_out_while_another_has_it():
    profile = make_profile(batch_sizes=(64,))  # 50,000 samples per epoch; 175 W is the least energy per sample
    spec = make_spec(hours=5000 / 3600, epochs=10, batch_size=64, target_metric="accuracy", objective="energy")
    spec = spec.model_copy(update={"max_slowdown": 1.0})
    history = JobHistory([_target_run(spec.name, d, 64, e) for d, e in ((3, 4.0), (2, 4.0), (1, 6.0))])
    # 9 epochs (1.5 x 6) at 175 W take 5357 s > 5000 s; at 200 W 4839 s: 200 W it is, although 175 W's
    # expected 4.67 epochs would fit.
    plan = plan_job(spec, profile, None, NOW, history)
    assert plan.config.power_limit_w == 200
    assert plan.start + timedelta(seconds=9 * 50_000 / 93.0) <= spec.finish_by
    left_out = [a for a in plan.alternatives if a.config.power_limit_w == 175]
    assert left_out and not left_out[0].feasible and "no room" in (left_out[0].why_not or "")


def test_a_start_now_kept_over_a_lower_window_within_the_error_says_why():
    """User trial, night 2: the plan started at once ("saving 0.0 %") while its forecast.png showed a clear dip
    later; the reason gave no explanation. A dip within the forecast's error at its lead is named, with the
    saving it would have promised by the raw forecast, and a deep dip is still taken (no such note)."""
    values = [200.0] * 96
    for i in range(14, 22):  # 7-11 h ahead, 8 % lower: within the calibrated error of that lead
        values[i] = 184.0
    plan = plan_job(make_spec(), make_profile(), make_forecast(values), NOW)
    assert plan.start == NOW
    assert "lower window, start" in plan.reason and "within its error" in plan.reason
    assert "safer choice" in plan.reason
    deep = [200.0] * 96
    for i in range(14, 22):
        deep[i] = 80.0
    taken = plan_job(make_spec(), make_profile(), make_forecast(deep), NOW)
    assert taken.start > NOW and "safer choice" not in taken.reason
