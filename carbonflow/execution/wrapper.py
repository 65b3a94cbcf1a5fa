"""``carbonflow run``: the one way a training job is started (DESIGN.md "Training contract").

The wrapper applies the plan's power limit to every GPU of the run, starts the energy monitor
(and optionally a power-trace sampler), runs the command, restores the power limits whatever
happens (normal exit, exception, SIGTERM/SIGINT to the wrapper, the child killed), and writes a
:class:`WrappedRun` JSON with what the run measured. It knows nothing of carbon: the backend turns
energy over time into emissions.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel, Field

from carbonflow.contract import training_base_env
from carbonflow.domain import Config, DeviceEnergy, JobSpec, Plan, UtcDatetime, utcnow
from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.lease import GpuLeaseSet
from carbonflow.energy.monitor import EnergyMonitor, PowerSampler
from carbonflow.energy.power_limit import applied_power_limit
from carbonflow.execution.commands import work_env
from carbonflow.execution.errors import GPU_UNAVAILABLE_EXIT, GpuUnavailable, shell_exit_status
from carbonflow.execution.gpus import (
    GuardedChild,
    drop_privileges_for_training,
    lease_run_gpus,
    pinned_env,
    start_child,
)
from carbonflow.execution.printed_lines import PatternProgress, own_streams
from carbonflow.execution.signing import RESULT_LINE_PREFIX, result_line, sign_result, take_result_key
from carbonflow.progress_pattern import UNMATCHED_GRACE_S, unmatched_stop_note
from carbonflow.training import (
    MAX_STEPS_ENV,
    OUTPUT_DIR_ENV,
    PROGRESS_FILE_ENV,
    SIM_SLOWDOWN_FILE_ENV,
    STOP_FILE_ENV,
)

log = logging.getLogger(__name__)

POLL_S = 0.02
SHORT_WINDOW = "measured window cut short"
"""Starts a run's note when a profiled configuration was measured over less than it asked (steps or seconds)."""
WINDOW_TOO_SHORT = "profile window too short"
"""Starts a run's note when a configuration's progress reports, even all of them, span less than
``profile_min_window_s``: the profile then falls back to the whole run (or drops that limit), and says so."""
IN_RUN_PROFILE = "in-run profiling"
"""Starts the note of a training that swept its power limits inside itself and went on at the best one."""
ENERGY_BUDGET_STOP = "stopped at its energy budget"
"""Starts the note of a run the wrapper stopped once its energy passed ``stop_above_energy_j``."""
ENERGY_STOP_GRACE_S = 10.0
"""How long a training asked to stop at its energy budget (``should_stop()``) may take before it is stopped."""
ENERGY_CHECK_S = 0.1
"""How often the wrapper reads a budgeted run's energy (each read asks every device for its counter)."""


def check_energy_budget(name: str, value: float | None, *, optional: bool = True) -> float | None:
    """``value`` if it is an allowed energy budget or grace period (a finite number > 0; None when ``optional``),
    else a ValueError naming ``name``, the value and what is allowed."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        allowed = "a finite number > 0" + (" (or None: no budget)" if optional else "")
        raise ValueError(f"{name}={value!r} is not allowed; give {allowed}")
    return float(value)


class Terminated(Exception):
    """The wrapper received SIGTERM or SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class MeasuredWindow(BaseModel):
    """One profiled power limit of a sweep: throughput from the training's timestamps, energy around them."""

    power_limit_w: float | None
    samples: int
    window_s: float = Field(description="time between the window's first and last progress reports")
    energy_j: dict[str, float] = Field(description="energy per device over the energy window")
    energy_window_s: float = Field(description="length of the energy window")
    label: str = ""
    step_time_cv: float | None = Field(
        default=None, description="spread of the window's step times (standard deviation / mean); None: < 3 steps"
    )
    steps: int = Field(default=0, description="progress reports inside the window")


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
    windows: list[MeasuredWindow] = Field(default_factory=list, description="profile mode: one per power limit")
    metrics: dict[str, float] = Field(default_factory=dict)
    power_limit_applied: bool = True
    power_limit_w: float | None = None
    power_limits_not_restored: list[str] = Field(
        default_factory=list, description="per GPU whose limit could not be put back: the GPU, wanted and actual W"
    )
    notes: list[str] = Field(default_factory=list)
    power_trace_csv: str | None = None
    output_dir: str | None = None
    stopped_at_energy_budget_j: float | None = Field(
        default=None,
        description="the energy budget (J, stop_above_energy_j) the wrapper stopped the run at; None: not stopped",
    )


