"""``carbonflow report JOB``: a job's runs side by side (terminal table + PNG), from MLflow.

The numbers are the runs' own MLflow metrics (the same names MLflow's compare view shows); nothing is
recomputed except sums. Energy labels (measured / estimated / simulated) and replayed carbon data are
shown on every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from carbonflow.tracking import schema
from carbonflow.tracking.history import RealisedVsPredicted, TrackingUnavailableError, realised_vs_predicted, run_views
from carbonflow.tracking.spool import pending
from carbonflow.tracking.uri import redacted_uri, resolve_tracking_uri
from carbonflow.units import (
    emissions_unit_for,
    energy_unit_for,
    format_column,
    format_emissions_g,
    format_energy_j,
    format_percent,
    nearest_minute,
    tidy_zero,
)

if TYPE_CHECKING:
    from rich.table import Table

PNG_WIDTH_IN = 12.0
PNG_HEIGHT_IN = 8.0
PNG_DPI = 100
PNG_SIZE_PX = (int(PNG_WIDTH_IN * PNG_DPI), int(PNG_HEIGHT_IN * PNG_DPI))


@dataclass(frozen=True)
class ReportRow:
    """One training run of the job, with its MLflow metrics and configuration."""

    recurrence: int | None
    run_id: str | None
    started_at: str
    config_key: str
    containers: int
    power_limit_w: float | None
    batch_size: int | None
    colocated_with: str
    duration_s: float
    energy_total_j: float
    emissions_g: float
    emissions_run_now_default_g: float | None
    saving_g: float | None
    saving_fraction: float | None
    test_accuracy: float | None
    energy_labels: str
    replay: bool
    predicted_duration_s: float
    predicted_energy_j: float
    predicted_emissions_g: float
    recorded_at: str = ""
    """Wall-clock time its record was made (``carbonflow.recorded_at``; empty for older runs): when it ran (ended).
    A replayed run's ``started_at`` is the replayed date, so two nights can share it."""
    energy_gpu_j: float | None = None
    energy_cpu_j: float | None = None

    @property
    def ran(self) -> str:
        """When it ran, wall clock, to the minute (``2026-11-26 09:45``); '' when not recorded."""
        from datetime import datetime

        try:
            return f"{nearest_minute(datetime.fromisoformat(self.recorded_at)):%Y-%m-%d %H:%M}"
        except ValueError:
            return ""


@dataclass
class ReportData:
    """A job's report: rows oldest first, totals, and the PNG written."""

    job: str
    tracking_uri: str
    rows: list[ReportRow]
    png_path: Path | None = None
    """Where :func:`render_png` writes the runs view's plot (None: not written)."""
    png_size_px: tuple[int, int] = PNG_SIZE_PX
    spooled_waiting: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def energy_total_j(self) -> float:
        return sum(r.energy_total_j for r in self.rows)

    @property
    def emissions_g(self) -> float:
        return sum(r.emissions_g for r in self.rows)

    @property
    def saving_g(self) -> float:
        return sum(r.saving_g for r in self.rows if r.saving_g is not None)


def _row(r: RealisedVsPredicted, recorded: _Recorded | None = None) -> ReportRow:
    recorded = recorded or _Recorded()
    return ReportRow(
        recorded_at=recorded.at,
        energy_gpu_j=recorded.gpu_j,
        energy_cpu_j=recorded.cpu_j,
        recurrence=r.recurrence,
        run_id=r.run_id,
        started_at=nearest_minute(r.started_at).strftime("%Y-%m-%d %H:%M"),
        config_key=r.config_key,
        containers=r.containers,
        power_limit_w=r.power_limit_w,
        batch_size=r.batch_size,
        colocated_with=",".join(r.colocated_with) or "-",
        duration_s=r.duration_s,
        energy_total_j=r.energy_total_j,
        emissions_g=r.emissions_g,
        emissions_run_now_default_g=r.emissions_run_now_default_g,
        saving_g=r.saving_g,
        saving_fraction=r.saving_fraction,
        test_accuracy=r.test_accuracy,
        energy_labels=r.energy_labels,
        replay=r.replay,
        predicted_duration_s=r.predicted_duration_s,
        predicted_energy_j=r.predicted_energy_j,
        predicted_emissions_g=r.predicted_emissions_g,
    )


