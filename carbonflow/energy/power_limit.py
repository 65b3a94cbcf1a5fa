"""Set one power limit on every GPU of a run and always put the previous limits back.

``applied_power_limit(devices, limit_w)`` is the context manager the ``carbonflow run`` wrapper
uses. It

1. validates ``limit_w`` against every GPU's constraints before touching anything (ValueError
   naming the value and the allowed range);
2. holds the *lease* of every GPU it may change (:mod:`carbonflow.energy.lease`: taken here unless the
   caller passes its own), and first repairs what a crashed run left behind — on every start, with or
   without a limit: a journal of a GPU whose lease this process now holds was written by a run that is
   gone. Then it reads every GPU's current limit and writes one *restore journal* per GPU
   (``<journal dir>/<GPU UUID>.json``, format 2, written atomically) before changing that GPU, so a later
   process can restore after a crash of the wrapper itself (``restore_from_journal`` /
   ``python -m carbonflow.energy.power_limit restore [PATH]``, through zeusd when ``ZEUSD_SOCK_PATH`` is
   set, or simply the next run on those GPUs). Journals of 0.1.0 (one file per run, judged by PID) are
   still read and repaired. Simulated GPUs need no journal (their limit lives and dies with the process);
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from carbonflow.contract import POWER_JOURNAL_DIR_ENV, ZEUSD_SOCK_ENV
from carbonflow.energy.device import LIMIT_TOLERANCE_W, Device
from carbonflow.energy.errors import (
    EnergyError,
    GpuLeaseUnavailable,
    PowerLimitNotPermitted,
    PowerLimitRestoreFailed,
)
from carbonflow.energy.lease import (
    GpuLeaseSet,
    acquire_gpus,
    lease_holder_pid,
    lease_is_held,
    safe_name,
)
from carbonflow.energy.zeusd import holder_of, release_device
from carbonflow.settings import node_dirs

RESTORE_FAILED = "POWER LIMIT NOT RESTORED"
"""How a run's note starts when a limit could not be put back: words for people. The session fails the task on
the typed ``RunResult.power_limits_not_restored`` (from :attr:`PowerLimitOutcome.not_restored`), not on this."""
logger = logging.getLogger(__name__)

JOURNAL_DIR_ENV = POWER_JOURNAL_DIR_ENV
JOURNAL_PREFIX = "power-limit-journal-"
"""0.1.0 journals (one per run, named by PID); still read and repaired."""
JOURNAL_FORMAT_VERSION = 2


def default_journal_dir() -> Path:
    """The machine-wide journal directory: $CARBONFLOW_POWER_JOURNAL_DIR, else ``<node dir>/power-journal``.

    Never under a worker's home (see :func:`carbonflow.settings.node_dirs`, which refuses a split).
    """
    return node_dirs().journals


def journal_target_w(dev: Device, entry: JournalEntry) -> tuple[float, str | None]:
    """The limit to put ``dev`` back to from ``entry``, and why it is not the journal's own value (or None).

    A journal is restore instructions applied with privilege: a ``previous_w`` outside the GPU's [min, max]
    range (a forged or corrupt file) is refused and the GPU goes back to its default limit instead.
    """
    low_w, high_w = dev.power_limit_constraints_w()
    if low_w - LIMIT_TOLERANCE_W <= entry.previous_w <= high_w + LIMIT_TOLERANCE_W:
        return entry.previous_w, None
    default_w = dev.default_power_limit_w()
    why = (
        f"journal {entry.path}: previous_w={entry.previous_w:g} W is outside {dev.describe()}'s range "
        f"[{low_w:g}, {high_w:g}] W; refused, restoring the GPU's default limit {default_w:g} W instead"
    )
    logger.critical(why)
    return default_w, why


def gpu_journal_path(directory: Path, gpu_uuid: str) -> Path:
    """The journal of a GPU: ``<directory>/<UUID>.json``."""
    return directory / f"{safe_name(gpu_uuid)}.json"


def gpu_journal_paths(directory: Path, gpu_uuid: str) -> list[Path]:
    """Every journal of a GPU: ``<UUID>.json``, and ``<UUID>.uid-<N>.json`` written by user N beside another user's
    journal it could not remove (a sticky shared node directory: see :func:`_journal_path_for_writing`)."""
    base = gpu_journal_path(directory, gpu_uuid)
    return [p for p in [base, *sorted(directory.glob(f"{base.stem}.uid-*.json"))] if p.is_file()]


def _journal_path_for_writing(directory: Path, gpu_uuid: str) -> Path:
    """``<UUID>.json``, unless another user's journal is there (it was applied; a sticky directory keeps it)."""
    path = gpu_journal_path(directory, gpu_uuid)
    try:
        theirs = path.lstat().st_uid != os.geteuid()
    except FileNotFoundError:
        return path
    return path.with_name(f"{path.stem}.uid-{os.geteuid()}.json") if theirs else path


