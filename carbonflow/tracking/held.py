"""Run records held in Airflow's metadata DB while MLflow is down, so they outlive the worker that made them.

When a training's record cannot be written, :func:`carbonflow.tracking.spool.deliver` keeps it in the
worker's local spool. On an ephemeral worker (a pod, an autoscaled VM) that disk goes with the worker,
so the training task also pushes the spool entry, files included, to XCom (:func:`hold_run`), and a
downstream task with retries writes it (:func:`deliver_held`) once MLflow is back. Both paths carry
the run's idempotency key: whichever writes first makes the run, the other finds it (exactly once).

Files larger than the budget (``$CARBONFLOW_HELD_RUN_MAX_BYTES``, default 64 MiB per run: a large
model checkpoint) are not copied into the DB; the held record says which were left on the worker.
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from carbonflow.tracking.records import SpoolEntryMeta, TrackingOutcome

log = logging.getLogger(__name__)

HELD_RUNS_XCOM_KEY = "held_runs"
HELD_FORMAT_VERSION = 1
MAX_BYTES_ENV = "CARBONFLOW_HELD_RUN_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def _max_bytes() -> int:
    raw = os.environ.get(MAX_BYTES_ENV, str(DEFAULT_MAX_BYTES))
    if not raw.strip().isdigit():
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r} is not allowed; give a whole number of bytes (>= 0)")
    return int(raw)


def hold_run(tracking: dict[str, Any], max_bytes: int | None = None) -> dict[str, Any]:
    """The spooled run of ``tracking`` (a :class:`TrackingOutcome` as JSON) as one JSON-able value for XCom."""
    outcome = TrackingOutcome.model_validate(tracking)
    if not outcome.spooled or not outcome.spool_path:
        raise ValueError(f"run {outcome.idempotency_key} was not spooled; there is nothing to hold")
    entry = Path(outcome.spool_path)
    meta = SpoolEntryMeta.model_validate_json((entry / "entry.json").read_text(encoding="utf-8"))
    budget = _max_bytes() if max_bytes is None else max_bytes
    files: dict[str, str] = {}
    left: list[str] = []
    for artifact in _artifacts(meta):
        path = entry / artifact
        size = path.stat().st_size
        if size > budget:
            left.append(artifact)
            continue
        budget -= size
        files[artifact] = base64.b64encode(path.read_bytes()).decode("ascii")
    if left:
        log.warning("held run %s without %s (over the %s budget); they stay on this worker's spool",
                    outcome.idempotency_key, ", ".join(left), MAX_BYTES_ENV)  # fmt: skip
    return {"format_version": HELD_FORMAT_VERSION, "entry": meta.model_dump(mode="json"), "files": files,
            "left_on_worker": left}  # fmt: skip


def _artifacts(meta: SpoolEntryMeta) -> list[str]:
    out: list[str] = []
    stack = [meta.record]
    while stack:
        record = stack.pop()
        out.extend(a.file for a in record.artifacts)
        stack.extend(record.children)
    return out


def deliver_held(held: dict[str, Any], tracking_uri: str | None = None) -> str:
    """Write one held run to MLflow (exactly once, by its idempotency key); returns its run id.

    Raises when MLflow is still unreachable, so the delivering task fails and Airflow retries it.
    A file left on the worker is dropped from the record, with a tag saying so.
    """
    from carbonflow.tracking import schema
    from carbonflow.tracking.store import client_for, write_record
    from carbonflow.tracking.uri import resolve_tracking_uri, short_http_timeouts

    version = int(held.get("format_version", 0))
    if version != HELD_FORMAT_VERSION:
        raise ValueError(f"held run format_version={version} is not one this carbonflow reads ({HELD_FORMAT_VERSION})")
    meta = SpoolEntryMeta.model_validate(held["entry"])
    uri = resolve_tracking_uri(tracking_uri or meta.tracking_uri)
    with tempfile.TemporaryDirectory(prefix="carbonflow-held-") as tmp:
        base = Path(tmp)
        for name, data in held["files"].items():
            target = base / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(data))
        record = _without(meta.record, set(held.get("left_on_worker", [])))
        if held.get("left_on_worker"):
            record.tags[schema.T_HELD_WITHOUT] = ", ".join(held["left_on_worker"])
        with short_http_timeouts():
            run_id, _, _ = write_record(client_for(uri), uri, record, base, from_spool=True)
    return run_id


def _without(record: Any, left: set[str]) -> Any:
    artifacts = [a for a in record.artifacts if a.file not in left]
    children = [_without(c, left) for c in record.children]
    registry = record.registry if len(artifacts) == len(record.artifacts) else None  # its model may be left behind
    return record.model_copy(update={"artifacts": artifacts, "children": children, "registry": registry})
