"""The training's guard: the process between the wrapper and the training that takes the training down with it.

``python -I -S process_guard.py SETUP_FD REPORT_FD -- CMD...`` runs in the training's process group (the wrapper starts
it as the group's leader). It starts clean: an isolated interpreter (``-I``: no ``PYTHON*`` variable, no user
site, neither its working directory nor its own folder on ``sys.path``; ``-S``: no ``site``, so no ``.pth``
file runs), an empty environment and ``/`` as its working directory, so nothing of the job — no
``LD_PRELOAD``, no ``sitecustomize.py`` — runs in it while it may still be root. The training's environment,
working directory, user and the lease fds come separately, as JSON on the pipe ``SETUP_FD`` that only the
wrapper writes; only the training child gets them.

It makes itself a child subreaper, so every process the training starts stays its descendant even when it
leaves the training's session (``setsid``, ``torchrun`` ranks) and its parent dies. When the training ends,
and when the wrapper dies by any signal (SIGKILL included: the kernel sends the guard SIGTERM), it SIGKILLs
every descendant left, walking ``/proc``, and reaps them; it exits only when none is left, holding the GPU
leases until then, so a retry waits for them instead of training beside them. It writes how many it killed
to ``REPORT_FD`` for the wrapper's notes. A SIGTERM that the wrapper sends the group on purpose (a graceful
stop) is left to the training; SIGUSR1 from the wrapper means "kill everything now" (its grace ran out).

On shared nodes the training runs as an unprivileged user without supplementary groups (the setup's
``uid``/``gid``): the user's command then cannot reach zeusd's socket or the power-limit journals.

Imports only the standard library and is run by path, not as ``carbonflow.execution.process_guard``: it starts in
milliseconds and imports nothing of carbonflow (or of its dependencies).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SWEEP_POLL_S = 0.01


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -I -S process_guard.py SETUP_FD REPORT_FD -- CMD...", file=sys.stderr)
        return 2
    setup, report_fd, command = _read_setup(int(argv[0])), int(argv[1]), argv[3:]
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != parent:  # the wrapper is gone: nothing of this training may run on
            _die_with_everything()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGUSR1, lambda _s, _f: _die_with_everything())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the group's SIGINT is for the training
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        _die_with_everything()
    child = _start(command, setup)
    code = _wait_for(child)
    left = sweep()
    _report(report_fd, {"left_behind": left})
    return code


def _read_setup(fd: int) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as pipe:
        return json.loads(pipe.read().decode("utf-8"))


def _start(command: list[str], setup: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The training. Keep the object until it is reaped: a dropped Popen reaps its child itself (``__del__``)."""
    uid, gid = setup.get("uid"), setup.get("gid")
    as_user: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": []} if uid is not None else {}
    return subprocess.Popen(
        command, env=setup["env"], cwd=setup.get("cwd"), pass_fds=tuple(setup.get("fds", ())),
        preexec_fn=_default_signals, **as_user,
    )  # fmt: skip


def _wait_for(child: subprocess.Popen[bytes]) -> int:
    """Reap children (orphans re-parented to this subreaper too) until ``child`` ends; its exit code."""
    while child.returncode is None:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:  # pragma: no cover - the training is our child until reaped, here
            return -1
        if reaped == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode


def descendants(root: int) -> set[int]:
    """Every living process below ``root`` (by the parent links in ``/proc``; zombies included)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def sweep() -> int:
    """SIGKILL every descendant and reap them all; returns how many were still running (not zombies)."""
    me, killed = os.getpid(), set()
    while True:
        left = descendants(me)
        for pid in left:
            if pid not in killed and not _zombie(pid):
                killed.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not _reap_all() and not left:
            return len(killed)
        time.sleep(SWEEP_POLL_S)


def _reap_all() -> bool:
    """Reap every ended child without waiting; False once this process has no child left at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _die_with_everything() -> None:
    """Kill and reap every descendant, then die by SIGKILL (the wrapper sees the training killed)."""
    sweep()
    os.kill(os.getpid(), signal.SIGKILL)


def _report(fd: int, report: dict[str, Any]) -> None:
    try:
        os.write(fd, json.dumps(report).encode())
        os.close(fd)
    except OSError:  # the wrapper stopped listening: nothing to tell
        pass


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def exit_like(code: int) -> None:
    """End this process the way the training ended: the same exit status, or the same signal."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    raise SystemExit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    exit_like(main(sys.argv[1:]))
