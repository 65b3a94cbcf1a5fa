"""``carbonflow`` command line.

- ``carbonflow run --job J --plan P --result R -- <command>``: the training wrapper.
- ``carbonflow profile JOB.json``: profile a job under candidate configurations.
- ``carbonflow demo``: the embedded end-to-end demo (nightly_retrain through Airflow).
- ``carbonflow dags test DAG_FILE``: run your own DAG once on embedded Airflow + MLflow (the dev loop).
- ``carbonflow plan JOB_FILE``: plan a job from its profile and the forecast; print the plan and why.
- ``carbonflow try -- CMD``: run a command under the wrapper (no plan to write) and print what it measured.
- ``carbonflow report JOB``: compare a job's runs from MLflow (table + PNG).
- ``carbonflow spool replay``: push runs spooled during a tracking outage to MLflow.
- ``carbonflow serve --dags DIR``: the local Airflow UI (with the Carbon page) and MLflow on your DAG folder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="Train deep-learning models with less energy and less carbon.", no_args_is_help=True, add_completion=False
)

EXIT_BAD_FILE = 2
"""Exit code of a command given a job or plan file it cannot use (as ``carbonflow plan`` exits for a bad job)."""


def package_version() -> str:
    """The installed carbonflow's version (its distribution metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("carbonflow")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"carbonflow {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", help="print carbonflow's version and exit", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """Train deep-learning models with less energy and less carbon."""


def _refuse_file(message: str) -> typer.Exit:
    """Print ``error: message`` on one line to stderr; the Exit to raise (no traceback)."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    return typer.Exit(EXIT_BAD_FILE)


BAD_INPUT = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
"""What a command refuses in one line (exit 2) at its boundary: bad values (pydantic's ValidationError is a
ValueError) and paths that are not there, found while it runs (a job's ``working_dir``, a file it names)."""


