"""Run records held in Airflow's metadata DB while MLflow is down, so they outlive the worker that made them.

When a training's record cannot be written, :func:`carbonflow.tracking.spool.deliver` keeps it in the
worker's local spool. On an ephemeral worker (a pod, an autoscaled VM) that disk goes with the worker,
so the training task also pushes the spool entry, files included, to XCom (:func:`hold_run`), and a
downstream task with retries writes it (:func:`deliver_held`) once MLflow is back. Both paths carry
the run's idempotency key: whichever writes first makes the run, the other finds it (exactly once).

A held run is at most :data:`HELD_RUN_MAX_KIB` KiB as stored (JSON, files in base64): files that do not fit
stay on the worker (the record's ``carbonflow.held_without`` tag names them), and a record too big even
without its files is refused at hold time (:class:`HeldRunRefused`; it stays in the worker's spool).

Anyone who can write an XCom row can write a held run, so :func:`deliver_held` trusts none of it but the run
record's fields: each artifact is a plain file name (no ``/``, no ``..``, not absolute) whose bytes the held run
carries, files are written only inside the delivery's own temporary folder, and the run goes to the
deployment's tracking URI (the operator's, else ``$MLFLOW_TRACKING_URI``), never to one the record names.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from carbonflow.tracking.records import ArtifactFile, RunRecord, SpoolEntryMeta, TrackingOutcome

log = logging.getLogger(__name__)

HELD_RUNS_XCOM_KEY = "held_runs"
HELD_FORMAT_VERSION = 2  # 2: plain file names, size-capped; 1 (carbonflow 0.1.0) named spool paths
HELD_RUN_MAX_KIB = 256  # one held run as XCom stores it (JSON, files in base64)
HELD_KEYS = ("format_version", "entry", "files", "left_on_worker")


class HeldRunRefused(ValueError):
    """A held run that is too big to hold, or that no delivery may trust (it names the field and value)."""


def _size_bytes(value: Any) -> int:
    return len(json.dumps(value).encode("utf-8"))


def hold_run(tracking: dict[str, Any], max_kib: int = HELD_RUN_MAX_KIB) -> dict[str, Any]:
    """The spooled run of ``tracking`` (a :class:`TrackingOutcome` as JSON) as one JSON-able value for XCom.

    Files go in while the held run stays within ``max_kib`` KiB; the others stay on the worker.
    Raises :class:`HeldRunRefused` when the record alone (no file) is over ``max_kib``.
    """
    outcome = TrackingOutcome.model_validate(tracking)
    if not outcome.spooled or not outcome.spool_path:
        raise ValueError(f"run {outcome.idempotency_key} was not spooled; there is nothing to hold")
    entry = Path(outcome.spool_path)
    meta = SpoolEntryMeta.model_validate_json((entry / "entry.json").read_text(encoding="utf-8"))
    named = _plain_names(meta.record)  # spool path -> plain name; a repeated name stays on the worker
    every = _artifact_files(meta.record)
    worst = _held(meta, named, {}, every)  # the record with every file left behind: the smallest it gets
    room = max_kib * 1024 - _size_bytes(worst)
    if room < 0:
        raise HeldRunRefused(
            f"held run {outcome.idempotency_key} is {_size_bytes(worst) / 1024:.0f} KiB without any file, over the "
            f"{max_kib} KiB cap (HELD_RUN_MAX_KIB); it is not held in XCom and stays in this worker's spool "
            f"at {entry}, replayed from there when MLflow is back"
        )
    files: dict[str, str] = {}
    for spool_file in every:
        if spool_file not in named or _base64_len((entry / spool_file).stat().st_size) > room:
            continue  # a big checkpoint is not even read
        data = base64.b64encode((entry / spool_file).read_bytes()).decode("ascii")
        cost = _size_bytes({named[spool_file]: data})  # with a separator's room
        if cost <= room:
            files[named[spool_file]] = data
            room -= cost
    left = [f for f in every if f not in named or named[f] not in files]
    if left:
        log.warning("held run %s without %s (over the %s KiB cap of a held run); they stay on this worker's spool",
                    outcome.idempotency_key, ", ".join(left), max_kib)  # fmt: skip
    return _held(meta, named, files, left)


def _base64_len(size_bytes: int) -> int:
    return 4 * ((size_bytes + 2) // 3)


def _held(meta: SpoolEntryMeta, named: dict[str, str], files: dict[str, str], left: list[str]) -> dict[str, Any]:
    """The held value: the record with plain artifact names, without the files in ``left`` (and a tag naming them)."""
    from carbonflow.tracking import schema

    record = _renamed(meta.record, named, set(left))
    if left:  # a new tags dict: model_copy shares the original's
        record = record.model_copy(update={"tags": {**record.tags, schema.T_HELD_WITHOUT: ", ".join(left)}})
    entry = meta.model_copy(update={"record": record}).model_dump(mode="json")
    return {"format_version": HELD_FORMAT_VERSION, "entry": entry, "files": files, "left_on_worker": list(left)}


def _artifact_files(record: RunRecord) -> list[str]:
    """Every artifact file of ``record`` and its nested runs, parent first."""
    out = [a.file for a in record.artifacts]
    for child in record.children:
        out.extend(_artifact_files(child))
    return out


def _plain_names(record: RunRecord) -> dict[str, str]:
    """Spool file -> its plain name (the file name MLflow shows), for names no other file of the run has."""
    seen: dict[str, list[str]] = {}
    for spool_file in _artifact_files(record):
        seen.setdefault(Path(spool_file).name, []).append(spool_file)
    return {files[0]: name for name, files in seen.items() if len(files) == 1 and _plain_name_problem(name) is None}


def _renamed(record: RunRecord, named: dict[str, str], left: set[str]) -> RunRecord:
    artifacts = [a.model_copy(update={"file": named[a.file]}) for a in record.artifacts if a.file not in left]
    children = [_renamed(c, named, left) for c in record.children]
    registry = record.registry if len(artifacts) == len(record.artifacts) else None  # its model may be left behind
    return record.model_copy(update={"artifacts": artifacts, "children": children, "registry": registry})


def _plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name, or None."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if "/" in name or "\\" in name or "\x00" in name:
        return "holds '/', '\\' or NUL (a plain file name has no folder)"
    if name in (".", "..") or name.startswith(".."):
        return "is '.' or starts with '..'"
    if len(name.encode("utf-8")) > 255:
        return "is longer than 255 bytes"
    return None


def deliver_held(held: dict[str, Any], tracking_uri: str | None = None) -> str:
    """Write one held run to MLflow (exactly once, by its idempotency key); returns its run id.

    ``tracking_uri``: the deployment's store (default ``$MLFLOW_TRACKING_URI``); the URI the record carries is
    never used. Raises :class:`HeldRunRefused` for a held run no delivery may trust, and MLflow's error when
    MLflow is still unreachable, so the delivering task fails and Airflow retries it.
    """
    from carbonflow.tracking.store import client_for, write_record
    from carbonflow.tracking.uri import resolve_tracking_uri, short_http_timeouts

    meta, files = _checked(held)
    uri = resolve_tracking_uri(tracking_uri)  # the deployment's; meta.tracking_uri is the record's wish
    with tempfile.TemporaryDirectory(prefix="carbonflow-held-") as tmp:
        base = Path(tmp).resolve()
        for name, data in files.items():
            target = base / name
            if target.parent != base:  # _checked refused it already; a second lock on the same door
                raise HeldRunRefused(f"held file {name!r} would be written outside {base}")
            with open(target, "xb") as out:  # a fresh file of our own, never through a planted link
                out.write(data)
        with short_http_timeouts():
            run_id, _, _ = write_record(client_for(uri), uri, meta.record, base, from_spool=True)
    return run_id


def _checked(held: Any) -> tuple[SpoolEntryMeta, dict[str, bytes]]:
    """The held run's record and file bytes, or :class:`HeldRunRefused` naming the field and value."""
    if not isinstance(held, dict):
        raise HeldRunRefused(f"held run is a {type(held).__name__}; expected a mapping with keys {HELD_KEYS}")
    unknown = sorted(set(held) - set(HELD_KEYS))
    if unknown:
        raise HeldRunRefused(f"held run has unknown key(s) {unknown}; allowed: {list(HELD_KEYS)}")
    if held.get("format_version") != HELD_FORMAT_VERSION:
        raise HeldRunRefused(f"held run format_version={held.get('format_version')!r} is not one this carbonflow "
                             f"reads ({HELD_FORMAT_VERSION}); the run is still in its worker's spool")  # fmt: skip
    size = _size_bytes(held)
    if size > HELD_RUN_MAX_KIB * 1024:
        raise HeldRunRefused(
            f"held run is {size / 1024:.0f} KiB, over the {HELD_RUN_MAX_KIB} KiB cap (HELD_RUN_MAX_KIB)"
        )
    meta = SpoolEntryMeta.model_validate(held.get("entry"))
    raw = held.get("files")
    if not isinstance(raw, dict):
        raise HeldRunRefused(f"held run files is a {type(raw).__name__}; expected a mapping of file name to base64")
    files = {name: _decoded(name, data) for name, data in raw.items()}
    wanted = _artifact_names(meta.record)
    missing = [a.file for a in wanted if a.file not in files]
    if missing:
        raise HeldRunRefused(f"held run artifact file(s) {missing} are not carried in its files "
                             f"({sorted(files)}); a held run uploads only the bytes it holds")  # fmt: skip
    extra = sorted(set(files) - {a.file for a in wanted})
    if extra:
        raise HeldRunRefused(f"held run carries file(s) {extra} that no artifact of its record names")
    return meta, files


