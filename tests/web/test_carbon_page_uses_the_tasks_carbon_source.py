"""Finding (issue #25): offline, the tasks fell back to codecarbon's static 238 g/kWh while the Carbon page showed
the March-2023 replay. The page now resolves its carbon source as the tasks do (``$CARBONFLOW_REPLAY``, else the
live chain with its fallbacks) and names it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from carbonflow.session.source import CarbonSource
from carbonflow.web.app import create_app

pytestmark = pytest.mark.timeout(180)
KEYED = ("CARBONFLOW_ELECTRICITYMAPS_TOKEN", "CARBONFLOW_WATTTIME_USERNAME", "CARBONFLOW_WATTTIME_PASSWORD",
         "CARBONFLOW_CARBON_AWARE_SDK_URL")  # fmt: skip


def _source_name(html: str) -> str:
    found = re.search(r'<b id="carbon-source-name">(.*?)</b>', html)
    assert found, html[:3000]
    return found.group(1)


def _page(tmp_path) -> str:
    app = create_app(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", forecast_wait_s=120)
    return TestClient(app).get("/carbon").text


def test_offline_the_page_shows_the_static_fallback_the_tasks_use_not_the_replay(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CARBONFLOW_REPLAY", "0")  # as `make serve` ran the tasks: live
    monkeypatch.setenv("CARBONFLOW_CARBON_MODE", "replay")  # the page's old default, which showed the replay
    monkeypatch.setenv("CARBONFLOW_NESO_URL", "http://127.0.0.1:9")  # offline: nothing answers
    for name in KEYED:
        monkeypatch.delenv(name, raising=False)
    now = datetime.now(UTC)
    task = CarbonSource(replay=False).forecast("GB", now, now + timedelta(hours=24))  # what a task gets
    assert task.provider == "static:codecarbon" and round(task.points[0].gco2_per_kwh) == 238
    html = _page(tmp_path)
    assert _source_name(html) == task.provider
    source_line = re.search(r'id="forecast-source">(.*?)</p>', html).group(1)
    assert "replay" not in source_line and "static:codecarbon" in source_line
    notes = re.search(r'<p class="notes">(.*?)</p>', html).group(1)
    assert "the tasks&#x27; carbon source: live (CARBONFLOW_REPLAY=0)" in notes
    assert "CARBONFLOW_CARBON_MODE=replay is ignored" in notes
    assert "skipped neso" in notes and "static annual average 238 gCO2/kWh" in notes


def test_with_replay_the_page_names_the_replay_the_tasks_use(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CARBONFLOW_REPLAY", "1")
    monkeypatch.delenv("CARBONFLOW_CARBON_MODE", raising=False)
    source = CarbonSource(replay=True)
    start = source.replay_window("GB")[0]
    html = _page(tmp_path)
    assert _source_name(html) == source.forecast("GB", start, start + timedelta(hours=24)).provider
    assert '<span class="badge replay">replay</span>' in html and "is ignored" not in html
