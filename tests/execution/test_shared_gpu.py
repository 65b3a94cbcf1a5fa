"""Two jobs on one (simulated) GPU: the device model, the early-observation bound and the real launcher.

The launcher tests run the real digits CNN twice at once through ``carbonflow run-shared`` (the
local backend), on a simulated V100 whose pair speeds replay Gavel's measurements.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from carbonflow.domain import Config, JobSpec, Plan, SimulatedGpuSpec, utcnow
from carbonflow.energy.device import Device
from carbonflow.energy.errors import EnergyError
from carbonflow.energy.simulated import SHARED_POWER_FACTOR, SimulatedSharedGpu, ZeusPowerModel, pair_kept_speeds
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.pair_wrapper import SEPARATED_EXIT_CODE, SharedMember, SharedRequest
from carbonflow.planning.early_observation import min_kept_speeds
from carbonflow.planning.pairs import pair_timeline
from carbonflow.tracking.schema import (
    M_HOST_PACE_FRACTION as M_HOST_PACE,
)
from carbonflow.tracking.schema import (
    M_KEPT_SPEED_FRACTION as M_KEPT_SPEED,
)
from carbonflow.tracking.schema import (
    M_SHARED_GPU_S,
    M_SHARING_ENERGY_J,
    M_SHARING_LOST_S,
)
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
    # On the simulated V100 the A3C job keeps Gavel's 0.75 of its solo speed next to ResNet-18; allowed no less
    # than 0.9, the check must fire (on the device's kept speed, whatever this machine's CPUs do).
    members = [
        # enough work in both that they train together long enough for the check, whichever starts first and
        # however long the other's start-up takes on a loaded host (with 1 epoch the first could end before the
        # second's first step, and no pair was ever observed)
        _member(DIGITS_CNN, epochs=10, solo_throughput_samples_per_s=5000.0, solo_power_w=200.0),
        _member(DIGITS_CNN_WIDE_BATCH, epochs=20, solo_throughput_samples_per_s=5000.0, solo_power_w=150.0,
                min_kept_speed=0.9),
    ]  # fmt: skip
    request = SharedRequest(members=members, power_limit_w=200, warmup_steps=2, observe_steps=5)
    run = LocalBackend(tmp_path).execute_shared(request, run_name="separate")
    assert run.separated == [members[1].job.name]
    assert run.members[1].exit_code == SEPARATED_EXIT_CODE
    assert run.members[0].exit_code == 0  # the first job trains to the end alone
    assert "test_accuracy" in run.members[0].metrics  # it trained to the end and evaluated
    assert any("separated after early observation" in n for n in run.members[0].notes)
    gpu = [next(d for d in m.devices if d.kind == "gpu") for m in run.members]
    assert sum(g.share for g in gpu) == pytest.approx(1.0)


class _CpuBurners:
    """Load this machine's CPUs with busy processes (the test's own, ended by pid) while a pair trains."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> _CpuBurners:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.count)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)


