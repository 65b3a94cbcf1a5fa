"""The local dev loop behind ``carbonflow dags test DAG_FILE``: run one's own DAG once, end to end, on embedded
Airflow (SQLite metadata DB) and MLflow (SQLite store), with replayed carbon data, and print what it did.

Everything lives under ``--home`` (default ``.carbonflow``): the Airflow DB, the MLflow store, the log. The
DAG file's folder is the DAGs folder, so relative ``working_dir``s resolve as they will in production.
Replay is on by default (no carbon API key needed; waits pass at replay speed); ``--live`` uses the live
provider chain and the wall clock, so a start planned for 03:00 really waits until 03:00.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from carbonflow.demo import airflow_cli, airflow_executable, demo_env, prepare_airflow
from carbonflow.terminal import print_path, print_wrapped, short_time


class DevLoopError(RuntimeError):
    """The DAG could not be run; the message says why and where the log is."""


def _airflow_json(args: list[str], env: dict[str, str]) -> Any:
    """An Airflow CLI command's ``-o json`` answer (its last output line; log lines come before it)."""
    done = subprocess.run(
        [airflow_executable(), *args, "-o", "json"], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise DevLoopError(f"airflow {' '.join(args)} failed: {done.stderr.strip()[-1500:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else []


def _import_error(dag_file: Path, env: dict[str, str]) -> str:
    """What importing the DAG file says (its traceback's tail), run as Airflow would: with the same environment."""
    done = subprocess.run([sys.executable, str(dag_file)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=dag_file.parent)  # fmt: skip
    return "\n".join(done.stderr.strip().splitlines()[-12:]) if done.returncode != 0 else ""


def find_dag_id(dag_file: Path, env: dict[str, str], dag_id: str | None) -> str:
    """The DAG to run: ``dag_id`` if given (and defined in the file), else the file's only DAG."""
    dags = _airflow_json(["dags", "list", "--local"], env)
    ids = sorted(d["dag_id"] for d in dags if Path(d.get("fileloc", "")).resolve() == dag_file)
    if not ids:
        error = _import_error(dag_file, env)
        raise DevLoopError(f"{dag_file} does not import:\n{error}" if error else f"{dag_file} defines no DAG")
    if dag_id is not None:
        if dag_id not in ids:
            raise DevLoopError(f"--dag-id={dag_id!r} is not a DAG of {dag_file.name}; it defines: {ids}")
        return dag_id
    if len(ids) != 1:
        raise DevLoopError(f"{dag_file.name} defines {len(ids)} DAGs ({ids}); choose one with --dag-id")
    return ids[0]


def training_runs_of(uri: str, dag_id: str, dag_run_id: str) -> list[dict[str, Any]]:
    """The MLflow training runs a DAG run logged (by the provenance tags carbonflow puts on every run)."""
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s
    from carbonflow.tracking.store import search_all_runs

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments() if e.name.startswith(s.EXPERIMENT_PREFIX)]
    if not experiments:
        return []
    where = (f"tags.`{s.T_KIND}` = 'training' and tags.`{s.T_DAG_ID}` = '{dag_id}' "
             f"and tags.`{s.T_DAG_RUN_ID}` = '{dag_run_id}'")  # fmt: skip
    runs = search_all_runs(client, experiments, where)
    return [{"run_id": r.info.run_id, "job": r.data.tags.get(s.T_JOB, "?"), "params": r.data.params,
             "metrics": r.data.metrics, "tags": r.data.tags} for r in runs]  # fmt: skip


MAX_CONF_CHARS = 65_536
"""The longest ``--conf`` accepted (a trigger's conf is a few bounded fields)."""


def parse_conf(text: str | None) -> dict[str, Any] | None:
    """``--conf``'s JSON object, or None; a clear error for anything else, before Airflow starts."""
    if text is None:
        return None
    if len(text) > MAX_CONF_CHARS:
        raise ValueError(f"{len(text)} characters is too long; allowed: at most {MAX_CONF_CHARS}")
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{text!r} is not JSON ({err.msg}); give an object, e.g. '{{\"epochs\": 2}}'") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{text!r} is a JSON {type(conf).__name__}; give an object, e.g. '{{\"epochs\": 2}}'")
    return conf


def run_dag_test(dag_file: Path, home: Path, *, dag_id: str | None = None, live: bool = False,
                 conf: dict[str, Any] | None = None, console: Console | None = None) -> int:  # fmt: skip
    """Run ``dag_file``'s DAG once on embedded Airflow + MLflow (with ``conf`` as the DAG run's conf, checked by
    its validate task as a trigger's is); returns a process exit code."""
    from carbonflow.terminal import cli_console

    console = console or cli_console()
    dag_file, home = dag_file.resolve(), home.resolve()
    if not dag_file.is_file() or dag_file.suffix != ".py":
        console.print(f"[red]error:[/] {escape(str(dag_file))} is not a DAG file (a .py file)")
        return 2
    env = demo_env(home, dag_file.parent)
    if live:
        env["CARBONFLOW_REPLAY"] = "0"
    log_path = home / "dags-test.log"
    t0 = time.monotonic()
    print_path(console, "carbonflow dags test", dag_file)
    print_path(console, "home (Airflow DB, MLflow store, runs, log):", home)
    try:
        with console.status("initialising Airflow's metadata DB (SQLite)…"):
            if not prepare_airflow(env, log_path):
                raise DevLoopError(f"airflow db migrate failed; see {log_path}")
            dag_id = find_dag_id(dag_file, env, dag_id)
        mode = "live carbon data, wall clock" if live else "replayed carbon data (NESO GB, March 2023)"
        offset = log_path.stat().st_size if log_path.exists() else 0
        with console.status(f"running {dag_id} through Airflow ({mode})…"):
            conf_args = ["--conf", json.dumps(conf)] if conf is not None else []
            code = airflow_cli(["dags", "test", dag_id, "--dagfile-path", str(dag_file), *conf_args], env, log_path)
        outcome = parse_dags_test_log(_read_from(log_path, offset), dag_id)
        if outcome.run_id is None or outcome.state is None:
            latest = max(_airflow_json(["dags", "list-runs", dag_id], env), key=lambda r: r.get("start_date") or "",
                         default={})  # fmt: skip
            outcome.run_id = outcome.run_id or latest.get("run_id")
            outcome.state = outcome.state or latest.get("state")
    except DevLoopError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        return 1
    elapsed = durations_text(outcome.run_duration_s, time.monotonic() - t0) + (
        f", run {outcome.run_id}" if outcome.run_id else ""
    )
    succeeded = code == 0 and outcome.state == "success"
    if succeeded:
        console.print(f"{dag_id} success ({elapsed})", overflow="fold")
        uri = env["MLFLOW_TRACKING_URI"]
        print_runs(console, training_runs_of(uri, dag_id, str(outcome.run_id)), replayed=not live, tracking_uri=uri)
    else:
        print_failure(console, dag_id, elapsed, outcome)
    others = [path for path in outcome.import_errors if Path(path).resolve() != dag_file]
    if others:
        names = ", ".join(os.path.relpath(path, dag_file.parent) for path in others)
        print_wrapped(console, f"note: Airflow parses every DAG-like .py file of the DAGs folder {dag_file.parent}; "
                               f"these do not import (their tracebacks are in the log): {names}")  # fmt: skip
    print_path(console, "MLflow store:", env["MLFLOW_TRACKING_URI"])
    print_path(console, "read the log:" if not succeeded else "Airflow log:", log_path)
    return 0 if succeeded else (code or 1)


def durations_text(run_duration_s: float | None, wall_s: float) -> str:
    """The run's durations, each named: Airflow's run duration (its DAG run's start to end) and the wall time of
    ``carbonflow dags test`` (parsing the DAG and starting Airflow included), never one bare figure."""
    wall = f"{wall_s:.0f} s wall time of `dags test`, parse and start-up included"
    return wall if run_duration_s is None else f"Airflow run duration {run_duration_s:.0f} s; {wall}"


def _read_from(path: Path, offset: int) -> str:
    """The log written since ``offset`` (this invocation's part: the log is appended to, run after run)."""
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", errors="replace")


@dataclass
class DagTestOutcome:
    """What ``airflow dags test`` reported: the DAG run, its state, each failed task's error, import errors."""

    run_id: str | None = None
    state: str | None = None
    failed_tasks: list[tuple[str, str]] = field(default_factory=list)
    """(task, error message without the exception's module path), in the order they failed."""
    last_error: str | None = None
    """The last exception in the log when no task's failure could be told (e.g. Airflow itself failed)."""
    import_errors: list[str] = field(default_factory=list)
    """Files of the DAGs folder Airflow could not import while parsing it."""
    run_duration_s: float | None = None
    """Airflow's ``run_duration`` of the DAG run (its start to its end)."""


_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z? \[")
_STARTING = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_RUNNING = re.compile(r"\[DAG TEST\] running task <TaskInstance: (\S+) ")
_FINISHED = re.compile(r"DagRun Finished: dag_id=(\S+?), .*?run_id=([^,\s]+), .*?state=(\w+)")
_RUN_DURATION = re.compile(r"\brun_duration=([\d.]+)")
_IMPORT = re.compile(r"Failed to import: (\S+)")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Failed|Exit|Interrupt)\w*: .+")


def parse_dags_test_log(text: str, dag_id: str) -> DagTestOutcome:
    """Read ``airflow dags test``'s log: which task failed with what, the run's id and state, import errors."""
    outcome = DagTestOutcome()
    lines = text.splitlines()
    task = "?"
    for i, line in enumerate(lines):
        if (m := _STARTING.search(line)) is not None:
            task = m.group(1) + (f"[{m.group(2)}]" if m.group(2) != "-1" else "")
        elif (m := _RUNNING.search(line)) is not None and m.group(1).startswith(f"{dag_id}."):
            name = m.group(1)[len(dag_id) + 1 :]
            task = task if task.split("[")[0] == name else name
        elif "Task failed with exception" in line:
            outcome.failed_tasks.append((task, _exception_message(_block_after(lines, i))))
        elif (m := _FINISHED.search(line)) is not None and m.group(1) == dag_id:
            outcome.run_id, outcome.state = m.group(2), m.group(3)
            if (d := _RUN_DURATION.search(line)) is not None:
                outcome.run_duration_s = float(d.group(1))
        elif (m := _IMPORT.search(line)) is not None and m.group(1) not in outcome.import_errors:
            outcome.import_errors.append(m.group(1))
    found = [line.strip() for line in lines if _EXCEPTION_LINE.match(line.strip())]
    outcome.last_error = _plain_exception(found[-1]) if found else None
    return outcome


def _block_after(lines: list[str], index: int) -> list[str]:
    """The lines after log record ``index`` up to the next log record (a traceback and its message)."""
    block = []
    for line in lines[index + 1 :]:
        if _RECORD.match(line):
            break
        block.append(line)
    return block


def _exception_message(block: list[str]) -> str:
    """The final exception of a traceback block, as ``message`` (Airflow's own classes) or ``Class: message``."""
    current: list[str] = []
    in_frames = False
    for line in block:
        if line.startswith("Traceback (most recent call last):"):
            in_frames, current = True, []
        elif in_frames and (line.startswith(" ") or not line.strip()):
            continue
        elif in_frames:
            in_frames, current = False, [line]
        elif current and line.startswith(_CHAIN):
            current = []
        elif current:
            current.append(line)
    while current and not current[-1].strip():
        current.pop()
    if not current:
        return "no error message in the log"
    return "\n".join([_plain_exception(current[0]), *current[1:]])


def _plain_exception(line: str) -> str:
    """``airflow.sdk.exceptions.AirflowFailException: msg`` → ``msg``; ``pkg.mod.ProfilingError: msg`` →
    ``ProfilingError: msg`` (the class says what kind of error; its module path says nothing to a user)."""
    name, sep, message = line.partition(": ")
    if not sep or " " in name:
        return line
    if name.startswith("airflow.") or name.split(".")[-1] in ("AirflowException", "AirflowFailException"):
        return message
    return f"{name.split('.')[-1]}: {message}"


MAX_ERROR_LINES = 12
"""Lines of a failed task's error printed in the summary (a training's log tail can be long: the log has it all)."""


def print_failure(console: Console, dag_id: str, elapsed: str, outcome: DagTestOutcome) -> None:
    """Once, plainly: which task failed and why; the log to read follows."""
    console.print(f"[red]{escape(dag_id)} did not succeed[/] ({escape(elapsed)})", overflow="fold")
    failures = outcome.failed_tasks or [("a task", outcome.last_error or "no error message in the log")]
    for task, message in failures:
        first, *more = message.splitlines() or [""]
        print_wrapped(console, f"task {task} failed: {first}", rest="  ")
        for line in more[:MAX_ERROR_LINES]:
            print_wrapped(console, line, first="  ", rest="  ")
        if len(more) > MAX_ERROR_LINES:
            console.print(f"  … ({len(more) - MAX_ERROR_LINES} more lines in the log)")


def training_log_of(uri: str, run_id: str) -> Path | None:
    """The training's own log (its output, the wrapper's command line) beside its output folder, from the run's
    ``result.json`` artifact; None when it cannot be told."""
    import tempfile

    from carbonflow.tracking import schema as s
    from carbonflow.tracking.store import client_for

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            local = client_for(uri).download_artifacts(run_id, s.A_RESULT, tmp)
            result = json.loads(Path(local).read_text(encoding="utf-8"))
    except Exception:  # an artifact that is not there: the summary says nothing rather than fail
        return None
    output_dir = (result.get("artifacts") or {}).get("output_dir") or result.get("output_dir")
    return Path(output_dir).parent / "training.log" if output_dir else None


def print_runs(
    console: Console, runs: list[dict[str, Any]], *, replayed: bool, tracking_uri: str | None = None
) -> None:
    """One row per training run: what was chosen, what it cost (predicted and measured), the saving, accuracy;
    then each run's plan reason, whether it was observe-only, and the path of its training log."""
    from carbonflow.tracking import schema as s
    from carbonflow.units import emissions_unit_for, energy_unit_for, format_column, format_percent

    if not runs:
        console.print("no training run was logged by this DAG run (does it have a CarbonAwareTrainingOperator?)")
        return
    runs = sorted(runs, key=lambda r: r["job"])
    energies = [v for r in runs for v in (r["metrics"].get(s.M_ENERGY_TOTAL_J), r["metrics"].get(
        s.M_PREDICTED_ENERGY_TOTAL_J)) if v is not None]  # fmt: skip
    e_unit, per_j = energy_unit_for(energies)
    g_unit, per_g = emissions_unit_for([r["metrics"].get(s.M_EMISSIONS_G) or 0.0 for r in runs])
    labels = {r["tags"].get(s.T_ENERGY_LABELS, "") for r in runs}
    title = "training runs of this DAG run" + (" (replayed carbon data, March 2023)" if replayed else "")
    batch_sizes = [_batch_size_cell(r["params"].get(s.P_BATCH_SIZE)) for r in runs]
    chose_batch_sizes = any(r["params"].get(s.P_BATCH_SIZE, "").isdigit() for r in runs)  # not the job's own
    table = Table(title=title)
    table.add_column("job", overflow="fold")
    table.add_column("containers\n× limit")
    if chose_batch_sizes:  # a job that learns its batch size: which one each run trained at
        table.add_column("batch\nsize", justify="right")
    table.add_column("start (UTC)", no_wrap=True)
    for header in (f"energy ({e_unit})\npredicted", f"energy ({e_unit})\nmeasured", f"CO2e\n({g_unit})",
                   "saving\n(%)", "test\nacc."):  # fmt: skip
        table.add_column(header, justify="right", no_wrap=True)
    if len(labels) > 1:
        table.add_column("energy label")

    def column(name: str, per: float) -> list[str]:  # one format per column: the same decimals on every row
        return format_column([None if name not in r["metrics"] else r["metrics"][name] / per for r in runs])

    cells = zip(column(s.M_PREDICTED_ENERGY_TOTAL_J, per_j), column(s.M_ENERGY_TOTAL_J, per_j),
                column(s.M_EMISSIONS_G, per_g), strict=True)  # fmt: skip
    for run, batch_size, (predicted, measured, emissions) in zip(runs, batch_sizes, cells, strict=True):
        m, p = run["metrics"], run["params"]
        table.add_row(
            run["job"], _configuration(p.get(s.P_CONTAINERS), p.get(s.P_POWER_LIMIT_W)),
            *([batch_size] if chose_batch_sizes else []), short_time(p.get(s.P_PLANNED_START)),
            predicted, measured, emissions,
            format_percent(m.get(s.M_SAVING_FRACTION)),
            f"{m[s.M_TEST_ACCURACY]:.3f}" if s.M_TEST_ACCURACY in m else "–",
            *([run["tags"].get(s.T_ENERGY_LABELS, "")] if len(labels) > 1 else []),
        )  # fmt: skip
    if len(runs) > 1:  # the DAG run's own cost: every training, a stopped attempt and its rerun included
        table.add_section()
        table.add_row(f"total ({len(runs)} runs)", *[""] * (2 + chose_batch_sizes), "",
                      *_totals(runs, per_j, per_g), "", "", *([""] if len(labels) > 1 else []))  # fmt: skip
    energy = f"energy: {labels.pop() or 'unlabelled'}; " if len(labels) == 1 else ""
    table.caption = energy + SAVING_CAPTION
    console.print(table)
    for run in runs:
        tags = run["tags"]
        observe_only = tags.get(s.T_OBSERVE_ONLY) == "true"
        reason = run["params"].get(s.P_PLAN_REASON, "")
        if observe_only:  # the reason: "observe-only: trained at once …; carbonflow would have run …"
            print_wrapped(console, f"{run['job']}: observe-only (trained at once, at the current limit; the plan "
                                   "was logged, not applied)", rest="  ")  # fmt: skip
            print_wrapped(console, reason.split("; ", 1)[-1], first="  ", rest="  ")
        else:
            print_wrapped(console, f"{run['job']}: planned — {predicted_saving_named(reason)}", rest="  ")
        registry = tags.get(s.T_MODEL_REGISTRY_NOTE)
        if registry:
            print_wrapped(console, f"model: {registry}", first="  ", rest="    ")
        for warning in _run_warnings(tags.get(s.T_NOTE, "")):
            print_wrapped(console, f"warning: {warning}", first="  ", rest="    ", style="yellow")
        log = training_log_of(tracking_uri, run["run_id"]) if tracking_uri else None
        if log is not None:
            print_path(console, "training log:", log, indent="  ")


def _totals(runs: list[dict[str, Any]], per_j: float, per_g: float) -> list[str]:
    """The measured energy and CO2e of all ``runs`` (in the table's units; '–' when a run has none)."""
    from carbonflow.tracking import schema as s
    from carbonflow.units import format_column

    out = []
    for name, per in ((s.M_ENERGY_TOTAL_J, per_j), (s.M_EMISSIONS_G, per_g)):
        values = [r["metrics"].get(name) for r in runs]
        out += format_column([None if None in values else sum(values) / per])
    return out


SAVING_CAPTION = (
    "saving (%): measured — this run's emissions against the predicted emissions of starting now at the default "
    "configuration, the figure MLflow (saving_fraction), the task log and the Carbon page show; a plan's "
    "predicted saving is the planner's forecast of it"
)
"""How the summary names its one saving figure (the run's, measured) apart from the plan's predicted one."""

_PLAN_SAVING = re.compile(r"(?<!predicted )\bsaving (?=[−-]?\d)")


def predicted_saving_named(reason: str) -> str:
    """A plan's reason with its saving named as the planner's prediction (``saving 23.4 %`` → ``predicted saving
    23.4 %``), so it is not read as the run's measured saving beside it."""
    return _PLAN_SAVING.sub("predicted saving ", reason)


def _run_warnings(note: str) -> list[str]:
    """The notes of a run's MLflow description a user must not miss (its work was not what the job asked)."""
    from carbonflow.session.run import MORE_WORK

    return [line for line in note.splitlines() if line.startswith(MORE_WORK)]


def _batch_size_cell(logged: str | None) -> str:
    """The batch size a run logged: ``128``; the job's own, ``default (64)``, as ``64 (default)``; none, ``–``."""
    if not logged:
        return "–"
    if logged.startswith("default (") and logged.endswith(")"):
        return f"{logged[len('default (') : -1]} (default)"
    return logged


def _configuration(containers: str | None, limit_w: str | None) -> str:
    limit = "default" if limit_w in (None, "", "None", "default") else f"{limit_w} W"
    return f"{containers} × {limit}"
