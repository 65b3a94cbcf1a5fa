"""``carbonflow run-shared``: two co-located jobs on one GPU, measured once and split fairly.

One wrapper owns the shared GPU: it sets the pair's power limit once, starts both trainings with
their own progress, stop and output files, and measures the device in *phases* — every time the set
of working jobs changes (a job reports its first step, or ends) a new energy window begins. A phase
with one job working is charged to it; a phase with both is split by the shared-GPU rule of
:mod:`carbonflow.accounting.energy` (``P_i × s_i``: solo power × the speed it kept, observed). So the
GPU's energy is counted exactly once.

Early observation (EaCO): after ``warmup_steps`` + ``observe_steps`` steps of both jobs together, a
job whose kept speed is below its ``min_kept_speed`` (the planner's bound) separates the pair: the
second job is stopped and reported ``separated``; the caller runs it alone. Pair profiling
(``profile_steps``) runs both just long enough to measure each job's kept speed and the device's
power, then stops both. Power limits are restored on every exit path, as in ``carbonflow run``.

Kept speeds on a simulated GPU. The two trainings run for real on the host's CPUs while the simulated
device paces them (:class:`~carbonflow.energy.simulated.SimulatedSharedGpu`, Gavel's V100 pair speeds), so
their observed speed together is the device's kept speed × what the host's CPUs allowed. The kept speeds
the pair reports — and the early-observation check, the energy split and the planner use — are then the
simulated device's own (its interference model); the host's share is measured apart as each job's
``host_pace`` (observed pace / the pace the simulated device prescribes; 1.0 = no host-CPU contention) and
said in a note labelled as such, never mixed into the GPU's figures. On a real GPU the observed kept
speeds are the truth and are used as they are.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel, Field

from carbonflow.accounting.energy import (
    M_KEPT_SPEED_FRACTION,
    M_SHARED_GPU_S,
    M_SHARING_ENERGY_J,
    M_SHARING_LOST_S,
    SoloProfile,
    charge_phases,
    device_energies,
    shared_gpu_shares,
    sharing_metrics,
)
from carbonflow.domain import JobSpec, Plan, utcnow
from carbonflow.energy.lease import GpuLeaseSet
from carbonflow.energy.monitor import EnergyMonitor, Measurement, PowerSampler
from carbonflow.energy.power_limit import applied_power_limit
from carbonflow.execution.errors import GPU_UNAVAILABLE_EXIT, GpuUnavailable, shell_exit_status
from carbonflow.execution.gpus import drop_privileges_for_training, lease_run_gpus, pinned_env, start_child
from carbonflow.execution.signing import take_result_key
from carbonflow.execution.wrapper import (
    POLL_S,
    Terminated,
    WrappedRun,
    _left_behind_note,
    _Progress,
    _stop_child,
    emit_result,
    training_env,
)

log = logging.getLogger(__name__)

SEPARATED_EXIT_CODE = 75
"""Exit code reported for a job the early-observation check separated from its pair (EX_TEMPFAIL)."""

KEPT_FROM_DEVICE = "simulated GPU's interference model (Gavel's V100 pair speeds)"
"""``SharedRun.kept_speeds_source`` on a simulated GPU."""

# Each member's metrics get its sharing figures (carbonflow.accounting.energy.sharing_metrics: kept speed, host
# pace, seconds shared, time and energy sharing cost), under the names tracking's schema documents.


class SharedMember(BaseModel):
    """One job of a co-located pair."""

    job: JobSpec
    plan: Plan
    command: list[str] = Field(min_length=1)
    solo_throughput_samples_per_s: float | None = Field(default=None, gt=0, description="alone, at the pair's limit")
    solo_power_w: float | None = Field(default=None, gt=0, description="GPU power alone at the pair's limit")
    min_kept_speed: float | None = Field(default=None, ge=0, le=1, description="separate below this; None: never")
    output_dir: str | None = None


class SharedRequest(BaseModel):
    """What ``carbonflow run-shared`` runs."""

    members: list[SharedMember] = Field(min_length=2, max_length=2)
    power_limit_w: float | None = Field(default=None, gt=0)
    warmup_steps: int = Field(default=5, ge=0)
    observe_steps: int = Field(default=20, gt=0, description="steps together before the early-observation check")
    profile_steps: int | None = Field(default=None, gt=0, description="pair profile: measure this many, then stop")
    trace_csv: str | None = None
    trace_interval_s: float = Field(default=0.5, gt=0)


class SharedRun(BaseModel):
    """What a co-located pair measured: one WrappedRun per job (energy already split) and the pair's figures."""

    members: list[WrappedRun]
    overlap_s: float = 0.0
    overlap_energy_j: float = Field(default=0.0, description="energy of every device (GPU + CPU) while both worked")
    kept_speeds: list[float | None] = Field(
        description="fraction of its solo speed each job kept while both worked: observed on a real GPU; on a "
        "simulated GPU the device's interference model (host-CPU contention is in host_pace, not here)"
    )
    kept_speeds_source: str = Field(default="observed", description="where kept_speeds come from")
    observed_kept_speeds: list[float | None] = Field(
        default_factory=list, description="observed throughput together / solo, per job (the host's too)"
    )
    host_pace: list[float | None] = Field(
        default_factory=list,
        description="simulated GPU only: observed pace / the pace the simulated device prescribes, per job "
        "(1.0 = the host's CPUs kept up; below 1: host-CPU contention)",
    )
    shares: list[float] = Field(description="each job's share of the GPU energy while both worked")
    separated: list[str] = Field(default_factory=list)
    label: str = "measured"
    notes: list[str] = Field(default_factory=list)

    @property
    def overlap_power_w(self) -> float:
        return self.overlap_energy_j / self.overlap_s if self.overlap_s > 0 else 0.0


