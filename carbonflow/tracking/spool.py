"""Outage safety: every run is written to a local spool first, then to MLflow; no run is ever lost.

``deliver`` writes the record and copies of its files under ``<home>/spool/<stamp>-<key>/`` (atomically,
by renaming a finished temporary folder), then tries the tracking store with short HTTP timeouts.
Success removes the spool entry; failure keeps it and says why. ``replay_spool`` writes the waiting
entries, oldest first, each under a file lock so two replays never race; the idempotency key makes a
replay after a half-finished write resume that run instead of duplicating it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from carbonflow.domain import utcnow
from carbonflow.tracking.records import ArtifactFile, RunRecord, SpoolEntryMeta, TrackingOutcome
from carbonflow.tracking.uri import carbonflow_home, resolve_tracking_uri, server_reachable, short_http_timeouts

log = logging.getLogger(__name__)

ENTRY_FILE = "entry.json"
LOCK_FILE = "lock"
REPLAYED_LOG = "replayed.jsonl"
FAILED_DIR = "failed"
#: A reachable store refusing an entry this many times is not an outage: the entry is quarantined.
MAX_ATTEMPTS = 5
#: Entries written by 0.1.0 carry no version and read as 1; this version is written now.
SPOOL_FORMAT_VERSION = 2


def new_idempotency_key() -> str:
    """A fresh client-made idempotency key (runs outside Airflow; see :func:`run_idempotency_key`)."""
    return uuid.uuid4().hex


def run_idempotency_key(
    dag_id: str, dag_run_id: str, clear_number: int, task_id: str, map_index: int, job: str, kind: str = "training"
) -> str:
    """The key of one run of ``job`` by one Airflow task attempt chain: the same for every retry of the task
    (a retry finds the run its previous try logged and does not log a second), new when the DAG run is
    cleared (``clear_number`` + 1: a cleared run is a new run)."""
    import hashlib

    text = "\x1f".join([dag_id, dag_run_id, str(clear_number), task_id, str(map_index), job, kind])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def spool_root(home: Path | None = None) -> Path:
    """``<home>/spool``, where runs wait while the tracking server is down."""
    return (home or carbonflow_home()) / "spool"


@dataclass(frozen=True)
class SpoolEntry:
    """A spooled record on disk."""

    path: Path
    meta: SpoolEntryMeta

    @property
    def record(self) -> RunRecord:
        return self.meta.record


def _localise(record: RunRecord, files_dir: Path, counter: list[int]) -> RunRecord:
    """Copy the record's files into ``files_dir`` and return the record with paths relative to the entry."""
    artifacts = []
    for artifact in record.artifacts:
        source = Path(artifact.file)
        if not source.is_file():
            raise FileNotFoundError(f"artifact file {source} of run {record.run_name!r} does not exist")
        counter[0] += 1
        target = files_dir / f"{counter[0]:03d}" / source.name
        target.parent.mkdir(parents=True)
        shutil.copy2(source, target)
        artifacts.append(
            ArtifactFile(file=str(target.relative_to(files_dir.parent)), artifact_path=artifact.artifact_path)
        )
    children = [_localise(child, files_dir, counter) for child in record.children]
    return record.model_copy(update={"artifacts": artifacts, "children": children})


def write_spool(record: RunRecord, tracking_uri: str, *, root: Path | None = None, reason: str = "") -> SpoolEntry:
    """Durably store ``record`` and copies of its files; returns the entry."""
    root = root or spool_root()
    root.mkdir(parents=True, exist_ok=True)
    stamp = utcnow().strftime("%Y%m%dT%H%M%S%fZ")
    final = root / f"{stamp}-{record.idempotency_key}"
    tmp = root / f".tmp-{stamp}-{record.idempotency_key}"
    tmp.mkdir()
    try:
        local = _localise(record, tmp / "files", [0])
        meta = SpoolEntryMeta(
            tracking_uri=tracking_uri, reason=reason, record=local, format_version=SPOOL_FORMAT_VERSION
        )
        _write_entry(tmp, meta)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SpoolEntry(final, meta)


def _write_entry(folder: Path, meta: SpoolEntryMeta) -> None:
    """Replace ``entry.json`` atomically (temporary file, fsync, rename): a kill mid-write leaves the old one."""
    tmp = folder / f".{ENTRY_FILE}.{uuid.uuid4().hex[:8]}"
    with tmp.open("w") as handle:
        handle.write(meta.model_dump_json(indent=1))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / ENTRY_FILE)


def _load(path: Path) -> SpoolEntry | None:
    try:
        return SpoolEntry(path, SpoolEntryMeta.model_validate_json((path / ENTRY_FILE).read_text()))
    except (OSError, ValueError) as exc:
        log.error("unreadable spool entry %s: %s", path, exc)
        return None


def pending(*, root: Path | None = None, tracking_uri: str | None = None) -> list[SpoolEntry]:
    """Spooled entries, oldest first (only those meant for ``tracking_uri`` when given)."""
    root = root or spool_root()
    if not root.is_dir():
        return []
    entries = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != FAILED_DIR):
        entry = _load(path)
        if entry is not None and (tracking_uri is None or entry.meta.tracking_uri == tracking_uri):
            entries.append(entry)
    return entries


