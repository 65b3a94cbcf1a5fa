"""Profile a job under candidate configurations (SCORER's "profile → estimate → configure").

Each candidate runs through the same ``carbonflow run`` wrapper and backend as training, for a
warm-up plus a measured step budget. The search is pruned like this:

1. container counts ``min..max`` at the device's maximum power limit; a count whose throughput
   *and* energy per sample are both worse than another's is dominated and dropped;
2. power limits from the maximum down in ``step_w`` steps (Koszczał et al.'s sweep) at each
   surviving count; the sweep stops once a limit is slower than the fastest point by more than
   twice the job's allowed slowdown, since every lower limit is slower still.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from carbonflow.energy.device import Device
from carbonflow.execution.wrapper import WrappedRun
from carbonflow.models import Config, JobSpec, Plan, Profile, ProfilePoint, utcnow

log = logging.getLogger(__name__)

DEFAULT_STEP_W = 25.0


class Executor(Protocol):
    def execute(
        self, spec: JobSpec, plan: Plan, *, run_name: str, profile_steps: int | None, warmup_steps: int, trace: bool
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


def _point(run: WrappedRun, config: Config, label: str) -> ProfilePoint:
    if run.exit_code != 0:
        raise RuntimeError(f"profiling run {config.key()} of {run.job} failed with exit code {run.exit_code}")
    samples = run.measured_samples or run.samples
    window_s = run.measured_window_s or run.duration_s
    if samples <= 0 or window_s <= 0:
        raise RuntimeError(
            f"profiling run {config.key()} of {run.job} reported no progress; does the training call "
            "carbonflow.training.report() (or append to $CARBONFLOW_PROGRESS_FILE)?"
        )
    # Throughput from the training's own timestamps; power from the energy window around them.
    throughput = samples / window_s
    if run.measured_energy_j and run.measured_energy_window_s > 0:
        power_w = {device: joules / run.measured_energy_window_s for device, joules in run.measured_energy_j.items()}
    else:
        power_w = {d.device_id: d.energy_j / run.duration_s for d in run.devices}
    return ProfilePoint(
        config=config,
        throughput_samples_per_s=throughput,
        power_per_device_w=power_w,
        energy_per_sample_j=sum(power_w.values()) / throughput,
        duration_s=window_s,
        samples=samples,
        label=label,  # type: ignore[arg-type]
    )


def _dominated(point: ProfilePoint, others: list[ProfilePoint]) -> bool:
    return any(
        o is not point
        and o.throughput_samples_per_s >= point.throughput_samples_per_s
        and o.energy_per_sample_j <= point.energy_per_sample_j
        and (
            o.throughput_samples_per_s > point.throughput_samples_per_s
            or o.energy_per_sample_j < point.energy_per_sample_j
        )
        for o in others
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
    planned = len(counts) + len(limits) - 1
    label = (
        "simulated"
        if any(d.label == "simulated" for d in devices)
        else ("estimated" if any(d.label == "estimated" for d in devices) else "measured")
    )
    done = 0

    def measure(config: Config) -> ProfilePoint:
        nonlocal done
        plan = Plan(
            job=spec.name, config=config, start=utcnow(), predicted_duration_s=0, predicted_energy_j=0,
            predicted_emissions_g=0, region=spec.region, forecast_provider="none (profiling)",
            reason=f"profiling {config.key()}",
        )  # fmt: skip
        run = backend.execute(
            spec, plan, run_name=f"profile-{config.key()}", profile_steps=spec.profile_steps,
            warmup_steps=spec.profile_warmup_steps, trace=False,
        )  # fmt: skip
        point = _point(run, config, label)
        done += 1
        if on_progress:
            on_progress(config.key(), done, planned)
        log.info(
            "profiled %s: %.1f samples/s, %.4f J/sample", config.key(), point.throughput_samples_per_s,
            point.energy_per_sample_j,
        )  # fmt: skip
        return point

    top_limit = limits[0]
    by_count = [measure(Config(containers=c, power_limit_w=top_limit)) for c in counts]
    survivors = [p for p in by_count if not _dominated(p, by_count)]
    points = list(by_count)
    fastest = max(p.throughput_samples_per_s for p in by_count)
    for start_point in survivors:
        for limit in limits[1:]:
            point = measure(Config(containers=start_point.config.containers, power_limit_w=limit))
            points.append(point)
            if point.throughput_samples_per_s < fastest / (1 + 2 * spec.max_slowdown):
                log.info("stopping the sweep at %s W: too slow for max_slowdown=%g", limit, spec.max_slowdown)
                break
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
