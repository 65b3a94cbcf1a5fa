"""A job's profile in the session: reuse a fresh one unless the job's runs drifted from it, and log a new one.

The profile task (``operators/profile.py``) only translates between Airflow and these functions: whether tonight
needs a profile at all (:func:`reusable_profile`: the newest profile for this device model and code version
younger than ``profile_max_age_s``, unless the job's realised energy has drifted from what was predicted, see
:func:`carbonflow.profiling.refresh.drift_reason`), and where a measured one goes (:func:`log_measured_profile`:
MLflow, or the outage spool). MLflow being down never fails the task: the job is profiled again, or the profile
waits in the spool. No Airflow here.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from carbonflow.domain import JobSpec, Profile

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