def _remove_journal(path: Path) -> str | None:
    """Remove a journal that was applied; a note when a sticky directory keeps another user's (applying it again
    later is harmless: it holds the GPU's limit from before that run)."""
    try:
        path.unlink(missing_ok=True)
    except PermissionError:
        return f"journal {path} (another user's) was applied but cannot be removed here; the next run applies it again"
    return None


@dataclass
class PowerLimitOutcome:
    """What ``applied_power_limit`` did (the wrapper copies it into the run result)."""

    requested_w: float | None
    applied: bool = False
    previous_w: dict[str, float] = field(default_factory=dict)
    applied_w: dict[str, float] = field(default_factory=dict)
    restored: bool | None = None
    notes: list[str] = field(default_factory=list)
    journal_paths: list[str] = field(default_factory=list)
    not_restored: list[str] = field(default_factory=list)
    """One entry per GPU whose limit could not be put back: the GPU, the wanted and the actual limit (the run
    result's ``power_limits_not_restored``; the note starting with :data:`RESTORE_FAILED` says it in words)."""


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(payload, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _release_with_retries(dev: Device, holder: str, retries: int, delay_s: float) -> tuple[float | None, str | None]:
    """Release ``holder`` at the node's power agent; (limit left in W, None), (None, None) without an agent, or
    (None, the last error)."""
    last = "unknown error"
    for attempt in range(1, retries + 1):
        try:
            left_w = release_device(dev, holder)
            if left_w is None:
                return None, None
            now_w = dev.power_limit_w()
            if abs(now_w - left_w) <= LIMIT_TOLERANCE_W:
                return left_w, None
            last = f"the power agent left {left_w:g} W but it reads back {now_w:g} W"
        except (EnergyError, ValueError) as exc:
            last = str(exc)
        if attempt < retries:
            time.sleep(delay_s * attempt)
    return None, last


def put_back(dev: Device, want_w: float, holder: str | None, retries: int, delay_s: float) -> tuple[float, str | None]:
    """Put ``dev`` back after a run: release ``holder`` at the power agent (which restores the original only when
    no other holder remains), else set ``want_w``. Returns (the limit it is left at, None) or (want_w, error)."""
    if holder is not None:
        left_w, err = _release_with_retries(dev, holder, retries, delay_s)
        if left_w is not None or err is not None:
            return (left_w if left_w is not None else want_w), err
    return want_w, _set_with_retries(dev, want_w, retries, delay_s)


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
        journals: dict[str, Path],
        retries: int,
        delay_s: float,
        outcome: PowerLimitOutcome,
    ) -> None:
        self.gpus = gpus
        self.previous_w = previous_w
        self.journals = journals
        self.retries = retries
        self.delay_s = delay_s
        self.outcome = outcome
        self.holders = {dev.id: h for dev in gpus if (h := holder_of(dev)) is not None}
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
                holder = self.holders.get(dev.id)
                try:
                    if holder is None and abs(dev.power_limit_w() - want) <= LIMIT_TOLERANCE_W:
                        continue
                except (EnergyError, ValueError):
                    pass
                _, err = put_back(dev, want, holder, self.retries, self.delay_s)
                if err is not None:
                    failures.append((dev, want, err))
            if failures:
                for dev, want, err in failures:
                    msg = (
                        f"{RESTORE_FAILED} ({why}) on {dev.describe()}: wanted {want:g} W, "
                        f"{err}; after {self.retries} attempts. "
                        + (
                            "Restore later with: python -m carbonflow.energy.power_limit restore "
                            f"{self.journals[dev.id]}"
                            if dev.id in self.journals
                            else ""
                        )
                    )
                    logger.critical(msg)
                    print(f"carbonflow: {msg}", file=sys.stderr, flush=True)
                    self.outcome.notes.append(msg)
                    self.outcome.not_restored.append(f"{dev.describe()}: wanted {want:g} W, {_limit_now(dev)} ({err})")
                self.outcome.restored = False
                return False
            self.outcome.restored = True
            for path in self.journals.values():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            logger.info("power limits restored (%s): %s", why, self.previous_w)
            return True


def _limit_now(dev: Device) -> str:
    """The GPU's limit as it reads now, in words (``is at 200 W``; ``unreadable: <why>``)."""
    try:
        return f"is at {dev.power_limit_w():g} W"
    except (EnergyError, ValueError) as exc:
        return f"its limit is unreadable: {exc}"