class _Member:
    """Runtime state of one job of the pair."""

    def __init__(self, index: int, spec: SharedMember, workdir: Path) -> None:
        self.index = index
        self.spec = spec
        self.dir = workdir / f"m{index}"
        self.dir.mkdir(parents=True)
        self.progress = _Progress(self.dir / "progress.jsonl")
        self.stop_file = self.dir / "stop"
        self.slowdown_file = self.dir / "sim_slowdown"
        self.output_dir = Path(spec.output_dir) if spec.output_dir else self.dir / "output"
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.child: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.active = False
        self.started_at = utcnow()
        self.ended_at = self.started_at
        self.start_s = time.monotonic()
        self.duration_s = 0.0
        self.arm_step: int | None = None  # measuring together starts at this step (after the warm-up)
        self.mark: tuple[int, float, int] | None = None  # (step, t_s, samples) when measuring together began
        self.together: tuple[float, int] = (0.0, 0)  # seconds and samples measured together
        self.separated = False
        self.device_kept: float | None = None  # a simulated GPU's kept speed for this job (None: a real GPU)
        self.phase_samples = 0  # samples done when the current phase began
        self.samples_shared = 0  # samples done while both worked

    def device_shared_s(self, kept: float | None) -> float | None:
        """The GPU's time for the work done while both worked: those samples at the solo speed × the kept speed."""
        solo = self.spec.solo_throughput_samples_per_s
        if solo is None or kept is None or kept <= 0:
            return None
        return self.samples_shared / (solo * kept)

    @property
    def running(self) -> bool:
        return self.child is not None and self.exit_code is None

    def observed_kept_speed(self) -> float | None:
        """Throughput while both worked over the solo throughput (on a simulated GPU: the host's CPUs included)."""
        seconds, samples = self.together
        solo = self.spec.solo_throughput_samples_per_s
        if solo is None or seconds <= 0 or samples <= 0:
            return None
        return min(samples / seconds / solo, 1.0)

    def kept_speed(self) -> float | None:
        """The kept speed the pair reports: the simulated device's own, else the observed one."""
        if self.device_kept is not None:
            return self.device_kept if self.observed_kept_speed() is not None else None
        return self.observed_kept_speed()

    def host_pace(self) -> float | None:
        """Simulated GPU only: observed kept speed / the device's (below 1: host-CPU contention)."""
        observed = self.observed_kept_speed()
        if self.device_kept is None or observed is None:
            return None
        return observed / self.device_kept


