"""Which GPUs a wrapper trains on, and a training child that cannot outlive its wrapper.

``lease_run_gpus`` leases the run's GPUs by UUID (:mod:`carbonflow.energy.lease`) — free ones, never
"the first N" — and ``pinned_env`` pins the training to exactly those (``CUDA_VISIBLE_DEVICES`` by UUID,
so no enumeration order can point it elsewhere). ``start_child`` starts the training in its own process
group under a guard that takes the whole group down when the wrapper dies by any signal, even SIGKILL, and
keeps the GPUs leased until it has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from carbonflow.contract import GPU_WAIT_ENV, TRAINING_GID_ENV, TRAINING_UID_ENV, ZEUSD_SOCK_ENV
from carbonflow.energy.errors import GpuLeaseUnavailable
from carbonflow.energy.lease import GpuLeaseSet, acquire_gpus
from carbonflow.execution.errors import GpuUnavailable

DEFAULT_GPU_WAIT_S = 300.0


def gpu_wait_s() -> float:
    """Seconds a wrapper waits for its GPUs' leases (``CARBONFLOW_GPU_WAIT_S``, default 300)."""
    raw = os.environ.get(GPU_WAIT_ENV)
    if raw is None:
        return DEFAULT_GPU_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{GPU_WAIT_ENV}={raw!r} is not allowed; give a number of seconds >= 0")
    return value


def _durable(gpu: Any) -> bool:
    """A GPU whose state outlives this process (NVML); a simulated GPU lives and dies with the wrapper."""
    return getattr(gpu, "label", "") != "simulated"


def lease_run_gpus(all_gpus: Sequence[Any], count: int) -> tuple[list[Any], GpuLeaseSet | None]:
    """``count`` free GPUs of ``all_gpus`` with their leases (simulated GPUs: the first ``count``, no lease)."""
    if not all_gpus or not _durable(all_gpus[0]):
        return list(all_gpus[:count]) if len(all_gpus) > count else list(all_gpus), None
    try:
        lease = acquire_gpus([g.id for g in all_gpus], min(count, len(all_gpus)), wait_s=gpu_wait_s())
    except GpuLeaseUnavailable as exc:
        raise GpuUnavailable(str(exc)) from exc
    return [g for g in all_gpus if g.id in lease.uuids], lease


def pinned_env(env: dict[str, str], gpus: Sequence[Any]) -> dict[str, str]:
    """``env`` with the training pinned to ``gpus`` by UUID (NVML GPUs only)."""
    durable = [g.id for g in gpus if _durable(g)]
    if durable:
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(durable)}
    return env


def training_owner() -> tuple[int, int] | None:
    """(uid, gid) the training runs as, from ``$CARBONFLOW_TRAINING_UID`` / ``_GID``; None: the wrapper's own."""
    raw = os.environ.get(TRAINING_UID_ENV)
    if not raw:
        return None
    try:
        uid = int(raw)
        gid = int(os.environ.get(TRAINING_GID_ENV) or raw)
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


def drop_privileges_for_training(env: dict[str, str], writable: list[Path]) -> dict[str, str]:
    """When the training runs as another user: give it ``writable`` (its run folder, output) and tell the guard;
    the training's environment loses the zeusd socket path (the socket's mode keeps it out anyway)."""
    owner = training_owner()
    if owner is None:
        return env
    for folder in writable:
        os.chown(folder, *owner)
    env = {k: v for k, v in env.items() if k != ZEUSD_SOCK_ENV}
    return {**env, "CARBONFLOW_GUARD_UID": str(owner[0]), "CARBONFLOW_GUARD_GID": str(owner[1])}


def start_child(
    command: list[str], env: dict[str, str], lease: GpuLeaseSet | None, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    """Start the training under its guard (:mod:`carbonflow.execution.guard`) as a new process group.

    The guard dies with the wrapper and takes the whole group with it; it and the training hold the GPUs'
    leases meanwhile. The training's exit status is the guard's (a signal death N as ``128 + N``).
    """
    fds = tuple(lease.fds) if lease is not None else ()
    guard_env = {**env, "CARBONFLOW_GUARD_FDS": ",".join(str(fd) for fd in fds)}
    return subprocess.Popen(
        [sys.executable, "-m", "carbonflow.execution.guard", "--", *command],
        env=guard_env,
        start_new_session=True,
        pass_fds=fds,
        cwd=cwd,
    )
