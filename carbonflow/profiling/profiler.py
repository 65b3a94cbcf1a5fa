"""Profile a job under candidate configurations (SCORER's "profile → estimate → configure").

Each container count (``min..max``) runs once through the same ``carbonflow run`` wrapper and
backend as training. Inside that run the wrapper sweeps the power limits from the maximum down in
``step_w`` steps (Koszczał et al.'s sweep), changing the limit in the running training as Zeus's
just-in-time profiler does: after each change it lets ``profile_warmup_steps`` pass, then measures
``profile_steps`` steps. The sweep is pruned: it stops once a limit is slower than the fastest by
more than twice the job's allowed slowdown, since every lower limit is slower still (and could
never be chosen). One process start per container count keeps profiling cheap.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from carbonflow.domain import PROFILE_NOISE, Config, JobSpec, Plan, Profile, ProfilePoint, utcnow
from carbonflow.energy.device import Device
from carbonflow.execution.backend import RunOptions
from carbonflow.execution.pair_wrapper import SharedMember, SharedRequest, SharedRun, contention_note
from carbonflow.execution.wrapper import IN_RUN_PROFILE, SHORT_WINDOW, WINDOW_TOO_SHORT, MeasuredWindow, WrappedRun
from carbonflow.progress_pattern import UNMATCHED_NOTE, UNMATCHED_STOP_NOTE

if TYPE_CHECKING:
    from carbonflow.planning.pairs import PairProfile

log = logging.getLogger(__name__)

DEFAULT_STEP_W = 25.0


class Executor(Protocol):
    """What profiling needs of a backend: the contract's ``execute`` (see ``carbonflow.execution.backend.Backend``)."""

    def execute(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, **fields: Any) -> WrappedRun: ...


class ProfileWindowTooShort(UserWarning):
    """A profiled configuration's progress reports spanned less than the job's ``profile_min_window_s``, even
    all of them: the profile measured it over the whole run instead (start-up included) or left that power
    limit out. A prediction from it is a fallback, not a steady-state rate; the profile's notes say so too."""


class ProfilingError(RuntimeError):
    """Profiling could not measure the job; the message says what to change and where the training's log is."""


def _log_path(run: WrappedRun) -> str:
    return str(Path(run.output_dir).parent / "training.log") if run.output_dir else "(no log)"


def _log_tail(run: WrappedRun, lines: int = 3) -> str:
    path = Path(_log_path(run))
    if not path.is_file():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = [line.strip() for line in text if line.strip() and not line.startswith("CARBONFLOW_RESULT")]
    return " | ".join(kept[-lines:])


def silent_job_message(spec: JobSpec, run: WrappedRun) -> str:
    """What to tell the user of a training that reported no progress while it was profiled: a training that
    failed before its first report is told as a failure, with its log's last lines."""
    stopped_by_us = any("no progress reported" in note or note.startswith(UNMATCHED_STOP_NOTE) for note in run.notes)
    if run.exit_code != 0 and not stopped_by_us:
        tail = _log_tail(run)
        return (
            f"profiling {spec.name}: the training failed (exit code {run.exit_code}) before reporting any progress; "
            f"its log: {_log_path(run)}" + (f"; last lines: {tail}" if tail else "")
        )
    unmatched = next((note for note in run.notes if note.startswith(UNMATCHED_NOTE)), None)
    early = next((note for note in run.notes if note.startswith(UNMATCHED_STOP_NOTE)), None)
    if unmatched is not None:
        return (
            f"profiling {spec.name} measured nothing in its first profiling window: {unmatched}"
            + (f" ({early[len('profiling ') :]})" if early else "")
            + ". Make the pattern "
            'match the line the script prints once per epoch or step (docs/own-job.md, "Progress from the '
            f"script's own output\"). The training's log: {_log_path(run)}"
        )
    return (
        f"profiling {spec.name} measured nothing: the training reported no progress in {run.duration_s:.0f} s "
        f"(exit code {run.exit_code}). carbonflow measures throughput from progress reports: call "
        "carbonflow.training.report(step, samples) after each optimiser step, or append JSON lines "
        '{"step": N, "samples": M} to the file named by $CARBONFLOW_PROGRESS_FILE, and stop when '
        "carbonflow.training.should_stop() is true; or, for a script that prints a line per epoch, give the job a "
        f"progress_pattern (docs/own-job.md). The training's log: {_log_path(run)}"
    )


