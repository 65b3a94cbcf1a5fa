"""``carbonflow try -- CMD``: run a command under the wrapper as a job would run, without writing a Plan.

The command gets the same environment a job's command gets (work variables, progress file, output
directory, GPUs pinned by lease), runs through the local backend and its ``carbonflow run`` wrapper
(GPU leases, power limit set and always restored, energy measured), and the measured result is printed:
energy per device with its label, throughput, the metrics the training reported, where its log is.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from carbonflow.domain import Config, JobSpec, Plan


def try_job(command: list[str], steps: int, batch_size: int, containers: int) -> JobSpec:
    """The throwaway job ``try`` runs: the command in the current directory, ``steps`` of work."""
    return JobSpec(name="try", command=command, working_dir=os.getcwd(), steps=steps, max_containers=containers,
                   min_containers=containers, region="GB", batch_size=batch_size)  # fmt: skip


def run_try(command: list[str], workdir: Path, *, steps: int, batch_size: int, power_limit_w: float | None,
            containers: int, console: Console | None = None) -> int:  # fmt: skip
    """Run ``command`` once under the wrapper; print the measurement; returns the command's exit code."""
    from carbonflow.execution.backend import run_to_completion
    from carbonflow.execution.errors import ExecutionError
    from carbonflow.execution.local import LocalBackend
    from carbonflow.terminal import cli_console, print_path
    from carbonflow.units import energy_unit_for, format_number

    console = console or cli_console()
    spec = try_job(command, steps, batch_size, containers)
    plan = Plan(job=spec.name, config=Config(containers=containers, power_limit_w=power_limit_w),
                start=datetime.now(UTC), predicted_duration_s=0, predicted_energy_j=0, predicted_emissions_g=0,
                region=spec.region, forecast_provider="none (carbonflow try)", reason="carbonflow try")  # fmt: skip
    try:
        with console.status(f"running {' '.join(command)} under carbonflow's wrapper…"):
            run = run_to_completion(LocalBackend(workdir.resolve()), spec, plan)
    except ExecutionError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        return 1
    table = Table(title=f"carbonflow try — exit code {run.exit_code}, {run.duration_s:.1f} s")
    unit, per_j = energy_unit_for([device.energy_j for device in run.devices])
    table.add_column("device")
    table.add_column(f"energy ({unit})", justify="right", no_wrap=True)
    table.add_column("label", no_wrap=True)
    table.add_column("power limit (W)", justify="right")
    for device in run.devices:
        limit = "–" if device.power_limit_w is None else f"{device.power_limit_w:g}"
        energy = format_number(device.energy_j / per_j)
        table.add_row(f"{device.kind} {device.device_model}", energy, device.label, limit)
    console.print(table)
    if run.steps:
        rate = f"{run.throughput_samples_per_s:.1f} samples/s"
        console.print(f"progress reported: {run.steps} steps, {run.samples} samples ({rate})")
    else:
        console.print("progress reported: none (call carbonflow.training.report(step, samples) to be profiled)")
    if run.metrics:
        console.print("metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(run.metrics.items())))
    for note in run.notes:
        console.print(f"note: {escape(note)}")
    if run.output_dir:
        print_path(console, "log:", Path(run.output_dir).parent / "training.log")
    return run.exit_code
