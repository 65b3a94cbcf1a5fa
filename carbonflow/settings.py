"""carbonflow's settings: every ``CARBONFLOW_*`` variable, listed in :data:`VARIABLES` and read here.

This module is the one place carbonflow reads its own environment variables (the training side reads what the
wrapper hands it through :mod:`carbonflow.contract`): each setting has a function that returns it typed, with
its default, and refuses a bad value with a ValueError naming the variable, the value and what is allowed.
``tests/project/test_settings_module.py`` fails on a ``CARBONFLOW_*`` read anywhere else.

Where carbonflow keeps its state: one home per worker, one node directory per machine.

Two kinds of state, two places, one resolver each:

* :func:`home_dir` — a worker's own state (run folders, training logs, the spool, the embedded MLflow store):
  ``$CARBONFLOW_HOME``, else ``./.carbonflow``, absolute. Every part of carbonflow that names "the home"
  asks this function.
* :func:`node_state_dir` — what every wrapper on a machine must share, whatever its home or user: the GPU
  leases (``<node dir>/gpu-leases``) and the power-limit journals (``<node dir>/power-journal``).
  ``$CARBONFLOW_NODE_DIR``, else ``/var/lib/carbonflow`` when that directory exists (created by the
  deployment: the image, a volume, the admin), else ``/tmp/carbonflow-node`` (created mode 1777, sticky: every
  user may create files, nobody may remove or replace another's). The default never depends on the home, the
  user or whether the caller is root, so two wrappers of one machine always meet in one place.

:func:`node_dirs` resolves the lease and journal directories (``CARBONFLOW_GPU_LEASE_DIR`` /
``CARBONFLOW_POWER_JOURNAL_DIR`` override them) and refuses a split before any GPU is touched: a lease or
journal directory inside ``$CARBONFLOW_HOME`` (per worker, so per-home), or one that disagrees with what the
node registered on first use in ``<node dir>/node.json``. The error names both paths and the variable to fix.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from carbonflow import contract
from carbonflow.contract import (
    GPU_INDEX_MAP_ENV,
    GPU_LEASE_DIR_ENV,
    GPU_WAIT_ENV,
    NODE_DIR_ENV,
    POWER_JOURNAL_DIR_ENV,
    TRAINING_GID_ENV,
    TRAINING_UID_ENV,
)

HOME_ENV = "CARBONFLOW_HOME"
DEFAULT_HOME = ".carbonflow"
SYSTEM_NODE_DIR = Path("/var/lib/carbonflow")
SHARED_NODE_DIR = Path("/tmp/carbonflow-node")
NODE_REGISTRY = "node.json"
LEASES_SUBDIR = "gpu-leases"
JOURNALS_SUBDIR = "power-journal"


class NodeDirsSplit(ValueError):
    """The lease or journal directory would not be the one every wrapper of this machine uses."""


def home_dir() -> Path:
    """A worker's carbonflow home: ``$CARBONFLOW_HOME``, else ``./.carbonflow`` (absolute; not created)."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser().resolve()


def use_home(home: Path) -> None:
    """Make ``home`` this process's carbonflow home (what :func:`home_dir` answers from now on)."""
    os.environ[HOME_ENV] = str(home)