@contextmanager
def _locked(path: Path) -> Iterator[bool]:
    with open(path / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _flush(entry: SpoolEntry, uri: str, *, from_spool: bool) -> tuple[str, str, str | None] | None:
    """Write one entry; on success remove it and return (run_id, experiment_id, version); None if locked."""
    from carbonflow.tracking.store import client_for, write_record

    with _locked(entry.path) as got_lock:
        if not got_lock or not entry.path.exists():
            return None
        meta = entry.meta
        meta.attempts += 1
        meta.last_attempt_at = utcnow()
        try:
            with short_http_timeouts():
                result = write_record(client_for(uri), uri, meta.record, entry.path, from_spool=from_spool)
        except Exception as exc:
            meta.last_error = f"{type(exc).__name__}: {exc}"[:2000]
            _write_entry(entry.path, meta)
            raise
        line = {
            "idempotency_key": meta.record.idempotency_key,
            "run_id": result[0],
            "tracking_uri": uri,
            "spooled_at": meta.spooled_at.isoformat(),
            "written_at": utcnow().isoformat(),
            "attempts": meta.attempts,
            "from_spool": from_spool,
        }
        with open(entry.path.parent / REPLAYED_LOG, "a") as handle:
            handle.write(json.dumps(line) + "\n")
    shutil.rmtree(entry.path, ignore_errors=True)
    return result


def _quarantine(entry: SpoolEntry) -> Path:
    """Move an entry the store keeps refusing (not an outage) to ``<spool>/failed/``; it is kept, not lost."""
    target = entry.path.parent / FAILED_DIR / entry.path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(entry.path), target)
    log.error(
        "spooled run %s refused %d times by a reachable tracking store (%s); kept at %s for inspection",
        entry.record.idempotency_key,
        entry.meta.attempts,
        entry.meta.last_error,
        target,
    )
    return target


def failed_entries(*, root: Path | None = None) -> list[SpoolEntry]:
    """Entries quarantined after :data:`MAX_ATTEMPTS` refusals by a reachable store."""
    folder = (root or spool_root()) / FAILED_DIR
    if not folder.is_dir():
        return []
    return [e for e in (_load(p) for p in sorted(folder.iterdir()) if p.is_dir()) if e is not None]


def _replay(uri: str, entries: list[SpoolEntry]) -> tuple[int, str | None]:
    """Write ``entries`` oldest first; returns (written, outage reason or None).

    Stops at an outage (the store unreachable). A failure while the store stays reachable is not an
    outage: that entry is skipped (and quarantined after :data:`MAX_ATTEMPTS`), the others go on.
    """
    written = 0
    for entry in entries:
        try:
            if _flush(entry, uri, from_spool=True) is not None:
                written += 1
        except Exception as exc:
            reachable, why = server_reachable(uri)
            if not reachable:
                return written, why
            log.warning("replay of %s failed: %s: %s", entry.path.name, type(exc).__name__, exc)
            if entry.meta.attempts >= MAX_ATTEMPTS:
                _quarantine(entry)
    return written, None


def replay_spool(tracking_uri: str | None = None, *, root: Path | None = None, all_targets: bool = False) -> int:
    """Write waiting spooled runs to ``tracking_uri``, oldest first; returns how many were written.

    Stops at an outage and leaves the rest waiting. With ``all_targets`` it also replays entries first
    meant for another tracking URI into this one.
    """
    uri = resolve_tracking_uri(tracking_uri)
    reachable, why = server_reachable(uri)
    if not reachable:
        log.warning("not replaying the spool: %s", why)
        return 0
    written, outage = _replay(uri, pending(root=root, tracking_uri=None if all_targets else uri))
    if outage:
        log.warning("spool replay stopped after %d run(s): %s", written, outage)
    return written


def deliver(record: RunRecord, tracking_uri: str | None = None, *, root: Path | None = None) -> TrackingOutcome:
    """Spool ``record``, replay older waiting runs, then write it; never raises because tracking is down."""
    uri = resolve_tracking_uri(tracking_uri)
    outcome = TrackingOutcome(tracking_uri=uri, idempotency_key=record.idempotency_key)
    try:
        entry = write_spool(record, uri, root=root)
    except OSError as exc:  # no local disk to spool to: write straight through, and fail loudly if that fails
        log.error("cannot spool run %s locally (%s); writing it directly", record.idempotency_key, exc)
        from carbonflow.tracking.store import client_for, write_record

        with short_http_timeouts():
            result = write_record(client_for(uri), uri, record, Path("/"))
        outcome.run_id, outcome.experiment_id, outcome.model_version = result
        return outcome
    reachable, why = server_reachable(uri)
    if not reachable:
        return _spooled(entry, outcome, why)
    older = [e for e in pending(root=root, tracking_uri=uri) if e.path != entry.path]
    outcome.replayed_from_spool, outage = _replay(uri, older)
    if outage:
        return _spooled(entry, outcome, f"store went away while replaying older spooled runs: {outage}")
    try:
        result = _flush(entry, uri, from_spool=False)
    except Exception as exc:
        return _spooled(entry, outcome, f"{type(exc).__name__}: {exc}")
    if result is None:  # another process holds the entry; it will write it
        return _spooled(entry, outcome, "spool entry locked by another replay")
    outcome.run_id, outcome.experiment_id, outcome.model_version = result
    log.info(outcome.message)
    return outcome


def _spooled(entry: SpoolEntry, outcome: TrackingOutcome, reason: str) -> TrackingOutcome:
    reason = reason[:500]
    if entry.path.exists():
        meta = entry.meta
        meta.reason = reason
        _write_entry(entry.path, meta)
    outcome.spooled = True
    outcome.reason = reason
    outcome.spool_path = str(entry.path)
    log.warning(outcome.message)
    return outcome
