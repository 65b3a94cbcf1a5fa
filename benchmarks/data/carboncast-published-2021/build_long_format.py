"""Write CarbonCast's published day-ahead forecasts in the shared data set in carbonflow's long format.

    python3 build_long_format.py [--shared DIR]

Reads every ``*_forecast_vs_actual_*.csv`` of ``/work/shared/data/carbon/carboncast-forecast-vs-actual/``
(columns ``forecast_run_day_utc,target_time_utc,lead_hour,forecast_<kind>_gco2_per_kwh,actual_<kind>_gco2_per_kwh``)
and writes, next to this script, one file per input in the long format of ``benchmarks/data/neso-gb-published-2023``:
``issued_at,slot_start,lead_h,forecast_gco2_per_kwh,actual_gco2_per_kwh``. Values are unchanged; ``issued_at`` is
the run day at 00:00Z (a run forecasts 96 hours from then on), ``slot_start`` the target hour, ``lead_h`` the end of
the hour minus the issue time (``lead_hour + 1``, 3 decimals; the convention of the NESO file and of
``carbonflow.carbon.calibration``). Standard library only.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path("/work/shared/data/carbon/carboncast-forecast-vs-actual")


def convert(src: Path, dst: Path) -> int:
    with src.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fcol = next(c for c in rows[0] if c.startswith("forecast_") and c.endswith("_gco2_per_kwh"))
    acol = next(c for c in rows[0] if c.startswith("actual_") and c.endswith("_gco2_per_kwh"))
    with dst.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["issued_at", "slot_start", "lead_h", "forecast_gco2_per_kwh", "actual_gco2_per_kwh"])
        for r in rows:
            out.writerow(
                [
                    f"{r['forecast_run_day_utc']}T00:00:00Z",
                    r["target_time_utc"],
                    f"{int(r['lead_hour']) + 1:.3f}",
                    r[fcol],
                    r[acol],
                ]
            )
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=SHARED)
    args = parser.parse_args()
    for src in sorted(args.shared.glob("*_forecast_vs_actual_*.csv")):
        dst = HERE / src.name.replace("_forecast_vs_actual_", "_published_long_")
        print(f"{src.name}: {convert(src, dst)} rows -> {dst.name}")


if __name__ == "__main__":
    main()
