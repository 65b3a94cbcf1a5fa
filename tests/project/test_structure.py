"""Structure checks of issue #22 ("Finish the moves"), read from the source with ``ast``.

* No import circles in ``carbonflow/``. The graph holds every module-level import (class bodies and
  ``try``/``if`` blocks run at import time too) and the ``if TYPE_CHECKING:`` ones (the guard hides a circle, it
  does not remove it). Imports inside functions cannot make an import-time circle; circles through them are
  reported as a warning, for information. An edge goes to the module named (``from carbonflow.x import y``
  goes to ``carbonflow.x.y`` when that is a module, else to ``carbonflow.x``), not to the parent packages
  Python also runs.
* ``J_PER_KWH`` is defined, used (imported, read), and 3.6e6 (in any spelling) written, only in
  ``carbonflow/units.py``: elsewhere energy turns into kWh and emissions through its helpers
  (``kwh_from_j``, ``emissions_g_from``, ``g_per_j``, ``j_from_kwh``).

``python -m tests.project.test_structure`` prints the graph's circles, lazy ones included.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from carbonflow.execution.backend import BACKEND_CLASSES, BACKENDS, backend_class
from carbonflow.units import J_PER_KWH

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "carbonflow"
UNITS = PACKAGE / "units.py"

KNOWN_CIRCLES: dict[frozenset[str], str] = {}
"""Circles left for a larger refactor, each with its reason; empty: none is left."""

# --- the import graph ---------------------------------------------------------------------------------------


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``package`` (a package is its ``__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement in ``body``, with where it runs: ``module``, ``type_checking`` or ``function``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _imports(node.body, "function")
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(node.body, "type_checking")
            yield from _imports(node.orelse, where)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _imports(inner, where)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ``known`` that an import statement in ``module`` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def import_graph(package: Path) -> dict[str, dict[str, set[str]]]:
    """For each kind of import (``module``, ``type_checking``, ``function``): module → modules it imports."""
    files = module_files(package)
    kinds = ("module", "type_checking", "function")
    graph: dict[str, dict[str, set[str]]] = {k: {m: set() for m in files} for k in kinds}
    for module, path in files.items():
        for node, where in _imports(ast.parse(path.read_text(encoding="utf-8")).body, "module"):
            graph[where][module].update(_targets(node, module, path.name == "__init__.py", set(files)))
    return graph


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _merged(*parts: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: set().union(*(p[m] for p in parts)) for m in parts[0]}


def _describe(component: frozenset[str], edges: dict[str, set[str]]) -> str:
    arrows = [f"{a} -> {b}" for a in sorted(component) for b in sorted(edges[a] & component)]
    return "{" + ", ".join(arrows) + "}"


def test_no_import_circles_anywhere_in_carbonflow() -> None:
    graph = import_graph(PACKAGE)
    import_time = _merged(graph["module"], graph["type_checking"])
    found = circles(import_time)
    unexpected = [c for c in found if c not in KNOWN_CIRCLES]
    assert not unexpected, "import circles: " + "; ".join(_describe(c, import_time) for c in unexpected)
    stale = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not stale, f"listed as known circles but gone (remove them from KNOWN_CIRCLES): {stale}"
    everything = _merged(graph["module"], graph["type_checking"], graph["function"])
    lazy = [c for c in circles(everything) if not any(c <= k for k in found)]
    if lazy:  # information: not an import-time circle, but still two modules that need each other
        text = "; ".join(_describe(c, everything) for c in lazy)
        warnings.warn(f"circles through imports inside functions: {text}", stacklevel=1)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_the_circle_finder_sees_the_circles_the_issue_found(tmp_path: Path) -> None:
    """The two shapes issue #22 named: an implementation importing its contract while the contract imports it
    (here at module level, through a relative import), and a circle hidden behind ``if TYPE_CHECKING:``."""
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/execution/__init__.py": "",
        "pkg/execution/backend.py": "from .local import LocalBackend\n",
        "pkg/execution/local.py": "from pkg.execution.backend import Backend\n",
        "pkg/planning/optimizer.py": "from pkg.planning import batch_size\n",
        "pkg/planning/batch_size.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from pkg.planning.optimizer import Candidate\n",
        "pkg/planning/lazy.py": "def f():\n    from pkg.planning import lazy_back\n",
        "pkg/planning/lazy_back.py": "import pkg.planning.lazy\n",
    })  # fmt: skip
    graph = import_graph(package)
    assert sorted(sorted(c) for c in circles(_merged(graph["module"], graph["type_checking"]))) == [
        ["pkg.execution.backend", "pkg.execution.local"],
        ["pkg.planning.batch_size", "pkg.planning.optimizer"],
    ]
    assert graph["function"]["pkg.planning.lazy"] == {"pkg.planning.lazy_back"}
    assert frozenset({"pkg.planning.lazy", "pkg.planning.lazy_back"}) in circles(_merged(*graph.values()))


def test_backend_contract_no_longer_imports_its_own_implementations() -> None:
    """Finding: ``execution/backend.py`` imported ``local`` and ``kubernetes`` (inside ``make_backend``), which
    import it: a circle. The registry names them as ``module:Class`` and imports one only when it is asked for."""
    graph = import_graph(PACKAGE)
    implementations = {path.split(":")[0] for path in BACKEND_CLASSES.values()}
    imported = set().union(*(graph[kind]["carbonflow.execution.backend"] for kind in graph))
    assert imported & implementations == set()
    for name in BACKENDS:
        cls = backend_class(name)
        assert f"{cls.__module__}:{cls.__name__}" == BACKEND_CLASSES[name]
    with pytest.raises(ValueError, match=r"backend='slurm' is not allowed; use one of local, kubernetes"):
        backend_class("slurm")


# --- J_PER_KWH ----------------------------------------------------------------------------------------------

_J_PER_KWH_TEXT = re.compile(r"(?<![\w.])(3\.6e\+?0*6|3_600_000(\.0*)?|3600000(\.0*)?|36e5)(?![\w.])", re.IGNORECASE)


def _number(node: ast.expr) -> float | None:
    """The value of a numeric literal, or of a product of two (``3600 * 1000``); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _number(node.left), _number(node.right)
        return None if left is None or right is None else left * right
    return None