class _Progress:
    """Tails the JSON-lines progress file the training writes, and the reports its printed lines make
    (``progress_pattern``: :mod:`carbonflow.execution.printed_lines`). Once the training has written a report
    of its own, only its own reports count as progress; the lines' accuracy is the fallback ``test_accuracy``."""

    def __init__(self, path: Path, lines: PatternProgress | None = None) -> None:
        self.path = path
        self.lines = lines
        self.own_reports = 0
        self.offset = 0
        self.step = 0
        self.samples = 0
        self.metrics: dict[str, float] = {}
        self.last: tuple[float, int] | None = None
        self.reports: list[tuple[int, float, int]] = []  # (step, t_s, samples) as the training wrote them

    def poll(self) -> None:
        self._poll_file()
        for report in self.lines.drain() if self.lines is not None else []:
            if self.own_reports == 0:
                self._take(report)

    def final_metrics(self) -> dict[str, float]:
        """The training's metrics; ``test_accuracy`` from its printed lines when it reported none itself."""
        accuracy = self.lines.accuracy if self.lines is not None else None
        if accuracy is None or "test_accuracy" in self.metrics:
            return self.metrics
        return {**self.metrics, "test_accuracy": accuracy}

    def _poll_file(self) -> None:
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
            self.own_reports += 1
            self._take(line)

    def _take(self, line: dict[str, Any]) -> None:
        """One progress report ``{"step", "samples", "t_s", "metrics"}``."""
        self.step = int(line.get("step", self.step))
        self.samples = int(line.get("samples", self.samples))
        self.metrics.update({k: float(v) for k, v in (line.get("metrics") or {}).items()})
        self.last = (float(line.get("t_s", time.monotonic())), self.samples)
        self.reports.append((self.step, self.last[0], self.samples))

    def step_time_cv(self, t0: float, t1: float) -> float | None:
        """The spread (standard deviation / mean) of the seconds per step the training reported in [t0, t1]."""
        inside = [(s, t) for s, t, _ in self.reports if t0 <= t <= t1]
        per_step = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(inside) if b[0] > a[0]]
        if len(per_step) < 2:
            return None
        mean = sum(per_step) / len(per_step)
        variance = sum((x - mean) ** 2 for x in per_step) / (len(per_step) - 1)
        return variance**0.5 / mean if mean > 0 else None

    def reports_between(self, t0: float, t1: float) -> int:
        return sum(1 for _, t, _ in self.reports if t0 <= t <= t1)

    def since(self, step: int) -> tuple[float, int] | None:
        """The training's own (t_s, samples) at its first report at or after ``step``."""
        return next(((t, n) for s, t, n in self.reports if s >= step), None)


class _Sweep:
    """Profile mode: for each power limit, let ``warmup_steps`` pass, then measure ``profile_steps``.

    The limit changes in the running training (as Zeus's JIT profiler does), so one process start
    profiles every limit; the training learns the simulated slowdown from a file it re-reads.
    """

    def __init__(
        self,
        limits_w: list[float | None],
        warmup_steps: int,
        profile_steps: int,
        slowest_fraction: float | None,
        min_window_s: float = 0.0,
        keep_training: bool = False,
    ) -> None:
        self.limits_w = limits_w
        self.keep_training = keep_training
        """In-run profiling: once every limit was measured the training goes on at the best one to its end."""
        self.chosen_w: float | None = None
        """With ``keep_training``: the limit the rest of the training ran at."""
        self.objective = "energy"
        self.max_slowdown: float | None = None
        self.min_window_s = min_window_s
        self.warmup_steps = warmup_steps
        self.profile_steps = profile_steps
        self.slowest_fraction = slowest_fraction
        self.index = 0
        self.phase_start_step = 0
        self.open_at: tuple[float, int] | None = None
        self.windows: list[MeasuredWindow] = []
        self.done = False
        self.created_s = time.monotonic()  # just before the training starts: where a whole-run window begins
        self.clocked: list[Any] = []  # simulated GPUs on their own clock: windows last their work's simulated time

    @property
    def limit_w(self) -> float | None:
        return self.limits_w[self.index]

    def warmup_for_phase(self) -> int:
        """The first phase also warms the process up (allocator, caches, data loader): three times longer."""
        return 3 * self.warmup_steps if self.index == 0 else self.warmup_steps

    def total_steps(self) -> int | None:
        """A safety cap for the training; the wrapper normally ends the sweep with the stop file first (none when
        the training goes on after the sweep: it trains its whole work).

        Each phase may overrun its marks by the steps that pass between two polls, hence the slack. With a
        minimum measured wall time the steps a window needs are unknown: no cap (the stop file ends it).
        """
        if self.min_window_s > 0 or self.keep_training:
            return None
        return len(self.limits_w) * (self.warmup_steps + self.profile_steps + 10) + 2 * self.warmup_steps


