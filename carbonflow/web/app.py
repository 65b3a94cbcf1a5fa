"""The Carbon page: a small FastAPI app, mounted by the Airflow plugin at ``/carbonflow``.

Routes: ``/carbon`` (HTML: forecast chart with the planned windows of waiting jobs, latest runs' energy,
emissions, accuracy and savings from MLflow), ``/api/runs`` and ``/api/forecast`` (the same data as JSON),
``/static/*`` (the page's CSS and icon, shipped in the package: it works offline), ``/healthz``.

Every route goes through the app's dependencies (the plugin adds Airflow's login); there is no
``/docs``, ``/redoc`` or ``/openapi.json``. A user sees only the waiting jobs and runs of DAGs Airflow's
auth manager lets them read (``readable_dags``); runs logged outside any DAG only by users who may read
every DAG. A page load never waits on a live carbon provider for more than ``forecast_wait_s``: the
forecast is served from a cache refreshed in the background, keyed on the region as the region table names
it and bounded. The tracking URI is shown with its password replaced by ``***`` (as is any URL in an error).
MLflow's HTTP timeouts are set once when the app is made (MLflow reads them from the environment), never per
request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from carbonflow.tracking.uri import redacted_text, redacted_uri
from carbonflow.units import format_emissions_g, format_energy_j, tidy_zero
from carbonflow.web.chart import forecast_svg
from carbonflow.web.data import (
    ForecastCache,
    PageData,
    ReadableDags,
    RunRow,
    UpcomingJob,
    latest_runs,
    page_forecast,
)

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
UpcomingSource = Callable[[], list[UpcomingJob]]
STATIC_FILES = {"carbonflow.css": "text/css", "leaf.svg": "image/svg+xml"}


def everything() -> ReadableDags:
    """Every DAG: the page without Airflow login (``CARBONFLOW_UI_AUTH=none``) and tests."""
    return ReadableDags(dag_ids=set(), all_dags=True)


def _fmt(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _grams(emissions_g: float | None) -> str:
    """Emissions (or a saving) in units.py's unit, floating-point noise read as 0: never ``5.2e-17 g``."""
    return format_emissions_g(None if emissions_g is None else tidy_zero(emissions_g))


def _badges(row: RunRow) -> str:
    labels = [label for label in row.energy_labels.replace(";", ",").split(",") if label.strip()]
    out = "".join(f'<span class="badge {escape(lb.strip())}">{escape(lb.strip())}</span>' for lb in labels)
    if row.replay:
        out += '<span class="badge replay">replay</span>'
    return out


def _runs_table(runs: list[RunRow]) -> str:
    from carbonflow.accounting.saving import format_saving  # the one saving figure

    head = (
        "<tr><th>job</th><th>started (UTC)</th><th>config</th><th>duration s</th><th>energy</th>"
        "<th>emissions CO2e</th><th>intensity g/kWh</th><th>test accuracy</th><th>saving CO2e</th>"
        "<th>saving %</th><th>labels</th><th>carbon source</th><th>run</th></tr>"
    )
    if not runs:
        empty = '<tr class="empty"><td colspan="13">No training runs yet.</td></tr>'
        return f'<table id="runs-table">{head}{empty}</table>'
    rows = []
    for r in runs:
        rows.append(
            f'<tr class="run-row" data-run-id="{escape(r.run_id)}"><td>{escape(r.job)}</td>'
            f'<td>{r.started_at:%Y-%m-%d %H:%M}</td><td class="text">{escape(r.config_key)}</td>'
            f"<td>{_fmt(r.duration_s, '.1f')}</td><td>{format_energy_j(r.energy_total_j)}</td>"
            f"<td>{_grams(r.emissions_g)}</td><td>{_fmt(r.intensity_gco2_per_kwh, '.0f')}</td>"
            f"<td>{_fmt(r.test_accuracy, '.3f')}</td><td>{_grams(r.saving_g)}</td>"
            f'<td>{format_saving(r.saving_fraction)}</td><td class="text">{_badges(r)}</td>'
            f'<td class="text source">{escape(r.forecast_provider) or "–"}</td>'
            f'<td class="text"><code>{escape(r.run_id[:8])}</code></td></tr>'
        )
    return f'<table id="runs-table">{head}{"".join(rows)}</table>'