def candidate_power_limits_w(spec: JobSpec, gpu: Device | None, step_w: float = DEFAULT_STEP_W) -> list[float | None]:
    """Power limits to try, highest first: the job's own list, else the device's range in ``step_w`` steps.

    A GPU job profiled where this process sees no GPU (a Kubernetes worker: the GPU is the pod's) sweeps its own
    ``power_limits_w``, which the wrapper in the pod applies (noting any its GPU refuses); without them, none.
    """
    if gpu is None and spec.device_kind == "gpu" and spec.power_limits_w:
        return sorted(set(spec.power_limits_w), reverse=True)
    if gpu is None or not gpu.supports_power_limit:
        return [None]
    low_w, high_w = gpu.power_limit_constraints_w()
    if spec.power_limits_w:
        for limit in spec.power_limits_w:
            gpu.check_power_limit_w(limit)
        return sorted(set(spec.power_limits_w), reverse=True)
    if step_w <= 0:
        raise ValueError(f"step_w={step_w} is not allowed; it must be a positive number of watts")
    limits = []
    limit = high_w
    while limit >= low_w - 1e-9:
        limits.append(round(limit, 3))
        limit -= step_w
    return limits


def _point(window: MeasuredWindow, config: Config, label: str, job: str) -> ProfilePoint:
    if window.samples <= 0 or window.window_s <= 0 or window.energy_window_s <= 0:
        raise ProfilingError(
            f"profiling {config.key()} of {job} measured no progress; does the training call "
            "carbonflow.training.report() (or append to $CARBONFLOW_PROGRESS_FILE)?"
        )
    # Throughput from the training's own timestamps; power from the energy window around them.
    throughput = window.samples / window.window_s
    power_w = {device: joules / window.energy_window_s for device, joules in window.energy_j.items()}
    return ProfilePoint(
        config=config,
        throughput_samples_per_s=throughput,
        power_per_device_w=power_w,
        energy_per_sample_j=sum(power_w.values()) / throughput,
        duration_s=window.window_s,
        samples=window.samples,
        label=label,  # type: ignore[arg-type]
        throughput_spread=window.step_time_cv / window.steps**0.5 if window.step_time_cv and window.steps else None,
    )


NOISE_Z = 2.0
"""Points closer than this many combined standard errors are not told apart (≈ 95 % for two points)."""


def noise_note(points: list[ProfilePoint]) -> str | None:
    """When the profiled configurations' energy per sample differ less than their own step times' spread allows
    to tell apart, say so: a choice between them would be a choice on noise."""
    spreads = [p.throughput_spread for p in points if p.throughput_spread is not None]
    if len(points) < 2 or len(spreads) < len(points):
        return None
    energies = [p.energy_per_sample_j for p in points]
    mean = sum(energies) / len(energies)
    if mean <= 0:
        return None
    range_fraction = (max(energies) - min(energies)) / mean
    combined = NOISE_Z * (2 * max(spreads) ** 2) ** 0.5
    if range_fraction >= combined:
        return None
    return (
        f"profiled configurations differ by {range_fraction * 100:.1f} % in energy per sample, less than their "
        f"step times' spread tells apart ({combined * 100:.1f} %): {PROFILE_NOISE}; "
        "carbonflow keeps the default power limit until longer profiles or real runs tell them apart"
    )


def profile_job(
    spec: JobSpec,
    backend: Executor,
    devices: list[Device],
    *,
    samples_per_epoch: int | None = None,
    step_w: float = DEFAULT_STEP_W,
    on_progress: Callable[[str, int, int], None] | None = None,
    probe: bool = False,
) -> Profile:
    """Profile ``spec`` and return its Profile; ``on_progress(config_key, done, planned)`` reports progress.

    ``probe``: a short single-limit probe (the highest limit only), enough to plan the first run, which then
    sweeps the limits inside itself and keeps that work (:func:`in_run_options`); the probe's own work is thrown
    away like a profile's."""
    sweep = ProfileSweep(spec, devices, samples_per_epoch=samples_per_epoch, step_w=step_w, on_progress=on_progress,
                         probe=probe)  # fmt: skip
    while (planned := sweep.next_run()) is not None:
        sweep.add(backend.execute(spec, *planned))
    return sweep.profile()


