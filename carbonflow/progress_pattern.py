"""Progress from the script's own output: a job's ``progress_pattern`` turns printed lines into progress reports.

An unchanged training script that prints one line per epoch (``epoch 3/30 loss 0.41 val_acc 0.88``) reports
nothing to carbonflow; with a ``progress_pattern`` the ``carbonflow run`` wrapper reads the lines the command
prints (stdout and stderr, split at ``\\n`` and ``\\r`` so progress bars count), searches each for the pattern,
and turns each match into a progress report:

- ``samples``: samples processed so far, as printed;
- ``step``: optimiser steps so far, as printed (samples = step × the batch size, unless ``samples`` is captured);
- ``epoch``: the epoch number; each *new* value counts as one epoch done (0- or 1-based, a progress bar redrawn
  at 100 % counts once), samples = epochs done × the job's ``samples_per_epoch``;
- none of the three: each matching line counts as one epoch;
- ``loss``: logged as the metric ``loss``; ``accuracy``: the last one is the run's ``test_accuracy`` unless the
  script reports a ``test_accuracy`` itself; ``epochs`` (the total) is accepted and ignored.

A pattern is a Python regular expression, compiled with the ``regex`` package (its syntax is a superset of
``re``'s): each search of a printed line stops after :data:`MATCH_TIMEOUT_S` and releases the GIL while it runs, so a
pattern that backtracks catastrophically (``(a|aa)+$``) loses that line and is reported, but never stalls the
wrapper's reader threads (and, through a full pipe, the training).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import regex

PATTERN_GROUPS = ("epoch", "epochs", "step", "samples", "loss", "accuracy")
"""The named groups a progress_pattern may use."""
PROGRESS_GROUPS = ("samples", "step", "epoch")
MAX_PATTERN_CHARS = 500
"""A progress_pattern's longest length (a regular expression runs on every printed line)."""
MAX_LINE_CHARS = 4096
"""Of a longer printed line only its first this many characters are searched."""
UNMATCHED_NOTE = "progress_pattern matched no line"
"""Starts the run's note when the pattern matched none of the lines the command printed."""
MATCH_TIMEOUT_S = 0.05
"""How long one search of one printed line may take; a line that takes longer counts as unmatched."""
SHOWN_LINES = 8
SHOWN_LINE_CHARS = 200
UNMATCHED_GRACE_S = 30.0
"""Profiling: lines printed this long after the start (less when ``profile_report_timeout_s`` / 10 is shorter)
are past a script's start-up chatter; when the pattern has matched none of them, and the command has printed a
profile's worth of them (warm-up + measured steps + 1 newline-ended lines), profiling stops it and says so."""
UNMATCHED_STOP_NOTE = "profiling stopped the training early: progress_pattern matched none of"
"""Starts the note of a profile run the wrapper stopped because the pattern matched nothing it printed."""


def _short(value: str, limit: int = 160) -> str:
    """The pattern as the user wrote it, in quotes (``'epoch (?P<epoch>\\d+)'``, never repr's ``\\\\d``), cut at
    ``limit`` characters."""
    text = f"'{value}'"
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(value)} characters)"


def check_progress_pattern(pattern: str) -> regex.Pattern[str]:
    """The compiled pattern, or a ValueError naming the field, the value and what is allowed."""
    allowed = ", ".join(PATTERN_GROUPS)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"progress_pattern={_short(pattern)} is too long ({len(pattern)} characters); "
            f"allowed: at most {MAX_PATTERN_CHARS}"
        )
    try:
        compiled = regex.compile(pattern)
    except regex.error as err:
        raise ValueError(
            f"progress_pattern={_short(pattern)} is not a valid regular expression: {err.msg} at position {err.pos}; "
            f"give a Python regular expression with named groups among {allowed}"
        ) from None
    names = list(compiled.groupindex)
    if not names:
        raise ValueError(
            f"progress_pattern={_short(pattern)} has no named group; name what it captures with (?P<name>...), "
            rf"e.g. 'epoch (?P<epoch>\d+)/\d+ loss (?P<loss>[\d.]+)'; allowed names: {allowed}"
        )
    unknown = [name for name in names if name not in PATTERN_GROUPS]
    if unknown:
        raise ValueError(
            f"progress_pattern={_short(pattern)} has the group(s) {', '.join(unknown)}, which carbonflow does not "
            f"know; allowed names: {allowed}"
        )
    return compiled


