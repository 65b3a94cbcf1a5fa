"""Replay recorded grid data as if it were a live forecast API (always labelled ``replay``).

Where a file holds published forecasts (NESO fw48h, CarbonCast, carbonflow's ``issued_at_utc`` format) the
provider serves the forecast issued at the latest issue time at or before ``now``. Where a file holds only
actuals, it serves the actuals that follow ``now`` plus a synthetic lead-time error drawn from the calibrated
:class:`~carbonflow.carbon.calibration.LeadTimeErrorModel` (seeded by region and time, so reruns agree), or the
actuals unchanged with ``synthetic_error=False`` (perfect foresight, and it says so).
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from carbonflow.carbon.base import (
    DEFAULT_HORIZON_S,
    ProviderUnavailable,
    RegionNotSupported,
    floor_to,
    require_utc,
)
from carbonflow.carbon.calibration import DATA_DIR, LeadTimeErrorModel, default_error_model
from carbonflow.carbon.traces import Trace, load_trace, to_datetime
from carbonflow.domain import Forecast, ForecastPoint

NESO_DIR = DATA_DIR / "uk-neso-forecast-vs-actual"
NESO_FW48H = NESO_DIR / "gb_national_fw48h_forecast_vs_actual_issued_2023-03-14_to_2023-03-17.csv"
NESO_ACTUALS = NESO_DIR / "gb_national_actual_and_final_forecast_2023-03-13_to_2023-03-19.csv"
DEFAULT_REPLAY_NAME = "replay:neso-gb-2023-03"
MIN_SERVE_AHEAD_S = 24 * 3600.0


class ReplayProvider:
    """Serve recorded forecasts/actuals for one or more regions.

    ``traces`` are :class:`Trace` objects or CSV paths (see :mod:`carbonflow.carbon.traces` for the shapes);
    traces of one region are merged. ``aliases`` maps extra region names (e.g. ``national``) onto a trace's region.
    """

    zone_key = "grid"

    def __init__(
        self,
        traces: Sequence[Trace | str | Path],
        *,
        name: str | None = None,
        synthetic_error: bool = True,
        error_model: LeadTimeErrorModel | None = None,
        seed: int = 0,
        aliases: dict[str, str] | None = None,
    ) -> None:
        if not traces:
            raise ValueError("traces=[] is not allowed; give at least one CSV file or Trace")
        self._traces: dict[str, Trace] = {}
        for item in traces:
            trace = item if isinstance(item, Trace) else load_trace(item)
            key = trace.region.upper()
            self._traces[key] = self._traces[key].merge(trace) if key in self._traces else trace
        first = next(iter(self._traces.values()))
        self.name = name or (f"replay:{first.name}" if len(self._traces) == 1 else "replay:traces")
        self.synthetic_error = synthetic_error
        self.error_model = error_model or default_error_model()
        self.seed = seed
        self.aliases = {k.upper(): v.upper() for k, v in (aliases or {}).items()}

    @classmethod
    def default(cls, **kwargs: object) -> ReplayProvider:
        """The shipped NESO GB national forecasts issued 2023-03-14..17 and actuals 2023-03-13..19."""
        trace = load_trace(NESO_ACTUALS).merge(load_trace(NESO_FW48H))
        trace.name = "neso-gb-2023-03"
        return cls([trace], name=DEFAULT_REPLAY_NAME, aliases={"NATIONAL": "GB", "UK": "GB"}, **kwargs)  # type: ignore[arg-type]

    @property
    def regions(self) -> list[str]:
        return sorted(self._traces)

    def trace(self, region: str) -> Trace:
        key = self.aliases.get(region.upper(), region.upper())
        if key not in self._traces:  # a cloud region or GB sub-region: its grid zone (e.g. aws:eu-west-2 -> GB)
            from carbonflow.carbon.regions import resolve_region

            with contextlib.suppress(ValueError):
                key = resolve_region(region).grid_zone.upper()
        if key not in self._traces:
            raise RegionNotSupported(
                f"region={region!r} is not in replay {self.name}; allowed: {', '.join(self.regions)}"
            )
        return self._traces[key]

    def replay_window(self, region: str | None = None) -> tuple[datetime, datetime]:
        """(first, last) ``now`` for which this replay serves a forecast at least 24 h long (or as long as it has)."""
        trace = self.trace(region) if region else next(iter(self._traces.values()))
        if trace.has_forecasts:
            assert trace.forecasts is not None
            issues = trace.forecasts.groupby("issued_at")["start"].max()
            first = to_datetime(issues.index.min())
            last_issue = issues.index.max()
            last_end = to_datetime(issues.iloc[-1]) + timedelta(seconds=trace.slot_s)
            last = max(to_datetime(last_issue), last_end - timedelta(seconds=MIN_SERVE_AHEAD_S))
            return first, last
        valid = trace.actuals.dropna()
        first = to_datetime(valid.index.min())
        end = to_datetime(valid.index.max()) + timedelta(seconds=trace.slot_s)
        return first, max(first, end - timedelta(seconds=MIN_SERVE_AHEAD_S))

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        """The forecast known at ``now``: the latest published issue, or actuals plus synthetic error."""
        now = require_utc("now", now)
        if horizon_s <= 0:
            raise ValueError(f"horizon_s={horizon_s} is not allowed; it must be > 0")
        trace = self.trace(region)
        end = now + timedelta(seconds=horizon_s)
        if trace.has_forecasts:
            return self._published(trace, region, now, end)
        return self._from_actuals(trace, region, now, end)

    def _published(self, trace: Trace, region: str, now: datetime, end: datetime) -> Forecast:
        assert trace.forecasts is not None
        frame = trace.forecasts
        issued = frame["issued_at"][frame["issued_at"] <= pd.Timestamp(now)]
        if issued.empty:
            first, last = self.replay_window(region)
            raise ProviderUnavailable(
                f"{self.name}: no forecast for {region} was issued at or before {now.isoformat()}; "
                f"this replay covers {first.isoformat()} .. {last.isoformat()}"
            )
        issue = issued.max()
        rows = frame[frame["issued_at"] == issue]
        slot = pd.Timedelta(seconds=trace.slot_s)
        rows = rows[(rows["start"] + slot > pd.Timestamp(now)) & (rows["start"] < pd.Timestamp(end))]
        if rows.empty:
            raise ProviderUnavailable(
                f"{self.name}: the latest forecast for {region} (issued {to_datetime(issue).isoformat()}) "
                f"ends before {now.isoformat()}"
            )
        points = [
            ForecastPoint(start=to_datetime(s), length_s=trace.slot_s, gco2_per_kwh=max(0.0, float(v)))
            for s, v in zip(rows["start"], rows["gco2_per_kwh"], strict=True)
        ]
        level = float(np.mean([p.gco2_per_kwh for p in points]))
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=trace.signal_kind,
            issued_at=to_datetime(issue),
            points=points,
            replay=True,
            error_mae_by_lead_h=self.error_model.mae_by_lead_h(level),
            notes=[f"replay of the forecast published at {to_datetime(issue).isoformat()} ({trace.source})"],
        )

    def _from_actuals(self, trace: Trace, region: str, now: datetime, end: datetime) -> Forecast:
        series = trace.actuals
        start = floor_to(now, trace.slot_s)
        window = series[(series.index >= pd.Timestamp(start)) & (series.index < pd.Timestamp(end))].dropna()
        if window.empty:
            first, last = self.replay_window(region)
            raise ProviderUnavailable(
                f"{self.name}: no recorded data for {region} after {now.isoformat()}; "
                f"this replay covers {first.isoformat()} .. {last.isoformat()}"
            )
        values = window.to_numpy(dtype=float)
        starts = [to_datetime(ts) for ts in window.index]
        if self.synthetic_error:
            lead_h = np.array([(s.timestamp() + trace.slot_s - now.timestamp()) / 3600.0 for s in starts])
            seed = zlib.crc32(f"{self.seed}:{trace.region}:{int(now.timestamp())}".encode())
            rng = np.random.default_rng(seed)
            values = self.error_model.sample(values[None, :], lead_h, trace.slot_s / 3600.0, rng)[0]
            note = (
                f"replay: recorded actuals ({trace.source}) plus synthetic lead-time error "
                f"(calibrated model '{self.error_model.source}', seed {seed}); not a published forecast"
            )
        else:
            note = f"replay with perfect foresight: the recorded actuals ({trace.source}) served as the forecast"
        points = [
            ForecastPoint(start=s, length_s=trace.slot_s, gco2_per_kwh=max(0.0, float(v)))
            for s, v in zip(starts, values, strict=True)
        ]
        level = float(np.mean(window.to_numpy(dtype=float)))
        return Forecast(
            region=region,
            provider=self.name,
            signal_kind=trace.signal_kind,
            issued_at=now,
            points=points,
            replay=True,
            error_mae_by_lead_h=self.error_model.mae_by_lead_h(level) if self.synthetic_error else None,
            notes=[note],
        )

    def actuals(self, region: str, start: datetime, end: datetime) -> list[ForecastPoint]:
        """Recorded actuals of the slots overlapping ``[start, end)`` (missing slots are left out)."""
        start = require_utc("start", start)
        end = require_utc("end", end)
        trace = self.trace(region)
        slot = pd.Timedelta(seconds=trace.slot_s)
        series = trace.actuals.dropna()
        series = series[(series.index + slot > pd.Timestamp(start)) & (series.index < pd.Timestamp(end))]
        return [
            ForecastPoint(start=to_datetime(ts), length_s=trace.slot_s, gco2_per_kwh=max(0.0, float(v)))
            for ts, v in series.items()
        ]
