"""One error family for everything that runs a plan: ``except ExecutionError`` catches any backend's failure."""

from __future__ import annotations

from carbonflow.energy.errors import GpuLeaseUnavailable


class ExecutionError(RuntimeError):
    """A run could not be started, did not produce a result, or could not be stopped cleanly."""


class RunFailed(ExecutionError):
    """The wrapper (local process or pod) ended without a result; the message names the run and its log tail."""


class RunTimedOut(ExecutionError):
    """A run exceeded its time limit and was cancelled (power limits restored)."""


class GpuUnavailable(ExecutionError, GpuLeaseUnavailable):
    """No GPU could be leased for the run: every GPU it may use is held by another run (the message says which)."""


class PowerLimitNotRestored(ExecutionError):
    """A run ended but a GPU's power limit could not be put back; its journal is kept for ``carbonflow restore``."""


GPU_UNAVAILABLE_EXIT = 69
"""Exit status of ``carbonflow run``/``run-shared`` when no GPU could be leased (EX_UNAVAILABLE: retry later)."""


def shell_exit_status(code: int) -> int:
    """A training's exit code as the wrapper's own exit status: a death by signal N (``-N``) becomes a shell's
    ``128 + N`` (137 for SIGKILL), not ``-N`` modulo 256 (247)."""
    return code if code >= 0 else 128 - code
