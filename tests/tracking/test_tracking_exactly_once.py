"""Exactly-once run records (issue 12 findings): a timed-out ``create_run`` that the server committed is not
created twice; spool entries survive a kill mid-write; 0.1.0 entries are still replayed; retries reuse a
run's key and cleared DAG runs get a new one."""

from __future__ import annotations

import http.client
import json
import os
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlparse

import pytest
import tracking_factories as f
from tracking_server_process import MlflowServer, free_port

from carbonflow.tracking import schema
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.spool import ENTRY_FILE, pending, replay_spool, run_idempotency_key, write_spool
from carbonflow.tracking.store import client_for, search_all_runs, tag_filter


class SlowCreateProxy:
    """A real HTTP proxy in front of MLflow that answers the first ``runs/create`` only after ``delay_s``:
    the server has committed the run, the client has timed out (a lost reply)."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port, self.delay_s = upstream_port, delay_s
        self.creates = 0
        self.port = free_port()
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                if urlparse(self.path).path.endswith("/runs/create"):
                    proxy.creates += 1
                    if proxy.creates == 1:
                        time.sleep(proxy.delay_s)  # committed upstream; the client gives up meanwhile
                self.send_response(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_mlflow_create_run_retry_never_makes_two_runs(
    server: MlflowServer, home: Path, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: MLflow's client retried a timed-out ``create_run`` that the server had committed: two runs, one key."""
    proxy = SlowCreateProxy(server.port, delay_s=4)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # the user's retries apply to everything else
    try:
        uri = f"http://127.0.0.1:{proxy.port}"
        plan, result = f.plan(job_name), f.result(job_name)
        outcome = log_training_run(f.job_spec(job_name), plan, result, tracking_uri=uri)
    finally:
        proxy.close()
    client = client_for(server.uri)
    exp = client.get_experiment_by_name(schema.experiment_name(job_name))
    runs = search_all_runs(client, [exp.experiment_id], tag_filter(schema.T_IDEMPOTENCY_KEY, outcome.idempotency_key))
    assert proxy.creates == 1, outcome.reason  # never asked twice
    assert not outcome.spooled, outcome.reason
    assert len(runs) == 1 and not outcome.spooled and outcome.run_id == runs[0].info.run_id
    assert runs[0].data.tags[schema.T_COMPLETE] == "true"


def _spooled_entry(home: Path, job: str):
    from carbonflow.tracking.logger import training_record

    rec = training_record(f.job_spec(job), f.plan(job), f.result(job), workdir=home)
    return write_spool(rec, f"sqlite:///{home / 'mlflow.db'}", root=home / "spool")


def test_spool_entry_killed_mid_write_is_still_replayed(home: Path, job_name: str, monkeypatch) -> None:
    """Before: entries were rewritten in place; a kill mid-write left one that was never replayed."""
    entry = _spooled_entry(home, job_name)
    from carbonflow.tracking import spool

    def killed(src, dst):  # the process dies between writing the new file and renaming it
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(spool.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        spool._spooled(entry, spool.TrackingOutcome(tracking_uri="x", idempotency_key="k"), "outage")
    monkeypatch.undo()
    (waiting,) = pending(root=home / "spool")
    assert waiting.record.idempotency_key == entry.record.idempotency_key
    assert replay_spool(f"sqlite:///{home / 'mlflow.db'}", root=home / "spool") == 1
    assert pending(root=home / "spool") == []


def test_a_0_1_0_spool_entry_is_still_read_and_replayed(home: Path, job_name: str) -> None:
    entry = _spooled_entry(home, job_name)
    old = json.loads((entry.path / ENTRY_FILE).read_text())
    old.pop("format_version")  # what carbonflow 0.1.0 wrote
    (entry.path / ENTRY_FILE).write_text(json.dumps(old))
    (waiting,) = pending(root=home / "spool")
    assert waiting.meta.format_version == 1
    assert replay_spool(f"sqlite:///{home / 'mlflow.db'}", root=home / "spool") == 1


def test_new_spool_entries_carry_their_format_version(home: Path, job_name: str) -> None:
    entry = _spooled_entry(home, job_name)
    assert json.loads((entry.path / ENTRY_FILE).read_text())["format_version"] == 2
    assert not [p for p in entry.path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_a_retry_reuses_the_runs_key_and_a_cleared_run_gets_a_new_one() -> None:
    """Before: keys were random per attempt (a retry logged a second run); a cleared run returned the old one."""
    first_try = run_idempotency_key("nightly", "scheduled__2026-11-24", 0, "train", -1, "resnet")
    retry = run_idempotency_key("nightly", "scheduled__2026-11-24", 0, "train", -1, "resnet")
    cleared = run_idempotency_key("nightly", "scheduled__2026-11-24", 1, "train", -1, "resnet")
    other_group = run_idempotency_key("nightly", "scheduled__2026-11-24", 0, "train", 2, "resnet")
    assert first_try == retry
    assert len({first_try, cleared, other_group}) == 3


def test_logging_twice_with_one_key_makes_one_run(home: Path, job_name: str) -> None:
    uri = f"sqlite:///{home / 'mlflow.db'}"
    key = run_idempotency_key("d", "r", 0, "t", -1, job_name)
    provenance = {schema.T_DAG_ID: "d", schema.T_RUN_KIND: "nightly"}
    a = log_training_run(f.job_spec(job_name), f.plan(job_name), f.result(job_name), tracking_uri=uri,
                         idempotency_key=key, provenance=provenance)  # fmt: skip
    b = log_training_run(f.job_spec(job_name), f.plan(job_name), f.result(job_name), tracking_uri=uri,
                         idempotency_key=key, provenance=provenance)  # fmt: skip
    assert a.run_id == b.run_id
    run = client_for(uri).get_run(a.run_id)
    assert run.data.tags[schema.T_DAG_ID] == "d" and run.data.tags[schema.T_SCHEMA_VERSION] == schema.SCHEMA_VERSION
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") != "0"  # the no-retry window is only around create
