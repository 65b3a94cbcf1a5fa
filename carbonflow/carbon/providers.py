"""Live carbon-intensity API clients, faithful to each provider's documented shapes and errors.

* :class:`NesoProvider` — UK NESO Carbon Intensity API v2 (no key): national, region id, postcode.
* :class:`ElectricityMapsProvider` — Electricity Maps v3 (``auth-token`` header): forecast, history, latest.
* :class:`WattTimeProvider` — WattTime v3: ``/login`` with basic auth, bearer token cached and renewed on 401,
  ``/v3/forecast`` marginal signal, lbs/MWh converted to g/kWh (x 0.45359237).
* :class:`CarbonAwareSdkProvider` — GSF Carbon Aware SDK WebAPI ``/emissions/forecasts/current``.

All share :class:`HttpSettings`: per-request timeouts, urllib3 ``Retry`` with backoff that honours
``Retry-After`` on 429/503 (capped, so a DAG never sleeps for an hour), and an optional on-disk
requests-cache per provider whose entries expire at the end of the current slot (the URL names the region).
Every failure becomes a :class:`~carbonflow.carbon.base.ProviderError` whose text holds no credential.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from carbonflow.carbon.base import (
    DEFAULT_HORIZON_S,
    NotConfigured,
    ProviderError,
    ProviderUnavailable,
    RegionNotSupported,
    floor_to,
    parse_utc,
    require_utc,
)
from carbonflow.models import Forecast, ForecastPoint, SignalKind

log = logging.getLogger(__name__)
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
USER_AGENT = "carbonflow (+https://github.com/carbonflow)"
_SECRET_HEADERS = ["auth-token", "Authorization", "X-BLOBR-KEY"]


@dataclass(frozen=True)
class HttpSettings:
    """Timeouts, retries and cache shared by the HTTP providers."""

    timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    max_retry_after_s: float = 60.0
    cache_dir: Path | None = None
    cache_slot_s: float = 1800.0


class _CappedRetry(Retry):
    """urllib3 Retry that honours Retry-After but gives up (falls back) when the server asks to wait too long."""

    max_retry_after_s: float = 60.0

    def new(self, **kw: Any) -> _CappedRetry:
        new = super().new(**kw)
        new.max_retry_after_s = self.max_retry_after_s
        return new

    def sleep_for_retry(self, response: Any = None) -> bool:
        retry_after = self.get_retry_after(response) if response is not None else None
        if retry_after is not None and retry_after > self.max_retry_after_s:
            raise _RetryAfterTooLong(retry_after)
        return super().sleep_for_retry(response)


class _RetryAfterTooLong(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"the server asked to retry after {seconds:.0f} s")
        self.seconds = seconds


def _mount(session: requests.Session, settings: HttpSettings) -> requests.Session:
    retry = _CappedRetry(
        total=settings.retries,
        connect=settings.retries,
        read=settings.retries,
        status=settings.retries,
        backoff_factor=settings.backoff_s,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods={"GET"},
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    retry.max_retry_after_s = settings.max_retry_after_s
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"Accept": "application/json", "User-Agent": USER_AGENT})
    return session


def make_session(provider: str, settings: HttpSettings, *, cached: bool = True) -> requests.Session:
    """A session with retries, and an on-disk cache per provider when ``settings.cache_dir`` is set."""
    if cached and settings.cache_dir is not None:
        import requests_cache

        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        session: requests.Session = requests_cache.CachedSession(
            cache_name=str(settings.cache_dir / f"{provider}.sqlite"),
            backend="sqlite",
            allowable_codes=(200,),
            allowable_methods=("GET",),
            match_headers=False,
            ignored_parameters=_SECRET_HEADERS,
            expire_after=settings.cache_slot_s,
            stale_if_error=False,
        )
    else:
        session = requests.Session()
    return _mount(session, settings)


def _error_text(response: requests.Response) -> str:
    """A short description of an error body in any of the documented shapes (never the request headers)."""
    try:
        body = response.json()
    except ValueError:
        return (response.text or "").strip()[:200]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):  # NESO {"error":{"code","message"}}
            return f"{err.get('code', '')}: {err.get('message', '')}".strip(": ")
        if "title" in body:  # RFC 7807 (Carbon Aware SDK)
            return f"{body.get('title')}: {body.get('detail') or body.get('errors') or ''}".strip(": ")
        msg = body.get("message") or body.get("msg")
        if err and msg:
            return f"{err}: {msg}"
        if err or msg:
            return str(err or msg)
    return json.dumps(body)[:200]


class _HttpProvider:
    name = "http"
    key = "http"
    zone_key = "grid"

    def __init__(self, base_url: str, settings: HttpSettings | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = settings or HttpSettings()
        self._session: requests.Session | None = None

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = make_session(self.key, self.settings)
        return self._session

    def secrets(self) -> list[str]:
        return []

    def _slot_expiry_s(self, now: datetime) -> float:
        slot = self.settings.cache_slot_s
        end = floor_to(now, slot) + timedelta(seconds=slot)
        return max(1.0, (end - datetime.now(UTC)).total_seconds()) if end > datetime.now(UTC) else slot

    def _get(
        self,
        path: str,
        *,
        params: dict | None = None,
        headers: dict | None = None,
        auth: Any = None,
        session: requests.Session | None = None,
        expire_after: float | None = None,
    ) -> requests.Response:
        url = f"{self.base_url}{path}"
        kwargs: dict[str, Any] = {
            "params": params,
            "headers": headers,
            "auth": auth,
            "timeout": self.settings.timeout_s,
        }
        sess = session or self.session
        if expire_after is not None and hasattr(sess, "cache"):
            kwargs["expire_after"] = expire_after
        try:
            return sess.get(url, **kwargs)
        except _RetryAfterTooLong as exc:
            raise ProviderUnavailable(f"{self.name}: HTTP 429/503 and {exc}; not waiting that long") from None
        except requests.exceptions.RetryError as exc:
            raise ProviderUnavailable(f"{self.name}: gave up after retries ({_reason(exc)})") from None
        except requests.exceptions.Timeout:
            raise ProviderUnavailable(
                f"{self.name}: timed out after {self.settings.timeout_s:g} s requesting {path}"
            ) from None
        except requests.exceptions.RequestException as exc:
            if _is_timeout(exc):
                raise ProviderUnavailable(
                    f"{self.name}: timed out after {self.settings.timeout_s:g} s requesting {path}"
                ) from None
            cause = exc.__context__ if isinstance(exc.__context__, _RetryAfterTooLong) else None
            if cause is not None:
                raise ProviderUnavailable(f"{self.name}: {cause}; not waiting that long") from None
            raise ProviderUnavailable(f"{self.name}: request to {path} failed ({type(exc).__name__})") from None

    def _json(self, response: requests.Response, what: str) -> Any:
        if response.status_code >= 400:
            text = _error_text(response)
            for secret in sorted((s for s in self.secrets() if s), key=len, reverse=True):
                text = text.replace(secret, "***")  # a server may echo a key back; never pass it on
            raise ProviderUnavailable(f"{self.name}: HTTP {response.status_code} for {what}: {text}")
        if response.status_code == 204 or not response.content:
            raise ProviderUnavailable(f"{self.name}: empty answer (HTTP {response.status_code}) for {what}")
        try:
            return response.json()
        except ValueError:
            raise ProviderUnavailable(f"{self.name}: malformed JSON for {what}") from None


def _is_timeout(exc: BaseException) -> bool:
    """True when a requests error is a (retried) read/connect timeout, not a refused connection."""
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    for arg in getattr(exc, "args", ()):
        reason = arg.reason if isinstance(arg, MaxRetryError) else arg
        if isinstance(reason, Urllib3Timeout) and not isinstance(reason, NewConnectionError):
            return True
    return False


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "too many 429" in text:
        return "HTTP 429 Too Many Requests"
    for code in ("500", "502", "503", "504"):
        if f"too many {code}" in text:
            return f"HTTP {code}"
    return type(exc).__name__


def _points(pairs: list[tuple[datetime, float | None]], period_s: float) -> list[ForecastPoint]:
    """Points of the provider's period from (start, value) pairs; a point never runs past the next start (so a
    gap in the answer stays a gap, never filled with the previous value); null/negative/non-numeric dropped."""
    pairs = sorted(pairs, key=lambda p: p[0])
    out = []
    for i, (start, value) in enumerate(pairs):
        length = period_s
        if i + 1 < len(pairs):
            length = min(period_s, (pairs[i + 1][0] - start).total_seconds())
        if length <= 0:
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            continue
        if value < 0:
            continue
        out.append(ForecastPoint(start=start, length_s=length, gco2_per_kwh=float(value)))
    return out


def _fmt_neso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


class NesoProvider(_HttpProvider):
    """UK NESO Carbon Intensity API v2: zones ``national``, ``regionid:<1-17>``, ``postcode:<outward code>``.

    Signal: average, CO2 only, operational (``average-direct``). Data licence CC BY 4.0.
    """

    name = "neso"
    key = "neso"
    zone_key = "neso"
    signal_kind: SignalKind = "average-direct"

    def __init__(self, base_url: str | None = None, settings: HttpSettings | None = None) -> None:
        super().__init__(base_url or "https://api.carbonintensity.org.uk", settings)

    def _path(self, zone: str, now: datetime) -> str:
        start = _fmt_neso(floor_to(now, 1800.0))  # the slot containing now: one cache entry per slot
        if zone.lower() in ("national", "gb"):
            return f"/intensity/{start}/fw48h"
        kind, _, value = zone.partition(":")
        if kind == "regionid" and value.isdigit():
            return f"/regional/intensity/{start}/fw48h/regionid/{int(value)}"
        if kind == "postcode" and value:
            return f"/regional/intensity/{start}/fw48h/postcode/{value.upper()}"
        raise RegionNotSupported(
            f"neso: zone={zone!r} is not allowed; use 'national', 'regionid:<1-17>' or 'postcode:<outward code>'"
        )

    @staticmethod
    def _slots(body: Any) -> list[dict]:
        """The list of half-hour entries in any documented or captured shape."""
        if not isinstance(body, dict) or "data" not in body:
            raise ProviderUnavailable("neso: answer has no 'data'")
        data = body["data"]
        if isinstance(data, dict):  # regional-by-id/postcode, object shape (real 2023 capture)
            data = [data]
        if not isinstance(data, list):
            raise ProviderUnavailable(f"neso: 'data' is a {type(data).__name__}, expected a list or object")
        slots: list[dict] = []
        for item in data:
            if isinstance(item, dict) and isinstance(item.get("data"), list):  # regional wrapper (list shape)
                slots.extend(item["data"])
            elif isinstance(item, dict):
                slots.append(item)
        return slots

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        now = require_utc("now", now)
        path = self._path(region, now)
        body = self._json(self._get(path, expire_after=self._slot_expiry_s(now)), path)
        pairs = []
        for slot in self._slots(body):
            try:
                start = parse_utc(slot["from"])
                value = (slot.get("intensity") or {}).get("forecast")
            except (KeyError, TypeError, ValueError):
                continue
            pairs.append((start, value))
        end = now + timedelta(seconds=horizon_s)
        points = [p for p in _points(pairs, 1800.0) if p.end > now and p.start < end]
        if not points:
            raise ProviderUnavailable(f"neso: no forecast values for {region} after {now.isoformat()}")
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=self.signal_kind,
            issued_at=now,
            points=points,
            notes=["NESO Carbon Intensity API (carbonintensity.org.uk, CC BY 4.0), CO2 only"],
        )

    def actuals(self, region: str, start: datetime, end: datetime) -> list[ForecastPoint]:
        """National actuals (``/intensity/{from}/{to}``, at most 14 days per call; longer spans are split)."""
        if region.lower() not in ("national", "gb"):
            raise RegionNotSupported("neso: actuals exist only for the national series (regional data has none)")
        out: list[ForecastPoint] = []
        cursor = require_utc("start", start)
        end = require_utc("end", end)
        while cursor < end:
            stop = min(end, cursor + timedelta(days=14))
            path = f"/intensity/{_fmt_neso(cursor)}/{_fmt_neso(stop)}"
            body = self._json(self._get(path), path)
            pairs = []
            for slot in self._slots(body):
                try:
                    pairs.append((parse_utc(slot["from"]), (slot.get("intensity") or {}).get("actual")))
                except (KeyError, TypeError, ValueError):
                    continue
            out.extend(_points(pairs, 1800.0))
            cursor = stop
        return out


def _intensity_pairs(body: object, key: str, region: str) -> list[tuple[datetime, object]]:
    """(datetime, carbonIntensity) of an Electricity Maps answer's ``key`` list; malformed items are skipped."""
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ProviderUnavailable(f"electricitymaps: answer for {region} has no {key!r} list")
    pairs = []
    for item in items:
        try:
            pairs.append((parse_utc(item["datetime"]), item.get("carbonIntensity")))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return pairs


