"""The session's notion of now: the wall clock, or in replay a recorded date advancing with it."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta


class SessionClock:
    """Wall time shifted by ``offset_s`` (0 in production; in replay, back to a recorded date)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = float(offset_s)

    @classmethod
    def replaying(cls, replay_now: datetime) -> SessionClock:
        """A clock that reads ``replay_now`` at this instant and then runs at wall speed."""
        return cls((replay_now - datetime.now(UTC)).total_seconds())

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset_s)

    def to_clock(self, wall_time: datetime) -> datetime:
        """A wall-clock instant on this clock (the same instant in production)."""
        return wall_time + timedelta(seconds=self.offset_s)

    @property
    def replay(self) -> bool:
        return abs(self.offset_s) > 1.0


DEFAULT_DEADLINE_TIME_UTC = "07:00"
"""A job without ``finish_by`` must finish by the next 07:00 UTC (the operators' ``deadline_time_utc`` default)."""


def next_deadline(now: datetime, deadline_time_utc: str) -> datetime:
    """The next occurrence of ``HH:MM`` UTC strictly after ``now``."""
    try:
        at = time.fromisoformat(deadline_time_utc)
    except ValueError:
        raise ValueError(f"deadline_time_utc={deadline_time_utc!r} is not a time of day; use 'HH:MM' (UTC)") from None
    candidate = datetime.combine(now.date(), at, tzinfo=UTC)
    return candidate if candidate > now else candidate + timedelta(days=1)
