"""Issue #22: one settings module for every ``CARBONFLOW_*`` variable, one home resolver, one joule/kWh constant.

* A ``CARBONFLOW_*`` variable is read (``os.environ.get``, ``os.getenv``, ``os.environ[...]``, ``in os.environ``,
  ``.pop``/``.setdefault``, a copy of ``os.environ``, a loop over it, a helper that reads the name it is given)
  or changed in this process's environment only in ``carbonflow/settings.py`` and ``carbonflow/contract.py``
  (the training side). The name may be a literal, a constant of the module (``HOME_ENV = "CARBONFLOW_HOME"``),
  a constant imported from another carbonflow module, or built (``PREFIX + "HOME"``, an f-string). Building
  a child's environment (a dict passed to ``subprocess``) is not a read.
* The home has one resolver (:func:`carbonflow.settings.home_dir`) with one default, the documented one.
* ``J_PER_KWH`` is defined, read, and 3.6e6 written, only in ``carbonflow/units.py``
  (:func:`tests.project.test_structure.j_per_kwh_outside_units`, checked again here on planted sources).

Each checker is run on a small planted source, so a test fails when its checker goes blind.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from carbonflow import settings
from tests.project.test_structure import j_per_kwh_outside_units, module_files

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "carbonflow"
PREFIX = "CARBONFLOW_"
ALLOWED_READERS = {"carbonflow/settings.py", "carbonflow/contract.py"}
ENVIRON_READS = {"get", "pop", "setdefault", "__getitem__", "__contains__", "copy", "items", "keys", "values"}
ENVIRON_WRITES = {"update", "__setitem__", "__delitem__", "clear", "popitem"}

Strings = frozenset[str]


# --- module constants ----------------------------------------------------------------------------------------


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
        return [node.target]
    return []


def _value(node: ast.AST) -> ast.expr | None:
    return getattr(node, "value", None) if _targets(node) else None


def string_constants(tree: ast.Module, known: dict[str, dict[str, Strings]] | None = None) -> dict[str, Strings]:
    """Name → the strings it may hold, for every name of ``tree`` bound to strings (at any depth: a local
    ``name = "CARBONFLOW_X"`` counts), to a container of strings (dict values, tuple items), by a ``for`` over
    such a container, or imported from a carbonflow module of ``known``."""
    names: dict[str, Strings] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in (known or {}):
            for alias in node.names:
                if alias.name in known[node.module]:  # type: ignore[index]
                    names[alias.asname or alias.name] = known[node.module][alias.name]  # type: ignore[index]
    for _ in range(3):  # constants defined from constants
        for node in ast.walk(tree):
            pairs: list[tuple[ast.expr, ast.expr | None]] = [(t, _value(node)) for t in _targets(node)]
            if isinstance(node, ast.For | ast.comprehension):
                pairs.append((node.target, node.iter))
            for target, value in pairs:
                if isinstance(target, ast.Name) and value is not None:
                    found = _strings(value, names, {}) | _container_strings(value, names)
                    if found:
                        names[target.id] = names.get(target.id, frozenset()) | found
    return names


def _container_strings(node: ast.expr, names: dict[str, Strings]) -> Strings:
    if isinstance(node, ast.Dict):
        return frozenset().union(*(_strings(v, names, {}) | _container_strings(v, names) for v in node.values))
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return frozenset().union(*(_strings(v, names, {}) | _container_strings(v, names) for v in node.elts))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {"values", "items"}:
        return _strings(node.func.value, names, {})
    return frozenset()


def _strings(node: ast.expr, names: dict[str, Strings], modules: dict[str, dict[str, Strings]]) -> Strings:
    """The strings ``node`` may evaluate to (a built one: its known leading part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return frozenset({node.value})
    if isinstance(node, ast.Name):
        return names.get(node.id, frozenset())
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
        return modules[node.value.id].get(node.attr, frozenset())
    if isinstance(node, ast.JoinedStr):
        lead = "".join(v.value for v in _leading_constants(node.values))
        return frozenset({lead}) if lead else frozenset()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _strings(node.left, names, modules), _strings(node.right, names, modules)
        return frozenset(a + b for a in left for b in right) if right else left
    if isinstance(node, ast.IfExp):
        return _strings(node.body, names, modules) | _strings(node.orelse, names, modules)
    if isinstance(node, ast.Subscript):
        return _strings(node.value, names, modules)  # NAMES["token"]: any of the container's strings
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {"upper", "strip"}:
        return _strings(node.func.value, names, modules)
    return frozenset()


def _leading_constants(values: list[ast.expr]) -> Iterator[ast.Constant]:
    for value in values:
        if not isinstance(value, ast.Constant):
            return
        yield value


@functools.cache
def package_constants(package: Path = PACKAGE) -> dict[str, dict[str, Strings]]:
    """Module → its names bound to strings, for every module of ``package`` (resolves ``from ... import``)."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in module_files(package).items()}
    known: dict[str, dict[str, Strings]] = {}
    for _ in range(3):  # a constant imported from a module that imported it
        known = {name: string_constants(tree, known) for name, tree in trees.items()}
    return known


# --- environment reads -----------------------------------------------------------------------------------------


class _Aliases:
    """What names ``os``, ``os.environ``, ``os.getenv`` and copies of ``os.environ`` go by in one module."""

    def __init__(self, tree: ast.Module, known: dict[str, dict[str, Strings]]) -> None:
        self.os = {"os"}
        self.environ: set[str] = set()
        self.getenv: set[str] = set()
        self.copies: set[str] = set()
        self.modules: dict[str, dict[str, Strings]] = {}
        for node in ast.walk(tree):
            self._import(node, known)
        for _ in range(2):
            for node in ast.walk(tree):
                value = _value(node)
                for target in _targets(node):
                    if isinstance(target, ast.Name) and value is not None:
                        self._alias(target.id, value)

    def _import(self, node: ast.AST, known: dict[str, dict[str, Strings]]) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "os":
                    self.os.add(alias.asname or "os")
                elif alias.name in known:
                    self.modules[alias.asname or alias.name] = known[alias.name]
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                {"environ": self.environ, "getenv": self.getenv}.get(alias.name, set()).add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    self.modules[alias.asname or alias.name] = known[full]

    def _alias(self, name: str, value: ast.expr) -> None:
        if self.is_environ(value):
            self.environ.add(name)
        elif isinstance(value, ast.Attribute) and value.attr == "getenv" and self._is_os(value.value):
            self.getenv.add(name)
        elif self.is_copy(value):
            self.copies.add(name)

    def _is_os(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id in self.os

    def is_environ(self, node: ast.expr) -> bool:
        """``os.environ`` itself (reads and writes count)."""
        if isinstance(node, ast.Attribute) and node.attr == "environ":
            return self._is_os(node.value)
        return isinstance(node, ast.Name) and node.id in self.environ

    def is_copy(self, node: ast.expr) -> bool:
        """A copy of ``os.environ`` (``dict(os.environ)``, ``.copy()``, ``{**os.environ}``, ``os.environ if ...``):
        its reads count, its writes build a child's environment."""
        if isinstance(node, ast.Name):
            return node.id in self.copies
        if isinstance(node, ast.IfExp):
            return self.reads_from(node.body) or self.reads_from(node.orelse)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in {"dict", "Mapping"} and node.args:
                return self.reads_from(node.args[0])
            return (
                isinstance(node.func, ast.Attribute) and node.func.attr == "copy" and self.reads_from(node.func.value)
            )
        if isinstance(node, ast.Dict):
            return any(k is None and self.reads_from(v) for k, v in zip(node.keys, node.values, strict=True))
        return False

    def reads_from(self, node: ast.expr) -> bool:
        return self.is_environ(node) or self.is_copy(node)

    def is_getenv(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr in {"getenv", "putenv", "unsetenv"}:
            return self._is_os(node.value)
        return isinstance(node, ast.Name) and node.id in self.getenv


def _function_params(tree: ast.Module) -> dict[ast.AST, list[str]]:
    """Every function node → its parameter names (positional order)."""
    out: dict[ast.AST, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            out[node] = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return out


class _Reads:
    """Every environment read or change in one module, with its key expression."""

    def __init__(self, tree: ast.Module, aliases: _Aliases) -> None:
        self.aliases = aliases
        self.found: list[tuple[ast.AST, ast.expr | None, str, ast.AST | None]] = []
        """(node, key, what, enclosing function)"""
        self._visit(tree, None)

    def _visit(self, node: ast.AST, function: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            function = node
        self._check(node, function)
        for child in ast.iter_child_nodes(node):
            self._visit(child, function)

    def _add(self, node: ast.AST, key: ast.expr | None, what: str, function: ast.AST | None) -> None:
        self.found.append((node, key, what, function))

    def _check(self, node: ast.AST, function: ast.AST | None) -> None:
        al = self.aliases
        if isinstance(node, ast.Call) and al.is_getenv(node.func):
            self._add(node, node.args[0] if node.args else None, ast.unparse(node.func), function)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and al.reads_from(node.func.value):
            method = node.func.attr
            if method in ENVIRON_READS and method not in {"copy", "items", "keys", "values"}:
                self._add(node, node.args[0] if node.args else None, f"environ.{method}", function)
            elif method in ENVIRON_WRITES and al.is_environ(node.func.value):
                for key in _written_keys(node):
                    self._add(node, key, f"environ.{method}", function)
        elif isinstance(node, ast.Subscript) and al.reads_from(node.value):
            if isinstance(node.ctx, ast.Load) or al.is_environ(node.value):
                self._add(node, node.slice, "environ[...]", function)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if any(al.reads_from(c) for c in node.comparators):
                self._add(node, node.left, "in environ", function)
        elif isinstance(node, ast.comprehension | ast.For) and self._iterates_environ(node.iter):
            self._add(node, None, "a loop over environ", function)

    def _iterates_environ(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {
            "items", "keys", "values"
        }:  # fmt: skip
            node = node.func.value
        return self.aliases.reads_from(node)


def _written_keys(call: ast.Call) -> list[ast.expr | None]:
    keys: list[ast.expr | None] = [kw.arg and ast.Constant(kw.arg) for kw in call.keywords]
    for arg in call.args:
        keys.extend(arg.keys if isinstance(arg, ast.Dict) else [None])
    return keys


def _mentions_carbonflow(node: ast.AST, names: dict[str, Strings], modules: dict[str, dict[str, Strings]]) -> bool:
    return any(
        any(s.startswith(PREFIX) for s in _strings(sub, names, modules))
        for sub in ast.walk(node)
        if isinstance(sub, ast.expr)
    )


def carbonflow_env_reads(source: str, known: dict[str, dict[str, Strings]] | None = None) -> list[str]:
    """Where ``source`` reads (or changes) a ``CARBONFLOW_*`` variable of its process's environment, as
    ``line: what``. ``known``: the package's constants (:func:`package_constants`), for imported names."""
    known = known or {}
    tree = ast.parse(source)
    names = string_constants(tree, known)
    aliases = _Aliases(tree, known)
    reads = _Reads(tree, aliases).found
    params = _function_params(tree)
    found: list[tuple[int, str]] = []
    helpers: dict[str, set[int | str]] = {}
    for node, key, what, function in reads:
        if what == "a loop over environ":
            parent = _enclosing_loop(tree, node)
            if _mentions_carbonflow(parent, names, aliases.modules):
                found.append((node.target.lineno, f"{what} picking CARBONFLOW_* names"))  # type: ignore[attr-defined]
            continue
        hits = sorted(s for s in _strings(key, names, aliases.modules) if s.startswith(PREFIX)) if key else []
        if hits:
            found.append((node.lineno, f"{what} of {hits[0]}"))  # type: ignore[attr-defined]
        elif isinstance(key, ast.Name) and function is not None and key.id in params[function]:
            name = getattr(function, "name", None)
            if name:
                helpers.setdefault(name, set()).update({params[function].index(key.id), key.id})
    found.extend(_helper_calls(tree, helpers, names, aliases.modules))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def _enclosing_loop(tree: ast.Module, target: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) and target in node.generators:
            return node
    return target


def _helper_calls(
    tree: ast.Module,
    helpers: dict[str, set[int | str]],
    names: dict[str, Strings],
    modules: dict[str, dict[str, Strings]],
) -> list[tuple[int, str]]:
    """Calls of a function of this module that reads the variable named by one of its parameters, with a
    ``CARBONFLOW_*`` name in that parameter."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        wanted = helpers.get(func or "")
        if not wanted:
            continue
        offset = 1 if isinstance(node.func, ast.Attribute) and any(p == "self" for p in wanted) else 0
        given = [(i + offset, a) for i, a in enumerate(node.args)] + [(kw.arg, kw.value) for kw in node.keywords]
        for where, arg in given:
            if where in wanted and any(s.startswith(PREFIX) for s in _strings(arg, names, modules)):
                found.append((node.lineno, f"{func}() reads the environment for a CARBONFLOW_* name"))
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_carbonflow_variables_are_read_only_in_settings_and_contract() -> None:
    """Finding (issue #22): ``CARBONFLOW_*`` variables were read in some twenty modules, each with its own default
    and its own way of refusing a bad value (or none)."""
    known = package_constants()
    offenders = {
        _relative(path): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if _relative(path) not in ALLOWED_READERS
        and (hits := carbonflow_env_reads(path.read_text(encoding="utf-8"), known))
    }
    assert offenders == {}, f"read these through carbonflow.settings (or contract.py, training side): {offenders}"


def test_the_settings_module_itself_is_seen_reading() -> None:
    """The scan is not blind on the real files: the two allowed readers are found reading."""
    known = package_constants()
    for allowed in sorted(ALLOWED_READERS):
        assert carbonflow_env_reads((REPO / allowed).read_text(encoding="utf-8"), known), allowed


PLANTED = {
    "literal get": 'import os\nx = os.environ.get("CARBONFLOW_HOME")\n',
    "getenv": 'import os\nx = os.getenv("CARBONFLOW_HOME", "")\n',
    "subscript": 'import os\nx = os.environ["CARBONFLOW_HOME"]\n',
    "module constant": 'import os\nHOME_ENV = "CARBONFLOW_HOME"\ndef f():\n    return os.environ.get(HOME_ENV)\n',
    "annotated constant": 'import os\nHOME_ENV: str = "CARBONFLOW_HOME"\nx = os.getenv(HOME_ENV)\n',
    "local constant": 'import os\ndef f():\n    name = "CARBONFLOW_X"\n    return os.environ.get(name)\n',
    "imported constant": "import os\nfrom carbonflow.contract import NODE_DIR_ENV\nx = os.environ.get(NODE_DIR_ENV)\n",
    "module attribute": "import os\nfrom carbonflow import contract\nx = os.environ[contract.NODE_DIR_ENV]\n",
    "from os import": 'from os import environ, getenv\nx = environ.get("CARBONFLOW_A")\ny = getenv("CARBONFLOW_B")\n',
    "os alias": 'import os as o\nx = o.environ.get("CARBONFLOW_A")\n',
    "environ alias": 'import os\nE = os.environ\nx = E.get("CARBONFLOW_A")\n',
    "copy": 'import os\ndef f():\n    env = dict(os.environ)\n    return env.get("CARBONFLOW_A")\n',
    "copy by if": "import os\ndef f(b=None):\n    env = os.environ if b is None else b\n"
    '    return env["CARBONFLOW_A"]\n',
    "membership": 'import os\nx = "CARBONFLOW_A" not in os.environ\n',
    "pop": 'import os\nx = os.environ.pop("CARBONFLOW_RESULT_KEY", None)\n',
    "setdefault": 'import os\nos.environ.setdefault("CARBONFLOW_HOME", "/x")\n',
    "assignment": 'import os\nos.environ["CARBONFLOW_HOME"] = "/x"\n',
    "update": 'import os\nos.environ.update({"CARBONFLOW_HOME": "/x"})\n',
    "built name": 'import os\nP = "CARBONFLOW_"\nx = os.environ.get(P + "HOME")\n'
    'y = os.environ.get(f"CARBONFLOW_{x}")\n',
    "container": 'import os\nNAMES = {"a": "CARBONFLOW_A"}\nx = os.environ.get(NAMES["a"])\n',
    "loop": 'import os\nfor n in ("CARBONFLOW_A", "CARBONFLOW_B"):\n    print(os.environ.get(n))\n',
    "prefix scan": 'import os\nx = {k: v for k, v in os.environ.items() if k.startswith("CARBONFLOW_")}\n',
    "helper": 'import os\ndef _env(name, default=""):\n    return os.environ.get(name, default)\n'
    'x = _env("CARBONFLOW_A")\n',
    "helper keyword": 'import os\ndef _env(name):\n    return os.getenv(name)\nx = _env(name="CARBONFLOW_A")\n',
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_env_read_finder_sees_a_planted_read(case: str) -> None:
    assert carbonflow_env_reads(PLANTED[case], package_constants()), case


NOT_READS = {
    "child env": 'import os\ndef f():\n    env = dict(os.environ)\n    env["CARBONFLOW_HOME"] = "/x"\n    return env\n',
    "child env update": 'import os\nenv = {**os.environ}\nenv.update({"CARBONFLOW_REPLAY": "1"})\n',
    "another variable": 'import os\nx = os.environ.get("MLFLOW_TRACKING_URI")\nHOME_ENV = "CARBONFLOW_HOME"\n',
    "a plain dict": 'd = {}\nx = d.get("CARBONFLOW_HOME")\n',
    "through settings": "from carbonflow.settings import HOME_ENV, home_dir\nx = home_dir()\n",
    "allow-list filter": "import os\nfrom carbonflow.contract import training_base_env\n"
    "x = training_base_env(os.environ)\n",
}


@pytest.mark.parametrize("case", sorted(NOT_READS))
def test_the_env_read_finder_leaves_what_is_not_a_read(case: str) -> None:
    assert carbonflow_env_reads(NOT_READS[case], package_constants()) == [], case


# --- the list of variables, and the home ---------------------------------------------------------------------


def test_the_settings_list_holds_every_carbonflow_name_the_code_uses() -> None:
    """settings.VARIABLES is the list the docs test reads: every ``CARBONFLOW_*`` name carbonflow or a shipped
    DAG writes (read or set) is on it, and nothing else is."""
    import re

    not_variables = {"CARBONFLOW_RESULT"}  # the wrapper's log-line prefix (execution/signing.py), not a variable
    names = set()
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "dags").rglob("*.py")]:
        names |= set(re.findall(r"[\"'](CARBONFLOW_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8")))
    assert len(names) > 20, "the scan found too few names to mean anything"
    assert sorted(names - not_variables - set(settings.VARIABLES)) == []
    assert sorted(set(settings.VARIABLES) - names) == [], "listed in settings.VARIABLES but used nowhere"
    assert {v.read_by for v in settings.VARIABLES.values()} == {"settings", "training", "child"}
    assert all(name == v.name and name.startswith(PREFIX) for name, v in settings.VARIABLES.items())


def test_settings_read_only_their_own_variables() -> None:
    with pytest.raises(KeyError, match="CARBONFLOW_NOT_A_SETTING is not one of carbonflow's settings"):
        settings._text("CARBONFLOW_NOT_A_SETTING")


def test_one_home_resolver_with_the_documented_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: three functions resolved the home, with two defaults (``./.carbonflow``, ``~/.carbonflow``).
    One is left, ``settings.home_dir``; docs/cli.md documents its default."""
    monkeypatch.delenv(settings.HOME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert settings.home_dir() == tmp_path / ".carbonflow"
    assert "unset, it is\n`./.carbonflow`" in (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    settings.use_home(tmp_path / "elsewhere")
    assert settings.home_dir() == tmp_path / "elsewhere"
    defaults = [
        _relative(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if any(
            isinstance(node, ast.Constant) and node.value in {".carbonflow", "~/.carbonflow"}
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert defaults == ["carbonflow/settings.py"], defaults


@pytest.mark.parametrize(
    ("function", "variable", "value", "allowed"),
    [
        (settings.gpu_wait_s, "CARBONFLOW_GPU_WAIT_S", "-1", "a number of seconds >= 0"),
        (settings.gpu_wait_s, "CARBONFLOW_GPU_WAIT_S", "nan", "a number of seconds >= 0"),
        (settings.replay_min_wait_s, "CARBONFLOW_REPLAY_MIN_WAIT_S", "soon", "a number of seconds >= 0"),
        (settings.demo_night, "CARBONFLOW_DEMO_NIGHT", "0", "a whole number >= 1"),
        (settings.night_gpus, "CARBONFLOW_NIGHT_GPUS", "two", "a whole number >= 1"),
        (settings.max_pairs_per_night, "CARBONFLOW_MAX_PAIRS_PER_NIGHT", "-1", "a whole number >= 0"),
        (settings.ui_auth_mode, "CARBONFLOW_UI_AUTH", "open", "use 'airflow' or 'none'"),
        (settings.carbon_mode, "CARBONFLOW_CARBON_MODE", "maybe", "use 'replay' or 'live'"),
        (settings.airflow_port, "CARBONFLOW_AIRFLOW_PORT", "80800", "a port number from 1 to 65535"),
        (settings.mlflow_port_setting, "CARBONFLOW_MLFLOW_PORT", "x", "a port number from 1 to 65535"),
    ],
)
def test_a_bad_setting_is_refused_naming_variable_value_and_what_is_allowed(
    function, variable: str, value: str, allowed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as err:
        function()
    assert f"{variable}={value!r}" in str(err.value) and allowed in str(err.value)


def test_settings_defaults_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in settings.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert settings.gpu_wait_s() == 300.0
    assert settings.replay_min_wait_s() == 15.0
    assert (settings.demo_night(), settings.night_gpus(), settings.max_pairs_per_night()) == (1, 2, 5)
    assert (settings.ui_auth_mode(), settings.ui_region_text(), settings.carbon_mode()) == ("airflow", "GB", "")
    assert (settings.airflow_port(), settings.mlflow_port_setting()) == (8080, 5000)
    assert not settings.replay_from_env() and not settings.observe_only_from_env()
    monkeypatch.setenv("CARBONFLOW_REPLAY", "Yes")
    assert settings.replay_from_env()


# --- J_PER_KWH ----------------------------------------------------------------------------------------------------


def test_j_per_kwh_is_defined_only_in_units() -> None:
    units = PACKAGE / "units.py"
    offenders = {
        _relative(path): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != units and (hits := j_per_kwh_outside_units(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"use carbonflow.units' kwh_from_j / emissions_g_from / g_per_j instead: {offenders}"


@pytest.mark.parametrize(
    "source",
    ["J_PER_KWH = 3.6e6\n", "J_PER_KWH: float = 3_600_000\n", "kwh = j / 3600000.0\n", "kwh = j / (3600 * 1000)\n"],
)
def test_the_j_per_kwh_finder_sees_a_planted_definition(source: str) -> None:
    assert j_per_kwh_outside_units(source)
    assert not j_per_kwh_outside_units("from carbonflow.units import kwh_from_j\nkwh = kwh_from_j(j)\n")
    # the name itself is units.py's alone: importing or reading it elsewhere is found too
    assert j_per_kwh_outside_units("from carbonflow.units import J_PER_KWH\nkwh = j / J_PER_KWH\n")
