"""Capacity-aware bounds: caps only while nobody waits, sharing weighed against waiting, deferral budgets."""

from __future__ import annotations

import pytest

from carbonflow.planning import (
    CapacityLedger,
    ClusterLoad,
    deferral_budget_s,
    partner_slowdown_bound,
    power_limit_under_load,
    power_limit_with_delay_cost,
    waiting_slowdown_bound,
)


def test_power_cap_only_while_nobody_waits() -> None:
    idle = ClusterLoad(queued_jobs=0, free_gpus=10, total_gpus=16)
    busy = ClusterLoad(queued_jobs=3, free_gpus=0, total_gpus=16)
    assert power_limit_under_load(150.0, 250.0, idle) == 150.0
    assert power_limit_under_load(150.0, 250.0, busy) == 250.0
    # too little headroom: the next arrival would wait, so no cap either
    assert power_limit_under_load(150.0, 250.0, idle, headroom_gpus=11) == 250.0
    assert power_limit_under_load(150.0, 250.0, idle, headroom_gpus=10) == 150.0
    with pytest.raises(ValueError, match="headroom_gpus=-1"):
        power_limit_under_load(150.0, 250.0, idle, headroom_gpus=-1)
    with pytest.raises(ValueError, match="free_gpus=17"):
        ClusterLoad(queued_jobs=0, free_gpus=17, total_gpus=16)


def test_waiting_slowdown_bound_weighs_sharing_against_waiting() -> None:
    assert waiting_slowdown_bound(3600.0, 0.0, 0.1) == pytest.approx(0.1)
    # waiting 1 h for a 1 h run: sharing may take it up to 1.1 x 2 h
    assert waiting_slowdown_bound(3600.0, 3600.0, 0.1) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="predicted_run_s=0"):
        waiting_slowdown_bound(0.0, 10.0, 0.1)


def test_partner_bound_is_the_tighter_of_budget_and_deadline() -> None:
    # ran 1 h of a predicted 2 h; 1 h left alone; budget (1.1 x 2 h - 1 h) / 1 h - 1 = 0.2
    assert partner_slowdown_bound(3600.0, 3600.0, 7200.0, 0.1, 10 * 3600.0) == pytest.approx(0.2)
    assert partner_slowdown_bound(3600.0, 3600.0, 7200.0, 0.1, 10 * 3600.0, congestion_slowdown=0.5) == (
        pytest.approx(1.2)
    )
    # the deadline is 1.5 h away: at most 50 % slower whatever the budget
    assert partner_slowdown_bound(3600.0, 3600.0, 7200.0, 0.1, 5400.0, congestion_slowdown=0.5) == (pytest.approx(0.5))


def test_deferral_budget_is_a_fraction_of_the_expected_completion_time() -> None:
    assert deferral_budget_s(3600.0, 0.032) == pytest.approx(115.2)
    assert deferral_budget_s(3600.0, 0.032, expected_queue_s=3600.0) == pytest.approx(230.4)
    assert deferral_budget_s(3600.0, 0.0) == 0.0
    with pytest.raises(ValueError, match=r"max_jct_increase=-0\.1"):
        deferral_budget_s(3600.0, -0.1)


def test_ledger_books_and_releases_capacity() -> None:
    ledger = CapacityLedger(total_gpus=8, slot_s=900.0, horizon_s=86400.0)
    assert ledger.fits(0.0, 3600.0, 8)
    ledger.add(900.0, 2700.0, 6)
    assert ledger.peak_gpus(0.0, 900.0) == 0
    assert ledger.peak_gpus(0.0, 3600.0) == 6
    assert not ledger.fits(1800.0, 3600.0, 3)
    assert ledger.fits(2700.0, 3600.0, 8)
    ledger.remove(900.0, 2700.0, 6)
    assert ledger.peak_gpus(0.0, 86400.0) == 0
    # beyond the horizon: clipped to the last slot, never an error
    ledger.add(2 * 86400.0, 3 * 86400.0, 2)
    assert ledger.peak_gpus(86400.0 - 1, 4 * 86400.0) == 2
    with pytest.raises(ValueError, match="total_gpus=0"):
        CapacityLedger(total_gpus=0)


def test_a_price_on_time_caps_many_gpu_jobs_harder_and_nobody_while_others_wait() -> None:
    limits = [150.0, 200.0, 250.0]
    slow = [1.10, 1.04, 1.0]
    power = [150.0, 190.0, 220.0]  # energy per default-second: 165, 197.6, 220
    idle = ClusterLoad(queued_jobs=0, free_gpus=4, total_gpus=8)
    busy = ClusterLoad(queued_jobs=2, free_gpus=0, total_gpus=8)
    # no price on time: the least energy within the slowdown bound
    assert power_limit_with_delay_cost(limits, slow, power, 1, 0.0, 0.1) == 150.0
    assert power_limit_with_delay_cost(limits, slow, power, 1, 0.0, 0.05) == 200.0
    # 1 GPU at 600 W per second of its delay: 165 + 660 > 197.6 + 624 > 220 + 600 -> the default
    assert power_limit_with_delay_cost(limits, slow, power, 1, 600.0, 0.1) == 250.0
    # the same price on an 8-GPU job: 8 x 165 + 660 = 1980 < 8 x 197.6 + 624 < 8 x 220 + 600 -> capped
    assert power_limit_with_delay_cost(limits, slow, power, 8, 600.0, 0.1) == 150.0
    # while others wait: the fastest limit (infinite queue price), or priced per GPU held
    assert power_limit_with_delay_cost(limits, slow, power, 8, 0.0, 0.1, busy) == 250.0
    assert power_limit_with_delay_cost(limits, slow, power, 8, 0.0, 0.1, idle) == 150.0
    assert power_limit_with_delay_cost(limits, slow, power, 8, 0.0, 0.1, busy, queue_cost_w_per_gpu=10.0) == 150.0
    assert power_limit_with_delay_cost(limits, slow, power, 8, 0.0, 0.1, busy, queue_cost_w_per_gpu=1000.0) == 250.0
    with pytest.raises(ValueError, match="gpus=0"):
        power_limit_with_delay_cost(limits, slow, power, 0, 0.0, 0.1)
    with pytest.raises(ValueError, match="equal length"):
        power_limit_with_delay_cost(limits, slow[:2], power, 1, 0.0, 0.1)
