"""``carbonflow run``: the one way a training job is started (DESIGN.md "Training contract").

The wrapper applies the plan's power limit to every GPU of the run, starts the energy monitor
(and optionally a power-trace sampler), runs the command, restores the power limits whatever
happens (normal exit, exception, SIGTERM/SIGINT to the wrapper, the child killed), and writes a
:class:`WrappedRun` JSON with what the run measured. It knows nothing of carbon: the backend turns
energy over time into emissions.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from pydantic import BaseModel, Field

from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.monitor import EnergyMonitor, PowerSampler
from carbonflow.energy.power_limit import applied_power_limit
from carbonflow.models import DeviceEnergy, JobSpec, Plan, UtcDatetime, utcnow
from carbonflow.training import MAX_STEPS_ENV, OUTPUT_DIR_ENV, PROGRESS_FILE_ENV, SIM_SLOWDOWN_ENV

log = logging.getLogger(__name__)

POLL_S = 0.05


class Terminated(Exception):
    """The wrapper received SIGTERM or SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class WrappedRun(BaseModel):
    """What one wrapped run measured (no carbon yet)."""

    job: str
    config_key: str
    started_at: UtcDatetime
    ended_at: UtcDatetime
    duration_s: float
    exit_code: int
    devices: list[DeviceEnergy]
    steps: int = 0
    samples: int = 0
    throughput_samples_per_s: float = 0.0
    measured_window_s: float = 0.0
    measured_samples: int = 0
    measured_energy_j: dict[str, float] = Field(default_factory=dict, description="energy per device after warm-up")
    measured_energy_window_s: float = Field(default=0.0, description="length of the window measured_energy_j covers")
    metrics: dict[str, float] = Field(default_factory=dict)
    power_limit_applied: bool = True
    power_limit_w: float | None = None
    notes: list[str] = Field(default_factory=list)
    power_trace_csv: str | None = None
    output_dir: str | None = None


