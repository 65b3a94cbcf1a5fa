"""``carbonflow serve --dags DIR``: the local UI on one's own DAG folder.

Starts the stack ``make serve`` starts (``scripts/serve.sh``: MLflow, Airflow api-server, scheduler, dag-processor
and triggerer, each in its own process group, bound to 127.0.0.1) with ``DIR`` as Airflow's DAGs folder, DAGs
unpaused when first parsed (a local stack: a triggered run never sits queued behind a pause), and one carbon
source for the tasks and the Carbon page (``CARBONFLOW_REPLAY``: the shipped replay by default, live APIs with
``--live``). It prints the URLs, the admin user and where the generated password file is (never the password),
then stays in the foreground until Ctrl-C (or SIGTERM), and stops the stack with ``scripts/stop.sh``;
``carbonflow serve --stop`` (or ``make stop`` for the repository's home) stops a detached one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from carbonflow import settings

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
EXIT_USAGE = 2
POLL_S = 2.0


class ServeError(ValueError):
    """A ``carbonflow serve`` argument that cannot be used; the message names it, its value and what is allowed."""


def resolve_dags_folder(dags: Path) -> Path:
    """``dags`` as an absolute folder; ServeError when it does not exist or is not a folder."""
    path = dags.expanduser().resolve()
    if not path.exists():
        raise ServeError(f"--dags: {path} does not exist; give the folder that holds your DAG files")
    if not path.is_dir():
        raise ServeError(f"--dags: {path} is a file, not a folder; give the folder that holds it ({path.parent})")
    return path


def script(name: str) -> Path:
    """``scripts/<name>`` of the source checkout carbonflow runs from; ServeError when it has none."""
    path = SCRIPTS / name
    if not path.is_file():
        raise ServeError(
            f"{path} not found: carbonflow serve starts the stack with the repository's scripts/{name}; run it from "
            "an editable install of a carbonflow checkout (pip install -e .)"
        )
    return path


def stack_env(
    dags: Path, home: Path, *, airflow_port: int, mlflow_port: int, live: bool, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment ``scripts/serve.sh`` and ``scripts/stop.sh`` run in for this stack."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            settings.HOME_ENV: str(home),
            settings.DAGS_FOLDER_ENV: str(dags),
            settings.AIRFLOW_PORT_ENV: str(airflow_port),
            settings.MLFLOW_PORT_ENV: str(mlflow_port),
            settings.VENV_ENV: settings.venv_setting(env) or str(Path(sys.executable).parent.parent),
            settings.REPLAY_ENV: "0" if live else "1",
            "CARBONFLOW_DAGS_PAUSED_AT_CREATION": "False",
            "CARBONFLOW_STOP_HINT": f"Ctrl-C here, or carbonflow serve --stop --home {home}",
        }
    )
    return env


def stop_stack(home: Path, env: dict[str, str] | None = None) -> int:
    """Stop the stack whose PID files are in ``home``/run (``scripts/stop.sh``); its exit code."""
    env = dict(os.environ if env is None else env)
    env[settings.HOME_ENV] = str(home)
    return subprocess.call([str(script("stop.sh"))], env=env)


def _running(home: Path) -> dict[str, int]:
    """The stack's processes (name → process group) that are still alive."""
    alive = {}
    for pidfile in sorted((home / "run").glob("*.pid")):
        try:
            pid = int(pidfile.read_text().strip())
            os.killpg(pid, 0)
        except (ValueError, ProcessLookupError, FileNotFoundError):
            continue
        except PermissionError:
            pass
        alive[pidfile.stem] = pid
    return alive


def serve(
    dags: Path,
    home: Path,
    *,
    airflow_port: int = 8080,
    mlflow_port: int = 5000,
    live: bool = False,
    detach: bool = False,
    echo: Callable[[str], None] = print,
) -> int:
    """Start the stack on ``dags`` under ``home``; in the foreground until Ctrl-C unless ``detach``. Exit code."""
    dags = resolve_dags_folder(dags)
    home = home.expanduser().resolve()
    serve_sh = script("serve.sh")
    script("stop.sh")
    home.mkdir(parents=True, exist_ok=True)
    env = stack_env(dags, home, airflow_port=airflow_port, mlflow_port=mlflow_port, live=live)

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    # Ctrl-C stops the stack even when SIGINT came ignored (a background job of a non-interactive shell, nohup, CI)
    previous_int = signal.signal(signal.SIGINT, terminate)
    code, started = 0, False
    try:
        echo(f"carbonflow serve: DAGs folder {dags}, home {home}")
        code = subprocess.call([str(serve_sh)], env=env)
        if code != 0:
            return code  # serve.sh said why, and stopped what it had started
        started = True
        if detach:
            echo(f"carbonflow serve: running in the background; stop it with: carbonflow serve --stop --home {home}")
            return 0
        echo("carbonflow serve: serving until Ctrl-C")
        expected = set(_running(home))
        while not (gone := expected - set(_running(home))):
            time.sleep(POLL_S)
        for name in sorted(gone):
            echo(f"carbonflow serve: {name} exited; its log: {home / 'logs' / (name + '.log')}")
        code = 1
    except KeyboardInterrupt:
        echo("\ncarbonflow serve: stopping")
        started = True  # an interrupted start may have left processes: stop.sh stops whatever has a PID file
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    if not started or detach:
        return code
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave half a stack behind
    try:
        stopped = stop_stack(home, env)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    echo("carbonflow serve: stopped" if stopped == 0 else "carbonflow serve: scripts/stop.sh left processes running")
    return code if stopped == 0 else 1
