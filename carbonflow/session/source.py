"""Where carbon intensity comes from for one session: recorded data (replay) or the live provider chain."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from carbonflow import settings
from carbonflow.domain import Forecast, ForecastPoint
from carbonflow.session.clock import SessionClock

REPLAY_ENV = settings.REPLAY_ENV


def replay_enabled(flag: bool | None) -> bool:
    """Replay recorded carbon data instead of live APIs: the operator flag, else ``$CARBONFLOW_REPLAY``."""
    if flag is not None:
        return flag
    return settings.replay_from_env()


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

    def _live(self) -> Any:
        if self._chain is None:
            from carbonflow.carbon.chain import default_chain

            self._chain = default_chain(self._credentials)
        return self._chain

    def forecast(self, region: str, now: datetime, until: datetime) -> Forecast:
        """The best forecast available for ``region`` from ``now`` to ``until``; never raises for a dead API."""
        if self.replay:
            return self._replayer().forecast(region, now, max((until - now).total_seconds(), 3600.0))
        return self._live().forecast(region, now, until, now=now)

    def recent_actuals(self, region: str, now: datetime, days: float = 14.0) -> list[ForecastPoint]:
        """Actuals of the last ``days`` ended by ``now``: the planner's check on the forecast (robust start
        search); ``[]`` when no provider has them (the planner then takes the forecast at face value)."""
        start = now - timedelta(days=days)
        if self.replay:
            points = self._replayer().actuals(region, start, now)
        else:
            points = self._live().history(region, start, now)
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


def session_clock(source: CarbonSource, region: str, replay_start: str | None) -> SessionClock:
    """The wall clock, or in replay a clock reading ``replay_start`` (default: an evening of the replay) now."""
    if not source.replay:
        return SessionClock()
    if replay_start:
        start = datetime.fromisoformat(replay_start.replace("Z", "+00:00"))
        if start.tzinfo is None:
            raise ValueError(f"replay_start={replay_start!r} has no time zone; give it in UTC")
    else:
        start = source.replay_window(region)[0] + timedelta(hours=DEFAULT_REPLAY_EVENING_H)
    return SessionClock.replaying(start)


def finish_by_on_clock(finish_by: datetime | None, clock: SessionClock, source: CarbonSource, region: str) -> Any:
    """``finish_by`` on the session's clock: in replay, a finish-by past the recorded data is a wall-clock time
    (a user's "one hour from now") and moves with the clock onto the replayed date; otherwise unchanged."""
    if finish_by is None or not clock.replay:
        return finish_by
    if finish_by <= source.replay_window(region)[1]:
        return finish_by
    return clock.to_clock(finish_by)
