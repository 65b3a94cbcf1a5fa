"""UK NESO Carbon Intensity API v2 (no key): national, region id, postcode."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from carbonflow.carbon.base import (
    DEFAULT_HORIZON_S,
    ProviderUnavailable,
    RegionNotSupported,
    floor_to,
    parse_utc,
    require_utc,
)
from carbonflow.carbon.providers.http import HttpProvider, HttpSettings, slot_points
from carbonflow.carbon.providers.registry import ConnectionType, register_provider
from carbonflow.domain import Forecast, ForecastPoint, SignalKind


def _fmt_neso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


@register_provider(
    "neso",
    env={"url": "CARBONFLOW_NESO_URL"},
    connection=ConnectionType(
        conn_type="carbonflow_neso",
        label="UK NESO Carbon Intensity API (carbonflow, no key)",
        fields={"host": "base URL (optional, default https://api.carbonintensity.org.uk)"},
    ),
)
class NesoProvider(HttpProvider):
    """UK NESO Carbon Intensity API v2: zones ``national``, ``regionid:<1-17>``, ``postcode:<outward code>``.

    Signal: average, CO2 only, operational (``average-direct``). Data licence CC BY 4.0.
    """

    name = "neso"
    key = "neso"
    zone_key = "neso"
    signal_kind: SignalKind = "average-direct"

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Any], settings: HttpSettings) -> NesoProvider:
        """The client from plain credentials (``url``) as :func:`~carbonflow.carbon.chain.default_chain` gives them."""
        return cls(base_url=credentials.get("url"), settings=settings)

    def history_zone(self, zone: str) -> str | None:
        """The zone whose actuals :meth:`actuals` serves for ``zone`` (only the national series has any)."""
        return "national" if zone == "national" else None

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
        points = [p for p in slot_points(pairs, 1800.0) if p.end > now and p.start < end]
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
            out.extend(slot_points(pairs, 1800.0))
            cursor = stop
        return out