def test_a_simulated_pair_keeps_gavels_speeds_under_host_cpu_load(tmp_path: Path) -> None:
    """Two real trainings on a loaded host: kept speeds, energy split and guard are the simulated V100's (Gavel);
    what the host's CPUs did is measured and reported apart, never mixed in."""
    gavel = pair_kept_speeds(CNN.pair_type or "", WIDE.pair_type or "")
    members = [
        # An unreachable solo speed: the observed pace is far below it, as under any host load; the guard (0.9)
        # would separate the pair on observed speeds, and must not on the simulated GPU's own (1.00).
        _member(DIGITS_CNN, epochs=3, solo_throughput_samples_per_s=1e9, solo_power_w=200.0, min_kept_speed=0.9),
        _member(DIGITS_CNN_WIDE_BATCH, epochs=3, solo_throughput_samples_per_s=5000.0, solo_power_w=150.0,
                min_kept_speed=0.7),
    ]  # fmt: skip
    request = SharedRequest(members=members, power_limit_w=200, warmup_steps=2, observe_steps=5)
    with _CpuBurners(2 * (os.cpu_count() or 1)):
        run = LocalBackend(tmp_path).execute_shared(request, run_name="loaded")
    assert run.separated == [] and [m.exit_code for m in run.members] == [0, 0]
    assert run.kept_speeds == pytest.approx(list(gavel))
    assert "Gavel" in run.kept_speeds_source and run.label == "simulated"
    # the host's share, measured and labelled apart
    assert all(o is not None for o in run.observed_kept_speeds)
    assert run.observed_kept_speeds[0] < 1e-3  # type: ignore[operator]
    assert run.host_pace == pytest.approx([o / k for o, k in zip(run.observed_kept_speeds, gavel, strict=True)])  # type: ignore[operator]
    note = next(n for n in run.notes if n.startswith("host-CPU contention"))
    assert "not the simulated GPU" in note and f"{gavel[1]:.2f}" in note
    # the energy split follows the simulated GPU's kept speeds (P_i × s_i), and the runs carry the figures
    weights = [200.0 * gavel[0], 150.0 * gavel[1]]
    assert run.shares == pytest.approx([w / sum(weights) for w in weights])
    for member, kept, pace in zip(run.members, gavel, run.host_pace, strict=True):
        assert member.metrics[M_KEPT_SPEED] == pytest.approx(kept)
        assert member.metrics[M_HOST_PACE] == pytest.approx(pace)  # type: ignore[arg-type]
        # counted over the GPU's time for the work done together, never more than the time both were up: what the
        # host's CPUs added is not lost to sharing the GPU (the first job's unreachable solo speed: no time at all)
        assert 0 <= member.metrics[M_SHARING_LOST_S] <= (1 - kept) * member.metrics[M_SHARED_GPU_S] + 1e-9
        assert M_SHARING_ENERGY_J in member.metrics
    # on the simulated GPU's clock: durations and GPU energy from the work only (the planner's pair timeline),
    # whatever the burners did to the host's wall time
    models = [ZeusPowerModel.from_spec(CNN), ZeusPowerModel.from_spec(WIDE)]
    solo = [mod.seconds_per_sample(200) * m.samples for mod, m in zip(models, run.members, strict=True)]
    tl = pair_timeline(solo[0], solo[1], gavel[0], gavel[1])
    assert [m.duration_s for m in run.members] == pytest.approx([tl.total_a_s, tl.total_b_s])
    assert run.overlap_s == pytest.approx(tl.overlap_s)
    shared_w = min(200.0, SHARED_POWER_FACTOR * max(mod.average_power_w(200) for mod in models))
    tail = [tl.total_a_s - tl.overlap_s, tl.total_b_s - tl.overlap_s]
    gpu_j = [next(d.energy_j for d in m.devices if d.kind == "gpu") for m in run.members]
    assert sum(gpu_j) == pytest.approx(shared_w * tl.overlap_s + sum(
        mod.average_power_w(200) * t for mod, t in zip(models, tail, strict=True)))  # fmt: skip
    assert all(any(n.startswith("simulated GPU clock") for n in m.notes) for m in run.members)
    # what learning takes out of a co-located run (RealisedRun.alone) leaves the job's time and GPU energy alone
    for mod, m, alone_s, j in zip(models, run.members, solo, gpu_j, strict=True):
        assert m.duration_s - m.metrics[M_SHARING_LOST_S] == pytest.approx(alone_s)
        assert j - m.metrics[M_SHARING_ENERGY_J] == pytest.approx(mod.average_power_w(200) * alone_s)


class _MeasuredGpu(Device):
    """A stand-in for a real (non-simulated) GPU: a measured energy counter at a steady 100 W, no limit set."""

    kind = "gpu"
    label = "measured"
    id = "GPU-test-real-0"
    model = "Test GPU (measured)"

    def __init__(self) -> None:
        super().__init__()
        self._t0 = time.monotonic()

    def energy_j(self) -> float:
        return 100.0 * (time.monotonic() - self._t0)

    def power_w(self) -> float:
        return 100.0


