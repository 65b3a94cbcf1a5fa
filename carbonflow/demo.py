"""The embedded demo behind ``make demo``: nightly_retrain once, end-to-end, through Airflow itself.

It initialises Airflow (SQLite metadata DB) and MLflow (SQLite store + local artifacts) under
``.carbonflow/``, runs ``airflow dags test nightly_retrain`` (profile → plan → wait → train → log for
each job), then reads the runs back from MLflow and prints what was decided and what it cost.
What is simulated, estimated and replayed is said in the output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from carbonflow.settings import (
    DAGS_FOLDER_ENV,
    DEMO_NIGHT_ENV,
    HOME_ENV,
    REPLAY_ENV,
    REPLAY_MIN_WAIT_ENV,
    dags_folder_setting,
    replay_min_wait_text,
    use_home,
)
from carbonflow.terminal import short_time

DAG_ID = "nightly_retrain"
GPU_POOL = "carbonflow_gpu"
GPU_POOL_SLOTS = 4


def demo_env(home: Path, dags_folder: Path) -> dict[str, str]:
    """Environment for the embedded stack: everything under ``home``, replayed carbon data."""
    airflow_home = home / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            HOME_ENV: str(home),
            REPLAY_ENV: "1",
            # `airflow dags test` runs triggers in-process: no scheduler to race, so replayed waits can be short.
            REPLAY_MIN_WAIT_ENV: replay_min_wait_text(env, default="1"),
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
            "MLFLOW_TRACKING_URI": env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def airflow_executable() -> str:
    """The Airflow CLI of this interpreter's environment, else ``airflow`` on PATH."""
    airflow = Path(sys.executable).with_name("airflow")
    return str(airflow) if airflow.exists() else "airflow"


