"""Triggers: wait for a planned start without holding a worker slot.

``CarbonWindowTrigger`` fires at ``wake_at`` on the session's clock
(:class:`~carbonflow.session.SessionClock`). In production the clock is
the wall clock. In replay (the embedded demo) the session's clock is a recorded date: the
trigger then waits ``(wake_at − clock now) / speedup`` real seconds, so hours of replayed waiting
pass in seconds, and the event says which clock time it fired at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class CarbonWindowTrigger(BaseTrigger):
    """Fire when the operator's clock reaches ``wake_at`` (a planned start or a re-plan check).

    ``state`` (a :class:`~carbonflow.session.WaitState` as JSON) is echoed back in the event, so the operator
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


class BackendRunTrigger(BaseTrigger):
    """Fire when every run in ``handles`` has finished; the task holds no worker slot meanwhile.

    Generic over backends: it rebuilds the runs' backend (``backend``, by its registered name, from
    ``backend_options``, what the backend's ``rebuild_options()`` gave) and asks it through the
    :class:`~carbonflow.execution.backend.Backend` contract's ``poll`` whether each run has finished, so whatever
    a backend counts as finished (a pod Succeeded or Failed, a Job Complete or Failed, an image that cannot be
    pulled) is decided in one place, the backend. ``handles`` are the backend's
    :class:`~carbonflow.execution.backend.RunHandle` s as JSON (one per job; a co-located pair has two pods on one
    time-sliced GPU), ``state`` the caller's state as JSON (a training's wait state, a profile's sweep so far);
    both come back in the event, so the resumed task collects, accounts and logs the runs on any worker.
    """

    def __init__(
        self,
        backend: str,
        handles: list[dict[str, Any]],
        backend_options: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        clock_offset_s: float = 0.0,
        poll_s: float = 10.0,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.handles = handles
        self.backend_options = backend_options
        self.state = state
        self.clock_offset_s = float(clock_offset_s)
        self.poll_s = float(poll_s)
        self._fired = False
        if self.poll_s <= 0:
            raise ValueError(f"poll_s={poll_s} is not allowed; it must be > 0")
        if not handles:
            raise ValueError("handles=[] is not allowed; give the started run(s) to wait for")
        others = sorted({str(h.get("backend")) for h in handles} - {backend})
        if others:
            raise ValueError(f"handles of backend(s) {', '.join(others)} given to a trigger of backend={backend!r}")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "carbonflow.operators.triggers.BackendRunTrigger",
            {"backend": self.backend, "handles": self.handles, "backend_options": self.backend_options,
             "state": self.state, "clock_offset_s": self.clock_offset_s, "poll_s": self.poll_s},
        )  # fmt: skip

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from carbonflow.execution.backend import RunHandle

        backend = await asyncio.to_thread(_rebuild, self.backend, self.backend_options)
        handles = [RunHandle.model_validate(h) for h in self.handles]
        pending = list(range(len(handles)))
        messages: dict[int, str] = {}
        while pending:
            for i in list(pending):
                try:
                    status = await asyncio.to_thread(backend.poll, handles[i])
                    ended, message = status.state == "finished", status.message
                except Exception as err:  # the run is gone or the backend refuses: the task decides (collect raises)
                    ended, message = True, f"{type(err).__name__}: {err}"
                if ended:
                    pending.remove(i)
                    messages[i] = message
            if pending:
                await asyncio.sleep(self.poll_s)
        self._fired = True
        yield TriggerEvent({"status": "ended", "message": "; ".join(messages[i] for i in sorted(messages)),
                            "handles": self.handles, "state": self.state,
                            "clock_offset_s": self.clock_offset_s})  # fmt: skip

    async def on_kill(self) -> None:
        """A user marked or cleared the deferred task: stop its runs as the task's ``on_kill`` would.

        Airflow (3.3+) calls this only for a user's kill, never on a triggerer restart or after the event
        fired. Each run is cancelled through the backend's ``cancel`` (on Kubernetes: its pods are deleted — the
        wrapper restores the GPU's limit in the grace period —, waited for, and a restore pod replays any journal
        they left).
        """
        if self._fired:
            return
        for handle in self.handles:
            try:
                await asyncio.to_thread(_cancel_run, self.backend, self.backend_options, handle)
                self.log.info("cancelled %s: its runs are gone and its GPUs' limits restored", handle.get("run_id"))
            except Exception:  # the triggerer ignores on_kill's errors: say what is left
                self.log.exception("cancelling %s did not finish cleanly", handle.get("run_id"))


class KubernetesRunTrigger(BackendRunTrigger):
    """What carbonflow 0.2 deferred on (kept so that a task deferred before an upgrade resumes after it): a
    :class:`BackendRunTrigger` of the ``kubernetes`` backend, taking 0.2's arguments. New deferrals use
    :class:`BackendRunTrigger`; ``connection`` (the provider hook's arguments) only fills in how to reach the
    cluster when ``backend_options`` is missing."""

    def __init__(
        self,
        handles: list[dict[str, Any]],
        connection: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        clock_offset_s: float = 0.0,
        poll_s: float = 10.0,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        if backend_options is None and connection:
            extras = connection.get("connection_extras") or {}
            backend_options = {"config_file": extras.get("kube_config_path"), "context": connection.get(
                "cluster_context"), "in_cluster": bool(extras.get("in_cluster", False))}  # fmt: skip
        super().__init__("kubernetes", handles, backend_options, state, clock_offset_s, poll_s)


def _rebuild(name: str, options: dict[str, Any] | None) -> Any:
    """The backend called ``name``, rebuilt in this process (the triggerer) from its ``rebuild_options()`` (on
    Kubernetes its client is the provider hook's again, from the Airflow connection the options name)."""
    import tempfile
    from pathlib import Path

    from carbonflow.operators.kubernetes import operator_backend

    return operator_backend(name, Path(tempfile.gettempdir()) / "carbonflow-trigger", dict(options or {}) or None)


def _cancel_run(name: str, options: dict[str, Any] | None, handle: dict[str, Any]) -> None:
    from carbonflow.execution.backend import RunHandle

    _rebuild(name, options).cancel(RunHandle.model_validate(handle))
