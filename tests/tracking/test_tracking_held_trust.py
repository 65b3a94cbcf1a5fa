"""Findings (issue #21): the ``held_runs`` XCom was trusted — a ``../`` file name wrote outside the delivery's
temporary folder, an absolute artifact path was read and uploaded, the record picked its own tracking URI —
and a held run put up to 64 MiB into XCom. Now a held run carries plain file names and their bytes only, is
written to the deployment's store, and is at most HELD_RUN_MAX_KIB KiB (refused at hold time when bigger).

Every delivery here goes to a real MLflow store (the test's migrated SQLite under its carbonflow home).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from carbonflow.tracking import schema
from carbonflow.tracking.held import (
    HELD_FORMAT_VERSION,
    HELD_RUN_MAX_KIB,
    HeldRunRefused,
    deliver_held,
    hold_run,
    hold_runs,
)
from carbonflow.tracking.records import ArtifactFile, RunRecord, SpoolEntryMeta, TrackingOutcome
from carbonflow.tracking.spool import write_spool
from carbonflow.tracking.store import client_for, find_run_by_key, get_experiment_id


def _record(key: str, **update: Any) -> RunRecord:
    now_ms = int(time.time() * 1000)
    record = RunRecord(idempotency_key=key, job="trust", kind="training", experiment="carbonflow/trust",
                       run_name="trust", start_time_ms=now_ms, end_time_ms=now_ms)  # fmt: skip
    return record.model_copy(update=update)


def _spooled(home: Path, record: RunRecord, uri: str = "http://127.0.0.1:9/") -> dict[str, Any]:
    """A run spooled on this worker (MLflow was down), as the training task's outcome JSON."""
    entry = write_spool(record, uri, root=home / "spool", reason="test outage")
    outcome = TrackingOutcome(tracking_uri=uri, idempotency_key=record.idempotency_key, spooled=True,
                              spool_path=str(entry.path))  # fmt: skip
    return outcome.model_dump(mode="json")


def _forged(key: str, files: dict[str, bytes], artifacts: list[ArtifactFile], uri: str) -> dict[str, Any]:
    """A held run as someone who can write XCom rows writes it."""
    meta = SpoolEntryMeta(tracking_uri=uri, record=_record(key, artifacts=artifacts))
    encoded = {name: base64.b64encode(data).decode() for name, data in files.items()}
    return {"format_version": HELD_FORMAT_VERSION, "entry": meta.model_dump(mode="json"), "files": encoded,
            "left_on_worker": []}  # fmt: skip


def _logged_runs(uri: str, key: str) -> list[Any]:
    client = client_for(uri)
    experiment = get_experiment_id(client, "carbonflow/trust")
    run = None if experiment is None else find_run_by_key(client, experiment, key)
    return [] if run is None else [run]


def _store(home: Path) -> str:
    return f"sqlite:///{home / 'mlflow.db'}"


def test_a_held_run_keeps_plain_names_and_is_delivered_with_its_files(home: Path, tmp_path: Path) -> None:
    plan, trace = tmp_path / "plan.json", tmp_path / "trace.csv"
    plan.write_text('{"plan": 1}')
    trace.write_text("time_s,power_w\n0,100\n")
    key = f"ok-{uuid.uuid4().hex[:8]}"
    record = _record(key, artifacts=[ArtifactFile(file=str(plan)), ArtifactFile(file=str(trace), artifact_path="t")])
    held = json.loads(json.dumps(hold_run(_spooled(home, record))))  # as XCom stores it
    assert sorted(held["files"]) == ["plan.json", "trace.csv"] and held["left_on_worker"] == []
    assert [a["file"] for a in held["entry"]["record"]["artifacts"]] == ["plan.json", "trace.csv"]
    assert schema.T_HELD_WITHOUT not in held["entry"]["record"]["tags"]  # nothing was left behind
    run_id = deliver_held(held)
    paths = {a.path for a in client_for(_store(home)).list_artifacts(run_id)}
    assert paths == {"plan.json", "t"}


@pytest.mark.parametrize("name", ["../../{outside}/planted", "../{outside}", "..", "a/../../{outside}"])
def test_held_run_with_dotdot_name_writes_nothing_outside(home: Path, name: str) -> None:
    outside = f"carbonflow-outside-{uuid.uuid4().hex[:8]}"
    name = name.format(outside=outside)
    held = _forged(f"dotdot-{uuid.uuid4().hex[:8]}", {name: b"forged"}, [ArtifactFile(file=name)], _store(home))
    tmp_root = Path(tempfile.gettempdir())
    before = set(tmp_root.parent.glob("carbonflow-outside-*")) | set(tmp_root.glob("carbonflow-outside-*"))
    with pytest.raises(HeldRunRefused, match="allowed: a plain file name"):
        deliver_held(held)
    after = set(tmp_root.parent.glob("carbonflow-outside-*")) | set(tmp_root.glob("carbonflow-outside-*"))
    assert after == before
    assert not _logged_runs(_store(home), held["entry"]["record"]["idempotency_key"])