def airflow_cli(args: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run the Airflow CLI with ``args`` in ``env``, appending its output to ``log_path``; returns its exit code."""
    command = [airflow_executable(), *args]
    with log_path.open("ab") as log_file:
        log_file.write(f"\n$ {' '.join(command)}\n".encode())
        log_file.flush()
        return subprocess.call(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def prepare_airflow(env: dict[str, str], log_path: Path) -> bool:
    """The embedded Airflow's metadata DB migrated and the GPU pool set; False when the migration failed."""
    if airflow_cli(["db", "migrate"], env, log_path) != 0:
        return False
    airflow_cli(["pools", "set", GPU_POOL, str(GPU_POOL_SLOTS), "GPU slots for carbonflow training"], env, log_path)
    return True


def find_dags_folder() -> Path:
    """``$CARBONFLOW_DAGS_FOLDER``, else ``./dags``, else the ``dags`` folder of the checkout carbonflow is installed
    from (``make install`` installs it editable), so ``carbonflow demo`` runs from any folder."""
    given = dags_folder_setting()
    folder = Path(given or "dags").resolve()
    checkout = Path(__file__).resolve().parents[1] / "dags"
    if not given and not (folder / f"{DAG_ID}.py").exists() and (checkout / f"{DAG_ID}.py").exists():
        folder = checkout
    if not (folder / f"{DAG_ID}.py").exists():
        raise FileNotFoundError(
            f"{folder / (DAG_ID + '.py')} not found; run from the repository or set {DAGS_FOLDER_ENV}"
        )
    return folder


def run_demo(home: Path, console: Console | None = None) -> int:
    """Run the demo; returns a process exit code."""
    console = console or Console()
    if not console.is_terminal and console.width < 120:
        console.width = 120  # piped output (logs, CI): room for the table instead of 80 columns
    home = home.resolve()
    dags_folder = find_dags_folder()
    env = demo_env(home, dags_folder)
    log_path = home / "demo.log"
    started = datetime.now(UTC)
    t0 = time.monotonic()
    console.print(f"[bold]carbonflow demo[/] — state in {home}, log in {log_path}")
    with console.status("initialising Airflow's metadata DB (SQLite)…"):
        if not prepare_airflow(env, log_path):
            console.print(f"[red]airflow db migrate failed; see {log_path}[/]")
            return 1
    console.print(f"Airflow ready ({time.monotonic() - t0:.0f} s)")
    from carbonflow.workloads.catalog import NIGHTLY_JOBS

    jobs = [job["name"] for job in NIGHTLY_JOBS]
    earlier = training_run_ids(env["MLFLOW_TRACKING_URI"], jobs)
    night = demo_night_of(earlier, jobs)
    env[DEMO_NIGHT_ENV] = str(night)
    if night > 1:
        console.print(
            f"night {night} in this home: each job trains a third more epochs than on night 1 (its data grew), "
            "predicted from what the earlier nights measured"
        )
    with console.status(f"running {DAG_ID} through Airflow: validate → profile → plan → wait → train → log…"):
        code = airflow_cli(["dags", "test", DAG_ID, started.strftime("%Y-%m-%dT%H:%M:%S+00:00")], env, log_path)
    if code != 0:
        console.print(f"[red]{DAG_ID} failed (exit {code}); see {log_path}[/]")
        return code
    console.print(f"{DAG_ID} finished ({time.monotonic() - t0:.0f} s)")
    os.environ["MLFLOW_TRACKING_URI"] = env["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the table reads a few small files
    use_home(home)
    runs = latest_training_runs(env["MLFLOW_TRACKING_URI"], jobs, earlier=earlier)
    if not runs:
        console.print(f"[red]no MLflow training run found; see {log_path}[/]")
        return 1
    print_summary(console, runs)
    console.print(f"Demo finished in {time.monotonic() - t0:.0f} s")
    console.print(f"MLflow tracking URI: {env['MLFLOW_TRACKING_URI']}", soft_wrap=True)
    console.print(f"MLflow run: {runs[0]['run_id']}", soft_wrap=True)
    return 0


def demo_night_of(earlier: set[str], jobs: list[str]) -> int:
    """This demo's night in its home: 1 + the nights already there (each trained every job once)."""
    return 1 + len(earlier) // max(len(jobs), 1)


def training_run_ids(uri: str, jobs: list[str]) -> set[str]:
    """Ids of the training runs of ``jobs`` already in the store (none when a local store does not exist yet)."""
    from carbonflow.tracking.report import existing_store

    try:
        existing_store(uri)
    except LookupError:
        return set()
    try:
        return {row["run_id"] for row in _training_runs(uri, jobs)}
    except Exception:  # the store is unreadable before the run: every run found afterwards is then a candidate
        return set()


def _training_runs(uri: str, jobs: list[str]) -> list[dict[str, Any]]:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema

    client = MlflowClient(tracking_uri=uri)
    rows: list[dict[str, Any]] = []
    for job in jobs:
        experiment = client.get_experiment_by_name(schema.experiment_name(job))
        if experiment is None:
            continue
        found = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{schema.T_KIND}` = 'training'")
        rows += [
            {
                "run_id": run.info.run_id,
                "job": job,
                "params": run.data.params,
                "metrics": run.data.metrics,
                "tags": run.data.tags,
                "recurrence": int(run.data.tags.get(schema.T_RECURRENCE, "0") or 0),
            }
            for run in found
        ]
    return rows


def latest_training_runs(uri: str, jobs: list[str], earlier: set[str] | None = None) -> list[dict[str, Any]]:
    """The newest training run of each job, in the order of ``jobs``: one this demo logged (not in ``earlier``).

    Runs carry their replayed start time and the demo's runs are on-demand runs without a recurrence index,
    so "this night's run" is the one that was not in the store before the DAG ran; among several, the
    highest recurrence index (when there is one) wins.
    """
    earlier = earlier or set()
    rows = []
    for job in jobs:
        found = _training_runs(uri, [job])
        fresh = [r for r in found if r["run_id"] not in earlier] or found
        if fresh:
            rows.append(max(fresh, key=lambda r: r["recurrence"]))
    return rows


def _artifact_json(run_id: str, name: str) -> dict[str, Any]:
    """A JSON artifact of a run ({} when it cannot be read: the summary must still print)."""
    import json
    import tempfile

    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = MlflowClient().download_artifacts(run_id, name, tmp)
        except Exception:  # an artifact store hiccup must not hide the summary
            return {}
        return dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _devices(run_id: str) -> list[dict[str, Any]]:
    """Per-device energy of a run, from its result.json artifact."""
    from carbonflow.tracking import schema

    return list(_artifact_json(run_id, schema.A_RESULT).get("devices", []))


def _alternatives(run_id: str, most: int = 3) -> list[dict[str, Any]]:
    """The best feasible start of each other configuration the planner weighed, from plan.json."""
    from carbonflow.tracking import schema

    plan = _artifact_json(run_id, schema.A_PLAN)
    chosen = plan.get("config", {})
    best: dict[tuple[Any, Any], dict[str, Any]] = {}
    for alt in plan.get("alternatives", []):
        config = alt.get("config", {})
        key = (config.get("containers"), config.get("power_limit_w"))
        if not alt.get("feasible") or key == (chosen.get("containers"), chosen.get("power_limit_w")):
            continue
        if key not in best or alt.get("cost", 0.0) < best[key].get("cost", 0.0):
            best[key] = alt
    return sorted(best.values(), key=lambda a: a.get("cost", 0.0))[:most]


def _w(limit: float | None) -> str:
    return "default limit" if limit is None else f"{limit:g} W"


def _kj(value: float | None) -> str:
    from carbonflow.units import format_energy_j

    return format_energy_j(value)


def _g(value: float | None) -> str:
    from carbonflow.units import format_emissions_g, tidy_zero

    return format_emissions_g(None if value is None else tidy_zero(value))


def saving_cell(saving_g: float | None, fraction: float | None, objective: str | None) -> str:
    """The table's saving: carbonflow's one saving figure (:mod:`carbonflow.accounting.saving`) and the objective."""
    from carbonflow.accounting.saving import format_saving

    if saving_g is None:
        return "–"
    return f"{_g(saving_g)} ({format_saving(fraction)}; objective {objective or '?'})"


def sharing_line(metrics: dict[str, float]) -> str:
    """A co-located run's kept speed (the GPU's; 1 / kept − 1 slower) and, apart, what this machine's CPUs did."""
    from carbonflow.planning.learning import slowdown_from_kept_speed
    from carbonflow.tracking import schema as s

    kept = metrics.get(s.M_KEPT_SPEED_FRACTION)
    if not kept:
        return ""
    pace = metrics.get(s.M_HOST_PACE_FRACTION)
    line = (
        f"shared the GPU: kept {kept:.2f} of its solo speed while both ran "
        f"({slowdown_from_kept_speed(kept) * 100:.0f} % slower"
        + ("; the simulated GPU's pair model, Gavel's V100 measurements)" if pace is not None else "; measured)")
    )
    if pace is not None:
        line += (
            f"; information only: the two real trainings ran at {pace:.2f} of the simulated GPU's pace on this "
            "machine's CPUs, which changes neither the simulated GPU's time nor its energy"
        )
    return line


def print_summary(console: Console, runs: list[dict[str, Any]]) -> None:
    """The demo's table: decision, predicted vs measured, accuracy, saving; then the labels."""
    from carbonflow.tracking import schema as s

    table = Table(title="carbonflow nightly_retrain — one night (replayed carbon data)", show_lines=True)
    for column in ("job", "configuration", "start (replay)", "energy pred/meas", "CO2e pred/meas",
                   "test acc.", "saving vs now @ default"):  # fmt: skip
        table.add_column(column, no_wrap=column == "job")
    for run in runs:
        m, p = run["metrics"], run["params"]
        saving_g, fraction = m.get(s.M_SAVING_G), m.get(s.M_SAVING_FRACTION)
        saving = saving_cell(saving_g, fraction, p.get(s.P_OBJECTIVE))
        table.add_row(
            run["job"],
            f"{p.get(s.P_CONTAINERS)}× @ {p.get(s.P_POWER_LIMIT_W)} W"
            + ("" if p.get(s.P_COLOCATED_JOBS, "none") == "none" else f", GPU shared with {p[s.P_COLOCATED_JOBS]}"),
            short_time(p.get(s.P_PLANNED_START), " UTC"),
            f"{_kj(m.get(s.M_PREDICTED_ENERGY_TOTAL_J))} / {_kj(m.get(s.M_ENERGY_TOTAL_J))}",
            f"{_g(m.get(s.M_PREDICTED_EMISSIONS_G))} / {_g(m.get(s.M_EMISSIONS_G))}",
            "–" if m.get(s.M_TEST_ACCURACY) is None else f"{m[s.M_TEST_ACCURACY]:.3f}",
            saving,
        )
    console.print(table)
    for run in runs:
        m = run["metrics"]
        console.print(f"[bold]{run['job']}[/]: {run['params'].get(s.P_PLAN_REASON, '')}", soft_wrap=True)
        console.print(
            f"  MLflow {run['run_id']}: duration_s={m.get(s.M_DURATION_S):.3f} "
            f"energy_total_j={m.get(s.M_ENERGY_TOTAL_J):.3f} "
            f"emissions_g={m.get(s.M_EMISSIONS_G):.6f} carbon_intensity_mean_gco2_per_kwh="
            f"{m.get(s.M_CARBON_INTENSITY_MEAN):.3f} test_accuracy={m.get(s.M_TEST_ACCURACY, float('nan')):.4f}",
            soft_wrap=True,
        )
        sharing = sharing_line(m)
        if sharing:
            console.print(f"    {sharing}", soft_wrap=True)
        for alt in _alternatives(run["run_id"]):
            config = alt["config"]
            console.print(
                f"    also considered: {config['containers']}× @ {_w(config.get('power_limit_w'))} from "
                f"{short_time(alt['start'], ' UTC')}: {_kj(alt['predicted_energy_j'])}, "
                f"{_g(alt['predicted_emissions_g'])}",
                soft_wrap=True,
            )
        for device in _devices(run["run_id"]):
            console.print(
                f"    {device['kind']} {device['device_model']}: {device['energy_j']:.1f} J ({device['label']})"
                + (f", {device['share'] * 100:.0f} % of the shared device" if device.get("share", 1) < 1 else ""),
                soft_wrap=True,
            )
    labels = runs[0]["tags"].get(s.T_ENERGY_LABELS, "")
    console.print(
        f"Labels: energy figures are [bold]{labels}[/] — the GPU is a [bold]simulated[/] V100 replaying Zeus's "
        "published power/speed measurements (the training itself runs for real on this CPU); CPU energy is "
        "[bold]estimated[/] (codecarbon's model, no RAPL here); carbon intensity is a [bold]replay[/] of NESO's "
        "published GB forecasts and actuals (March 2023, CC BY 4.0); the start-now saving is [bold]predicted[/] "
        "from the profile.",
        soft_wrap=True,
    )
