"""Exclusive GPU leases: one wrapper (and the training it starts) per GPU, released by the kernel on death.

A lease is an exclusive ``flock`` on ``<lease dir>/<GPU UUID>.lock``. The wrapper takes the leases of the
GPUs it caps or measures before it touches them and holds them for its whole life; the training child
inherits the lock's file descriptors, so the GPU stays leased while any process of that training lives,
even an orphan whose wrapper was SIGKILLed. When the last holder exits — cleanly, by a signal, by the OOM
killer — the kernel drops the lock: no lease outlives its processes, and none needs cleaning up.

That makes the lease the liveness test of everything else: a power-limit journal of a GPU whose lease a
new wrapper now holds was left by a run that is gone, and is repaired at once.

The lease directory is the same for every wrapper on a machine whatever its ``CARBONFLOW_HOME`` or user:
``<node dir>/gpu-leases`` (:func:`carbonflow.settings.node_state_dir`), or ``CARBONFLOW_GPU_LEASE_DIR``; a
directory inside a home, or one that disagrees with what the machine registered, is refused before any lease
is taken (:func:`carbonflow.settings.node_dirs`). It must be on a local filesystem (``flock`` on NFS is not
reliable). Lock files are opened read-only when another user created them (``flock`` needs no write access).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from carbonflow.energy.errors import GpuLeaseUnavailable
from carbonflow.settings import node_dirs

POLL_S = 0.2


def lease_dir() -> Path:
    """The machine-wide lease directory (see the module docstring); raises NodeDirsSplit on a split."""
    return node_dirs().leases


def safe_name(text: str) -> str:
    """``text`` usable as one path component (GPU UUIDs; Airflow run ids contain ':' and '+').

    Never ``''``, ``'.'`` or ``'..'`` (which name no file of their own): those come back with their dots as
    ``_``, e.g. ``'..'`` → ``'__'``, ``''`` → ``'_'``.
    """
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    return "_" * max(len(name), 1) if name in ("", ".", "..") else name


def _lock_path(directory: Path, gpu_uuid: str) -> Path:
    return directory / f"{safe_name(gpu_uuid)}.lock"


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    with contextlib.suppress(OSError):  # informative only; read-only when another user created the file
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _try_group_lock(directory: Path, gpu_uuid: str, group: str) -> int | None:
    """An fd holding a *shared* flock on the GPU's lease for co-location ``group``, or None when it is leased to a
    run alone or to another group.

    The members of one planned pair (on Kubernetes, two pods on one time-sliced GPU) share the GPU's lease; a
    run alone (an exclusive lease) and the members of another pair wait. Under ``<uuid>.gate`` a member either
    finds the lease free — takes it, records its group in ``<uuid>.group``, keeps it shared — or finds it held
    by its own group and joins. The record is written only by the member that found the lease free, so it
    names the holders for as long as any holds it; the kernel frees the lease with its last holder, as always.
    """
    directory.mkdir(parents=True, exist_ok=True)
    gate = _open_lock_file(directory / f"{safe_name(gpu_uuid)}.gate")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fd = _open_lock_file(_lock_path(directory, gpu_uuid))
        record = directory / f"{safe_name(gpu_uuid)}.group"
        if _flock_nb(fd, fcntl.LOCK_EX):  # free: the group's, from now on
            record.write_text(group, encoding="utf-8")
        elif not (record.is_file() and record.read_text(encoding="utf-8") == group):
            os.close(fd)
            return None
        if _flock_nb(fd, fcntl.LOCK_SH):  # a run alone may take the lease between the two: then wait
            return fd
        os.close(fd)
        return None
    finally:
        os.close(gate)


def _flock_nb(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _open_lock_file(path: Path) -> int:
    """The lock file, read-write when ours, read-only when another user's (never through a symlink)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def lease_holder_pid(gpu_uuid: str, directory: Path | None = None) -> int | None:
    """The pid of the wrapper that took the lease (informative: its children may hold it after it died)."""
    try:
        text = _lock_path(directory or lease_dir(), gpu_uuid).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lease_is_held(gpu_uuid: str, directory: Path | None = None) -> bool:
    """Whether some living process holds ``gpu_uuid``'s lease (this process's own leases count)."""
    fd = _try_lock(_lock_path(directory or lease_dir(), gpu_uuid))
    if fd is None:
        return True
    os.close(fd)
    return False


@dataclass
class GpuLeaseSet:
    """Leases held by this process; ``fds`` are inherited by a child started with ``pass_fds=lease.fds``."""

    uuids: list[str]
    directory: Path
    fds: list[int] = field(default_factory=list)

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def __enter__(self) -> GpuLeaseSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _take_free(candidates: Sequence[str], count: int, directory: Path, group: str | None) -> GpuLeaseSet | None:
    taken = GpuLeaseSet([], directory)
    for gpu_uuid in candidates:
        fd = (
            _try_lock(_lock_path(directory, gpu_uuid)) if group is None else _try_group_lock(directory, gpu_uuid, group)
        )
        if fd is not None:
            taken.uuids.append(gpu_uuid)
            taken.fds.append(fd)
            if len(taken.uuids) == count:
                return taken
    taken.release()
    return None


def acquire_gpus(
    candidates: Sequence[str],
    count: int,
    *,
    wait_s: float = 0.0,
    directory: Path | None = None,
    group: str | None = None,
) -> GpuLeaseSet:
    """Lease ``count`` of the GPUs named in ``candidates`` (UUIDs, in order of preference).

    ``group``: the run is one member of a planned co-located pair; it shares the lease with the pair's other
    member only (:func:`_try_group_lock`). None: the run has its GPUs alone.

    Waits up to ``wait_s`` for enough of them to be free; then raises :class:`GpuLeaseUnavailable` naming the
    GPUs and who holds them. Never returns fewer than ``count``.
    """
    if count < 1 or count > len(candidates):
        raise GpuLeaseUnavailable(
            f"containers={count}: this node has {len(candidates)} GPU(s) for carbonflow ({', '.join(candidates)})"
        )
    directory = directory or lease_dir()
    deadline = time.monotonic() + wait_s
    while True:
        taken = _take_free(candidates, count, directory, group)
        if taken is not None:
            return taken
        if time.monotonic() >= deadline:
            raise GpuLeaseUnavailable(_busy_message(candidates, count, wait_s, directory))
        time.sleep(POLL_S)


def _busy_message(candidates: Sequence[str], count: int, wait_s: float, directory: Path) -> str:
    held = [f"{u} (leased by pid {lease_holder_pid(u, directory)})" for u in candidates if lease_is_held(u, directory)]
    return (
        f"no {count} free GPU(s) after waiting {wait_s:g} s: {len(held)} of {len(candidates)} are leased by other "
        f"carbonflow runs: {', '.join(held)}. A GPU is never shared by accident; raise the wait "
        f"(CARBONFLOW_GPU_WAIT_S) or give the night fewer parallel runs (lease dir {directory})"
    )
