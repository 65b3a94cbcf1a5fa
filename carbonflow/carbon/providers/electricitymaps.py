"""Electricity Maps v3 (``auth-token`` header): forecast, history, latest."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from carbonflow.carbon.base import DEFAULT_HORIZON_S, NotConfigured, ProviderUnavailable, parse_utc, require_utc
from carbonflow.carbon.providers.http import HttpProvider, HttpSettings, slot_points
from carbonflow.carbon.providers.registry import ConnectionType, register_provider
from carbonflow.domain import Forecast, ForecastPoint, SignalKind


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


@register_provider(
    "electricitymaps",
    env={"token": "CARBONFLOW_ELECTRICITYMAPS_TOKEN", "url": "CARBONFLOW_ELECTRICITYMAPS_URL"},
    connection=ConnectionType(
        conn_type="carbonflow_electricitymaps",
        label="Electricity Maps API (carbonflow)",
        fields={
            "password": "API token (sent as the auth-token header)",
            "host": "base URL (optional, default https://api.electricitymap.org/v3)",
        },
        from_fields={"password": "token"},
        extra_fields=("emission_factor",),
    ),
)
class ElectricityMapsProvider(HttpProvider):
    """Electricity Maps API v3 with an ``auth-token`` header; zones like ``DE``, ``US-CAL-CISO``."""

    name = "electricitymaps"
    key = "electricitymaps"
    zone_key = "electricitymaps"

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Any], settings: HttpSettings) -> ElectricityMapsProvider:
        """The client from plain credentials (``token``, ``url``, ``emission_factor``)."""
        return cls(
            token=credentials.get("token"),
            base_url=credentials.get("url"),
            settings=settings,
            emission_factor=credentials.get("emission_factor", "lifecycle"),
        )

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
        points = [p for p in slot_points(pairs, 3600.0) if p.end > now and p.start < end]
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
        points = slot_points(_intensity_pairs(body, "history", region), 3600.0)
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