class SweepState(BaseModel):
    """A profile's sweep so far, as JSON: what a task that waits between runs (deferred) carries."""

    model_config = ConfigDict(extra="forbid")

    job: str
    runs_done: int = 0
    points: list[ProfilePoint] = Field(default_factory=list)
    window_notes: list[str] = Field(default_factory=list)


class ProfileSweep:
    """:func:`profile_job` one run at a time: :meth:`next_run` gives the next container count's plan and options
    (None when all ran), :meth:`add` takes what it measured, :meth:`profile` makes the profile. ``state`` (a
    :class:`SweepState`) lets a caller that waits for each run elsewhere (a deferred Airflow task on Kubernetes)
    pick the sweep up again on another worker."""

    def __init__(
        self,
        spec: JobSpec,
        devices: list[Device],
        *,
        samples_per_epoch: int | None = None,
        step_w: float = DEFAULT_STEP_W,
        on_progress: Callable[[str, int, int], None] | None = None,
        state: SweepState | None = None,
        probe: bool = False,
    ) -> None:
        self.spec, self.devices = spec, devices
        self.samples_per_epoch, self.on_progress = samples_per_epoch, on_progress
        gpus = [d for d in devices if d.kind == "gpu"]
        self.gpu = gpus[0] if gpus else None
        self.limits = candidate_power_limits_w(spec, self.gpu, step_w)
        if probe:  # one limit, the highest: the first training run sweeps the rest inside itself
            self.limits = self.limits[:1]
        self.counts = list(range(spec.min_containers, spec.max_containers + 1))
        self.planned = len(self.counts) * len(self.limits)
        self.label = (
            "simulated"
            if any(d.label == "simulated" for d in devices)
            else ("estimated" if any(d.label == "estimated" for d in devices) else "measured")
        )
        self.stop_below = 1 / (1 + 2 * spec.max_slowdown)
        self.state = state or SweepState(job=spec.name)
        if self.state.job != spec.name:
            raise ValueError(f"a sweep state of job {self.state.job!r} given to profile {spec.name!r}")

    def next_run(self) -> tuple[Plan, RunOptions] | None:
        """The next container count's plan and run options, or None when every count ran."""
        if self.state.runs_done >= len(self.counts):
            return None
        spec, count, limits = self.spec, self.counts[self.state.runs_done], self.limits
        plan = Plan(
            job=spec.name, config=Config(containers=count, power_limit_w=limits[0]), start=utcnow(),
            predicted_duration_s=0, predicted_energy_j=0, predicted_emissions_g=0, region=spec.region,
            forecast_provider="none (profiling)", reason=f"profiling {count} container(s)",
        )  # fmt: skip
        sweep = [w for w in limits if w is not None]
        options = RunOptions(
            run_name=f"profile-c{count}", profile_steps=spec.profile_steps, warmup_steps=spec.profile_warmup_steps,
            trace=False, sweep_limits_w=sweep or None, stop_below_fraction=self.stop_below if sweep else None,
        )  # fmt: skip
        return plan, options

    def add(self, run: WrappedRun, config: Config | None = None) -> None:
        """What the run :meth:`next_run` planned measured: one point per swept limit (ProfilingError when nothing).

        ``config``: the configuration the run trained (an in-run profile, :func:`profile_from_training`): its
        points keep its containers and batch size; else the planned container count's."""
        spec = self.spec
        count = config.containers if config is not None else self.counts[self.state.runs_done]
        if run.steps == 0:  # found at the first attempt, not once per container count
            raise ProfilingError(silent_job_message(spec, run))
        if run.exit_code != 0:
            raise ProfilingError(
                f"profiling {count} container(s) of {spec.name} failed with exit code {run.exit_code}; "
                f"its log: {_log_path(run)}"
            )
        for window in run.windows:
            base = config or Config(containers=count)
            point_config = base.model_copy(update={"power_limit_w": window.power_limit_w, "colocation_group": None})
            point = _point(window, point_config, self.label, spec.name)  # type: ignore[arg-type]
            self.state.points.append(point)
            if self.on_progress:
                self.on_progress(point_config.key(), len(self.state.points), self.planned)
            log.info(
                "profiled %s: %.1f samples/s, %.4f J/sample", point_config.key(), point.throughput_samples_per_s,
                point.energy_per_sample_j,
            )  # fmt: skip
        short = [note for note in run.notes if note.startswith((SHORT_WINDOW, WINDOW_TOO_SHORT))]
        for note in short:
            log.warning("%s, %d container(s): %s", spec.name, count, note)
            if note.startswith(WINDOW_TOO_SHORT):
                warnings.warn(f"{spec.name}, {count} container(s): {note}", ProfileWindowTooShort, stacklevel=3)
        self.state.window_notes += short
        if len(run.windows) < len(self.limits):
            log.info("%d container(s): sweep stopped early (slower than max_slowdown allows)", count)
        self.state.runs_done += 1

    def profile(self) -> Profile:
        """The profile of every point measured (ProfilingError when there is none)."""
        spec, gpu, devices, points = self.spec, self.gpu, self.devices, self.state.points
        if not points:
            raise ProfilingError(f"profiling {spec.name} measured nothing; does the training report progress?")
        noise = noise_note(points)
        if noise:
            log.warning("%s: %s", spec.name, noise)
        default_w = gpu.default_power_limit_w() if gpu is not None and gpu.supports_power_limit else None
        max_power_w = gpu.power_limit_constraints_w()[1] if gpu is not None and gpu.supports_power_limit else None
        return Profile(
            job=spec.name,
            device_model=gpu.model if gpu is not None else next((d.model for d in devices if d.kind == "cpu"), "cpu"),
            device_kind="gpu" if gpu is not None else "cpu",
            label=self.label,  # type: ignore[arg-type]
            code_version=spec.code_version,
            default_power_limit_w=default_w,
            max_power_w=max_power_w,
            samples_per_epoch=self.samples_per_epoch,
            points=list(points),
            notes=[*self.state.window_notes, *([noise] if noise else [])],
        )


