"""An MLflow outage mid-run (server stopped, later restarted on the same port) loses no run and duplicates none."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
import tracking_factories as f
from tracking_server_process import MlflowServer

from carbonflow.tracking import schema
from carbonflow.tracking.history import latest_profile, realised_vs_predicted
from carbonflow.tracking.logger import log_profile, log_training_run
from carbonflow.tracking.spool import pending, replay_spool
from carbonflow.tracking.store import client_for, search_all_runs, tag_filter


def _night(job: str, i: int):
    start = f.T0 + timedelta(days=i, hours=6)
    plan = f.plan(job, start=start)
    result = f.result(job, started_at=start, duration_s=500.0 + 10 * i, emissions_g=2.0 + 0.1 * i)
    return plan, result


@pytest.mark.slow
def test_outage_mid_run_leaves_every_run_exactly_once(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    spec = f.job_spec(job_name)
    keys: list[str] = []

    # night 1 and a profile: server up
    plan, result = _night(job_name, 1)
    first = log_training_run(spec, plan, result, power_trace_csv=files["trace"], tracking_uri=server.uri)
    assert not first.spooled
    keys.append(first.idempotency_key)
    assert not log_profile(spec, f.profile(job_name, measured_at=f.T0), tracking_uri=server.uri).spooled

    # outage: the server is stopped; runs go to the spool within seconds and the caller is told so
    server.stop()
    plan, result = _night(job_name, 2)
    t0 = time.monotonic()
    second = log_training_run(
        spec, plan, result, power_trace_csv=files["trace"], model_path=files["model"], tracking_uri=server.uri
    )
    assert time.monotonic() - t0 < 20, "an outage must be detected in seconds"
    assert second.spooled and second.run_id is None
    assert "unavailable" in second.message and "spool" in second.message
    assert Path(second.spool_path).is_dir()
    keys.append(second.idempotency_key)
    fresh = f.profile(job_name, measured_at=f.T0 + timedelta(days=2))
    spooled_profile = log_profile(spec, fresh, tracking_uri=server.uri)
    assert spooled_profile.spooled
    # the planner still reads what waits in the spool while the server is down
    assert latest_profile(
        job_name, "NVIDIA A40", "7", 7 * 86400, f.T0 + timedelta(days=2), tracking_uri=server.uri
    ) == (fresh)
    waiting_rows = realised_vs_predicted(job_name, tracking_uri=server.uri)
    assert [r.source for r in waiting_rows] == ["spool"]
    with pytest.raises(Exception, match="cannot read tracking store"):
        realised_vs_predicted(job_name, tracking_uri=server.uri, strict=True)

    # the server returns, then dies again in the middle of writing the replayed night-2 run
    server.start()
    original = MlflowClient.log_artifact
    died: list[str] = []

    def dying_log_artifact(self, run_id, local_path, artifact_path=None):
        if not died:
            died.append(run_id)
            server.stop()
        return original(self, run_id, local_path, artifact_path)

    plan, result = _night(job_name, 3)
    with monkeypatch.context() as patched:
        patched.setattr(MlflowClient, "log_artifact", dying_log_artifact)
        third = log_training_run(spec, plan, result, tracking_uri=server.uri)
    assert third.spooled, "night 3 must wait behind the half-written night 2"
    keys.append(third.idempotency_key)
    assert died, "the fault was injected"
    assert len(pending(tracking_uri=server.uri)) == 3

    # back for good: replay writes the waiting runs once, resuming the half-written one
    server.start()
    assert replay_spool(server.uri) == 3
    assert replay_spool(server.uri) == 0
    assert pending() == []

    client = client_for(server.uri)
    experiment_id = client.get_experiment_by_name(schema.experiment_name(job_name)).experiment_id
    training = search_all_runs(client, [experiment_id], tag_filter(schema.T_KIND, "training"), include_deleted=True)
    by_key = {r.data.tags[schema.T_IDEMPOTENCY_KEY]: r for r in training}
    assert len(training) == 3 and set(by_key) == set(keys)
    assert by_key[second.idempotency_key].info.run_id == died[0], "the half-written run was resumed, not duplicated"
    for run in training:
        assert run.info.status == "FINISHED"
        assert run.data.tags[schema.T_COMPLETE] == "true"
        assert set(schema.TRAINING_REQUIRED_METRICS) <= set(run.data.metrics)
    assert [by_key[k].data.tags[schema.T_RECURRENCE] for k in keys] == ["1", "2", "3"]
    assert [by_key[k].data.tags[schema.T_SPOOLED] for k in keys] == ["false", "true", "true"]
    night2 = by_key[second.idempotency_key].info.run_id
    names = {a.path for a in client.list_artifacts(night2)} | {a.path for a in client.list_artifacts(night2, "model")}
    assert {"plan.json", "result.json", "power_trace.csv", "pareto.png", "model/model.pt"} <= names
    versions = client.search_model_versions(f"name = 'carbonflow-{job_name}'")
    assert sorted(v.run_id for v in versions) == [night2]

    profiles = search_all_runs(client, [experiment_id], tag_filter(schema.T_KIND, "profile"), include_deleted=True)
    points = search_all_runs(client, [experiment_id], tag_filter(schema.T_KIND, "profile-point"), include_deleted=True)
    assert len(profiles) == 2 and len(points) == 2 * len(fresh.points)
    rows = realised_vs_predicted(job_name, tracking_uri=server.uri)
    assert [(r.recurrence, r.source) for r in rows] == [(1, "mlflow"), (2, "mlflow"), (3, "mlflow")]
    log_lines = [json.loads(line) for line in (home / "spool" / "replayed.jsonl").read_text().splitlines()]
    assert {line["idempotency_key"] for line in log_lines} >= set(keys)
