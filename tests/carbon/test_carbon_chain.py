"""The fallback chain, region table, default chains, and keys never leaking."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from werkzeug import Response

from carbonflow.carbon.base import ProviderUnavailable
from carbonflow.carbon.chain import ForecastChain, default_chain, redact
from carbonflow.carbon.fallbacks import ClimatologyProvider, StaticProvider
from carbonflow.carbon.providers import ElectricityMapsProvider, HttpSettings, WattTimeProvider
from carbonflow.carbon.regions import all_regions, resolve_region
from carbonflow.carbon.replay import ReplayProvider
from carbonflow.carbon.windows import choose_start
from carbonflow.domain import Forecast, ForecastPoint

FIX = Path(__file__).parent / "fixtures"
FAST = HttpSettings(timeout_s=0.5, retries=1, backoff_s=0.0)
NOW = datetime(2023, 3, 15, 18, 0, tzinfo=UTC)


def test_resolve_region_maps_clouds_and_names_bad_values():
    london = resolve_region("aws:eu-west-2")
    assert (london.zone("neso"), london.zone("electricitymaps"), london.country_iso3) == ("national", "GB", "GBR")
    assert resolve_region("azure:centralus").zone("watttime") == "MISO_MASON_CITY"
    assert resolve_region("azure:centralus").zone("carbon_aware_sdk") == "centralus"
    assert resolve_region("GB-13").zone("neso") == "regionid:13"
    assert resolve_region("gb-rg41").zone("neso") == "postcode:RG41"
    with pytest.raises(ValueError, match=r"region='aws:mars-1'.*aws:eu-west-2"):
        resolve_region("aws:mars-1")
    with pytest.raises(ValueError, match=r"region='Atlantis'.*e\.g\. .*GB"):
        resolve_region("Atlantis")
    with pytest.raises(ValueError, match="regionid 1-17"):
        resolve_region("GB-99")
    assert len(all_regions()) >= 90 and all(
        ":" in r or r.replace("-", "").replace("_", "").isalnum() for r in all_regions()
    )


class _Broken:
    name = "broken"
    key = "broken"
    zone_key = "grid"

    def forecast(self, region, now, horizon_s=0):
        raise ProviderUnavailable("broken: HTTP 503")


class _Boom(_Broken):
    name = key = "boom"

    def forecast(self, region, now, horizon_s=0):
        raise RuntimeError("surprise")


def test_chain_records_who_decided_and_why_others_were_skipped(caplog):
    chain = ForecastChain([_Broken(), _Boom(), ReplayProvider.default(), StaticProvider()])
    with caplog.at_level(logging.WARNING):
        fc = chain.forecast("aws:eu-west-2", NOW, NOW + timedelta(hours=12))
    assert fc.provider == "replay:neso-gb-2023-03" and fc.region == "aws:eu-west-2"
    assert fc.notes[0].startswith("decided by replay:neso-gb-2023-03")
    assert any("skipped broken: broken: HTTP 503" in n for n in fc.notes)
    assert any("skipped boom: unexpected error RuntimeError: surprise" in n for n in fc.notes)
    assert all(p.end > NOW and p.start < NOW + timedelta(hours=12) for p in fc.points)
    assert any("falling back" in r.getMessage() for r in caplog.records)


def test_order_per_region_and_validation():
    replay, static = ReplayProvider.default(), StaticProvider()
    chain = ForecastChain([replay, static], order={"GB": ["static", "replay"], "*": ["replay", "static"]})
    assert chain.forecast("GB", NOW, NOW + timedelta(hours=3)).provider == "static:codecarbon"
    assert chain.forecast("aws:eu-west-2", NOW, NOW + timedelta(hours=3)).provider == replay.name
    with pytest.raises(ValueError, match=r"order\['GB'\].*unknown providers \['nope'\]"):
        ForecastChain([replay, static], order={"GB": ["nope"]})
    with pytest.raises(ValueError, match="region="):
        chain.forecast("nowhere", NOW, NOW + timedelta(hours=3))


def test_signal_kind_is_never_mixed_silently():
    chain = ForecastChain([ReplayProvider.default(), StaticProvider()], signal_kind="marginal")
    fc = chain.forecast("GB", NOW, NOW + timedelta(hours=3))
    assert fc.provider == "static:codecarbon"
    assert any("signal average-direct, the chain wants marginal" in n for n in fc.notes)
    assert any("not the wanted marginal" in n for n in fc.notes)


def test_empty_chain_answer_starts_at_once():
    fc = ForecastChain([_Broken()]).forecast("GB", NOW, NOW + timedelta(hours=3))
    assert fc.points == [] and fc.provider == "none"
    choice = choose_start(fc, 3600, NOW, NOW + timedelta(hours=3))
    assert choice.fallback and choice.start == NOW


def test_default_replay_chain_serves_demo_and_falls_back_outside_it():
    chain = default_chain(replay=True)
    fc = chain.forecast("GB", NOW, NOW + timedelta(hours=12))
    assert fc.replay and fc.provider.startswith("replay:")
    history = chain.history("GB", NOW - timedelta(days=8), NOW)
    assert history and all(p.end <= NOW + timedelta(minutes=30) for p in history)
    choice = choose_start(fc, 2 * 3600, NOW, NOW + timedelta(hours=12), history=history)
    assert not choice.fallback and "replayed data" in choice.reason
    outside = chain.forecast("DE", NOW, NOW + timedelta(hours=12))
    assert outside.provider == "static:codecarbon"
    assert any("skipped climatology:replay" in n for n in outside.notes)
    assert chain.history("DE", NOW - timedelta(days=1), NOW) == []


def test_climatology_uses_hour_of_week_from_history():
    def history(zone, start, end):
        t = end - timedelta(days=14)
        out = []
        while t < end:
            out.append(ForecastPoint(start=t, length_s=3600, gco2_per_kwh=100 + t.weekday() * 10 + t.hour))
            t += timedelta(hours=1)
        return out

    clim = ClimatologyProvider(history, signal_kind="average-lifecycle")
    now = datetime(2023, 3, 15, 10, 30, tzinfo=UTC)  # a Wednesday
    fc = clim.forecast("DE", now, 6 * 3600)
    assert fc.points[0].start == datetime(2023, 3, 15, 10, tzinfo=UTC)
    assert fc.points[0].gco2_per_kwh == 100 + 2 * 10 + 10
    assert "hour-of-week" in fc.notes[0] and "not a forecast" in fc.notes[0]
    with pytest.raises(ProviderUnavailable, match="needs >= 24 h"):
        ClimatologyProvider(lambda z, s, e: [], signal_kind="average-direct").forecast("DE", now)


def test_default_live_chain_reads_env_keys_and_uses_electricity_maps(httpserver, monkeypatch, tmp_path):
    body = (FIX / "electricitymaps" / "GET_v3_carbon-intensity_forecast_zone_US-CAL-CISO.json").read_text()
    httpserver.expect_request(
        "/v3/carbon-intensity/forecast", headers={"auth-token": "env-token-abc"}
    ).respond_with_data(body, content_type="application/json")
    monkeypatch.setenv("CARBONFLOW_ELECTRICITYMAPS_TOKEN", "env-token-abc")
    monkeypatch.setenv("CARBONFLOW_ELECTRICITYMAPS_URL", httpserver.url_for("/v3"))
    monkeypatch.delenv("CARBONFLOW_WATTTIME_USERNAME", raising=False)
    monkeypatch.delenv("CARBONFLOW_CARBON_AWARE_SDK_URL", raising=False)
    chain = default_chain(cache_dir=tmp_path, timeout_s=0.5, retries=0)
    now = datetime(2021, 7, 8, 0, 0, tzinfo=UTC)
    fc = chain.forecast("gcp:us-west2", now, now + timedelta(hours=10))
    assert fc.provider == "electricitymaps" and fc.signal_kind == "average-lifecycle"
    assert any("skipped neso: it has no zone" in n for n in fc.notes)
    assert "env-token-abc" not in fc.model_dump_json()


def test_default_live_chain_without_keys_falls_back_and_says_so(monkeypatch):
    for var in (
        "CARBONFLOW_ELECTRICITYMAPS_TOKEN",
        "CARBONFLOW_WATTTIME_USERNAME",
        "CARBONFLOW_WATTTIME_PASSWORD",
        "CARBONFLOW_CARBON_AWARE_SDK_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CARBONFLOW_NESO_URL", "http://127.0.0.1:9")
    chain = default_chain(timeout_s=0.3, retries=0)
    fc = chain.forecast("azure:westeurope", NOW, NOW + timedelta(hours=6))
    assert fc.provider == "static:codecarbon"
    text = " | ".join(fc.notes)
    assert "no token" in text and "it has no zone" in text


SECRETS = {"em": "EM-SECRET-TOKEN-42", "wt_pw": "WT-PASSWORD-99", "bearer": "WT-BEARER-777"}


def test_keys_never_reach_logs_forecasts_or_exceptions(httpserver, caplog):
    """Hostile servers echo the credentials they received; none may reach a log line, a note, XCom JSON or an error."""
    httpserver.expect_request("/v3/carbon-intensity/forecast").respond_with_data(
        json.dumps({"error": f"Invalid auth-token {SECRETS['em']}"}), status=401, content_type="application/json"
    )
    httpserver.expect_request("/login").respond_with_json({"token": SECRETS["bearer"]})

    def forecast_500(request):
        seen = f"seen {request.headers.get('Authorization')} for alice:{SECRETS['wt_pw']}"
        return Response(json.dumps({"error": "boom", "message": seen}), 500, content_type="application/json")

    httpserver.expect_request("/v3/forecast").respond_with_handler(forecast_500)
    em = ElectricityMapsProvider(SECRETS["em"], httpserver.url_for("/v3"), FAST)
    wt = WattTimeProvider("alice", SECRETS["wt_pw"], httpserver.url_for(""), FAST)
    errors: list[str] = []
    for call in (lambda: em.forecast("US-CAL-CISO", NOW), lambda: wt.forecast("MISO_MASON_CITY", NOW)):
        with pytest.raises(ProviderUnavailable) as err:
            call()
        errors.append(str(err.value) + repr(err.value))
    chain = ForecastChain([em, wt, StaticProvider()])
    with caplog.at_level(logging.DEBUG):
        a = chain.forecast("US-CAL-CISO", NOW, NOW + timedelta(hours=6))
        b = chain.forecast("azure:centralus", NOW, NOW + timedelta(hours=6))
    assert a.provider == b.provider == "static:codecarbon"
    assert any("HTTP 401" in n for n in a.notes) and any("HTTP 500" in n for n in b.notes)
    haystack = "\n".join(errors + [r.getMessage() for r in caplog.records] + [a.model_dump_json(), b.model_dump_json()])
    haystack += "\n".join(caplog.text.splitlines())
    for secret in SECRETS.values():
        assert secret not in haystack, secret
    assert "***" in haystack  # the echoed values were seen and redacted, not silently dropped
    restored = Forecast.model_validate_json(a.model_dump_json())  # what travels over XCom
    assert restored.notes == a.notes


def test_redact_handles_overlapping_secrets():
    assert redact("a-secret-long and a-secret", ["a-secret", "a-secret-long"]) == "*** and ***"
    assert redact("short key ab", ["ab"]) == "short key ab"  # too short to be a real key; never mangle text


def test_on_disk_cache_holds_no_keys(httpserver, tmp_path):
    fix = FIX / "watttime" / "GET_v3_forecast_region_MISO_MASON_CITY_signal_co2_moer.json"
    httpserver.expect_request("/login").respond_with_json({"token": SECRETS["bearer"]})
    httpserver.expect_request("/v3/forecast").respond_with_data(fix.read_text(), content_type="application/json")
    em_fix = FIX / "electricitymaps" / "GET_v3_carbon-intensity_forecast_zone_US-CAL-CISO.json"
    httpserver.expect_request("/v3/carbon-intensity/forecast").respond_with_data(
        em_fix.read_text(), content_type="application/json"
    )
    settings = HttpSettings(timeout_s=1, retries=0, cache_dir=tmp_path)
    WattTimeProvider("alice", SECRETS["wt_pw"], httpserver.url_for(""), settings).forecast(
        "MISO_MASON_CITY", datetime(2022, 10, 21, 6, 20, tzinfo=UTC)
    )
    ElectricityMapsProvider(SECRETS["em"], httpserver.url_for("/v3"), settings).forecast(
        "US-CAL-CISO", datetime(2021, 7, 8, tzinfo=UTC)
    )
    files = list(tmp_path.glob("*.sqlite"))
    assert {f.name for f in files} == {"watttime.sqlite", "electricitymaps.sqlite"}
    for f in files:
        blob = f.read_bytes()
        for secret in SECRETS.values():
            assert secret.encode() not in blob, (f.name, secret)


def test_connection_fields_map_to_chain_credentials(httpserver):
    from carbonflow.carbon.credentials import credentials_from_connection, credentials_from_connections, describe

    assert credentials_from_connection("carbonflow_electricitymaps", password="tok-123456") == (
        "electricitymaps",
        {"token": "tok-123456"},
    )
    assert credentials_from_connection("carbonflow_watttime", login="al", password="pw-123456", host="http://wt") == (
        "watttime",
        {"url": "http://wt", "username": "al", "password": "pw-123456"},
    )
    with pytest.raises(ValueError, match=r"conn_type='http' is not allowed; use one of carbonflow_"):
        credentials_from_connection("http")
    creds = credentials_from_connections(
        [
            {"conn_type": "carbonflow_carbon_aware_sdk", "host": httpserver.url_for("")},
            {"conn_type": "carbonflow_electricitymaps", "extra": '{"token": "EM-SECRET-TOKEN-42"}'},
        ]
    )
    assert describe(creds) == {"carbon-aware-sdk": ["url"], "electricitymaps": ["token"]}
    sdk = FIX / "carbon-aware-sdk" / "GET_emissions_forecasts_current_location_centralus_windowSize_30.json"
    httpserver.expect_request("/emissions/forecasts/current").respond_with_data(
        sdk.read_text(), content_type="application/json"
    )
    chain = default_chain(creds, timeout_s=0.5, retries=0, order={"*": ["carbon-aware-sdk", "static"]})
    now = datetime(2022, 10, 21, 6, 20, tzinfo=UTC)
    fc = chain.forecast("azure:centralus", now, now + timedelta(hours=5))
    assert fc.provider == "carbon-aware-sdk" and fc.signal_kind == "marginal"


def test_operator_hook_shaped_credentials_are_accepted(httpserver):
    sdk = FIX / "carbon-aware-sdk" / "GET_emissions_forecasts_current_location_centralus_windowSize_30.json"
    httpserver.expect_request("/emissions/forecasts/current").respond_with_data(
        sdk.read_text(), content_type="application/json"
    )
    creds = {"carbon_aware_sdk": {"base_url": httpserver.url_for("")}, "electricitymaps": {"token": ""}}
    chain = default_chain(creds, timeout_s=0.5, retries=0)
    now = datetime(2022, 10, 21, 6, 20, tzinfo=UTC)
    fc = chain.forecast("azure:centralus", now, now + timedelta(hours=5))
    assert fc.provider == "carbon-aware-sdk"
    assert any("skipped electricitymaps: electricitymaps: no token" in n for n in fc.notes)