def test_a_real_gpu_pair_keeps_its_observed_speeds(tmp_path: Path) -> None:
    """Not simulated: the observed speeds are the truth; no host pace, no contention note."""
    from carbonflow.energy.cpu import CpuDevice
    from carbonflow.execution.commands import training_command
    from carbonflow.execution.pair_wrapper import _run_shared_on

    members = [
        _member(DIGITS_CNN, solo_throughput_samples_per_s=1e6, solo_power_w=200.0, min_kept_speed=0.9),
        _member(DIGITS_CNN_WIDE_BATCH, solo_throughput_samples_per_s=1e6, solo_power_w=150.0),
    ]
    members = [
        m.model_copy(
            update={"command": training_command(m.job, m.plan.config), "output_dir": str(tmp_path / m.job.name)}
        )
        for m in members
    ]
    request = SharedRequest(members=members, power_limit_w=None, warmup_steps=2, profile_steps=6)
    run = _run_shared_on(request, _MeasuredGpu(), None, CpuDevice(), None)
    assert run.kept_speeds_source == "observed" and run.label == "measured"
    assert run.kept_speeds == run.observed_kept_speeds
    assert all(k is not None and k < 0.5 for k in run.kept_speeds)  # the host is far from 10^6 samples/s
    assert run.host_pace == [] and not any("host-CPU" in n for n in run.notes)
    for member, kept in zip(run.members, run.kept_speeds, strict=True):
        assert member.metrics[M_KEPT_SPEED] == pytest.approx(kept)  # type: ignore[arg-type]
        assert M_HOST_PACE not in member.metrics


def test_a_pair_members_energy_is_its_share_counted_once() -> None:
    """A shared device's ``energy_j`` is already the member's part: the run's totals must not apply the share again."""
    from carbonflow.accounting.run import to_run_result
    from carbonflow.domain import DeviceEnergy
    from carbonflow.execution.wrapper import WrappedRun

    member = _member(DIGITS_CNN)
    devices = [
        DeviceEnergy(device_id="SIM-GPU-1", device_model="V100", kind="gpu", energy_j=400.0, label="simulated",
                     share=0.4),
        DeviceEnergy(device_id="cpu", device_model="cpu", kind="cpu", energy_j=20.0, label="estimated", share=0.5),
    ]  # fmt: skip
    start = utcnow()
    wrapped = WrappedRun(job=member.job.name, config_key="c1", started_at=start, ended_at=start, duration_s=10.0,
                         exit_code=0, devices=devices)  # fmt: skip
    result = to_run_result(wrapped, member.plan, [], fallback_gco2_per_kwh=100.0)
    assert (result.energy_gpu_j, result.energy_cpu_j, result.energy_total_j) == pytest.approx((400.0, 20.0, 420.0))
    assert result.emissions_g == pytest.approx(420.0 / 3.6e6 * 100.0)


def test_sharing_figures_count_the_gpus_time_not_the_hosts() -> None:
    from carbonflow.accounting.energy import sharing_metrics

    # 10 s both working, 1000 J charged (100 W), alone 120 W, kept 0.75. A simulated GPU whose trainings kept half
    # the pace it prescribes needed 5 s for that work: 1.25 s lost to sharing, (100 − 90) W × 5 s added.
    sim = sharing_metrics(0.75, 0.5, 120.0, 10.0, 1000.0)
    assert sim[M_SHARING_LOST_S] == pytest.approx(1.25) and sim[M_SHARING_ENERGY_J] == pytest.approx(50.0)
    assert sim[M_SHARED_GPU_S] == 10.0 and sim[M_HOST_PACE] == 0.5
    real = sharing_metrics(0.75, None, 120.0, 10.0, 1000.0)  # a real GPU: the observed time is the GPU's
    assert real[M_SHARING_LOST_S] == pytest.approx(2.5) and real[M_SHARING_ENERGY_J] == pytest.approx(100.0)
    assert M_HOST_PACE not in real
    assert sharing_metrics(None, None, 120.0, 10.0, 1000.0) == {}  # never worked together: nothing to say
    # with the work done together known (4 s of the GPU's time for it), that time is the one counted
    known = sharing_metrics(0.75, 0.5, 120.0, 10.0, 1000.0, device_s=4.0)
    assert known[M_SHARING_LOST_S] == pytest.approx(1.0) and known[M_SHARING_ENERGY_J] == pytest.approx(40.0)