class _EnergyBudget:
    """``stop_above_energy_j``: once the run's energy (its GPUs and CPU, what the run is accounted) passes the budget,
    the training is asked to stop (the stop file: ``carbonflow.training.should_stop()`` turns true); one still
    running ``grace_s`` later is stopped (a planned end: exit status 0)."""

    def __init__(self, budget_j: float, grace_s: float, monitor: EnergyMonitor, stop_file: Path) -> None:
        self.budget_j, self.grace_s, self.monitor, self.stop_file = budget_j, grace_s, monitor, stop_file
        self.spent_j: float | None = None
        """The run's energy when the training was asked to stop (None: it never passed the budget)."""
        self.asked_s: float | None = None
        self.forced = False
        self._next_read_s = 0.0

    def overdue(self, child: subprocess.Popen[bytes]) -> bool:
        """Whether the training must be stopped now: asked ``grace_s`` ago and still running (asks it first, once
        the run's energy passed the budget; the energy is read every ``ENERGY_CHECK_S``)."""
        now = time.monotonic()
        if self.asked_s is not None:
            return now - self.asked_s >= self.grace_s and child.poll() is None
        if now >= self._next_read_s:
            self._next_read_s = now + ENERGY_CHECK_S
            spent_j = accounted_energy_j(self.monitor.read_window("run"))
            if spent_j > self.budget_j:
                self.spent_j, self.asked_s = spent_j, now
                self.stop_file.touch()
        return False

    def stop(self, child: subprocess.Popen[bytes]) -> int:
        """Stop a training that outlived its grace period; the run ended as planned (0)."""
        _stop_child(child)
        self.forced = True
        return 0

    def note(self) -> str | None:
        """What the run's notes say of the budget (None: the run never passed it)."""
        if self.spent_j is None:
            return None
        how = f"did not stop within {self.grace_s:g} s and was stopped" if self.forced else "stopped"
        return (
            f"{ENERGY_BUDGET_STOP}: the run had spent {self.spent_j:.1f} J (read every {ENERGY_CHECK_S:g} s), more "
            f"than stop_above_energy_j={self.budget_j:g} J; its energy_total_j counts the run to its end; the "
            f"training was asked to stop (carbonflow.training.should_stop()) and {how}"
        )


def accounted_energy_j(measurement: Any) -> float:
    """A measurement's energy as a run is accounted (its GPUs and CPU: ``RunResult.energy_total_j``)."""
    return sum(j for kind, j in measurement.energy_by_kind_j().items() if kind in ("gpu", "cpu"))


def training_env(
    spec: JobSpec,
    progress_file: Path,
    output_dir: Path,
    stop_file: Path,
    max_steps: int | None,
    slowdown_file: Path | None,
    config: Config | None = None,
    profile: bool | None = None,
) -> dict[str, str]:
    """The training child's environment: an allow-list of the wrapper's, the job's own, then carbonflow's (which win).

    Of the wrapper's environment only :func:`carbonflow.contract.training_base_env` passes (``PATH``, ``HOME``,
    locale, ``TMPDIR`` and a short named runtime set): a worker's credentials never reach a training unless
    the job declares them. carbonflow's are the training contract's files and the job's work
    (``CARBONFLOW_EPOCHS`` or ``CARBONFLOW_STEPS``, ``CARBONFLOW_BATCH_SIZE``, ``CARBONFLOW_MODE`` = train |
    profile, ...).
    """
    env = training_base_env(os.environ)
    env.update(spec.env)
    in_profile = profile if profile is not None else max_steps is not None
    env.update(work_env(spec, config or Config(), "profile" if in_profile else "train"))
    env[PROGRESS_FILE_ENV] = str(progress_file)
    env[OUTPUT_DIR_ENV] = str(output_dir)
    env[STOP_FILE_ENV] = str(stop_file)
    env.pop(MAX_STEPS_ENV, None)
    if max_steps is not None:
        env[MAX_STEPS_ENV] = str(max_steps)
    if slowdown_file is not None:
        env[SIM_SLOWDOWN_FILE_ENV] = str(slowdown_file)
    return env


def _working_dir(spec: JobSpec) -> str | None:
    """The job's working directory (already resolved to an absolute path by whoever launched the run)."""
    if spec.working_dir is None:
        return None
    path = Path(spec.working_dir)
    if not path.is_dir():
        raise ValueError(f"working_dir={spec.working_dir!r} of job {spec.name!r} is not a directory on this worker")
    return str(path)


def _set_busy(gpus: list[Any], busy: bool) -> bool:
    """Mark simulated GPUs busy or idle (real GPUs measure themselves); returns ``busy``."""
    for gpu in gpus:
        set_busy = getattr(gpu, "set_busy", None)
        if callable(set_busy):
            set_busy(busy)
    return busy


def _work_clocked(gpus: list[Any]) -> list[Any]:
    """The run's simulated GPUs that keep their own clock, driven by the work (:meth:`SimulatedGpu.add_work`)."""
    return [g for g in gpus if callable(getattr(g, "add_work", None))]


def _feed_work(clocked: list[Any], samples: int, fed: int) -> int:
    """Hand the simulated GPUs the samples trained since ``fed`` (split evenly: data-parallel containers each train
    their share), so their clock and energy follow the work at the current limit whatever the host's load;
    returns the samples fed so far."""
    if clocked and samples > fed:
        for gpu in clocked:
            gpu.add_work((samples - fed) / len(clocked))
    return max(samples, fed)


def _simulated_window_s(clocked: list[Any], samples: int) -> float:
    """The simulated GPUs' time for ``samples`` trained at the current limit (split evenly between them)."""
    if not clocked or samples <= 0:
        return 0.0
    return max(g.power_model.seconds_per_sample(g.power_limit_w()) for g in clocked) * samples / len(clocked)


