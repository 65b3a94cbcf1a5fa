"""`make serve` (scripts/serve.sh) starts the real local stack on 127.0.0.1 only, with one admin whose generated
password is in a file only its owner reads, says who is admin and where that file is, and never prints it."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _outside_address() -> str | None:
    """This machine's address on its network (not loopback), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") else address


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("serve")
    env = {**os.environ, "CARBONFLOW_HOME": str(home), "CARBONFLOW_AIRFLOW_PORT": str(_free_port()),
           "CARBONFLOW_MLFLOW_PORT": str(_free_port()), "CARBONFLOW_VENV": str(Path(sys.executable).parent.parent),
           "CARBONFLOW_REPLAY": "1", "CARBONFLOW_CARBON_MODE": "replay"}  # fmt: skip
    env.pop("CARBONFLOW_SERVE_AUTH", None)
    out = subprocess.run([str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert out.returncode == 0, f"serve.sh failed:\n{out.stdout}\n{out.stderr}"
        yield home, env, out.stdout
    finally:
        stop = subprocess.run([str(REPO / "scripts" / "stop.sh")], env=env, capture_output=True, text=True, timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr


def test_serve_says_who_is_admin_and_keeps_the_password_in_a_0600_file(served) -> None:
    home, env, stdout = served
    passwords = home / "airflow" / "simple_auth_manager_passwords.json"
    password = json.loads(passwords.read_text())["admin"]
    assert f"Airflow admin   user admin, password in {passwords} (mode 0600)" in stdout
    assert password not in stdout
    for secret in (passwords, home / "airflow" / "jwt_secret", home / "stack.env"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert not any(password in log.read_text(errors="replace") for log in (home / "logs").rglob("*.log"))
    base = f"http://127.0.0.1:{env['CARBONFLOW_AIRFLOW_PORT']}"
    assert requests.get(f"{base}/auth/token", timeout=30).status_code in (401, 403)  # no token without a login
    assert requests.get(f"{base}/api/v2/dags", timeout=30).status_code == 401
    wrong = requests.post(f"{base}/auth/token", json={"username": "admin", "password": "admin"}, timeout=30)
    assert wrong.status_code == 401
    token = requests.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
    token.raise_for_status()
    headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
    assert requests.get(f"{base}/api/v2/dags", headers=headers, timeout=30).status_code == 200


def test_serve_listens_on_127_0_0_1_only(served) -> None:
    _, env, _ = served
    address = _outside_address()
    for port in (int(env["CARBONFLOW_AIRFLOW_PORT"]), int(env["CARBONFLOW_MLFLOW_PORT"])):
        assert _reachable("127.0.0.1", port)
        if address is not None:
            assert not _reachable(address, port), f"port {port} answers on {address}"