# ---- in-run profiling -------------------------------------------------------------------------
IN_RUN_MIN_LIMITS = 2
"""A configuration's batch size and containers are profiled when the profile holds this many power limits there;
fewer (none, or a single-limit probe), its first training run sweeps the limits inside itself."""


def needs_in_run_profile(spec: JobSpec, profile: Profile | None, config: Config) -> bool:
    """Whether a training at ``config`` should sweep its power limits inside itself: its batch size and container
    count have fewer than :data:`IN_RUN_MIN_LIMITS` profiled limits (never profiled, or only probed)."""
    from carbonflow.planning.batch_size import batch_size_of

    if profile is None:
        return True
    bs = batch_size_of(config, spec)
    limits = {
        p.config.power_limit_w
        for p in profile.points
        if batch_size_of(p.config, spec) == bs and p.config.containers == config.containers
        and not p.config.colocation_group and p.config.power_limit_w is not None
    }  # fmt: skip
    return len(limits) < IN_RUN_MIN_LIMITS


def in_run_options(
    spec: JobSpec, devices: list[Device], run_name: str = "train", step_w: float = DEFAULT_STEP_W
) -> RunOptions | None:
    """Run options that make a training profile itself (None when there is no power limit to sweep): the sweep's
    windows (``profile_warmup_steps`` then ``profile_steps`` per limit, highest first, pruned as a separate
    profile's) are the training's first steps, kept, and it trains on at the best limit for the job's objective.
    The work is the job's: nothing is discarded."""
    gpus = [d for d in devices if d.kind == "gpu"]
    sweep = [w for w in candidate_power_limits_w(spec, gpus[0] if gpus else None, step_w) if w is not None]
    if len(sweep) < IN_RUN_MIN_LIMITS:
        return None
    return RunOptions(
        run_name=run_name, profile_steps=spec.profile_steps, warmup_steps=spec.profile_warmup_steps,
        sweep_limits_w=sweep, stop_below_fraction=1 / (1 + 2 * spec.max_slowdown), train_after_sweep=True,
    )  # fmt: skip


