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


# --- execution runs and measures: accounting is below it, the planner and tracking above it -------------------

EXECUTION_MAY_NOT_IMPORT = ("tracking", "planning")


def _absolute_imports(path: Path, package: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions too), relative imports made absolute."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    here = parts if parts[-1] == "__init__" else parts[:-1]  # the package a relative import starts from
    here = [p for p in here if p != "__init__"]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - (node.level - 1)] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def forbidden_imports(package: Path, layer: str, forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    """``package/layer``'s files that import one of ``package``'s ``forbidden`` sub-packages, with what they import."""
    banned = tuple(f"{package.name}.{name}" for name in forbidden)
    found: dict[str, set[str]] = {}
    for path in sorted((package / layer).rglob("*.py")):
        hits = {
            n for n in _absolute_imports(path, package) if n in banned or n.startswith(tuple(f"{b}." for b in banned))
        }
        if hits:
            found[str(path.relative_to(package))] = hits
    return found


def test_execution_imports_neither_tracking_nor_planning() -> None:
    """Issue #22: results.py reached the planner (lazily) for the saving and shared.py tracking for metric names;
    both now come from carbonflow.accounting, below execution."""
    assert (PACKAGE / "execution").is_dir()
    assert forbidden_imports(PACKAGE, "execution", EXECUTION_MAY_NOT_IMPORT) == {}


def test_the_execution_rule_sees_a_planted_violation(tmp_path: Path) -> None:
    """Every way of writing the import is caught: at module level, lazily in a function, relative, plain."""
    package = tmp_path / "carbonflow"
    files = {
        "execution/__init__.py": "",
        "execution/clean.py": "from carbonflow.accounting.run import to_run_result\nfrom carbonflow import units\n",
        "execution/eager.py": "from carbonflow.tracking.schema import M_SAMPLES\n",
        "execution/lazy.py": "def f():\n    from carbonflow.planning.saving import saving_g\n",
        "execution/relative.py": "from ..planning import optimizer\n",
        "execution/plain.py": "import carbonflow.tracking\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert forbidden_imports(package, "execution", EXECUTION_MAY_NOT_IMPORT) == {
        "execution/eager.py": {"carbonflow.tracking.schema.M_SAMPLES"},
        "execution/lazy.py": {"carbonflow.planning.saving.saving_g"},
        "execution/relative.py": {"carbonflow.planning.optimizer"},
        "execution/plain.py": {"carbonflow.tracking"},
    }
