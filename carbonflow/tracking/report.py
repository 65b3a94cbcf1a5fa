"""``carbonflow report JOB``: a job's runs side by side (terminal table + PNG), from MLflow.

The numbers are the runs' own MLflow metrics (the same names MLflow's compare view shows); nothing is
recomputed except sums. Energy labels (measured / estimated / simulated) and replayed carbon data are
shown on every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from carbonflow.tracking.history import RealisedVsPredicted, TrackingUnavailableError, realised_vs_predicted
from carbonflow.tracking.spool import pending
from carbonflow.tracking.uri import resolve_tracking_uri
from carbonflow.units import energy_unit_for, format_emissions_g, format_energy_j

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


@dataclass
class ReportData:
    """A job's report: rows oldest first, totals, and the PNG written."""

    job: str
    tracking_uri: str
    rows: list[ReportRow]
    png_path: Path
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


def _row(r: RealisedVsPredicted) -> ReportRow:
    return ReportRow(
        recurrence=r.recurrence,
        run_id=r.run_id,
        started_at=r.started_at.strftime("%Y-%m-%d %H:%M"),
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
                "logged to with --tracking-uri or MLFLOW_TRACKING_URI, or run from the folder whose "
                ".carbonflow/ holds it (CARBONFLOW_HOME)"
            )
    return resolve_tracking_uri(uri)


def build_report(
    job: str,
    *,
    tracking_uri: str | None = None,
    png_path: Path,
    last_n: int | None = None,
    spool_dir: Path | None = None,
) -> ReportData:
    """Read ``job``'s training runs from MLflow, write the comparison PNG to ``png_path``, return the data.

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
        raise LookupError(f"no training runs of job {job!r} in {uri}{extra}")
    if last_n is not None:
        history = history[-last_n:]
    rows = [_row(r) for r in history]
    report = ReportData(job=job, tracking_uri=uri, rows=rows, png_path=Path(png_path), spooled_waiting=waiting)
    if waiting:
        report.notes.append(f"{waiting} run(s) of {job} wait in the local spool for the tracking server")
    labels = sorted({r.energy_labels for r in rows})
    if any(label != "measured" for label in labels):
        report.notes.append(f"energy labels present: {', '.join(labels)} (not every figure is a hardware reading)")
    if any(r.replay for r in rows):
        report.notes.append("rows marked 'replay' used replayed carbon-intensity data, not a live API")
    render_png(report)
    return report


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(report: ReportData) -> Table:
    """The report as a rich table (one row per run, totals in the caption)."""
    from rich.table import Table

    table = Table(title=f"carbonflow report: {report.job}  ({report.tracking_uri})", show_lines=False)
    unit, per_unit = energy_unit_for([r.energy_total_j for r in report.rows])
    columns = [
        ("#", "right"),
        ("started (UTC)", "left"),
        ("config", "left"),
        ("with", "left"),
        ("time (s)", "right"),
        (f"energy ({unit})", "right"),
        ("CO2e (g)", "right"),
        ("saving (g)", "right"),
        ("saving", "right"),
        ("accuracy", "right"),
        ("labels", "left"),
    ]
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in report.rows:
        table.add_row(
            "-" if row.recurrence is None else str(row.recurrence),
            row.started_at,
            row.config_key,
            row.colocated_with,
            _fmt(row.duration_s, ".1f"),
            _fmt(row.energy_total_j / per_unit, ".4g"),
            _fmt(row.emissions_g, ".3g"),
            _fmt(row.saving_g, ".3g"),
            _fmt(None if row.saving_fraction is None else 100 * row.saving_fraction, ".1f") + " %",
            _fmt(row.test_accuracy, ".3f"),
            row.energy_labels + (" +replay" if row.replay else ""),
        )
    caption = (
        f"{len(report.rows)} runs: {format_energy_j(report.energy_total_j)}, {format_emissions_g(report.emissions_g)} "
        f"CO2e, saved {format_emissions_g(report.saving_g)} vs run-now at the default power limit"
    )
    table.caption = "\n".join([caption, *report.notes])
    return table


def render_png(report: ReportData) -> Path:
    """Four panels per run: energy, emissions vs the run-now baseline, accuracy, realised/predicted."""
    from matplotlib.figure import Figure

    rows = report.rows
    xs = list(range(len(rows)))
    ticks = [f"{r.recurrence if r.recurrence is not None else '?'}\n{r.config_key}" for r in rows]
    fig = Figure(figsize=(PNG_WIDTH_IN, PNG_HEIGHT_IN), dpi=PNG_DPI)
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    ax.bar(xs, [r.energy_total_j / 1000 for r in rows], color="tab:blue")
    ax.set_title("energy_total_j (kJ)")
    ax = axes[0][1]
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.emissions_g for r in rows], width, label="emissions_g", color="tab:green")
    ax.bar(
        [x + width / 2 for x in xs],
        [r.emissions_run_now_default_g or 0 for r in rows],
        width,
        label="emissions_run_now_default_g",
        color="tab:grey",
    )
    ax.set_title("emissions (g CO2e) vs run now at default power")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(xs, [r.test_accuracy if r.test_accuracy is not None else float("nan") for r in rows], "o-")
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
        ax.set_xlabel("recurrence / configuration")
        ax.tick_params(axis="x", labelsize=7 if len(rows) > 8 else 9)
        ax.grid(alpha=0.3)
    labels = ", ".join(sorted({r.energy_labels for r in rows}))
    fig.suptitle(f"carbonflow report: {report.job} ({len(rows)} runs; energy: {labels})")
    fig.tight_layout()
    report.png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(report.png_path, dpi=PNG_DPI)
    return report.png_path


__all__ = ["PNG_SIZE_PX", "ReportData", "ReportRow", "TrackingUnavailableError", "build_report", "render_table"]
