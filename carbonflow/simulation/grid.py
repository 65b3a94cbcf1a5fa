"""A replayed grid for the simulator: carbon intensity over simulated time, with O(1) integrals.

The intensity series comes from a real carbon trace (read by :func:`carbonflow.carbon.traces.load_trace`)
and is put on a regular grid (gaps forward-filled). Simulated time ``t`` (seconds after the job
trace's origin) is mapped to the carbon trace by calendar position: the job trace's origin lands on
the same month, day and time of day in the first year of the carbon trace that holds that date (or on
its first slot when none does), and the series repeats when the simulation runs past its end. That mapping is
a replay assumption and is reported with the results.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from carbonflow.domain import Forecast, ForecastPoint, SignalKind
from carbonflow.units import kwh_from_j


class GridError(ValueError):
    """A carbon series that cannot be used."""


class CarbonGrid:
    """Piecewise-constant carbon intensity (gCO2e/kWh) on a regular grid, repeating after its end."""

    def __init__(
        self,
        start: datetime,
        step_s: float,
        values_gco2_per_kwh: np.ndarray,
        region: str,
        signal_kind: SignalKind,
        source: str,
        origin: datetime | None = None,
    ) -> None:
        if start.tzinfo is None:
            raise GridError(f"start={start.isoformat()} has no time zone; give it in UTC")
        if not step_s > 0:
            raise GridError(f"step_s={step_s} is not allowed; it must be > 0")
        values = np.asarray(values_gco2_per_kwh, dtype=float)
        if len(values) == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
            raise GridError("values_gco2_per_kwh must be a non-empty series of finite, non-negative numbers")
        self.start = start.astimezone(UTC)
        self.step_s = float(step_s)
        self.values = values
        self.region = region
        self.signal_kind: SignalKind = signal_kind
        self.source = source
        self._vals = values.tolist()
        cum = np.concatenate(([0.0], np.cumsum(values) * self.step_s))
        self._cum = cum.tolist()
        self.period_s = len(values) * self.step_s
        self._total = float(cum[-1])
        self.offset_s = 0.0
        self.origin = self.start
        if origin is not None:
            self.align(origin)
        self._forecasts: dict[tuple[int, int], Forecast] = {}

    @property
    def mean_gco2_per_kwh(self) -> float:
        return float(np.mean(self.values))

    def align(self, origin: datetime) -> None:
        """Map simulated t=0 (the job trace's ``origin``) to the same calendar position in this series."""
        if origin.tzinfo is None:
            raise GridError(f"origin={origin.isoformat()} has no time zone; give it in UTC")
        offset = 0.0
        last_year = (self.start + timedelta(seconds=self.period_s)).year
        for year in range(self.start.year, last_year + 1):
            try:
                target = origin.astimezone(UTC).replace(year=year)
            except ValueError:  # 29 February
                target = origin.astimezone(UTC).replace(year=year, day=28)
            candidate = (target - self.start).total_seconds()
            if 0 <= candidate < self.period_s:
                offset = candidate
                break
        self.offset_s = offset
        self.origin = origin.astimezone(UTC)

    def _F(self, t_s: float) -> float:
        wraps, r = divmod(t_s + self.offset_s, self.period_s)
        i = int(r // self.step_s)
        if i >= len(self._vals):
            i = len(self._vals) - 1
        return wraps * self._total + self._cum[i] + (r - i * self.step_s) * self._vals[i]

    def integral(self, t0_s: float, t1_s: float) -> float:
        """∫ intensity dt over simulated [t0, t1], in gCO2e/kWh · s."""
        return self._F(t1_s) - self._F(t0_s)

    def integral_many(self, t0_s: np.ndarray, t1_s: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`integral` over arrays of windows."""
        return self._F_many(np.asarray(t1_s, dtype=float)) - self._F_many(np.asarray(t0_s, dtype=float))

    def _F_many(self, t_s: np.ndarray) -> np.ndarray:
        u = t_s + self.offset_s
        wraps = np.floor(u / self.period_s)
        r = u - wraps * self.period_s
        i = np.minimum((r // self.step_s).astype(np.int64), len(self.values) - 1)
        cum = np.asarray(self._cum)
        return wraps * self._total + cum[i] + (r - i * self.step_s) * self.values[i]

    def emissions_g(self, power_w: float, t0_s: float, t1_s: float) -> float:
        """Grams CO2e of drawing ``power_w`` constantly over simulated [t0, t1]."""
        return kwh_from_j(power_w * self.integral(t0_s, t1_s))  # W x s x g/kWh -> g

    def intensity_at(self, t_s: float) -> float:
        r = (t_s + self.offset_s) % self.period_s
        return self._vals[min(int(r // self.step_s), len(self._vals) - 1)]

    def forecast(self, now_s: float, horizon_s: float) -> Forecast:
        """A :class:`Forecast` issued at simulated ``now_s`` covering ``horizon_s``: the replayed actuals.

        Perfect foresight (an oracle forecast); cached per grid slot so many jobs share one object.
        """
        slot = int((now_s + self.offset_s) // self.step_s)
        key = (slot, int(horizon_s // self.step_s) + 1)
        cached = self._forecasts.get(key)
        if cached is not None:
            return cached
        slot_t = slot * self.step_s - self.offset_s
        points = []
        issued = self.origin + timedelta(seconds=slot_t)
        for k in range(key[1] + 1):
            t = slot_t + k * self.step_s
            points.append(
                ForecastPoint(
                    start=self.origin + timedelta(seconds=t), length_s=self.step_s, gco2_per_kwh=self.intensity_at(t)
                )
            )
        fc = Forecast(
            region=self.region,
            provider=f"replay:{self.source}",
            signal_kind=self.signal_kind,
            issued_at=issued,
            points=points,
            replay=True,
            notes=["simulation: replayed actuals used as a perfect forecast"],
        )
        if len(self._forecasts) > 4096:
            self._forecasts.clear()
        self._forecasts[key] = fc
        return fc

    def to_datetime(self, t_s: float) -> datetime:
        return self.origin + timedelta(seconds=t_s)


def grid_from_trace_file(
    path: str | Path, origin: datetime | None = None, emission_factor: str = "lifecycle"
) -> CarbonGrid:
    """A :class:`CarbonGrid` from any carbon CSV :func:`carbonflow.carbon.traces.load_trace` reads."""
    from carbonflow.carbon.traces import load_trace

    trace = load_trace(path, emission_factor=emission_factor)
    series = trace.actuals.astype(float).ffill().bfill()
    if series.empty or not np.all(np.isfinite(series.to_numpy())):
        raise GridError(f"carbon={str(path)!r} holds no usable intensity values")
    start = series.index[0].to_pydatetime().astimezone(UTC)
    return CarbonGrid(
        start=start,
        step_s=float(trace.slot_s),
        values_gco2_per_kwh=series.to_numpy(dtype=float),
        region=trace.region,
        signal_kind=trace.signal_kind,
        source=f"{Path(path).name} ({trace.source})",
        origin=origin,
    )


def constant_grid(gco2_per_kwh: float, region: str = "constant") -> CarbonGrid:
    """A flat grid (no shifting gain is possible); for tests and for energy-only studies."""
    return CarbonGrid(
        start=datetime(2000, 1, 1, tzinfo=UTC),
        step_s=3600.0,
        values_gco2_per_kwh=np.full(24, float(gco2_per_kwh)),
        region=region,
        signal_kind="average-lifecycle",
        source="constant",
    )