def _problem_text(err: Exception) -> str:
    """An error as one line: pydantic's problems as ``field: message; …``, anything else as its message."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'input'}: {e['msg']}" for e in err.errors())
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}: {err.strerror or err}"
    return str(err)


def one_line_errors(command: Callable[..., None]) -> Callable[..., None]:
    """The command boundary every ``carbonflow`` command goes through: bad input (:data:`BAD_INPUT`) is refused
    with ``error: …`` on one line and exit code 2, never a traceback (as ``carbonflow plan`` refuses a bad job)."""

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            return command(*args, **kwargs)
        except BAD_INPUT as err:
            raise _refuse_file(_problem_text(err)) from None

    return guarded


def load_job_or_exit(path: Path, option: str):  # -> JobSpec
    """The job in ``path``, read as ``carbonflow plan`` and the job registry read it (YAML or JSON); a file that
    is missing or not a valid job is refused in one line naming ``option``, the file and each problem."""
    from carbonflow.registry import RegistryError, load_job_file

    if not path.is_file():
        raise _refuse_file(f"{option}: {path} is not a readable file")
    try:
        return load_job_file(path.resolve())
    except RegistryError as err:
        raise _refuse_file(f"{option}: {path} is not a valid job: {err}") from None


def load_plan_or_exit(path: Path, option: str):  # -> Plan
    """The Plan JSON in ``path``; refused in one line when it is not one."""
    from pydantic import ValidationError

    from carbonflow.domain import Plan, field_problems

    try:
        return Plan.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise _refuse_file(f"{option}: {path} is not readable: {err}") from None
    except ValidationError as err:
        problems = "; ".join(field_problems(err, Plan))
        raise _refuse_file(f"{option}: {path} is not a valid Plan JSON: {problems}") from None


def _job_as_json(job: Path, result: Path) -> Path:
    """``job`` itself when it is JSON; else the validated job written as JSON beside ``result`` (the wrapper
    reads JSON), so ``run --job`` takes the YAML that ``plan`` takes."""
    spec = load_job_or_exit(job, "--job")
    if job.suffix == ".json":
        return job
    converted = result.parent / f"{result.stem}.job.json"
    converted.parent.mkdir(parents=True, exist_ok=True)
    converted.write_text(spec.model_dump_json(), encoding="utf-8")
    return converted


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
@one_line_errors
def run(
    ctx: typer.Context,
    job: Annotated[Path, typer.Option(help="the job's JobSpec (YAML or JSON, as in the job registry)")],
    plan: Annotated[Path, typer.Option(help="Plan JSON file")],
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
    train_after_sweep: Annotated[
        bool,
        typer.Option(
            help="in-run profiling: the sweep's windows are the training's first steps (kept); then it trains on "
            "to its end at the swept limit best for the job's objective"
        ),
    ] = False,
    stop_above_energy: Annotated[
        float | None,
        typer.Option(
            help="an energy budget (J): once the run's energy passes it the training is asked to stop "
            "(carbonflow.training.should_stop()), then stopped after --stop-grace seconds"
        ),
    ] = None,
    stop_grace: Annotated[
        float | None,
        typer.Option(help="seconds a training asked to stop at its energy budget may take to stop (default 10)"),
    ] = None,
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
    load_plan_or_exit(plan, "--plan")
    job = _job_as_json(job, result)
    code = main_from_files(
        job, plan, result, command,
        trace_csv=trace, trace_interval_s=trace_interval, profile_steps=profile_steps,
        warmup_steps=warmup_steps, sweep_limits_w=limits, stop_below_fraction=stop_below, output_dir=output_dir,
        train_after_sweep=train_after_sweep, stop_above_energy_j=stop_above_energy,
        **({} if stop_grace is None else {"stop_grace_s": stop_grace}),
    )  # fmt: skip
    raise typer.Exit(code)


@app.command("run-shared")
@one_line_errors
def run_shared(
    request: Annotated[Path, typer.Option(help="SharedRequest JSON: the two jobs, their plans and commands")],
    result: Annotated[Path, typer.Option(help="where to write the measured pair result (JSON)")],
) -> None:
    """Run two co-located jobs on one GPU, measure the GPU once and split its energy between them."""
    from pydantic import ValidationError

    from carbonflow.execution.pair_wrapper import main_from_file

    if not request.is_file():
        raise _refuse_file(f"--request: {request} is not a readable file")
    try:
        code = main_from_file(request, result)
    except ValidationError as err:
        raise _refuse_file(f"--request: {request} is not a valid SharedRequest JSON: {_problem_text(err)}") from None
    raise typer.Exit(code)


HOME_HELP = "carbonflow home (the .carbonflow folder holding the spool)"
HOME_DEFAULT = "$CARBONFLOW_HOME, else ./.carbonflow"  # carbonflow.settings.home_dir, the one resolver
AIRFLOW_PORT_DEFAULT = "$CARBONFLOW_AIRFLOW_PORT, else 8080"  # carbonflow.settings.airflow_port
MLFLOW_PORT_DEFAULT = "$CARBONFLOW_MLFLOW_PORT, else 5000"  # carbonflow.settings.mlflow_port_setting


@app.command()
@one_line_errors
def profile(
    job: Annotated[Path, typer.Argument(help="the job's JobSpec (YAML or JSON, as in the job registry)")],
    out: Annotated[Path, typer.Option(help="where to write the Profile JSON")] = Path("profile.json"),
    step_w: Annotated[float, typer.Option(help="power-limit step of the sweep (W)", min=1)] = 25.0,
    workdir: Annotated[
        Path | None, typer.Option(help="where runs keep their files", show_default=f"{HOME_DEFAULT}, then runs/cli")
    ] = None,
) -> None:
    """Profile a job under candidate configurations (power limits × containers), with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from carbonflow.energy.discovery import discover_devices
    from carbonflow.execution.commands import samples_per_epoch
    from carbonflow.execution.local import LocalBackend, check_working_dir
    from carbonflow.profiling.profiler import ProfilingError, profile_job
    from carbonflow.settings import home_dir
    from carbonflow.terminal import cli_console, print_wrapped
    from carbonflow.units import format_energy_j

    spec = load_job_or_exit(job, "JOB")
    check_working_dir(spec)  # before the progress bar: a working_dir that is not there is refused alone, in one line
    workdir = workdir or home_dir() / "runs" / "cli"
    devices = discover_devices(spec.simulated_gpu, include_cpu=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        task = progress.add_task(f"profiling {spec.name}", total=None)

        def advance(key: str, done: int, planned: int) -> None:
            progress.update(task, completed=done, total=max(planned, done), description=f"profiled {key}")

        try:
            result = profile_job(
                spec, LocalBackend(workdir / spec.name), devices, samples_per_epoch=samples_per_epoch(spec),
                step_w=step_w, on_progress=advance,
            )  # fmt: skip
        except ProfilingError as err:  # the training failed: its message says why and where its log is
            progress.stop()
            print_wrapped(cli_console(stderr=True), f"error: {err}", rest="  ")
            raise typer.Exit(1) from None
    out.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    for point in result.points:
        typer.echo(
            f"{point.config.key():>16}: {point.throughput_samples_per_s:9.1f} samples/s  "
            f"{format_energy_j(point.energy_per_sample_j)}/sample ({point.label})"
        )
    typer.echo(f"profile written to {out}")


@app.command()
@one_line_errors
def demo(
    home: Annotated[
        Path | None, typer.Option(help="state directory (Airflow DB, MLflow store)", show_default=HOME_DEFAULT)
    ] = None,
) -> None:
    """Run the nightly_retrain DAG once end-to-end on embedded Airflow + MLflow and print what it did."""
    from carbonflow.demo import run_demo
    from carbonflow.settings import home_dir

    raise typer.Exit(run_demo(home or home_dir()))


@app.command()
@one_line_errors
def report(
    job: Annotated[str, typer.Argument(help="the job's name (its recurring key)")],
    out: Annotated[Path | None, typer.Option(help="write the view's plot (PNG) into this folder")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: embedded store)")] = None,
    view: Annotated[str, typer.Option(help="runs (one row per run) or energy-accuracy (per configuration)")] = "runs",
) -> None:
    """Compare a job's runs: energy, emissions, accuracy, savings and configuration."""
    if view not in ("runs", "energy-accuracy"):
        raise typer.BadParameter(f"--view={view!r} is not allowed; use runs or energy-accuracy", param_hint="--view")
    from carbonflow.terminal import cli_console, print_path, print_wrapped
    from carbonflow.tracking.history import TrackingUnavailableError
    from carbonflow.tracking.report import build_report, render_png, render_table

    if out is not None and out.exists() and not out.is_dir():
        raise typer.BadParameter(f"--out={out} is a file; give a folder for the plot", param_hint="--out")
    try:
        data = build_report(job, tracking_uri=tracking_uri)
    except (LookupError, TrackingUnavailableError) as err:
        print_wrapped(cli_console(stderr=True), f"error: {err}", rest="  ")
        raise typer.Exit(1) from None
    console = cli_console()
    if view == "energy-accuracy":
        from carbonflow.tracking.report import render_energy_accuracy_png, render_energy_accuracy_table

        console.print(render_energy_accuracy_table(data))
        if out is not None:
            print_path(console, "plot:", render_energy_accuracy_png(data, out / f"{job}-energy-accuracy.png"))
        return
    console.print(render_table(data))
    if out is not None:
        data.png_path = out / f"{job}-report.png"
        print_path(console, "plot:", render_png(data))


@app.command()
@one_line_errors
def plan(
    job_file: Annotated[Path, typer.Argument(help="the job's JobSpec (YAML or JSON, as in the job registry)")],
    profile: Annotated[Path | None, typer.Option(help="a Profile JSON (default: the job's newest in MLflow)")] = None,
    live: Annotated[bool, typer.Option(help="live carbon APIs and the wall clock instead of the replay")] = False,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: embedded store)")] = None,
) -> None:
    """Plan a job as tonight's run would: configuration, start and why, from its profile and the forecast."""
    from carbonflow.plan_preview import run_plan

    raise typer.Exit(run_plan(job_file, profile, live=live, tracking_uri=tracking_uri))


