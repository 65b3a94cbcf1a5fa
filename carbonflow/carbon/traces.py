"""Read carbon-intensity CSV files in every shape carbonflow knows, into one normalised :class:`Trace`.

Shapes (detected from the header): Let's Wait Awhile (``Time``, ``Carbon Intensity``), Electricity Maps data
portal (``Datetime (UTC)``, ``Carbon Intensity gCO₂eq/kWh (direct|LCA)``), carbonAdvisor API polls
(``zone_datetime``, ``carbon_intensity_avg``), legacy Electricity Maps export (``datetime``,
``carbon_intensity_avg``), CarbonCast forecast-vs-actual (``forecast_run_day_utc``, ``target_time_utc``, ...),
NESO long format (``issued_at_utc``, ``from_utc``, ``forecast_gco2_per_kwh``, ``actual_gco2_per_kwh``), NESO
actual + final forecast (``from_utc``, ``actual_gco2_per_kwh``), raw NESO snapshots (``from``,
``intensity.forecast``, ``intensity.actual``), Carbon Aware SDK / WattTime exports (``location``,
``timestamp``, ``duration``, ``value``), and users' own files in carbonflow's format:
``start_utc,gco2_per_kwh`` (actuals) or ``issued_at_utc,start_utc,gco2_per_kwh[,actual_gco2_per_kwh]``
(published forecasts). Time stamps mark the start of a slot and are UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from carbonflow.domain import SignalKind

_LWA_REGIONS = {"ger": "DE", "gb": "GB", "fr": "FR", "cal": "US-CAL-CISO"}
_CARBONADVISOR_ZONE_FIX = {"AUS-NSW": "AU-NSW", "AUS-VIC": "AU-VIC"}


@dataclass
class Trace:
    """A normalised carbon-intensity trace: actuals on a regular grid, and published forecasts if the file has them.

    ``actuals`` is indexed by slot start (UTC) at ``slot_s`` spacing (NaN where missing);
    ``forecasts`` has columns ``issued_at``, ``start``, ``gco2_per_kwh`` (one row per published slot).
    """

    name: str
    region: str
    signal_kind: SignalKind
    slot_s: float
    actuals: pd.Series
    forecasts: pd.DataFrame | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def has_forecasts(self) -> bool:
        return self.forecasts is not None and not self.forecasts.empty

    def merge(self, other: Trace) -> Trace:
        """Combine two traces of one region and signal kind: actuals of ``other`` win on overlap."""
        if other.region != self.region or other.signal_kind != self.signal_kind:
            raise ValueError(
                f"cannot merge trace {other.name!r} ({other.region}, {other.signal_kind}) into "
                f"{self.name!r} ({self.region}, {self.signal_kind}); region and signal kind must match"
            )
        slot_s = min(self.slot_s, other.slot_s)
        actuals = other.actuals.combine_first(self.actuals).sort_index()
        actuals = actuals[~actuals.index.duplicated(keep="last")]
        frames = [f for f in (self.forecasts, other.forecasts) if f is not None and not f.empty]
        forecasts = None
        if frames:
            forecasts = pd.concat(frames, ignore_index=True).drop_duplicates(["issued_at", "start"], keep="last")
            forecasts = forecasts.sort_values(["issued_at", "start"]).reset_index(drop=True)
        return Trace(
            name=self.name,
            region=self.region,
            signal_kind=self.signal_kind,
            slot_s=slot_s,
            actuals=actuals,
            forecasts=forecasts,
            source=f"{self.source}; {other.source}",
            notes=[*self.notes, *other.notes],
        )


def _utc_index(values: pd.Series) -> pd.DatetimeIndex:
    idx = pd.to_datetime(values, utc=True, format="mixed")
    return pd.DatetimeIndex(idx)


def _regular(series: pd.Series, slot_s: float | None = None) -> tuple[pd.Series, float]:
    """Put a series on a regular grid at its most common spacing (mean within a slot, gaps stay NaN)."""
    series = series[~series.index.duplicated(keep="last")].sort_index().astype(float)
    if slot_s is None:
        diffs = np.diff(series.index.as_unit("s").asi8).astype(float)
        diffs = diffs[diffs > 0]
        if len(diffs) == 0:
            slot_s = 3600.0
        else:
            values, counts = np.unique(diffs, return_counts=True)
            slot_s = float(values[np.argmax(counts)])
    rule = f"{int(slot_s)}s"
    regular = series.resample(rule, origin="start").mean()
    return regular, float(slot_s)


def _name_from(path: Path) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-")


def load_trace(
    path: str | Path,
    *,
    region: str | None = None,
    emission_factor: str = "lifecycle",
    name: str | None = None,
) -> Trace:
    """Read one CSV file into a :class:`Trace`.

    ``emission_factor`` chooses the column of files that hold both (``lifecycle`` or ``direct``);
    ``region`` overrides the region read from the file or its name.
    """
    path = Path(path)
    if emission_factor not in ("lifecycle", "direct"):
        raise ValueError(f"emission_factor={emission_factor!r} is not allowed; use 'lifecycle' or 'direct'")
    if not path.exists():
        raise ValueError(f"trace={str(path)!r} does not exist; give a CSV file path")
    frame = pd.read_csv(path)
    cols = set(frame.columns)
    trace_name = name or _name_from(path)
    lifecycle: SignalKind = "average-lifecycle"
    forecasts = None

    if {"Time", "Carbon Intensity"} <= cols:  # Let's Wait Awhile
        actual = pd.Series(frame["Carbon Intensity"].to_numpy(), index=_utc_index(frame["Time"]))
        zone = _LWA_REGIONS.get(path.stem.split("_")[0].lower(), path.stem.split("_")[0].upper())
        kind: SignalKind = lifecycle
        source = "Let's Wait Awhile (ENTSO-E production mix x IPCC lifecycle factors)"
    elif "Datetime (UTC)" in cols:  # Electricity Maps data portal
        want = "LCA" if emission_factor == "lifecycle" else "direct"
        col = next(c for c in frame.columns if c.startswith("Carbon Intensity") and c.endswith(f"({want})"))
        actual = pd.Series(frame[col].to_numpy(), index=_utc_index(frame["Datetime (UTC)"]))
        zone = str(frame["Zone Id"].iloc[0]) if "Zone Id" in cols else path.stem.split("_")[0]
        kind = lifecycle if emission_factor == "lifecycle" else "average-direct"
        source = f"Electricity Maps data portal ({want})"
    elif {"forecast_run_day_utc", "target_time_utc"} <= cols:  # CarbonCast
        fcol = next(c for c in frame.columns if c.startswith("forecast_") and c.endswith("_gco2_per_kwh"))
        acol = next(c for c in frame.columns if c.startswith("actual_") and c.endswith("_gco2_per_kwh"))
        target = _utc_index(frame["target_time_utc"])
        actual = pd.Series(frame[acol].to_numpy(), index=target)
        forecasts = pd.DataFrame(
            {"issued_at": _utc_index(frame["forecast_run_day_utc"]), "start": target, "gco2_per_kwh": frame[fcol]}
        )
        zone = "US-CAL-CISO" if "CISO" in path.name.upper() else path.stem.split("_")[0]
        kind = "average-direct" if "direct" in fcol else lifecycle
        source = "CarbonCast day-ahead forecasts (published model output) and actuals"
    elif {"issued_at_utc", "from_utc", "forecast_gco2_per_kwh"} <= cols:  # NESO long format
        start = _utc_index(frame["from_utc"])
        actual = pd.Series(frame["actual_gco2_per_kwh"].to_numpy(), index=start)
        issued = _utc_index(frame["issued_at_utc"])
        forecasts = pd.DataFrame({"issued_at": issued, "start": start, "gco2_per_kwh": frame["forecast_gco2_per_kwh"]})
        zone, kind, source = "GB", "average-direct", "NESO Carbon Intensity API fw48h forecasts (CC BY 4.0)"
    elif {"from_utc", "actual_gco2_per_kwh"} <= cols:  # NESO actual + final forecast
        actual = pd.Series(frame["actual_gco2_per_kwh"].to_numpy(), index=_utc_index(frame["from_utc"]))
        zone, kind, source = "GB", "average-direct", "NESO Carbon Intensity API actuals (CC BY 4.0)"
    elif {"from", "intensity.forecast"} <= cols:  # raw NESO snapshot
        start = _utc_index(frame["from"])
        stamp = re.search(r"(\d{4}-\d{2}-\d{2}T\d{2})(\d{2})Z", path.name)
        zone, kind = "GB", "average-direct"
        source = "NESO Carbon Intensity API snapshot (CC BY 4.0)"
        if path.name.startswith("fw48h") and stamp:
            issued = pd.Timestamp(f"{stamp.group(1)}:{stamp.group(2)}Z")
            forecasts = pd.DataFrame({"issued_at": issued, "start": start, "gco2_per_kwh": frame["intensity.forecast"]})
        actual = pd.Series(frame["intensity.actual"].to_numpy(dtype=float), index=start)
    elif {"zone_datetime", "carbon_intensity_avg"} <= cols:  # carbonAdvisor API polls
        actual = pd.Series(frame["carbon_intensity_avg"].to_numpy(), index=_utc_index(frame["zone_datetime"]))
        zone = _CARBONADVISOR_ZONE_FIX.get(path.stem, path.stem)
        kind, source = lifecycle, "Electricity Maps API polls (carbonAdvisor)"
    elif {"datetime", "carbon_intensity_avg"} <= cols:  # legacy Electricity Maps export
        actual = pd.Series(frame["carbon_intensity_avg"].to_numpy(), index=_utc_index(frame["datetime"]))
        zone = str(frame["zone_name"].iloc[0]) if "zone_name" in cols else path.stem.split("_")[0]
        kind, source = lifecycle, "Electricity Maps legacy export"
    elif {"location", "timestamp", "value"} <= cols:  # Carbon Aware SDK / WattTime export
        actual = pd.Series(frame["value"].to_numpy(), index=_utc_index(frame["timestamp"]))
        zone = str(frame["location"].iloc[0])
        kind, source = "marginal", "WattTime marginal signal via Carbon Aware SDK (gCO2/kWh)"
    elif {"start_utc", "gco2_per_kwh"} <= cols:  # carbonflow's own format
        start = _utc_index(frame["start_utc"])
        zone = str(frame["region"].iloc[0]) if "region" in cols else path.stem
        kind = str(frame["signal_kind"].iloc[0]) if "signal_kind" in cols else lifecycle  # type: ignore[assignment]
        if kind not in ("average-direct", "average-lifecycle", "marginal"):
            raise ValueError(
                f"signal_kind={kind!r} in {path.name} is not allowed; use average-direct, average-lifecycle or marginal"
            )
        source = "user trace"
        if "issued_at_utc" in cols:
            forecasts = pd.DataFrame(
                {"issued_at": _utc_index(frame["issued_at_utc"]), "start": start, "gco2_per_kwh": frame["gco2_per_kwh"]}
            )
            acol = "actual_gco2_per_kwh" if "actual_gco2_per_kwh" in cols else None
            actual = pd.Series(frame[acol].to_numpy() if acol else np.nan, index=start, dtype=float)
        else:
            actual = pd.Series(frame["gco2_per_kwh"].to_numpy(), index=start)
    else:
        raise ValueError(
            f"trace={path.name!r} has columns {sorted(cols)}, which carbonflow does not recognise; allowed shapes: "
            "'start_utc,gco2_per_kwh' (actuals), 'issued_at_utc,start_utc,gco2_per_kwh[,actual_gco2_per_kwh]' "
            "(forecasts), or the Let's Wait Awhile, Electricity Maps, carbonAdvisor, CarbonCast, NESO and "
            "Carbon Aware SDK export formats"
        )

    actual = actual.astype(float)
    values = actual.dropna()
    regular, slot_s = _regular(values if not values.empty else actual)
    if forecasts is not None:
        forecasts = forecasts.dropna(subset=["gco2_per_kwh"]).astype({"gco2_per_kwh": float})
        forecasts = forecasts.sort_values(["issued_at", "start"]).reset_index(drop=True)
        if values.empty:
            diffs = np.diff(np.unique(pd.DatetimeIndex(forecasts["start"]).as_unit("s").asi8))
            slot_s = float(np.min(diffs)) if len(diffs) else 3600.0
    return Trace(
        name=trace_name,
        region=region or zone,
        signal_kind=kind,
        slot_s=slot_s,
        actuals=regular,
        forecasts=forecasts,
        source=f"{source} [{path.name}]",
    )


def to_datetime(ts: pd.Timestamp) -> datetime:
    """A pandas UTC timestamp as a plain UTC datetime."""
    return ts.to_pydatetime().astimezone(UTC)