def _upcoming_table(upcoming: list[UpcomingJob]) -> str:
    if not upcoming:
        return '<p class="sub" id="upcoming-empty">No job is waiting for its window.</p>'
    rows = []
    for job in upcoming:
        p = job.plan
        finish = p.finish_by.strftime("%Y-%m-%d %H:%M") if p.finish_by else "–"
        rows.append(
            f'<tr class="upcoming-row"><td>{escape(p.job)}</td><td>{p.start:%Y-%m-%d %H:%M}</td>'
            f'<td>{finish}</td><td class="text">{escape(p.config.key())}</td>'
            f"<td>{format_energy_j(p.predicted_energy_j)}</td><td>{_grams(p.predicted_emissions_g)}</td>"
            f'<td class="text why">{escape(p.reason)}</td></tr>'
        )
    return (
        '<table id="upcoming-table"><tr><th>job</th><th>planned start (UTC)</th><th>finish by</th><th>config</th>'
        "<th>predicted energy</th><th>predicted CO2e</th><th>why</th></tr>" + "".join(rows) + "</table>"
    )


def render_page(data: PageData, static_prefix: str = "static") -> str:
    """The Carbon page HTML."""
    fc = data.forecast
    plans = [j.plan for j in data.upcoming if fc is None or j.plan.region == fc.region]
    if fc is not None:
        replay = '<span class="badge replay">replay</span>' if fc.replay else ""
        fc_line = (
            f'<p class="sub" id="carbon-source">Carbon source: <b id="carbon-source-name">{escape(fc.provider)}</b>'
            " — what the training tasks use, with the same fallbacks (each run's own source is in the table)</p>"
        )
        fc_line += (
            f'<p class="sub" id="forecast-source">{escape(fc.region)} — {escape(fc.provider)} '
            f"({escape(fc.signal_kind)}), issued {fc.issued_at:%Y-%m-%d %H:%M} UTC{replay}</p>"
        )
        notes = "; ".join(fc.notes)
        fc_line += f'<p class="notes">{escape(notes)}</p>' if notes else ""
    else:
        fc_line = '<p class="sub error">No forecast.</p>'
    errors = "".join(f'<p class="error">{escape(redacted_text(e))}</p>' for e in data.errors)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>carbonflow · Carbon</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{static_prefix}/carbonflow.css"><link rel="icon" href="{static_prefix}/leaf.svg"></head>