def _assigned_names(node: ast.AST) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {t.id for t in targets if isinstance(t, ast.Name)}


def j_per_kwh_outside_units(source: str) -> list[str]:
    """Where ``source`` defines, imports or reads ``J_PER_KWH``, or writes 3.6e6 itself, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if "J_PER_KWH" in _assigned_names(node):
            found.append(f"{node.lineno}: defines J_PER_KWH")
        elif isinstance(node, ast.ImportFrom) and any(a.name == "J_PER_KWH" for a in node.names):
            found.append(f"{node.lineno}: imports J_PER_KWH")
        elif (isinstance(node, ast.Name) and node.id == "J_PER_KWH" and isinstance(node.ctx, ast.Load)) or (
            isinstance(node, ast.Attribute) and node.attr == "J_PER_KWH"
        ):
            found.append(f"{node.lineno}: uses J_PER_KWH")
        elif isinstance(node, ast.expr) and _number(node) == J_PER_KWH:
            found.append(f"{node.lineno}: the number {ast.unparse(node)}")
    for lineno, line in enumerate(source.splitlines(), 1):
        for match in _J_PER_KWH_TEXT.finditer(line):
            found.append(f"{lineno}: the text {match.group(0)}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_j_per_kwh_defined_three_times_now_only_in_units() -> None:
    """Finding: ``J_PER_KWH`` was defined 3 times and 3.6e6 written out 4 more times; units.py is its one home,
    and the only module that reads it (the others call its helpers)."""
    offenders = {
        str(path.relative_to(REPO)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != UNITS and (hits := j_per_kwh_outside_units(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"use carbonflow.units' kwh_from_j / emissions_g_from / g_per_j instead: {offenders}"
    assert j_per_kwh_outside_units(UNITS.read_text(encoding="utf-8")), "carbonflow/units.py no longer defines it"


def test_the_j_per_kwh_finder_sees_every_spelling() -> None:
    source = (
        "J_PER_KWH = 3.6e6\nA: float = 3_600_000\nb = x / 3600000.0\nc = 3600 * 1000\n"
        "d = '3.6E+06 J'\n# 36e5\nfrom carbonflow.units import J_PER_KWH\ne = y / J_PER_KWH * 3600\n"
        "import carbonflow.units as u\nf = u.J_PER_KWH\ng = kwh_from_j(y)\n"
    )
    lines = [int(hit.split(":")[0]) for hit in j_per_kwh_outside_units(source)]
    assert lines == [1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 10]  # the import (7) and both reads (8, 10) too


def _report() -> None:
    graph = import_graph(PACKAGE)
    for kind, parts in (("import-time", ("module", "type_checking")), ("with lazy imports", tuple(graph))):
        edges = _merged(*(graph[p] for p in parts))
        found = circles(edges)
        print(f"{kind}: {len(found)} circle(s)")
        for component in found:
            print("  ", _describe(component, edges))


if __name__ == "__main__":
    _report()


def test_the_objective_grammar_is_written_once() -> None:
    """models.OBJECTIVE_PATTERN is the grammar; the DAGs' Params and the MLflow schema derive from it (issue #22:
    it was written three times, in models.py, the nightly DAG and tracking/schema.py)."""
    from carbonflow.domain import OBJECTIVE_PARAM_PATTERN, parse_objective

    written = [
        str(path.relative_to(REPO))
        for path in [*PACKAGE.rglob("*.py"), *(REPO / "dags").rglob("*.py")]
        if re.search(r"eds:[(\[]", path.read_text(encoding="utf-8"))
    ]
    assert written == ["carbonflow/domain.py"], written
    for objective in ("carbon", "energy", "time", "edp", "eds:2", "zeus:0.5"):
        assert re.match(OBJECTIVE_PARAM_PATTERN, objective)
        parse_objective(objective)
    assert not re.match(OBJECTIVE_PARAM_PATTERN, "greenest")