class _Progress:
    """Tails the JSON-lines progress file the training writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.step = 0
        self.samples = 0
        self.metrics: dict[str, float] = {}
        self.first_after_warmup: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def poll(self, warmup_steps: int) -> None:
        if not self.path.exists():
            return
        with self.path.open("r", encoding="utf-8") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return
        self.offset += len(complete) + 1
        for raw in complete.splitlines():
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                log.warning("ignoring a malformed progress line: %.80s", raw)
                continue
            self.step = int(line.get("step", self.step))
            self.samples = int(line.get("samples", self.samples))
            self.metrics.update({k: float(v) for k, v in (line.get("metrics") or {}).items()})
            t_s = float(line.get("t_s", time.monotonic()))
            if self.step >= warmup_steps and self.first_after_warmup is None:
                self.first_after_warmup = (t_s, self.samples)
            self.last = (t_s, self.samples)


def run_wrapped(
    spec: JobSpec,
    plan: Plan,
    command: list[str],
    *,
    result_path: Path | None = None,
    trace_csv: Path | None = None,
    trace_interval_s: float = 0.5,
    profile_steps: int | None = None,
    warmup_steps: int = 0,
    output_dir: Path | None = None,
) -> WrappedRun:
    """Run ``command`` under the plan's power limit with energy measured; never leaves a limit lowered."""
    if not command:
        raise ValueError("command is empty; give the training command after '--'")
    found = discover_devices(spec.simulated_gpu, include_cpu=True)
    all_gpus = [d for d in found if d.kind == "gpu"]
    # One GPU per container, as CUDA_VISIBLE_DEVICES would give them; only those are measured.
    gpus = all_gpus[: plan.config.containers] if len(all_gpus) > plan.config.containers else all_gpus
    devices = [*gpus, *(d for d in found if d.kind != "gpu")]
    monitor = EnergyMonitor(devices)
    workdir = Path(tempfile.mkdtemp(prefix="carbonflow-run-"))
    progress = _Progress(workdir / "progress.jsonl")
    out_dir = output_dir or workdir / "output"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(spec.env)
    env[PROGRESS_FILE_ENV] = str(progress.path)
    env[OUTPUT_DIR_ENV] = str(out_dir)
    env.pop(MAX_STEPS_ENV, None)
    if profile_steps is not None:
        env[MAX_STEPS_ENV] = str(warmup_steps + profile_steps)

    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    started_at = utcnow()
    start_s = time.monotonic()
    exit_code = -1
    notes: list[str] = []
    child: subprocess.Popen[bytes] | None = None
    window_state = "before"  # the measured (post-warm-up) window: before → open → closed
    target_steps = warmup_steps + profile_steps if profile_steps is not None else None
    measured = None
    try:
        with applied_power_limit(gpus, plan.config.power_limit_w) as outcome:
            notes.extend(outcome.notes)
            for gpu in gpus:
                factor = getattr(gpu, "slowdown_factor", None)
                if callable(factor):
                    env[SIM_SLOWDOWN_ENV] = f"{factor():.6f}"
                    break
            sampler = PowerSampler(devices, trace_interval_s, trace_csv) if trace_csv else None
            if sampler:
                sampler.__enter__()
            monitor.begin_window("run")
            try:
                child = subprocess.Popen(command, env=env, start_new_session=True)
                for gpu in gpus:
                    set_busy = getattr(gpu, "set_busy", None)
                    if callable(set_busy):
                        set_busy(True)
                while True:
                    if received:
                        raise Terminated(received[0])
                    code = child.poll()
                    progress.poll(warmup_steps)
                    if progress.first_after_warmup and window_state == "before":
                        monitor.begin_window("measured")
                        window_state = "open"
                    if window_state == "open" and target_steps is not None and progress.step >= target_steps:
                        measured = monitor.end_window("measured")
                        window_state = "closed"
                    if code is not None:
                        exit_code = code
                        break
                    time.sleep(POLL_S)
            finally:
                if child is not None and child.poll() is None:
                    _stop_child(child)
                    exit_code = child.returncode if child.returncode is not None else -signal.SIGTERM
                if window_state == "open":
                    measured = monitor.end_window("measured")
                total = monitor.end_window("run")
                for gpu in gpus:
                    set_busy = getattr(gpu, "set_busy", None)
                    if callable(set_busy):
                        set_busy(False)
                if sampler:
                    sampler.__exit__(None, None, None)
            applied = outcome.applied
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    ended_at = utcnow()
    progress.poll(warmup_steps)
    if exit_code < 0:
        notes.append(f"training process ended by signal {signal.Signals(-exit_code).name}")
    from carbonflow.energy.accounting import device_energies

    per_device = device_energies(total, devices)
    for entry in per_device:
        if entry.kind == "gpu":
            entry.power_limit_w = plan.config.power_limit_w if applied else None
    measured_s = measured_samples = 0.0
    if measured is not None and progress.last and progress.first_after_warmup:
        measured_s = max(progress.last[0] - progress.first_after_warmup[0], 0.0)
        measured_samples = progress.last[1] - progress.first_after_warmup[1]
    throughput = (
        measured_samples / measured_s
        if measured_s > 0
        else (progress.samples / total.elapsed_s if total.elapsed_s > 0 else 0.0)
    )
    wrapped = WrappedRun(
        job=spec.name,
        config_key=plan.config.key(),
        started_at=started_at,
        ended_at=ended_at,
        duration_s=time.monotonic() - start_s,
        exit_code=exit_code,
        devices=per_device,
        steps=progress.step,
        samples=progress.samples,
        throughput_samples_per_s=throughput,
        measured_window_s=measured_s,
        measured_samples=int(measured_samples),
        measured_energy_j=dict(measured.energy_j) if measured is not None else {},
        measured_energy_window_s=measured.elapsed_s if measured is not None else 0.0,
        metrics=progress.metrics,
        power_limit_applied=applied,
        power_limit_w=plan.config.power_limit_w,
        notes=notes,
        power_trace_csv=str(trace_csv) if trace_csv else None,
        output_dir=str(out_dir),
    )
    if result_path is not None:
        result_path.parent.mkdir(parents=True, exist_ok=True)
        result_path.write_text(wrapped.model_dump_json(indent=2), encoding="utf-8")
    if received:
        raise Terminated(received[0])
    return wrapped


def _stop_child(child: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group, then SIGKILL after a grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def main_from_files(job_path: Path, plan_path: Path, result_path: Path, command: list[str], **kwargs: object) -> int:
    """CLI entry: read and validate the job and plan files, run, write the result. Returns an exit code."""
    spec = JobSpec.model_validate_json(Path(job_path).read_text(encoding="utf-8"))
    plan = Plan.model_validate_json(Path(plan_path).read_text(encoding="utf-8"))
    try:
        wrapped = run_wrapped(spec, plan, command, result_path=result_path, **kwargs)  # type: ignore[arg-type]
    except Terminated as err:
        print(f"carbonflow run: {err}; power limits restored", file=sys.stderr)
        return 128 + err.signum
    return wrapped.exit_code
