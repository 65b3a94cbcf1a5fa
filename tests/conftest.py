"""Session-wide test setup: one embedded Airflow DB and one carbonflow home per pytest process.

The environment is set here, before anything imports Airflow, so every test sees the same
isolated AIRFLOW_HOME (SQLite metadata DB, migrated once on first use), carbonflow home and
embedded MLflow store, and replayed carbon data (no live API is ever called).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="carbonflow-tests-"))
_AIRFLOW_HOME = _SESSION_DIR / "airflow"
_AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)

os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "CARBONFLOW_HOME": str(_SESSION_DIR / "home"),
        "CARBONFLOW_REPLAY": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SESSION_DIR / 'home' / 'mlflow.db'}",
        "CARBONFLOW_POWER_JOURNAL_DIR": str(_SESSION_DIR / "power-journal"),
        "CARBONFLOW_NODE_DIR": str(_SESSION_DIR / "node"),  # never the real /var/lib/carbonflow or /tmp one
    }
)
(_SESSION_DIR / "home").mkdir(exist_ok=True)
for _var in ("COLUMNS", "LINES"):  # output is checked as piped (100 columns); xdist's workers inherit COLUMNS=80
    os.environ.pop(_var, None)


@pytest.fixture(autouse=True)
def _one_node_dir_per_test(tmp_path_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each test is its own machine: its own node directory, so node.json registers that test's lease and
    journal directories (carbonflow.settings refuses a machine whose wrappers disagree on them)."""
    monkeypatch.setenv("CARBONFLOW_NODE_DIR", str(tmp_path_factory.mktemp("node")))


_FAKE_NVML_DIR = REPO / "tests" / "energy" / "fake_pynvml"


@pytest.fixture(autouse=True)
def _no_fake_driver_left_behind() -> None:
    """Each test starts on this machine's real NVML (none here): a fake ``pynvml`` a previous test left in
    ``sys.modules`` or on ``sys.path`` (outside ``monkeypatch``) would make a later test in the same process — an
    xdist worker runs other files than a plain run — find the fake node's GPUs."""
    import sys

    while str(_FAKE_NVML_DIR) in sys.path:
        sys.path.remove(str(_FAKE_NVML_DIR))
    loaded = sys.modules.get("pynvml")
    if loaded is not None and str(_FAKE_NVML_DIR) in str(getattr(loaded, "__file__", "")):
        del sys.modules["pynvml"]
        from carbonflow.energy import nvml

        nvml._initialised = False


@pytest.fixture(scope="session")
def session_dir() -> Path:
    """The per-process scratch folder holding AIRFLOW_HOME and CARBONFLOW_HOME."""
    return _SESSION_DIR


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The embedded Airflow metadata DB, migrated once for the whole session; returns AIRFLOW_HOME."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    subprocess.run(
        [str(airflow), "pools", "set", "carbonflow_gpu", "4", "GPU slots for carbonflow training"],
        env=dict(os.environ), capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return _AIRFLOW_HOME


@pytest.fixture(scope="session")
def dag_bag(airflow_db: Path):
    """The repository's DAGs, parsed once (fails loudly on import errors)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag
