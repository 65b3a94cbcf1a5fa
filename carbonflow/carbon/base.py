"""What every carbon-intensity provider shares: the interface and the errors the chain understands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from carbonflow.domain import Forecast

DEFAULT_HORIZON_S = 48 * 3600.0


class ProviderError(Exception):
    """A provider could not answer; the chain falls back. Messages never contain credentials."""


class NotConfigured(ProviderError):
    """The provider needs a key or URL that was not given."""


class RegionNotSupported(ProviderError):
    """The provider does not cover this region."""


class ProviderUnavailable(ProviderError):
    """The API failed: HTTP error, timeout, malformed or empty answer."""


@runtime_checkable
class ForecastProvider(Protocol):
    """A source of regional carbon-intensity forecasts, normalised to :class:`Forecast`."""

    name: str

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        """The forecast available at ``now`` for ``region`` covering up to ``horizon_s`` ahead."""
        ...


def require_utc(name: str, value: datetime) -> datetime:
    """Return ``value`` in UTC; raise ValueError naming the field when it is naive."""
    if not isinstance(value, datetime):
        raise ValueError(f"{name}={value!r} is not allowed; give a timezone-aware UTC datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}={value.isoformat()} has no time zone; give it in UTC, e.g. '2023-03-15T06:00Z'")
    return value.astimezone(UTC)


def floor_to(when: datetime, step_s: float) -> datetime:
    """``when`` rounded down to a multiple of ``step_s`` since the epoch (UTC)."""
    ts = when.timestamp()
    return datetime.fromtimestamp(ts - (ts % step_s), tz=UTC)


def parse_utc(text: str) -> datetime:
    """Parse an ISO-8601 time stamp from an API or CSV; naive stamps are taken as UTC (as the sources state)."""
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def horizon_end(now: datetime, horizon_s: float) -> datetime:
    return now + timedelta(seconds=horizon_s)
