"""Forecast error as a function of lead time, calibrated on real published forecasts.

``python benchmarks/fit_error_calibration.py`` (or ``python -m carbonflow.carbon.calibration [--neso-long FILE]
[--neso FILE] [--carboncast FILE] [--out FILE]``) measures the error of NESO's GB national forecasts on the 91-issue
archive in ``benchmarks/data/neso-gb-published-2023`` (the product's NESO calibration), keeps the former fit on the
four issues of 14-17 March 2023 shipped in ``data/`` under ``superseded``, measures CarbonCast's California day-ahead
forecasts (all the shared data set holds: 8 daily runs) and writes ``data/error_calibration.json``, with the days
each fit used (``error_calibration_days``). Nothing in that file is typed by hand: :func:`default_error_model` reads
it, and a test recomputes it from the source files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

DATA_DIR = Path(__file__).parent / "data"
CALIBRATION_PATH = DATA_DIR / "error_calibration.json"
NESO_FW48H = (
    DATA_DIR
    / "uk-neso-forecast-vs-actual"
    / ("gb_national_fw48h_forecast_vs_actual_issued_2023-03-14_to_2023-03-17.csv")
)
NESO_LONG = (
    Path(__file__).resolve().parents[2]
    / "benchmarks"
    / "data"
    / "neso-gb-published-2023"
    / "gb_national_fw48h_evening_forecasts_2023-03-14_to_2023-06-24.csv"
)
"""NESO's evening 48 h forecasts of 91 days (14 March - 24 June 2023) with their actuals, in the repository (not in
the installed package: fitting is done from a checkout; the product reads only the JSON)."""
IMPLAUSIBLE_FRACTION = 0.5
"""A published actual below this fraction of the median of its 4 h neighbourhood (or <= 0) is a known bad
publication (see that folder's README: 0, 4, 29 gCO2/kWh amid 150-250) and is left out of the fit."""
SHARED_CARBONCAST = Path("/work/shared/data/carbon/carboncast-forecast-vs-actual") / (
    "US-CISO_lifecycle_96h_forecast_vs_actual_2021-07-01_to_2021-07-11.csv"
)
LEAD_EDGES_H = (0.0, 6.0, 12.0, 24.0, 36.0, 48.0, 72.0, 96.0)


@dataclass(frozen=True)
class LeadTimeErrorModel:
    """Relative forecast error growing with lead time, with errors correlated between neighbouring slots.

    ``rel_rmse[i]`` is the root-mean-square of (forecast - actual) / actual for lead times in
    ``(lead_edges_h[i], lead_edges_h[i+1]]``; ``phi_per_h`` is the correlation of the error of two slots one
    hour apart in the same forecast (an AR(1) process along the lead time).
    """

    lead_edges_h: tuple[float, ...]
    rel_rmse: tuple[float, ...]
    rel_mae: tuple[float, ...]
    phi_per_h: float
    source: str = "calibrated"

    def sigma_rel(self, lead_h: np.ndarray | float) -> np.ndarray:
        """Relative error standard deviation at each lead time (h); beyond the last bin the last value holds."""
        lead = np.asarray(lead_h, dtype=float)
        idx = np.searchsorted(np.asarray(self.lead_edges_h[1:-1]), lead, side="left")
        return np.asarray(self.rel_rmse)[np.clip(idx, 0, len(self.rel_rmse) - 1)]

    def mae_by_lead_h(self, level_gco2_per_kwh: float) -> dict[float, float]:
        """Absolute mean error (gCO2/kWh) by lead-time upper bound, for a series at the given mean level."""
        return {
            float(hi): round(float(mae) * level_gco2_per_kwh, 2)
            for hi, mae in zip(self.lead_edges_h[1:], self.rel_mae, strict=True)
        }

    def sample(self, actual: np.ndarray, lead_h: np.ndarray, slot_h: float, rng: np.random.Generator) -> np.ndarray:
        """Synthetic forecasts: ``actual`` (n x H) times (1 + sigma(lead) * z), z an AR(1) along the H axis."""
        actual = np.atleast_2d(np.asarray(actual, dtype=float))
        n, horizon = actual.shape
        phi = float(self.phi_per_h) ** float(slot_h)
        innov = rng.standard_normal((n, horizon))
        z = np.empty_like(innov)
        z[:, 0] = innov[:, 0]
        scale = np.sqrt(max(0.0, 1.0 - phi * phi))
        for k in range(1, horizon):
            z[:, k] = phi * z[:, k - 1] + scale * innov[:, k]
        sigma = self.sigma_rel(np.asarray(lead_h, dtype=float))[None, :]
        return np.clip(actual * (1.0 + sigma * z), 0.0, None)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _lag1_per_hour(frame: pd.DataFrame, issue_col: str, slot_h: float) -> float:
    corrs = []
    for _, group in frame.groupby(issue_col):
        err = group["rel"].dropna().to_numpy()
        if len(err) > 3 and np.std(err) > 0:
            corrs.append(float(np.corrcoef(err[:-1], err[1:])[0, 1]))
    lag1 = float(np.clip(np.mean(corrs), 1e-6, 0.999999))
    return lag1 ** (1.0 / slot_h)


def _bins(frame: pd.DataFrame) -> dict[str, list]:
    edges = list(LEAD_EDGES_H)
    cut = pd.cut(frame["lead_h"], edges, right=True)
    rows: dict[str, list] = {"rel_rmse": [], "rel_mae": [], "rel_bias": [], "mae_gco2_per_kwh": [], "n": []}
    for interval in cut.cat.categories:
        sel = frame[cut == interval].dropna(subset=["rel"])
        if sel.empty:
            for key in rows:
                rows[key].append(None)
            continue
        rows["rel_rmse"].append(round(float(np.sqrt(np.mean(sel["rel"] ** 2))), 4))
        rows["rel_mae"].append(round(float(np.mean(np.abs(sel["rel"]))), 4))
        rows["rel_bias"].append(round(float(np.mean(sel["rel"])), 4))
        rows["mae_gco2_per_kwh"].append(round(float(np.mean(np.abs(sel["err"]))), 2))
        rows["n"].append(len(sel))
    return rows


def measure_neso(path: Path) -> dict:
    """Error statistics of the NESO GB national fw48h forecasts (long format)."""
    frame = pd.read_csv(path)
    frame = frame.rename(columns={"lead_time_h": "lead_h"})
    frame["err"] = frame["forecast_gco2_per_kwh"] - frame["actual_gco2_per_kwh"]
    frame["rel"] = frame["err"] / frame["actual_gco2_per_kwh"]
    out = {"file": path.name, "sha256": _sha256(path), "rows": len(frame), "lead_edges_h": list(LEAD_EDGES_H)}
    out.update(_bins(frame))
    out["phi_per_h"] = round(_lag1_per_hour(frame, "issued_at_utc", 0.5), 4)
    return out


def plausible_actuals(actual: pd.Series, slot_s: float = 1800.0) -> pd.Series:
    """The actual series (indexed by slot start) with implausible publications set to NaN: <= 0, or below
    ``IMPLAUSIBLE_FRACTION`` of the median of the 4 h around it (the slot included)."""
    regular = actual.resample(f"{int(slot_s)}s").mean()
    width = max(3, round(4 * 3600 / slot_s) + 1)
    median = regular.rolling(width, center=True, min_periods=3).median()
    bad = (regular <= 0) | (regular < IMPLAUSIBLE_FRACTION * median)
    return regular.mask(bad).reindex(actual.index)


def measure_neso_long(path: Path = NESO_LONG) -> dict:
    """Error statistics of NESO's forecasts in the long format of ``benchmarks/data/neso-gb-published-2023``
    (``issued_at,slot_start,lead_h,forecast_gco2_per_kwh,actual_gco2_per_kwh``); implausible published actuals
    (:func:`plausible_actuals`) are left out. ``error_calibration_days``: issues (one a day) with at least one
    forecast/actual pair."""
    frame = pd.read_csv(path)
    slot = pd.to_datetime(frame["slot_start"], utc=True)
    actual = pd.Series(frame["actual_gco2_per_kwh"].to_numpy(dtype=float), index=slot)
    actual = actual[~actual.index.duplicated(keep="last")].sort_index()
    good = plausible_actuals(actual)
    frame["actual"] = good.reindex(slot).to_numpy()
    frame["err"] = frame["forecast_gco2_per_kwh"] - frame["actual"]
    frame["rel"] = frame["err"] / frame["actual"]
    used = frame.dropna(subset=["rel"])
    days = sorted(used["issued_at"].str[:10].unique())
    issues = frame["issued_at"].nunique()
    out = {
        "file": path.name,
        "sha256": _sha256(path),
        "rows": len(frame),
        "pairs_used": len(used),
        "implausible_actuals_left_out": int(actual.notna().sum() - good.notna().sum()),
        "error_calibration_days": len(days),
        "fitted_on": f"{len(days)} evening issues {days[0]} .. {days[-1]} (of {issues}"
        + ("; the others have no published actual in the archive)" if len(days) < issues else ")"),
        "lead_edges_h": list(LEAD_EDGES_H),
    }
    out.update(_bins(frame))
    out["phi_per_h"] = round(_lag1_per_hour(frame, "issued_at", 0.5), 4)
    return out


def measure_carboncast(path: Path) -> dict:
    """Error statistics of CarbonCast's 96 h day-ahead forecasts (lead time = end of the hour - run start)."""
    frame = pd.read_csv(path)
    fcol = next(c for c in frame.columns if c.startswith("forecast_") and c.endswith("_gco2_per_kwh"))
    acol = next(c for c in frame.columns if c.startswith("actual_") and c.endswith("_gco2_per_kwh"))
    frame["lead_h"] = frame["lead_hour"] + 1.0
    frame["err"] = frame[fcol] - frame[acol]
    frame["rel"] = frame["err"] / frame[acol]
    out = {"file": path.name, "sha256": _sha256(path), "rows": len(frame), "lead_edges_h": list(LEAD_EDGES_H)}
    out.update(_bins(frame))
    out["phi_per_h"] = round(_lag1_per_hour(frame, "forecast_run_day_utc", 1.0), 4)
    days = sorted(frame["forecast_run_day_utc"].astype(str).unique())
    out["error_calibration_days"] = len(days)
    out["fitted_on"] = f"{len(days)} daily runs {days[0]} .. {days[-1]} (all the shared data set holds)"
    return out


def pool(sources: dict[str, dict]) -> dict:
    """Equal-weight mean of the sources' curves, bin by bin (a bin uses the sources that reach it)."""
    pooled: dict[str, list | float] = {"lead_edges_h": list(LEAD_EDGES_H)}
    for key in ("rel_rmse", "rel_mae", "rel_bias"):
        values = []
        for i in range(len(LEAD_EDGES_H) - 1):
            vals = [s[key][i] for s in sources.values() if s[key][i] is not None]
            values.append(round(float(np.mean(vals)), 4))
        pooled[key] = values
    pooled["phi_per_h"] = round(float(np.mean([s["phi_per_h"] for s in sources.values()])), 4)
    return pooled


def compute(neso_long: Path = NESO_LONG, neso: Path = NESO_FW48H, carboncast: Path | None = SHARED_CARBONCAST) -> dict:
    """The full calibration document (what ``error_calibration.json`` holds): ``sources`` are what the product and
    the benchmarks use; ``superseded`` keeps the former NESO fit (4 issues) beside it for comparison."""
    sources = {"neso-gb-national": measure_neso_long(neso_long)}
    if carboncast is not None and Path(carboncast).exists():
        sources["carboncast-us-ciso"] = measure_carboncast(Path(carboncast))
    old = measure_neso(neso)
    old["error_calibration_days"] = int(pd.read_csv(neso)["issued_at_utc"].str[:10].nunique())
    old["fitted_on"] = "4 midday issues 2023-03-14 .. 2023-03-17 (inside the 91-issue archive that replaces it)"
    return {
        "generated_by": "python benchmarks/fit_error_calibration.py",
        "definition": "rel = (forecast - actual) / actual; lead = end of slot - issue time (h); "
        "phi_per_h = lag-1 autocorrelation of rel within one issue, per hour",
        "error_calibration_days": {k: v["error_calibration_days"] for k, v in sources.items()},
        "sources": sources,
        "pooled": pool(sources),
        "superseded": {
            "neso-gb-national": old,
            "pooled": pool({"neso-gb-national": old, **{k: v for k, v in sources.items() if k != "neso-gb-national"}}),
        },
    }


def provider_error(which: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(lead bin upper edges h, relative bias, relative spread about the bias, phi per hour) of one provider's
    calibration in ``carbonflow/carbon/data/error_calibration.json``; bins without data hold the last known."""
    doc = json.loads(CALIBRATION_PATH.read_text())["sources"][which]
    edges = np.asarray(doc["lead_edges_h"][1:], dtype=float)
    bias, rmse = [], []
    for b, r in zip(doc["rel_bias"], doc["rel_rmse"], strict=True):
        bias.append(bias[-1] if b is None else b)
        rmse.append(rmse[-1] if r is None else r)
    bias_a, rmse_a = np.asarray(bias), np.asarray(rmse)
    return edges, bias_a, np.sqrt(np.maximum(rmse_a**2 - bias_a**2, 0.0)), float(doc["phi_per_h"])


def sample_biased(actual: np.ndarray, lead_h: np.ndarray, slot_h: float, which: str, rng) -> np.ndarray:
    """Synthetic forecasts ``actual x (1 + bias(lead) + spread(lead) z)``, z an AR(1) along the lead time, with
    the bias, spread and correlation one provider's published forecasts showed."""
    edges, bias, spread, phi_h = provider_error(which)
    i = np.clip(np.searchsorted(edges, lead_h, side="left"), 0, len(edges) - 1)
    actual = np.atleast_2d(actual)
    phi = phi_h**slot_h
    innov = rng.standard_normal(actual.shape)
    z = np.empty_like(innov)
    z[:, 0] = innov[:, 0]
    for k in range(1, actual.shape[1]):
        z[:, k] = phi * z[:, k - 1] + np.sqrt(1 - phi * phi) * innov[:, k]
    return np.clip(actual * (1.0 + bias[i][None, :] + spread[i][None, :] * z), 0.0, None)


def model_from(doc: dict, which: str = "pooled") -> LeadTimeErrorModel:
    """Build an error model from a calibration document (``pooled`` or a source name)."""
    part = doc["pooled"] if which == "pooled" else doc["sources"][which]
    rmse = [v for v in part["rel_rmse"] if v is not None]
    mae = [v for v in part["rel_mae"] if v is not None]
    edges = tuple(part["lead_edges_h"][: len(rmse) + 1])
    return LeadTimeErrorModel(edges, tuple(rmse), tuple(mae), float(part["phi_per_h"]), source=which)


@lru_cache(maxsize=4)
def default_error_model(which: str = "pooled") -> LeadTimeErrorModel:
    """The shipped calibration (NESO GB + CarbonCast CISO, pooled unless a source is named)."""
    return model_from(json.loads(CALIBRATION_PATH.read_text()), which)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neso-long", type=Path, default=NESO_LONG)
    parser.add_argument("--neso", type=Path, default=NESO_FW48H, help="the former 4-issue sample (kept, superseded)")
    parser.add_argument("--carboncast", type=Path, default=SHARED_CARBONCAST)
    parser.add_argument("--out", type=Path, default=CALIBRATION_PATH)
    args = parser.parse_args(argv)
    if not args.carboncast.exists():
        raise SystemExit(f"--carboncast={args.carboncast} does not exist; give the CarbonCast forecast-vs-actual CSV")
    if not args.neso_long.exists():
        raise SystemExit(f"--neso-long={args.neso_long} does not exist; give the long-format NESO archive")
    doc = compute(args.neso_long, args.neso, args.carboncast)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["pooled"], indent=2))


if __name__ == "__main__":
    main()