def _settable(gpus: list[Device], limit_w: float, outcome: PowerLimitOutcome) -> list[Device] | None:
    """The GPUs the limit can go on, or None (noted) when any refuses; ValueError for an out-of-range limit."""
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
        return None
    return settable


def _write_journals(
    directory: Path, durable: list[Device], previous: dict[str, float], limit_w: float
) -> dict[str, Path]:
    journals = {}
    for dev in durable:
        path = _journal_path_for_writing(directory, dev.id)
        _write_json_atomic(path, {
            "format_version": JOURNAL_FORMAT_VERSION, "gpu_uuid": dev.id, "model": dev.model,
            "previous_w": previous[dev.id], "requested_w": limit_w, "pid": os.getpid(),
            "host": os.uname().nodename, "created_at": datetime.now(UTC).isoformat(), "holder": holder_of(dev),
        })  # fmt: skip
        journals[dev.id] = path
    return journals


def _apply(settable: list[Device], limit_w: float, restorer: _Restorer, outcome: PowerLimitOutcome) -> None:
    for dev in settable:
        with restorer._lock:
            if restorer.stopping:  # a signal arrived while applying: do not lower any further GPU
                outcome.notes.append("power limit not applied: the run was stopped while it was being set")
                outcome.applied_w.clear()
                return
            try:
                dev.set_power_limit_w(limit_w)
                outcome.applied_w[dev.id] = dev.power_limit_w()
            except (EnergyError, ValueError) as exc:  # refused, or a read-back that disagrees: put all back
                outcome.notes.append(f"power limit not applied: {exc}")
                outcome.applied_w.clear()
                restorer.restore("a GPU refused the limit or read back another value")
                return
    outcome.applied = True
    outcome.notes.append(f"power limit {limit_w:g} W applied to {len(settable)} GPU(s)")
    outcome.notes.extend(
        f"{dev.describe()} is in MIG mode: the limit applies to the whole GPU, all instances"
        for dev in settable
        if dev.mig
    )


@contextlib.contextmanager
def _signals_restore(restorer: _Restorer, install: bool) -> Iterator[None]:
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

    if install and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            old_handlers[signum] = signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        try:
            restorer.restore("end of run")
        finally:
            for signum, old in old_handlers.items():
                signal.signal(signum, old)


@contextlib.contextmanager
def applied_power_limit(
    devices: Sequence[Device],
    limit_w: float | None,
    journal_dir: str | Path | None = None,
    install_signal_handlers: bool = True,
    retries: int = 3,
    retry_delay_s: float = 0.2,
    lease: GpuLeaseSet | None = None,
) -> Iterator[PowerLimitOutcome]:
    """Apply ``limit_w`` to every GPU in ``devices`` for the duration of the block; always restore.

    ``limit_w=None`` leaves limits alone (after repairing what a crashed run left). ``lease``: the caller's
    leases of these GPUs (the wrapper's, held for its whole life); without it the block takes its own.
    See the module docstring for the full contract.
    """
    outcome = PowerLimitOutcome(requested_w=limit_w)
    gpus = [d for d in devices if d.kind == "gpu"]
    durable = [d for d in gpus if d.label != "simulated"]  # a simulated GPU's limit dies with its process
    # resolved (and checked against a split) before any lease is taken; unused without a durable GPU
    directory = Path(journal_dir) if journal_dir else default_journal_dir() if durable else Path()
    own = acquire_gpus([d.id for d in durable], len(durable)) if durable and lease is None else None
    try:
        outcome.notes.extend(repair_leased_gpus(directory, durable, retries, retry_delay_s))
        settable = _settable(gpus, limit_w, outcome) if limit_w is not None and gpus else None
        if limit_w is None:
            outcome.notes.append("no power limit requested: GPUs stay at their current limits")
        elif not gpus:
            outcome.notes.append("power limit not applied: no GPU in this run")
        if not settable:
            yield outcome
            return
        previous = {dev.id: dev.power_limit_w() for dev in settable}
        outcome.previous_w = dict(previous)
        journals = _write_journals(directory, [d for d in settable if d in durable], previous, limit_w)
        outcome.journal_paths = [str(p) for p in journals.values()]
        restorer = _Restorer(settable, previous, journals, retries, retry_delay_s, outcome)
        with _signals_restore(restorer, install_signal_handlers):
            _apply(settable, limit_w, restorer, outcome)
            yield outcome
    finally:
        if own is not None:
            own.release()


