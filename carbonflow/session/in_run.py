"""In-run profiling in a session: a solo training at a batch size its profile has not swept (none, or a single-limit
probe) sweeps its power limits inside itself, keeps that work, trains on at the best limit for its objective, and
the profile it measured is logged where the next night's planner reads profiles (MLflow, as a separate profile).

Only a backend that can run it says so (``supports_in_run_profiling``: the local one); elsewhere, and for an
observe-only job or a pair, the separate profile stays (charged in full: its work is thrown away)."""

from __future__ import annotations

import logging
from typing import Any

from carbonflow.domain import JobSpec, Plan, Profile

log = logging.getLogger(__name__)


def in_run_options_for(spec: JobSpec, profile: Profile | None, plan: Plan, backend: Any, shadow: bool) -> Any:
    """The run options that make this training profile itself, or None (it runs as planned)."""
    from carbonflow.energy.discovery import discover_devices
    from carbonflow.profiling.profiler import in_run_options, needs_in_run_profile

    if shadow or not getattr(backend, "supports_in_run_profiling", False) or plan.config.power_limit_w is None:
        return None
    if not needs_in_run_profile(spec, profile, plan.config):
        return None
    return in_run_options(spec, discover_devices(spec.simulated_gpu, include_cpu=True))


def learn_profile(
    spec: JobSpec, profile: Profile | None, plan: Plan, wrapped: Any, tracking_uri: str | None, logger: Any = log
) -> Profile | None:
    """The profile the training measured inside itself, merged into ``profile`` and logged to MLflow (None: it
    measured nothing usable; the run's training result stands either way)."""
    from carbonflow.energy.discovery import discover_devices
    from carbonflow.execution.commands import samples_per_epoch
    from carbonflow.profiling.profiler import ProfilingError, profile_from_training
    from carbonflow.tracking.logger import log_profile

    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    try:
        learned = profile_from_training(spec, devices, plan.config, wrapped, samples_per_epoch=samples_per_epoch(spec),
                                        earlier=profile)  # fmt: skip
    except ProfilingError as err:
        logger.warning("%s: in-run profiling measured nothing usable (%s); the next night profiles it", spec.name, err)
        return None
    outcome = log_profile(spec, learned, tracking_uri=tracking_uri)
    logger.info("%s: in-run profile of %d configurations logged (%s)", spec.name, len(learned.points),
                getattr(outcome, "run_id", None) or getattr(outcome, "reason", "spooled"))  # fmt: skip
    return learned


def ran_as(plan: Plan, wrapped: Any, learned: Profile | None = None) -> Plan:
    """The plan as the in-run profiled training ran it: at the limit its sweep chose (its run is logged and learned
    from at that configuration), its predictions moved to what the run did by the profile the sweep measured
    (``learned``: energy per sample and speed at every limit): the sweep's windows at their limits, the rest of its
    samples at the chosen one. Its saving is then judged against the planned default rather than against itself,
    and not credited with the sweep's samples as if they ran at the chosen limit; unchanged when it ended
    mid-sweep."""
    if wrapped.power_limit_w is None or wrapped.power_limit_w == plan.config.power_limit_w:
        return plan
    config = plan.config.model_copy(update={"power_limit_w": wrapped.power_limit_w})
    reason = (f"{plan.reason}; in-run profiling: planned at {plan.config.power_limit_w:g} W from a probe, swept the "
              f"limits inside the training and trained on at {wrapped.power_limit_w:g} W")  # fmt: skip
    moved = _moved_predictions(plan, config, wrapped, learned)
    return plan.model_copy(update={"config": config, "reason": reason, **moved})


def _moved_predictions(plan: Plan, ran: Any, wrapped: Any, learned: Profile | None) -> dict[str, float]:
    """The plan's predicted energy, emissions and duration scaled from its planned configuration to what the run
    did, by the sweep's own points: each window's samples at its limit, the rest at ``ran``; {} when the sweep
    measured the planned or the chosen configuration not."""
    points = {p.config.key(): p for p in (learned.points if learned is not None else [])}
    planned, chosen = points.get(plan.config.key()), points.get(ran.key())
    if planned is None or chosen is None or planned.energy_per_sample_j <= 0 or planned.throughput_samples_per_s <= 0:
        return {}
    at: list[tuple[float, Any]] = []  # (samples, profile point) of each part of the run
    for window in getattr(wrapped, "windows", []):
        point = points.get(ran.model_copy(update={"power_limit_w": window.power_limit_w}).key())
        if point is not None and window.samples > 0:
            at.append((float(window.samples), point))
    total = float(max(getattr(wrapped, "samples", 0) or 0, sum(n for n, _ in at), 1))
    at.append((total - sum(n for n, _ in at), chosen))
    energy = sum(n * p.energy_per_sample_j for n, p in at) / (total * planned.energy_per_sample_j)
    seconds = sum(n / p.throughput_samples_per_s for n, p in at if p.throughput_samples_per_s > 0)
    return {
        "predicted_energy_j": plan.predicted_energy_j * energy,
        "predicted_emissions_g": plan.predicted_emissions_g * energy,
        "predicted_duration_s": plan.predicted_duration_s * seconds * planned.throughput_samples_per_s / total,
    }
