"""docker-compose.yml validates with Debian's docker-compose and wires the production stack as documented.

Its secrets come from scripts/compose-secrets.sh (run here into a temporary folder): none has a default.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
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


SECRET_NAMES = ("postgres_password", "mlflow_db_password", "mlflow_admin_password", "mlflow_flask_secret_key",
                "airflow_jwt_secret")  # fmt: skip


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory) -> Path:
    """The secrets scripts/compose-secrets.sh generates, in a folder of this test's own."""
    folder = tmp_path_factory.mktemp("compose") / "secrets"
    _generate_secrets(folder)
    return folder


def _generate_secrets(folder: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "CARBONFLOW_SECRETS_DIR": str(folder)}
    out = subprocess.run([str(REPO / "scripts" / "compose-secrets.sh")], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def _compose(*args: str, secrets: Path | None, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", **env}
    if secrets is not None:
        base["CARBONFLOW_SECRETS_DIR"] = str(secrets)
    return subprocess.run([COMPOSE, "-f", str(REPO / "docker-compose.yml"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=base)  # fmt: skip


def _config(*args: str, secrets: Path, **env: str) -> dict:
    out = _compose(*args, "config", secrets=secrets, **env)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def _published(service: dict) -> list[tuple[str, str]]:
    """(host address, host port) of each published port; an empty address means every interface."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", ""), str(port.get("published", ""))))
            continue
        parts = str(port).split("/")[0].split(":")
        out.append(("", parts[0]) if len(parts) == 2 else (":".join(parts[:-2]), parts[-2]))
    return out


def test_compose_config_is_valid(secrets_dir: Path):
    for args in ([], ["--profile", "gpu"]):
        out = _compose(*args, "config", "-q", secrets=secrets_dir)
        assert out.returncode == 0, out.stderr


def test_compose_without_generated_secrets_does_not_start(tmp_path: Path):
    out = _compose("config", "-q", secrets=tmp_path / "never-generated")
    assert out.returncode != 0
    assert "never-generated" in out.stderr and ".env" in out.stderr, out.stderr


def test_compose_publishes_no_port_on_every_interface(secrets_dir: Path):
    for args in ([], ["--profile", "gpu"]):
        services = _config(*args, secrets=secrets_dir)["services"]
        published = {name: _published(svc) for name, svc in services.items() if svc.get("ports")}
        assert set(published) == {"airflow-apiserver", "mlflow"}, published
        for name, ports in published.items():
            assert ports and all(host == "127.0.0.1" for host, _ in ports), (name, ports)
    # configurable, on purpose only
    services = _config(secrets=secrets_dir, CARBONFLOW_BIND_ADDRESS="10.1.2.3")["services"]
    assert _published(services["airflow-apiserver"]) == [("10.1.2.3", "8080")]


def test_compose_has_no_default_secret(secrets_dir: Path):
    raw = (REPO / "docker-compose.yml").read_text()
    assert "change-me" not in raw
    defaulted = re.findall(r"\$\{(\w+):?-", raw)
    secretish = [
        v for v in defaulted if re.search(r"PASSWORD|SECRET|TOKEN|KEY|CONN", v) and v != "CARBONFLOW_SECRETS_DIR"
    ]
    assert not secretish, f"secrets with a default in docker-compose.yml: {secretish}"
    assert not re.search(r"://\w+:[^@/$\s]+@", raw), "a URL with a literal password in docker-compose.yml"
    # every secret is a generated file only its owner reads, long and distinct
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    values = {}
    for path in secrets_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for name in SECRET_NAMES:
        values[name] = (secrets_dir / name).read_text().strip()
        assert len(values[name]) >= 32, name
    assert len(set(values.values())) == len(values)
    # a second run keeps them (PostgreSQL stored its passwords on the first start)
    _generate_secrets(secrets_dir)
    assert {n: (secrets_dir / n).read_text().strip() for n in SECRET_NAMES} == values
    # and the services get exactly these
    services = _config(secrets=secrets_dir)["services"]
    api, pg, mlflow = services["airflow-apiserver"]["environment"], services["postgres"]["environment"], \
        services["mlflow"]["environment"]  # fmt: skip
    assert api["AIRFLOW__API_AUTH__JWT_SECRET"] == values["airflow_jwt_secret"]
    assert f":{values['postgres_password']}@postgres:" in api["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert pg["POSTGRES_PASSWORD"] == values["postgres_password"]
    assert pg["MLFLOW_DB_PASSWORD"] == values["mlflow_db_password"]
    assert f":{values['mlflow_db_password']}@postgres:" in mlflow["MLFLOW_BACKEND_STORE_URI"]
    assert "AIRFLOW__API_AUTH__JWT_SECRET" not in mlflow and "MLFLOW_AUTH_ADMIN_PASSWORD" not in pg  # each its own


def test_mlflow_is_not_reachable_without_auth_or_from_outside(secrets_dir: Path):
    services = _config(secrets=secrets_dir)["services"]
    mlflow = services["mlflow"]
    assert _published(mlflow) == [("127.0.0.1", "5000")]
    env = mlflow["environment"]
    assert env["MLFLOW_AUTH"] == "basic"
    password = (secrets_dir / "mlflow_admin_password").read_text().strip()
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == password and env["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    assert mlflow["build"]["context"].endswith("/mlflow")
    dockerfile = (REPO / "mlflow" / "Dockerfile").read_text()
    assert '"mlflow[auth]==' in dockerfile  # the basic-auth app needs Flask-WTF
    assert "MLFLOW_AUTH_CONFIG_PATH=/etc/carbonflow-mlflow/basic_auth.ini" in dockerfile
    ini = (REPO / "mlflow" / "basic_auth.ini").read_text()
    assert re.search(r"^default_permission = NO_PERMISSIONS$", ini, re.M)
    assert "admin_password" not in ini.replace("MLFLOW_AUTH_ADMIN_PASSWORD", "")
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-triggerer"):
        client = services[name]["environment"]
        assert client["MLFLOW_TRACKING_USERNAME"] == env["MLFLOW_AUTH_ADMIN_USERNAME"]
        assert client["MLFLOW_TRACKING_PASSWORD"] == password


def test_default_stack_services_and_wiring(secrets_dir: Path):
    cfg = _config(secrets=secrets_dir)
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
    assert mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://mlflow:")
    assert mlflow["environment"]["MLFLOW_ARTIFACTS_DESTINATION"] == "/mlartifacts"
    assert ("mlflow-artifacts", "/mlartifacts") in _volumes(mlflow)
    assert ("mlflow-auth", "/mlauth") in _volumes(mlflow)
    assert "mlflow-artifacts" in cfg["volumes"] and "postgres-data" in cfg["volumes"]


def test_gpu_profile_adds_zeusd_and_a_gpu_scheduler(secrets_dir: Path):
    services = _config("--profile", "gpu", secrets=secrets_dir)["services"]
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
