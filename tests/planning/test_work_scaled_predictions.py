"""Issue 24 finding: "A 2-epoch on-demand run predicted more energy than the same job's 15 epochs."

A job trained nightly on one amount of work cannot tell its fixed costs from its per-sample ones; the whole excess
over a profile whose energy per sample was low (a window too short, energy over the process life) became a
"fixed" part, so any amount of work was predicted at the nightly energy. Now the fixed energy is at most the fixed
time at the training's power (:func:`carbonflow.planning.learning.cap_fixed_energy`) and the rest scales with
tonight's work."""

from __future__ import annotations

from datetime import timedelta

import pytest

from carbonflow.planning import JobHistory, RealisedRun, plan_job
from carbonflow.planning.learning import cap_fixed_energy
from tests.planning.planning_factories import NOW, V100_LIKE, make_profile, make_spec

SAMPLES_PER_EPOCH = 100  # a small job: 15 epochs are 15 s of steps next to 5 s of start-up
START_UP_S, START_UP_W = 5.0, 20.0  # process start and data loading: the GPU idles, the CPU works


def true_cost(config_key: str, epochs: int) -> tuple[float, float]:
    """What the simulated job really costs: start-up, then the V100-like per-sample figures."""
    limit = float(config_key.split("-pl")[1])
    _, speed, power_w = next(r for r in V100_LIKE if r[0] == limit)
    steps_s = epochs * SAMPLES_PER_EPOCH / speed
    return START_UP_S + steps_s, START_UP_S * START_UP_W + steps_s * power_w


def nightly_history(profile, nights: int = 3) -> JobHistory:
    history = JobHistory([])
    for night in range(nights):
        spec = make_spec(epochs=15, hours=12 + 24 * night, objective="energy")
        plan = plan_job(spec, profile, None, NOW + timedelta(days=night), history)
        duration_s, energy_j = true_cost(plan.config.key(), 15)
        history.add(RealisedRun(
            job=plan.job, config_key=plan.config.key(), finished_at=NOW + timedelta(days=night, hours=1),
            predicted_duration_s=plan.predicted_duration_s, realised_duration_s=duration_s,
            predicted_energy_j=plan.predicted_energy_j, realised_energy_j=energy_j,
            power_limit_w=plan.config.power_limit_w, epochs=15, samples=15 * SAMPLES_PER_EPOCH,
        ))  # fmt: skip
    return history


@pytest.mark.parametrize("profile_power_scale", [1.0, 0.1], ids=["right profile", "profile 10x low in energy"])
def test_a_2_epoch_on_demand_run_predicts_about_2_15_of_the_nightly_energy(profile_power_scale):
    rows = [(limit, speed, power_w * profile_power_scale) for limit, speed, power_w in V100_LIKE]
    profile = make_profile(rows=rows, samples_per_epoch=SAMPLES_PER_EPOCH)
    history = nightly_history(profile)
    nightly_j = history.records[-1].realised_energy_j
    on_demand = make_spec(epochs=2, hours=12 + 24 * 3, objective="energy")
    plan = plan_job(on_demand, profile, None, NOW + timedelta(days=3), history)
    _, true_j = true_cost(plan.config.key(), 2)
    assert plan.predicted_energy_j < 0.3 * nightly_j  # was 0.9-1.0 × the nightly energy with the low profile
    assert plan.predicted_energy_j == pytest.approx(2 / 15 * nightly_j, rel=0.25)  # about 2/15 (start-up aside)
    assert plan.predicted_energy_j == pytest.approx(true_j, rel=0.05)  # and what 2 epochs really cost
    nightly_again = plan_job(make_spec(epochs=15, hours=12 + 24 * 3, objective="energy"), profile, None,
                             NOW + timedelta(days=3), history)  # fmt: skip
    assert nightly_again.predicted_energy_j == pytest.approx(nightly_j, rel=0.02)  # the nightly stays right


def test_cap_fixed_energy_by_hand():
    # profile: 15 s at 2.36 W (10x low), realised 3640 J after 5 s of fixed time: at most 5 s x 2.36 W is fixed
    fixed_j, factor = cap_fixed_energy([(15.0, 35.4)], [3640.0], 5.0, (3604.6, 1.0))
    assert fixed_j == pytest.approx(5 * 2.36) and factor == pytest.approx((3640.0 - 11.8) / 35.4)
    # a fixed part within the cap is kept as fitted
    assert cap_fixed_energy([(15.0, 3540.0)], [3640.0], 5.0, (100.0, 1.0)) == (100.0, 1.0)