def _apply_limit(gpus: list[Any], limit_w: float | None, slowdown_file: Path | None, notes: list[str]) -> None:
    """Change the limit mid-run (inside applied_power_limit, which restores the original at exit)."""
    if limit_w is not None:
        for gpu in gpus:
            try:
                gpu.set_power_limit_w(limit_w)
            except Exception as err:  # not permitted: profile at the current limit, say so
                notes.append(f"power limit {limit_w:g} W not applied on {gpu.id}: {err}")
    if slowdown_file is not None:
        factor = next((g.slowdown_factor() for g in gpus if callable(getattr(g, "slowdown_factor", None))), 1.0)
        slowdown_file.write_text(f"{factor:.6f}", encoding="utf-8")


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
    sweep_limits_w: list[float] | None = None,
    stop_below_fraction: float | None = None,
    output_dir: Path | None = None,
    result_key: str | None = None,
    train_after_sweep: bool = False,
    stop_above_energy_j: float | None = None,
    stop_grace_s: float = ENERGY_STOP_GRACE_S,
) -> WrappedRun:
    """Run ``command`` under the plan's power limit with energy measured; never leaves a limit lowered.

    With ``profile_steps`` the run is a profile: after ``warmup_steps`` it measures ``profile_steps``
    steps at the plan's limit, or at each of ``sweep_limits_w`` in turn (highest first), stopping the
    sweep early once a limit's throughput falls below ``stop_below_fraction`` of the fastest. With
    ``train_after_sweep`` too the sweep is in-run profiling, as Zeus's JIT profiler: the measured windows are
    the training's first steps, kept, and once every limit was measured the training goes on to its end at the
    limit best for the job's objective (``WrappedRun.power_limit_w``); its windows are the profile.

    ``stop_above_energy_j``: an energy budget. Once the run's energy (GPUs and CPU, as it is accounted) passes it,
    the training is asked to stop (``carbonflow.training.should_stop()``), and stopped when it still runs
    ``stop_grace_s`` later; the run's note and ``WrappedRun.stopped_at_energy_budget_j`` say so.
    """
    check_energy_budget("stop_above_energy_j", stop_above_energy_j)
    check_energy_budget("stop_grace_s", stop_grace_s, optional=False)
    if not command:
        raise ValueError("command is empty; give the training command after '--'")
    if train_after_sweep and profile_steps is None:
        raise ValueError("train_after_sweep needs profile_steps (the window each swept limit is measured for)")
    found = discover_devices(spec.simulated_gpu, include_cpu=True)
    all_gpus = [d for d in found if d.kind == "gpu"]
    # One free GPU per container, leased for the wrapper's whole life; only those are capped and measured.
    gpus, lease = lease_run_gpus(all_gpus, plan.config.containers, group=plan.config.colocation_group)
    try:
        return _run_on(spec, plan, command, found, all_gpus, gpus, lease, result_path=result_path,
                       trace_csv=trace_csv, trace_interval_s=trace_interval_s, profile_steps=profile_steps,
                       warmup_steps=warmup_steps, sweep_limits_w=sweep_limits_w,
                       stop_below_fraction=stop_below_fraction, output_dir=output_dir,
                       result_key=result_key, train_after_sweep=train_after_sweep,
                       stop_above_energy_j=stop_above_energy_j, stop_grace_s=stop_grace_s)  # fmt: skip
    finally:
        if lease is not None:
            lease.release()


