"""The Carbon page against a real MLflow store holding runs logged by carbonflow's tracking module."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from carbonflow.carbon.replay import ReplayProvider
from carbonflow.domain import Config, DeviceEnergy, JobSpec, Plan, RunResult
from carbonflow.tracking.logger import log_training_run
from carbonflow.web.app import create_app, render_page
from carbonflow.web.data import (
    PageData,
    UpcomingJob,
    decode_next_kwargs,
    latest_runs,
    page_forecast,
    upcoming_from_state,
)

pytestmark = pytest.mark.timeout(120)


def _spec(name: str) -> JobSpec:
    return JobSpec(name=name, workload="digits_cnn", epochs=2, region="GB", device_kind="cpu")


def _job_json(name: str) -> dict:
    from carbonflow.workloads.catalog import DIGITS_CNN

    return JobSpec.model_validate({**DIGITS_CNN, "name": name}).model_dump(mode="json")


def _plan(name: str, start: datetime, duration_s: float = 5400, energy_j: float = 7.2e5) -> Plan:
    return Plan(
        job=name,
        config=Config(containers=1, power_limit_w=175),
        start=start,
        finish_by=start + timedelta(hours=8),
        predicted_duration_s=duration_s,
        predicted_energy_j=energy_j,
        predicted_emissions_g=energy_j / 3.6e6 * 150,
        region="GB",
        forecast_provider="replay:neso",
        signal_kind="average-direct",
        replay=True,
        reason=f"{name}: lowest-carbon window before finish-by",
    )


def _result(name: str, start: datetime, energy_j: float, accuracy: float, saving_g: float) -> RunResult:
    emissions = energy_j / 3.6e6 * 150
    return RunResult(
        job=name,
        config=Config(containers=1, power_limit_w=175),
        started_at=start,
        ended_at=start + timedelta(seconds=60),
        duration_s=60,
        devices=[DeviceEnergy(device_id="cpu0", device_model="cpu", kind="cpu", energy_j=energy_j, label="estimated")],
        energy_gpu_j=0,
        energy_cpu_j=energy_j,
        energy_total_j=energy_j,
        energy_labels=["estimated"],
        emissions_g=emissions,
        carbon_intensity_mean_gco2_per_kwh=150,
        samples=1000,
        throughput_samples_per_s=16.7,
        metrics={"test_accuracy": accuracy},
        emissions_run_now_default_g=emissions + saving_g,
        saving_g=saving_g,
        saving_fraction=saving_g / (emissions + saving_g),
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow SQLite store with three training runs of two jobs, logged by carbonflow.tracking."""
    home = tmp_path_factory.mktemp("cfhome")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    t = datetime(2023, 3, 14, 1, 0, tzinfo=UTC)
    logged = []
    for name, offset_h, energy_j, acc, saving in [
        ("digits_cnn", 0, 36000.0, 0.971, 0.4),
        ("resnet_nightly", 1, 72000.0, 0.912, 1.1),
        ("digits_cnn", 24, 30000.0, 0.975, 0.5),
    ]:
        start = t + timedelta(hours=offset_h)
        outcome = log_training_run(
            _spec(name),
            _plan(name, start),
            _result(name, start, energy_j, acc, saving),
            tracking_uri=uri,
            spool_dir=home / "spool",
        )
        assert not outcome.spooled, outcome.message
        logged.append(outcome.run_id)
    return uri, logged


def _upcoming() -> list[UpcomingJob]:
    replay = ReplayProvider.default()
    first, _ = replay.replay_window()
    forecast = replay.forecast("GB", first, 24 * 3600)
    return [
        UpcomingJob(
            plan=_plan("digits_cnn", first + timedelta(hours=3)),
            forecast=forecast,
            dag_id="nightly_retrain",
            run_id="r1",
            task_id="train_digits_cnn",
        ),
        UpcomingJob(plan=_plan("resnet_nightly", first + timedelta(hours=5), duration_s=7200), forecast=forecast),
    ]


def test_latest_runs_reads_every_job_newest_first(store):
    uri, run_ids = store
    rows = latest_runs(uri, limit=10)
    assert [r.run_id for r in rows] == list(reversed(run_ids))
    newest = rows[0]
    assert newest.job == "digits_cnn"
    assert newest.energy_total_j == pytest.approx(30000)
    assert newest.emissions_g == pytest.approx(30000 / 3.6e6 * 150)
    assert newest.test_accuracy == pytest.approx(0.975)
    assert newest.saving_g == pytest.approx(0.5)
    assert "estimated" in newest.energy_labels
    assert newest.replay is True
    assert len(latest_runs(uri, limit=2)) == 2
    with pytest.raises(ValueError, match="limit=0"):
        latest_runs(uri, limit=0)