def node_state_dir() -> Path:
    """The machine-wide state directory (see the module docstring); not created here."""
    env = os.environ.get(NODE_DIR_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return SYSTEM_NODE_DIR if SYSTEM_NODE_DIR.is_dir() else SHARED_NODE_DIR


def _env_dir(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


@dataclass(frozen=True)
class NodeDirs:
    """The machine's lease and journal directories, as every wrapper on it must use them."""

    node: Path
    leases: Path
    journals: Path


def node_dirs(*, register: bool = True) -> NodeDirs:
    """The lease and journal directories, checked against a split (raises :class:`NodeDirsSplit`).

    ``register``: record them in ``<node dir>/node.json`` on first use (the wrapper does; a read-only look does
    not). A later caller with other directories is refused.
    """
    node = node_state_dir()
    dirs = NodeDirs(
        node,
        _env_dir(GPU_LEASE_DIR_ENV, node / LEASES_SUBDIR),
        _env_dir(POWER_JOURNAL_DIR_ENV, node / JOURNALS_SUBDIR),
    )
    _refuse_per_home(dirs)
    if register:
        _prepare_node_dir(node)
        _check_registry(dirs)
        for sub in (dirs.leases, dirs.journals):
            _prepare_subdir(node, sub)
    return dirs


def _refuse_per_home(dirs: NodeDirs) -> None:
    home = os.environ.get(HOME_ENV)
    if not home:
        return
    home_path = Path(home).expanduser().resolve()
    for name, path in ((NODE_DIR_ENV, dirs.node), (GPU_LEASE_DIR_ENV, dirs.leases),
                       (POWER_JOURNAL_DIR_ENV, dirs.journals)):  # fmt: skip
        if path == home_path or home_path in path.parents:
            raise NodeDirsSplit(
                f"{name} resolves to {path}, inside {HOME_ENV}={home_path}: every worker has its own home, so two "
                f"workers of one machine would lease the same GPU twice; set {name} to one machine-wide directory "
                f"outside every home (or unset it: the default is {node_state_dir.__name__}()'s "
                f"{SYSTEM_NODE_DIR} / {SHARED_NODE_DIR})"
            )


def _prepare_node_dir(node: Path) -> None:
    """Create the node directory; the shared default in /tmp is sticky and world-writable, and checked."""
    if node == SHARED_NODE_DIR and NODE_DIR_ENV not in os.environ:
        with contextlib.suppress(FileExistsError):
            node.mkdir(parents=True)
            node.chmod(0o1777)
        _check_shared_dir(node)
    else:
        node.mkdir(parents=True, exist_ok=True)
    if not os.access(node, os.W_OK | os.X_OK):
        raise NodeDirsSplit(
            f"the node directory {node} is not writable by uid {os.geteuid()}: every wrapper of this machine keeps "
            f"its GPU leases and power journals there; make it writable for carbonflow's users (a shared group) "
            f"or set {NODE_DIR_ENV} to one directory they all can write"
        )


def _prepare_subdir(node: Path, sub: Path) -> None:
    """A lease or journal directory inside the node directory is created with the node directory's mode (1777 in
    /tmp: every user may add a lock or journal file, none may remove another's; a shared group's 2775 ...)."""
    if sub.parent != node:
        sub.mkdir(parents=True, exist_ok=True)
        return
    try:
        sub.mkdir()
        sub.chmod(node.stat().st_mode & 0o7777)
    except FileExistsError:
        pass
    if node == SHARED_NODE_DIR and NODE_DIR_ENV not in os.environ:
        _check_shared_dir(sub)
    if not os.access(sub, os.W_OK | os.X_OK):
        raise NodeDirsSplit(
            f"{sub} is not writable by uid {os.geteuid()} (owner uid {sub.stat().st_uid}): every wrapper of this "
            f"machine must create its lock and journal files there; give it the node directory's mode "
            f"({oct(node.stat().st_mode & 0o7777)}) or set {NODE_DIR_ENV} to a directory carbonflow's users share"
        )


def _check_shared_dir(node: Path) -> None:
    """A world-writable directory in /tmp is safe only if it is really a directory, sticky, and root's or ours."""
    info = node.lstat()
    problem = None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory (a symlink?)"
    elif info.st_uid not in (0, os.geteuid()) and info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        problem = f"is writable by others without the sticky bit and owned by uid {info.st_uid}"
    if problem:
        raise NodeDirsSplit(
            f"the shared node directory {node} {problem}: another user could replace carbonflow's leases or "
            f"journals; remove it, or set {NODE_DIR_ENV} to a directory only carbonflow's users can write"
        )


def _registry_payload(dirs: NodeDirs) -> dict[str, str]:
    return {"gpu_lease_dir": str(dirs.leases), "power_journal_dir": str(dirs.journals)}


def _check_registry(dirs: NodeDirs) -> None:
    path = dirs.node / NODE_REGISTRY
    want = _registry_payload(dirs)
    if not path.exists() and _register(path, want):
        return
    _compare_registry(path, want)


def _register(path: Path, want: dict[str, str]) -> bool:
    """Write the registry whole, then link it into place: a racing wrapper sees no file or the full one, never a
    half-written one. False when another wrapper registered first."""
    fd, tmp = tempfile.mkstemp(prefix=".node-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(want, fh, indent=2)
        os.chmod(tmp, 0o644)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _compare_registry(path: Path, want: dict[str, str]) -> None:
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NodeDirsSplit(f"{path} (the machine's registered lease and journal dirs) is unreadable: {exc}") from exc
    names = {"gpu_lease_dir": GPU_LEASE_DIR_ENV, "power_journal_dir": POWER_JOURNAL_DIR_ENV}
    for key, env in names.items():
        if have.get(key) != want[key]:
            raise NodeDirsSplit(
                f"{env} resolves to {want[key]}, but this machine's wrappers use {have.get(key)} (registered in "
                f"{path}): two directories would let two runs take one GPU or hide a journal from its restore. "
                f"Set {env} to {have.get(key)} for every wrapper (or unset it), or, if the machine's layout was "
                f"changed on purpose and no run is active, remove {path}"
            )


START_GUARD_Z_ENV = "CARBONFLOW_START_GUARD_Z"
MAX_START_GUARD_Z = 10.0


def start_guard_z(default: float) -> float:
    """The safer-start guard's z for the start search (``$CARBONFLOW_START_GUARD_Z``; unset: ``default``); 0 turns
    the guard off. A ValueError names the variable, the value and what is allowed."""
    text = os.environ.get(START_GUARD_Z_ENV, "").strip()
    if not text:
        return default
    try:
        z = float(text)
    except ValueError:
        z = math.nan
    if not math.isfinite(z) or not 0 <= z <= MAX_START_GUARD_Z:
        raise ValueError(
            f"{START_GUARD_Z_ENV}={text!r} is not allowed; give a number from 0 (guard off) to {MAX_START_GUARD_Z:g}"
        )
    return z


# --- the other settings a worker reads ----------------------------------------------------------------------
TRUE_WORDS = frozenset({"1", "true", "yes"})
"""What turns a yes/no setting on (case-insensitive); anything else, or unset, is off."""

DEFAULT_GPU_WAIT_S = 300.0


def _text(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The raw value of carbonflow's setting ``name`` (None when unset), from ``environ`` (default: this
    process's environment). Only registered variables are read: a KeyError names an unknown one."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of carbonflow's settings; add it to carbonflow.settings.VARIABLES")
    return (os.environ if environ is None else environ).get(name)


def _flag(name: str) -> bool:
    return (_text(name) or "").lower() in TRUE_WORDS


def gpu_wait_s() -> float:
    """Seconds a wrapper waits for its GPUs' leases (``CARBONFLOW_GPU_WAIT_S``, default 300)."""
    return _seconds(GPU_WAIT_ENV, DEFAULT_GPU_WAIT_S)


def _seconds(name: str, default: float) -> float:
    """``$name`` as a finite number of seconds >= 0, else ``default`` when unset; refused naming name and value."""
    raw = _text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={raw!r} is not allowed; give a number of seconds >= 0")
    return value


def training_owner() -> tuple[int, int] | None:
    """(uid, gid) the training runs as, from ``$CARBONFLOW_TRAINING_UID`` / ``_GID``; None: the wrapper's own."""
    raw = _text(TRAINING_UID_ENV)
    if not raw:
        return None
    try:
        uid = int(raw)
        gid = int(_text(TRAINING_GID_ENV) or raw)
    except ValueError:
        raise ValueError(
            f"{TRAINING_UID_ENV}={raw!r} / {TRAINING_GID_ENV} must be numeric user and group ids"
        ) from None
    if os.geteuid() != 0:
        raise PermissionError(
            f"{TRAINING_UID_ENV}={uid} needs the wrapper to run as root (it drops to that user for the training); "
            f"it runs as uid {os.geteuid()}"
        )
    return uid, gid


def gpu_index_map_file() -> Path | None:
    """The node's GPU UUID → host index map file (``$CARBONFLOW_GPU_INDEX_MAP``); None when unset."""
    raw = _text(GPU_INDEX_MAP_ENV)
    return Path(raw) if raw else None


REPLAY_ENV = "CARBONFLOW_REPLAY"
REPLAY_MIN_WAIT_ENV = "CARBONFLOW_REPLAY_MIN_WAIT_S"
DEFAULT_REPLAY_MIN_WAIT_S = 15.0


def replay_from_env() -> bool:
    """``$CARBONFLOW_REPLAY`` is 1, true or yes: replay recorded carbon data instead of live APIs."""
    return _flag(REPLAY_ENV)


def replay_text() -> str | None:
    """``$CARBONFLOW_REPLAY`` as given (None when unset), for saying what decided the carbon source."""
    return _text(REPLAY_ENV)


def replay_min_wait_s(default: float = DEFAULT_REPLAY_MIN_WAIT_S) -> float:
    """The shortest wait of a replayed night, seconds (``$CARBONFLOW_REPLAY_MIN_WAIT_S``, else ``default``)."""
    return _seconds(REPLAY_MIN_WAIT_ENV, default)


def replay_min_wait_text(environ: Mapping[str, str], default: str) -> str:
    """``$CARBONFLOW_REPLAY_MIN_WAIT_S`` of ``environ`` as given, else ``default``: passed on to a child stack."""
    raw = _text(REPLAY_MIN_WAIT_ENV, environ)
    return default if raw is None else raw


OBSERVE_ONLY_ENV = "CARBONFLOW_OBSERVE_ONLY"


def observe_only_from_env() -> bool:
    """``$CARBONFLOW_OBSERVE_ONLY`` is 1, true or yes: every job of the deployment runs in shadow."""
    return _flag(OBSERVE_ONLY_ENV)


DEMO_NIGHT_ENV = "CARBONFLOW_DEMO_NIGHT"
"""The demo's night (1, 2, ...), set by ``carbonflow demo`` for the DAG it runs; unset: the first night's work."""


def demo_night() -> int:
    """The demo's night from :data:`DEMO_NIGHT_ENV` (1 when unset); an unusable value is refused by name."""
    raw = _text(DEMO_NIGHT_ENV) or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{DEMO_NIGHT_ENV}={raw!r} is not allowed; the demo's night is a whole number >= 1")
    return int(raw)


DAGS_FOLDER_ENV = "CARBONFLOW_DAGS_FOLDER"
JOBS_DIR_ENV = "CARBONFLOW_JOBS_DIR"
VENV_ENV = "CARBONFLOW_VENV"


def dags_folder_setting() -> Path | None:
    """``$CARBONFLOW_DAGS_FOLDER`` (None when unset or empty)."""
    raw = _text(DAGS_FOLDER_ENV)
    return Path(raw) if raw else None


def jobs_dir_setting() -> Path | None:
    """``$CARBONFLOW_JOBS_DIR``, the job registry's folder (None when unset or empty)."""
    raw = _text(JOBS_DIR_ENV)
    return Path(raw) if raw else None


def venv_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """``$CARBONFLOW_VENV`` of ``environ`` (default: this process's), the stack's virtual environment."""
    return _text(VENV_ENV, environ) or None


NIGHT_GPUS_ENV = "CARBONFLOW_NIGHT_GPUS"
MAX_PAIRS_PER_NIGHT_ENV = "CARBONFLOW_MAX_PAIRS_PER_NIGHT"


def _whole_number(name: str, default: int, least: int) -> int:
    raw = _text(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"{name}={raw!r} is not allowed; give a whole number >= {least}")
    return value


def night_gpus(default: int = 2) -> int:
    """GPUs of the registry's night (``$CARBONFLOW_NIGHT_GPUS``, else ``default``)."""
    return _whole_number(NIGHT_GPUS_ENV, default, 1)


def max_pairs_per_night(default: int = 5) -> int:
    """Most co-located pairs the registry's night plans (``$CARBONFLOW_MAX_PAIRS_PER_NIGHT``, else ``default``)."""
    return _whole_number(MAX_PAIRS_PER_NIGHT_ENV, default, 0)


UI_AUTH_ENV = "CARBONFLOW_UI_AUTH"
UI_AUTH_MODES = ("airflow", "none")
UI_REGION_ENV = "CARBONFLOW_UI_REGION"
DEFAULT_UI_REGION = "GB"
CARBON_MODE_ENV = "CARBONFLOW_CARBON_MODE"
CARBON_MODES = ("replay", "live")


def ui_auth_mode() -> str:
    """``$CARBONFLOW_UI_AUTH``: ``airflow`` (default; the Carbon page needs an Airflow login) or ``none``."""
    mode = (_text(UI_AUTH_ENV) or "airflow").lower()
    if mode not in UI_AUTH_MODES:
        raise ValueError(f"{UI_AUTH_ENV}={mode!r} is not allowed; use 'airflow' or 'none'")
    return mode


def ui_region_text() -> str:
    """``$CARBONFLOW_UI_REGION`` as given, else GB (the caller resolves it against the region table)."""
    raw = _text(UI_REGION_ENV)
    return DEFAULT_UI_REGION if raw is None else raw


def carbon_mode() -> str:
    """``$CARBONFLOW_CARBON_MODE`` as given ("" when unset); a value other than replay or live is refused."""
    mode = (_text(CARBON_MODE_ENV) or "").strip().lower()
    if mode not in ("", *CARBON_MODES):
        raise ValueError(f"{CARBON_MODE_ENV}={mode!r} is not allowed; use 'replay' or 'live'")
    return mode


AIRFLOW_PORT_ENV = "CARBONFLOW_AIRFLOW_PORT"
MLFLOW_PORT_ENV = "CARBONFLOW_MLFLOW_PORT"
MAX_PORT = 65535


def _port(name: str, default: int) -> int:
    raw = _text(name)
    if raw is None or not raw.strip():
        return default
    value = int(raw) if raw.strip().isdigit() else 0
    if not 1 <= value <= MAX_PORT:
        raise ValueError(f"{name}={raw!r} is not allowed; give a port number from 1 to {MAX_PORT}")
    return value


def airflow_port(default: int = 8080) -> int:
    """The Airflow port of ``carbonflow serve`` when ``--port`` is not given (``$CARBONFLOW_AIRFLOW_PORT``)."""
    return _port(AIRFLOW_PORT_ENV, default)


def mlflow_port_setting(default: int = 5000) -> int:
    """The MLflow port of ``carbonflow serve`` when ``--mlflow-port`` is not given (``$CARBONFLOW_MLFLOW_PORT``)."""
    return _port(MLFLOW_PORT_ENV, default)


K8S_SETTINGS_ENV = "CARBONFLOW_K8S_SETTINGS"
K8S_CONTEXT_ENV = "CARBONFLOW_K8S_CONTEXT"


def k8s_settings_json() -> str | None:
    """``$CARBONFLOW_K8S_SETTINGS``: the Kubernetes backend's settings as a JSON object (None when unset or empty)."""
    return _text(K8S_SETTINGS_ENV) or None


def k8s_context() -> str | None:
    """``$CARBONFLOW_K8S_CONTEXT``: the kubeconfig context the Kubernetes backend uses (None: the current one)."""
    return _text(K8S_CONTEXT_ENV)


RESULT_KEY_ENV = "CARBONFLOW_RESULT_KEY"


def take_result_key() -> str | None:
    """The wrapper's result key (``$CARBONFLOW_RESULT_KEY``), removed from its environment so no child (the
    training) inherits it."""
    return os.environ.pop(RESULT_KEY_ENV, None) or None


def provider_credential(name: str) -> str | None:
    """A carbon provider's credential from the variable its spec names (``CARBONFLOW_ELECTRICITYMAPS_TOKEN``, ...;
    a plugin provider may name its own); None when unset or empty."""
    return os.environ.get(name) or None


# --- the list ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variable:
    """One of carbonflow's environment variables."""

    name: str
    read_by: str
    """``settings`` (read through this module), ``training`` (set by the wrapper, read by the training through
    :mod:`carbonflow.contract`) or ``child`` (set by carbonflow for a process it starts: serve.sh, a pod)."""
    meaning: str


def _variables(read_by: str, entries: dict[str, str]) -> dict[str, Variable]:
    return {name: Variable(name, read_by, meaning) for name, meaning in entries.items()}


VARIABLES: dict[str, Variable] = {
    **_variables(
        "settings",
        {
            HOME_ENV: "a worker's own state folder (default ./.carbonflow)",
            NODE_DIR_ENV: "the machine-wide state folder (leases, journals)",
            GPU_LEASE_DIR_ENV: "the GPU lease folder (default <node dir>/gpu-leases)",
            POWER_JOURNAL_DIR_ENV: "the power-limit journal folder (default <node dir>/power-journal)",
            GPU_INDEX_MAP_ENV: "the node's GPU UUID to host index map file (zeusd's numbering)",
            GPU_WAIT_ENV: "seconds a wrapper waits for a GPU lease (default 300)",
            TRAINING_UID_ENV: "run the training as this user id (needs a root wrapper)",
            TRAINING_GID_ENV: "run the training as this group id (default the user id)",
            START_GUARD_Z_ENV: "the safer-start guard's z (default 1, 0 off, at most 10)",
            REPLAY_ENV: "replay the shipped carbon data instead of live APIs (1, true, yes)",
            REPLAY_MIN_WAIT_ENV: "the shortest wait of a replayed night, seconds (default 15)",
            OBSERVE_ONLY_ENV: "run every job in shadow (1, true, yes)",
            DEMO_NIGHT_ENV: "the demo's night, set by carbonflow demo (default 1)",
            DAGS_FOLDER_ENV: "the DAGs folder carbonflow demo / serve use",
            JOBS_DIR_ENV: "the job registry's folder (default <dags folder>/jobs)",
            VENV_ENV: "the virtual environment the stack runs in",
            NIGHT_GPUS_ENV: "GPUs of the registry's night (default 2)",
            MAX_PAIRS_PER_NIGHT_ENV: "most co-located pairs a registry night plans (default 5)",
            UI_AUTH_ENV: "the Carbon page's login: airflow (default) or none",
            UI_REGION_ENV: "the Carbon page's region (default GB)",
            CARBON_MODE_ENV: "the carbon source the page expects: replay or live (ignored, with a note, when the "
            "tasks use the other)",
            AIRFLOW_PORT_ENV: "the Airflow port of carbonflow serve",
            MLFLOW_PORT_ENV: "the MLflow port of carbonflow serve",
            K8S_SETTINGS_ENV: "the Kubernetes backend's settings (a JSON object)",
            K8S_CONTEXT_ENV: "the kubeconfig context of the Kubernetes backend",
            RESULT_KEY_ENV: "the run's result-signing key, in the wrapper's environment only",
            "CARBONFLOW_ELECTRICITYMAPS_TOKEN": "Electricity Maps API token (without an Airflow connection)",
            "CARBONFLOW_ELECTRICITYMAPS_URL": "Electricity Maps API URL",
            "CARBONFLOW_WATTTIME_USERNAME": "WattTime user (without an Airflow connection)",
            "CARBONFLOW_WATTTIME_PASSWORD": "WattTime password (without an Airflow connection)",
            "CARBONFLOW_WATTTIME_URL": "WattTime API URL",
            "CARBONFLOW_CARBON_AWARE_SDK_URL": "the Carbon Aware SDK's URL",
            "CARBONFLOW_NESO_URL": "the NESO carbon intensity API URL",
        },
    ),
    **_variables(
        "training",
        {
            contract.PROGRESS_FILE_ENV: "the file the training appends progress reports to",
            contract.OUTPUT_DIR_ENV: "where the training saves its model",
            contract.STOP_FILE_ENV: "the training stops when this file exists",
            contract.MAX_STEPS_ENV: "profile mode: a cap on steps",
            contract.SIM_SLOWDOWN_ENV: "simulated GPU: fixed slowdown factor",
            contract.SIM_SLOWDOWN_FILE_ENV: "simulated GPU: file holding the current slowdown factor",
            contract.JOB_NAME_ENV: "the job's name",
            contract.EPOCHS_ENV: "the job's epochs",
            contract.STEPS_ENV: "the job's steps",
            contract.BATCH_SIZE_ENV: "the job's batch size",
            contract.TARGET_METRIC_ENV: "a job trained to a target: its target_metric",
            contract.TARGET_VALUE_ENV: "a job trained to a target: its target_value",
            contract.LR_SCALE_ENV: "the learning-rate factor at tonight's batch size (the job's lr_scaling)",
            contract.MODE_ENV: "train or profile",
            contract.CONTAINERS_ENV: "the planned container count",
            contract.LR_ENV: "the built-in digits workload's learning rate",
            contract.THREADS_PER_CONTAINER_ENV: "the built-in digits workload's CPU threads per container",
        },
    ),
    **_variables(
        "child",
        {
            "CARBONFLOW_DAGS_PAUSED_AT_CREATION": "set by carbonflow serve for serve.sh",
            "CARBONFLOW_STOP_HINT": "set by carbonflow serve for serve.sh: how to stop the stack",
            "CARBONFLOW_JOB_FILE": "set for a Kubernetes wrapper: the job's JSON file",
            "CARBONFLOW_PLAN_FILE": "set for a Kubernetes wrapper: the plan's JSON file",
            "CARBONFLOW_RESULT_FILE": "set for a Kubernetes wrapper: where it writes its result",
            "CARBONFLOW_BACKEND": "set for a Kubernetes wrapper: the backend it runs under",
            "CARBONFLOW_POWER_AGENT": "set for a Kubernetes wrapper: how it sets power limits",
        },
    ),
}
"""Every ``CARBONFLOW_*`` variable carbonflow's code reads or sets (the docs name each; a test checks)."""
