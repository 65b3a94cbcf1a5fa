"""A job's profile in the session: reuse a fresh one unless the job's runs drifted from it, and log a new one.

The profile task (``operators/profile.py``) only translates between Airflow and these functions: whether tonight
needs a profile at all (:func:`reusable_profile`: the newest profile for this device model and code version
younger than ``profile_max_age_s``, unless the job's realised energy has drifted from what was predicted, see
:func:`carbonflow.profiling.refresh.drift_reason`), and where a measured one goes (:func:`log_measured_profile`:
MLflow, or the outage spool). MLflow being down never fails the task: the job is profiled again, or the profile
waits in the spool. No Airflow here.

A job that explores batch sizes gets its neighbour batch sizes probed before the night's training
(:func:`batch_size_probes` decides which, :func:`with_batch_size_probes` runs them through the profiler and logs the
merged profile): the batch sizes the explorer would weigh next and has no profile of, one short single-limit run
each, charged in full (their work is thrown away). The first training at a probed batch size then sweeps its power
limits inside itself (in-run profiling: the probe profiled one limit there).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from carbonflow.domain import Config, JobSpec, Profile, ProfilePoint

log = logging.getLogger(__name__)


def reusable_profile(
    spec: JobSpec, device_model: str, now: datetime, tracking_uri: str | None = None, logger: Any = log
) -> Profile | None:
    """The profile tonight may reuse instead of measuring, or None (none fresh, drifted, or MLflow unreadable)."""
    fresh = _fresh_profile(spec, device_model, now, tracking_uri, logger)
    if fresh is None:
        return None
    drift = drift_from_profile(spec, tracking_uri, logger)
    if drift:
        logger.info("profiling %s again: %s", spec.name, drift)
        return None
    logger.info(
        "reusing the profile of %s measured at %s on %s (younger than %.0f s); not profiling again",
        spec.name, fresh.measured_at.isoformat(), device_model, spec.profile_max_age_s,
    )  # fmt: skip
    return fresh


def drift_from_profile(spec: JobSpec, tracking_uri: str | None = None, logger: Any = log) -> str | None:
    """Why the job's realised runs no longer match its profile (None: they do, or history is unreadable)."""
    from carbonflow.profiling.refresh import drift_reason
    from carbonflow.tracking.history import realised_vs_predicted

    try:
        rows = realised_vs_predicted(spec.name, tracking_uri=tracking_uri)
    except Exception as err:  # tracking down: reuse the profile rather than fail the DAG
        logger.warning("could not read %s's runs from MLflow (%s)", spec.name, err)
        return None
    return drift_reason([r.energy_ratio for r in rows if r.energy_ratio is not None])


def log_measured_profile(spec: JobSpec, profile: Profile, tracking_uri: str | None = None, logger: Any = log) -> None:
    """Log a measured profile to MLflow where the next night's :func:`reusable_profile` reads it (spooled when
    MLflow is unreachable)."""
    from carbonflow.tracking.logger import log_profile

    outcome = log_profile(spec, profile, tracking_uri=tracking_uri)
    if getattr(outcome, "spooled", False):
        logger.warning("MLflow unreachable: profile spooled locally (%s)", getattr(outcome, "reason", ""))
    else:
        logger.info("profile logged to MLflow run %s", getattr(outcome, "run_id", None))


def _fresh_profile(
    spec: JobSpec, device_model: str, now: datetime, tracking_uri: str | None, logger: Any
) -> Profile | None:
    from carbonflow.tracking.history import latest_profile

    try:
        return latest_profile(
            spec.name, device_model, spec.code_version, spec.profile_max_age_s, now, tracking_uri=tracking_uri
        )
    except Exception as err:  # tracking down must not fail the DAG: profile instead
        logger.warning("could not read profile history from MLflow (%s); profiling again", err)
        return None