DEFAULT_BATCH_SIZE = 64
"""``carbonflow try``'s batch size when none is given: a JobSpec's default (``JobSpec.batch_size``)."""


@app.command("try", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@one_line_errors
def try_command(
    ctx: typer.Context,
    steps: Annotated[int, typer.Option(help="the work to tell the command ($CARBONFLOW_STEPS, {steps})", min=1)] = 100,
    batch_size: Annotated[
        int, typer.Option(help="the batch size to tell the command ($CARBONFLOW_BATCH_SIZE, {batch_size})", min=1)
    ] = DEFAULT_BATCH_SIZE,
    power_limit: Annotated[float | None, typer.Option(help="GPU power limit (W) for this run; default: none")] = None,
    containers: Annotated[int, typer.Option(help="data-parallel processes", min=1)] = 1,
    workdir: Annotated[
        Path | None,
        typer.Option(help="where the run's files go", show_default="$CARBONFLOW_HOME/try, else ./.carbonflow/try"),
    ] = None,
) -> None:
    """Run CMD (after --) under carbonflow's wrapper, as a job would run, and print what it measured."""
    from carbonflow.settings import home_dir
    from carbonflow.tryout import run_try

    if not ctx.args:
        raise typer.BadParameter("give the command after --, e.g. carbonflow try -- python train.py", param_hint="CMD")
    raise typer.Exit(run_try(list(ctx.args), workdir or home_dir() / "try", steps=steps, batch_size=batch_size,
                             power_limit_w=power_limit, containers=containers))  # fmt: skip


dags_app = typer.Typer(help="Your own DAGs, run locally.", no_args_is_help=True)
app.add_typer(dags_app, name="dags")


@dags_app.command("test")
@one_line_errors
def dags_test(
    dag_file: Annotated[
        Path, typer.Argument(help="the DAG file; its folder is the DAGs folder (every DAG file there is parsed)")
    ],
    dag_id: Annotated[str | None, typer.Option(help="the DAG to run, when the file defines several")] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            help="carbonflow home: the Airflow DB, MLflow store, runs and log go here", show_default=HOME_DEFAULT
        ),
    ] = None,
    live: Annotated[bool, typer.Option(help="live carbon APIs and the wall clock instead of the replay")] = False,
    conf: Annotated[
        str | None,
        typer.Option(
            help="the DAG run's conf, a JSON object (what a UI trigger would send), e.g. '{\"epochs\": 2}'; the "
            "validate task checks it as it checks a trigger's"
        ),
    ] = None,
) -> None:
    """Run your DAG once, end to end, on embedded Airflow + MLflow, and print each training's cost and accuracy."""
    from carbonflow.dag_test import parse_conf, run_dag_test
    from carbonflow.settings import home_dir

    try:
        run_conf = parse_conf(conf)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--conf") from None
    raise typer.Exit(run_dag_test(dag_file, home or home_dir(), dag_id=dag_id, live=live, conf=run_conf))


