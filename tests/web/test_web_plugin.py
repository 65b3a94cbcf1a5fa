"""The Airflow plugin: valid for Airflow's plugin manager, and its page guarded by Airflow's own JWT auth."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.timeout(300)


def test_plugin_shape_is_what_airflow_accepts():
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from airflow.plugins_manager import is_valid_plugin

    from carbonflow.web.plugin import CarbonflowPlugin

    assert is_valid_plugin(CarbonflowPlugin)
    (app,) = CarbonflowPlugin.fastapi_apps
    assert not any(app["url_prefix"].startswith(p) for p in RESERVED_URL_PREFIXES)
    (view,) = CarbonflowPlugin.external_views
    assert view["href"] == f"{app['url_prefix']}/carbon" and view["destination"] == "nav"
    assert view["icon"].startswith(app["url_prefix"] + "/static/")


def test_page_needs_an_airflow_token(airflow_db, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER", "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
    )
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "carbonflow-test-secret-" + "x" * 48)
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from carbonflow.web.app import airflow_auth_dependency, airflow_readable_dags, create_app

    manager = create_auth_manager()
    manager.init()
    token = manager.generate_jwt(SimpleAuthManagerUser(username="ops", role="viewer"))
    client = TestClient(create_app(dependencies=[airflow_auth_dependency()], readable_dags=airflow_readable_dags()))
    assert client.get("/healthz").status_code == 401
    assert client.get("/healthz", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.get("/healthz", cookies={"_token": token}).status_code == 200  # the Airflow UI's session cookie
    assert client.get("/healthz", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    assert client.get("/static/carbonflow.css").status_code == 401  # assets too need a login (review finding)
    assert client.get("/static/carbonflow.css", cookies={"_token": token}).status_code == 200
    # the auth manager (here Airflow's SimpleAuthManager, a viewer) decides which DAGs' runs the user sees
    assert client.get("/api/runs", cookies={"_token": token}).status_code == 200
    assert client.get("/openapi.json", cookies={"_token": token}).status_code == 404