def profile_from_training(
    spec: JobSpec,
    devices: list[Device],
    config: Config,
    run: WrappedRun,
    *,
    samples_per_epoch: int | None = None,
    earlier: Profile | None = None,
) -> Profile:
    """The profile a training run measured inside itself (:func:`in_run_options`), one point per swept limit at
    ``config``'s containers and batch size, merged into ``earlier`` (its points at other configurations kept): the
    next night's planner reads it as it reads a separate profile. ProfilingError when it measured nothing."""
    sweep = ProfileSweep(spec, devices, samples_per_epoch=samples_per_epoch)
    sweep.add(run, config)
    fresh = sweep.profile()
    note = (
        f"{IN_RUN_PROFILE}: {len(fresh.points)} limit(s) at {config.model_copy(update={'power_limit_w': None}).key()}"
        " measured inside a training run (its work kept)"
    )
    return merged_profile(fresh, earlier, note)


def merged_profile(fresh: Profile, earlier: Profile | None, note: str) -> Profile:
    """``fresh``'s points merged into ``earlier``'s (a point of ``earlier`` at a configuration ``fresh`` measured is
    replaced, the others kept), with ``note`` added to ``fresh``'s notes: the profile the next night reads."""
    keys = {p.config.key() for p in fresh.points}
    kept = [p for p in (earlier.points if earlier is not None else []) if p.config.key() not in keys]
    per_epoch = fresh.samples_per_epoch or (earlier.samples_per_epoch if earlier is not None else None)
    points, notes = [*kept, *fresh.points], [*fresh.notes, note]
    return fresh.model_copy(update={"points": points, "notes": notes, "samples_per_epoch": per_epoch})


BATCH_SIZE_PROBE = "batch-size probe"
"""Starts the note of a profile that merged single-limit probes of batch sizes the explorer asked for."""


def run_probes(
    spec: JobSpec,
    backend: Executor,
    devices: list[Device],
    configs: list[Config],
    earlier: Profile,
    *,
    samples_per_epoch: int | None = None,
    on_progress: Callable[[Config, int, int], None] | None = None,
) -> Profile:
    """Probe each of ``configs`` with one short single-limit run at its batch size and power limit
    (``profile_warmup_steps``, then ``profile_steps`` measured; a separate pass whose work is thrown away, like a
    profile) and merge the points into ``earlier``, whose points at other configurations are kept
    (:func:`merged_profile`). ``on_progress(config, n, of)`` is told before each probe. A probe that measured
    nothing is left out with a warning; ``earlier`` itself when none measured anything."""
    sweep = ProfileSweep(spec, devices, samples_per_epoch=samples_per_epoch, probe=True)
    for n, config in enumerate(configs, 1):
        if on_progress is not None:
            on_progress(config, n, len(configs))
        try:
            sweep.add(backend.execute(spec, *_probe_run(spec, config)), config)
        except ProfilingError as err:
            log.warning("%s: the probe of %s measured nothing usable (%s); left out", spec.name, config.key(), err)
    if not sweep.state.points:
        return earlier
    fresh = sweep.profile()
    probed = ", ".join(p.config.key() for p in fresh.points)
    note = f"{BATCH_SIZE_PROBE}: {probed} probed at one limit each (a separate pass, its work thrown away)"
    # One limit per batch size: there are no power limits to tell apart, so no noise note of the probes'; the
    # earlier profile's notes (its own limits' noise among them) stay, as its points do.
    windows = [n for n in fresh.notes if PROFILE_NOISE not in n]
    notes = list(dict.fromkeys([*earlier.notes, *windows, note]))
    return merged_profile(fresh, earlier, note).model_copy(update={"notes": notes})


def _probe_run(spec: JobSpec, config: Config) -> tuple[Plan, RunOptions]:
    """A batch-size probe's plan and run options: one measured window at the configuration's limit."""
    limit = "no power limit" if config.power_limit_w is None else f"{config.power_limit_w:g} W"
    plan = Plan(
        job=spec.name, config=config, start=utcnow(), predicted_duration_s=0, predicted_energy_j=0,
        predicted_emissions_g=0, region=spec.region, forecast_provider="none (profiling)",
        reason=f"probing batch size {config.batch_size} at {limit}",
    )  # fmt: skip
    options = RunOptions(run_name=f"probe-b{config.batch_size}", profile_steps=spec.profile_steps,
                         warmup_steps=spec.profile_warmup_steps, trace=False)  # fmt: skip
    return plan, options