class ElectricityMapsProvider(_HttpProvider):
    """Electricity Maps API v3 with an ``auth-token`` header; zones like ``DE``, ``US-CAL-CISO``."""

    name = "electricitymaps"
    key = "electricitymaps"
    zone_key = "electricitymaps"

    def __init__(
        self,
        token: str | None,
        base_url: str | None = None,
        settings: HttpSettings | None = None,
        *,
        emission_factor: str = "lifecycle",
    ) -> None:
        super().__init__(base_url or "https://api.electricitymap.org/v3", settings)
        if emission_factor not in ("lifecycle", "direct"):
            raise ValueError(f"emission_factor={emission_factor!r} is not allowed; use 'lifecycle' or 'direct'")
        self._token = token
        self.emission_factor = emission_factor
        self.signal_kind: SignalKind = "average-lifecycle" if emission_factor == "lifecycle" else "average-direct"

    def secrets(self) -> list[str]:
        return [self._token] if self._token else []

    def _headers(self) -> dict[str, str]:
        if not self._token:
            raise NotConfigured(
                "electricitymaps: no token (set the Airflow connection or CARBONFLOW_ELECTRICITYMAPS_TOKEN)"
            )
        return {"auth-token": self._token}

    def _params(self, zone: str) -> dict[str, str]:
        return {"zone": zone, "emissionFactorType": self.emission_factor}

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        now = require_utc("now", now)
        headers = self._headers()
        resp = self._get(
            "/carbon-intensity/forecast",
            params=self._params(region),
            headers=headers,
            expire_after=self._slot_expiry_s(now),
        )
        body = self._json(resp, f"forecast of {region}")
        pairs = _intensity_pairs(body, "forecast", region)
        end = now + timedelta(seconds=horizon_s)
        points = [p for p in _points(pairs, 3600.0) if p.end > now and p.start < end]
        if not points:
            raise ProviderUnavailable(f"electricitymaps: no forecast values for {region} after {now.isoformat()}")
        issued = now
        if isinstance(body.get("updatedAt"), str):
            with contextlib.suppress(ValueError):
                issued = min(parse_utc(body["updatedAt"]), now)
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=self.signal_kind,
            issued_at=issued,
            points=points,
            notes=[f"Electricity Maps v3 forecast ({self.emission_factor} emission factors)"],
        )

    def history(self, region: str, start: datetime | None = None, end: datetime | None = None) -> list[ForecastPoint]:
        """The last 24 h (``/carbon-intensity/history``); null intensities are left out."""
        body = self._json(
            self._get("/carbon-intensity/history", params=self._params(region), headers=self._headers()),
            f"history of {region}",
        )
        points = _points(_intensity_pairs(body, "history", region), 3600.0)
        if start is not None and end is not None:
            points = [p for p in points if p.end > start and p.start < end]
        return points

    def latest(self, region: str) -> ForecastPoint:
        """The current value (``/carbon-intensity/latest``)."""
        body = self._json(
            self._get("/carbon-intensity/latest", params=self._params(region), headers=self._headers()),
            f"latest of {region}",
        )
        try:
            value = body["carbonIntensity"]
            start = parse_utc(body["datetime"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProviderUnavailable(f"electricitymaps: latest answer for {region} lacks {exc}") from None
        if value is None:
            raise ProviderUnavailable(f"electricitymaps: latest intensity for {region} is null")
        return ForecastPoint(start=start, length_s=3600.0, gco2_per_kwh=float(value))


class WattTimeProvider(_HttpProvider):
    """WattTime v3 marginal signal (``co2_moer``); the bearer token is cached and renewed on 401 or after 30 min."""

    name = "watttime"
    key = "watttime"
    zone_key = "watttime"
    signal_kind: SignalKind = "marginal"
    TOKEN_LIFETIME_S = 30 * 60

    def __init__(
        self,
        username: str | None,
        password: str | None,
        base_url: str | None = None,
        settings: HttpSettings | None = None,
    ) -> None:
        super().__init__(base_url or "https://api.watttime.org", settings)
        self._username = username
        self._password = password
        self._token: str | None = None
        self._token_at = 0.0
        self._lock = threading.Lock()
        self._login_session: requests.Session | None = None

    def secrets(self) -> list[str]:
        return [s for s in (self._password, self._token) if s]

    def _login(self, force: bool = False) -> str:
        if not self._username or not self._password:
            raise NotConfigured(
                "watttime: no username/password (set the Airflow connection or "
                "CARBONFLOW_WATTTIME_USERNAME and CARBONFLOW_WATTTIME_PASSWORD)"
            )
        with self._lock:
            fresh = self._token and time.monotonic() - self._token_at < self.TOKEN_LIFETIME_S - 60
            if fresh and not force:
                return self._token  # type: ignore[return-value]
            if self._login_session is None:
                self._login_session = make_session("watttime-login", self.settings, cached=False)
            resp = self._get("/login", auth=(self._username, self._password), session=self._login_session)
            if resp.status_code in (401, 403):
                raise ProviderUnavailable(f"watttime: login refused (HTTP {resp.status_code}); check the credentials")
            body = self._json(resp, "login")
            token = body.get("token") if isinstance(body, dict) else None
            if not isinstance(token, str) or not token:
                raise ProviderUnavailable("watttime: login answer has no token")
            self._token, self._token_at = token, time.monotonic()
            return token

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        now = require_utc("now", now)
        horizon_h = int(min(72, max(1, -(-horizon_s // 3600))))
        params = {"region": region, "signal_type": "co2_moer", "horizon_hours": str(horizon_h)}
        token = self._login()
        resp = self._get(
            "/v3/forecast",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
            expire_after=self._slot_expiry_s(now),
        )
        if resp.status_code == 401:  # expired token: log in again once
            token = self._login(force=True)
            resp = self._get(
                "/v3/forecast",
                params=params,
                headers={"Authorization": f"Bearer {token}"},
                expire_after=self._slot_expiry_s(now),
            )
        body = self._json(resp, f"forecast of {region}")
        data = body.get("data") if isinstance(body, dict) else None
        meta = body.get("meta") if isinstance(body, dict) and isinstance(body.get("meta"), dict) else {}
        if not isinstance(data, list):
            raise ProviderUnavailable(f"watttime: answer for {region} has no 'data' list")
        units = meta.get("units", "lbs_co2_per_mwh")
        if units != "lbs_co2_per_mwh":
            raise ProviderUnavailable(f"watttime: units {units!r} are not the documented lbs_co2_per_mwh")
        period = float(meta.get("data_point_period_seconds") or 300)
        pairs = []
        for item in data:
            try:
                value = item.get("value")
                pairs.append(
                    (parse_utc(item["point_time"]), None if value is None else float(value) * LBS_PER_MWH_TO_G_PER_KWH)
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        end = now + timedelta(seconds=horizon_s)
        points = [p for p in _points(pairs, period) if p.end > now and p.start < end]
        if not points:
            raise ProviderUnavailable(f"watttime: no forecast values for {region} after {now.isoformat()}")
        issued = now
        if isinstance(meta.get("generated_at"), str):
            with contextlib.suppress(ValueError):
                issued = min(parse_utc(meta["generated_at"]), now)
        notes = ["WattTime v3 co2_moer (marginal), lbs/MWh x 0.45359237 = g/kWh"]
        notes += [f"watttime warning: {w.get('message')}" for w in meta.get("warnings") or [] if isinstance(w, dict)]
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=self.signal_kind,
            issued_at=issued,
            points=points,
            notes=notes,
        )


class CarbonAwareSdkProvider(_HttpProvider):
    """GSF Carbon Aware SDK WebAPI (self-hosted, no auth); locations are its named locations (e.g. ``eastus``).

    The SDK passes on its upstream's signal: WattTime (marginal, the common setup) unless ``signal_kind`` says
    otherwise.
    """

    name = "carbon-aware-sdk"
    key = "carbon-aware-sdk"
    zone_key = "carbon_aware_sdk"

    def __init__(
        self, base_url: str | None, settings: HttpSettings | None = None, *, signal_kind: SignalKind = "marginal"
    ) -> None:
        super().__init__(base_url or "", settings)
        self.configured = bool(base_url)
        self.signal_kind: SignalKind = signal_kind

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        now = require_utc("now", now)
        if not self.configured:
            raise NotConfigured(
                "carbon-aware-sdk: no URL (set the Airflow connection or CARBONFLOW_CARBON_AWARE_SDK_URL)"
            )
        params = {"location": region}
        body = self._json(
            self._get("/emissions/forecasts/current", params=params, expire_after=self._slot_expiry_s(now)),
            f"forecast of {region}",
        )
        if not isinstance(body, list) or not body or not isinstance(body[0], dict):
            raise ProviderUnavailable(f"carbon-aware-sdk: answer for {region} is not a non-empty forecast list")
        dto = body[0]
        data = dto.get("forecastData")
        if not isinstance(data, list):
            raise ProviderUnavailable(f"carbon-aware-sdk: answer for {region} has no 'forecastData' list")
        pairs = []
        for item in data:
            try:
                pairs.append((parse_utc(item["timestamp"]), item.get("value")))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        step = 300.0  # the SDK's upstream period (WattTime 5 min); the smallest gap if the answer says otherwise
        gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(sorted(pairs, key=lambda p: p[0]))]
        if gaps and min(gaps) > 0:
            step = min(gaps)
        end = now + timedelta(seconds=horizon_s)
        points = [p for p in _points(pairs, step) if p.end > now and p.start < end]
        if not points:
            raise ProviderUnavailable(f"carbon-aware-sdk: no forecast values for {region} after {now.isoformat()}")
        optimal = dto.get("optimalDataPoints")
        if optimal is None and isinstance(dto.get("optimalDataPoint"), dict):  # legacy docs variant
            optimal = [dto["optimalDataPoint"]]
        notes = [f"Carbon Aware SDK forecast for {region} (values are {dto.get('windowSize', '?')}-min rolling means)"]
        if isinstance(optimal, list) and optimal and isinstance(optimal[0], dict):
            notes.append(f"SDK optimal start {optimal[0].get('timestamp')} at {optimal[0].get('value')} gCO2/kWh")
        issued = now
        if isinstance(dto.get("generatedAt"), str):
            with contextlib.suppress(ValueError):
                issued = min(parse_utc(dto["generatedAt"]), now)
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=self.signal_kind,
            issued_at=issued,
            points=points,
            notes=notes,
        )


__all__ = [
    "LBS_PER_MWH_TO_G_PER_KWH",
    "CarbonAwareSdkProvider",
    "ElectricityMapsProvider",
    "HttpSettings",
    "NesoProvider",
    "ProviderError",
    "WattTimeProvider",
    "make_session",
]