def check_pattern_for_job(pattern: str, samples_per_epoch: int | None) -> None:
    """A pattern that counts epochs needs the job's ``samples_per_epoch`` to count samples."""
    names = check_progress_pattern(pattern).groupindex
    if samples_per_epoch is None and not ("samples" in names or "step" in names):
        raise ValueError(
            f"progress_pattern={_short(pattern)} counts epochs (it captures neither step nor samples), so "
            "carbonflow must know how many samples one epoch holds; set samples_per_epoch"
        )


@dataclass
class LineMatcher:
    """Turns printed lines into progress reports ``{"step", "samples", "metrics"}`` (None: no match)."""

    pattern: str
    batch_size: int
    samples_per_epoch: int | None = None
    matched: int = 0
    epochs_done: int = 0
    accuracy: float | None = None
    timed_out: int = 0
    _compiled: regex.Pattern[str] = field(init=False, repr=False)
    _last_epoch: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._compiled = check_progress_pattern(self.pattern)

    def match(self, line: str) -> dict[str, Any] | None:
        try:
            found = self._compiled.search(line[:MAX_LINE_CHARS], timeout=MATCH_TIMEOUT_S, concurrent=True)
        except TimeoutError:
            self.timed_out += 1
            return None
        if found is None:
            return None
        groups = {k: v for k, v in found.groupdict().items() if v is not None}
        try:
            step, samples = self._progress(groups)
            metrics = {"loss": float(groups["loss"])} if "loss" in groups else {}
            accuracy = float(groups["accuracy"]) if "accuracy" in groups else None
        except ValueError:
            return None  # a group that captured no number: not a report
        self.matched += 1
        if accuracy is not None:
            self.accuracy = accuracy
        return {"step": step, "samples": samples, "metrics": metrics}

    def _progress(self, groups: dict[str, str]) -> tuple[int, int]:
        if "samples" in groups or "step" in groups:
            step = int(groups["step"]) if "step" in groups else None
            samples = int(groups["samples"]) if "samples" in groups else (step or 0) * self.batch_size
            return (step if step is not None else samples // max(self.batch_size, 1)), samples
        epoch = groups.get("epoch")
        if epoch is None or epoch != self._last_epoch:
            self.epochs_done += 1
            self._last_epoch = epoch
        return self.epochs_done, self.epochs_done * (self.samples_per_epoch or 0)


@dataclass
class SeenLines:
    """How many lines the command printed and the last few (cut), for the "matched nothing" error."""

    count: int = 0
    last: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        if not line.strip():
            return
        self.count += 1
        self.last = [*self.last[-(SHOWN_LINES - 1) :], line[:SHOWN_LINE_CHARS]]

    def unmatched_note(self, pattern: str) -> str:
        shown = " | ".join(self.last) if self.last else "(none)"
        return (
            f"{UNMATCHED_NOTE}: progress_pattern={_short(pattern)} matched none of the {self.count} line(s) the "
            f"command printed; the last of them: {shown}"
        )


def unmatched_stop_note(lines: int, after_s: float, elapsed_s: float) -> str:
    """The note of a profile run stopped because the pattern matched none of ``lines`` printed lines."""
    return (
        f"{UNMATCHED_STOP_NOTE} the {lines} line(s) the command printed after its first {after_s:g} s "
        f"(stopped {elapsed_s:.0f} s after the start, rather than at the script's end)"
    )


def timed_out_note(pattern: str, lines: int) -> str:
    """The run's note when searching some lines took longer than :data:`MATCH_TIMEOUT_S`."""
    return (
        f"progress_pattern={_short(pattern)} took longer than {MATCH_TIMEOUT_S} s on {lines} printed line(s), which "
        "counted as unmatched; the pattern backtracks too much: avoid nested repetition such as (a+)+ or (a|aa)+"
    )
