"""Job traces for the cluster simulator: the Philly job table format, slices and synthetic draws.

A trace is a :class:`JobTrace` of numpy arrays, one entry per job, sorted by submission time:
``submit_s`` (seconds after the trace origin), ``duration_s`` (run time measured in the real cluster,
exclusive GPUs at the default power limit), ``num_gpus`` and ``vc`` (virtual-cluster code). The
format read is the Pollux/Philly job table (``timestamp,duration,num_gpus,gpu_time,cluster``);
any CSV with those columns works. Everything replayed from it is labelled *replayed*, and
everything drawn from its distributions (:func:`synthetic_trace`) is labelled *synthetic*.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")


class TraceError(ValueError):
    """A trace file or option that cannot be used (names the field, the value and what is allowed)."""


@dataclass
class JobTrace:
    """Jobs of a cluster trace as parallel numpy arrays, sorted by ``submit_s``."""

    origin: datetime
    submit_s: np.ndarray
    duration_s: np.ndarray
    num_gpus: np.ndarray
    vc: np.ndarray
    vc_names: list[str]
    source: str
    label: str = "replayed"
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.origin.tzinfo is None:
            raise TraceError(f"origin={self.origin.isoformat()} has no time zone; give it in UTC")
        n = len(self.submit_s)
        for name in ("duration_s", "num_gpus", "vc"):
            if len(getattr(self, name)) != n:
                raise TraceError(f"{name} has {len(getattr(self, name))} entries; submit_s has {n}; they must match")

    def __len__(self) -> int:
        return len(self.submit_s)

    @property
    def gpu_seconds(self) -> float:
        return float(np.sum(self.duration_s * self.num_gpus))


def _parse_time(value: str, row: int, path: Path) -> float:
    try:
        return datetime.fromisoformat(value.strip()).replace(tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise TraceError(f"{path}: row {row}: timestamp={value!r} is not 'YYYY-MM-DD HH:MM:SS'") from exc


def load_philly_csv(
    path: str | Path,
    start: datetime | None = None,
    end: datetime | None = None,
    max_jobs: int | None = None,
    max_gpus: int | None = None,
) -> JobTrace:
    """Read a Philly-format job table, keep submissions in ``[start, end)``, sort by submit time.

    Philly time stamps carry no zone; they are read as UTC (the simulator aligns them to carbon
    data by calendar position, see :mod:`carbonflow.simulation.grid`). ``max_gpus`` drops jobs
    asking for more GPUs than the simulated cluster has (they could never start).
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace={str(path)!r} is not a readable file; give a CSV with columns {PHILLY_COLUMNS}")
    for name, value in (("start", start), ("end", end)):
        if value is not None and value.tzinfo is None:
            raise TraceError(f"{name}={value.isoformat()} has no time zone; give it in UTC")
    if max_jobs is not None and max_jobs <= 0:
        raise TraceError(f"max_jobs={max_jobs} is not allowed; it must be a positive integer")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in PHILLY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: columns {missing} are missing; a Philly-format trace needs {PHILLY_COLUMNS}")
        ts: list[float] = []
        dur: list[float] = []
        gpus: list[int] = []
        vcs: list[str] = []
        for i, row in enumerate(reader, start=2):
            ts.append(_parse_time(row["timestamp"], i, path))
            try:
                d = float(row["duration"])
                g = int(float(row["num_gpus"]))
            except ValueError as exc:
                raise TraceError(f"{path}: row {i}: duration/num_gpus must be numbers, got {row}") from exc
            if not d >= 0 or g < 1:
                raise TraceError(f"{path}: row {i}: duration={d} must be >= 0 and num_gpus={g} >= 1")
            dur.append(d)
            gpus.append(g)
            vcs.append(row["cluster"])
    if not ts:
        raise TraceError(f"{path}: the trace has no jobs")
    t = np.asarray(ts)
    d_arr = np.asarray(dur)
    g_arr = np.asarray(gpus, dtype=np.int64)
    vc_names, vc_codes = np.unique(np.asarray(vcs), return_inverse=True)
    mask = np.ones(len(t), dtype=bool)
    notes = [f"replayed from {path.name}"]
    if start is not None:
        mask &= t >= start.timestamp()
    if end is not None:
        mask &= t < end.timestamp()
    if start is not None or end is not None:
        notes.append(f"submissions in [{start}, {end})")
    d_arr = np.maximum(d_arr, 1.0)  # a zero-length job still occupies its GPUs for the 1 s trace resolution
    if max_gpus is not None:
        too_big = g_arr > max_gpus
        if np.any(too_big & mask):
            notes.append(f"dropped {int(np.sum(too_big & mask))} jobs asking for more than {max_gpus} GPUs")
        mask &= ~too_big
    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(t[idx], kind="stable")]
    if max_jobs is not None and len(idx) > max_jobs:
        idx = idx[:max_jobs]
        notes.append(f"first {max_jobs} jobs by submission time")
    if len(idx) == 0:
        raise TraceError(f"{path}: no jobs left in the window start={start} end={end}")
    t0 = float(t[idx[0]])
    return JobTrace(
        origin=datetime.fromtimestamp(t0, UTC),
        submit_s=t[idx] - t0,
        duration_s=d_arr[idx],
        num_gpus=g_arr[idx],
        vc=vc_codes[idx].astype(np.int64),
        vc_names=[str(v) for v in vc_names],
        source=str(path),
        notes=notes,
    )


def synthetic_trace(base: JobTrace, n_jobs: int, seed: int = 0) -> JobTrace:
    """``n_jobs`` synthetic jobs drawn from ``base``'s distributions (labelled synthetic).

    Inter-arrival gaps are resampled from the base trace's gaps; (duration, GPUs, VC) are resampled
    jointly from its rows so that their correlation is kept. Used for the scale benchmark.
    """
    if n_jobs <= 0:
        raise TraceError(f"n_jobs={n_jobs} is not allowed; it must be a positive integer")
    if len(base) < 2:
        raise TraceError(f"the base trace has {len(base)} jobs; at least 2 are needed to draw inter-arrival gaps")
    rng = np.random.default_rng(seed)
    gaps = np.diff(base.submit_s)
    submit = np.concatenate(([0.0], np.cumsum(rng.choice(gaps, size=n_jobs - 1))))
    rows = rng.integers(0, len(base), size=n_jobs)
    return JobTrace(
        origin=base.origin,
        submit_s=submit,
        duration_s=base.duration_s[rows],
        num_gpus=base.num_gpus[rows],
        vc=base.vc[rows],
        vc_names=base.vc_names,
        source=base.source,
        label="synthetic",
        notes=[*base.notes, f"{n_jobs} synthetic jobs drawn from the trace's distributions (seed {seed})"],
    )
