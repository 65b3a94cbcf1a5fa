"""``carbonflow plan JOB_FILE``: the plan tonight's run would make, printed with its reasons.

The job is read as the registry reads it (YAML or JSON) and checked as the DAG's ``validate`` task checks it
(:func:`carbonflow.validation.job_problems`: region, finish-by on the wall clock, power limit range), plus
what only this machine can tell: that the job's ``working_dir`` exists here and that the replay has data
for its region. Every problem is printed on its own line (exit code 2). Its profile is ``--profile`` or the
newest one in MLflow; the forecast is the replayed NESO GB data (default, labelled) or the live provider chain
(``--live``); history (fixed costs, realised runs) comes from MLflow when the store exists. A local store
that does not exist is never created: it is named, with how to point at the right one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from carbonflow.domain import JobSpec, Profile

EXIT_INVALID_JOB = 2
"""Exit code of ``carbonflow plan`` for a job that is not valid (1: anything else that stops it)."""


def job_file_problems(path: Path) -> tuple[JobSpec | None, list[str]]:
    """The job in ``path`` (read as the registry reads it), or every problem of its fields, one per message
    (worded by :func:`carbonflow.domain.field_problems`, as the registry and the DAG's validate task word them),
    with the request checks the fields the schema accepted can already have (region, finish-by)."""
    from carbonflow.registry import RegistryError, load_job_file, read_job_data
    from carbonflow.validation import problems_beside_the_schema

    try:
        return load_job_file(path), []
    except RegistryError as err:
        try:
            beside = problems_beside_the_schema(read_job_data(path)[0])
        except (OSError, ValueError):
            beside = []  # not readable: err already says so
        return None, err.problems + beside


def local_problems(spec: JobSpec, *, live: bool) -> list[str]:
    """What the DAG finds only when it runs, checked here: the working directory and the replay's regions."""
    problems = []
    if spec.image is None and spec.working_dir is not None:
        from carbonflow.execution.local import check_working_dir

        try:
            check_working_dir(spec)
        except ValueError as err:
            problems.append(str(err).replace("on this worker", "here"))
    from carbonflow.validation import region_problem

    if not live and region_problem(spec.region) is None:  # an unknown region: job_problems names it
        from carbonflow.carbon.base import ProviderError
        from carbonflow.session import CarbonSource

        try:
            CarbonSource(replay=True).replay_window(spec.region)
        except ProviderError as err:
            problems.append(f"{err} (the replay has recorded data for these regions only; use --live for others)")
    return problems


def run_plan(job_file: Path, profile_file: Path | None, *, live: bool, tracking_uri: str | None,
             console: Console | None = None) -> int:  # fmt: skip
    """Check the job, plan it and print the plan; returns a process exit code."""
    from carbonflow.terminal import cli_console, print_wrapped
    from carbonflow.validation import job_problems

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    console = console or cli_console()
    if not job_file.is_file():
        console.print(f"[red]error:[/] job file {escape(str(job_file))} does not exist")
        return EXIT_INVALID_JOB
    spec, problems = job_file_problems(job_file)
    if spec is not None:
        problems = job_problems(spec) + local_problems(spec, live=live)
    if problems:
        console.print(f"[red]error:[/] {escape(job_file.name)} is not a valid job ({len(problems)} problem"
                      f"{'s' if len(problems) > 1 else ''}):")  # fmt: skip
        for problem in problems:
            print_wrapped(console, problem, first="  - ", rest="    ")
        return EXIT_INVALID_JOB
    assert spec is not None
    store, profile = _store_and_profile(console, spec, profile_file, tracking_uri)
    if profile is None:
        return 1
    _print_plan(console, spec, profile, live=live, store=store)
    return 0


def _store_and_profile(console: Console, spec: JobSpec, profile_file: Path | None,
                       tracking_uri: str | None) -> tuple[str | None, Profile | None]:  # fmt: skip
    """The MLflow store to read (None: none exists, none is created) and the profile to plan from."""
    from carbonflow.tracking.history import TrackingUnavailableError, newest_profile
    from carbonflow.tracking.report import existing_store

    store, no_store = None, ""
    try:
        store = existing_store(tracking_uri)
    except LookupError as err:
        no_store = str(err)
    if profile_file is not None:
        try:
            return store, Profile.model_validate_json(profile_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            console.print(f"[red]error:[/] --profile={escape(str(profile_file))} is not a Profile JSON: "
                          f"{escape(str(err))}")  # fmt: skip
            return store, None
    if store is None:
        console.print(f"[red]error:[/] {escape(no_store)}; or give the job's profile with --profile")
        return None, None
    try:
        profile = newest_profile(spec.name, tracking_uri=store)
    except TrackingUnavailableError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        return store, None
    if profile is None:
        console.print(f"[red]error:[/] {spec.name} has no profile in MLflow yet (tracking URI {escape(store)}): "
                      "profile it first (carbonflow profile JOB.json, or a DAG run), point at the store holding "
                      "it with --tracking-uri, or give --profile")  # fmt: skip
    return store, profile


def _print_plan(console: Console, spec: JobSpec, profile: Profile, *, live: bool, store: str | None) -> None:
    from carbonflow.session import CarbonSource, RunSession
    from carbonflow.session.clock import DEFAULT_DEADLINE_TIME_UTC, next_deadline
    from carbonflow.session.source import finish_by_on_clock, session_clock
    from carbonflow.terminal import print_wrapped
    from carbonflow.units import emissions_unit_for, energy_unit_for, format_number

    class _Session(RunSession):
        def history(self, jobs: list[str]) -> Any:
            return None if store is None else super().history(jobs)  # no store: never create one

    source = CarbonSource(replay=not live)
    clock = session_clock(source, spec.region, None)
    now = clock.now()
    # finish-by was checked on the wall clock (as the DAG checks it); moved onto the planner's clock here
    finish_by = finish_by_on_clock(spec.finish_by, clock, source, spec.region) or next_deadline(
        now, DEFAULT_DEADLINE_TIME_UTC
    )  # as the DAG's operators do for a job without finish_by
    session = _Session(source=source, workdir=Path("."), tracking_uri=store)
    state = session.plan_alone(spec.model_copy(update={"finish_by": finish_by}), profile, now)
    plan = state.members[0].plan
    rows = [("chosen", plan)] + ([("start now at default", plan.baseline)] if plan.baseline is not None else [])
    e_unit, per_j = energy_unit_for([option.predicted_energy_j for _, option in rows])
    g_unit, per_g = emissions_unit_for([option.predicted_emissions_g for _, option in rows])
    where = "live forecast" if live else "replayed NESO GB forecast, March 2023"
    table = Table(title=f"plan for {spec.name} ({where}; now {now:%Y-%m-%d %H:%M} UTC)")
    table.add_column("")
    table.add_column("configuration", overflow="fold")
    for column in ("start (UTC)", "time (s)", f"energy ({e_unit})", f"CO2e ({g_unit})"):
        table.add_column(column, justify="left" if column.startswith("start") else "right", no_wrap=True)
    for label, option in rows:
        energy, emissions = option.predicted_energy_j / per_j, option.predicted_emissions_g / per_g
        table.add_row(label, option.config.key(), f"{option.start:%m-%d %H:%M}", f"{option.predicted_duration_s:.0f}",
                      format_number(energy), format_number(emissions, 4))  # fmt: skip
    console.print(table)
    print_wrapped(console, f"why: {plan.reason}", rest="     ")
    print_wrapped(console, f"objective {plan.objective}; finish by {finish_by:%Y-%m-%d %H:%M} UTC; profile "
                           f"{profile.label} on {profile.device_model}")  # fmt: skip
    if profile.code_version != spec.code_version:
        print_wrapped(console, f"note: the newest profile is of code version {profile.code_version}, "
                               f"the job is at {spec.code_version}: the next DAG run profiles it again",
                      style="yellow")  # fmt: skip
    if store is None:
        print_wrapped(console, "no MLflow store: planned from the profile alone (no history of earlier runs)")