@dataclass
class JournalEntry:
    gpu_uuid: str
    previous_w: float
    path: Path
    pid: int | None
    format_version: int
    holder: str | None = None
    """Who held the GPU at the node's power agent (format 2 on Kubernetes): the restore releases that holder."""


def read_journal(path: str | Path) -> list[JournalEntry]:
    """The entries of a journal file of either format (2: one GPU; 0.1.0: a run's GPUs and its PID)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if data.get("format_version") == JOURNAL_FORMAT_VERSION:
            holder = data.get("holder")
            if holder is not None and not isinstance(holder, str):
                raise ValueError(f"holder={holder!r} is not a name")
            return [JournalEntry(data["gpu_uuid"], float(data["previous_w"]), path, data.get("pid"), 2, holder)]
        pid = int(data.get("pid", -1))
        return [JournalEntry(e["id"], float(e["previous_w"]), path, pid, 1) for e in data["devices"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EnergyError(f"journal {path} is unreadable: {exc}") from exc


def host_gpus() -> list[Device]:
    """Every NVML GPU of this host, setting limits through zeusd when ``ZEUSD_SOCK_PATH`` is set."""
    from carbonflow.energy.nvml import nvml_devices
    from carbonflow.energy.zeusd import ZeusdClient

    zeusd = ZeusdClient() if os.environ.get(ZEUSD_SOCK_ENV) else None
    return list(nvml_devices(all_devices=True, zeusd=zeusd))


def restore_from_journal(
    path: str | Path, devices: Sequence[Device] | None = None, retries: int = 3, retry_delay_s: float = 0.2
) -> dict[str, float]:
    """Restore the limits recorded in a journal (after the wrapper itself crashed); returns id → W restored.

    ``devices`` defaults to :func:`host_gpus` (through zeusd when configured). Raises PowerLimitRestoreFailed
    (journal kept) if a recorded GPU is missing or refuses; removes the journal when everything is back.
    """
    entries = read_journal(path)
    if devices is None:
        devices = host_gpus() if entries else []
    by_id = {d.id: d for d in devices}
    restored: dict[str, float] = {}
    problems = []
    for entry in entries:
        dev = by_id.get(entry.gpu_uuid)
        if dev is None:
            problems.append(f"GPU {entry.gpu_uuid} not found on this host")
            continue
        target_w, _ = journal_target_w(dev, entry)
        left_w, err = put_back(dev, target_w, entry.holder, retries, retry_delay_s)
        if err is None:
            restored[entry.gpu_uuid] = left_w
        else:
            problems.append(f"{dev.describe()}: {err}")
    if problems:
        msg = f"journal {path}: could not restore: " + "; ".join(problems)
        logger.critical(msg)
        raise PowerLimitRestoreFailed(msg)
    kept = _remove_journal(Path(path))
    if kept:
        logger.warning(kept)
    return restored


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _v1_journal_is_stale(path: Path) -> bool:
    try:
        pid = int(json.loads(path.read_text()).get("pid", -1))
    except (OSError, ValueError, AttributeError):
        return True
    return not (pid > 0 and _pid_alive(pid))


def repair_leased_gpus(
    directory: str | Path, devices: Sequence[Device], retries: int = 3, retry_delay_s: float = 0.2
) -> list[str]:
    """Put back what crashed runs left on ``devices``, whose leases the caller holds; notes say what was done.

    A format-2 journal of a leased GPU is stale by construction (its writer's lease is gone). 0.1.0 journals
    are repaired when their PID is gone; their entries for other GPUs are kept.
    """
    directory = Path(directory)
    if not directory.is_dir() or not devices:
        return []
    notes = []
    for dev in devices:
        for path in gpu_journal_paths(directory, dev.id):
            notes.append(_repair_entry(dev, read_journal(path)[0], retries, retry_delay_s))
    return notes + _repair_v1_journals(directory, devices, retries, retry_delay_s)


def _repair_entry(dev: Device, entry: JournalEntry, retries: int, retry_delay_s: float) -> str:
    target_w, refused = journal_target_w(dev, entry)
    target_w, err = put_back(dev, target_w, entry.holder, retries, retry_delay_s)
    if err is not None:
        msg = f"could not restore {dev.describe()} from crashed run's journal {entry.path}: {err}"
        logger.critical(msg)
        return msg
    kept = _remove_journal(entry.path)
    done = f"restored {dev.describe()} to {target_w:g} W left lowered by a crashed run (journal {entry.path.name})"
    return "; ".join(part for part in (done, refused, kept) if part)


def _repair_v1_journals(directory: Path, devices: Sequence[Device], retries: int, retry_delay_s: float) -> list[str]:
    by_id = {d.id: d for d in devices}
    notes: list[str] = []
    for path in sorted(directory.glob(f"{JOURNAL_PREFIX}*.json")):
        if not _v1_journal_is_stale(path):
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
            note = _repair_entry(dev, JournalEntry(dev.id, float(entry["previous_w"]), path, None, 1), retries,
                                 retry_delay_s)  # fmt: skip
            notes.append(note)
            if note.startswith("could not"):
                remaining.append(entry)
        if remaining:
            data["devices"] = remaining
            _write_json_atomic(path, data)
        else:
            path.unlink(missing_ok=True)
    return notes


def stale_journals(directory: Path, leases: Path | None = None) -> list[Path]:
    """Journals whose writer is gone: format 2 when the GPU's lease (in ``leases``, default the node's) is free,
    0.1.0 when the PID is dead."""
    leases = leases or node_dirs(register=False).leases
    out = []
    for path in sorted(directory.glob("*.json")):
        if path.name.startswith(JOURNAL_PREFIX):
            if _v1_journal_is_stale(path):
                out.append(path)
            continue
        with contextlib.suppress(EnergyError):
            (entry,) = read_journal(path)
            if not lease_is_held(entry.gpu_uuid, leases):
                out.append(path)
            else:
                logger.info("journal %s is live: GPU %s is leased by pid %s", path, entry.gpu_uuid,
                            lease_holder_pid(entry.gpu_uuid, leases))  # fmt: skip
    return out


def restore_stale_journals(
    directory: str | Path | None = None, devices: Sequence[Device] | None = None
) -> dict[str, dict[str, float]]:
    """Restore every journal in ``directory`` whose writer is gone; returns path → restored limits.

    Format-2 journals are restored while holding the GPU's lease, so no wrapper starts on it meanwhile. A restore
    registers nothing in the node's ``node.json`` (it may be pointed at one pod's journals, by hand).
    """
    dirs = node_dirs(register=False)
    directory = Path(directory) if directory else dirs.journals
    out: dict[str, dict[str, float]] = {}
    for path in stale_journals(directory, dirs.leases) if directory.is_dir() else []:
        entries = read_journal(path)
        if entries[0].format_version == 1:
            out[str(path)] = restore_from_journal(path, devices)
            continue
        try:
            lease = acquire_gpus([entries[0].gpu_uuid], 1, directory=dirs.leases)
        except GpuLeaseUnavailable:  # a wrapper took the GPU meanwhile: it repairs the journal itself
            continue
        with lease:
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
    devices = _host_gpus_or_none()
    before_w = _limits_w(devices or [])
    try:
        if args.path:
            result = {args.path: restore_from_journal(args.path, devices)}
        else:
            result = restore_stale_journals(devices=devices)
    except EnergyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in restore_report_lines(result, before_w):
        print(line)
    return 0


def _host_gpus_or_none() -> list[Device] | None:
    """This host's GPUs, or None when they cannot be listed (the restore then lists them itself, if it must)."""
    try:
        return host_gpus()
    except Exception as exc:  # no NVML here: only the report's "from" figures are lost
        logger.debug("GPUs not listed before the restore: %s", exc)
        return None


