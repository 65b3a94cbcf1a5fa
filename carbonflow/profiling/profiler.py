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
from collections.abc import Callable
from typing import Protocol

from carbonflow.energy.device import Device
from carbonflow.execution.wrapper import MeasuredWindow, WrappedRun
from carbonflow.models import Config, JobSpec, Plan, Profile, ProfilePoint, utcnow

log = logging.getLogger(__name__)

DEFAULT_STEP_W = 25.0


class Executor(Protocol):
    def execute(
        self,
        spec: JobSpec,
        plan: Plan,
        *,
        run_name: str,
        profile_steps: int | None,
        warmup_steps: int,
        trace: bool,
        sweep_limits_w: list[float] | None,
        stop_below_fraction: float | None,
    ) -> WrappedRun: ...


def candidate_power_limits_w(spec: JobSpec, gpu: Device | None, step_w: float = DEFAULT_STEP_W) -> list[float | None]:
    """Power limits to try, highest first: the job's own list, else the device's range in ``step_w`` steps."""
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
        raise RuntimeError(
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
    )


def profile_job(
    spec: JobSpec,
    backend: Executor,
    devices: list[Device],
    *,
    samples_per_epoch: int | None = None,
    step_w: float = DEFAULT_STEP_W,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> Profile:
    """Profile ``spec`` and return its Profile; ``on_progress(config_key, done, planned)`` reports progress."""
    gpus = [d for d in devices if d.kind == "gpu"]
    gpu = gpus[0] if gpus else None
    limits = candidate_power_limits_w(spec, gpu, step_w)
    counts = list(range(spec.min_containers, spec.max_containers + 1))
    planned = len(counts) * len(limits)
    label = (
        "simulated"
        if any(d.label == "simulated" for d in devices)
        else ("estimated" if any(d.label == "estimated" for d in devices) else "measured")
    )
    done = 0
    stop_below = 1 / (1 + 2 * spec.max_slowdown)
    points: list[ProfilePoint] = []
    for count in counts:
        plan = Plan(
            job=spec.name, config=Config(containers=count, power_limit_w=limits[0]), start=utcnow(),
            predicted_duration_s=0, predicted_energy_j=0, predicted_emissions_g=0, region=spec.region,
            forecast_provider="none (profiling)", reason=f"profiling {count} container(s)",
        )  # fmt: skip
        sweep = [w for w in limits if w is not None]
        run = backend.execute(
            spec, plan, run_name=f"profile-c{count}", profile_steps=spec.profile_steps,
            warmup_steps=spec.profile_warmup_steps, trace=False, sweep_limits_w=sweep or None,
            stop_below_fraction=stop_below if sweep else None,
        )  # fmt: skip
        if run.exit_code != 0:
            raise RuntimeError(f"profiling {count} container(s) of {spec.name} failed with exit code {run.exit_code}")
        for window in run.windows:
            config = Config(containers=count, power_limit_w=window.power_limit_w)
            point = _point(window, config, label, spec.name)
            points.append(point)
            done += 1
            if on_progress:
                on_progress(config.key(), done, planned)
            log.info(
                "profiled %s: %.1f samples/s, %.4f J/sample", config.key(), point.throughput_samples_per_s,
                point.energy_per_sample_j,
            )  # fmt: skip
        if len(run.windows) < len(limits):
            log.info("%d container(s): sweep stopped early (slower than max_slowdown allows)", count)
    if not points:
        raise RuntimeError(f"profiling {spec.name} measured nothing; does the training report progress?")
    default_w = gpu.default_power_limit_w() if gpu is not None and gpu.supports_power_limit else None
    max_power_w = gpu.power_limit_constraints_w()[1] if gpu is not None and gpu.supports_power_limit else None
    return Profile(
        job=spec.name,
        device_model=gpu.model if gpu is not None else next((d.model for d in devices if d.kind == "cpu"), "cpu"),
        device_kind="gpu" if gpu is not None else "cpu",
        label=label,  # type: ignore[arg-type]
        code_version=spec.code_version,
        default_power_limit_w=default_w,
        max_power_w=max_power_w,
        samples_per_epoch=samples_per_epoch,
        points=points,
    )
