"""Set one power limit on every GPU of a run and always put the previous limits back.

``applied_power_limit(devices, limit_w)`` is the context manager the ``carbonflow run`` wrapper
uses. It

1. validates ``limit_w`` against every GPU's constraints before touching anything (ValueError
   naming the value and the allowed range);
2. first repairs what a crashed run left behind (journals of dead processes naming these GPUs),
   then reads every GPU's current limit and writes a *restore journal* (JSON, written atomically)
   before changing any limit, so that a later process can restore after a crash of the wrapper
   itself (``restore_from_journal`` / ``python -m carbonflow.energy.power_limit restore [PATH]``,
   or simply the next run on those GPUs). Simulated GPUs need no journal (their limit lives and
   dies with the wrapper process);
3. sets the limit on every GPU; if a GPU refuses (no permission, not supported) the limits already
   set are put back, the run continues at the current limits and the outcome says
   ``"power limit not applied: <reason>"``;
4. restores the previous limits on normal exit, on an exception, and on SIGTERM / SIGINT (handlers
   restore first, then chain to the previous handler; with the default SIGTERM disposition they
   raise ``SystemExit(143)`` so the wrapper's own cleanup and result writing still run). A restore
   is retried and read back; if it still fails, the error is logged loudly (CRITICAL) and the
   journal is kept for a later ``restore``.

The training child being killed (even with SIGKILL) is handled by the wrapper process surviving it:
the context exits normally and restores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from carbonflow.energy.device import LIMIT_TOLERANCE_W, Device
from carbonflow.energy.errors import EnergyError, PowerLimitNotPermitted, PowerLimitRestoreFailed

logger = logging.getLogger(__name__)

JOURNAL_DIR_ENV = "CARBONFLOW_POWER_JOURNAL_DIR"
JOURNAL_PREFIX = "power-limit-journal-"


def default_journal_dir() -> Path:
    """Where restore journals live: $CARBONFLOW_POWER_JOURNAL_DIR, else ~/.carbonflow/power-journal."""
    env = os.environ.get(JOURNAL_DIR_ENV)
    return Path(env) if env else Path.home() / ".carbonflow" / "power-journal"


@dataclass
class PowerLimitOutcome:
    """What ``applied_power_limit`` did (the wrapper copies it into the run result)."""

    requested_w: float | None
    applied: bool = False
    previous_w: dict[str, float] = field(default_factory=dict)
    applied_w: dict[str, float] = field(default_factory=dict)
    restored: bool | None = None
    notes: list[str] = field(default_factory=list)
    journal_path: str | None = None


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(payload, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _set_with_retries(dev: Device, limit_w: float, retries: int, delay_s: float) -> str | None:
    """Set and read back; returns None on success, else the last error text."""
    last = "unknown error"
    for attempt in range(1, retries + 1):
        try:
            dev.set_power_limit_w(limit_w)
            now_w = dev.power_limit_w()
            if abs(now_w - limit_w) <= LIMIT_TOLERANCE_W:
                return None
            last = f"reads back {now_w:g} W"
        except (EnergyError, ValueError) as exc:
            last = str(exc)
        if attempt < retries:
            time.sleep(delay_s * attempt)
    return last


class _Restorer:
    """Puts previous limits back (idempotent), from normal exit, exception or a signal handler.

    Once a restore has been requested (``stopping``) no limit is lowered any more, so a signal that
    arrives while limits are being applied cannot leave a GPU lowered after its restore ran.
    """

    def __init__(
        self,
        gpus: list[Device],
        previous_w: dict[str, float],
        journal: Path | None,
        retries: int,
        delay_s: float,
        outcome: PowerLimitOutcome,
    ) -> None:
        self.gpus = gpus
        self.previous_w = previous_w
        self.journal = journal
        self.retries = retries
        self.delay_s = delay_s
        self.outcome = outcome
        self._lock = threading.RLock()
        self.stopping = False

    def restore(self, why: str) -> bool:
        with self._lock:
            self.stopping = True
            failures = []
            for dev in self.gpus:
                want = self.previous_w.get(dev.id)
                if want is None:
                    continue
                try:
                    if abs(dev.power_limit_w() - want) <= LIMIT_TOLERANCE_W:
                        continue
                except (EnergyError, ValueError):
                    pass
                err = _set_with_retries(dev, want, self.retries, self.delay_s)
                if err is not None:
                    failures.append((dev, want, err))
            if failures:
                for dev, want, err in failures:
                    msg = (
                        f"POWER LIMIT NOT RESTORED ({why}) on {dev.describe()}: wanted {want:g} W, "
                        f"{err}; after {self.retries} attempts. "
                        + (
                            f"Restore later with: python -m carbonflow.energy.power_limit restore {self.journal}"
                            if self.journal
                            else ""
                        )
                    )
                    logger.critical(msg)
                    print(f"carbonflow: {msg}", file=sys.stderr, flush=True)
                    self.outcome.notes.append(msg)
                self.outcome.restored = False
                return False
            self.outcome.restored = True
            if self.journal is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.journal.unlink()
            logger.info("power limits restored (%s): %s", why, self.previous_w)
            return True


@contextlib.contextmanager
def applied_power_limit(
    devices: Sequence[Device],
    limit_w: float | None,
    journal_path: str | Path | None = None,
    install_signal_handlers: bool = True,
    retries: int = 3,
    retry_delay_s: float = 0.2,
) -> Iterator[PowerLimitOutcome]:
    """Apply ``limit_w`` to every GPU in ``devices`` for the duration of the block; always restore.

    ``limit_w=None`` leaves limits alone. ``journal_path`` defaults to a per-process file in
    :func:`default_journal_dir`. See the module docstring for the full contract.
    """
    outcome = PowerLimitOutcome(requested_w=limit_w)
    gpus = [d for d in devices if d.kind == "gpu"]
    if limit_w is None:
        outcome.notes.append("no power limit requested: GPUs stay at their current limits")
        yield outcome
        return
    if not gpus:
        outcome.notes.append("power limit not applied: no GPU in this run")
        yield outcome
        return
    settable, refused = [], []
    for dev in gpus:
        if not dev.supports_power_limit:
            refused.append(f"{dev.describe()} does not support power limits")
            continue
        try:
            dev.check_power_limit_w(limit_w)  # ValueError (bad input) propagates before any change
        except PowerLimitNotPermitted as exc:
            refused.append(str(exc))
            continue
        settable.append(dev)
    if refused:
        outcome.notes.append("power limit not applied: " + "; ".join(refused))
        yield outcome
        return

    journal_dir = Path(journal_path).parent if journal_path else default_journal_dir()
    # A wrapper that crashed (SIGKILL, power loss) left its journal: put those limits back first, or the
    # lowered limit would be read below as "previous" and kept forever.
    outcome.notes.extend(repair_from_stale_journals(journal_dir, settable, retries, retry_delay_s))
    previous = {dev.id: dev.power_limit_w() for dev in settable}
    outcome.previous_w = dict(previous)
    journal: Path | None = None
    durable = [d for d in settable if d.label != "simulated"]  # a simulated GPU's limit dies with its process
    if durable:
        journal = (
            Path(journal_path)
            if journal_path
            else journal_dir / f"{JOURNAL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        )
        _write_json_atomic(
            journal,
            {
                "pid": os.getpid(),
                "created_at": datetime.now(UTC).isoformat(),
                "requested_w": limit_w,
                "devices": [
                    {"id": d.id, "model": d.model, "label": d.label, "previous_w": previous[d.id]} for d in durable
                ],
            },
        )
        outcome.journal_path = str(journal)
    restorer = _Restorer(settable, previous, journal, retries, retry_delay_s, outcome)

    old_handlers: dict[int, Any] = {}

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        restorer.restore(f"signal {signal.Signals(signum).name}")
        old = old_handlers.get(signum, signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

    if install_signal_handlers and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            old_handlers[signum] = signal.signal(signum, _on_signal)
    try:
        for dev in settable:
            with restorer._lock:
                if restorer.stopping:  # a signal arrived while applying: do not lower any further GPU
                    outcome.notes.append("power limit not applied: the run was stopped while it was being set")
                    outcome.applied_w.clear()
                    break
                try:
                    dev.set_power_limit_w(limit_w)
                    outcome.applied_w[dev.id] = dev.power_limit_w()
                except PowerLimitNotPermitted as exc:
                    outcome.notes.append(f"power limit not applied: {exc}")
                    outcome.applied_w.clear()
                    restorer.restore("a GPU refused the limit")
                    break
        else:
            outcome.applied = True
            outcome.notes.append(f"power limit {limit_w:g} W applied to {len(settable)} GPU(s)")
            for dev in settable:
                if dev.mig:
                    outcome.notes.append(
                        f"{dev.describe()} is in MIG mode: the limit applies to the whole GPU, all instances"
                    )
        yield outcome
    finally:
        try:
            restorer.restore("end of run")
        finally:
            for signum, old in old_handlers.items():
                signal.signal(signum, old)


def restore_from_journal(
    path: str | Path, devices: Sequence[Device] | None = None, retries: int = 3, retry_delay_s: float = 0.2
) -> dict[str, float]:
    """Restore the limits recorded in a journal (after the wrapper itself crashed); returns id → W restored.

    ``devices`` defaults to the NVML GPUs of this host. Raises PowerLimitRestoreFailed (journal kept)
    if a recorded GPU is missing or refuses; removes the journal when everything is back.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        entries = {e["id"]: float(e["previous_w"]) for e in data["devices"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EnergyError(f"journal {path} is unreadable: {exc}") from exc
    if devices is None:
        from carbonflow.energy.nvml import nvml_devices

        devices = nvml_devices(all_devices=True) if entries else []
    by_id = {d.id: d for d in devices}
    restored: dict[str, float] = {}
    problems = []
    for dev_id, want in entries.items():
        dev = by_id.get(dev_id)
        if dev is None:
            problems.append(f"GPU {dev_id} not found on this host")
            continue
        err = _set_with_retries(dev, want, retries, retry_delay_s)
        if err is None:
            restored[dev_id] = want
        else:
            problems.append(f"{dev.describe()}: {err}")
    if problems:
        msg = f"journal {path}: could not restore: " + "; ".join(problems)
        logger.critical(msg)
        raise PowerLimitRestoreFailed(msg)
    path.unlink(missing_ok=True)
    return restored


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _journal_is_stale(path: Path) -> bool:
    try:
        pid = int(json.loads(path.read_text()).get("pid", -1))
    except (OSError, ValueError, AttributeError):
        return True
    return not (pid > 0 and _pid_alive(pid))


def repair_from_stale_journals(
    directory: str | Path, devices: Sequence[Device], retries: int = 3, retry_delay_s: float = 0.2
) -> list[str]:
    """Restore limits recorded by crashed runs for the given devices; returns notes saying what was done.

    Entries for devices not given are kept in the journal (rewritten) for whoever owns those GPUs.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    by_id = {d.id: d for d in devices}
    notes: list[str] = []
    for path in sorted(directory.glob(f"{JOURNAL_PREFIX}*.json")):
        if not _journal_is_stale(path):
            continue
        try:
            data = json.loads(path.read_text())
            entries = list(data["devices"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error("ignoring unreadable power-limit journal %s: %s", path, exc)
            continue
        remaining = []
        for entry in entries:
            dev = by_id.get(entry.get("id"))
            if dev is None:
                remaining.append(entry)
                continue
            err = _set_with_retries(dev, float(entry["previous_w"]), retries, retry_delay_s)
            if err is None:
                notes.append(
                    f"restored {dev.describe()} to {float(entry['previous_w']):g} W left lowered by a crashed run "
                    f"(journal {path.name})"
                )
            else:
                remaining.append(entry)
                msg = f"could not restore {dev.describe()} from crashed run's journal {path}: {err}"
                logger.critical(msg)
                notes.append(msg)
        if remaining:
            data["devices"] = remaining
            _write_json_atomic(path, data)
        else:
            path.unlink(missing_ok=True)
    return notes


def restore_stale_journals(
    directory: str | Path | None = None, devices: Sequence[Device] | None = None
) -> dict[str, dict[str, float]]:
    """Restore every journal in ``directory`` whose writing process is gone; returns path → restored limits."""
    directory = Path(directory) if directory else default_journal_dir()
    out: dict[str, dict[str, float]] = {}
    for path in sorted(directory.glob(f"{JOURNAL_PREFIX}*.json")):
        if _journal_is_stale(path):
            out[str(path)] = restore_from_journal(path, devices)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m carbonflow.energy.power_limit restore [PATH]`` — restore after a wrapper crash."""
    parser = argparse.ArgumentParser(prog="python -m carbonflow.energy.power_limit")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_restore = sub.add_parser("restore", help="restore limits from a journal file, or all stale journals")
    p_restore.add_argument("path", nargs="?", help="journal file (default: every stale journal)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        result = {args.path: restore_from_journal(args.path)} if args.path else restore_stale_journals()
    except EnergyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
