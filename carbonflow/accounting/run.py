"""Turn what a wrapped run measured into a :class:`RunResult`: totals, emissions, savings.

It reads the run through :class:`MeasuredRun` (what ``carbonflow.execution.wrapper.WrappedRun`` carries), so
accounting does not import the execution layer that calls it.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Protocol

from carbonflow.accounting.emissions import emissions_g
from carbonflow.accounting.saving import saving_fraction as one_saving_fraction
from carbonflow.accounting.saving import saving_g as one_saving_g
from carbonflow.domain import DeviceEnergy, ForecastPoint, Plan, RunResult
from carbonflow.units import emissions_g_from, kwh_from_j

log = logging.getLogger(__name__)


class MeasuredRun(Protocol):
    """What accounting reads of a wrapped run (``carbonflow.execution.wrapper.WrappedRun`` has it all)."""

    job: str
    started_at: datetime
    ended_at: datetime
    duration_s: float
    exit_code: int
    devices: Sequence[DeviceEnergy]
    samples: int
    metrics: dict[str, float]
    power_limit_applied: bool
    power_limits_not_restored: list[str]
    notes: list[str]
    power_trace_csv: str | None
    output_dir: str | None


def energy_intervals(run: MeasuredRun, time_shift_s: float = 0.0) -> list[tuple[datetime, datetime, float]]:
    """(start, end, energy_j) intervals of the run, from its power trace when there is one.

    Without a trace the total is spread evenly over the run. ``time_shift_s`` moves the run onto
    another clock (the replay demo maps wall time onto a replayed date).
    """
    shift = timedelta(seconds=time_shift_s)
    total_j = sum(d.energy_j for d in run.devices)  # energy_j is already this job's share of a shared device
    intervals: list[tuple[datetime, datetime, float]] = []
    if run.power_trace_csv and Path(run.power_trace_csv).exists():
        intervals = _trace_intervals(Path(run.power_trace_csv))
        traced_j = sum(e for _, _, e in intervals)
        # The trace is sampled: scale it to the counters' exact total, keeping its shape.
        scale = total_j / traced_j if traced_j > 0 and total_j > 0 else 0.0
        intervals = [(s, e, j * scale) for s, e, j in intervals] if scale else []
    if not intervals:
        intervals = [(run.started_at, run.ended_at, total_j)]
    return [(s + shift, e + shift, j) for s, e, j in intervals]


def _trace_intervals(path: Path) -> list[tuple[datetime, datetime, float]]:
    """Sum the per-device cumulative energy of a power trace into intervals between samples."""
    by_time: dict[datetime, dict[str, float]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            try:
                when = datetime.fromisoformat(row["timestamp_utc"])
                by_time.setdefault(when, {})[row["device_id"]] = float(row["energy_j"])
            except (KeyError, ValueError) as err:
                log.warning("power trace %s: skipping a row (%s)", path, err)
    times = sorted(by_time)
    intervals = []
    for before, after in pairwise(times):
        energy = sum(
            max(after_j - by_time[before].get(device, after_j), 0.0) for device, after_j in by_time[after].items()
        )
        intervals.append((before, after, energy))
    return intervals


def to_run_result(
    run: MeasuredRun,
    plan: Plan,
    intensity_points: list[ForecastPoint] | None,
    *,
    fallback_gco2_per_kwh: float | None = None,
    time_shift_s: float = 0.0,
    baseline_energy_ratio: float | None = None,
    baseline_intensity_gco2_per_kwh: float | None = None,
) -> RunResult:
    """Account a wrapped run: per-kind totals, emissions from the real intensity, savings.

    ``baseline_energy_ratio`` is E(default config)/E(chosen config) from the profile and
    ``baseline_intensity_gco2_per_kwh`` the intensity had the job started at once: together they
    give the counterfactual "start now at the default power limit" (a prediction, not a measurement).
    """
    intervals = energy_intervals(run, time_shift_s)
    emissions = emissions_g(intervals, intensity_points or [], fallback_gco2_per_kwh)
    # A shared device's energy_j is already the job's part (``share`` says which part): not multiplied again.
    energy_gpu_j = sum(d.energy_j for d in run.devices if d.kind == "gpu")
    energy_cpu_j = sum(d.energy_j for d in run.devices if d.kind == "cpu")
    energy_total_j = energy_gpu_j + energy_cpu_j
    mean_intensity = emissions / kwh_from_j(energy_total_j) if energy_total_j > 0 else 0.0
    notes = list(run.notes)
    run_now_g = saving_g = saving_fraction = None
    if baseline_energy_ratio is not None and baseline_intensity_gco2_per_kwh is not None:
        run_now_g = emissions_g_from(energy_total_j * baseline_energy_ratio, baseline_intensity_gco2_per_kwh)
        saving_g = one_saving_g(emissions, run_now_g)  # exactly 0 within float noise of the baseline
        saving_fraction = one_saving_fraction(emissions, run_now_g)  # carbonflow's one saving definition
        notes.append("emissions_run_now_default_g is predicted (profile energy ratio × run-now intensity)")
    if plan.replay:
        notes.append("carbon intensity replayed from recorded data")
    return RunResult(
        job=run.job,
        config=plan.config,
        started_at=run.started_at + timedelta(seconds=time_shift_s),
        ended_at=run.ended_at + timedelta(seconds=time_shift_s),
        duration_s=run.duration_s,
        devices=list(run.devices),
        energy_gpu_j=energy_gpu_j,
        energy_cpu_j=energy_cpu_j,
        energy_total_j=energy_total_j,
        energy_labels=sorted({d.label for d in run.devices}),
        emissions_g=emissions,
        carbon_intensity_mean_gco2_per_kwh=mean_intensity,
        samples=run.samples,
        throughput_samples_per_s=run.samples / run.duration_s if run.duration_s > 0 else 0.0,
        metrics=run.metrics,
        exit_code=run.exit_code,
        power_limit_applied=run.power_limit_applied,
        power_limits_not_restored=list(run.power_limits_not_restored),
        notes=notes,
        emissions_run_now_default_g=run_now_g,
        saving_g=saving_g,
        saving_fraction=saving_fraction,
        artifacts={
            k: v for k, v in {"power_trace_csv": run.power_trace_csv, "output_dir": run.output_dir}.items() if v
        },
    )