def existing_store(tracking_uri: str | None) -> str:
    """The tracking URI to read, refusing a local store that does not exist (never creates an empty one)."""
    from carbonflow.tracking.uri import tracking_uri as default_uri

    uri = tracking_uri or default_uri()
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        if not path.is_file() or path.stat().st_size == 0:
            raise LookupError(
                f"no MLflow store at {path} (tracking URI {uri}); point carbonflow at the store your runs were "
                "logged to with --tracking-uri or MLFLOW_TRACKING_URI, or set CARBONFLOW_HOME to the .carbonflow "
                "folder holding it (or run from the folder that holds that .carbonflow)"
            )
    return resolve_tracking_uri(uri)


KNOWN_JOBS_SHOWN = 12
"""At most this many job names are listed when the asked-for job has no runs."""


def _jobs_in_store(uri: str) -> str:
    """``jobs in this store: a, b, …`` (the jobs with an experiment), so a typo in the job's name is seen at once."""
    from carbonflow.tracking.schema import EXPERIMENT_PREFIX
    from carbonflow.tracking.store import client_for

    experiments = client_for(uri).search_experiments(filter_string=f"name LIKE '{EXPERIMENT_PREFIX}%'")
    jobs = sorted(e.name[len(EXPERIMENT_PREFIX) :] for e in experiments)
    if not jobs:
        return "this store holds no carbonflow job yet"
    more = f", and {len(jobs) - KNOWN_JOBS_SHOWN} more" if len(jobs) > KNOWN_JOBS_SHOWN else ""
    return "jobs in this store: " + ", ".join(jobs[:KNOWN_JOBS_SHOWN]) + more


def build_report(
    job: str,
    *,
    tracking_uri: str | None = None,
    png_path: Path | None = None,
    last_n: int | None = None,
    spool_dir: Path | None = None,
) -> ReportData:
    """Read ``job``'s training runs from MLflow, return the data; with ``png_path``, also write the runs plot there.

    Raises :class:`TrackingUnavailableError` when the store cannot be read and :class:`LookupError`
    when the job has no training run there.
    """
    if last_n is not None and last_n < 1:
        raise ValueError(f"last_n={last_n} is not allowed; give a positive number of runs or None for all")
    uri = existing_store(tracking_uri)
    history = realised_vs_predicted(job, tracking_uri=uri, include_spool=False, strict=True)
    waiting = sum(1 for e in pending(root=spool_dir, tracking_uri=uri) if e.record.job == job)
    if not history:
        extra = f" ({waiting} waiting in the local spool)" if waiting else ""
        raise LookupError(f"no training runs of job {job!r} in {redacted_uri(uri)}{extra}; {_jobs_in_store(uri)}")
    recorded = _recorded_at(job, uri)
    rows = sorted((_row(r, recorded.get(r.run_id or "")) for r in history), key=time_order)
    if last_n is not None:
        rows = rows[-last_n:]
    report = ReportData(
        job=job,
        tracking_uri=uri,
        rows=rows,
        png_path=None if png_path is None else Path(png_path),
        spooled_waiting=waiting,
    )
    if waiting:
        report.notes.append(f"{waiting} run(s) of {job} wait in the local spool for the tracking server")
    report.notes.extend(which_figures(rows))
    if report.png_path is not None:
        render_png(report)
    return report


@dataclass(frozen=True)
class _Recorded:
    at: str = ""
    gpu_j: float | None = None
    cpu_j: float | None = None


def _recorded_at(job: str, uri: str) -> dict[str, _Recorded]:
    """Each MLflow run's ``carbonflow.recorded_at`` (wall clock) and its GPU and CPU energy, by run id."""
    views = run_views(job, tracking_uri=uri, include_spool=False, strict=True)
    recorded = {}
    for v in views:
        if v.run_id:
            at = v.tags.get(schema.T_RECORDED_AT, "")
            recorded[v.run_id] = _Recorded(
                at, v.metrics.get(schema.M_ENERGY_GPU_J), v.metrics.get(schema.M_ENERGY_CPU_J)
            )
    return recorded


def time_order(row: ReportRow) -> tuple[str, str, int]:
    """In the order they ran: by the wall-clock time each run was recorded (a replayed run's start is the replayed
    date: night 2 replaying 03-14 18:01 ran after night 1 replaying 03-15 02:00), by start for runs recorded before
    carbonflow kept that time, then by recurrence."""
    from datetime import datetime

    try:
        ran = f"{datetime.fromisoformat(row.recorded_at):%Y-%m-%d %H:%M:%S.%f}"  # to the microsecond: ties are rare
    except ValueError:
        ran = row.started_at
    return ran, row.started_at, row.recurrence or 0


