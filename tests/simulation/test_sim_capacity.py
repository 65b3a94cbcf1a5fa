"""Capacity-aware policy in the engine (power re-tuned when a queue forms) and the server-level accounting."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from carbonflow.simulation import (
    ClusterSpec,
    DeviceModel,
    Experiment,
    FifoPolicy,
    JobTrace,
    PlannerPolicy,
    constant_grid,
    load_pair_table,
    simulate,
    standard_policies,
)
from carbonflow.simulation.nodes import NodeModel, node_accounting

PAIRS = load_pair_table()
DEVICES = DeviceModel.for_pairs(PAIRS)
R50 = PAIRS.index("ResNet-50 (batch size 64)")
ORIGIN = datetime(2020, 3, 2, tzinfo=UTC)


def _exp(submit: list[float], duration: list[float], gpus: list[int], cluster_gpus: int) -> Experiment:
    trace = JobTrace(
        origin=ORIGIN,
        submit_s=np.asarray(submit, dtype=float),
        duration_s=np.asarray(duration, dtype=float),
        num_gpus=np.asarray(gpus, dtype=np.int64),
        vc=np.zeros(len(submit), dtype=np.int64),
        vc_names=["vc0"],
        source="test",
    )
    exp = Experiment.build(trace, PAIRS, DEVICES, constant_grid(100.0), ClusterSpec(gpus=cluster_gpus))
    exp.job_type = np.full(len(trace), R50)
    return exp


def test_a_capped_job_runs_at_full_power_once_a_queue_forms() -> None:
    # job 0 profiles the family; job 1 starts capped on an idle cluster; job 2 arrives at 2500 s and waits
    exp = _exp([0.0, 2000.0, 2500.0], [1000.0, 1000.0, 1000.0], [1, 1, 1], cluster_gpus=1)
    pol = PlannerPolicy("cap", power_limit=True, capacity_aware=True)
    r = simulate(exp.context(), pol)
    cap_w = pol.limit_by_type[R50]
    default_w = DEVICES.default_power_limit_w
    assert cap_w < default_w
    p_cap, s_cap = DEVICES.solo(R50, cap_w)
    p_def, _ = DEVICES.solo(R50, default_w)
    done_capped = 500.0 / s_cap  # work done in 500 s at the capped speed
    end1 = 2500.0 + (1000.0 - done_capped)
    assert r.end_s[1] == pytest.approx(end1)
    # job 2 starts when job 1 ends with nobody behind it: capped again
    assert r.start_s[2] == pytest.approx(end1)
    assert r.end_s[2] == pytest.approx(end1 + 1000.0 * s_cap)
    expected_j = p_def * 1000.0 + p_cap * 500.0 + p_def * (end1 - 2500.0) + p_cap * 1000.0 * s_cap
    assert r.energy_j == pytest.approx(expected_j)
    assert r.retunes >= 1
    # without capacity awareness job 1 keeps its cap and job 2 waits longer
    plain = simulate(exp.context(), PlannerPolicy("plain", power_limit=True))
    assert plain.end_s[1] == pytest.approx(2000.0 + 1000.0 * s_cap)
    assert plain.end_s[1] > r.end_s[1]


def test_a_job_starting_while_others_wait_is_not_capped() -> None:
    exp = _exp([0.0, 500.0, 600.0, 700.0], [1000.0] * 4, [1, 1, 1, 1], cluster_gpus=1)
    r = simulate(exp.context(), PlannerPolicy("cap", power_limit=True, capacity_aware=True))
    assert r.end_s[1] - r.start_s[1] == pytest.approx(1000.0)  # jobs 2 and 3 wait behind it the whole time
    assert r.end_s[2] - r.start_s[2] == pytest.approx(1000.0)  # job 3 waits behind it
    assert r.end_s[3] - r.start_s[3] > 1000.0  # the last one runs capped on an idle cluster


def _result(spans: list[tuple[float, float, int]], gpus: int):
    exp = _exp([s for s, _, _ in spans], [e - s for s, e, _ in spans], [g for _, _, g in spans], gpus)
    return simulate(exp.context(), FifoPolicy())


def test_node_accounting_counts_hosts_and_idle_gpus_of_servers_that_are_on() -> None:
    r = _result([(0.0, 1000.0, 4), (500.0, 1500.0, 6)], gpus=16)
    model = NodeModel(gpus_per_node=8, host_w=900.0, gpu_idle_w=60.0)
    grid = constant_grid(100.0)
    out = node_accounting(r, model, grid)
    # 0-500 s: 4 busy, 1 server; 500-1000 s: 10 busy, 2 servers; 1000-1500 s: 6 busy, 1 server
    overhead = 900.0 * (500 + 2 * 500 + 500) + 60.0 * (4 * 500 + 6 * 500 + 2 * 500)
    assert out["overhead_energy_j"] == pytest.approx(overhead)
    assert out["energy_j"] == pytest.approx(r.energy_j + overhead)
    assert out["node_hours"] == pytest.approx(2000.0 / 3600.0)
    assert out["emissions_g"] == pytest.approx(out["energy_j"] / 3.6e6 * 100.0)
    # servers never powered down: both on for the whole 1,500 s
    on = node_accounting(r, model.scaled(power_down_empty=False), grid)
    busy_gpu_s = 4 * 1000 + 6 * 1000
    assert on["overhead_energy_j"] == pytest.approx(900.0 * 2 * 1500 + 60.0 * (16 * 1500 - busy_gpu_s))
    assert node_accounting(r, model.scaled(host_factor=0.5), grid)["overhead_energy_j"] < overhead


def test_node_model_from_acme_distributions(tmp_path: Path) -> None:
    csv = tmp_path / "cdfs.csv"
    csv.write_text(
        "cluster,metric,x_unit,x,cdf_percent\n"
        "Seren,gpu_power,W,15,0\nSeren,gpu_power,W,60,1.0\nSeren,gpu_power,W,300,50\n"
        "Seren,server_power_gpu_servers,W,0,0\nSeren,server_power_gpu_servers,W,1400,1.0\n"
        "Seren,server_power_gpu_servers,W,4000,50\nKalos,gpu_power,W,1,1.0\n"
    )
    m = NodeModel.from_acme_cdfs(csv)
    assert (m.gpu_idle_w, m.host_w) == (60.0, 1400.0 - 8 * 60.0)
    with pytest.raises(ValueError, match="no server_power_gpu_servers"):
        NodeModel.from_acme_cdfs(csv, cluster="Kalos")
    with pytest.raises(ValueError, match="host_w=-1"):
        NodeModel(host_w=-1.0)


def test_a_price_on_completion_time_caps_the_many_gpu_job_and_not_the_one_gpu_job() -> None:
    # two families on an idle cluster: 1-GPU jobs and 8-GPU jobs (each family's first run is its profile)
    exp = _exp([0.0, 10.0, 5000.0, 5010.0], [1000.0, 1000.0, 1000.0, 1000.0], [1, 8, 1, 8], cluster_gpus=16)
    r = simulate(exp.context(), PlannerPolicy("priced", power_limit=True, capacity_aware=True, delay_cost_w=600.0))
    default_w = DEVICES.default_power_limit_w
    assert r.power_limit_w[2] == default_w  # 1 GPU: the time is worth more than its energy saving
    assert r.power_limit_w[3] < default_w  # 8 GPUs: eight times the saving for the same delay


def test_capacity_aware_joint_policy_keeps_jct_closer_to_fifo_than_the_load_blind_one() -> None:
    rng = np.random.default_rng(3)
    n = 400
    exp = _exp(
        list(np.cumsum(rng.exponential(200.0, n))),
        list(rng.choice([600.0, 1800.0, 5400.0], n)),
        list(rng.choice([1, 1, 1, 2, 4], n)),
        cluster_gpus=24,
    )
    blind = {p.name: exp.run(p).summary() for p in standard_policies()}
    aware = exp.run(standard_policies(capacity_aware=True)[-1]).summary()
    fifo_jct = blind["fifo"]["mean_jct_s"]
    assert blind["fifo"]["mean_queue_s"] > 0  # the cluster queues: slowdowns cost others time
    assert aware["mean_jct_s"] - fifo_jct < blind["carbonflow"]["mean_jct_s"] - fifo_jct
    assert aware["energy_j"] < blind["fifo"]["energy_j"]
