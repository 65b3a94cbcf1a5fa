#!/usr/bin/env python3
"""Build the long-format forecast-vs-actual file from the raw snapshots in ``raw/``.

Standard library only; rerunnable (overwrites the output file).

Inputs (see README.md for provenance):
  raw/fw48h_<YYYY-MM-DD>T<HHMM>Z.csv  one evening 48 h forecast per issue day
  raw/pt24h_<YYYY-MM-DD>T<HHMM>Z.csv  past-24 h snapshots holding the actual intensity
Each has the columns ``from,intensity.forecast,intensity.actual`` (half-hour slot start, gCO2/kWh).

Output: gb_national_fw48h_evening_forecasts_2023-03-14_to_2023-06-24.csv with one row per (issue, slot):
  issued_at              snapshot time of the fw48h file, e.g. 2023-03-14T18:01:00Z
  slot_start             start of the half-hour slot, e.g. 2023-03-14T18:00:00Z
  lead_h                 hours from issued_at to the END of the slot (slot_start + 30 min), 3 decimals;
                         same convention as carbonflow's ``lead_time_h`` (first slot = 0.483 h)
  forecast_gco2_per_kwh  the published forecast, unchanged
  actual_gco2_per_kwh    actual from the latest pt24h snapshot (by snapshot time) that has a non-empty
                         actual for the slot, unchanged; empty if no snapshot has one
"""

from __future__ import annotations

import csv
import datetime as dt
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
OUT = HERE / "gb_national_fw48h_evening_forecasts_2023-03-14_to_2023-06-24.csv"
NAME = re.compile(r"^(fw48h|pt24h)_(\d{4}-\d{2}-\d{2}T\d{4}Z)\.csv$")
SLOT = dt.timedelta(minutes=30)


def _snap_time(ts: str) -> dt.datetime:
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H%MZ").replace(tzinfo=dt.UTC)


def _slot_time(s: str) -> dt.datetime:
    return dt.datetime.strptime(s, "%Y-%m-%dT%H:%MZ").replace(tzinfo=dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if rows and list(rows[0]) != ["from", "intensity.forecast", "intensity.actual"]:
        raise ValueError(f"{path}: unexpected columns {list(rows[0])}")
    return rows


def main() -> int:
    snaps: dict[str, list[tuple[dt.datetime, Path]]] = {"fw48h": [], "pt24h": []}
    for p in sorted(RAW.iterdir()):
        m = NAME.match(p.name)
        if m:
            snaps[m.group(1)].append((_snap_time(m.group(2)), p))

    # actual per slot: latest pt24h snapshot with a non-empty value wins
    actual: dict[dt.datetime, tuple[dt.datetime, str]] = {}
    for t_snap, p in sorted(snaps["pt24h"]):
        for r in _rows(p):
            a = (r["intensity.actual"] or "").strip()
            if a:
                actual[_slot_time(r["from"])] = (t_snap, a)

    n = 0
    with OUT.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["issued_at", "slot_start", "lead_h", "forecast_gco2_per_kwh", "actual_gco2_per_kwh"])
        for t_issue, p in sorted(snaps["fw48h"]):
            for r in _rows(p):
                t = _slot_time(r["from"])
                lead = (t + SLOT - t_issue).total_seconds() / 3600.0
                a = actual.get(t, (None, ""))[1]
                w.writerow([_iso(t_issue), _iso(t), f"{lead:.3f}", r["intensity.forecast"], a])
                n += 1
    print(f"{OUT.name}: {n} rows from {len(snaps['fw48h'])} fw48h and {len(snaps['pt24h'])} pt24h snapshots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
