"""What a crashed training says for itself: its exit status and its command's last output lines.

The task error and the failed run's MLflow tag ``carbonflow.error`` both carry :func:`crash_report`: a user reads
the exception their script raised, not a dict of logging details. The command's stderr and stdout share one
training log (the local backend's ``training.log``, beside the run's output folder), so its last lines end with
the traceback a crashing Python script prints.
"""

from __future__ import annotations

import signal
from pathlib import Path

from carbonflow.domain import RunResult

TAIL_LINES = 10
"""Last output lines of the command shown in a crashed training's error."""
TAIL_READ_BYTES = 16 * 1024
"""Bytes read from the end of the training log to find them."""
WRAPPER_PREFIXES = ("carbonflow run", "carbonflow:", "CARBONFLOW_RESULT")
"""Lines the wrapper itself writes into the training log (``carbonflow run: ...``, its signed result line)."""


def exit_status_text(exit_code: int) -> str:
    """``exit status 1``; a signal death (``128 + N`` from a shell, ``-N`` from Python) names the signal."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else None
    if number is None:
        return f"exit status {exit_code}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"exit status {exit_code}"
    return f"exit status {exit_code} (killed by {name})"


def training_log_path(result: RunResult) -> Path | None:
    """The training's log beside its output folder (as the local backend keeps it), None when not on this host."""
    output_dir = result.artifacts.get("output_dir")
    path = Path(output_dir).parent / "training.log" if output_dir else None
    return path if path is not None and path.is_file() else None


def last_output_lines(log_path: Path | None, lines: int = TAIL_LINES) -> list[str]:
    """The command's last ``lines`` non-blank output lines in its training log (the wrapper's own lines left out)."""
    if log_path is None:
        return []
    try:
        with log_path.open("rb") as handle:
            handle.seek(max(0, log_path.stat().st_size - TAIL_READ_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    kept = [line.rstrip() for line in text.splitlines() if line.strip() and not line.startswith(WRAPPER_PREFIXES)]
    return kept[-lines:]


def crash_report(job: str, result: RunResult, log_path: Path | None = None) -> str:
    """``training of JOB failed with exit status N`` and, indented below, the command's last output lines."""
    log_path = log_path if log_path is not None else training_log_path(result)
    head = f"training of {job} failed with {exit_status_text(result.exit_code)}"
    tail = last_output_lines(log_path)
    if not tail:
        where = f" (no output in {log_path})" if log_path is not None else " (its log is the run's own: the pod's)"
        return head + where
    return "\n".join([f"{head}; its last output lines:", *(f"  {line}" for line in tail)])
