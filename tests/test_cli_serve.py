"""``carbonflow serve --dags DIR`` refuses a DAG folder it cannot serve in one line, before starting anything
(issue #25, "A local UI for your own DAGs"); the stack's environment serves that folder, unpaused, with one
carbon source for the tasks and the Carbon page. The stack itself: tests/e2e/test_serve_own_dags.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carbonflow.cli import app
from carbonflow.serve import SCRIPTS, resolve_dags_folder, stack_env

pytestmark = pytest.mark.timeout(60)


def _serve(*args: str):
    return CliRunner().invoke(app, ["serve", *args])


def _one_line_error(result) -> str:
    text = result.stderr if result.stderr else result.output
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert "Traceback" not in text
    return lines[0]


def test_serve_refuses_a_dags_folder_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dags"
    result = _serve("--dags", str(missing), "--home", str(tmp_path / "home"))
    assert result.exit_code == 2
    line = _one_line_error(result)
    assert f"--dags: {missing} does not exist" in line
    assert not (tmp_path / "home").exists()  # nothing was started or written


def test_serve_refuses_a_dags_path_that_is_a_file(tmp_path: Path) -> None:
    dag = tmp_path / "my_dag.py"
    dag.write_text("# a DAG file\n")
    result = _serve("--dags", str(dag), "--home", str(tmp_path / "home"))
    assert result.exit_code == 2
    line = _one_line_error(result)
    assert f"--dags: {dag} is a file, not a folder" in line and f"({tmp_path})" in line


def test_serve_without_dags_says_what_to_give(tmp_path: Path) -> None:
    result = _serve("--home", str(tmp_path / "home"))
    assert result.exit_code == 2
    assert "--dags: missing" in _one_line_error(result)


def test_serve_refuses_a_port_out_of_range(tmp_path: Path) -> None:
    result = _serve("--dags", str(tmp_path), "--port", "70000")
    assert result.exit_code == 2 and "--port" in result.output and "Traceback" not in result.output


def test_a_relative_dags_folder_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dags").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_dags_folder(Path("dags")) == tmp_path / "dags"


def test_the_stack_serves_that_folder_unpaused_with_one_carbon_source(tmp_path: Path) -> None:
    env = stack_env(tmp_path / "dags", tmp_path / "home", airflow_port=8181, mlflow_port=5151, live=False, base={})
    assert env["CARBONFLOW_DAGS_FOLDER"] == str(tmp_path / "dags")
    assert env["CARBONFLOW_DAGS_PAUSED_AT_CREATION"] == "False"
    assert env["CARBONFLOW_REPLAY"] == "1"  # read by the tasks and by the Carbon page alike
    assert (env["CARBONFLOW_AIRFLOW_PORT"], env["CARBONFLOW_MLFLOW_PORT"]) == ("8181", "5151")
    live = stack_env(tmp_path, tmp_path, airflow_port=1, mlflow_port=2, live=True, base={"CARBONFLOW_REPLAY": "1"})
    assert live["CARBONFLOW_REPLAY"] == "0"


def test_serve_sh_refuses_a_dags_folder_that_is_not_one(tmp_path: Path) -> None:
    """`make serve DAGS=...` goes through serve.sh: a wrong folder is refused before any process starts."""
    env = {**os.environ, "CARBONFLOW_HOME": str(tmp_path / "home"), "CARBONFLOW_DAGS_FOLDER": str(tmp_path / "nope"),
           "CARBONFLOW_AIRFLOW_PORT": "1", "CARBONFLOW_MLFLOW_PORT": "2"}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"CARBONFLOW_DAGS_FOLDER={tmp_path / 'nope'} is not a folder" in done.stderr
    assert not list((tmp_path / "home" / "run").glob("*.pid"))


def test_serve_stop_with_nothing_running_says_so(tmp_path: Path) -> None:
    result = _serve("--stop", "--home", str(tmp_path))
    assert result.exit_code == 0


_DRIVER = """
import os, signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a non-interactive shell (CI) starts it
import carbonflow.serve as serve
fake = Path(sys.argv[1])
serve.script = lambda name: fake / name
sys.exit(serve.serve(Path(sys.argv[2]), Path(sys.argv[3])))
"""

_FAKE_SERVE = """#!/usr/bin/env bash
mkdir -p "$CARBONFLOW_HOME/run"
setsid sleep 300 & echo $! > "$CARBONFLOW_HOME/run/stand-in.pid"
"""

_FAKE_STOP = """#!/usr/bin/env bash
for f in "$CARBONFLOW_HOME"/run/*.pid; do kill -TERM -- "-$(cat "$f")" 2>/dev/null; rm -f "$f"; done
"""


def test_ctrl_c_stops_the_stack_even_when_sigint_came_ignored(tmp_path: Path) -> None:
    """CI ran the Chromium test as a background job, where SIGINT is inherited ignored: Ctrl-C (SIGINT to the
    group) left `carbonflow serve` serving and the stack running. serve installs its own SIGINT handler."""
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "scripts"
    fake.mkdir()
    for name, text in (("serve.sh", _FAKE_SERVE), ("stop.sh", _FAKE_STOP)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    dags, home = tmp_path / "dags", tmp_path / "home"
    dags.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(fake), str(dags), str(home)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list((home / "run").glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # serve is in its wait loop
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "carbonflow serve: stopped" in out, out
    assert not list((home / "run").glob("*.pid"))
