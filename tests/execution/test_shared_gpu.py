"""Two jobs on one (simulated) GPU: the device model, the early-observation bound and the real launcher.

The launcher tests run the real digits CNN twice at once through ``carbonflow run-shared`` (the
local backend), on a simulated V100 whose pair speeds replay Gavel's measurements.
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import pytest

from carbonflow.energy.errors import EnergyError
from carbonflow.energy.simulated import SHARED_POWER_FACTOR, SimulatedSharedGpu, ZeusPowerModel, pair_kept_speeds
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.shared import SEPARATED_EXIT_CODE, SharedMember, SharedRequest
from carbonflow.models import Config, JobSpec, Plan, SimulatedGpuSpec, utcnow
from carbonflow.planning.colocation import pair_timeline
from carbonflow.planning.guard import min_kept_speeds
from carbonflow.workloads.catalog import DIGITS_CNN, DIGITS_CNN_WIDE_BATCH

CNN = SimulatedGpuSpec.model_validate(DIGITS_CNN["simulated_gpu"])
WIDE = SimulatedGpuSpec.model_validate(DIGITS_CNN_WIDE_BATCH["simulated_gpu"])


def _gavel_row(type_a: str, type_b: str) -> dict[str, str]:
    text = resources.files("carbonflow").joinpath("simulation", "data", "gavel_pairs_v100.csv").read_text()
    rows = [r for r in csv.DictReader(text.splitlines()) if (r["job_a"], r["job_b"]) == (type_a, type_b)]
    assert len(rows) == 1
    return rows[0]


def test_pair_speeds_are_gavels_measurements() -> None:
    row = _gavel_row("ResNet-18 (batch size 64)", "A3C")
    assert pair_kept_speeds("ResNet-18 (batch size 64)", "A3C") == (
        float(row["norm_tput_a"]),
        float(row["norm_tput_b"]),
    )


def test_unknown_pair_type_names_the_field_and_the_allowed_types() -> None:
    with pytest.raises(EnergyError, match=r"pair_type='GPT-9'.*allowed: \[.*'A3C'"):
        pair_kept_speeds("GPT-9", "A3C")
    with pytest.raises(EnergyError, match="pair_type is required"):
        SimulatedSharedGpu([CNN, SimulatedGpuSpec()])


def test_shared_gpu_power_and_speed_follow_who_is_working() -> None:
    now = [0.0]
    gpu = SimulatedSharedGpu([CNN, WIDE], clock=lambda: now[0])
    alone = [ZeusPowerModel.from_spec(s) for s in (CNN, WIDE)]
    gpu.set_power_limit_w(200)
    solo_w = [m.average_power_w(200) for m in alone]
    assert gpu.power_w() == 0.0
    gpu.set_active(1, True)
    assert gpu.power_w() == pytest.approx(solo_w[1])
    assert gpu.member_slowdown_factor(1) == pytest.approx(alone[1].slowdown(200))
    gpu.set_active(0, True)
    assert gpu.power_w() == pytest.approx(min(200.0, SHARED_POWER_FACTOR * max(solo_w)))
    keep = pair_kept_speeds(CNN.pair_type or "", WIDE.pair_type or "")
    assert gpu.member_slowdown_factor(1) == pytest.approx(alone[1].slowdown(200) / keep[1])
    now[0] = 10.0
    assert gpu.energy_j() == pytest.approx(10.0 * gpu.power_w())
    assert gpu.label == "simulated" and any("assumed" in n for n in gpu.notes)


@pytest.mark.parametrize(
    ("solo", "speeds", "bounds"),
    [
        ((100.0, 300.0), (0.9, 0.8), (0.2, 0.3)),
        ((300.0, 100.0), (0.95, 0.7), (0.5, 0.1)),
        ((50, 50), (1.0, 1.0), (0.1, 0.1)),
    ],
)
def test_min_kept_speed_is_where_the_bound_is_just_met(solo, speeds, bounds) -> None:  # type: ignore[no-untyped-def]
    guards = min_kept_speeds(*solo, *speeds, *bounds)
    predicted = pair_timeline(solo[0], solo[1], *speeds)
    for job in (0, 1):
        if (predicted.total_a_s, predicted.total_b_s)[job] / solo[job] - 1 > bounds[job]:
            assert guards[job] == speeds[job]  # already predicted to break: no slack to give
            continue
        kept = list(speeds)
        kept[job] = guards[job]
        tl = pair_timeline(solo[0], solo[1], kept[0], kept[1])
        slowdown = (tl.total_a_s, tl.total_b_s)[job] / solo[job] - 1
        assert guards[job] <= speeds[job]
        assert slowdown <= bounds[job] + 1e-6
        if guards[job] > 1e-3:  # any slower and the bound breaks
            kept[job] = guards[job] * 0.99
            tl = pair_timeline(solo[0], solo[1], kept[0], kept[1])
            assert (tl.total_a_s, tl.total_b_s)[job] / solo[job] - 1 > bounds[job]


def _member(job: dict, epochs: int = 1, **kw) -> SharedMember:  # type: ignore[no-untyped-def]
    spec = JobSpec.model_validate({**job, "epochs": epochs})
    plan = Plan(
        job=spec.name, config=Config(containers=1, power_limit_w=200, colocation_group="pair"), start=utcnow(),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=0, region="GB", forecast_provider="test",
        reason="test",
    )  # fmt: skip
    return SharedMember(job=spec, plan=plan, command=["(backend)"], **kw)


def _devices_total(run, kind: str) -> float:  # type: ignore[no-untyped-def]
    """The device's whole energy, from one member's share of it."""
    entry = next(d for d in run.devices if d.kind == kind)
    return entry.energy_j / entry.share


def test_a_pair_profile_measures_both_jobs_and_counts_the_gpu_once(tmp_path: Path) -> None:
    members = [
        _member(DIGITS_CNN, solo_throughput_samples_per_s=5000.0, solo_power_w=200.0),
        _member(DIGITS_CNN_WIDE_BATCH, solo_throughput_samples_per_s=5000.0, solo_power_w=150.0),
    ]
    request = SharedRequest(members=members, power_limit_w=200, warmup_steps=3, profile_steps=10)
    run = LocalBackend(tmp_path).execute_shared(request, run_name="pair")
    assert [m.exit_code for m in run.members] == [0, 0]
    assert run.overlap_s > 0 and run.overlap_power_w > 0
    assert all(k is not None and 0 < k <= 1 for k in run.kept_speeds)
    assert sum(run.shares) == pytest.approx(1.0)
    # every joule of the shared GPU is charged exactly once
    gpu = [next(d for d in m.devices if d.kind == "gpu") for m in run.members]
    assert gpu[0].device_id == gpu[1].device_id and gpu[0].power_limit_w == 200
    assert sum(g.energy_j for g in gpu) == pytest.approx(_devices_total(run.members[0], "gpu"), rel=1e-9)
    assert sum(g.share for g in gpu) == pytest.approx(1.0)
    assert all(m.steps > 0 for m in run.members)
    assert run.label == "simulated"


def test_early_observation_separates_a_pair_that_breaks_its_bound(tmp_path: Path) -> None:
    # The first job is promised 10^9 samples/s alone and may not drop below 0.9 of it: the check must fire.
    members = [
        _member(DIGITS_CNN, solo_throughput_samples_per_s=1e9, solo_power_w=200.0, min_kept_speed=0.9),
        # enough work that the second job is still running when the check comes, whichever starts first
        _member(DIGITS_CNN_WIDE_BATCH, epochs=20, solo_throughput_samples_per_s=5000.0, solo_power_w=150.0),
    ]
    request = SharedRequest(members=members, power_limit_w=200, warmup_steps=2, observe_steps=5)
    run = LocalBackend(tmp_path).execute_shared(request, run_name="separate")
    assert run.separated == [members[1].job.name]
    assert run.members[1].exit_code == SEPARATED_EXIT_CODE
    assert run.members[0].exit_code == 0  # the first job trains to the end alone
    assert "test_accuracy" in run.members[0].metrics  # it trained to the end and evaluated
    assert any("separated after early observation" in n for n in run.members[0].notes)
    gpu = [next(d for d in m.devices if d.kind == "gpu") for m in run.members]
    assert sum(g.share for g in gpu) == pytest.approx(1.0)
