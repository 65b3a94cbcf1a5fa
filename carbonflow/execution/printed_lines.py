"""The wrapper's side of ``progress_pattern``: read what the training prints, echo it, turn matches into reports.

With a pattern the training's stdout and stderr are pipes (:func:`carbonflow.execution.gpus.start_child`); one
reader thread per stream copies every byte unchanged to the wrapper's own stream (the training log stays as it
was) and splits the text into lines at ``\\n`` and ``\\r`` (progress bars redraw with ``\\r``). A line is kept to
its first :data:`~carbonflow.progress_pattern.MAX_LINE_CHARS` bytes, so a line without end costs bounded memory.
Each line the pattern matches becomes a progress report with the wrapper's monotonic time, queued for
:class:`carbonflow.execution.wrapper._Progress`.

The readers never wait on the pattern: they hand lines to one matcher thread through a bounded queue and drop
a line when it is full, so a slow pattern can lose reports but never block the training on a full pipe.

Profiling gives up early on a pattern that matches nothing: :meth:`PatternProgress.matched_nothing_in` counts
the newline-ended lines printed after ``grace_s`` (start-up chatter comes before; a progress bar's ``\\r``
redraws do not count) while nothing has matched, and the wrapper stops the command once they reach a profile's
worth, instead of letting the whole script run.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import sys
import threading
import time
from typing import IO, Any

from carbonflow.progress_pattern import (
    MAX_LINE_CHARS,
    UNMATCHED_GRACE_S,
    LineMatcher,
    SeenLines,
    timed_out_note,
)

log = logging.getLogger(__name__)

READ_BYTES = 65536
JOIN_S = 10.0
QUEUED_LINES = 10_000
_END = None
_LINE_END = re.compile(rb"(\r\n|\r|\n)")
"""Split with the ends kept: ``[text, end, text, end, …, rest]``."""


class PatternProgress:
    """Progress reports from the lines a training prints (``progress_pattern``)."""

    def __init__(
        self, pattern: str, batch_size: int, samples_per_epoch: int | None, grace_s: float = UNMATCHED_GRACE_S
    ) -> None:
        self.pattern = pattern
        self.grace_s = grace_s
        self.unmatched_late = 0
        """Newline-ended lines printed ``grace_s`` or more after :meth:`start` while nothing had matched."""
        self._started_s = time.monotonic()
        self.matcher = LineMatcher(pattern, batch_size, samples_per_epoch)
        self.seen = SeenLines()
        self.reports: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.dropped = 0
        self._lines: queue.Queue[tuple[str, bool, float] | None] = queue.Queue(maxsize=QUEUED_LINES)
        self._threads: list[threading.Thread] = []
        self._matcher = threading.Thread(target=self._match_lines, name="carbonflow-match", daemon=True)

    def start(self, streams: list[tuple[IO[bytes] | None, IO[bytes]]]) -> None:
        """Read each ``(pipe, echo)`` pair in its own thread until the pipe ends."""
        self._started_s = time.monotonic()
        self._matcher.start()
        for pipe, echo in streams:
            if pipe is None:
                continue
            thread = threading.Thread(target=self._read, args=(pipe, echo), name="carbonflow-lines", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float = JOIN_S) -> None:
        """Wait for the readers (the pipes close once the guard has ended every process of the training)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._matcher.is_alive():
            self._lines.put(_END)  # after every line the readers queued
            self._matcher.join(max(0.0, deadline - time.monotonic()))

    def on_line(self, line: str, newline: bool = True) -> None:
        """Queue a printed line for the matcher (dropped, and counted, when the matcher is that far behind);
        ``newline``: it ended with ``\\n`` (not a ``\\r`` redraw)."""
        try:
            self._lines.put_nowait((line, newline, time.monotonic()))
        except queue.Full:
            self.dropped += 1

    def matched_nothing_in(self, lines: int) -> bool:
        """The pattern has matched nothing, and the command printed ``lines`` newline-ended lines after
        ``grace_s``: it is printing, just not what the pattern looks for."""
        return self.matcher.matched == 0 and self.unmatched_late >= lines

    def _match_lines(self) -> None:
        while (item := self._lines.get()) is not _END:
            line, newline, t_s = item
            try:
                self.seen.add(line)
                report = self.matcher.match(line)
            except Exception:  # a bug here must not end the matching; the readers go on regardless
                log.exception("progress_pattern: could not match a printed line")
                continue
            if report is not None:
                self.reports.put({**report, "t_s": time.monotonic()})
            elif newline and line.strip() and self.matcher.matched == 0 and t_s - self._started_s >= self.grace_s:
                self.unmatched_late += 1

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.reports.get_nowait())
            except queue.Empty:
                return out

    @property
    def accuracy(self) -> float | None:
        return self.matcher.accuracy

    def notes(self) -> list[str]:
        notes = [] if self.matcher.matched else [self.seen.unmatched_note(self.pattern)]
        if self.matcher.timed_out:
            notes.append(timed_out_note(self.pattern, self.matcher.timed_out))
        if self.dropped:
            notes.append(f"progress_pattern: {self.dropped} printed line(s) not searched (the pattern fell behind)")
        return notes

    def _read(self, pipe: IO[bytes], echo: IO[bytes]) -> None:
        fd, pending = pipe.fileno(), b""
        try:
            while chunk := os.read(fd, READ_BYTES):
                _echo(echo, chunk)
                *parts, pending = _LINE_END.split(pending + chunk)
                pending = pending[:MAX_LINE_CHARS]
                for line, end in zip(parts[::2], parts[1::2], strict=True):
                    self.on_line(line[:MAX_LINE_CHARS].decode("utf-8", errors="replace"), newline=end != b"\r")
        finally:
            pipe.close()
        if pending:
            self.on_line(pending.decode("utf-8", errors="replace"))


def _echo(echo: IO[bytes], chunk: bytes) -> None:
    """Copy to the wrapper's own stream; a closed one must not stop the reading (the training would block)."""
    try:
        echo.write(chunk)
        echo.flush()
    except (OSError, ValueError):
        pass


def own_streams() -> tuple[IO[bytes], IO[bytes]]:
    """The wrapper's stdout and stderr as byte streams."""
    return _bytes(sys.stdout, 1), _bytes(sys.stderr, 2)


def _bytes(stream: Any, fd: int) -> IO[bytes]:
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        stream.flush()
        return buffer
    return os.fdopen(os.dup(fd), "wb", buffering=0)