def _run_on(
    spec: JobSpec,
    plan: Plan,
    command: list[str],
    found: list[Any],
    all_gpus: list[Any],
    gpus: list[Any],
    lease: GpuLeaseSet | None,
    *,
    result_path: Path | None,
    trace_csv: Path | None,
    trace_interval_s: float,
    profile_steps: int | None,
    warmup_steps: int,
    sweep_limits_w: list[float] | None,
    stop_below_fraction: float | None,
    output_dir: Path | None,
    result_key: str | None = None,
    train_after_sweep: bool = False,
    stop_above_energy_j: float | None = None,
    stop_grace_s: float = ENERGY_STOP_GRACE_S,
) -> WrappedRun:
    devices = [*gpus, *(d for d in found if d.kind != "gpu")]
    _set_busy(all_gpus, False)  # a simulated GPU accrues energy only while the training works
    clocked = _work_clocked(gpus)
    for gpu in clocked:  # its time and energy follow the samples trained, never the host's clock
        gpu.follow_work()
    monitor = EnergyMonitor(devices)
    workdir = Path(tempfile.mkdtemp(prefix="carbonflow-run-"))
    lines = _pattern_progress(spec, plan)
    progress = _Progress(workdir / "progress.jsonl", lines)
    out_dir = output_dir or workdir / "output"
    out_dir.mkdir(parents=True, exist_ok=True)
    simulated = any(callable(getattr(g, "slowdown_factor", None)) for g in gpus)
    slowdown_file = workdir / "sim_slowdown" if simulated else None
    stop_file = workdir / "stop"
    budget = None if stop_above_energy_j is None else _EnergyBudget(stop_above_energy_j, stop_grace_s, monitor,
                                                                   stop_file)  # fmt: skip
    sweep: _Sweep | None = None
    if profile_steps is not None:
        limits: list[float | None] = list(sweep_limits_w) if sweep_limits_w else [plan.config.power_limit_w]
        sweep = _Sweep(limits, warmup_steps, profile_steps, stop_below_fraction, spec.profile_min_window_s,
                       keep_training=train_after_sweep)  # fmt: skip
        sweep.clocked = clocked
        sweep.objective, sweep.max_slowdown = spec.objective, spec.max_slowdown
    profiling_only = sweep is not None and not sweep.keep_training
    env = training_env(
        spec, progress.path, out_dir, stop_file, sweep.total_steps() if sweep is not None else None, slowdown_file,
        plan.config, profile=profiling_only,
    )  # fmt: skip
    if lines is not None:  # a Python script's print() reaches the pipe line by line, not at exit
        env.setdefault("PYTHONUNBUFFERED", "1")
    env = pinned_env(env, gpus)
    env = drop_privileges_for_training(env, [workdir, out_dir])
    command = [word.replace("{output_dir}", str(out_dir)) for word in command]
    cwd = _working_dir(spec)
    print(f"carbonflow run: {shlex.join(command)} (in {cwd or os.getcwd()}, interpreter {sys.executable})",
          file=sys.stderr, flush=True)  # fmt: skip

    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    started_at = utcnow()
    start_s = time.monotonic()
    exit_code = -1
    notes: list[str] = []
    not_restored: list[str] = []
    child: subprocess.Popen[bytes] | None = None
    first_limit = sweep.limit_w if sweep is not None else plan.config.power_limit_w
    try:
        with applied_power_limit(gpus, first_limit, lease=lease) as outcome:
            notes.extend(outcome.notes)
            _apply_limit(gpus, None, slowdown_file, notes)
            sampler = PowerSampler(devices, trace_interval_s, trace_csv) if trace_csv else None
            if sampler:
                sampler.__enter__()
            monitor.begin_window("run")
            try:
                child = start_child(command, env, lease, cwd=cwd, capture_output=lines is not None)
                if lines is not None:
                    lines.start(list(zip((child.stdout, child.stderr), own_streams(), strict=True)))
                busy = False
                fed = 0
                while True:
                    if received:
                        notes.append(f"wrapper received {signal.Signals(received[0]).name}: training stopped")
                        _stop_child(child)
                        exit_code = child.returncode if child.returncode is not None else -signal.SIGTERM
                        break
                    code = child.poll()
                    progress.poll()
                    fed = _feed_work(clocked, progress.samples, fed)
                    if not busy and progress.step > 0:
                        # A simulated GPU works from the first training step (the Zeus data has no
                        # idle power, so the process start-up before it accrues no GPU energy).
                        busy = _set_busy(gpus, True)
                    if sweep is not None and not sweep.done:
                        _advance_sweep(sweep, progress, monitor, gpus, slowdown_file, stop_file, notes)
                        if _silent_too_long(progress, start_s, spec.profile_report_timeout_s):
                            notes.append(
                                f"no progress reported within {spec.profile_report_timeout_s:g} s of the start: "
                                "profiling stopped the training (it must report progress to be measured)"
                            )
                            _stop_child(child)
                            exit_code = child.returncode if child.returncode is not None else -signal.SIGTERM
                            break
                        if lines is not None and lines.matched_nothing_in(sweep.warmup_steps + sweep.profile_steps + 1):
                            notes.append(unmatched_stop_note(lines.unmatched_late, lines.grace_s,
                                                             time.monotonic() - start_s))  # fmt: skip
                            _stop_child(child)
                            exit_code = child.returncode if child.returncode is not None else -signal.SIGTERM
                            break
                    if code is not None:
                        exit_code = code
                        break
                    if budget is not None and budget.overdue(child):
                        exit_code = budget.stop(child)
                        break
                    if lines is not None and profiling_only and sweep is not None and sweep.done:
                        exit_code = _stop_measured(child, notes)
                        break
                    time.sleep(POLL_S)
            finally:
                if child is not None and child.poll() is None:
                    _stop_child(child)
                    exit_code = child.returncode if child.returncode is not None else -signal.SIGTERM
                notes.extend(_left_behind_note(child))
                if lines is not None:  # the pipes end with the training: its last printed lines are reports too
                    lines.join()
                if child is not None:  # the training's last reports are the simulated GPU's work too
                    progress.poll()
                    fed = _feed_work(clocked, progress.samples, fed)
                if sweep is not None and not sweep.done and (sweep.open_at is not None or not sweep.windows):
                    _close_at_exit(sweep, progress, monitor, notes)
                total = monitor.end_window("run")
                if sweep is not None:
                    _energy_from_run(sweep.windows, total, notes, progress.samples)
                _set_busy(gpus, False)
                if sampler:
                    sampler.__exit__(None, None, None)
        applied = outcome.applied
        notes.extend(note for note in outcome.notes if note not in notes)  # restore notes come last
        not_restored = list(outcome.not_restored)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    ended_at = utcnow()
    if lines is not None:
        notes.extend(lines.notes())
    progress.poll()
    if exit_code < 0:
        notes.append(f"training process ended by signal {signal.Signals(-exit_code).name}")
    budget_note = budget.note() if budget is not None else None
    if budget_note:
        notes.append(budget_note)
    from carbonflow.accounting.energy import device_energies

    per_device = device_energies(total, devices)
    # an in-run profile's training ran on at the limit its sweep chose (None: it ended mid-sweep, at several)
    ran_at_w = sweep.chosen_w if sweep is not None and sweep.keep_training else plan.config.power_limit_w
    for entry in per_device:
        if entry.kind == "gpu":
            entry.power_limit_w = ran_at_w if applied and not profiling_only else None
    windows = sweep.windows if sweep is not None else []
    first = windows[0] if windows and profiling_only else None  # a training's pace is its whole run's
    duration_s = host_s = time.monotonic() - start_s
    if clocked and fed > 0:  # a simulated GPU's run lasts the simulated time of its work, not the host's
        duration_s = max(g.simulated_s() for g in clocked)
        notes.append(
            f"simulated GPU clock: {fed} samples took {duration_s:.3f} s of simulated GPU time (energy and duration "
            f"follow the work and the configuration); the host's wall time was {host_s:.2f} s"
        )
    wrapped = WrappedRun(
        job=spec.name,
        config_key=plan.config.key(),
        started_at=started_at,
        ended_at=ended_at,
        duration_s=duration_s,
        exit_code=exit_code,
        devices=per_device,
        steps=progress.step,
        samples=progress.samples,
        throughput_samples_per_s=(first.samples / first.window_s)
        if first and first.window_s > 0
        else (progress.samples / duration_s if duration_s > 0 else 0.0),
        measured_window_s=first.window_s if first else 0.0,
        measured_samples=first.samples if first else 0,
        measured_energy_j=dict(first.energy_j) if first else {},
        measured_energy_window_s=first.energy_window_s if first else 0.0,
        windows=windows,
        metrics=progress.final_metrics(),
        power_limit_applied=applied,
        power_limit_w=ran_at_w,
        power_limits_not_restored=not_restored,
        notes=notes,
        power_trace_csv=str(trace_csv) if trace_csv else None,
        output_dir=str(out_dir),
        stopped_at_energy_budget_j=stop_above_energy_j if budget_note else None,
    )
    emit_result(wrapped, result_path, result_key)
    if received:
        raise Terminated(received[0])
    return wrapped