def which_figures(rows: list[ReportRow]) -> list[str]:
    """The report's footer: which of its figures are measured, estimated or simulated, run by run (runs numbered
    in the table's order), and what the CO2e and the savings rest on."""
    by_label: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_label.setdefault(r.energy_labels.replace(",", " + "), []).append(i)
    parts = []
    for label, indexes in sorted(by_label.items()):
        picked = [rows[i] for i in indexes]
        cpu_only = all(r.energy_cpu_j and not r.energy_gpu_j for r in picked)
        what = {
            "measured": "read from hardware counters",
            "estimated": "a power model, not a hardware reading",
            "simulated": "a simulated GPU, not a hardware reading",
        }.get(label, "part hardware reading, part not")
        where = "; CPU only, no GPU energy" if cpu_only else ""
        which = (
            "all runs"
            if len(indexes) == len(rows)
            else ("run " if len(indexes) == 1 else "runs ") + ", ".join(str(i + 1) for i in indexes)
        )
        parts.append(f"{label} for {which} ({what}{where})")
    notes = ["energy: " + "; ".join(parts)]
    replayed = sum(1 for r in rows if r.replay)
    source = "replayed grid intensity (recorded, not live)" if replayed == len(rows) else (
        f"grid intensity ({replayed} of {len(rows)} runs replayed)" if replayed else "live grid intensity")  # fmt: skip
    all_measured = all(label == "measured" for label in by_label)
    notes.append(f"CO2e: that energy × the {source}" + ("" if all_measured else ", so not measured either"))
    notes.append("saved: vs a predicted baseline (start at once, default power limit), never measured")
    notes.append("time, acc.: measured and reported by the run; ran: when it ended (wall clock)")
    return notes


def run_labels(rows: list[ReportRow]) -> list[str]:
    """One distinct label per run: its number in time order and when it ran (wall clock), its start (replayed or
    not), its configuration and the run (``#recurrence``, else the MLflow run id's start, else its place)."""
    labels = []
    for i, r in enumerate(rows):
        run = f"#{r.recurrence}" if r.recurrence is not None else f"run {r.run_id[:6]}" if r.run_id else f"run {i + 1}"
        ran = f"{i + 1}: ran {r.ran[5:]}\n" if r.ran else ""
        labels.append(f"{ran}{r.started_at[5:]}{' replay' if r.replay and r.ran else ''}\n{r.config_key}\n{run}")
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # still the same (a spooled run twice): number them
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} ({seen[label]})"
    return labels


def accuracy_ylim(values: list[float | None]) -> tuple[float, float]:
    """An accuracy axis (0-1) that stops at 1: from a little under the lowest value (never below 0) to 1."""
    known = [v for v in values if v is not None]
    low = min(known, default=0.0)
    return max(0.0, min(low, 1.0) - 0.05), 1.0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _saving_g(row: ReportRow) -> float | None:
    """The row's saving in grams, 0 when it is floating-point noise (an observe-only run saves exactly 0)."""
    if row.saving_g is None:
        return None
    return tidy_zero(row.saving_g, max(row.emissions_g, row.emissions_run_now_default_g or 0.0))


def _labels(row: ReportRow) -> str:
    """``measured, estimated replay``: words a narrow column can wrap between (never inside)."""
    return row.energy_labels.replace(",", ", ") + (" replay" if row.replay else "")


