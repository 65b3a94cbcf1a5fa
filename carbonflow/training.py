"""The training side of the training contract: a tiny progress API for training code.

Training code calls :func:`report` after each optimiser step and checks :func:`should_stop`.
The ``carbonflow run`` wrapper reads the reports to measure throughput (profiling) and to collect
final metrics such as ``test_accuracy``. Code in any language can instead append JSON lines
``{"step": int, "samples": int, "metrics": {...}}`` to the file named by ``CARBONFLOW_PROGRESS_FILE``.

Environment set by the wrapper:

- ``CARBONFLOW_PROGRESS_FILE``: JSON-lines file to append reports to (no file: reports are no-ops).
- ``CARBONFLOW_MAX_STEPS``: profile mode; :func:`should_stop` turns true after this many steps.
- ``CARBONFLOW_SIM_SLOWDOWN_FILE`` (or a fixed ``CARBONFLOW_SIM_SLOWDOWN``): on a simulated GPU, how
  much slower than at its maximum power limit the emulated device runs (>= 1); the wrapper rewrites
  the file when it changes the limit mid-run (profiling sweeps). Each step is stretched by sleeping
  so the run's wall time follows the published Zeus measurements; the training itself runs for real
  on the CPU.
- ``CARBONFLOW_STOP_FILE``: when this file exists, :func:`should_stop` is true (the wrapper ends a
  profiling sweep early this way).
- ``CARBONFLOW_OUTPUT_DIR``: where to save the model and other outputs.
- ``CARBONFLOW_TARGET_METRIC`` / ``CARBONFLOW_TARGET_VALUE``: a job trained to a target (:func:`target`); in a
  training run :func:`should_stop` turns true once a report's metric reaches the value, so a loop that checks it
  ends at the target (as Zeus's training does), its model saved as at any other end.
- ``CARBONFLOW_LR_SCALE``: the factor for the learning rate at tonight's batch size, from the job's
  ``lr_scaling`` (:func:`lr_scale`; 1 at the job's own batch size).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from carbonflow import contract
from carbonflow.contract import (
    MAX_STEPS_ENV,
    OUTPUT_DIR_ENV,
    PROGRESS_FILE_ENV,
    SIM_SLOWDOWN_ENV,
    SIM_SLOWDOWN_FILE_ENV,
    STOP_FILE_ENV,
    TARGET_METRIC_ENV,
    TARGET_VALUE_ENV,
)

__all__ = [
    "MAX_STEPS_ENV",
    "OUTPUT_DIR_ENV",
    "PROGRESS_FILE_ENV",
    "SIM_SLOWDOWN_ENV",
    "SIM_SLOWDOWN_FILE_ENV",
    "STOP_FILE_ENV",
    "TARGET_METRIC_ENV",
    "TARGET_VALUE_ENV",
    "lr_scale",
    "output_dir",
    "profiling",
    "report",
    "reset",
    "should_stop",
    "target",
]


class _Reporter:
    def __init__(self) -> None:
        self.steps = 0
        self.last_step_end_s = time.monotonic()
        self.slowdown = max(1.0, contract.sim_slowdown())
        self.slowdown_file = contract.sim_slowdown_file()
        self.stop_file = contract.stop_file()
        self.max_steps = contract.max_steps()
        self.path = contract.progress_file()
        self.target = contract.work_target()
        self.reached_target = False
        # Only rank 0 writes in a distributed run; every rank throttles.
        self.rank = int(os.environ.get("RANK", "0"))

    def _current_slowdown(self) -> float:
        if self.slowdown_file is None:
            return self.slowdown
        try:
            return max(1.0, float(self.slowdown_file.read_text(encoding="utf-8") or 1))
        except (OSError, ValueError):
            return self.slowdown

    def report(self, step: int, samples: int, metrics: dict[str, Any]) -> None:
        now = time.monotonic()
        self.slowdown = self._current_slowdown()
        if self.slowdown > 1.0:
            step_s = now - self.last_step_end_s
            time.sleep(step_s * (self.slowdown - 1.0))
            now = time.monotonic()
        self.last_step_end_s = now
        self.steps = max(self.steps, step)
        self.reached_target = self.reached_target or self._reaches_target(metrics)
        if self.path is None or self.rank != 0:
            return
        line = {"step": int(step), "samples": int(samples), "t_s": now, "metrics": _floats(metrics)}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def _reaches_target(self, metrics: dict[str, Any]) -> bool:
        if self.target is None or self.target[0] not in metrics:
            return False
        name, value = self.target
        return _floats({name: metrics[name]})[name] >= value

    @property
    def profiling(self) -> bool:
        return contract.training_mode() == "profile" or self.max_steps is not None

    def should_stop(self) -> bool:
        if self.max_steps is not None and self.steps >= self.max_steps:
            return True
        if self.reached_target and not self.profiling:  # a profile measures its window whatever the metric says
            return True
        return self.stop_file is not None and self.stop_file.exists()


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"metric {key}={value!r} is not a number; report numbers only") from err
    return out


_reporter: _Reporter | None = None


def _get() -> _Reporter:
    global _reporter
    if _reporter is None:
        _reporter = _Reporter()
    return _reporter


def reset() -> None:
    """Forget the cached reporter (re-read the environment); for tests and in-process reuse."""
    global _reporter
    _reporter = None


def report(step: int, samples: int, **metrics: Any) -> None:
    """Report progress: ``step`` optimiser steps done, ``samples`` samples processed in total."""
    _get().report(step, samples, metrics)


def should_stop() -> bool:
    """True when the training should end: in profile mode once the step budget is used up; when carbonflow asks
    (a profile's window ended, the run's energy budget is spent); in a training run of a job trained to a target,
    once a :func:`report` gave its ``target_metric`` at least its ``target_value``."""
    return _get().should_stop()


def target() -> tuple[str, float] | None:
    """The job's target, ``(target_metric, target_value)``, or None when it is not trained to one."""
    return _get().target


def lr_scale() -> float:
    """The factor to multiply the learning rate by at tonight's batch size (the job's ``lr_scaling``; 1 when it is
    ``none`` or the batch size is the job's own): ``lr = base_lr * training.lr_scale()``."""
    return contract.lr_scale()


def profiling() -> bool:
    """True while carbonflow profiles the job (``CARBONFLOW_MODE=profile``): train until :func:`should_stop`."""
    return _get().profiling


def output_dir() -> Path:
    """Where to write the model and other outputs (created when missing)."""
    path = contract.output_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path
