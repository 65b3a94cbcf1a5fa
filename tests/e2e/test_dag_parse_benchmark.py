"""benchmarks/dag_parse.py catches what it promises to catch: heavy imports and network at DAG top level."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

GOOD = """
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("light", start_date=datetime(2024, 1, 1), schedule=None):
    EmptyOperator(task_id="t")
"""

BAD = """
import socket
from datetime import datetime
import pandas  # heavy at top level
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

try:
    socket.create_connection(("example.org", 80), timeout=1)  # network at top level
except OSError:
    pass

with DAG("heavy", start_date=datetime(2024, 1, 1), schedule=None):
    EmptyOperator(task_id="t")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dag_parse_benchmark_flags_heavy_imports_and_network(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "light.py").write_text(GOOD)
    (dags / "heavy.py").write_text(BAD)
    out = tmp_path / "dag_parse.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "dag_parse.py"),
            "--runs",
            "1",
            "--dags",
            str(dags),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    files = {f["file"]: f for f in result["files"]}
    assert files["heavy.py"]["heavy_imports"] == ["pandas"]
    assert [c["call"] for c in files["heavy.py"]["network_calls"]] == ["create_connection"]
    assert files["light.py"]["heavy_imports"] == [] and files["light.py"]["network_calls"] == []
    assert files["light.py"]["dag_ids"] == ["light"]
    assert not result["passed"] and any("heavy.py: heavy import" in f for f in result["failures"])
    assert result["max_parse_s"] == max(f["parse_s_median"] for f in result["files"])