def _advance_sweep(
    sweep: _Sweep,
    progress: _Progress,
    monitor: EnergyMonitor,
    gpus: list[Any],
    slowdown_file: Path | None,
    stop_file: Path,
    notes: list[str],
) -> None:
    """Open, close and move on between the sweep's measured windows as the training reports steps."""
    measure_from = sweep.phase_start_step + sweep.warmup_for_phase()
    if sweep.open_at is None and progress.step >= measure_from and progress.last is not None:
        monitor.begin_window("measured")
        sweep.open_at = progress.last
        return
    if sweep.open_at is None or progress.step < measure_from + sweep.profile_steps or progress.last is None:
        return
    if progress.last[0] - sweep.open_at[0] < sweep.min_window_s:
        return  # fast steps: keep measuring until the window is long enough to mean something
    window = _close_window(sweep, progress, monitor)
    speeds = [w.samples / w.window_s for w in sweep.windows if w.window_s > 0]
    too_slow = (
        sweep.slowest_fraction is not None and len(speeds) > 1 and speeds[-1] < sweep.slowest_fraction * max(speeds)
    )
    if too_slow:
        notes.append(f"sweep stopped after {window.power_limit_w} W: slower than allowed")
    if too_slow or sweep.index + 1 >= len(sweep.limits_w):
        sweep.done = True
        if sweep.keep_training:  # in-run profiling: the measured prefix is training kept; go on at the best limit
            sweep.chosen_w = _best_limit(sweep, gpus, notes)
            _apply_limit(gpus, sweep.chosen_w, slowdown_file, notes)
            return
        stop_file.touch()  # the training's should_stop() turns true
        return
    sweep.index += 1
    sweep.phase_start_step = progress.step
    _apply_limit(gpus, sweep.limit_w, slowdown_file, notes)


def _best_limit(sweep: _Sweep, gpus: list[Any], notes: list[str]) -> float | None:
    """The swept limit best for the job's objective (``choose_power_limit`` over the measured windows: time and
    power of the same work), within its ``max_slowdown``; the first limit when no window measured energy."""
    from carbonflow.objectives import choose_power_limit

    usable = [w for w in sweep.windows if w.samples > 0 and w.window_s > 0 and w.energy_window_s > 0]
    if not usable or any(w.power_limit_w is None for w in usable):
        notes.append("in-run profiling: no window measured energy at a set limit; training on at the first limit")
        return sweep.limits_w[0]
    gpu = gpus[0] if gpus else None
    limits = gpu.power_limit_constraints_w() if gpu is not None and gpu.supports_power_limit else None
    default_w = gpu.default_power_limit_w() if limits is not None else None
    chosen = choose_power_limit(
        [w.power_limit_w for w in usable],  # type: ignore[misc]
        [w.window_s / w.samples for w in usable],
        [sum(w.energy_j.values()) / w.energy_window_s for w in usable],
        objective=sweep.objective, max_slowdown=sweep.max_slowdown, default_power_limit_w=default_w,
        max_power_w=limits[1] if limits is not None else None,
    )  # fmt: skip
    notes.append(
        f"{IN_RUN_PROFILE}: swept {', '.join(f'{w.power_limit_w:g} W' for w in usable)} inside the training (work "
        f"kept); trained on at {chosen:g} W, best for objective {sweep.objective}"
    )
    return chosen


def _close_window(sweep: _Sweep, progress: _Progress, monitor: EnergyMonitor) -> MeasuredWindow:
    """End the open measured window at the last progress report and record it."""
    energy = monitor.end_window("measured")
    (t0, s0), (t1, s1) = sweep.open_at, progress.last  # type: ignore[misc]
    window = MeasuredWindow(
        power_limit_w=sweep.limit_w, samples=s1 - s0, window_s=max(t1 - t0, 0.0), energy_j=dict(energy.energy_j),
        energy_window_s=energy.elapsed_s, step_time_cv=progress.step_time_cv(t0, t1),
        steps=progress.reports_between(t0, t1),
    )  # fmt: skip
    if sweep.clocked:  # on the simulated GPU's clock: the window's samples at its limit (host load aside)
        window.window_s = window.energy_window_s = _simulated_window_s(sweep.clocked, window.samples)
    sweep.windows.append(window)
    sweep.open_at = None
    return window


def _close_at_exit(sweep: _Sweep, progress: _Progress, monitor: EnergyMonitor, notes: list[str]) -> None:
    """The training ended mid-phase: keep what it measured of this phase.

    A job shorter than the profile budget, or whose steps outran the wrapper's polling, still gives a
    window: from the training's own first report after warm-up (the plain warm-up when the job ended before
    the longer first-phase one) to its last report. Shorter than ``min_window_s``, the window reaches back to
    the phase's first report; still shorter, it never decides alone (:func:`_too_short`). Its energy is the
    measured window's when that covers it, else the run's per sample (:func:`_energy_from_run`).
    """
    progress.poll()
    energy = monitor.end_window("measured") if sweep.open_at is not None else None
    opened_at, sweep.open_at = sweep.open_at, None
    start = progress.since(sweep.phase_start_step + sweep.warmup_for_phase()) or progress.since(
        sweep.phase_start_step + sweep.warmup_steps
    )
    if _span_s(progress, start) <= 0 or _span_s(progress, start) < sweep.min_window_s:
        start = progress.since(sweep.phase_start_step)  # every report of the phase, warm-up included
    if _span_s(progress, start) <= 0 or _span_s(progress, start) < sweep.min_window_s:
        _too_short(sweep, progress, start, notes)
        return
    (t0, s0), (t1, s1) = start, progress.last  # type: ignore[misc]
    covered = energy is not None and opened_at is not None and opened_at[0] <= t0
    window = MeasuredWindow(
        power_limit_w=sweep.limit_w, samples=s1 - s0, window_s=t1 - t0,
        energy_j=dict(energy.energy_j) if covered else {}, energy_window_s=energy.elapsed_s if covered else 0.0,
        step_time_cv=progress.step_time_cv(t0, t1), steps=progress.reports_between(t0, t1),
    )  # fmt: skip
    if sweep.clocked:
        window.window_s = _simulated_window_s(sweep.clocked, window.samples)
        window.energy_window_s = window.window_s if covered else 0.0
    sweep.windows.append(window)
    if progress.step < sweep.phase_start_step + sweep.warmup_for_phase() + sweep.profile_steps:
        notes.append(
            f"{SHORT_WINDOW}: the training ended {window.window_s:.2f} s into it at {window.power_limit_w} W "
            f"(asked: {sweep.profile_steps} steps, at least {sweep.min_window_s:g} s); kept, with its "
            f"{window.samples} samples"
        )


def _span_s(progress: _Progress, start: tuple[float, int] | None) -> float:
    """Seconds from the report ``start`` to the training's last report (0 without both)."""
    return progress.last[0] - start[0] if start is not None and progress.last is not None else 0.0


def _too_short(sweep: _Sweep, progress: _Progress, start: tuple[float, int] | None, notes: list[str]) -> None:
    """The phase's reports span less than ``min_window_s``: never a rate from them alone. The first phase falls
    back to the whole run (process start to last report, start-up included, every sample); a later one is
    dropped (the limits before it were measured). Either way the run's note says so (:data:`WINDOW_TOO_SHORT`)."""
    if progress.last is None or progress.samples <= 0:
        return
    spanned = _span_s(progress, start)
    told = (
        f"{WINDOW_TOO_SHORT}: the progress reports at {sweep.limit_w} W span {spanned:.2f} s, less than "
        f"profile_min_window_s={sweep.min_window_s:g} s"
    )
    if sweep.index > 0:
        notes.append(f"{told}; that limit is left out of the profile")
        return
    t1, s1 = progress.last
    window_s = max(t1 - sweep.created_s, spanned)
    if sweep.clocked:  # a simulated GPU's clock has no start-up: the run's samples at this limit
        window_s = _simulated_window_s(sweep.clocked, s1)
    sweep.windows.append(
        MeasuredWindow(
            power_limit_w=sweep.limit_w, samples=s1, window_s=window_s, energy_j={}, energy_window_s=0.0,
            step_time_cv=progress.step_time_cv(sweep.created_s, t1), steps=len(progress.reports), label="whole run",
        )
    )  # fmt: skip
    notes.append(
        f"{told}; measured over the whole run instead ({window_s:.2f} s from the process start, {s1} samples, "
        "start-up included): a longer job, or a longer profile (profile_steps), measures its steady pace"
    )