def render_table(report: ReportData) -> Table:
    """The report as a rich table (one row per run, totals in the caption), at most 100 columns wide.

    Every header carries its unit and every column is scaled once (its largest value's unit); numbers never
    wrap, dates wrap at their space, and only configuration keys may fold. Columns that would say the same on
    every row (recurrence, co-located jobs, labels) are left out and said once in the caption.
    """
    from rich.table import Table

    rows = report.rows
    table = Table(title=f"carbonflow report: {report.job}\n({redacted_uri(report.tracking_uri)})", show_lines=False)
    e_unit, per_j = energy_unit_for([r.energy_total_j for r in rows])
    g_unit, per_g = emissions_unit_for([r.emissions_g for r in rows])
    savings = [_saving_g(r) for r in rows]
    s_unit, per_s = emissions_unit_for([s for s in savings if s is not None])
    show_recurrence = any(r.recurrence is not None for r in rows)
    show_others = any(r.colocated_with != "-" for r in rows)
    show_labels = len({_labels(r) for r in rows}) > 1
    show_ran = any(r.ran for r in rows)  # when it ran (wall clock) beside its (replayed) start
    table.add_column("run", justify="right", no_wrap=True)
    if show_recurrence:
        table.add_column("#", justify="right", no_wrap=True)
    if show_ran:
        table.add_column("ran\n(UTC)", min_width=5)
    replayed = any(r.replay for r in rows)
    table.add_column(f"{'replayed ' if replayed and show_ran else ''}start (UTC)", min_width=10)
    table.add_column("config", overflow="fold", min_width=6)
    if show_others:
        table.add_column("with", overflow="fold")
    for header in ("time (s)", f"energy ({e_unit})", f"CO2e ({g_unit})", f"saved ({s_unit})", "saved (%)", "acc."):
        table.add_column(header.replace(" ", "\n"), justify="right", no_wrap=True)
    if show_labels:
        table.add_column("labels", min_width=9)
    columns = zip(  # one format per column: the same decimals on every row (never 58 beside 59.6)
        format_column([r.duration_s for r in rows], 4),
        format_column([r.energy_total_j / per_j for r in rows], 4),
        format_column([r.emissions_g / per_g for r in rows]),
        format_column([None if s is None else s / per_s for s in savings]),
        strict=True,
    )
    for i, (row, saving, (duration, energy, emissions, saved)) in enumerate(zip(rows, savings, columns, strict=True)):
        table.add_row(
            str(i + 1),
            *(["-" if row.recurrence is None else str(row.recurrence)] if show_recurrence else []),
            *([row.ran[5:] or "-"] if show_ran else []),
            row.started_at[5:] if show_ran else row.started_at,
            row.config_key,
            *([row.colocated_with] if show_others else []),
            duration,
            energy,
            emissions,
            saved,
            format_percent(0.0 if saving == 0 else row.saving_fraction),
            _fmt(row.test_accuracy, ".3f"),
            *([_labels(row)] if show_labels else []),
        )
    caption = [
        f"{len(rows)} runs: {format_energy_j(report.energy_total_j)}, {format_emissions_g(report.emissions_g)} CO2e, "
        f"saved {format_emissions_g(tidy_zero(report.saving_g, report.emissions_g))} vs run-now at the default "
        "power limit"
    ]
    table.caption = "\n".join([*caption, *report.notes])
    return table


