"""The design's import rules, checked on the source: only operators, web and plugins know Airflow, and
nothing below the operators imports them (DESIGN.md, "Who may import whom")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "carbonflow"
AIRFLOW_AWARE = ("operators", "web")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules() -> list[tuple[str, set[str]]]:
    return [(str(p.relative_to(PACKAGE)), _imports(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def test_only_operators_and_web_import_airflow() -> None:
    outside = {
        rel for rel, names in _modules()
        if rel.split("/")[0] not in AIRFLOW_AWARE and any(n == "airflow" or n.startswith("airflow.") for n in names)
    }  # fmt: skip
    assert outside == set(), f"Airflow imported outside operators/ and web/: {outside}"


def test_nothing_below_the_operators_imports_them() -> None:
    offenders = {
        rel for rel, names in _modules()
        if rel.split("/")[0] not in AIRFLOW_AWARE and any(n.startswith("carbonflow.operators") for n in names)
    }  # fmt: skip
    assert offenders == set(), f"imports carbonflow.operators from below: {offenders}"


def test_the_run_session_is_airflow_free() -> None:
    session = [(rel, names) for rel, names in _modules() if rel.startswith("session/")]
    assert session, "carbonflow/session/ is missing"
    for rel, names in session:
        assert not any(n.startswith(("airflow", "carbonflow.operators", "carbonflow.web")) for n in names), rel
