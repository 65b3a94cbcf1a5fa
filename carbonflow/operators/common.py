"""What both operators share: job parsing, state directories, the carbon source, devices."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from carbonflow.execution.backend import Backend
from carbonflow.models import Forecast, ForecastPoint, JobSpec

log = logging.getLogger(__name__)

HOME_ENV = "CARBONFLOW_HOME"
REPLAY_ENV = "CARBONFLOW_REPLAY"


def home() -> Path:
    """carbonflow's state directory (``$CARBONFLOW_HOME``, default ``./.carbonflow``)."""
    path = Path(os.environ.get(HOME_ENV, ".carbonflow")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def safe_name(text: str) -> str:
    """``text`` usable as one path component (Airflow run ids contain ':' and '+')."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def parse_job(job: JobSpec | dict[str, Any] | str) -> JobSpec:
    """Validate a job given as a model, a dict or JSON; errors name the field, value and rule."""
    if isinstance(job, JobSpec):
        return job
    try:
        return JobSpec.model_validate_json(job) if isinstance(job, str) else JobSpec.model_validate(job)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'job'}: {e['msg']} (got {e.get('input')!r})" for e in err.errors()
        )
        raise ValueError(f"invalid job: {problems}") from None


BACKENDS = ("local", "kubernetes")


def make_backend(name: str, workdir: Path, kubernetes: dict[str, Any] | None = None) -> Backend:
    """The execution backend called ``name``: ``local`` processes or ``kubernetes`` pods/jobs."""
    if name == "local":
        from carbonflow.execution.local import LocalBackend

        return LocalBackend(workdir)
    if name == "kubernetes":
        from carbonflow.execution.k8s_manifests import KubernetesSettings
        from carbonflow.execution.kubernetes import KubernetesBackend

        if not kubernetes:
            return KubernetesBackend.from_env()  # $CARBONFLOW_K8S_SETTINGS, in-cluster or kubeconfig
        options = dict(kubernetes)
        connection = {k: options.pop(k) for k in ("config_file", "context", "in_cluster") if k in options}
        return KubernetesBackend(KubernetesSettings.model_validate(options), **connection)
    raise ValueError(f"backend={name!r} is not allowed; use one of {', '.join(BACKENDS)}")


def replay_enabled(flag: bool | None) -> bool:
    """Replay recorded carbon data instead of live APIs: the operator flag, else ``$CARBONFLOW_REPLAY``."""
    if flag is not None:
        return flag
    return os.environ.get(REPLAY_ENV, "").lower() in {"1", "true", "yes"}


class CarbonSource:
    """Forecasts for planning and intensity for accounting, from the replay data or the live chain."""

    def __init__(self, *, replay: bool, credentials: dict[str, dict[str, str]] | None = None) -> None:
        self.replay = replay
        self._credentials = credentials or {}
        self._replay_provider: Any = None
        self._chain: Any = None

    def _replayer(self) -> Any:
        if self._replay_provider is None:
            from carbonflow.carbon.replay import ReplayProvider

            self._replay_provider = ReplayProvider.default()
        return self._replay_provider

    def forecast(self, region: str, now: datetime, until: datetime) -> Forecast:
        """The best forecast available for ``region`` from ``now`` to ``until``; never raises for a dead API."""
        if self.replay:
            return self._replayer().forecast(region, now, max((until - now).total_seconds(), 3600.0))
        if self._chain is None:
            from carbonflow.carbon.chain import default_chain

            self._chain = default_chain(self._credentials)
        return self._chain.forecast(region, now, until, now=now)

    def recent_actuals(self, region: str, now: datetime, days: float = 14.0) -> list[ForecastPoint]:
        """Actuals of the last ``days`` ended by ``now``: the planner's check on the forecast (robust start
        search); ``[]`` when no provider has them (the planner then takes the forecast at face value)."""
        start = now - timedelta(days=days)
        if self.replay:
            points = self._replayer().actuals(region, start, now)
        else:
            if self._chain is None:
                from carbonflow.carbon.chain import default_chain

                self._chain = default_chain(self._credentials)
            points = self._chain.history(region, start, now)
        return [p for p in points if p.end <= now]

    def intensity_for_accounting(
        self, region: str, start: datetime, end: datetime, forecast: Forecast | None
    ) -> tuple[list[ForecastPoint], str]:
        """Intensity to account a run between start and end, and where it came from."""
        pad = timedelta(hours=1)
        if self.replay:
            points = self._replayer().actuals(region, start - pad, end + pad)
            if points:
                return points, "replayed actual intensity"
        if forecast is not None and forecast.points:
            return list(forecast.points), f"forecast intensity ({forecast.provider})"
        return [], "no intensity data"

    def replay_window(self, region: str) -> tuple[datetime, datetime]:
        return self._replayer().replay_window(region)


DEFAULT_REPLAY_EVENING_H = 6.0
"""Replay starts this many hours after the replay's first published forecast (an evening for NESO GB)."""


def carbon_source(replay: bool | None, conn_ids: dict[str, str] | None) -> CarbonSource:
    """Replayed recorded data, or the live provider chain with keys from Airflow connections."""
    live_credentials = None
    if not replay_enabled(replay):
        from carbonflow.operators.hooks import provider_credentials

        live_credentials = provider_credentials(conn_ids)
    return CarbonSource(replay=replay_enabled(replay), credentials=live_credentials)


def operator_clock(source: CarbonSource, region: str, replay_start: str | None) -> Any:
    """The wall clock, or in replay a clock reading ``replay_start`` (default: an evening of the replay) now."""
    from carbonflow.operators.triggers import OperatorClock

    if not source.replay:
        return OperatorClock()
    if replay_start:
        start = datetime.fromisoformat(replay_start.replace("Z", "+00:00"))
        if start.tzinfo is None:
            raise ValueError(f"replay_start={replay_start!r} has no time zone; give it in UTC")
    else:
        start = source.replay_window(region)[0] + timedelta(hours=DEFAULT_REPLAY_EVENING_H)
    return OperatorClock.replaying(start)


def group_result_path(run_id: str, group: str, job: str) -> Path:
    """Where the launcher of a co-located pair leaves each member's outcome for the member's own task."""
    return home() / "runs" / safe_name(run_id) / "groups" / safe_name(group) / f"{job}.json"


def planning_history(jobs: list[str], tracking_uri: str | None, task_log: logging.Logger) -> Any:
    """The planner's history of ``jobs`` from MLflow, or None (with a warning) when tracking is down."""
    try:
        from carbonflow.tracking.history import job_history

        return job_history(jobs, tracking_uri=tracking_uri)
    except Exception as err:  # tracking down: plan from the profiles alone
        task_log.warning("MLflow history unavailable (%s); planning from the profiles alone", err)
        return None
