"""A real ``mlflow server`` process that tests can stop (an outage) and restart on the same port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

MLFLOW_BIN = Path(sys.executable).with_name("mlflow")
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` process that tests can stop and restart on the same port."""

    def __init__(self, backend_uri: str, workdir: Path, port: int) -> None:
        self.backend_uri = backend_uri
        self.workdir = workdir
        self.port = port
        self.uri = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None, "already running"
        log = open(self.workdir / f"server-{self.starts}.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [
                str(MLFLOW_BIN),
                "server",
                "--backend-store-uri",
                self.backend_uri,
                "--artifacts-destination",
                str(self.workdir / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
            # MLflow's GenAI job runner (7 huey consumers) is not used by carbonflow; keep the test server light
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}; see {log.name}")
            try:
                if requests.get(self.uri + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server on {self.uri} did not answer /health within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.proc = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the port must really be closed: an outage, not a slow server
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
