"""Which GPUs a wrapper trains on, and a training child that cannot outlive its wrapper.

``lease_run_gpus`` leases the run's GPUs by UUID (:mod:`carbonflow.energy.lease`) — free ones, never
"the first N" — and ``pinned_env`` pins the training to exactly those through their vendor's variable
(:mod:`carbonflow.energy.vendors`; NVIDIA: ``CUDA_VISIBLE_DEVICES`` by UUID, so no enumeration order can point
it elsewhere). ``start_child`` starts the training in its own process
group under a guard (:mod:`carbonflow.execution.process_guard`) that takes every process the training started down
when the training ends or the wrapper dies by any signal, even SIGKILL, and keeps the GPUs leased until it has.
The guard starts clean (an isolated interpreter, an empty environment, ``/`` as its working directory); the
training's environment reaches only the training, through a pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from carbonflow.contract import ZEUSD_SOCK_ENV
from carbonflow.energy.errors import GpuLeaseUnavailable
from carbonflow.energy.lease import GpuLeaseSet, acquire_gpus
from carbonflow.energy.vendors import pin as pin_gpus
from carbonflow.energy.vendors import vendor_of
from carbonflow.execution.errors import GpuUnavailable
from carbonflow.settings import gpu_wait_s, training_owner

GUARD_PATH = Path(__file__).with_name("process_guard.py")
"""Run by path: the guard imports nothing of carbonflow (nor of its dependencies)."""
GUARD_FLAGS = ("-I", "-S")
"""Isolated (no ``PYTHON*`` variable, no user site, no working directory or script folder on ``sys.path``) and
without ``site`` (no ``.pth`` file of the environment runs): the guard needs the standard library only."""


def _durable(gpu: Any) -> bool:
    """A GPU whose state outlives this process (NVML); a simulated GPU lives and dies with the wrapper."""
    return vendor_of(gpu).durable


def lease_run_gpus(
    all_gpus: Sequence[Any], count: int, group: str | None = None
) -> tuple[list[Any], GpuLeaseSet | None]:
    """``count`` free GPUs of ``all_gpus`` with their leases (simulated GPUs: the first ``count``, no lease);
    ``group``: shared with the other member of this planned pair only (a pair run as two pods)."""
    if not all_gpus or not _durable(all_gpus[0]):
        return list(all_gpus[:count]) if len(all_gpus) > count else list(all_gpus), None
    try:
        lease = acquire_gpus([g.id for g in all_gpus], min(count, len(all_gpus)), wait_s=gpu_wait_s(), group=group)
    except GpuLeaseUnavailable as exc:
        raise GpuUnavailable(str(exc)) from exc
    return [g for g in all_gpus if g.id in lease.uuids], lease


def pinned_env(env: dict[str, str], gpus: Sequence[Any]) -> dict[str, str]:
    """``env`` with the training pinned to ``gpus``: each GPU's vendor sets its own visible-devices variable
    (NVIDIA: ``CUDA_VISIBLE_DEVICES`` by UUID; simulated GPUs: nothing)."""
    return pin_gpus(env, gpus) if gpus else env


def drop_privileges_for_training(env: dict[str, str], writable: list[Path]) -> dict[str, str]:
    """When the training runs as another user: give it ``writable`` (its run folder, output); the training's
    environment loses the zeusd socket path (the socket's mode keeps it out anyway). :func:`start_child` then
    starts it as that user."""
    owner = training_owner()
    if owner is None:
        return env
    for folder in writable:
        os.chown(folder, *owner)
    return {k: v for k, v in env.items() if k != ZEUSD_SOCK_ENV}


class GuardedChild(subprocess.Popen[bytes]):
    """The guard process of one training; :meth:`left_behind` once it has ended."""

    report_fd: int = -1

    def left_behind(self) -> int:
        """How many processes the training left running that the guard killed (0: none, or it could not say).

        Call once the guard has ended (it closes its end of the report pipe then)."""
        if self.report_fd < 0:
            return 0
        chunks = []
        try:
            while chunk := os.read(self.report_fd, 4096):
                chunks.append(chunk)
        finally:
            os.close(self.report_fd)
            self.report_fd = -1
        try:
            return int(json.loads(b"".join(chunks) or b"{}").get("left_behind", 0))
        except (ValueError, AttributeError):
            return 0


def start_child(
    command: list[str],
    env: dict[str, str],
    lease: GpuLeaseSet | None,
    cwd: str | None = None,
    *,
    capture_output: bool = False,
) -> GuardedChild:
    """Start the training under its guard (:mod:`carbonflow.execution.process_guard`) as a new process group.

    The guard dies with the wrapper and takes every process of the training with it; it and the training hold
    the GPUs' leases meanwhile. Only the training gets ``env`` and ``cwd`` (default: the wrapper's; sent on a
    pipe); the guard runs with an empty environment in ``/``. The training's exit status is the guard's (a
    signal death N as ``128 + N``). With ``capture_output`` the training's stdout and stderr are pipes
    (``child.stdout``, ``child.stderr``; the guard prints nothing) for the wrapper to read (``progress_pattern``).
    """
    fds = tuple(lease.fds) if lease is not None else ()
    owner = training_owner()
    setup = {"env": env, "cwd": cwd or os.getcwd(), "fds": list(fds), "uid": owner[0] if owner else None,
             "gid": owner[1] if owner else None}  # fmt: skip
    setup_r, setup_w = os.pipe()
    report_r, report_w = os.pipe()
    try:
        child = GuardedChild(
            [sys.executable, *GUARD_FLAGS, str(GUARD_PATH), str(setup_r), str(report_w), "--", *command],
            env={}, cwd="/", start_new_session=True, pass_fds=(*fds, setup_r, report_w),
            stdout=subprocess.PIPE if capture_output else None, stderr=subprocess.PIPE if capture_output else None,
        )  # fmt: skip
    except BaseException:
        os.close(setup_w)
        os.close(report_r)
        raise
    finally:
        os.close(setup_r)
        os.close(report_w)
    child.report_fd = report_r
    _send(setup_w, json.dumps(setup).encode("utf-8"))
    return child


def _send(fd: int, data: bytes) -> None:
    """Write ``data`` to the guard's setup pipe and close it (a guard that died early reads nothing)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)
