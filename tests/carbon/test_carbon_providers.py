"""Provider clients against a real local HTTP server serving the documented fixtures verbatim, plus faults."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from werkzeug import Response

from carbonflow.carbon.base import NotConfigured, ProviderUnavailable, RegionNotSupported
from carbonflow.carbon.chain import ForecastChain
from carbonflow.carbon.fallbacks import StaticProvider
from carbonflow.carbon.providers import (
    LBS_PER_MWH_TO_G_PER_KWH,
    CarbonAwareSdkProvider,
    ElectricityMapsProvider,
    HttpSettings,
    NesoProvider,
    WattTimeProvider,
)

FIX = Path(__file__).parent / "fixtures"
FAST = HttpSettings(timeout_s=0.5, retries=1, backoff_s=0.0, max_retry_after_s=2.0)
NESO_NOW = datetime(2023, 3, 14, 12, 1, tzinfo=UTC)
WT_NOW = datetime(2022, 10, 21, 6, 20, tzinfo=UTC)
EM_NOW = datetime(2021, 7, 8, 0, 0, tzinfo=UTC)
JSON = "application/json"


def body(rel: str) -> str:
    return (FIX / rel).read_text()


def serve(httpserver, uri: str, rel: str, status: int = 200, **kw) -> None:
    httpserver.expect_request(uri, **kw).respond_with_data(body(rel), status=status, content_type=JSON)


# ---------------------------------------------------------------- NESO


def test_neso_national_fw48h_fixture(httpserver):
    serve(
        httpserver,
        "/intensity/2023-03-14T12:00Z/fw48h",
        "uk-carbon-intensity/GET_intensity_2023-03-14T12-01Z_fw48h.json",
    )
    fc = NesoProvider(httpserver.url_for(""), FAST).forecast("national", NESO_NOW)
    raw = json.loads(body("uk-carbon-intensity/GET_intensity_2023-03-14T12-01Z_fw48h.json"))["data"]
    assert len(fc.points) == len(raw) == 96
    assert fc.points[0].gco2_per_kwh == raw[0]["intensity"]["forecast"] == 93
    assert fc.points[0].start == datetime(2023, 3, 14, 12, 0, tzinfo=UTC)
    assert all(p.length_s == 1800 for p in fc.points)
    assert fc.signal_kind == "average-direct" and fc.provider == "neso" and not fc.replay


@pytest.mark.parametrize(
    ("zone", "uri", "rel"),
    [
        (
            "regionid:13",
            "/regional/intensity/2023-03-14T12:00Z/fw48h/regionid/13",
            "uk-carbon-intensity/GET_regional_intensity_2023-03-14T12-01Z_fw48h_regionid_13__docs_list_shape_synthetic_values.json",
        ),
        (
            "postcode:SW1",
            "/regional/intensity/2023-03-14T12:00Z/fw48h/postcode/SW1",
            "uk-carbon-intensity/GET_regional_intensity_2023-03-14T12-01Z_fw48h_postcode_SW1__docs_list_shape_synthetic_values.json",
        ),
    ],
)
def test_neso_regional_list_shape(httpserver, zone, uri, rel):
    serve(httpserver, uri, rel)
    fc = NesoProvider(httpserver.url_for(""), FAST).forecast(zone, NESO_NOW)
    raw = json.loads(body(rel))["data"][0]["data"]
    assert [p.gco2_per_kwh for p in fc.points] == [float(r["intensity"]["forecast"]) for r in raw]


def test_neso_regional_object_shape(httpserver):
    rel = "uk-carbon-intensity/GET_regional_intensity_2023-03-13T12-01Z_fw48h_regionid_1__captured_object_shape_truncated.json"  # noqa: E501
    serve(httpserver, "/regional/intensity/2023-03-13T12:00Z/fw48h/regionid/1", rel)
    now = datetime(2023, 3, 13, 12, 1, tzinfo=UTC)
    fc = NesoProvider(httpserver.url_for(""), FAST).forecast("regionid:1", now)
    raw = json.loads(body(rel))["data"]["data"]
    assert len(fc.points) == len(raw) == 11
    assert fc.points[0].gco2_per_kwh == raw[0]["intensity"]["forecast"]


def test_neso_actuals_and_bad_zone(httpserver):
    serve(
        httpserver,
        "/intensity/2023-03-15T12:00Z/2023-03-16T12:00Z",
        "uk-carbon-intensity/GET_intensity_2023-03-15T12-00Z_2023-03-16T12-00Z.json",
    )
    neso = NesoProvider(httpserver.url_for(""), FAST)
    pts = neso.actuals("national", datetime(2023, 3, 15, 12, tzinfo=UTC), datetime(2023, 3, 16, 12, tzinfo=UTC))
    assert len(pts) == 48 and pts[0].gco2_per_kwh == 203
    with pytest.raises(RegionNotSupported, match="regionid"):
        neso.forecast("mars", NESO_NOW)


@pytest.mark.parametrize(
    ("status", "rel"), [(400, "uk-carbon-intensity/error_400.json"), (500, "uk-carbon-intensity/error_500.json")]
)
def test_neso_error_bodies(httpserver, status, rel):
    serve(httpserver, "/intensity/2023-03-14T12:00Z/fw48h", rel, status=status)
    with pytest.raises(ProviderUnavailable, match=f"HTTP {status}") as err:
        NesoProvider(httpserver.url_for(""), FAST).forecast("national", NESO_NOW)
    assert json.loads(body(rel))["error"]["message"][:20] in str(err.value)


# ---------------------------------------------------------------- Electricity Maps


def test_electricitymaps_forecast_sends_auth_token(httpserver):
    serve(
        httpserver,
        "/v3/carbon-intensity/forecast",
        "electricitymaps/GET_v3_carbon-intensity_forecast_zone_US-CAL-CISO.json",
        query_string={"zone": "US-CAL-CISO", "emissionFactorType": "lifecycle"},
        headers={"auth-token": "em-secret-123"},
    )
    em = ElectricityMapsProvider("em-secret-123", httpserver.url_for("/v3"), FAST)
    fc = em.forecast("US-CAL-CISO", EM_NOW)
    raw = json.loads(body("electricitymaps/GET_v3_carbon-intensity_forecast_zone_US-CAL-CISO.json"))["forecast"]
    assert fc.points[0].gco2_per_kwh == raw[0]["carbonIntensity"] == 262
    assert len(fc.points) == 48  # 48 h horizon of a 72 h answer
    assert fc.signal_kind == "average-lifecycle"
    assert fc.issued_at == datetime(2021, 7, 7, 23, 50, 23, 662000, tzinfo=UTC)


def test_electricitymaps_history_and_latest(httpserver):
    serve(
        httpserver,
        "/v3/carbon-intensity/history",
        "electricitymaps/GET_v3_carbon-intensity_history_zone_US-CAL-CISO.json",
    )
    serve(
        httpserver,
        "/v3/carbon-intensity/latest",
        "electricitymaps/GET_v3_carbon-intensity_latest_zone_DE__legacy_without_temporalGranularity.json",
    )
    em = ElectricityMapsProvider("tok-abcdef", httpserver.url_for("/v3"), FAST)
    hist = em.history("US-CAL-CISO")
    raw = json.loads(body("electricitymaps/GET_v3_carbon-intensity_history_zone_US-CAL-CISO.json"))["history"]
    assert len(hist) == len([r for r in raw if r["carbonIntensity"] is not None])
    latest = em.latest("DE")
    assert (
        latest.gco2_per_kwh
        == json.loads(
            body("electricitymaps/GET_v3_carbon-intensity_latest_zone_DE__legacy_without_temporalGranularity.json")
        )["carbonIntensity"]
    )


def test_electricitymaps_without_token_is_not_configured():
    with pytest.raises(NotConfigured, match="CARBONFLOW_ELECTRICITYMAPS_TOKEN"):
        ElectricityMapsProvider(None, "http://127.0.0.1:9", FAST).forecast("DE", EM_NOW)


# ---------------------------------------------------------------- WattTime


def _watttime(httpserver, forecast_handler=None):
    logins = []

    def login(request):
        logins.append(request.authorization)
        return Response(body("watttime/GET_login.json"), 200, content_type=JSON)

    httpserver.expect_request("/login").respond_with_handler(login)
    if forecast_handler is None:
        serve(httpserver, "/v3/forecast", "watttime/GET_v3_forecast_region_MISO_MASON_CITY_signal_co2_moer.json")
    else:
        httpserver.expect_request("/v3/forecast").respond_with_handler(forecast_handler)
    return logins


def test_watttime_login_basic_auth_bearer_and_units(httpserver):
    token = json.loads(body("watttime/GET_login.json"))["token"]
    seen = []

    def fc_handler(request):
        seen.append(request.headers.get("Authorization"))
        return Response(
            body("watttime/GET_v3_forecast_region_MISO_MASON_CITY_signal_co2_moer.json"), 200, content_type=JSON
        )

    logins = _watttime(httpserver, fc_handler)
    wt = WattTimeProvider("alice", "wt-pass-xyz", httpserver.url_for(""), FAST)
    fc = wt.forecast("MISO_MASON_CITY", WT_NOW, 6 * 3600)
    fc2 = wt.forecast("MISO_MASON_CITY", WT_NOW, 6 * 3600)
    assert len(logins) == 1, "the token is cached between calls"
    assert logins[0].username == "alice" and logins[0].password == "wt-pass-xyz"
    assert seen == [f"Bearer {token}"] * 2
    raw = json.loads(body("watttime/GET_v3_forecast_region_MISO_MASON_CITY_signal_co2_moer.json"))["data"]
    assert fc.points[0].gco2_per_kwh == pytest.approx(raw[0]["value"] * 0.45359237)
    assert LBS_PER_MWH_TO_G_PER_KWH == 0.45359237
    assert fc.signal_kind == "marginal" and fc.points[0].length_s == 300
    assert len(fc.points) == 72 and fc2.points == fc.points


def test_watttime_renews_token_on_401(httpserver):
    calls = {"n": 0}

    def fc_handler(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return Response(body("watttime/error_401__ASSUMED_body.json"), 401, content_type=JSON)
        return Response(
            body("watttime/GET_v3_forecast_region_MISO_MASON_CITY_signal_co2_moer.json"), 200, content_type=JSON
        )

    logins = _watttime(httpserver, fc_handler)
    fc = WattTimeProvider("alice", "pw-123456", httpserver.url_for(""), FAST).forecast("MISO_MASON_CITY", WT_NOW)
    assert len(logins) == 2 and calls["n"] == 2 and fc.points


@pytest.mark.parametrize(
    ("status", "rel", "text"),
    [
        (400, "watttime/error_400_ErrorResponse.json", "HTTP 400"),
        (403, "watttime/error_403_ErrorResponse.json", "does not have access"),
    ],
)
def test_watttime_documented_errors(httpserver, status, rel, text):
    _watttime(httpserver, lambda r: Response(body(rel), status, content_type=JSON))
    with pytest.raises(ProviderUnavailable, match=text):
        WattTimeProvider("alice", "pw-123456", httpserver.url_for(""), FAST).forecast("MISO_MASON_CITY", WT_NOW)


def test_watttime_login_refused(httpserver):
    httpserver.expect_request("/login").respond_with_data("", status=401)
    with pytest.raises(ProviderUnavailable, match="login refused"):
        WattTimeProvider("alice", "wrong-pw", httpserver.url_for(""), FAST).forecast("MISO_MASON_CITY", WT_NOW)


# ---------------------------------------------------------------- Carbon Aware SDK


@pytest.mark.parametrize(
    "rel",
    [
        "carbon-aware-sdk/GET_emissions_forecasts_current_location_centralus_windowSize_30.json",
        "carbon-aware-sdk/GET_emissions_forecasts_current__LEGACY_docs_variant_optimalDataPoint_singular.json",
    ],
)
def test_carbon_aware_sdk_both_optimal_shapes(httpserver, rel):
    serve(httpserver, "/emissions/forecasts/current", rel, query_string={"location": "centralus"})
    fc = CarbonAwareSdkProvider(httpserver.url_for(""), FAST).forecast("centralus", WT_NOW)
    raw = json.loads(body(rel))[0]["forecastData"]
    assert fc.points[0].gco2_per_kwh == pytest.approx(raw[0]["value"])
    assert fc.points[0].length_s == 300
    assert any("optimal start 2022-10-21T08:20" in n for n in fc.notes)


# ---------------------------------------------------------------- faults end in the fallback with a warning


def _chain_for(kind: str, url: str) -> tuple[ForecastChain, str, datetime]:
    if kind == "neso":
        return ForecastChain([NesoProvider(url, FAST), StaticProvider()]), "GB", NESO_NOW
    if kind == "electricitymaps":
        return (
            ForecastChain([ElectricityMapsProvider("em-tok-999", url + "/v3", FAST), StaticProvider()]),
            "US-CAL-CISO",
            EM_NOW,
        )
    if kind == "watttime":
        return (
            ForecastChain([WattTimeProvider("alice", "pw-123456", url, FAST), StaticProvider()]),
            "azure:centralus",
            WT_NOW,
        )
    if kind == "carbon-aware-sdk":
        return ForecastChain([CarbonAwareSdkProvider(url, FAST), StaticProvider()]), "azure:centralus", WT_NOW
    raise AssertionError(kind)


PATHS = {
    "neso": "/intensity/2023-03-14T12:00Z/fw48h",
    "electricitymaps": "/v3/carbon-intensity/forecast",
    "carbon-aware-sdk": "/emissions/forecasts/current",
    "watttime": "/v3/forecast",
}
FAULTS = [
    (400, '{"error": {"code": "400 Bad Request", "message": "bad"}}', "HTTP 400"),
    (401, body("electricitymaps/error_401_invalid_token.json"), "HTTP 401"),
    (403, body("watttime/error_403_ErrorResponse.json"), "HTTP 403"),
    (500, body("uk-carbon-intensity/error_500.json"), "HTTP 500"),
    (200, "{not json", "malformed JSON"),
    (200, "", "empty answer"),
]


@pytest.mark.parametrize("kind", sorted(PATHS))
@pytest.mark.parametrize(("status", "payload", "text"), FAULTS)
def test_fault_falls_back_to_static_with_warning(httpserver, caplog, kind, status, payload, text):
    if kind == "watttime":
        httpserver.expect_request("/login").respond_with_data(body("watttime/GET_login.json"), content_type=JSON)
    httpserver.expect_request(PATHS[kind]).respond_with_data(payload, status=status, content_type=JSON)
    chain, region, now = _chain_for(kind, httpserver.url_for("").rstrip("/"))
    with caplog.at_level(logging.WARNING):
        fc = chain.forecast(region, now, now.replace(hour=now.hour + 6) if now.hour < 17 else now)
    assert fc.provider == "static:codecarbon"
    assert any(text in n for n in fc.notes), fc.notes
    assert any(text in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", sorted(PATHS))
def test_empty_data_and_null_intensities_fall_back(httpserver, caplog, kind):
    empty = {
        "neso": {"data": []},
        "electricitymaps": {"zone": "US-CAL-CISO", "forecast": []},
        "carbon-aware-sdk": [],
        "watttime": {"data": [], "meta": {"units": "lbs_co2_per_mwh"}},
    }[kind]
    nulls = {
        "neso": {"data": [{"from": "2023-03-14T12:00Z", "to": "2023-03-14T12:30Z", "intensity": {"forecast": None}}]},
        "electricitymaps": {
            "zone": "US-CAL-CISO",
            "forecast": [{"carbonIntensity": None, "datetime": "2021-07-08T00:00:00.000Z"}],
        },
        "watttime": {
            "data": [{"point_time": "2022-10-21T06:20:00+00:00", "value": None}],
            "meta": {"units": "lbs_co2_per_mwh", "data_point_period_seconds": 300},
        },
        "carbon-aware-sdk": [
            {
                "location": "centralus",
                "forecastData": [
                    {"location": "X", "timestamp": "2022-10-21T06:20:00+00:00", "duration": 30, "value": None}
                ],
            }
        ],
    }[kind]
    for payload in (empty, nulls):
        httpserver.clear()
        if kind == "watttime":
            httpserver.expect_request("/login").respond_with_data(body("watttime/GET_login.json"), content_type=JSON)
        httpserver.expect_request(PATHS[kind]).respond_with_json(payload)
        chain, region, now = _chain_for(kind, httpserver.url_for("").rstrip("/"))
        with caplog.at_level(logging.WARNING):
            fc = chain.forecast(region, now, now.replace(hour=now.hour + 3))
        assert fc.provider == "static:codecarbon", fc.notes
        assert any(kind in n and ("no forecast values" in n or "empty" in n or "non-empty" in n) for n in fc.notes)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_then_succeeds(httpserver, status):
    calls = []

    def handler(request):
        calls.append(time.monotonic())
        if len(calls) == 1:
            return Response('{"error": "busy"}', status, headers={"Retry-After": "1"}, content_type=JSON)
        return Response(body("uk-carbon-intensity/GET_intensity_2023-03-14T12-01Z_fw48h.json"), 200, content_type=JSON)

    httpserver.expect_request(PATHS["neso"]).respond_with_handler(handler)
    fc = NesoProvider(httpserver.url_for(""), FAST).forecast("national", NESO_NOW)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.95
    assert len(fc.points) == 96


def test_429_persistent_or_too_long_retry_after_falls_back(httpserver, caplog):
    httpserver.expect_request(PATHS["electricitymaps"]).respond_with_data(
        body("electricitymaps/error_429__ASSUMED_body.json"),
        status=429,
        headers={"Retry-After": "3600"},
        content_type=JSON,
    )
    chain, region, now = _chain_for("electricitymaps", httpserver.url_for("").rstrip("/"))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        fc = chain.forecast(region, now, now.replace(hour=6))
    assert time.monotonic() - t0 < 5, "a one-hour Retry-After must not block the DAG"
    assert fc.provider == "static:codecarbon"
    assert any("retry after 3600" in n for n in fc.notes)

    httpserver.clear()
    httpserver.expect_request(PATHS["carbon-aware-sdk"]).respond_with_data(
        body("carbon-aware-sdk/error_429_upstream_WattTime_forwarded.json"),
        status=429,
        headers={"Retry-After": "0"},
        content_type=JSON,
    )
    chain, region, now = _chain_for("carbon-aware-sdk", httpserver.url_for("").rstrip("/"))
    fc = chain.forecast(region, now, now.replace(hour=9))
    assert fc.provider == "static:codecarbon"
    assert any("HTTP 429" in n and "WattTimeClientHttpException" in n for n in fc.notes), fc.notes


def test_timeout_falls_back(httpserver, caplog):
    release = threading.Event()

    def slow(request):
        release.wait(2.0)
        return Response("{}", 200, content_type=JSON)

    httpserver.expect_request(PATHS["neso"]).respond_with_handler(slow)
    settings = HttpSettings(timeout_s=0.3, retries=0, backoff_s=0.0)
    chain = ForecastChain([NesoProvider(httpserver.url_for(""), settings), StaticProvider()])
    with caplog.at_level(logging.WARNING):
        fc = chain.forecast("GB", NESO_NOW, NESO_NOW.replace(hour=18))
    assert fc.provider == "static:codecarbon"
    assert any("timed out after 0.3 s" in n for n in fc.notes), fc.notes
    assert any("timed out" in r.getMessage() for r in caplog.records)
    release.set()
    time.sleep(0.1)


def test_dead_port_falls_back():
    chain = ForecastChain([NesoProvider("http://127.0.0.1:9", FAST), StaticProvider()])
    fc = chain.forecast("GB", NESO_NOW, NESO_NOW.replace(hour=18))
    assert fc.provider == "static:codecarbon" and any("neso" in n and "failed" in n for n in fc.notes)


def test_on_disk_cache_keyed_by_provider_region_slot(httpserver, tmp_path):
    calls = []

    def handler(request):
        calls.append(request.path)
        return Response(body("uk-carbon-intensity/GET_intensity_2023-03-14T12-01Z_fw48h.json"), 200, content_type=JSON)

    httpserver.expect_request(PATHS["neso"]).respond_with_handler(handler)
    settings = HttpSettings(timeout_s=1, retries=0, cache_dir=tmp_path)
    a = NesoProvider(httpserver.url_for(""), settings).forecast("national", NESO_NOW)
    b = NesoProvider(httpserver.url_for(""), settings).forecast("national", NESO_NOW.replace(minute=20))
    assert a.points == b.points
    assert len(calls) == 1, "the second call in the same slot is served from the on-disk cache"
    assert (tmp_path / "neso.sqlite").exists()


def test_gaps_stay_gaps_and_bad_values_are_dropped(httpserver):
    payload = {
        "zone": "DE",
        "forecast": [
            {"carbonIntensity": 300, "datetime": "2021-07-08T00:00:00.000Z"},
            {"carbonIntensity": 310, "datetime": "2021-07-08T01:00:00.000Z"},
            {"carbonIntensity": 320, "datetime": "2021-07-08T05:00:00.000Z"},  # 3 h missing before this one
            {"carbonIntensity": "n/a", "datetime": "2021-07-08T06:00:00.000Z"},
            {"carbonIntensity": -5, "datetime": "2021-07-08T07:00:00.000Z"},
            {"carbonIntensity": True, "datetime": "2021-07-08T08:00:00.000Z"},
            {"datetime": "2021-07-08T09:00:00.000Z"},
            {"carbonIntensity": 330},
        ],
    }
    httpserver.expect_request("/v3/carbon-intensity/forecast").respond_with_json(payload)
    fc = ElectricityMapsProvider("tok-123456", httpserver.url_for("/v3"), FAST).forecast("DE", EM_NOW)
    assert [(p.start.hour, p.length_s, p.gco2_per_kwh) for p in fc.points] == [
        (0, 3600, 300),
        (1, 3600, 310),
        (5, 3600, 320),
    ]