def render_png(report: ReportData) -> Path:
    """Four panels per run: energy, emissions vs the run-now baseline, accuracy, realised/predicted."""
    from matplotlib.figure import Figure

    if report.png_path is None:
        raise ValueError(f"the report of {report.job} has no png_path: set where to write the plot")
    rows = report.rows
    xs = list(range(len(rows)))
    ticks = run_labels(rows)
    fig = Figure(figsize=(PNG_WIDTH_IN, PNG_HEIGHT_IN), dpi=PNG_DPI)
    axes = fig.subplots(2, 2)
    e_unit, per_j = energy_unit_for([r.energy_total_j for r in rows])
    g_unit, per_g = emissions_unit_for([max(r.emissions_g, r.emissions_run_now_default_g or 0) for r in rows])
    ax = axes[0][0]
    ax.bar(xs, [r.energy_total_j / per_j for r in rows], color="tab:blue")
    ax.set_title(f"energy per run ({e_unit})")
    ax.set_ylabel(e_unit)
    ax = axes[0][1]
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.emissions_g / per_g for r in rows], width, label="this run",
           color="tab:green")  # fmt: skip
    ax.bar(
        [x + width / 2 for x in xs],
        [(r.emissions_run_now_default_g or 0) / per_g for r in rows],
        width,
        label="run now at the default power limit",
        color="tab:grey",
    )
    ax.set_title(f"emissions ({g_unit} CO2e)")
    ax.set_ylabel(f"{g_unit} CO2e")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(xs, [r.test_accuracy if r.test_accuracy is not None else float("nan") for r in rows], "o-")
    ax.set_ylim(*accuracy_ylim([r.test_accuracy for r in rows]))
    ax.set_title("test_accuracy")
    ax = axes[1][1]
    for name, values in (
        ("duration", [r.duration_s / r.predicted_duration_s if r.predicted_duration_s else float("nan") for r in rows]),
        ("energy", [r.energy_total_j / r.predicted_energy_j if r.predicted_energy_j else float("nan") for r in rows]),
        (
            "emissions",
            [r.emissions_g / r.predicted_emissions_g if r.predicted_emissions_g else float("nan") for r in rows],
        ),
    ):
        ax.plot(xs, values, "o-", label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_title("realised / predicted")
    ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.set_xticks(xs, ticks)
        ax.set_xlabel("run, in the order they ran: number, when it ran / start (UTC) / configuration / run")
        ax.tick_params(axis="x", labelsize=7 if len(rows) > 8 else 9)
        ax.grid(alpha=0.3)
    labels = ", ".join(sorted({r.energy_labels for r in rows}))
    fig.suptitle(f"carbonflow report: {report.job} ({len(rows)} runs; energy: {labels})")
    fig.tight_layout()
    report.png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(report.png_path, dpi=PNG_DPI)
    return report.png_path


@dataclass(frozen=True)
class ConfigSummary:
    """One configuration across a job's runs: what it cost and how accurate it was."""

    config_key: str
    runs: int
    energy_mean_j: float
    accuracy_mean: float | None
    accuracy_best: float | None
    pareto: bool
    """No other configuration used less energy *and* reached a higher mean accuracy."""


def energy_accuracy(report: ReportData) -> list[ConfigSummary]:
    """The job's configurations by mean energy, each with its accuracy and whether it is on the Pareto front."""
    from statistics import fmean

    by_config: dict[str, list[ReportRow]] = {}
    for row in report.rows:
        by_config.setdefault(row.config_key, []).append(row)
    energy = {k: fmean(r.energy_total_j for r in rows) for k, rows in by_config.items()}
    keys = sorted(energy, key=energy.__getitem__)
    accuracy = {}
    for k in keys:
        known = [r.test_accuracy for r in by_config[k] if r.test_accuracy is not None]
        accuracy[k] = (fmean(known), max(known)) if known else (None, None)
    front, best_so_far = set(), float("-inf")  # keys ascend in energy: a point is on the front if it beats all cheaper
    for k in keys:
        mean = accuracy[k][0]
        if mean is not None and mean > best_so_far:
            front.add(k)
            best_so_far = mean
    return [ConfigSummary(k, len(by_config[k]), energy[k], accuracy[k][0], accuracy[k][1], k in front) for k in keys]


def render_energy_accuracy_table(report: ReportData) -> Table:
    """Energy against accuracy, one row per configuration (Pareto-front rows marked)."""
    from rich.table import Table

    summaries = energy_accuracy(report)
    unit, per_unit = energy_unit_for([c.energy_mean_j for c in summaries])
    table = Table(title=f"energy against accuracy: {report.job}")
    for name in ("config", "runs", f"mean energy ({unit})", "mean accuracy", "best accuracy", "Pareto"):
        table.add_column(name, justify="left" if name == "config" else "right")
    for c in summaries:
        table.add_row(c.config_key, str(c.runs), _fmt(c.energy_mean_j / per_unit, ".4g"), _fmt(c.accuracy_mean, ".3f"),
                      _fmt(c.accuracy_best, ".3f"), "yes" if c.pareto else "")  # fmt: skip
    table.caption = ("Pareto: no other configuration used less energy and reached a higher mean accuracy. "
                     f"Energy labels: {', '.join(sorted({r.energy_labels for r in report.rows}))}")  # fmt: skip
    return table


def render_energy_accuracy_png(report: ReportData, path: Path) -> Path:
    """Each run as a point (energy, accuracy), coloured by configuration; the Pareto front as a line."""
    from matplotlib.figure import Figure

    summaries = energy_accuracy(report)
    unit, per_unit = energy_unit_for([r.energy_total_j for r in report.rows])
    fig = Figure(figsize=(PNG_WIDTH_IN * 0.6, PNG_HEIGHT_IN * 0.6), dpi=PNG_DPI)
    ax = fig.subplots()
    for c in summaries:
        rows = [r for r in report.rows if r.config_key == c.config_key and r.test_accuracy is not None]
        ax.scatter([r.energy_total_j / per_unit for r in rows], [r.test_accuracy for r in rows], label=c.config_key)
    front = sorted((c for c in summaries if c.pareto), key=lambda c: c.energy_mean_j)
    if len(front) >= 2:  # a front of one point draws no line: no legend entry for it either
        ax.plot([c.energy_mean_j / per_unit for c in front], [c.accuracy_mean for c in front], "k--",
                linewidth=1, label="Pareto front (means)")  # fmt: skip
    ax.set_xlabel(f"energy per run ({unit})")
    ax.set_ylabel("test_accuracy")
    ax.set_ylim(*accuracy_ylim([r.test_accuracy for r in report.rows]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    labels = ", ".join(sorted({r.energy_labels for r in report.rows}))
    ax.set_title(f"{report.job}: energy against accuracy (energy: {labels})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=PNG_DPI)
    return path


__all__ = [
    "PNG_SIZE_PX",
    "ReportData",
    "ReportRow",
    "TrackingUnavailableError",
    "build_report",
    "energy_accuracy",
    "render_energy_accuracy_png",
    "render_energy_accuracy_table",
    "render_table",
]
