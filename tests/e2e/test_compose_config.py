"""docker-compose.yml validates with Debian's docker-compose and wires the production stack as documented."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose binary not installed (apt-get install docker-compose)"
)


def _volumes(service: dict) -> set[tuple[str, str]]:
    """(source, target) of a service's volumes, in either the short or the long syntax."""
    out = set()
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v["source"], v["target"]
        out.add((source, target))
    return out


def _config(*args: str) -> dict:
    out = subprocess.run(
        [COMPOSE, "-f", str(REPO / "docker-compose.yml"), *args, "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_config_is_valid():
    for args in ([], ["--profile", "gpu"]):
        out = subprocess.run(
            [COMPOSE, "-f", str(REPO / "docker-compose.yml"), *args, "config", "-q"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr


def test_default_stack_services_and_wiring():
    cfg = _config()
    services = {k: v for k, v in cfg["services"].items() if not v.get("profiles")}  # the default stack
    assert {k for k, v in cfg["services"].items() if v.get("profiles") == ["gpu"]} == {"zeusd", "airflow-scheduler-gpu"}
    assert set(services) == {
        "postgres",
        "mlflow",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        env = svc["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert svc["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert "healthcheck" in svc
    mlflow = services["mlflow"]
    assert any(a.startswith("--backend-store-uri=postgresql") for a in mlflow["command"])
    assert "--artifacts-destination=/mlartifacts" in mlflow["command"]
    assert ("mlflow-artifacts", "/mlartifacts") in _volumes(mlflow)
    assert "mlflow-artifacts" in cfg["volumes"] and "postgres-data" in cfg["volumes"]


def test_gpu_profile_adds_zeusd_and_a_gpu_scheduler():
    services = _config("--profile", "gpu")["services"]
    zeusd, sched = services["zeusd"], services["airflow-scheduler-gpu"]
    assert zeusd["privileged"] is True
    assert "privileged" not in sched  # training containers are not privileged
    assert sched["environment"]["ZEUSD_SOCK_PATH"] == "/var/run/zeusd/zeusd.sock"
    devices = sched["deploy"]["resources"]["reservations"]["devices"][0]
    assert "gpu" in devices["capabilities"]
    shared = _volumes(zeusd) & _volumes(sched)
    assert shared == {("zeusd-socket", "/var/run/zeusd")}


def test_dockerfile_installs_carbonflow_and_files_exist():
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert "FROM apache/airflow:${AIRFLOW_VERSION}" in dockerfile
    assert "pip install" in dockerfile and '".[train]"' in dockerfile
    for path in (
        "deploy/docker/mlflow.Dockerfile",
        "deploy/docker/zeusd.Dockerfile",
        "deploy/docker/postgres-init.sh",
        "plugins/carbonflow_plugin.py",
    ):
        assert (REPO / path).is_file(), path