def _shared_device(members: list[SharedMember]) -> tuple[Any, GpuLeaseSet | None]:
    """The one GPU the pair shares, with its lease: simulated when both jobs simulate one, else a free NVML GPU.

    The pair's one launcher (this wrapper) takes the one lease; both trainings inherit it.
    """
    sims = [m.job.simulated_gpu for m in members]
    if all(s is not None for s in sims):
        from carbonflow.energy.simulated import SimulatedSharedGpu

        return SimulatedSharedGpu([s for s in sims if s is not None]), None
    from carbonflow.energy.nvml import nvml_devices

    gpus = list(nvml_devices(os.environ.get("CUDA_VISIBLE_DEVICES")))
    if not gpus:
        raise RuntimeError("no GPU to share: NVML found none and the jobs do not both declare simulated_gpu")
    leased, lease = lease_run_gpus(gpus, 1)
    return leased[0], lease


def run_shared(request: SharedRequest, *, result_path: Path | None = None, result_key: str | None = None) -> SharedRun:
    """Run the pair on one GPU; returns one WrappedRun per job with the GPU's energy split between them."""
    from carbonflow.energy.cpu import CpuDevice

    gpu, lease = _shared_device(request.members)
    try:
        return _run_shared_on(request, gpu, lease, CpuDevice(), result_path, result_key)
    finally:
        if lease is not None:
            lease.release()


def _run_shared_on(
    request: SharedRequest,
    gpu: Any,
    lease: GpuLeaseSet | None,
    cpu: Any,
    result_path: Path | None,
    result_key: str | None = None,
) -> SharedRun:
    devices = [gpu, cpu]
    simulated = callable(getattr(gpu, "member_slowdown_factor", None))
    if simulated:
        gpu.set_busy(False)
    monitor = EnergyMonitor(devices)
    workdir = Path(tempfile.mkdtemp(prefix="carbonflow-shared-"))
    members = [_Member(i, m, workdir) for i, m in enumerate(request.members)]
    if simulated:
        for m in members:
            m.device_kept = float(gpu.kept_speeds[m.index])
    phases: list[tuple[tuple[int, ...], Measurement]] = []
    notes: list[str] = []
    received: list[int] = []
    state: dict[str, bool] = {}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    def active_set() -> tuple[int, ...]:
        return tuple(m.index for m in members if m.active)

    def tell_simulated_gpu() -> None:
        """Who works now, and so how much slower each training must run (simulated GPU only)."""
        if simulated:
            for m in members:
                gpu.set_active(m.index, m.active)
            for m in members:
                m.slowdown_file.write_text(f"{gpu.member_slowdown_factor(m.index):.6f}", encoding="utf-8")

    def count_phase_samples(previous: tuple[int, ...]) -> None:
        for m in members:
            if len(previous) == 2:
                m.samples_shared += max(m.progress.samples - m.phase_samples, 0)
            m.phase_samples = m.progress.samples

    def new_phase(previous: tuple[int, ...]) -> None:
        count_phase_samples(previous)
        phases.append((previous, monitor.end_window("phase")))
        monitor.begin_window("phase")
        tell_simulated_gpu()

    previous_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    applied = True
    not_restored: list[str] = []
    try:
        with applied_power_limit([gpu], request.power_limit_w, lease=lease) as outcome:
            notes.extend(outcome.notes)
            trace = Path(request.trace_csv) if request.trace_csv else None
            sampler = PowerSampler(devices, request.trace_interval_s, trace) if trace else None
            if sampler:
                sampler.__enter__()
            monitor.begin_window("run")
            monitor.begin_window("phase")
            try:
                tell_simulated_gpu()
                for m in members:
                    env = pinned_env(_member_env(m, request, simulated), [gpu])
                    env = drop_privileges_for_training(env, [workdir, m.dir, m.output_dir])
                    command = [w.replace("{output_dir}", str(m.output_dir)) for w in m.spec.command]
                    m.child = start_child(command, env, lease, cwd=m.spec.job.working_dir)
                    m.start_s, m.started_at = time.monotonic(), utcnow()
                while any(m.running for m in members):
                    if received:
                        notes.append(f"wrapper received {signal.Signals(received[0]).name}: training stopped")
                        break
                    before = active_set()
                    for m in members:
                        m.progress.poll()
                        if m.running and not m.active and m.progress.step > 0:
                            m.active = True
                        code = m.child.poll() if m.child is not None else None
                        if m.running and code is not None:
                            m.exit_code, m.active = code, False
                            m.duration_s, m.ended_at = time.monotonic() - m.start_s, utcnow()
                    if active_set() != before:
                        _close_together(members)
                        new_phase(before)
                        _open_together(members, request)
                    _observe(members, request, state, notes)
                    time.sleep(POLL_S)
            finally:
                for m in members:
                    if m.running:
                        _stop_child(m.child)  # type: ignore[arg-type]
                        m.exit_code = m.child.returncode if m.child and m.child.returncode is not None else -15
                        m.duration_s, m.ended_at = time.monotonic() - m.start_s, utcnow()
                for m in members:
                    notes.extend(f"{m.spec.job.name}: {note}" for note in _left_behind_note(m.child))
                last = active_set()
                _close_together(members)
                for m in members:
                    m.progress.poll()
                    m.active = False
                count_phase_samples(last)
                phases.append((last, monitor.end_window("phase")))
                total = monitor.end_window("run")
                if simulated:
                    gpu.set_busy(False)
                if sampler:
                    sampler.__exit__(None, None, None)
        applied = outcome.applied
        notes.extend(note for note in outcome.notes if note not in notes)
        not_restored = list(outcome.not_restored)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    run = _account(request, members, phases, total, devices, gpu, applied, notes)
    for member in run.members:  # the GPU both shared: each job's run says its limit was not put back
        member.power_limits_not_restored = list(not_restored)
    if simulated and hasattr(gpu, "models"):
        _on_simulated_clock(run, members, gpu, request.power_limit_w)
    emit_result(run, result_path, result_key)  # signed with the run's key: the backend believes nothing else
    if received:
        raise Terminated(received[0])
    return run


