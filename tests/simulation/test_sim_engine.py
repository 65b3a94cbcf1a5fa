"""The event-driven engine and the planner-backed policies, on small hand-made clusters."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from carbonflow.planning import choose_power_limit, pair_timeline
from carbonflow.simulation import (
    CarbonGrid,
    ClusterSpec,
    DeviceModel,
    Experiment,
    FifoPolicy,
    JobTrace,
    PlannerPolicy,
    SimulationError,
    constant_grid,
    load_pair_table,
    relative_to,
    simulate,
    standard_policies,
    synthetic_trace,
)
from carbonflow.simulation.families import derive_families

ORIGIN = datetime(2020, 3, 2, tzinfo=UTC)
PAIRS = load_pair_table()
DEVICES = DeviceModel.for_pairs(PAIRS, shared_power_factor=1.2)
R50 = PAIRS.index("ResNet-50 (batch size 64)")
R18 = PAIRS.index("ResNet-18 (batch size 32)")


def make_trace(submit: list[float], duration: list[float], gpus: list[int], vc: list[int] | None = None) -> JobTrace:
    return JobTrace(
        origin=ORIGIN,
        submit_s=np.asarray(submit, dtype=float),
        duration_s=np.asarray(duration, dtype=float),
        num_gpus=np.asarray(gpus, dtype=np.int64),
        vc=np.asarray(vc or [0] * len(submit), dtype=np.int64),
        vc_names=["vc0", "vc1"],
        source="test",
    )


def experiment(trace: JobTrace, gpus: int, types: list[int] | int, grid: CarbonGrid | None = None, **cl) -> Experiment:
    exp = Experiment.build(trace, PAIRS, DEVICES, grid or constant_grid(200.0), ClusterSpec(gpus=gpus, **cl))
    exp.job_type = np.full(len(trace), types) if isinstance(types, int) else np.asarray(types)
    return exp


def test_fifo_replays_the_trace_exactly_when_nothing_queues() -> None:
    exp = experiment(make_trace([0, 100, 200], [1000, 50, 300], [1, 2, 1]), gpus=8, types=R50)
    r = simulate(exp.context(), FifoPolicy())
    assert r.start_s.tolist() == [0, 100, 200]
    assert r.end_s.tolist() == [1000, 150, 500]
    p = DEVICES.solo(R50, DEVICES.default_power_limit_w)[0]
    assert r.energy_j == pytest.approx(p * (1000 + 2 * 50 + 300))
    assert r.emissions_g == pytest.approx(r.energy_j / 3.6e6 * 200.0)
    s = r.summary()
    assert s["deadline_misses"] == 0 and s["colocated_jobs"] == 0 and s["mean_queue_s"] == 0


def test_fifo_is_strict_a_blocked_multi_gpu_head_holds_later_jobs() -> None:
    # 2 GPUs: job0 takes 1; job1 wants 2 and waits; job2 (1 GPU) must wait behind job1 although a GPU is free
    exp = experiment(make_trace([0, 10, 20], [100, 50, 10], [1, 2, 1]), gpus=2, types=R50)
    r = simulate(exp.context(), FifoPolicy())
    assert r.start_s.tolist() == [0, 100, 150]
    assert r.end_s.tolist() == [100, 150, 160]
    assert r.summary()["mean_queue_s"] == pytest.approx((0 + 90 + 130) / 3)


def test_deadline_misses_are_counted() -> None:
    exp = experiment(make_trace([0, 0], [1000, 1000], [1, 1]), gpus=1, types=R50, deadline_slack_s=0.0)
    r = simulate(exp.context(), FifoPolicy())
    assert r.end_s.tolist() == [1000, 2000]
    assert r.summary()["deadline_misses"] == 1  # the second finishes at 2000 > 0 + 1.1 x 1000


def test_job_larger_than_the_cluster_is_refused() -> None:
    exp = experiment(make_trace([0], [10], [4]), gpus=2, types=R50)
    with pytest.raises(SimulationError, match="num_gpus=4"):
        simulate(exp.context(), FifoPolicy())
    with pytest.raises(SimulationError, match="gpus=0"):
        ClusterSpec(gpus=0)


class AlwaysPair(FifoPolicy):
    """Test policy: pair every single-GPU job with any running one (no guard)."""

    name = "always-pair"
    colocate = True

    def choose_partner(self, job, candidates, free_gpus, now_s):
        return next(iter(candidates.values()))


def test_colocated_pair_runs_at_gavel_speeds_and_draws_shared_power() -> None:
    exp = experiment(make_trace([0, 0], [1000, 400], [1, 1]), gpus=1, types=[R50, R18])
    r = simulate(exp.context(), AlwaysPair())
    ka, kb = PAIRS.keep[R50, R18], PAIRS.keep[R18, R50]
    tl = pair_timeline(1000, 400, ka, kb)
    assert r.end_s[1] == pytest.approx(tl.total_b_s)
    assert r.end_s[0] == pytest.approx(tl.total_a_s)
    lim = DEVICES.default_power_limit_w
    pa, pb = DEVICES.solo(R50, lim)[0], DEVICES.solo(R18, lim)[0]
    expected = DEVICES.shared_power_w(pa, pb, lim) * tl.overlap_s + pa * tl.tail_s
    assert r.energy_j == pytest.approx(expected)
    assert r.colocated.tolist() == [True, True]
    assert r.busy_gpu_s == pytest.approx(tl.device_s)


def test_unrunnable_pair_is_never_placed() -> None:
    bad = next((a, b) for a in range(len(PAIRS)) for b in range(len(PAIRS)) if not PAIRS.runnable(a, b))
    exp = experiment(make_trace([0, 0], [100, 100], [1, 1]), gpus=1, types=[bad[0], bad[1]])
    r = simulate(exp.context(), AlwaysPair())
    assert r.start_s.tolist() == [0, 100]  # the second waits for the GPU instead of crashing next to the first
    assert not r.colocated.any()


def recurring_trace(n: int, gap_s: float, duration_s: float, gpus: int = 1) -> JobTrace:
    return make_trace([i * gap_s for i in range(n)], [duration_s] * n, [gpus] * n)


def test_power_limit_policy_uses_the_planner_from_the_second_recurrence() -> None:
    exp = experiment(recurring_trace(3, 10_000, 1000), gpus=4, types=R50)
    r = simulate(exp.context(), PlannerPolicy("pl", power_limit=True))
    limits = DEVICES.power_limits_w
    curve = [DEVICES.solo(R50, lim) for lim in limits]
    chosen = choose_power_limit(
        limits, [s for _, s in curve], [p for p, _ in curve], max_slowdown=0.10, default_power_limit_w=limits[-1]
    )
    assert chosen < DEVICES.default_power_limit_w  # the Zeus curve makes a lower limit pay off
    assert r.power_limit_w.tolist() == [DEVICES.default_power_limit_w, chosen, chosen]
    slow = DEVICES.solo(R50, chosen)[1]
    assert r.end_s[1] - r.start_s[1] == pytest.approx(1000 * slow)
    assert slow <= 1.10 + 1e-9
    fifo = simulate(exp.context(), FifoPolicy())
    assert r.energy_j < fifo.energy_j


def test_colocation_policy_respects_the_slowdown_guard() -> None:
    # long R50 jobs of one family (each runs alone), then short R18 jobs of another family arriving during them
    trace = make_trace(
        [0, 20_000, 40_000, 41_000, 45_000, 49_000],
        [10_000, 10_000, 10_000, 500, 500, 500],
        [1] * 6,
        vc=[0, 0, 0, 1, 1, 1],
    )
    exp = experiment(trace, gpus=4, types=[R50, R50, R50, R18, R18, R18])
    strict = simulate(exp.context(), PlannerPolicy("co", colocate=True, max_slowdown=0.10))
    loose = simulate(exp.context(), PlannerPolicy("co", colocate=True, max_slowdown=3.0))
    fifo = simulate(exp.context(), FifoPolicy())
    for r in (strict, loose):
        solo_s = np.asarray(exp.trace.duration_s)
        slowdown = (r.end_s - r.start_s) / solo_s - 1
        assert not r.colocated[:2].any() and not r.colocated[3]  # first recurrences and no history: alone
        if r is strict:
            assert np.all(slowdown <= 0.10 + 1e-9)
    assert loose.colocated.sum() >= strict.colocated.sum()
    assert loose.colocated[2] and loose.colocated[4]
    assert loose.energy_j < fifo.energy_j  # sharing did more work per joule than separate GPUs


def test_carbon_shift_defers_a_recurring_job_to_the_clean_slot() -> None:
    # dirty for 2 hours after each job arrives, then clean: hourly series 500, 500, 100, ...
    values = np.array([500.0, 500.0, 100.0, 100.0] * 6)
    grid = CarbonGrid(ORIGIN, 3600.0, values, "X", "average-lifecycle", "test", origin=ORIGIN)
    trace = recurring_trace(3, 4 * 3600.0, 1800.0)
    exp = experiment(trace, gpus=2, types=R50, grid=grid)
    r = simulate(exp.context(), PlannerPolicy("shift", shift=True, objective="carbon"))
    assert r.release_s[0] == 0.0  # first recurrence: nothing known about its duration
    assert r.release_s[1] >= trace.submit_s[1] + 2 * 3600.0 - 1e-6
    assert r.summary()["deadline_misses"] == 0
    fifo = simulate(exp.context(), FifoPolicy())
    assert r.emissions_g < fifo.emissions_g
    assert r.energy_j == pytest.approx(fifo.energy_j)


def test_joint_policy_on_a_synthetic_cluster_saves_energy_without_missing_deadlines() -> None:
    rng = np.random.default_rng(0)
    n = 400
    base = make_trace(
        list(np.cumsum(rng.exponential(300.0, n))),
        list(rng.choice([600.0, 1800.0, 5400.0], n)),
        list(rng.choice([1, 1, 1, 2], n)),
        list(rng.integers(0, 2, n)),
    )
    exp = Experiment.build(base, PAIRS, DEVICES, constant_grid(300.0), ClusterSpec(gpus=40))
    rows = {p.name: exp.run(p).summary() for p in standard_policies()}
    fifo = rows["fifo"]
    cf = relative_to(rows["carbonflow"], fifo)
    assert rows["fifo"]["deadline_misses"] == 0
    assert rows["carbonflow"]["deadline_misses"] == 0
    assert cf["energy_reduction_vs_fifo"] > 0.05
    assert rows["carbonflow"]["energy_j"] <= min(rows["power-limit"]["energy_j"], rows["colocation"]["energy_j"]) * 1.01
    # a flat grid gives shifting nothing to gain: the carbon-only policy changes nothing
    assert rows["carbon-shift"]["emissions_g"] == pytest.approx(fifo["emissions_g"], rel=1e-9)


def test_multi_gpu_sharing_is_only_an_explicit_extrapolation() -> None:
    trace = make_trace([0, 0], [1000, 400], [2, 2])
    exp = experiment(trace, gpus=2, types=[R50, R18])
    off = simulate(exp.context(), AlwaysPair())
    on = simulate(exp.context(replace(exp.cluster, colocate_multi_gpu=True)), AlwaysPair())
    assert not off.colocated.any() and off.start_s.tolist() == [0, 1000]
    assert on.colocated.all() and on.start_s.tolist() == [0, 0]
    tl = pair_timeline(1000, 400, PAIRS.keep[R50, R18], PAIRS.keep[R18, R50])
    assert on.end_s[1] == pytest.approx(tl.total_b_s)


def test_cost_is_about_linear_in_jobs() -> None:
    base = make_trace(list(np.arange(200) * 60.0), list(np.linspace(60, 6000, 200)), [1, 2, 1, 4] * 50)
    times = []
    for n in (5_000, 20_000):
        trace = synthetic_trace(base, n, seed=2)
        exp = Experiment.build(trace, PAIRS, DEVICES, constant_grid(100.0), ClusterSpec(gpus=64))
        derive_families(trace)
        r = exp.run(FifoPolicy())
        assert r.result.summary()["jobs"] == n
        times.append(r.seconds / n)
    assert times[1] < times[0] * 3  # per-job cost does not grow with the number of jobs (generous for noise)
