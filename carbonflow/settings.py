"""Where carbonflow keeps its state: one home per worker, one node directory per machine.

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
from dataclasses import dataclass
from pathlib import Path

from carbonflow.contract import GPU_LEASE_DIR_ENV, NODE_DIR_ENV, POWER_JOURNAL_DIR_ENV

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
