"""Real MLflow tracking servers for the tracking tests: one on SQLite, one on the machine's PostgreSQL.

Each is a real ``mlflow server`` process on a free loopback port, started once per session, with
artifacts proxied to a temporary folder. Tests may stop it (an outage) and start it again on the same
port with the same stores.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracking_server_process import MlflowServer, free_port

PG_DSN = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def _postgres_database() -> tuple[str, str] | None:
    try:
        import psycopg2

        conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG_DSN)
    except Exception:
        return None
    name = f"carbonflow_test_{uuid.uuid4().hex[:10]}"
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return name, f"postgresql+psycopg2://{PG_DSN['user']}@{PG_DSN['host']}:{PG_DSN['port']}/{name}"


def _drop_postgres_database(name: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG_DSN)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    conn.close()


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def mlflow_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server on SQLite or on a fresh PostgreSQL database (dropped afterwards)."""
    workdir = tmp_path_factory.mktemp(f"mlflow-{request.param}")
    database = None
    if request.param == "sqlite":
        backend = f"sqlite:///{workdir / 'mlflow.db'}"
    else:
        made = _postgres_database()
        if made is None:
            pytest.skip("PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) is not reachable")
        database, backend = made
    server = MlflowServer(backend, workdir, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if database is not None:
            _drop_postgres_database(database)


@pytest.fixture
def server(mlflow_server: MlflowServer) -> MlflowServer:
    """The session's server, guaranteed running at the start of the test."""
    if not mlflow_server.running:
        mlflow_server.start()
    return mlflow_server


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty embedded store with MLflow's schema migrations already applied (copied per test: faster)."""
    from carbonflow.tracking.store import client_for

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    client_for(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_sqlite: Path) -> Path:
    """An isolated carbonflow home (spool, embedded store) with no tracking URI from the environment."""
    path = tmp_path / "cfhome"
    path.mkdir()
    shutil.copyfile(migrated_sqlite, path / "mlflow.db")
    monkeypatch.setenv("CARBONFLOW_HOME", str(path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


@pytest.fixture
def job_name() -> str:
    """A job name unique to the test, so tests can share one server."""
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A power trace CSV and a model state_dict file, as the wrapper and workload write them."""
    import torch

    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,device,power_w\n0.0,GPU-0aa1,151.2\n1.0,GPU-0aa1,183.9\n2.0,GPU-0aa1,190.4\n")
    model = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(4, 2).state_dict(), model)
    return {"trace": trace, "model": model}
