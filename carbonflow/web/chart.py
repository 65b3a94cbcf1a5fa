"""An inline SVG chart of a carbon-intensity forecast with the planned windows of waiting jobs.

Drawn on the server (no JavaScript, no CDN): a step line of gCO2e/kWh per slot, one shaded band per
planned window ``[plan.start, plan.start + predicted_duration_s)``, and a marker at the forecast's issue time.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from html import escape

from carbonflow.domain import Forecast, Plan

WIDTH = 960
HEIGHT = 320
MARGIN_LEFT = 56
MARGIN_RIGHT = 16
MARGIN_TOP = 24
MARGIN_BOTTOM = 44
WINDOW_COLOURS = ["#2b8a3e", "#1971c2", "#e8590c", "#9c36b5", "#0c8599", "#c92a2a"]


def _nice_step(span: float, target_ticks: int = 5) -> float:
    raw = span / max(target_ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def forecast_svg(forecast: Forecast | None, plans: list[Plan], *, title: str = "") -> str:
    """The chart as an ``<svg>`` element string (ids: ``forecast-chart``, ``forecast-line``, ``planned-window-*``)."""
    if forecast is None or not forecast.points:
        return (
            f'<svg id="forecast-chart" class="empty" viewBox="0 0 {WIDTH} 60" role="img" '
            f'xmlns="http://www.w3.org/2000/svg"><text x="10" y="35">No forecast available'
            f"{escape(': ' + title) if title else ''}</text></svg>"
        )
    points = forecast.points
    t0: datetime = points[0].start
    t1: datetime = points[-1].end
    for plan in plans:
        t1 = max(t1, plan.start + timedelta(seconds=plan.predicted_duration_s))
        t0 = min(t0, plan.start)
    span_s = max((t1 - t0).total_seconds(), 1.0)
    values = [p.gco2_per_kwh for p in points]
    y_max = max(values) * 1.1 if max(values) > 0 else 1.0
    y_step = _nice_step(y_max)
    y_max = math.ceil(y_max / y_step) * y_step
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x(when: datetime) -> float:
        return MARGIN_LEFT + plot_w * (when - t0).total_seconds() / span_s

    def y(value: float) -> float:
        return MARGIN_TOP + plot_h * (1 - value / y_max)

    parts = [
        f'<svg id="forecast-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" xmlns="http://www.w3.org/2000/svg" '
        f'aria-label="carbon-intensity forecast {escape(forecast.region)}">',
        f"<title>{escape(title or forecast.region)}</title>",
    ]
    # planned windows first (under the line)
    for i, plan in enumerate(plans):
        colour = WINDOW_COLOURS[i % len(WINDOW_COLOURS)]
        end = plan.start + timedelta(seconds=plan.predicted_duration_s)
        x0, x1 = x(plan.start), x(end)
        width = max(x1 - x0, 2.0)
        label = f"{plan.job}: {plan.start:%H:%M}–{end:%H:%M} UTC, {plan.config.key()}"
        parts.append(
            f'<rect class="planned-window" id="planned-window-{i}" data-job="{escape(plan.job)}" x="{x0:.1f}" '
            f'y="{MARGIN_TOP}" width="{width:.1f}" height="{plot_h}" fill="{colour}" fill-opacity="0.18" '
            f'stroke="{colour}"><title>{escape(label)}</title></rect>'
        )
        parts.append(
            f'<text class="window-label" x="{x0 + 3:.1f}" y="{MARGIN_TOP + 14 + 14 * (i % 4)}" '
            f'fill="{colour}" font-size="12">{escape(plan.job)}</text>'
        )
    # axes and grid
    tick = 0.0
    while tick <= y_max + 1e-9:
        yy = y(tick)
        parts.append(
            f'<line class="grid" x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" '
            f'stroke="#ddd"/><text x="{MARGIN_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="11">'
            f"{tick:g}</text>"
        )
        tick += y_step
    hours = span_s / 3600
    step_h = max(1, int(_nice_step(hours, 8)))
    first_tick = t0.replace(minute=0, second=0, microsecond=0)
    if first_tick < t0:
        first_tick += timedelta(hours=1)
    when = first_tick
    while when <= t1:
        xx = x(when)
        label = f"{when:%d %b %H:%M}" if when.hour == 0 or when == first_tick else f"{when:%H:%M}"
        parts.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{MARGIN_TOP + plot_h}" y2="{MARGIN_TOP + plot_h + 4}" '
            f'stroke="#555"/><text x="{xx:.1f}" y="{MARGIN_TOP + plot_h + 18}" text-anchor="middle" '
            f'font-size="11">{label}</text>'
        )
        when += timedelta(hours=step_h)
    parts.append(
        f'<text x="{MARGIN_LEFT}" y="{HEIGHT - 6}" font-size="11">time (UTC)</text>'
        f'<text x="12" y="{MARGIN_TOP - 8}" font-size="11">gCO2e/kWh ({escape(forecast.signal_kind)})</text>'
    )
    # the forecast as a step line
    path = []
    for i, p in enumerate(points):
        cmd = "M" if i == 0 else "L"
        path.append(f"{cmd}{x(p.start):.1f},{y(p.gco2_per_kwh):.1f}")
        path.append(f"L{x(p.end):.1f},{y(p.gco2_per_kwh):.1f}")
    parts.append(
        f'<path id="forecast-line" d="{" ".join(path)}" fill="none" stroke="#343a40" stroke-width="2" '
        f'data-points="{len(points)}"/>'
    )
    issued = forecast.issued_at
    if t0 <= issued <= t1:
        xx = x(issued)
        parts.append(
            f'<line id="issued-at" x1="{xx:.1f}" x2="{xx:.1f}" y1="{MARGIN_TOP}" y2="{MARGIN_TOP + plot_h}" '
            f'stroke="#c92a2a" stroke-dasharray="4 3"><title>forecast issued {issued.isoformat()}</title></line>'
        )
    parts.append("</svg>")
    return "".join(parts)
