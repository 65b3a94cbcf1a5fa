"""WattTime v3: ``/login`` with basic auth, bearer token cached and renewed on 401, ``/v3/forecast`` marginal
signal, lbs/MWh converted to g/kWh (x 0.45359237)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import requests

from carbonflow.carbon.base import DEFAULT_HORIZON_S, NotConfigured, ProviderUnavailable, parse_utc, require_utc
from carbonflow.carbon.providers.http import HttpProvider, HttpSettings, make_session, slot_points
from carbonflow.carbon.providers.registry import ConnectionType, register_provider
from carbonflow.domain import Forecast, SignalKind

LBS_PER_MWH_TO_G_PER_KWH = 0.45359237


@register_provider(
    "watttime",
    env={
        "username": "CARBONFLOW_WATTTIME_USERNAME",
        "password": "CARBONFLOW_WATTTIME_PASSWORD",
        "url": "CARBONFLOW_WATTTIME_URL",
    },
    connection=ConnectionType(
        conn_type="carbonflow_watttime",
        label="WattTime API (carbonflow)",
        fields={
            "login": "username",
            "password": "password (basic auth to /login)",
            "host": "base URL (optional, default https://api.watttime.org)",
        },
        from_fields={"login": "username", "password": "password"},
    ),
)
class WattTimeProvider(HttpProvider):
    """WattTime v3 marginal signal (``co2_moer``); the bearer token is cached and renewed on 401 or after 30 min."""

    name = "watttime"
    key = "watttime"
    zone_key = "watttime"
    signal_kind: SignalKind = "marginal"
    TOKEN_LIFETIME_S = 30 * 60

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Any], settings: HttpSettings) -> WattTimeProvider:
        """The client from plain credentials (``username``, ``password``, ``url``)."""
        return cls(
            username=credentials.get("username"),
            password=credentials.get("password"),
            base_url=credentials.get("url"),
            settings=settings,
        )

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
        points = [p for p in slot_points(pairs, period) if p.end > now and p.start < end]
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