def _decoded(name: object, data: object) -> bytes:
    problem = _plain_name_problem(name)
    if problem is not None:
        raise HeldRunRefused(f"held run file name {name!r} {problem}; allowed: a plain file name")
    if not isinstance(data, str):
        raise HeldRunRefused(f"held run file {name!r} is a {type(data).__name__}; expected base64 text")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise HeldRunRefused(f"held run file {name!r} is not base64: {err}") from None


def _artifact_names(record: RunRecord) -> list[ArtifactFile]:
    """Every artifact of ``record`` and its nested runs, each checked to be a plain file name."""
    out: list[ArtifactFile] = []
    for artifact in record.artifacts:
        problem = _plain_name_problem(artifact.file)
        if problem is not None:
            raise HeldRunRefused(f"held run {record.idempotency_key}: artifact file {artifact.file!r} {problem}; "
                                 "allowed: a plain file name the held run carries")  # fmt: skip
        out.append(artifact)
    for child in record.children:
        out.extend(_artifact_names(child))
    return out


def hold_runs(trackings: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`hold_run` of each spooled run: (the held runs, a warning for each run refused as too big).

    A refused run is not lost: it stays in the worker's spool. The training task must not fail for it (a retry
    would train again), so the caller tells the warnings instead.
    """
    held: list[dict[str, Any]] = []
    warnings: list[str] = []
    for tracking in trackings:
        try:
            held.append(hold_run(tracking))
        except HeldRunRefused as err:
            log.warning("%s", err)
            warnings.append(str(err))
    return held, warnings
