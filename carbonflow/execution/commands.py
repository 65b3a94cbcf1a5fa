"""The command a backend runs for a job under a configuration (local process or container)."""

from __future__ import annotations

import sys

from carbonflow.models import Config, JobSpec

WORKLOAD_MODULES: dict[str, str] = {
    "digits_cnn": "carbonflow.workloads.digits_cnn",
}
"""Built-in workloads: name -> module (each has a ``SAMPLES_PER_EPOCH`` and a ``main``)."""


def samples_per_epoch(spec: JobSpec) -> int | None:
    """Samples in one epoch of a built-in workload (None for commands and images)."""
    if spec.workload is None:
        return None
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
    if config.containers == 1:
        return list(spec.command)
    return [
        python, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={config.containers}", "--no-python", *spec.command,
    ]  # fmt: skip