def test_held_run_cannot_upload_an_absolute_path(home: Path, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("the worker's secret")
    key = f"abs-{uuid.uuid4().hex[:8]}"
    for files in ({}, {"host-secret": b"forged"}):  # with and without bytes of that name in the row
        held = _forged(key, files, [ArtifactFile(file=str(secret), artifact_path="stolen")], _store(home))
        with pytest.raises(HeldRunRefused, match=f"artifact file '{secret}' holds '/'"):
            deliver_held(held)
    held = _forged(key, {}, [ArtifactFile(file="host-secret", artifact_path="stolen")], _store(home))
    with pytest.raises(HeldRunRefused, match=r"artifact file\(s\) \['host-secret'\] are not carried"):
        deliver_held(held)  # a plain name is not looked up anywhere but in the row's own bytes
    assert not _logged_runs(_store(home), key)


def test_held_run_cannot_choose_its_tracking_uri(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from carbonflow.operators.delivery import DeliverHeldRunsOperator

    key = f"uri-{uuid.uuid4().hex[:8]}"
    held = json.loads(json.dumps(hold_run(_spooled(home, _record(key)))))
    attacker = tmp_path / "attacker" / "mlflow.db"
    held["entry"]["tracking_uri"] = f"sqlite:///{attacker}"
    deployment = _store(home)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", deployment)

    class _Ti:
        def xcom_pull(self, task_ids: list[str], key: str) -> list[Any]:
            return [[held]]

    op = DeliverHeldRunsOperator(task_id="deliver_runs", training_task_ids=["train"])
    delivered = op.execute({"ti": _Ti()})["delivered"]
    assert not attacker.exists() and not attacker.parent.exists()
    [run] = _logged_runs(deployment, key)
    assert delivered == {key: run.info.run_id}


def test_held_run_over_the_size_cap_is_refused(home: Path, tmp_path: Path) -> None:
    # a record too big to hold even without its files: refused at hold time, by name and size
    key = f"big-{uuid.uuid4().hex[:8]}"
    big = _record(key, params={f"p{i}": "x" * 5000 for i in range(HELD_RUN_MAX_KIB // 4)})
    with pytest.raises(HeldRunRefused, match=rf"held run {key} is \d+ KiB without any file, over the "
                       rf"{HELD_RUN_MAX_KIB} KiB cap \(HELD_RUN_MAX_KIB\).*stays in this worker's spool"):  # fmt: skip
        hold_run(_spooled(home, big))
    # the training task is told, not failed (a retry would train again): the run stays in the spool
    small = _record(f"small-{uuid.uuid4().hex[:8]}")
    held, warnings = hold_runs([_spooled(home, big.model_copy(update={"idempotency_key": key + "-2"})),
                                _spooled(home, small)])  # fmt: skip
    assert [h["entry"]["record"]["idempotency_key"] for h in held] == [small.idempotency_key]
    assert len(warnings) == 1 and "stays in this worker's spool" in warnings[0]
    # a file over the cap stays on the worker; the held run is within the cap and says what it left
    model, plan = tmp_path / "model.pt", tmp_path / "plan.json"
    model.write_bytes(os.urandom(HELD_RUN_MAX_KIB * 1024))
    plan.write_text('{"plan": 1}')
    key = f"file-{uuid.uuid4().hex[:8]}"
    record = _record(key, artifacts=[ArtifactFile(file=str(plan)), ArtifactFile(file=str(model), artifact_path="m")])
    held = hold_run(_spooled(home, record))
    assert len(json.dumps(held).encode()) <= HELD_RUN_MAX_KIB * 1024
    assert list(held["files"]) == ["plan.json"] and held["left_on_worker"][0].endswith("model.pt")
    assert "model.pt" in held["entry"]["record"]["tags"][schema.T_HELD_WITHOUT]
    run_id = deliver_held(held)
    assert {a.path for a in client_for(_store(home)).list_artifacts(run_id)} == {"plan.json"}
    # and a row written over the cap by hand is refused at delivery
    forged = _forged(f"fat-{uuid.uuid4().hex[:8]}", {"model.pt": os.urandom(2 << 20)},
                     [ArtifactFile(file="model.pt")], _store(home))  # fmt: skip
    with pytest.raises(HeldRunRefused, match=rf"over the {HELD_RUN_MAX_KIB} KiB cap"):
        deliver_held(forged)


def test_a_held_run_with_unknown_keys_or_stray_files_is_refused_by_name(home: Path) -> None:
    held = _forged(f"odd-{uuid.uuid4().hex[:8]}", {"a.txt": b"a"}, [ArtifactFile(file="a.txt")], _store(home))
    with pytest.raises(HeldRunRefused, match=r"unknown key\(s\) \['tracking_uri'\]"):
        deliver_held({**held, "tracking_uri": "sqlite:////tmp/elsewhere.db"})
    with pytest.raises(HeldRunRefused, match=r"carries file\(s\) \['b.txt'\] that no artifact"):
        deliver_held({**held, "files": {**held["files"], "b.txt": base64.b64encode(b"b").decode()}})
    with pytest.raises(HeldRunRefused, match="format_version=1 is not one this carbonflow reads"):
        deliver_held({**held, "format_version": 1})
