"""`make test` on a fresh machine installs what it needs (finding: the README's command did not install
Chromium, only .ci/run did, so the stack test failed with "chromium not installed"); CI just calls it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "system-deps.sh"


def _fake_bin(tmp_path: Path, *, installed: set[str], uid: int, redis_up: bool = True) -> Path:
    """dpkg, id and apt-get as a fresh Debian machine without Chromium would answer (apt-get records calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    scripts = {
        "dpkg": f'[ "$1" = -s ] && case "$2" in {"|".join(installed) or "none"}) exit 0;; *) exit 1;; esac',
        "id": f'[ "$1" = -u ] && echo {uid}',
        "apt-get": f'echo "$@" >> {log}',
        "pg_isready": "exit 0",
        "redis-cli": "exit 0" if redis_up else "exit 1",
        "redis-server": f'echo "redis-server $@" >> {log}',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def _run(bin_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_make_test_installs_chromium_on_a_machine_without_it(tmp_path):
    bin_dir = _fake_bin(tmp_path, installed={"docker-compose"}, uid=0)
    done = _run(bin_dir)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "apt.log").read_text()
    assert "install" in calls and "chromium" in calls and "chromium-driver" in calls
    assert "docker-compose" not in calls.split("install", 1)[1]


def test_without_root_it_says_what_to_install_and_fails(tmp_path):
    done = _run(_fake_bin(tmp_path, installed=set(), uid=1000))
    assert done.returncode == 1
    assert "sudo apt-get install docker-compose chromium chromium-driver" in done.stderr


def test_nothing_is_installed_when_everything_is_there(tmp_path):
    done = _run(_fake_bin(tmp_path, installed={"docker-compose", "chromium", "chromium-driver"}, uid=0))
    assert done.returncode == 0 and not (tmp_path / "apt.log").exists()


def test_a_stopped_redis_is_started_for_the_celery_tests(tmp_path):
    installed = {"docker-compose", "chromium", "chromium-driver"}
    done = _run(_fake_bin(tmp_path, installed=installed, uid=0, redis_up=False))
    assert done.returncode == 0, done.stderr
    assert "redis-server --daemonize yes" in (tmp_path / "apt.log").read_text()


def test_make_test_runs_system_deps_and_the_docs_build_and_ci_just_calls_it():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: install system-deps docs\b", makefile, re.M)
    assert "mkdocs build --strict" in makefile
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"


def test_readme_fits_200_lines_and_its_example_validates(tmp_path):
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    tree = ast.parse(block)
    job_assign = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "JOB")
    job = ast.literal_eval(job_assign.value)
    from carbonflow.domain import JobSpec

    spec = JobSpec.model_validate(job)  # the finding: the README's example failed in the train task
    assert spec.samples_per_epoch and spec.epochs
    namespace: dict = {}
    exec(compile(tree, "README.md", "exec"), namespace)  # the DAG parses with real Airflow
    assert {t.task_id for t in namespace["dag"].tasks} == {"validate", "profile", "train", "deliver_runs"}