def _energy_from_run(
    windows: list[MeasuredWindow], total: Any, notes: list[str], run_samples: int | None = None
) -> None:
    """A window whose energy reading covers too little of it (opened late) takes the run's energy per sample
    (the run's mean power over the window's length when the run's samples are unknown): never the power of a
    whole process life, start-up included, over a window a fraction of it, which made a rate 10× too low."""
    for window in windows:
        if window.window_s > 0 and window.energy_window_s < 0.5 * window.window_s and total.elapsed_s > 0:
            if run_samples:
                share = min(window.samples / run_samples, 1.0)
                window.energy_j = {device: joules * share for device, joules in total.energy_j.items()}
                window.energy_window_s = window.window_s
            else:
                window.energy_j = dict(total.energy_j)
                window.energy_window_s = total.elapsed_s
            notes.append(f"{SHORT_WINDOW}: the window at {window.power_limit_w} W was shorter than one energy reading: "
                         "its energy is the run's per sample")  # fmt: skip


def _pattern_progress(spec: JobSpec, plan: Plan) -> PatternProgress | None:
    """The reader of the training's printed lines when the job has a ``progress_pattern``."""
    if spec.progress_pattern is None:
        return None
    grace_s = min(UNMATCHED_GRACE_S, spec.profile_report_timeout_s / 10)
    return PatternProgress(
        spec.progress_pattern, plan.config.batch_size or spec.batch_size, spec.samples_per_epoch, grace_s=grace_s
    )


def _stop_measured(child: subprocess.Popen[bytes], notes: list[str]) -> int:
    """Profile mode, progress from printed lines: the sweep has measured every limit. Such a script does not
    read the stop file, so the wrapper stops it; a planned end (0), unless it had failed on its own."""
    code = child.poll()
    if code is None:
        _stop_child(child)
        notes.append("profiling stopped the training once it was measured (progress_pattern: the script does not "
                      "read the stop file)")  # fmt: skip
        return 0
    return code


def _silent_too_long(progress: _Progress, start_s: float, timeout_s: float) -> bool:
    """Profile mode: the training has reported nothing for ``timeout_s`` since it started."""
    return progress.step == 0 and time.monotonic() - start_s > timeout_s


def _stop_child(child: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group; after a grace period the guard kills every process of the training
    (SIGUSR1: its session-leaving descendants too), and SIGKILL of the group is the last resort."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.kill(child.pid, signal.SIGUSR1)
            child.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _left_behind_note(child: subprocess.Popen[bytes] | None) -> list[str]:
    """The note a guard's sweep leaves: how many processes the training left running that it killed."""
    left = child.left_behind() if isinstance(child, GuardedChild) and child.returncode is not None else 0
    return [f"killed {left} process{'es' if left != 1 else ''} the training left behind"] if left else []


def emit_result(run: BaseModel, result_path: Path | None, result_key: str | None) -> None:
    """Write the run's result file and print it as the last line of stdout (the log's copy).

    With the run's key (``CARBONFLOW_RESULT_KEY``, given by the backend) both are signed
    (:mod:`carbonflow.execution.signing`) and the backend believes nothing else; without one (``carbonflow run``
    by hand) the file is plain JSON. Kubernetes keeps only 4 KiB of /dev/termination-log: compact text there.
    """
    compact = run.model_dump_json()
    if result_path is not None:
        on_device = str(result_path).startswith("/dev/")
        if not on_device:
            result_path.parent.mkdir(parents=True, exist_ok=True)
        text = sign_result(compact, result_key) if result_key else run.model_dump_json(indent=None if on_device else 2)
        result_path.write_text(text, encoding="utf-8")
    print(result_line(compact, result_key) if result_key else f"{RESULT_LINE_PREFIX} {compact}", flush=True)


def main_from_files(job_path: Path, plan_path: Path, result_path: Path, command: list[str], **kwargs: object) -> int:
    """CLI entry: read and validate the job and plan files, run, write the result. Returns an exit code.

    The run's result key is taken out of the environment first, so the training never inherits it.
    """
    result_key = take_result_key()
    spec = JobSpec.model_validate_json(Path(job_path).read_text(encoding="utf-8"))
    plan = Plan.model_validate_json(Path(plan_path).read_text(encoding="utf-8"))
    try:
        wrapped = run_wrapped(spec, plan, command, result_path=result_path, result_key=result_key, **kwargs)  # type: ignore[arg-type]
    except GpuUnavailable as err:
        print(f"carbonflow run: {err}", file=sys.stderr)
        return GPU_UNAVAILABLE_EXIT
    except ValueError as err:  # bad input found before the training started
        print(f"carbonflow run: error: {err}", file=sys.stderr)
        return 2
    except Terminated as err:
        print(f"carbonflow run: {err}; power limits restored", file=sys.stderr)
        return 128 + err.signum
    return shell_exit_status(wrapped.exit_code)
