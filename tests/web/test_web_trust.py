"""Findings (issue #21) on the Carbon page: its forecast cache was keyed on the raw region string and never
evicted; a password in the tracking URI was shown three times; each request changed ``os.environ``."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from carbonflow.carbon.regions import all_regions
from carbonflow.tracking.uri import redacted_text, redacted_uri
from carbonflow.web.app import create_app, render_page
from carbonflow.web.data import ForecastCache, PageData

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Fetch:
    """A forecast source that counts its calls per region and answers at once."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []
        self._lock = threading.Lock()

    def __call__(self, upcoming: list, region: str | None) -> Any:
        with self._lock:
            self.calls.append(region)
        return f"forecast of {region}"


def test_forecast_cache_is_keyed_on_the_normalised_region_and_bounded() -> None:
    fetch = _Fetch()
    cache = ForecastCache(fetch, wait_s=5.0, max_regions=4)
    for region in ["GB", "gb", " GB", "GB ", "Gb", "GB\t", None]:  # None: the page's default region, GB
        assert cache.get([], region) == "forecast of GB"
    assert fetch.calls == ["GB"] and list(cache._cached) == ["GB"]
    for region in ["G B", "Atlantis", "", "X" + secrets.token_hex(4)]:
        with pytest.raises(ValueError, match=r"is not allowed|is not a known region"):
            cache.get([], region)
    assert list(cache._cached) == ["GB"] and fetch.calls == ["GB"]  # nothing fetched or kept for them
    regions = [r for r in all_regions() if r != "GB"][:20]
    for region in regions:
        cache.get([], region.lower())
    assert len(cache._cached) <= 4 and len(cache._running) <= 4
    assert list(cache._cached) == regions[-4:]  # the least recently used went first
    with pytest.raises(ValueError, match="max_regions=0 is not allowed"):
        ForecastCache(fetch, max_regions=0)


def test_the_page_serves_one_forecast_for_every_spelling_of_a_region(monkeypatch: pytest.MonkeyPatch) -> None:
    from carbonflow.web import app as web_app

    fetch = _Fetch()
    real = web_app.page_forecast
    monkeypatch.setattr(web_app, "page_forecast", lambda u, r=None, now=None: fetch(u, r) and real(u, r, now))
    client = TestClient(create_app(tracking_uri="http://127.0.0.1:9"))
    for region in ["GB", "gb", " gb ", "Gb"]:
        response = client.get("/api/forecast", params={"region": region})
        assert response.status_code == 200 and response.json()["forecast"]["region"] == "GB"
    assert fetch.calls == ["GB"]
    assert client.get("/api/forecast", params={"region": "Atlantis"}).status_code == 400


def test_tracking_password_never_shown_on_the_carbon_page() -> None:
    password = secrets.token_urlsafe(12)
    uri = f"http://carbon:{password}@127.0.0.1:{free_port()}"  # nothing listens: the page shows the error too
    client = TestClient(create_app(tracking_uri=uri))
    html = client.get("/carbon").text
    assert "MLflow unavailable at http://carbon:***@127.0.0.1" in html
    assert f"From MLflow at <code>http://carbon:***@127.0.0.1:{uri.rsplit(':', 1)[1]}</code>" in html
    assert password not in html
    # an error that quotes the URI (a client's exception text) is scrubbed as it is rendered
    page = PageData(forecast=None, upcoming=[], runs=[], tracking_uri=uri,
                    errors=[f"MLflow unavailable: ConnectionError: Max retries for url {uri}/api/2.0/x"])  # fmt: skip
    rendered = render_page(page)
    assert password not in rendered and rendered.count("carbon:***@") == 2


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://carbon:pw-1@mlflow:5000", "http://carbon:***@mlflow:5000"),
        ("postgresql+psycopg2://u:pw-1@db:5432/mlflow", "postgresql+psycopg2://u:***@db:5432/mlflow"),
        ("https://user:pw-1@mlflow.example/path?x=1", "https://user:***@mlflow.example/path?x=1"),
        ("https://mlflow.example/?token=pw-1&x=1", "https://mlflow.example/?token=***&x=1"),
        ("sqlite:////srv/carbonflow/mlflow.db", "sqlite:////srv/carbonflow/mlflow.db"),
        ("http://mlflow:5000", "http://mlflow:5000"),
    ],
)
def test_redacted_uri_hides_the_password_and_keeps_the_rest(uri: str, shown: str) -> None:
    assert redacted_uri(uri) == shown
    if "@" in uri:  # a URL inside an error message loses its password too
        assert redacted_text(f"error at {uri}/api: refused") == f"error at {shown}/api: refused"


def test_a_request_does_not_change_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    from carbonflow.tracking import store

    app = create_app(tracking_uri=f"http://127.0.0.1:{free_port()}")
    started = dict(os.environ)
    assert started["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"  # set once, when the app was made
    seen: list[dict[str, str]] = []
    real = store.client_for

    def client_for(uri: str) -> Any:  # the environment MLflow's client reads its timeouts from, mid-request
        seen.append(dict(os.environ))
        return real(uri)

    monkeypatch.setattr(store, "client_for", client_for)
    client = TestClient(app, raise_server_exceptions=False)
    for path in ("/carbon", "/api/runs", "/carbon?region=gb"):
        assert client.get(path).status_code in (200, 500)
    assert len(seen) == 3 and all(env == started for env in seen)
    assert dict(os.environ) == started
