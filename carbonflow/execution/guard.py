"""The training's guard: the process between the wrapper and the training that takes the training down with it.

``python -m carbonflow.execution.guard -- CMD...`` runs in the training's process group (the wrapper
starts it as the group's leader). It asks the kernel for SIGTERM when its parent, the wrapper, dies — by
any signal, SIGKILL included — and then SIGKILLs the whole group: the training and every process it
started (data-loader workers, ``torchrun`` ranks), not only the direct child. It holds the wrapper's GPU
leases for as long as anything of the training may still run, so a retry waits for them instead of
training beside them. A SIGTERM that the wrapper sends the group on purpose (a graceful stop) is left to
the training; the guard only waits for it and passes on its exit status. On shared nodes the guard starts
the training as an unprivileged user without supplementary groups (``$CARBONFLOW_TRAINING_UID``): the
user's command then cannot reach zeusd's socket or the power-limit journals that the wrapper uses.

Imports only the standard library: it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m carbonflow.execution.guard -- CMD...", file=sys.stderr)
        return 2
    parent = os.getppid()

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != parent:  # the wrapper is gone: nothing of this training may run on
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the group's SIGINT is for the training
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.killpg(0, signal.SIGKILL)
    inherited = tuple(int(fd) for fd in os.environ.pop("CARBONFLOW_GUARD_FDS", "").split(",") if fd)
    uid, gid = os.environ.pop("CARBONFLOW_GUARD_UID", ""), os.environ.pop("CARBONFLOW_GUARD_GID", "")
    as_user = {"user": int(uid), "group": int(gid), "extra_groups": []} if uid else {}
    child = subprocess.Popen(command, pass_fds=inherited, preexec_fn=_default_signals, **as_user)
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def exit_like(code: int) -> None:
    """End this process the way the training ended: the same exit status, or the same signal."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    raise SystemExit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    exit_like(main(sys.argv[1:]))
