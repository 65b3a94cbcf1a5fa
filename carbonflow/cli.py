"""``carbonflow`` command line.

- ``carbonflow run --job J --plan P --result R -- <command>``: the training wrapper.
- ``carbonflow profile JOB.json``: profile a job under candidate configurations.
- ``carbonflow demo``: the embedded end-to-end demo (nightly_retrain through Airflow).
- ``carbonflow report JOB``: compare a job's runs from MLflow (table + PNG).
- ``carbonflow spool replay``: push runs spooled during a tracking outage to MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Train deep-learning models with less energy and less carbon.", no_args_is_help=True, add_completion=False
)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def run(
    ctx: typer.Context,
    job: Annotated[Path, typer.Option(help="JobSpec JSON file", exists=True, dir_okay=False)],
    plan: Annotated[Path, typer.Option(help="Plan JSON file", exists=True, dir_okay=False)],
    result: Annotated[Path, typer.Option(help="where to write the measured result (JSON)")],
    trace: Annotated[Path | None, typer.Option(help="write a power trace CSV here")] = None,
    trace_interval: Annotated[float, typer.Option(help="power trace interval (s)", min=0.01)] = 0.5,
    profile_steps: Annotated[int | None, typer.Option(help="profile mode: stop after warm-up + N steps", min=1)] = None,
    warmup_steps: Annotated[int, typer.Option(help="steps before measuring throughput", min=0)] = 0,
    sweep_limits: Annotated[
        str | None, typer.Option(help="profile mode: comma-separated power limits (W) to sweep, highest first")
    ] = None,
    stop_below: Annotated[
        float | None, typer.Option(help="end a sweep once throughput < this fraction of the fastest", min=0, max=1)
    ] = None,
    output_dir: Annotated[Path | None, typer.Option(help="where the training writes its outputs")] = None,
) -> None:
    """Run a training command under the plan's power limit, measure it, always restore the limit."""
    from carbonflow.execution.wrapper import main_from_files

    command = list(ctx.args)
    if not command:
        raise typer.BadParameter("give the training command after '--', e.g. -- python train.py", param_hint="command")
    limits = None
    if sweep_limits:
        try:
            limits = [float(x) for x in sweep_limits.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(
                f"--sweep-limits={sweep_limits!r} must be comma-separated watts, e.g. 250,225,200"
            ) from None
    code = main_from_files(
        job, plan, result, command,
        trace_csv=trace, trace_interval_s=trace_interval, profile_steps=profile_steps,
        warmup_steps=warmup_steps, sweep_limits_w=limits, stop_below_fraction=stop_below, output_dir=output_dir,
    )  # fmt: skip
    raise typer.Exit(code)


@app.command("run-shared")
def run_shared(
    request: Annotated[Path, typer.Option(help="SharedRequest JSON: the two jobs, their plans and commands")],
    result: Annotated[Path, typer.Option(help="where to write the measured pair result (JSON)")],
) -> None:
    """Run two co-located jobs on one GPU, measure the GPU once and split its energy between them."""
    from pydantic import ValidationError

    from carbonflow.execution.shared import main_from_file

    if not request.is_file():
        raise typer.BadParameter(f"{request} is not a readable file", param_hint="--request")
    try:
        code = main_from_file(request, result)
    except ValidationError as err:
        raise typer.BadParameter(str(err), param_hint="--request") from None
    raise typer.Exit(code)


@app.command()
def profile(
    job: Annotated[Path, typer.Argument(help="JobSpec JSON file", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="where to write the Profile JSON")] = Path("profile.json"),
    step_w: Annotated[float, typer.Option(help="power-limit step of the sweep (W)", min=1)] = 25.0,
    workdir: Annotated[Path, typer.Option(help="where runs keep their files")] = Path(".carbonflow/runs/cli"),
) -> None:
    """Profile a job under candidate configurations (power limits × containers), with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from carbonflow.energy.discovery import discover_devices
    from carbonflow.execution.commands import samples_per_epoch
    from carbonflow.execution.local import LocalBackend
    from carbonflow.models import JobSpec
    from carbonflow.profiling.profiler import profile_job

    spec = JobSpec.model_validate_json(job.read_text(encoding="utf-8"))
    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        task = progress.add_task(f"profiling {spec.name}", total=None)

        def advance(key: str, done: int, planned: int) -> None:
            progress.update(task, completed=done, total=max(planned, done), description=f"profiled {key}")

        result = profile_job(
            spec, LocalBackend(workdir / spec.name), devices, samples_per_epoch=samples_per_epoch(spec),
            step_w=step_w, on_progress=advance,
        )  # fmt: skip
    out.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    for point in result.points:
        typer.echo(
            f"{point.config.key():>16}: {point.throughput_samples_per_s:9.1f} samples/s  "
            f"{point.energy_per_sample_j:.4f} J/sample ({point.label})"
        )
    typer.echo(f"profile written to {out}")


@app.command()
def demo(
    home: Annotated[Path, typer.Option(help="state directory (Airflow DB, MLflow store)")] = Path(".carbonflow"),
) -> None:
    """Run the nightly_retrain DAG once end-to-end on embedded Airflow + MLflow and print what it did."""
    from carbonflow.demo import run_demo

    raise typer.Exit(run_demo(home))


@app.command()
def report(
    job: Annotated[str, typer.Argument(help="the job's name (its recurring key)")],
    out: Annotated[Path | None, typer.Option(help="write the comparison plot (PNG) into this folder")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: embedded store)")] = None,
) -> None:
    """Compare a job's runs: energy, emissions, accuracy, savings and configuration."""
    import tempfile

    from rich.console import Console

    from carbonflow.tracking.history import TrackingUnavailableError
    from carbonflow.tracking.report import build_report, render_table

    if out is not None and out.exists() and not out.is_dir():
        raise typer.BadParameter(f"--out={out} is a file; give a folder for the plot", param_hint="--out")
    with tempfile.TemporaryDirectory() as scratch:
        png_path = (out / f"{job}-report.png") if out is not None else Path(scratch) / "report.png"
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        try:
            data = build_report(job, tracking_uri=tracking_uri, png_path=png_path)
        except (LookupError, TrackingUnavailableError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
        console = Console(width=min(Console().width, 100))
        console.print(render_table(data))
        if out is not None:
            console.print(f"plot: {png_path}")


spool_app = typer.Typer(help="Runs kept locally while MLflow was unreachable.", no_args_is_help=True)
app.add_typer(spool_app, name="spool")


@spool_app.command("replay")
def spool_replay(
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: embedded store)")] = None,
) -> None:
    """Log spooled runs to MLflow, each exactly once."""
    from carbonflow.tracking.spool import replay_spool
    from carbonflow.tracking.uri import tracking_uri as default_uri

    count = replay_spool(tracking_uri or default_uri())
    typer.echo(f"replayed {count} spooled run(s)")


@spool_app.command("status")
def spool_status() -> None:
    """List the run records waiting in the local spool for MLflow, and those it refused."""
    from rich.console import Console
    from rich.table import Table

    from carbonflow.models import utcnow
    from carbonflow.tracking.spool import failed_entries, pending, spool_root

    waiting, refused = pending(), failed_entries()
    if not waiting and not refused:
        typer.echo(f"the spool is empty ({spool_root()})")
        return
    table = Table("state", "job", "kind", "age", "target", "attempts", "last error", title=f"spool {spool_root()}")
    for state, entries in (("waiting", waiting), ("refused", refused)):
        for e in entries:
            age_min = (utcnow() - e.meta.spooled_at).total_seconds() / 60
            table.add_row(state, e.record.job, e.record.kind, f"{age_min:.0f} min", e.meta.tracking_uri,
                          str(e.meta.attempts), (e.meta.last_error or "")[:60])  # fmt: skip
    Console(width=100).print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