<body>
<h1>Carbon</h1>
<p class="sub">Forecast carbon intensity with each waiting job's planned window, and what the latest runs cost.</p>
{errors}
<h2>Forecast and planned windows</h2>
{fc_line}
{forecast_svg(fc, plans, title=fc.region if fc else "")}
<h2>Waiting jobs</h2>
{_upcoming_table(data.upcoming)}
<h2>Latest runs</h2>
<p class="sub">From MLflow at <code>{escape(redacted_uri(data.tracking_uri))}</code>. Energy labels say how each
figure was obtained (measured / estimated / simulated); replay marks carbon data replayed from recorded grids.</p>
{_runs_table(data.runs)}
</body></html>"""


def create_app(
    *,
    tracking_uri: str | None = None,
    upcoming_source: UpcomingSource | None = None,
    run_limit: int = 20,
    dependencies: list[Any] | None = None,
    readable_dags: Callable[..., ReadableDags] = everything,
    forecast_wait_s: float = 2.0,
) -> FastAPI:
    """Build the app. ``upcoming_source`` lists waiting jobs (the plugin reads Airflow's deferred tasks);
    ``dependencies`` guard every route (the plugin adds Airflow's authentication); ``readable_dags`` is a
    FastAPI dependency saying which DAGs the user may read (the plugin asks Airflow's auth manager)."""
    from carbonflow.tracking.uri import resolve_tracking_uri, use_short_http_timeouts

    use_short_http_timeouts()  # once, for the process: a request never changes os.environ
    app = FastAPI(title="carbonflow", dependencies=dependencies or [], docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    forecasts = ForecastCache(page_forecast, wait_s=forecast_wait_s)

    @app.get("/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(status_code=404, detail=f"no static file {name!r}")
        return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name])

    def gather(region: str | None, limit: int, readable: ReadableDags) -> PageData:
        uri = resolve_tracking_uri(tracking_uri)
        errors: list[str] = []
        upcoming: list[UpcomingJob] = []
        if upcoming_source is not None:
            try:
                upcoming = [j for j in upcoming_source() if readable.allows(j.dag_id)]
            except Exception as exc:
                log.warning("cannot list waiting jobs: %s", redacted_text(str(exc)))
                errors.append(f"Waiting jobs unavailable: {type(exc).__name__}: {redacted_text(str(exc))}")
        try:
            forecast = forecasts.get(upcoming, region)
        except ValueError:
            raise
        except Exception as exc:
            log.warning("cannot get a forecast: %s", redacted_text(str(exc)))
            errors.append(f"Forecast unavailable: {type(exc).__name__}: {redacted_text(str(exc))}")
            forecast = None
        try:
            runs = [r for r in latest_runs(uri, limit, readable) if readable.allows(r.dag_id)]
        except Exception as exc:
            shown, why = redacted_uri(uri), redacted_text(str(exc))
            log.warning("cannot read MLflow at %s: %s", shown, why)
            errors.append(f"MLflow unavailable at {shown}: {type(exc).__name__}: {why}")
            runs = []
        return PageData(forecast=forecast, upcoming=upcoming, runs=runs, tracking_uri=redacted_uri(uri), errors=errors)

    def _bad_request(exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": redacted_text(str(exc))}, status_code=400)

    @app.get("/carbon", response_class=HTMLResponse)
    def carbon_page(
        region: str | None = Query(default=None),
        limit: int = Query(default=run_limit, ge=1, le=200),
        readable: ReadableDags = Depends(readable_dags),
    ):
        try:
            data = gather(region, limit, readable)
        except ValueError as exc:
            return _bad_request(exc)
        if data.forecast is None and forecasts.pending(region):
            data.errors.append("The forecast is being fetched; reload in a few seconds.")
        return HTMLResponse(render_page(data))

    @app.get("/api/runs")
    def api_runs(
        limit: int = Query(default=run_limit, ge=1, le=200), readable: ReadableDags = Depends(readable_dags)
    ) -> list[dict[str, Any]]:
        runs = latest_runs(resolve_tracking_uri(tracking_uri), limit, readable)
        return [r.to_json() for r in runs if readable.allows(r.dag_id)]

    @app.get("/api/forecast")
    def api_forecast(region: str | None = Query(default=None), readable: ReadableDags = Depends(readable_dags)):
        try:
            upcoming = [j for j in (upcoming_source() if upcoming_source else []) if readable.allows(j.dag_id)]
            fc = forecasts.get(upcoming, region)
            if fc is None:
                return JSONResponse({"detail": "the forecast is being fetched; retry in a few seconds"}, 503)
        except ValueError as exc:
            return _bad_request(exc)
        return {
            "forecast": fc.model_dump(mode="json"),
            "upcoming": [
                {"plan": j.plan.model_dump(mode="json"), "dag_id": j.dag_id, "run_id": j.run_id, "task_id": j.task_id}
                for j in upcoming
            ],
            "generated_at": datetime.now().astimezone().isoformat(),
        }

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def airflow_auth_dependency() -> Any:
    """Airflow's ``get_user`` (JWT bearer header or the UI's ``_token`` cookie) as a route dependency."""
    from airflow.api_fastapi.core_api.security import get_user

    return Depends(get_user)


def airflow_readable_dags() -> Callable[..., ReadableDags]:
    """A dependency asking Airflow's auth manager which DAGs the logged-in user may read."""
    from airflow.api_fastapi.core_api.security import get_user

    def readable(user: Any = Depends(get_user)) -> ReadableDags:
        from airflow.api_fastapi.app import get_auth_manager

        manager = get_auth_manager()
        return ReadableDags(
            dag_ids=set(manager.get_authorized_dag_ids(user=user, method="GET")),
            all_dags=bool(manager.is_authorized_dag(method="GET", user=user)),
        )

    return readable
