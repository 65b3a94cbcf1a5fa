"""The command a backend runs for a job under a configuration (local process or container)."""

from __future__ import annotations

import math
import sys

from carbonflow.contract import (
    BATCH_SIZE_ENV,
    CONTAINERS_ENV,
    EPOCHS_ENV,
    JOB_NAME_ENV,
    LR_SCALE_ENV,
    MODE_ENV,
    STEPS_ENV,
    TARGET_METRIC_ENV,
    TARGET_VALUE_ENV,
)
from carbonflow.domain import Config, JobSpec

WORKLOAD_MODULES: dict[str, str] = {
    "digits_cnn": "carbonflow.workloads.digits_cnn",
}
"""Built-in workloads: name -> module (each has a ``SAMPLES_PER_EPOCH`` and a ``main``)."""


def samples_per_epoch(spec: JobSpec) -> int | None:
    """Samples in one epoch: the built-in workload's, else what the job says (``samples_per_epoch``)."""
    if spec.workload is None:
        return spec.samples_per_epoch
    import importlib

    return int(importlib.import_module(workload_module(spec.workload)).SAMPLES_PER_EPOCH)


def workload_module(name: str) -> str:
    """The module of a built-in workload, with an error listing the allowed names."""
    try:
        return WORKLOAD_MODULES[name]
    except KeyError:
        allowed = ", ".join(sorted(WORKLOAD_MODULES))
        raise ValueError(f"workload={name!r} is not a built-in workload; allowed: {allowed}") from None


def training_args(spec: JobSpec, config: Config) -> list[str]:
    """Arguments every built-in workload understands: work and batch size."""
    args: list[str] = []
    if spec.epochs is not None:
        args += ["--epochs", str(spec.epochs)]
    batch_size = config.batch_size or spec.batch_size
    args += ["--batch-size", str(batch_size)]
    return args


def training_command(spec: JobSpec, config: Config, *, python: str = sys.executable) -> list[str]:
    """The training command for ``config.containers`` data-parallel processes on one node.

    One container runs the command directly; several run under PyTorch's distributed launcher
    (``torch.distributed.run``), which sets RANK/WORLD_SIZE for each process.
    """
    if spec.workload is not None:
        inner = ["-m", workload_module(spec.workload), *training_args(spec, config)]
        if config.containers == 1:
            return [python, *inner]
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={config.containers}", *inner,
        ]  # fmt: skip
    if spec.command is None:
        raise ValueError(f"job {spec.name!r} has no workload or command to run locally (image={spec.image!r})")
    command = resolved_command(spec, config, python=python)
    if config.containers == 1:
        return command
    return [
        python, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={config.containers}", "--no-python", *command,
    ]  # fmt: skip


PYTHON_NAMES = ("python", "python3")
"""A command starting with one of these runs under the worker's interpreter (carbonflow's own)."""


def resolved_command(spec: JobSpec, config: Config, *, python: str = sys.executable, output_dir: str = "") -> list[str]:
    """The job's command with its placeholders filled and ``python`` resolved to the worker's interpreter.

    ``{output_dir}`` is left for the wrapper (it knows the run's directory) unless ``output_dir`` is given.
    """
    values = {
        "epochs": "" if spec.epochs is None else str(spec.epochs),
        "steps": "" if spec.steps is None else str(spec.steps),
        "batch_size": str(config.batch_size or spec.batch_size),
        "lr_scale": _lr_scale_text(spec, config),
        "python": python,
        "output_dir": output_dir or "{output_dir}",
    }
    command = [_fill(word, values) for word in spec.command or []]
    if command and command[0] in PYTHON_NAMES:
        command[0] = python
    return command


def _fill(word: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        word = word.replace("{" + name + "}", value)
    return word


def work_env(spec: JobSpec, config: Config, mode: str) -> dict[str, str]:
    """The job's work as environment variables (set for every training, command or built-in)."""
    env = {
        JOB_NAME_ENV: spec.name,
        BATCH_SIZE_ENV: str(config.batch_size or spec.batch_size),
        MODE_ENV: mode,
        CONTAINERS_ENV: str(config.containers),
    }
    if spec.epochs is not None:
        env[EPOCHS_ENV] = str(spec.epochs)
    if spec.steps is not None:
        env[STEPS_ENV] = str(spec.steps)
    if spec.target_metric is not None and spec.target_value is not None:
        env[TARGET_METRIC_ENV] = spec.target_metric
        env[TARGET_VALUE_ENV] = repr(float(spec.target_value))
    env[LR_SCALE_ENV] = _lr_scale_text(spec, config)
    return env


def lr_scale(spec: JobSpec, config: Config) -> float:
    """The factor for the training's learning rate at ``config``'s batch size, by the job's ``lr_scaling``: ``linear``
    (Goyal et al.) batch size ÷ the job's ``batch_size``, ``sqrt`` its square root, ``none`` 1."""
    ratio = (config.batch_size or spec.batch_size) / spec.batch_size
    return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[spec.lr_scaling]


def _lr_scale_text(spec: JobSpec, config: Config) -> str:
    return f"{lr_scale(spec, config):.12g}"