def _member_env(m: _Member, request: SharedRequest, simulated: bool) -> dict[str, str]:
    # In a pair profile a safety cap; the stop file normally ends it.
    cap = 20 * (request.warmup_steps + request.profile_steps) + 100 if request.profile_steps is not None else None
    return training_env(
        m.spec.job, m.progress.path, m.output_dir, m.stop_file, cap, m.slowdown_file if simulated else None,
        m.spec.plan.config,
    )  # fmt: skip


def _open_together(members: list[_Member], request: SharedRequest) -> None:
    """Both working now: each starts measuring after the warm-up."""
    if all(m.active for m in members):
        for m in members:
            m.arm_step, m.mark = m.progress.step + request.warmup_steps, None


def _close_together(members: list[_Member]) -> None:
    """Both stop working together: add what each did since its mark to its measured together time."""
    for m in members:
        if m.mark is not None and m.progress.last is not None:
            _, t0, s0 = m.mark
            t1, s1 = m.progress.last
            seconds, samples = m.together
            m.together = (seconds + max(t1 - t0, 0.0), samples + max(s1 - s0, 0))
        m.arm_step, m.mark = None, None


def _observe(members: list[_Member], request: SharedRequest, state: dict[str, bool], notes: list[str]) -> None:
    """Start measuring after the warm-up; then end a pair profile, or run the early-observation check once."""
    if not all(m.active for m in members):
        return
    for m in members:
        if m.mark is None and m.arm_step is not None and m.progress.step >= m.arm_step and m.progress.last:
            m.mark = (m.progress.step, *m.progress.last)
    if any(m.mark is None for m in members) or state.get("observed"):
        return
    budget = request.profile_steps or request.observe_steps
    if any(m.progress.step - m.mark[0] < budget for m in members):  # type: ignore[index]
        return
    state["observed"] = True
    if request.profile_steps is not None:
        _close_together(members)
        for m in members:
            m.stop_file.touch()  # the trainings' should_stop() turns true
        return
    for m in members:
        solo, bound = m.spec.solo_throughput_samples_per_s, m.spec.min_kept_speed
        if solo is None or bound is None or m.mark is None or m.progress.last is None:
            continue
        if m.device_kept is not None:  # a simulated GPU: its own interference model, not the host's CPUs
            kept = m.device_kept
        else:
            seconds = m.together[0] + m.progress.last[0] - m.mark[1]
            samples = m.together[1] + m.progress.last[1] - m.mark[2]
            kept = samples / seconds / solo if seconds > 0 else 1.0
        if kept < bound:
            second = members[-1]
            notes.append(
                f"separated after early observation: {m.spec.job.name} kept {kept:.2f} of its solo speed "
                f"< {bound:.2f} allowed; {second.spec.job.name} stopped to run alone"
            )
            second.separated = True
            _stop_child(second.child)  # type: ignore[arg-type]
            return


