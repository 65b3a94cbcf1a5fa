"""Triggers: wait for a planned start without holding a worker slot.

``CarbonWindowTrigger`` fires at ``wake_at`` on the operator's clock. In production the clock is
the wall clock. In replay (the embedded demo) the operator's clock is a recorded date: the
trigger then waits ``(wake_at − clock now) / speedup`` real seconds, so hours of replayed waiting
pass in seconds, and the event says which clock time it fired at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class OperatorClock:
    """The operator's notion of now: wall time shifted by ``offset_s`` (0 in production)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = float(offset_s)

    @classmethod
    def replaying(cls, replay_now: datetime) -> OperatorClock:
        """A clock that reads ``replay_now`` at this instant and then runs at wall speed."""
        return cls((replay_now - datetime.now(UTC)).total_seconds())

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset_s)

    @property
    def replay(self) -> bool:
        return abs(self.offset_s) > 1.0


class CarbonWindowTrigger(BaseTrigger):
    """Fire when the operator's clock reaches ``wake_at`` (a planned start or a re-plan check).

    ``state`` (the operator's JSON-able waiting state) is echoed back in the event, so the operator
    resumes with it whether or not the runner keeps the deferral's ``next_kwargs``.
    """

    def __init__(
        self,
        wake_at: str,
        clock_offset_s: float = 0.0,
        speedup: float = 1.0,
        reason: str = "",
        state: dict[str, Any] | None = None,
        min_real_wait_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.state = state
        self.min_real_wait_s = float(min_real_wait_s)
        self.wake_at = wake_at
        self.clock_offset_s = float(clock_offset_s)
        self.speedup = float(speedup)
        self.reason = reason
        if self.speedup <= 0:
            raise ValueError(f"speedup={speedup} is not allowed; it must be > 0")
        datetime.fromisoformat(wake_at)  # validate early, in the worker

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "carbonflow.operators.triggers.CarbonWindowTrigger",
            {
                "wake_at": self.wake_at,
                "clock_offset_s": self.clock_offset_s,
                "speedup": self.speedup,
                "reason": self.reason,
                "state": self.state,
                "min_real_wait_s": self.min_real_wait_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        target = datetime.fromisoformat(self.wake_at)
        started_real = datetime.now(UTC)
        started_clock = started_real + timedelta(seconds=self.clock_offset_s)
        remaining_clock_s = (target - started_clock).total_seconds()
        # A replayed wait is compressed, but not below min_real_wait_s: a trigger that fires within a
        # second of deferral races Airflow 3.3's scheduler (apache/airflow#67287).
        real_wait_s = max(max(remaining_clock_s, 0.0) / self.speedup, self.min_real_wait_s)
        self.log.info(
            "waiting until %s (%s): %.0f s of operator clock, %.1f s real", self.wake_at, self.reason,
            max(remaining_clock_s, 0.0), real_wait_s,
        )  # fmt: skip
        deadline = started_real + timedelta(seconds=real_wait_s)
        while (left_s := (deadline - datetime.now(UTC)).total_seconds()) > 0:
            await asyncio.sleep(min(left_s, 60.0))
        fired_real = datetime.now(UTC)
        # In replay the skipped time is added to the clock; in production this is just "now".
        fired_clock = max(target, fired_real + timedelta(seconds=self.clock_offset_s))
        yield TriggerEvent(
            {
                "status": "woke",
                "clock_now": fired_clock.isoformat(),
                "clock_offset_s": (fired_clock - fired_real).total_seconds(),
                "state": self.state,
            }
        )


class GroupResultTrigger(BaseTrigger):
    """Fire when the launcher of a co-located pair has left this member's outcome at ``path`` (or at the timeout).

    The file is written atomically by the launching task; the member's task resumes and returns it.
    """

    def __init__(self, path: str, timeout_s: float, reason: str = "", poll_s: float = 2.0) -> None:
        super().__init__()
        self.path = path
        self.timeout_s = float(timeout_s)
        self.reason = reason
        self.poll_s = float(poll_s)
        if self.timeout_s <= 0 or self.poll_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} and poll_s={poll_s} must be > 0")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "carbonflow.operators.triggers.GroupResultTrigger",
            {"path": self.path, "timeout_s": self.timeout_s, "reason": self.reason, "poll_s": self.poll_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from pathlib import Path

        target = Path(self.path)
        deadline = datetime.now(UTC) + timedelta(seconds=self.timeout_s)
        self.log.info("waiting for %s (%s), at most %.0f s", self.path, self.reason, self.timeout_s)
        while not target.exists():
            if datetime.now(UTC) >= deadline:
                yield TriggerEvent({"status": "timeout", "path": self.path})
                return
            await asyncio.sleep(self.poll_s)
        yield TriggerEvent({"status": "done", "path": self.path})
