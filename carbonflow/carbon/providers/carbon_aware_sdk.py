"""GSF Carbon Aware SDK WebAPI ``/emissions/forecasts/current`` (self-hosted, no auth)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from carbonflow.carbon.base import DEFAULT_HORIZON_S, NotConfigured, ProviderUnavailable, parse_utc, require_utc
from carbonflow.carbon.providers.http import HttpProvider, HttpSettings, slot_points
from carbonflow.carbon.providers.registry import ConnectionType, register_provider
from carbonflow.domain import Forecast, SignalKind


@register_provider(
    "carbon-aware-sdk",
    env={"url": "CARBONFLOW_CARBON_AWARE_SDK_URL"},
    connection=ConnectionType(
        conn_type="carbonflow_carbon_aware_sdk",
        label="Carbon Aware SDK WebAPI (carbonflow)",
        fields={"host": "base URL of the self-hosted WebAPI, e.g. http://carbon-aware-sdk:8080"},
    ),
)
class CarbonAwareSdkProvider(HttpProvider):
    """GSF Carbon Aware SDK WebAPI (self-hosted, no auth); locations are its named locations (e.g. ``eastus``).

    The SDK passes on its upstream's signal: WattTime (marginal, the common setup) unless ``signal_kind`` says
    otherwise.
    """

    name = "carbon-aware-sdk"
    key = "carbon-aware-sdk"
    zone_key = "carbon_aware_sdk"

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Any], settings: HttpSettings) -> CarbonAwareSdkProvider:
        """The client from plain credentials (``url``, ``signal_kind``: what the SDK's upstream gives)."""
        provider = cls(
            base_url=credentials.get("url"), settings=settings, signal_kind=credentials.get("signal_kind", "marginal")
        )
        if provider.signal_kind not in ("average-direct", "average-lifecycle", "marginal"):
            raise ValueError(
                f"credentials['carbon-aware-sdk']['signal_kind']={provider.signal_kind!r} is not allowed; use "
                "average-direct, average-lifecycle or marginal (what the SDK's upstream provider gives)"
            )
        return provider

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
        points = [p for p in slot_points(pairs, step) if p.end > now and p.start < end]
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