def pair_member(spec: JobSpec, plan: Plan, profile: Profile, min_kept_speed: float | None = None) -> SharedMember:
    """One job of a co-located pair, with its solo speed and power at its reference configuration (its profile)."""
    from carbonflow.planning.optimizer import default_point

    point = default_point(spec, profile.points, profile)
    return SharedMember(
        job=spec, plan=plan, command=["(filled in by the backend)"], min_kept_speed=min_kept_speed,
        solo_throughput_samples_per_s=point.throughput_samples_per_s,
        solo_power_w=sum(point.power_per_device_w.values()) or None,
    )  # fmt: skip


class SharedExecutor(Protocol):
    def execute_shared(self, request: SharedRequest, options: RunOptions | None = None, **fields: Any) -> SharedRun: ...


def profile_pair(
    spec_a: JobSpec,
    spec_b: JobSpec,
    profile_a: Profile,
    profile_b: Profile,
    backend: SharedExecutor,
    *,
    profile_steps: int | None = None,
) -> PairProfile:
    """Run two recurring jobs together briefly on one GPU: the speed each keeps and the GPU's power.

    Both run at their reference configuration (one container, the default power limit), where the
    planner predicts co-located runs; each one's kept speed is its throughput together over its solo
    throughput at the same configuration, from its profile — on a real GPU. On a simulated GPU it is the
    simulated device's own (Gavel's pair speeds): the two real trainings share this machine's CPUs too, and
    that contention is logged apart (``host_pace``), never taken for the GPU's.
    """
    from carbonflow.planning.optimizer import default_point
    from carbonflow.planning.pairs import PairProfile

    members = []
    limits = []
    for spec, profile in ((spec_a, profile_a), (spec_b, profile_b)):
        point = default_point(spec, profile.points, profile)
        if point.config.containers != 1:
            raise ValueError(f"{spec.name}: co-location needs a one-container reference configuration")
        limits.append(point.config.power_limit_w)
        plan = Plan(
            job=spec.name, config=point.config.model_copy(update={"colocation_group": f"{spec_a.name}+{spec_b.name}"}),
            start=utcnow(), predicted_duration_s=0, predicted_energy_j=0, predicted_emissions_g=0, region=spec.region,
            forecast_provider="none (pair profiling)", reason="pair profiling",
        )  # fmt: skip
        members.append(pair_member(spec, plan, profile))
    limit_w = min((w for w in limits if w is not None), default=None)
    steps = profile_steps or min(spec_a.profile_steps, spec_b.profile_steps)
    warmup = max(spec_a.profile_warmup_steps, spec_b.profile_warmup_steps)
    request = SharedRequest(members=members, power_limit_w=limit_w, warmup_steps=warmup, profile_steps=steps)
    run = backend.execute_shared(request, RunOptions(run_name=f"pair-{spec_a.name}+{spec_b.name}", trace=False))
    failed = [r for r in run.members if r.exit_code != 0]
    if failed:
        first = failed[0]
        raise RuntimeError(f"pair profiling of {spec_a.name}+{spec_b.name}: {first.job} exited {first.exit_code}")
    speed_a, speed_b = run.kept_speeds
    if speed_a is None or speed_b is None or run.overlap_s <= 0:
        raise RuntimeError(f"pair profiling of {spec_a.name}+{spec_b.name} measured no time together")
    log.info(
        "pair %s+%s: kept %.2f / %.2f of solo speed (%s), %.0f W together", spec_a.name, spec_b.name, speed_a,
        speed_b, run.kept_speeds_source, run.overlap_power_w,
    )  # fmt: skip
    if run.host_pace:
        log.info("pair %s+%s: %s", spec_a.name, spec_b.name, contention_note(run.host_pace, run.observed_kept_speeds,
                                                                        run.kept_speeds))  # fmt: skip
    return PairProfile(
        spec_a.name, spec_b.name, speed_a, speed_b, run.overlap_power_w, label=run.label,  # type: ignore[arg-type]
        power_limit_w=limit_w,
    )  # fmt: skip