def _limits_w(devices: Sequence[Device]) -> dict[str, float | None]:
    """Each device's power limit (W) now, None where it cannot be read."""
    out: dict[str, float | None] = {}
    for dev in devices:
        try:
            out[dev.id] = dev.power_limit_w()
        except Exception:  # a report figure, not a decision
            out[dev.id] = None
    return out


def restore_report_lines(result: dict[str, dict[str, float]], before_w: dict[str, float | None]) -> list[str]:
    """What ``restore`` did, one line per GPU: ``restored from X W to Y W`` (the journal named), or ``nothing to
    restore`` for a GPU no journal named; one line when there was no GPU and no journal."""
    lines: list[str] = []
    restored: set[str] = set()
    for path, limits in result.items():
        for gpu_id, to_w in limits.items():
            restored.add(gpu_id)
            from_w = before_w.get(gpu_id)
            was = f"from {from_w:g} W " if from_w is not None else ""
            lines.append(f"GPU {gpu_id}: restored {was}to {to_w:g} W (journal {path})")
    for gpu_id, now_w in before_w.items():
        if gpu_id not in restored:
            at = f" (limit {now_w:g} W)" if now_w is not None else ""
            lines.append(f"GPU {gpu_id}: nothing to restore{at}")
    return lines or ["nothing to restore: no GPU found and no journal left by a crashed run"]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