def _two(values: list[float | None]) -> str:
    return " / ".join("–" if v is None else f"{v:.2f}" for v in values)


def contention_note(pace: list[float | None], observed: list[float | None], kept: list[float | None]) -> str:
    """What the host's CPUs did to a pair on a simulated GPU, labelled apart from the GPU's own kept speeds."""
    return (
        f"host-CPU contention (this machine, not the simulated GPU): the two real trainings kept {_two(pace)} of "
        f"the pace the simulated GPU prescribes (observed kept speeds {_two(observed)}); kept speeds, the energy "
        f"split and the early-observation check use the simulated GPU's own {_two(kept)}"
    )


def _account(
    request: SharedRequest,
    members: list[_Member],
    phases: list[tuple[tuple[int, ...], Measurement]],
    total: Measurement,
    devices: list[Any],
    gpu: Any,
    applied: bool,
    notes: list[str],
) -> SharedRun:
    """Charge each phase's energy to the jobs working in it (split by P_i × s_i while both work)."""
    kept = [m.kept_speed() for m in members]
    observed = [m.observed_kept_speed() for m in members]
    pace = [m.host_pace() for m in members]
    simulated = any(m.device_kept is not None for m in members)
    if simulated and all(p is not None for p in pace):
        notes.append(contention_note(pace, observed, kept))
    solo_power = [m.spec.solo_power_w for m in members]
    if all(k is not None for k in kept) and all(p is not None for p in solo_power):
        shares_map = shared_gpu_shares(
            [SoloProfile(str(m.index), p, k) for m, p, k in zip(members, solo_power, kept, strict=True)]  # type: ignore[arg-type]
        )
        shares = [shares_map[str(m.index)] for m in members]
    else:
        shares = [0.5, 0.5]
        notes.append("shared GPU split equally: a solo profile or an observed speed was missing")
    charge = charge_phases(phases, shares, list(total.energy_j))
    runs = []
    for m in members:
        per_device = device_energies(total, devices, shares=charge.fractions(m.index))
        for entry in per_device:
            if entry.kind == "gpu":
                entry.power_limit_w = request.power_limit_w if applied else None
                entry.notes.append(f"shared with {members[1 - m.index].spec.job.name}")
        exit_code = SEPARATED_EXIT_CODE if m.separated else (m.exit_code if m.exit_code is not None else -15)
        member_notes = [*notes, *gpu.notes] if m.index == 0 else list(notes)
        if m.separated:
            member_notes.append("separated from its pair after early observation; run it alone")
        sharing = sharing_metrics(kept[m.index], pace[m.index], solo_power[m.index], charge.overlap_s,
                                  charge.charged_together_j[m.index], m.device_shared_s(kept[m.index]))  # fmt: skip
        run = WrappedRun(
                job=m.spec.job.name, config_key=m.spec.plan.config.key(), started_at=m.started_at,
                ended_at=m.ended_at, duration_s=m.duration_s, exit_code=exit_code, devices=per_device,
                steps=m.progress.step, samples=m.progress.samples,
                throughput_samples_per_s=m.progress.samples / m.duration_s if m.duration_s > 0 else 0.0,
                metrics={**m.progress.metrics, **sharing}, power_limit_applied=applied,
                power_limit_w=request.power_limit_w,
                notes=member_notes, power_trace_csv=request.trace_csv, output_dir=str(m.output_dir),
        )  # fmt: skip
        runs.append(run)
    return SharedRun(
        members=runs, overlap_s=charge.overlap_s, overlap_energy_j=charge.overlap_j, kept_speeds=kept, shares=shares,
        kept_speeds_source=KEPT_FROM_DEVICE if simulated else "observed", observed_kept_speeds=observed,
        host_pace=pace if simulated else [], separated=[m.spec.job.name for m in members if m.separated],
        label=gpu.label, notes=notes,
    )  # fmt: skip


