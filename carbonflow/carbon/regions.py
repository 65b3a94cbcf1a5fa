"""Regions: cloud region names (``aws:``, ``gcp:``, ``azure:``) and grid zones, mapped per provider.

The table is ``data/regions.csv`` (shipped in the package). Besides its rows, NESO's GB regions are accepted as
``GB-<regionid>`` (1-17, e.g. ``GB-13`` London) and ``GB-<outward postcode>`` (e.g. ``GB-SW1``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

REGIONS_CSV = Path(__file__).parent / "data" / "regions.csv"
BASE_COLUMNS = ("region", "kind", "country_iso3", "location")


def _zone_columns() -> tuple[str, ...]:
    """The zone columns of ``regions.csv``: every column after the base ones, one per provider ``zone_key``.

    A provider with zone codes of its own adds its column to the CSV (its fixture) and names it as its
    ``zone_key``; providers that use the grid zone (``zone_key = "grid"``) or the country need no column.
    """
    with REGIONS_CSV.open(newline="") as handle:
        header = next(csv.reader(handle))
    return tuple(c for c in header if c not in BASE_COLUMNS)


PROVIDER_COLUMNS = _zone_columns()
NESO_REGION_IDS = {
    1: "North Scotland",
    2: "South Scotland",
    3: "North West England",
    4: "North East England",
    5: "Yorkshire",
    6: "North Wales & Merseyside",
    7: "South Wales",
    8: "West Midlands",
    9: "East Midlands",
    10: "East England",
    11: "South West England",
    12: "South England",
    13: "London",
    14: "South East England",
    15: "England",
    16: "Scotland",
    17: "Wales",
}
_POSTCODE_RE = re.compile(r"^[A-Z]{1,2}[0-9][0-9A-Z]?$")


@dataclass(frozen=True)
class ResolvedRegion:
    """A region and its zone code for each provider (``None``: the provider does not cover it)."""

    name: str
    kind: str
    country_iso3: str
    location: str
    zones: dict[str, str | None] = field(default_factory=dict)

    @property
    def grid_zone(self) -> str:
        """The grid zone (Electricity Maps code) used by replay, climatology and reports."""
        return self.zones.get("electricitymaps") or self.name

    def zone(self, provider_key: str) -> str | None:
        return self.zones.get(provider_key)


@lru_cache(maxsize=1)
def region_table() -> dict[str, ResolvedRegion]:
    """All rows of ``regions.csv`` keyed by upper-case region name."""
    table: dict[str, ResolvedRegion] = {}
    with REGIONS_CSV.open(newline="") as handle:
        for row in csv.DictReader(handle):
            zones = {col: (row[col] or None) for col in PROVIDER_COLUMNS}
            table[row["region"].upper()] = ResolvedRegion(
                name=row["region"],
                kind=row["kind"],
                country_iso3=row["country_iso3"],
                location=row["location"],
                zones=zones,
            )
    return table


def allowed_examples(limit: int = 12) -> list[str]:
    """A few allowed region names for error messages."""
    names = [r.name for r in region_table().values()]
    grid = [n for n in names if ":" not in n][:4]
    cloud = [n for n in names if ":" in n]
    picks = [*grid, cloud[0], cloud[len(cloud) // 2], cloud[-1], "GB-13", "GB-SW1"]
    return picks[:limit]


def resolve_region(region: str) -> ResolvedRegion:
    """Map a user's region to zones per provider; ValueError names the field, its value and allowed examples."""
    if not isinstance(region, str) or not region.strip():
        raise ValueError(f"region={region!r} is not allowed; allowed e.g. {', '.join(allowed_examples())}")
    text = region.strip()
    table = region_table()
    row = table.get(text.upper())
    if row is not None:
        return row
    match = re.match(r"^GB-(.+)$", text, re.IGNORECASE)
    if match:
        gb = table["GB"]
        part = match.group(1).upper()
        if part.isdigit() and int(part) in NESO_REGION_IDS:
            neso = f"regionid:{int(part)}"
            location = NESO_REGION_IDS[int(part)]
        elif _POSTCODE_RE.match(part):
            neso = f"postcode:{part}"
            location = f"GB postcode {part}"
        else:
            raise ValueError(
                f"region={region!r} is not allowed; GB sub-regions are GB-<regionid 1-17> (e.g. GB-13 London) "
                "or GB-<outward postcode> (e.g. GB-SW1)"
            )
        zones = dict(gb.zones)
        zones["neso"] = neso
        return ResolvedRegion(name=text.upper(), kind="grid", country_iso3="GBR", location=location, zones=zones)
    provider, _, _name = text.partition(":")
    known_clouds = sorted({n.split(":")[0] for n in table if ":" in n})
    if _name and provider.lower() in {c.lower() for c in known_clouds}:
        same = [r.name for r in table.values() if r.name.lower().startswith(provider.lower() + ":")]
        raise ValueError(f"region={region!r} is not a known {provider.lower()} region; allowed: {', '.join(same)}")
    raise ValueError(
        f"region={region!r} is not a known region; allowed: a grid zone, a cloud region or a NESO GB region, "
        f"e.g. {', '.join(allowed_examples())} (full list: {REGIONS_CSV})"
    )


def all_regions() -> list[str]:
    """Every region name in the table (for UI choices and DAG Params enums)."""
    return [r.name for r in region_table().values()]
