"""PNG plots carbonflow attaches to MLflow runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from carbonflow.domain import Forecast, ForecastPoint, Plan, Profile, RunResult
from carbonflow.units import emissions_unit_for, energy_unit_for

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")


def pareto_plot(path: Path, *, plan: Plan | None = None, profile: Profile | None = None, title: str = "") -> Path:
    """Energy vs time of the profiled configurations, coloured by carbon, the chosen one ringed.

    With a plan holding alternatives, each configuration is shown at its predicted full-job time and
    energy, coloured by its lowest predicted emissions over the start times considered. Otherwise the
    profile's points are shown per sample (time and energy per 1000 samples), coloured by power.
    """
    labels: list[str] = []
    xs: list[float] = []
    ys: list[float] = []
    colours: list[float] = []
    if plan is not None and plan.alternatives:
        best: dict[str, tuple[float, float, float]] = {}
        for alt in plan.alternatives:
            key = alt.config.key()
            value = (alt.predicted_duration_s, alt.predicted_energy_j, alt.predicted_emissions_g)
            if key not in best or value[2] < best[key][2]:
                best[key] = value
        e_unit, per_j = energy_unit_for([e for _, e, _ in best.values()])
        g_unit, per_g = emissions_unit_for([g for _, _, g in best.values()])
        for key, (t, e, g) in sorted(best.items()):
            labels.append(key)
            xs.append(t)
            ys.append(e / per_j)
            colours.append(g / per_g)
        x_label, y_label = "predicted time (s)", f"predicted energy ({e_unit})"
        c_label = f"predicted emissions ({g_unit} CO2e)"
        chosen = plan.config.key()
        label_note = "planned" + (" (carbon data replayed)" if plan.replay else "")
    elif profile is not None and profile.points:
        e_unit, per_j = energy_unit_for([1000 * p.energy_per_sample_j for p in profile.points])
        for point in profile.points:
            labels.append(point.config.key())
            xs.append(1000 / point.throughput_samples_per_s)
            ys.append(1000 * point.energy_per_sample_j / per_j)
            colours.append(point.power_total_w)
        x_label, y_label, c_label = "time per 1000 samples (s)", f"energy per 1000 samples ({e_unit})", "mean power (W)"
        chosen = plan.config.key() if plan is not None else ""
        label_note = f"profile, {profile.label}"
    else:
        raise ValueError("pareto_plot needs a plan with alternatives or a profile with points")

    fig = _figure(8, 5.5)
    ax = fig.add_subplot()
    scatter = ax.scatter(xs, ys, c=colours, cmap="viridis_r", s=60, edgecolors="black", linewidths=0.5)
    fig.colorbar(scatter, ax=ax, label=c_label)
    from carbonflow.planning.costs import pareto_front  # the planner's one Pareto front (lazy: it is heavy)

    points = list(zip(xs, ys, strict=True))
    front = sorted(pareto_front(points), key=lambda i: points[i])  # by time
    ax.plot(
        [xs[i] for i in front],
        [ys[i] for i in front],
        "--s",
        color="grey",
        markerfacecolor="none",
        markersize=13,
        label="Pareto front (time, energy)",
    )
    for i, label in enumerate(labels):
        ax.annotate(label, (xs[i], ys[i]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if label == chosen:
            ax.scatter([xs[i]], [ys[i]], s=220, facecolors="none", edgecolors="red", linewidths=2, label="chosen")
    for values, set_scale in ((xs, ax.set_xscale), (ys, ax.set_yscale)):
        positive = [v for v in values if v > 0]
        if len(positive) == len(values) and max(positive) > 10 * min(positive):  # far outliers: log scale
            set_scale("log")
    ax.set_xlabel(x_label + (" (log)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(y_label + (" (log)" if ax.get_yscale() == "log" else ""))
    ax.set_title(title or f"configurations: energy vs time ({label_note})")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _steps(points: list[ForecastPoint]) -> tuple[list, list[float]]:
    xs: list = []
    ys: list[float] = []
    for point in points:
        xs.extend([point.start, point.end])
        ys.extend([point.gco2_per_kwh, point.gco2_per_kwh])
    return xs, ys


def forecast_plot(
    path: Path,
    *,
    forecast: Forecast,
    plan: Plan,
    result: RunResult | None = None,
    actual_points: list[ForecastPoint] | None = None,
) -> Path:
    """Forecast intensity over time with the planned window, the actual window and realised intensity."""
    import matplotlib.dates as mdates

    fig = _figure(10, 5)
    ax = fig.add_subplot()
    xs, ys = _steps(forecast.points)
    replay = " (replayed data)" if forecast.replay else ""
    ax.plot(xs, ys, color="tab:blue", label=f"forecast: {forecast.provider}, {forecast.signal_kind}{replay}")
    if actual_points:
        axs, ays = _steps(sorted(actual_points, key=lambda p: p.start))
        ax.plot(axs, ays, color="black", linewidth=1, label="realised intensity")
    windows = [(plan.start, plan.start + timedelta(seconds=plan.predicted_duration_s), "tab:green", "planned window")]
    if result is not None:
        windows.append((result.started_at, result.ended_at, "tab:orange", "actual window"))
    if plan.baseline is not None:
        base = plan.baseline
        windows.append(
            (base.start, base.start + timedelta(seconds=base.predicted_duration_s), "tab:red", "run-now baseline")
        )
    times = [p.start for p in forecast.points] + [p.end for p in forecast.points] + [w[1] for w in windows]
    min_width = (max(times) - min(times)) * 0.004  # a minutes-long run on a day-long axis stays visible
    for start, end, colour, label in windows:
        widened = end - start < min_width
        ax.axvspan(
            start, max(end, start + min_width), color=colour, alpha=0.3, label=label + (" (widened)" if widened else "")
        )
        ax.axvline(start, color=colour, linewidth=1.2)
    if plan.finish_by is not None:
        ax.axvline(plan.finish_by, color="tab:red", linestyle="--", label="finish by")
    ax.set_ylabel("carbon intensity (g CO2e/kWh)")
    ax.set_xlabel("time (UTC)")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=forecast.issued_at.tzinfo))
    ax.set_title(f"{plan.job} in {forecast.region}: forecast issued {forecast.issued_at:%Y-%m-%d %H:%M} UTC")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