def batch_size_probes(spec: JobSpec, profile: Profile, history: Any) -> list[Config]:
    """The probes tonight's profile needs before the job trains: one :class:`Config` per batch size the explorer
    would weigh next but has no profile of (``unprofiled``, priced at :func:`probe_cost_j`; none until the default
    batch size has run), at ``min_containers`` and the power limit of the default batch size's point with the least
    energy per sample (what the explorer's prior uses; none for a CPU-only job). [] when the job does not explore
    batch sizes or ``history`` is None. The explorer is the planner's (``early_stop.planner_explorer``: over the
    points the planner may choose from)."""
    from carbonflow.planning.optimizer import decidable_profile
    from carbonflow.session.early_stop import planner_explorer

    explorer = planner_explorer(spec, profile, history)
    if explorer is None:
        return []
    profile = decidable_profile(profile)
    point = _least_energy_default_point(spec, profile)
    limit_w = None if spec.device_kind == "cpu" else point.config.power_limit_w
    sizes = explorer.unprofiled(profile_cost=probe_cost_j(spec, profile))
    return [Config(containers=spec.min_containers, power_limit_w=limit_w, batch_size=b) for b in sizes]


def probe_cost_j(spec: JobSpec, profile: Profile) -> float:
    """What probing one batch size costs (J), priced as one probe window of the default batch size: its least
    energy per sample × the samples of ``profile_warmup_steps + profile_steps`` steps at ``batch_size``."""
    point = _least_energy_default_point(spec, profile)
    steps = spec.profile_warmup_steps + spec.profile_steps
    return point.energy_per_sample_j * steps * spec.batch_size * point.config.containers


def _least_energy_default_point(spec: JobSpec, profile: Profile) -> ProfilePoint:
    from carbonflow.planning.batch_size import batch_size_of, point_power_w

    at_default = [p for p in profile.points if batch_size_of(p.config, spec) == spec.batch_size
                  and not p.config.colocation_group and p.throughput_samples_per_s > 0]  # fmt: skip
    if not at_default:
        raise ValueError(f"profile of {spec.name!r} has no point at its batch_size={spec.batch_size}; profile it first")
    return min(at_default, key=lambda p: point_power_w(p) / p.throughput_samples_per_s)


def with_batch_size_probes(
    spec: JobSpec,
    profile: Profile,
    backend: Any,
    devices: list[Any],
    tracking_uri: str | None = None,
    logger: Any = log,
) -> Profile:
    """Tonight's profile with the probes :func:`batch_size_probes` asks for run through ``backend`` and merged in,
    logged where the next night reads profiles (:func:`log_measured_profile`); ``profile`` itself when none is
    needed, or when MLflow's history is unreadable (then no probes: a log line says so)."""
    from carbonflow.execution.commands import samples_per_epoch
    from carbonflow.profiling.profiler import run_probes
    from carbonflow.session.early_stop import stops_early
    from carbonflow.session.run import planning_history

    if not stops_early(spec):
        return profile
    history = planning_history([spec.name], tracking_uri, logger)
    if history is None:
        logger.info("%s: no batch-size probes tonight: its history is unreadable", spec.name)
        return profile
    probes = batch_size_probes(spec, profile, history)
    if not probes:
        return profile
    logger.info("%s: probing batch size(s) %s, one short single-limit run each (their work is thrown away)",
                spec.name, ", ".join(str(c.batch_size) for c in probes))  # fmt: skip

    def told(config: Config, n: int, of: int) -> None:
        logger.info("probing batch size %s of %s at %s (%d of %d)", config.batch_size, spec.name,
                    _limit_text(config), n, of)  # fmt: skip

    probed = run_probes(spec, backend, devices, probes, profile, samples_per_epoch=samples_per_epoch(spec),
                        on_progress=told)  # fmt: skip
    if probed is not profile:
        log_measured_profile(spec, probed, tracking_uri, logger)
    return probed


def _limit_text(config: Config) -> str:
    return "no power limit" if config.power_limit_w is None else f"{config.power_limit_w:g} W"