@app.command()
@one_line_errors
def serve(
    dags: Annotated[Path | None, typer.Option(help="your DAG folder (Airflow's DAGs folder for this stack)")] = None,
    home: Annotated[
        Path | None,
        typer.Option(help="state: Airflow DB, MLflow store, logs, the admin password file", show_default=HOME_DEFAULT),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Airflow UI/API port (127.0.0.1)", min=1, max=65535, show_default=AIRFLOW_PORT_DEFAULT),
    ] = None,
    mlflow_port: Annotated[
        int | None,
        typer.Option(help="MLflow port (127.0.0.1)", min=1, max=65535, show_default=MLFLOW_PORT_DEFAULT),
    ] = None,
    live: Annotated[bool, typer.Option(help="live carbon APIs and the wall clock instead of the replay")] = False,
    detach: Annotated[bool, typer.Option(help="start in the background and return (stop with --stop)")] = False,
    stop: Annotated[bool, typer.Option(help="stop the stack running under --home")] = False,
) -> None:
    """Serve your DAG folder in the local Airflow UI (with the Carbon page) and MLflow, until Ctrl-C."""
    from carbonflow.serve import ServeError, stop_stack
    from carbonflow.serve import serve as serve_stack
    from carbonflow.settings import airflow_port, home_dir, mlflow_port_setting

    home = home or home_dir()
    try:
        if stop:
            raise typer.Exit(stop_stack(home.resolve()))
        if dags is None:
            raise ServeError("--dags: missing; give the folder that holds your DAG files, e.g. --dags ./dags")
        port = port or airflow_port()
        mlflow_port = mlflow_port or mlflow_port_setting()
        code = serve_stack(dags, home, airflow_port=port, mlflow_port=mlflow_port, live=live, detach=detach,
                           echo=typer.echo)  # fmt: skip
    except (ServeError, ValueError) as err:
        raise _refuse_file(str(err)) from None
    raise typer.Exit(code)


spool_app = typer.Typer(help="Runs kept locally while MLflow was unreachable.", no_args_is_help=True)
app.add_typer(spool_app, name="spool")


@spool_app.command("replay")
@one_line_errors
def spool_replay(
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI (default: embedded store)")] = None,
) -> None:
    """Log spooled runs to MLflow, each exactly once."""
    from carbonflow.tracking.spool import replay_spool
    from carbonflow.tracking.uri import tracking_uri as default_uri

    count = replay_spool(tracking_uri or default_uri())
    typer.echo(f"replayed {count} spooled run(s)")


@spool_app.command("status")
@one_line_errors
def spool_status(home: Annotated[Path | None, typer.Option(help=HOME_HELP, show_default=HOME_DEFAULT)] = None) -> None:
    """List the run records waiting in the local spool for MLflow, and those it refused."""
    from rich.table import Table

    from carbonflow.domain import utcnow
    from carbonflow.terminal import cli_console
    from carbonflow.tracking.spool import failed_entries, pending, spool_root
    from carbonflow.tracking.uri import redacted_text, redacted_uri

    root = spool_root(home.resolve() if home is not None else None)
    waiting, refused = pending(root=root), failed_entries(root=root)
    if not waiting and not refused:
        typer.echo(f"the spool is empty ({root})")
        return
    table = Table(title=f"spool {root}")
    table.add_column("state", no_wrap=True)
    table.add_column("job", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("age (min)", justify="right", no_wrap=True)
    table.add_column("target", overflow="fold")
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("last error")
    for state, entries in (("waiting", waiting), ("refused", refused)):
        for e in entries:
            age_min = (utcnow() - e.meta.spooled_at).total_seconds() / 60
            table.add_row(state, e.record.job, e.record.kind, f"{age_min:.0f}", redacted_uri(e.meta.tracking_uri),
                          str(e.meta.attempts), redacted_text(e.meta.last_error or "")[:60])  # fmt: skip
    cli_console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
