"""mlflow/entrypoint.sh (the compose MLflow server) starts MLflow's basic-auth app and refuses to run open.

A stand-in ``mlflow`` on PATH records the command line the entrypoint would run; the real server behind basic
auth was checked by hand (401 without credentials, 200 with the admin's): the image installs ``mlflow[auth]``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "mlflow" / "entrypoint.sh"
FAKE_MLFLOW = '#!/bin/sh\necho "$@" >> "$CALLS"\n'


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mlflow").write_text(FAKE_MLFLOW)
    (bin_dir / "mlflow").chmod(0o755)
    calls = tmp_path / "calls"
    full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
            "MLFLOW_BACKEND_STORE_URI": "sqlite:///" + str(tmp_path / "m.db"),
            "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "art"), **env}  # fmt: skip
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=full, capture_output=True, text=True, timeout=60)
    return out, calls.read_text().splitlines() if calls.exists() else []


def test_the_compose_mlflow_server_starts_behind_basic_auth(tmp_path: Path) -> None:
    admin = {"MLFLOW_AUTH_ADMIN_USERNAME": "admin", "MLFLOW_AUTH_ADMIN_PASSWORD": "p" * 43,
             "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 43}  # fmt: skip
    out, calls = _run(tmp_path, **admin)
    assert out.returncode == 0, out.stderr
    server = calls[-1].split()
    assert server[0] == "server" and "--app-name basic-auth" in calls[-1], calls
    assert "p" * 43 not in calls[-1]  # the password stays in the environment, off the command line


def test_the_mlflow_server_refuses_to_start_open_or_without_an_admin_password(tmp_path: Path) -> None:
    out, calls = _run(tmp_path, MLFLOW_AUTH_ADMIN_USERNAME="admin", MLFLOW_FLASK_SERVER_SECRET_KEY="k" * 43)
    assert out.returncode != 0 and "MLFLOW_AUTH_ADMIN_PASSWORD" in out.stderr and not calls
    out, calls = _run(tmp_path, MLFLOW_AUTH="none")  # open, on every interface of the container
    assert out.returncode == 2 and "MLFLOW_AUTH=none is allowed only with MLFLOW_HOST=127.0.0.1" in out.stderr
    assert not calls
    out, calls = _run(tmp_path, MLFLOW_AUTH="sometimes")
    assert out.returncode == 2 and "MLFLOW_AUTH='sometimes' is not allowed; use basic or none" in out.stderr
    out, calls = _run(tmp_path, MLFLOW_AUTH="none", MLFLOW_HOST="127.0.0.1")  # local only: allowed
    assert out.returncode == 0 and "--app-name" not in calls[-1] and "--host 127.0.0.1" in calls[-1]
