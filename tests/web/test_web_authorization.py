"""The Carbon page authorizes, answers nothing without login, and never waits on a live provider (issue 12).

Findings: any logged-in user saw every carbonflow task and run of every DAG; ``/docs``, ``/openapi.json``,
``/redoc`` and ``/static`` answered without login; a page load could wait on live carbon APIs (10 s
timeout × retries × providers) in the API server's thread pool.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import Depends, HTTPException, Request
from fastapi.testclient import TestClient
from test_web_carbon_page import _plan, _result, _spec

from carbonflow.carbon.replay import ReplayProvider
from carbonflow.tracking import schema
from carbonflow.tracking.logger import log_training_run
from carbonflow.web.app import create_app
from carbonflow.web.data import ReadableDags, UpcomingJob

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two_dag_store(tmp_path_factory):
    """Runs of DAG ``team_a``, of DAG ``team_b``, and one logged outside Airflow (no DAG tag)."""
    home = tmp_path_factory.mktemp("cfhome")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    start = datetime(2023, 3, 14, 1, 0, tzinfo=UTC)
    for i, (job, dag) in enumerate([("job-a", "team_a"), ("job-b", "team_b"), ("job-cli", None)]):
        at = start + timedelta(hours=i)
        provenance = {schema.T_DAG_ID: dag} if dag else None
        log_training_run(_spec(job), _plan(job, at), _result(job, at, 36000.0, 0.97, 0.4), tracking_uri=uri,
                         spool_dir=home / "spool", provenance=provenance)  # fmt: skip
    return uri


def _waiting() -> list[UpcomingJob]:
    replay = ReplayProvider.default()
    first, _ = replay.replay_window()
    forecast = replay.forecast("GB", first, 24 * 3600)
    return [
        UpcomingJob(plan=_plan("job-a", first + timedelta(hours=2)), forecast=forecast, dag_id="team_a"),
        UpcomingJob(plan=_plan("job-b", first + timedelta(hours=3)), forecast=forecast, dag_id="team_b"),
    ]


def _only(*dag_ids: str, every: bool = False):
    return lambda: ReadableDags(dag_ids=set(dag_ids), all_dags=every)


def test_carbon_page_hides_dags_the_user_cannot_read(two_dag_store):
    app = create_app(tracking_uri=two_dag_store, upcoming_source=_waiting, readable_dags=_only("team_a"))
    client = TestClient(app)
    html = client.get("/carbon").text
    assert "job-a" in html and "job-b" not in html and "job-cli" not in html
    assert [r["job"] for r in client.get("/api/runs").json()] == ["job-a"]
    assert [u["plan"]["job"] for u in client.get("/api/forecast").json()["upcoming"]] == ["job-a"]


def test_a_user_who_may_read_every_dag_sees_runs_logged_outside_airflow(two_dag_store):
    app = create_app(tracking_uri=two_dag_store, upcoming_source=_waiting, readable_dags=_only(every=True))
    jobs = {r["job"] for r in TestClient(app).get("/api/runs").json()}
    assert jobs == {"job-a", "job-b", "job-cli"}


def _login_required(request: Request) -> None:
    if request.headers.get("Authorization") != "Bearer ok":
        raise HTTPException(status_code=401, detail="not authenticated")


@pytest.mark.parametrize(
    "path", ["/carbon", "/api/runs", "/api/forecast", "/static/leaf.svg", "/static/carbonflow.css"]
)
def test_no_route_answers_without_login(two_dag_store, path):
    app = create_app(tracking_uri=two_dag_store, dependencies=[Depends(_login_required)])
    client = TestClient(app)
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer ok"}).status_code == 200


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_docs_routes_do_not_exist(path):
    client = TestClient(create_app(tracking_uri="sqlite:///:memory:", dependencies=[Depends(_login_required)]))
    assert client.get(path, headers={"Authorization": "Bearer ok"}).status_code == 404


def test_static_serves_only_the_pages_own_files():
    client = TestClient(create_app(tracking_uri="sqlite:///:memory:"))
    assert client.get("/static/../app.py").status_code == 404
    assert client.get("/static/leaf.svg").headers["content-type"].startswith("image/svg+xml")


def test_page_load_never_waits_on_a_live_provider(two_dag_store, monkeypatch):
    """A provider that hangs for 30 s: the page answers within the bound and says the forecast is coming."""
    from carbonflow.web import app as web_app

    real = web_app.page_forecast

    def hanging(upcoming, region=None, now=None):
        if not upcoming:
            time.sleep(30)
        return real(upcoming, region, now)

    monkeypatch.setattr(web_app, "page_forecast", hanging)
    client = TestClient(create_app(tracking_uri=two_dag_store, forecast_wait_s=1.0))
    t0 = time.monotonic()
    response = client.get("/carbon")
    assert time.monotonic() - t0 < 10
    assert response.status_code == 200 and "being fetched" in response.text
    assert client.get("/api/forecast").status_code == 503


def test_a_fetched_forecast_is_served_from_the_cache(two_dag_store, monkeypatch):
    from carbonflow.web import app as web_app

    calls = []
    real = web_app.page_forecast
    monkeypatch.setattr(web_app, "page_forecast", lambda u, r=None, now=None: calls.append(r) or real(u, r, now))
    client = TestClient(create_app(tracking_uri=two_dag_store))
    for _ in range(3):
        assert client.get("/api/forecast").status_code == 200
    assert len(calls) == 1