def test_carbon_page_renders_chart_windows_and_run_table(store):
    uri, run_ids = store
    client = TestClient(create_app(tracking_uri=uri, upcoming_source=_upcoming))
    response = client.get("/carbon")
    assert response.status_code == 200
    html = response.text
    # chart: a forecast line with one step per slot and a band per waiting job
    line = re.search(r'<path id="forecast-line" d="([^"]+)"[^>]*data-points="(\d+)"', html)
    assert line and int(line.group(2)) >= 40  # 24 h of half-hour slots, shipped NESO replay
    windows = re.findall(r'<rect class="planned-window" id="planned-window-\d" data-job="([^"]+)"', html)
    assert windows == ["digits_cnn", "resnet_nightly"]
    assert "replay" in re.search(r'<p class="sub" id="forecast-source">(.*?)</p>', html).group(1)
    # run table: one row per run with energy, emissions, accuracy, savings
    rows = re.findall(r'<tr class="run-row" data-run-id="([0-9a-f]+)">(.*?)</tr>', html)
    assert [r[0] for r in rows] == list(reversed(run_ids))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1])
    assert cells[0] == "digits_cnn"
    assert cells[4] == "30 kJ"  # one energy unit family (J, kJ, MJ) across carbonflow
    assert cells[7] == "0.975"
    assert "estimated" in cells[10] and "replay" in cells[10]
    # waiting jobs table
    assert len(re.findall(r'<tr class="upcoming-row">', html)) == 2
    # assets are served by the app itself (no CDN)
    head = re.sub(r'xmlns="[^"]+"', "", html.split("<body>")[0])
    assert 'href="static/carbonflow.css"' in html and "http" not in head
    assert client.get("/static/carbonflow.css").status_code == 200
    assert client.get("/static/leaf.svg").headers["content-type"].startswith("image/svg")


def test_json_endpoints(store):
    uri, run_ids = store
    client = TestClient(create_app(tracking_uri=uri, upcoming_source=_upcoming))
    runs = client.get("/api/runs", params={"limit": 2}).json()
    assert [r["run_id"] for r in runs] == list(reversed(run_ids))[:2]
    assert runs[0]["energy_total_kwh"] == pytest.approx(30000 / 3.6e6)
    fc = client.get("/api/forecast").json()
    assert fc["forecast"]["region"] == "GB" and fc["forecast"]["replay"] is True
    assert [u["plan"]["job"] for u in fc["upcoming"]] == ["digits_cnn", "resnet_nightly"]
    assert client.get("/api/forecast", params={"region": "Atlantis"}).status_code == 400


def test_page_without_waiting_jobs_uses_the_chain_replay_and_says_so(store, monkeypatch):
    uri, _ = store
    monkeypatch.setenv("CARBONFLOW_CARBON_MODE", "replay")
    html = TestClient(create_app(tracking_uri=uri)).get("/carbon").text
    assert 'id="forecast-line"' in html and 'id="upcoming-empty"' in html
    assert "replay" in re.search(r'id="forecast-source">(.*?)</p>', html).group(1)
    monkeypatch.setenv("CARBONFLOW_CARBON_MODE", "sometimes")
    response = TestClient(create_app(tracking_uri=uri)).get("/carbon")
    assert response.status_code == 400 and "CARBONFLOW_CARBON_MODE='sometimes'" in response.json()["detail"]


def test_mlflow_down_is_shown_not_raised(monkeypatch):
    # a tracking server URI where nothing listens: the page still renders, with the error named
    html = TestClient(create_app(tracking_uri="http://127.0.0.1:9", upcoming_source=_upcoming)).get("/carbon").text
    assert "MLflow unavailable at http://127.0.0.1:9" in html
    assert 'id="forecast-line"' in html and "No training runs yet." in html


def test_upcoming_from_operator_state_and_empty_render():
    first = datetime(2023, 3, 14, 0, 0, tzinfo=UTC)
    plan = _plan("digits_cnn", first)
    v1 = {"job": _job_json("digits_cnn"), "plan": plan.model_dump(mode="json"), "first_now": first.isoformat(),
          "forecast": None, "replans": 0}  # fmt: skip
    [job] = upcoming_from_state({"state": v1}, dag_id="d")  # as carbonflow 0.1.0 stored it
    assert job.plan == plan and job.forecast is None and job.dag_id == "d"
    assert upcoming_from_state({"something": 1}) == []
    html = render_page(PageData(forecast=None, upcoming=[], runs=[], tracking_uri="sqlite:///x"))
    assert "No forecast" in html and "No training runs yet." in html


def test_forecast_of_a_waiting_job_is_preferred():
    upcoming = _upcoming()
    assert page_forecast(upcoming) is upcoming[0].forecast


def test_deferred_task_state_as_airflow_stores_it_is_decoded():
    """The worker serialises ``defer(kwargs=...)`` with Airflow's serde before it reaches the DB."""
    from airflow.sdk.serde import serialize

    from carbonflow.session import GroupMember, WaitState

    up = _upcoming()[0]
    pair = [GroupMember(job=_job_json(name), plan=up.plan.model_copy(update={"job": name})) for name in ("a", "b")]
    state = WaitState(members=pair, first_now=up.plan.start, forecast=up.forecast)
    stored = serialize({"state": state.model_dump(mode="json")})
    jobs = upcoming_from_state(decode_next_kwargs(stored), dag_id="nightly_retrain")
    assert [j.plan.job for j in jobs] == ["a", "b"]  # a pair sharing a GPU shows both jobs
    assert jobs[0].forecast == up.forecast and jobs[0].dag_id == "nightly_retrain"
