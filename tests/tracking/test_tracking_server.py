"""Against a real MLflow server (SQLite and PostgreSQL): schema on real runs, registry, history queries."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import tracking_factories as f
from PIL import Image
from tracking_server_process import MlflowServer

from carbonflow.tracking import schema
from carbonflow.tracking.history import (
    job_history,
    latest_profile,
    realised_vs_predicted,
)
from carbonflow.tracking.logger import log_profile, log_training_run
from carbonflow.tracking.store import client_for


def _artifacts(client: Any, run_id: str, path: str | None = None) -> set[str]:
    found: set[str] = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def test_training_run_carries_full_schema_and_artifacts(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path], tmp_path: Path
) -> None:
    spec = f.job_spec(job_name)
    profile = f.profile(job_name)
    result = f.result(job_name)
    outcome = log_training_run(
        spec,
        f.plan(job_name),
        result,
        profile=profile,
        forecast=f.forecast(),
        actual_points=f.actual_points(),
        power_trace_csv=files["trace"],
        model_path=files["model"],
        tracking_uri=server.uri,
    )
    assert not outcome.spooled, outcome.reason
    assert outcome.model_version == "1"
    client = client_for(server.uri)
    run = client.get_run(outcome.run_id)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == f"carbonflow/{job_name}"
    assert run.info.status == "FINISHED"
    assert set(schema.TRAINING_REQUIRED_METRICS) <= set(run.data.metrics)
    assert set(schema.TRAINING_REQUIRED_PARAMS) <= set(run.data.params)
    assert set(schema.TRAINING_REQUIRED_TAGS) <= set(run.data.tags)
    m, p, t = run.data.metrics, run.data.params, run.data.tags
    assert m["energy_total_j"] == result.energy_total_j
    assert m["energy_total_kwh"] == pytest.approx(result.energy_total_j / 3.6e6)
    assert m["emissions_g"] == result.emissions_g
    assert m["test_accuracy"] == 0.95
    assert m["saving_g"] == pytest.approx(result.saving_g)
    assert m["emissions_run_now_default_g"] == 5.0
    assert m["predicted_emissions_g"] == 3.0
    assert p["power_limit_w"] == "200" and p["containers"] == "1" and p["batch_size"] == "64"
    assert p["planned_start"] == f.plan(job_name).start.isoformat()
    assert p["actual_start"] == result.started_at.isoformat()
    assert p["forecast_provider"] == "neso-replay" and p["signal_kind"] == "average-direct"
    assert p["colocated_jobs"] == "none"
    assert t["carbonflow.job"] == job_name and t["carbonflow.kind"] == "training"
    assert t["carbonflow.recurrence"] == "1"
    assert t["carbonflow.energy_labels"] == "measured,estimated"
    assert t["carbonflow.replay"] == "true"
    assert t["carbonflow.device_model"] == "NVIDIA A40"
    assert t["carbonflow.device_uuids"] == "GPU-0aa1,cpu0"
    assert t["carbonflow.spooled"] == "false" and t["carbonflow.complete"] == "true"

    artifacts = _artifacts(client, outcome.run_id)
    assert {"plan.json", "result.json", "power_trace.csv", "pareto.png", "forecast.png", "forecast.json"} <= artifacts
    assert "model/model.pt" in artifacts
    local = Path(client.download_artifacts(outcome.run_id, "forecast.png", str(tmp_path)))
    assert Image.open(local).size == (1000, 500)
    local = Path(client.download_artifacts(outcome.run_id, "power_trace.csv", str(tmp_path)))
    assert local.read_text() == files["trace"].read_text()

    versions = client.search_model_versions(f"name = 'carbonflow-{job_name}'")
    assert len(versions) == 1
    assert versions[0].run_id == outcome.run_id
    assert versions[0].tags["energy_total_j"] == f"{result.energy_total_j:.6g}"
    assert versions[0].tags["emissions_g"] == f"{result.emissions_g:.6g}"
    assert versions[0].tags["test_accuracy"] == "0.95"
    assert not list(home.glob("spool/*-*")), "a written run must leave the spool"


def test_model_below_the_bar_is_not_registered(
    server: MlflowServer, home: Path, job_name: str, files: dict[str, Path]
) -> None:
    outcome = log_training_run(
        f.job_spec(job_name, min_accuracy=0.99),
        f.plan(job_name),
        f.result(job_name, accuracy=0.95),
        model_path=files["model"],
        tracking_uri=server.uri,
    )
    assert outcome.model_version is None and not outcome.spooled
    client = client_for(server.uri)
    tags = client.get_run(outcome.run_id).data.tags
    assert tags["carbonflow.model_registered"] == "false"
    assert "0.9500 < min_accuracy 0.99" in tags["carbonflow.model_registry_note"]
    assert client.search_model_versions(f"name = 'carbonflow-{job_name}'") == []
    assert "model/model.pt" in _artifacts(client, outcome.run_id)  # the weights are kept all the same


def test_profile_run_has_nested_runs_per_configuration(server: MlflowServer, home: Path, job_name: str) -> None:
    profile = f.profile(job_name)
    outcome = log_profile(f.job_spec(job_name), profile, tracking_uri=server.uri)
    assert not outcome.spooled, outcome.reason
    client = client_for(server.uri)
    parent = client.get_run(outcome.run_id)
    assert parent.data.tags["carbonflow.kind"] == "profile"
    assert parent.data.tags["carbonflow.measured_at"] == profile.measured_at.isoformat()
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{outcome.run_id}'"
    )
    assert len(children) == len(profile.points)
    by_key = {c.data.tags["carbonflow.config_key"]: c for c in children}
    for point in profile.points:
        child = by_key[point.config.key()]
        assert child.data.tags["carbonflow.kind"] == "profile-point"
        assert child.data.metrics["throughput_samples_per_s"] == point.throughput_samples_per_s
        assert child.data.metrics["energy_per_sample_j"] == pytest.approx(point.energy_per_sample_j)
        assert child.data.params["power_limit_w"] == f"{point.config.power_limit_w:g}"
    assert {"profile.json", "pareto.png"} <= _artifacts(client, outcome.run_id)


def test_latest_profile_is_fresh_matching_and_newest(server: MlflowServer, home: Path, job_name: str) -> None:
    spec = f.job_spec(job_name)
    old = f.profile(job_name, measured_at=f.T0 - timedelta(days=10))
    newer = f.profile(job_name, measured_at=f.T0 - timedelta(hours=5))
    newest = f.profile(job_name, measured_at=f.T0 - timedelta(hours=1))
    other_gpu = f.profile(job_name, measured_at=f.T0, device_model="NVIDIA V100")
    other_code = f.profile(job_name, measured_at=f.T0, code_version="8")
    for profile in (newest, old, newer, other_gpu, other_code):  # logged out of order on purpose
        assert not log_profile(spec, profile, tracking_uri=server.uri).spooled
    week_s = 7 * 24 * 3600
    found = latest_profile(job_name, "NVIDIA A40", "7", week_s, f.T0, tracking_uri=server.uri)
    assert found == newest
    assert latest_profile(job_name, "NVIDIA A40", "7", 1800, f.T0, tracking_uri=server.uri) is None
    assert latest_profile(job_name, "NVIDIA V100", "7", week_s, f.T0, tracking_uri=server.uri) == other_gpu
    assert latest_profile(job_name, "NVIDIA A40", "8", week_s, f.T0, tracking_uri=server.uri) == other_code
    assert latest_profile(job_name, "NVIDIA A40", "9", week_s, f.T0, tracking_uri=server.uri) is None
    assert latest_profile("never-seen", "NVIDIA A40", "7", week_s, f.T0, tracking_uri=server.uri) is None
    with pytest.raises(ValueError, match=r"now=.*no time zone"):
        latest_profile(job_name, "NVIDIA A40", "7", week_s, f.T0.replace(tzinfo=None), tracking_uri=server.uri)


def test_realised_vs_predicted_and_pair_slowdown(server: MlflowServer, home: Path, job_name: str) -> None:
    partner = job_name + "-b"
    spec = f.job_spec(job_name)
    assert realised_vs_predicted(job_name, tracking_uri=server.uri) == []
    nights = [  # (duration_s, energy_gpu_j, colocated_with)
        (560.0, 65000.0, []),
        (600.0, 70000.0, []),
        (700.0, 80000.0, [partner]),
    ]
    for i, (duration, gpu_j, colocated) in enumerate(nights):
        start = f.T0 + timedelta(days=i, hours=6)
        outcome = log_training_run(
            spec,
            f.plan(job_name, start=start, colocated_with=colocated),
            f.result(job_name, started_at=start, duration_s=duration, energy_gpu_j=gpu_j),
            tracking_uri=server.uri,
        )
        assert not outcome.spooled, outcome.reason
    partner_start = f.T0 + timedelta(days=2, hours=6)
    log_training_run(
        f.job_spec(partner),
        f.plan(partner, start=partner_start, colocated_with=[job_name]),
        f.result(partner, started_at=partner_start, duration_s=800.0),
        tracking_uri=server.uri,
    )

    rows = realised_vs_predicted(job_name, tracking_uri=server.uri)
    assert [r.recurrence for r in rows] == [1, 2, 3]
    assert [r.duration_s for r in rows] == [560.0, 600.0, 700.0]
    assert [r.energy_total_j for r in rows] == [72000.0, 77000.0, 87000.0]
    assert rows[0].predicted_duration_s == 540.0
    assert rows[0].duration_ratio == pytest.approx(560.0 / 540.0)
    assert rows[0].energy_ratio == pytest.approx(72000.0 / 70000.0)
    assert rows[2].colocated_with == (partner,)
    assert rows[0].config_key == "c1-pl200-b64" and rows[0].power_limit_w == 200.0 and rows[0].batch_size == 64
    assert all(r.source == "mlflow" and r.run_id for r in rows)

    solo = sorted([5391 / 560.0, 5391 / 600.0])
    observed_slowdown = sum(solo) / 2 / (5391 / 700.0) - 1  # median solo speed at the config over the pair's

    history = job_history([job_name], tracking_uri=server.uri)
    correction = history.correction(job_name, "c1-pl200-b64")
    assert correction.runs == 3
    assert correction.time_factor == pytest.approx(600.0 / 540.0)
    assert history.pair_slowdown(job_name, partner) == pytest.approx(observed_slowdown)