def _on_simulated_clock(run: SharedRun, members: list[_Member], gpu: Any, limit_w: float | None) -> None:
    """A simulated shared GPU's figures on its own clock, from the work only (host load changes none of them).

    Each job's samples take its trace's time per sample at the pair's limit; while both work each keeps the
    device's kept speed (Gavel's), and the device draws the shared power; the job left then runs alone at its
    solo power (the shape of the planner's pair timeline, what it predicts with).
    Durations, the overlap and the GPU's energy per job are set from that; the CPU's figures stay the host's.
    """
    from carbonflow.energy.simulated import shared_gpu_power_w

    limit = limit_w if limit_w is not None else gpu.default_power_limit_w()
    solo_s = [
        model.seconds_per_sample(limit) * m.progress.samples for model, m in zip(gpu.models, members, strict=True)
    ]
    power = [model.average_power_w(limit) for model in gpu.models]
    kept = list(gpu.kept_speeds)
    if not all(k > 0 for k in kept) or not any(s > 0 for s in solo_s):
        return
    overlap_s = min(solo_s[i] / kept[i] for i in (0, 1)) if all(s > 0 for s in solo_s) else 0.0
    tail_s = [max(solo_s[i] - kept[i] * overlap_s, 0.0) for i in (0, 1)]
    shared_w = shared_gpu_power_w(power[0], power[1], limit)
    gpu_j = [shared_w * overlap_s * run.shares[i] + power[i] * tail_s[i] for i in (0, 1)]
    for i, member in enumerate(run.members):
        duration_s = overlap_s + tail_s[i]
        for entry in member.devices:
            if entry.kind == "gpu":
                entry.energy_j = gpu_j[i]
                entry.share = gpu_j[i] / sum(gpu_j) if sum(gpu_j) > 0 else 0.5
        member.notes.append(
            f"simulated GPU clock: {members[i].progress.samples} samples took {duration_s:.3f} s of simulated GPU "
            f"time ({overlap_s:.3f} s shared); the host's wall time was {member.duration_s:.2f} s"
        )
        member.duration_s = duration_s
        member.throughput_samples_per_s = member.samples / duration_s if duration_s > 0 else 0.0
        if M_KEPT_SPEED_FRACTION in member.metrics:  # the sharing figures on the same clock: what learning takes out
            member.metrics[M_SHARED_GPU_S] = overlap_s
            member.metrics[M_SHARING_LOST_S] = (1.0 - kept[i]) * overlap_s
            member.metrics[M_SHARING_ENERGY_J] = (shared_w * run.shares[i] - power[i] * kept[i]) * overlap_s
    # The overlap's power was the shared GPU's (the same on either clock) plus the host's CPU: kept, over the
    # simulated overlap.
    overlap_w = run.overlap_power_w if run.overlap_s > 0 else shared_w
    run.overlap_s = overlap_s
    run.overlap_energy_j = overlap_w * overlap_s


def main_from_file(request_path: Path, result_path: Path) -> int:
    """CLI entry: read the request, run the pair, write the result. Exit code: worst of the two (separated = 0).

    The run's result key is taken out of the environment first, so neither training inherits it."""
    result_key = take_result_key()
    request = SharedRequest.model_validate_json(Path(request_path).read_text(encoding="utf-8"))
    try:
        run = run_shared(request, result_path=result_path, result_key=result_key)
    except GpuUnavailable as err:
        print(f"carbonflow run-shared: {err}", file=sys.stderr)
        return GPU_UNAVAILABLE_EXIT
    except Terminated as err:
        print(f"carbonflow run-shared: {err}; power limits restored", file=sys.stderr)
        return 128 + err.signum
    codes = [r.exit_code for r in run.members if r.exit_code != SEPARATED_EXIT_CODE]
    return shell_exit_status(next((c for c in codes if c != 0), 0))
