"""The explorer's belief over epochs to target per batch size, and its knowledge-gradient choice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from carbonflow.planning import BatchSizeExplorer
from carbonflow.planning.batch_size import knowledge_gradient
from carbonflow.planning.epochs_curve import NOISE_SD_PRIOR, EpochsCurve


def test_runs_at_a_batch_size_pull_its_belief_to_them_and_tell_its_neighbours_more_than_far_ones():
    curve = EpochsCurve(256, {256: [20.0, 21.0, 22.0, 20.0]})
    assert curve.expected_epochs(256) == pytest.approx(20.75, rel=0.03)
    mean, cov = curve.posterior([256, 512, 8192])
    sd = np.sqrt(np.diag(cov))
    assert sd[0] < sd[1] < sd[2]  # the further from what ran, the less is known
    assert math.exp(mean[1]) > 20.75  # a larger batch size is believed to need more epochs (the prior slope)


def test_the_run_noise_is_pooled_from_repeated_runs_and_shrunk_toward_its_prior():
    assert EpochsCurve(32, {32: [4.0]}).noise_var == pytest.approx(NOISE_SD_PRIOR**2)
    spread = EpochsCurve(32, {32: [4.0, 5.0] * 10, 16: [4.0, 5.0] * 10}).noise_var
    assert spread > NOISE_SD_PRIOR**2  # 4-or-5 epochs is a wide spread in log terms
    assert EpochsCurve(32, {32: [4.0] * 20}).noise_var < NOISE_SD_PRIOR**2


def test_a_run_stopped_short_of_the_target_raises_the_belief_beyond_the_epochs_it_ran():
    seen = {1024: [70.0, 74.0]}
    before = EpochsCurve(1024, seen).expected_epochs(2048)
    after = EpochsCurve(1024, seen, censored={2048: [150.0]}).expected_epochs(2048)
    assert before < 150.0 < after


def test_knowledge_gradient_is_zero_for_a_known_arm_and_grows_with_what_a_run_could_change():
    cost = np.array([1.0, 1.0])
    mean = np.array([math.log(10.0), math.log(10.5)])
    assert knowledge_gradient(cost, mean, np.zeros((2, 2)), 1e-6, 1) == pytest.approx(0.0, abs=1e-6)
    narrow = knowledge_gradient(cost, mean, np.diag([0.0, 0.01]), 0.01, 1)
    wide = knowledge_gradient(cost, mean, np.diag([0.0, 0.09]), 0.01, 1)
    assert 0.0 < narrow < wide


def test_the_explorer_stops_exploring_as_the_horizon_ends():
    # 128 is untried and might be cheaper (its epoch is 10 % cheaper); with many recurrences left the explorer
    # tries it, with one left it runs what it knows.
    per_epoch = {64: 3.0, 128: 2.7}

    def explorer(horizon: int) -> BatchSizeExplorer:
        e = BatchSizeExplorer(list(per_epoch), 64, per_epoch, horizon=horizon)
        for _ in range(3):
            e.observe(64, 30.0, True, 10.0)
        return e

    assert explorer(100).choose() == 128
    assert explorer(4).choose() == 64


def test_an_exploratory_run_stops_once_what_it_still_needs_costs_more_than_a_fresh_best_run():
    # 512 is probed 10 % cheaper per epoch than 256 (the best): a run there that has not reached the target
    # after 1.5 x the best cost is expected to need only a little more, and goes on; 32, whose epoch costs
    # 4 x more, is stopped where its remaining epochs outweigh a fresh run at 256.
    per_epoch = {32: 8.0, 64: 4.0, 128: 2.2, 256: 2.0, 512: 1.8}
    explorer = BatchSizeExplorer(list(per_epoch), 256, per_epoch, horizon=100)
    for epochs in (20.0, 21.0, 20.0):
        explorer.observe(256, 2.0 * epochs, True, epochs)
    explorer.observe(128, 2.2 * 20.0, True, 20.0)
    explorer.observe(64, 4.0 * 22.0, True, 22.0)
    best = explorer.best_mean()[1]
    assert explorer.stop_threshold(512) > 1.5 * best
    assert best <= explorer.stop_threshold(32) < 1.5 * best
    assert explorer.stop_threshold(256) == pytest.approx(explorer.beta * best)  # a known batch size: Zeus's beta


def test_the_mean_residual_of_a_lognormal_run():
    from carbonflow.planning.batch_size import LogNormal

    epochs = LogNormal(math.log(10.0), 0.1)
    assert epochs.mean_residual(0.0) == pytest.approx(10.0 * math.exp(0.005))
    assert epochs.mean_residual(5.0) == pytest.approx(10.05 - 5.0, rel=1e-3)  # surely not yet: all of it to come
    assert 0.0 < epochs.mean_residual(12.0) < 2.0  # past the mean, a little more
    assert LogNormal(math.log(10.0), 0.0).mean_residual(4.0) == pytest.approx(6.0)


def test_before_any_run_reached_the_target_no_batch_size_has_a_predicted_number_of_epochs():
    # A user trial: night 1 of a target-trained job was predicted for 7.6 epochs (the curve's uninformative level)
    # instead of its epoch budget; nothing is known of epochs to target until a run reaches it.
    explorer = BatchSizeExplorer([32, 64], 64, {32: 2.0, 64: 1.0}, horizon=10)
    assert explorer.predicted_epochs(64) == math.inf and explorer.predicted_cost(32) == math.inf
    explorer.observe(64, 30.0, False, 30.0)  # stopped: still no level
    assert explorer.predicted_epochs(32) == math.inf
    explorer.observe(64, 20.0, True, 20.0)
    assert math.isfinite(explorer.predicted_epochs(32))
