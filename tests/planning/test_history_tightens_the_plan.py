"""What the planner learns from a job's own runs: deadline margins that tighten as history accumulates, epochs
to target from a long window, co-located runs counted at their solo cost, and co-location judged on the same
robust posterior as the solo plans."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from planning_factories import NOW, make_forecast, make_profile, make_spec
from planning_factories import make_target_run as _run

from carbonflow.carbon.windows import held_window_means, search_starts
from carbonflow.domain import ForecastPoint
from carbonflow.planning import JobHistory
from carbonflow.planning.batch_size import (
    DEADLINE_EPOCH_MARGIN,
    DEADLINE_MARGIN_FLOOR,
    batch_size_explorer,
    deadline_epochs,
    deadline_margin,
    expected_epochs,
)


def test_the_deadline_margin_tightens_by_hand_as_runs_accumulate():
    # 1.5 up to 30 runs, then 1 + 0.5 * 30 / n, floored at 1.1
    assert deadline_margin(3) == pytest.approx(DEADLINE_EPOCH_MARGIN) == pytest.approx(1.5)
    assert deadline_margin(30) == pytest.approx(1.5)
    assert deadline_margin(60) == pytest.approx(1.25)
    assert deadline_margin(100) == pytest.approx(1.15)
    assert deadline_margin(150) == pytest.approx(DEADLINE_MARGIN_FLOOR) == pytest.approx(1.1)
    assert deadline_margin(1000) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="runs=0"):
        deadline_margin(0)


def test_a_rare_long_run_stays_in_view_beyond_the_drift_window():
    # 80 runs at batch 64: one needed 5 epochs (the 70th latest), the others 4. The 10-run drift window would
    # forget it; the deadline keeps room for 5 epochs x the margin of 80 runs (1 + 0.5 * 30 / 80).
    spec = make_spec(epochs=20, batch_size=64, target_metric="accuracy")
    epochs = [4.0] * 80
    epochs[10] = 5.0
    history = JobHistory([_run(spec.name, 90 - i, 64, e) for i, e in enumerate(epochs)])
    assert deadline_epochs(spec, history, 64) == pytest.approx(5.0 * 1.1875)
    assert history.epochs_to_target(spec.name, 64) == pytest.approx(4.0)  # the drift window's mean: blind to it
    # Epochs to target are predicted from the last 40 runs (EPOCHS_HISTORY_RUNS): the unlucky streak of a batch
    # size left behind is diluted, not frozen in a 10-run window.
    streak = JobHistory([_run(spec.name, 50 - i, 64, 5.0 if i >= 30 else 4.0) for i in range(40)])
    assert streak.epochs_to_target(spec.name, 64) == pytest.approx(5.0)
    assert expected_epochs(streak, spec.name, 64) == pytest.approx(4.25)


def test_a_colocated_run_counts_at_its_configurations_solo_cost_in_the_explorer():
    profile = make_profile(batch_sizes=(64, 128), bs_speed={64: 1.0, 128: 1.25})
    spec = make_spec(epochs=10, batch_size=64, batch_sizes=[64, 128], target_metric="accuracy")
    solo = _run(spec.name, 2, 64, 4.0, energy_j=9e6, power_limit_w=250.0)
    shared = _run(spec.name, 1, 64, 4.0, energy_j=1.0, power_limit_w=250.0, colocated_with=("other",))
    explorer = batch_size_explorer(spec, profile, JobHistory([solo, shared]))
    assert explorer is not None
    # 250 W profile point of batch 64: 236 W at 100 samples/s, 50 000 samples per epoch, 4 epochs
    assert explorer.arms[64].costs == [pytest.approx(9e6), pytest.approx(236.0 / 100.0 * 50_000 * 4)]


def test_a_windows_posterior_is_the_one_the_start_search_ranks_by():
    # A forecast flat at 300 except a dip at 02:00-04:00; the last 10 days' actuals dip at 22:00-24:00 instead.
    fc = make_forecast([300.0] * 16 + [150.0] * 4 + [300.0] * 28, slot_s=1800.0)
    history = [
        ForecastPoint(
            start=NOW - timedelta(days=d) + timedelta(hours=h),
            length_s=3600.0,
            gco2_per_kwh=150.0 if h in (4, 5) else 300.0,
        )
        for d in range(1, 11)
        for h in range(24)
        if NOW - timedelta(days=d) + timedelta(hours=h + 1) <= NOW
    ]
    found = search_starts(fc, [3 * 3600.0], NOW, [21 * 3600.0], history=history, hold_edges=True, guard_z=0.0)
    assert found.shrunk_slots > 0
    post = held_window_means(fc, NOW, found.start_s, 3 * 3600.0, history=history)
    np.testing.assert_allclose(post, found.score_gco2_per_kwh, rtol=1e-9)
    raw = held_window_means(fc, NOW, found.start_s, 3 * 3600.0)
    np.testing.assert_allclose(raw, found.mean_gco2_per_kwh, rtol=1e-9)
    assert not np.allclose(post, raw)  # the history moved the ranking


def test_the_explorer_has_every_candidate_batch_size_and_the_jobs_recurrences_as_its_horizon():
    # Only batch 64 is profiled: 32 and 128 are arms without a prior, waiting for a probe (unprofiled); the job's
    # declared recurrences are the horizon its knowledge gradient and its budget count over.
    profile = make_profile(batch_sizes=(64,))
    spec = make_spec(epochs=10, batch_size=64, batch_sizes=[32, 128], target_metric="accuracy", recurrences=90)
    explorer = batch_size_explorer(spec, profile, JobHistory([_run(spec.name, 1, 64, 4.0, energy_j=9e6)]))
    assert explorer is not None and sorted(explorer.arms) == [32, 64, 128] and explorer.horizon == 90
    assert sorted(explorer.prior_cost_per_epoch) == [64] and explorer.candidates() == [64]
    assert explorer.unprofiled() == [32, 128]
    without = batch_size_explorer(spec.model_copy(update={"recurrences": None}), profile, JobHistory([]))
    assert without is not None and without.horizon is None
