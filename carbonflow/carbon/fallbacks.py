"""Keyless last resorts: climatology (hour-of-week profile of recent history) and static annual averages."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from carbonflow.carbon.base import DEFAULT_HORIZON_S, ProviderUnavailable, RegionNotSupported, floor_to, require_utc
from carbonflow.domain import Forecast, ForecastPoint, SignalKind

HistoryFn = Callable[[str, datetime, datetime], list[ForecastPoint]]


class ClimatologyProvider:
    """Forecast = the median of recent history at the same hour of the week (hour of day with < 7 days).

    ``history(zone, start, end)`` returns past points (e.g. a live API's actuals or a replay's actuals).
    """

    zone_key = "grid"

    def __init__(
        self,
        history: HistoryFn,
        *,
        signal_kind: SignalKind | Callable[[str], SignalKind],
        lookback_days: int = 28,
        name: str = "climatology",
        source: str = "recent history",
    ) -> None:
        if lookback_days < 1:
            raise ValueError(f"lookback_days={lookback_days} is not allowed; it must be >= 1")
        self.history = history
        self.signal_kind = signal_kind
        self.lookback_days = lookback_days
        self.name = name
        self.source = source

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        now = require_utc("now", now)
        try:
            past = self.history(region, now - timedelta(days=self.lookback_days), now)
        except RegionNotSupported:
            raise
        except Exception as exc:
            raise ProviderUnavailable(f"{self.name}: no history for {region} from {self.source}: {exc}") from exc
        past = [p for p in past if p.start < now]
        span_h = sum(p.length_s for p in past) / 3600.0
        if span_h < 24:
            raise ProviderUnavailable(
                f"{self.name}: only {span_h:.1f} h of history for {region} before {now.isoformat()}; needs >= 24 h"
            )
        hours = np.array([p.start.weekday() * 24 + p.start.hour for p in past])
        values = np.array([p.gco2_per_kwh for p in past])
        weekly = span_h >= 7 * 24
        key = hours if weekly else hours % 24
        n_keys = 168 if weekly else 24
        profile = np.full(n_keys, np.nan)
        for k in np.unique(key):
            profile[k] = float(np.median(values[key == k]))
        profile = np.where(np.isnan(profile), float(np.median(values)), profile)
        start = floor_to(now, 3600.0)
        n = int(np.ceil((now + timedelta(seconds=horizon_s) - start).total_seconds() / 3600.0))
        points = []
        for i in range(max(n, 1)):
            t = start + timedelta(hours=i)
            k = t.weekday() * 24 + t.hour if weekly else t.hour
            points.append(ForecastPoint(start=t, length_s=3600.0, gco2_per_kwh=float(profile[k])))
        kind = "hour-of-week" if weekly else "hour-of-day"
        return Forecast(
            region=region,
            provider=self.name,
            issued_at=now,
            points=points,
            signal_kind=self.signal_kind(region) if callable(self.signal_kind) else self.signal_kind,
            notes=[
                f"climatology: {kind} median of {span_h:.0f} h of {self.source} before {now.isoformat()}; "
                "an estimate, not a forecast"
            ],
        )


@lru_cache(maxsize=1)
def _codecarbon_tables() -> tuple[dict[str, dict], dict[str, float]]:
    spec = find_spec("codecarbon")  # locate the package's data without importing it (its import probes GPUs)
    if spec is None or not spec.submodule_search_locations:
        raise ProviderUnavailable("static:codecarbon: the codecarbon package is not installed")
    base = Path(next(iter(spec.submodule_search_locations))) / "data"
    mix = json.loads((base / "private_infra" / "global_energy_mix.json").read_text())
    cloud: dict[str, float] = {}
    with (base / "cloud" / "impact.csv").open(encoding="utf-8-sig") as handle:
        for row in csv.DictReader(handle):
            cloud[f"{row['provider']}:{row['region']}".lower()] = float(row["impact"])
    return mix, cloud


class StaticProvider:
    """codecarbon's annual average intensity for the region's country (or cloud region): the last resort."""

    zone_key = "country"
    name = "static:codecarbon"

    def zone_for(self, region: Any) -> str:
        """The cloud region if codecarbon lists it (grid-specific figure), else the country's ISO-3 code."""
        _, cloud = _codecarbon_tables()
        if region.kind == "cloud" and region.name.lower() in cloud:
            return region.name
        return region.country_iso3

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        """``region`` is a cloud region name (``gcp:europe-west2``) or an ISO-3166 alpha-3 country code."""
        now = require_utc("now", now)
        mix, cloud = _codecarbon_tables()
        value = cloud.get(region.lower())
        what = f"codecarbon cloud/impact.csv for {region}"
        if value is None:
            row = mix.get(region.upper())
            if row is None or row.get("carbon_intensity") is None:
                raise RegionNotSupported(f"{self.name}: no annual intensity for {region!r} in codecarbon's data")
            value = float(row["carbon_intensity"])
            what = f"codecarbon global_energy_mix.json, {row.get('country_name', region)} {row.get('year', '')}".strip()
        start = floor_to(now, 3600.0)
        n = max(1, int(np.ceil((now + timedelta(seconds=horizon_s) - start).total_seconds() / 3600.0)))
        points = [
            ForecastPoint(start=start + timedelta(hours=i), length_s=3600.0, gco2_per_kwh=value) for i in range(n)
        ]
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind="average-lifecycle",
            issued_at=now,
            points=points,
            notes=[f"static annual average {value:.0f} gCO2/kWh ({what}); flat, so it cannot pick a better time"],
        )
