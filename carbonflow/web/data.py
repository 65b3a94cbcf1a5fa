"""What the Carbon page shows, gathered from MLflow, Airflow and the carbon providers (no HTML here).

* :func:`latest_runs` — the latest training runs of every carbonflow job, read from MLflow with the
  documented schema (:mod:`carbonflow.tracking.schema`).
* :func:`airflow_upcoming` — jobs whose ``CarbonAwareTrainingOperator`` is waiting (deferred), with the
  plan and forecast it carries in its trigger state; only available inside Airflow.
* :func:`page_forecast` — the forecast to draw: the one the waiting jobs planned on, else a fresh one from
  the carbon source the training tasks use (:func:`tasks_carbon_source`: ``$CARBONFLOW_REPLAY``, else the
  live chain with its fallbacks), named on the page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from carbonflow.domain import Forecast, Plan
from carbonflow.settings import CARBON_MODE_ENV, UI_REGION_ENV, carbon_mode, replay_text, ui_region_text
from carbonflow.tracking import schema
from carbonflow.units import kwh_from_j

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRow:
    """One training run as the page's table shows it."""

    run_id: str
    experiment_id: str
    job: str
    started_at: datetime
    status: str
    config_key: str
    power_limit_w: str
    containers: str
    planned_start: str
    region: str
    forecast_provider: str
    duration_s: float | None
    energy_total_j: float | None
    emissions_g: float | None
    intensity_gco2_per_kwh: float | None
    test_accuracy: float | None
    saving_g: float | None
    saving_fraction: float | None
    energy_labels: str
    replay: bool
    dag_id: str = ""
    """The DAG that ran it (``carbonflow.dag_id``); empty for runs logged outside Airflow or by 0.1.0."""

    @property
    def energy_total_kwh(self) -> float | None:
        return None if self.energy_total_j is None else kwh_from_j(self.energy_total_j)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["started_at"] = self.started_at.isoformat()
        out["energy_total_kwh"] = self.energy_total_kwh
        return out


@dataclass(frozen=True)
class ReadableDags:
    """What a user may read: these DAG ids, or every DAG (then also runs logged outside any DAG)."""

    dag_ids: set[str]
    all_dags: bool = False

    def allows(self, dag_id: str) -> bool:
        return self.all_dags or (bool(dag_id) and dag_id in self.dag_ids)


def page_region(region: str | None) -> str:
    """``region`` (None: ``$CARBONFLOW_UI_REGION``, else GB) as the region table names it: ``GB``, ``gb`` and
    ``GB `` are one region; ValueError names the value and what is allowed."""
    from carbonflow.carbon.regions import resolve_region

    if region is not None:
        return resolve_region(region).name
    try:
        return resolve_region(ui_region_text()).name
    except ValueError as err:
        raise ValueError(f"{UI_REGION_ENV}: {err}") from None


class ForecastCache:
    """The page's forecast per region, fetched in the background: a page load waits at most ``wait_s``.

    A cached forecast younger than ``ttl_s`` is served at once; an older one is served while a refresh
    runs in a background thread. With nothing cached the load waits up to ``wait_s`` for the first fetch,
    then renders without a forecast (and says it is being fetched). A forecast a waiting job planned on is
    used directly (it costs nothing to fetch).

    Keyed on the region as the region table names it (:func:`page_region`: an unknown region is refused
    before anything is cached or fetched), and bounded: at most ``max_regions`` forecasts (the least
    recently used goes first) and as many fetches running at once.
    """

    def __init__(
        self, fetch: Callable[..., Forecast], wait_s: float = 2.0, ttl_s: float = 900.0, max_regions: int = 64
    ) -> None:
        if max_regions < 1:
            raise ValueError(f"max_regions={max_regions} is not allowed; it must be >= 1")
        self.fetch, self.wait_s, self.ttl_s, self.max_regions = fetch, wait_s, ttl_s, max_regions
        self._lock = threading.Lock()
        self._cached: OrderedDict[str, tuple[float, Forecast]] = OrderedDict()
        self._running: dict[str, threading.Thread] = {}
        self._errors: dict[str, Exception] = {}

    def get(self, upcoming: list[UpcomingJob], region: str | None) -> Forecast | None:
        key = page_region(region)
        asked = None if region is None else key
        planned = [j for j in upcoming if j.forecast is not None and (asked is None or j.plan.region == asked)]
        if planned:
            return self.fetch(upcoming, asked)
        with self._lock:
            hit = self._cached.get(key)
            if hit is not None:
                self._cached.move_to_end(key)
            fresh = hit is not None and time.monotonic() - hit[0] < self.ttl_s
            thread = None if fresh else self._start(key)
        if hit is not None:
            return hit[1]
        if thread is not None:
            thread.join(self.wait_s)
        with self._lock:
            error = self._errors.pop(key, None)
            hit = self._cached.get(key)
        if error is not None and hit is None:
            raise error
        return hit[1] if hit else None

    def pending(self, region: str | None) -> bool:
        try:
            key = page_region(region)
        except ValueError:
            return False
        thread = self._running.get(key)
        return thread is not None and thread.is_alive()

    def _start(self, key: str) -> threading.Thread | None:
        """A fetch of ``key`` (already running, or new); None when ``max_regions`` fetches are running."""
        running = self._running.get(key)
        if running is not None and running.is_alive():
            return running
        if len(self._running) >= self.max_regions:
            log.warning("forecast fetch for %s not started: %d fetches are running", key, len(self._running))
            return None
        thread = threading.Thread(target=self._refresh, args=(key,), daemon=True, name=f"forecast-{key}")
        self._running[key] = thread
        thread.start()
        return thread

    def _refresh(self, key: str) -> None:
        try:
            forecast = self.fetch([], key)
        except Exception as exc:  # shown on the next load; the cached forecast (if any) stays
            log.warning("forecast refresh for %s failed: %s", key, exc)
            with self._lock:
                self._errors[key] = exc
                while len(self._errors) > self.max_regions:
                    self._errors.pop(next(iter(self._errors)))
                self._running.pop(key, None)
            return
        with self._lock:
            self._cached[key] = (time.monotonic(), forecast)
            self._cached.move_to_end(key)
            while len(self._cached) > self.max_regions:
                evicted, _ = self._cached.popitem(last=False)
                self._errors.pop(evicted, None)
            self._running.pop(key, None)


@dataclass
class UpcomingJob:
    """A job waiting for its planned start."""

    plan: Plan
    forecast: Forecast | None = None
    dag_id: str = ""
    run_id: str = ""
    task_id: str = ""
    state: str = "deferred"


@dataclass
class PageData:
    forecast: Forecast | None
    upcoming: list[UpcomingJob]
    runs: list[RunRow]
    tracking_uri: str
    errors: list[str] = field(default_factory=list)


def _f(metrics: dict[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return None if value is None else float(value)


def latest_runs(tracking_uri: str | None = None, limit: int = 20, readable: ReadableDags | None = None) -> list[RunRow]:
    """The ``limit`` newest training runs across all ``carbonflow/<job>`` experiments, newest first.

    With ``readable``, only runs of DAGs the user may read (more rows are read so that ``limit`` remain).
    MLflow's HTTP timeouts are the process's (the page's app sets short ones once, at its start).
    """
    from carbonflow.tracking.store import client_for, tag_filter
    from carbonflow.tracking.uri import resolve_tracking_uri

    if limit < 1:
        raise ValueError(f"limit={limit} is not allowed; it must be >= 1")
    uri = resolve_tracking_uri(tracking_uri)
    client = client_for(uri)
    experiments = client.search_experiments(filter_string=f"name LIKE '{schema.EXPERIMENT_PREFIX}%'")
    if not experiments:
        return []
    runs = client.search_runs(
        [e.experiment_id for e in experiments],
        filter_string=tag_filter(schema.T_KIND, schema.KIND_TRAINING),
        max_results=limit if readable is None or readable.all_dags else min(10 * limit, 1000),
        order_by=["attributes.start_time DESC"],
    )
    rows = []
    for run in runs:
        m, p, t = run.data.metrics, run.data.params, run.data.tags
        rows.append(
            RunRow(
                run_id=run.info.run_id,
                experiment_id=run.info.experiment_id,
                job=t.get(schema.T_JOB, "?"),
                started_at=datetime.fromtimestamp(run.info.start_time / 1000, UTC),
                status=run.info.status,
                config_key=t.get(schema.T_CONFIG_KEY, ""),
                power_limit_w=p.get(schema.P_POWER_LIMIT_W, ""),
                containers=p.get(schema.P_CONTAINERS, ""),
                planned_start=p.get(schema.P_PLANNED_START, ""),
                region=p.get(schema.P_REGION, ""),
                forecast_provider=p.get(schema.P_FORECAST_PROVIDER, ""),
                duration_s=_f(m, schema.M_DURATION_S),
                energy_total_j=_f(m, schema.M_ENERGY_TOTAL_J),
                emissions_g=_f(m, schema.M_EMISSIONS_G),
                intensity_gco2_per_kwh=_f(m, schema.M_CARBON_INTENSITY_MEAN),
                test_accuracy=_f(m, schema.M_TEST_ACCURACY),
                saving_g=_f(m, schema.M_SAVING_G),
                saving_fraction=_f(m, schema.M_SAVING_FRACTION),
                energy_labels=t.get(schema.T_ENERGY_LABELS, ""),
                replay=t.get(schema.T_REPLAY, "false") == "true",
                dag_id=t.get(schema.T_DAG_ID, ""),
            )
        )
    if readable is not None:
        rows = [r for r in rows if readable.allows(r.dag_id)]
    return rows[:limit]


def upcoming_from_state(raw: dict[str, Any], **where: str) -> list[UpcomingJob]:
    """The jobs of a deferred training task's wait state (one, or a pair sharing a GPU); [] for another shape.

    Reads :class:`~carbonflow.session.WaitState` as stored now and as carbonflow 0.1.0 stored it.
    """
    from carbonflow.session.state import WaitState

    state = raw.get("state", raw)
    if not isinstance(state, dict) or not ({"plan", "members"} & set(state)):
        return []
    wait = WaitState.read(state)
    return [UpcomingJob(plan=m.plan, forecast=wait.forecast, **where) for m in wait.members]


def decode_next_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    """A deferred task's ``next_kwargs`` as stored by Airflow 3 (serde-serialised by the worker), decoded."""
    try:
        from airflow.sdk.serde import deserialize

        value = deserialize(raw)
    except (ImportError, KeyError, AttributeError, TypeError):
        from airflow.serialization.serialized_objects import BaseSerialization

        value = BaseSerialization.deserialize(raw)
    if not isinstance(value, dict):
        raise TypeError(f"next_kwargs decoded to {type(value).__name__}, expected a dict")
    return value


def airflow_upcoming(limit: int = 50) -> list[UpcomingJob]:
    """Deferred carbonflow training tasks in Airflow's metadata DB, with their plans (inside Airflow only)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    out: list[UpcomingJob] = []
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance)
            .where(TaskInstance.state == TaskInstanceState.DEFERRED)
            .where(TaskInstance.operator == "CarbonAwareTrainingOperator")
            .limit(limit)
        ).all()
        for ti in tis:
            try:
                jobs = upcoming_from_state(
                    decode_next_kwargs(ti.next_kwargs or {}),
                    dag_id=ti.dag_id,
                    run_id=ti.run_id,
                    task_id=ti.task_id,
                    state="deferred",
                )
            except Exception as exc:  # an old or foreign state shape must not break the page
                log.warning("cannot read the plan of %s/%s/%s: %s", ti.dag_id, ti.run_id, ti.task_id, exc)
                continue
            out.extend(jobs)
    return sorted(out, key=lambda j: j.plan.start)


def _mode() -> str:
    """``$CARBONFLOW_CARBON_MODE`` as given ("" when unset); a value other than replay or live is refused."""
    return carbon_mode()


@dataclass(frozen=True)
class TasksCarbonSource:
    """The carbon source the training tasks use, resolved as they resolve it, and how to name it on the page."""

    source: Any
    """A :class:`~carbonflow.session.source.CarbonSource`: replay, or the live chain with its fallbacks."""
    mode: str
    """``replay`` or ``live``."""
    why: str
    """What decided it, e.g. ``CARBONFLOW_REPLAY=1``."""
    notes: list[str] = field(default_factory=list)


def tasks_carbon_source() -> TasksCarbonSource:
    """The carbon source a training task of this deployment uses when its DAG does not set ``replay``: the
    operators' own resolution (:func:`carbonflow.operators.common.carbon_source`: ``$CARBONFLOW_REPLAY``, else
    the live chain, keyed from Airflow connections, falling back to climatology and codecarbon's static
    average). ``$CARBONFLOW_CARBON_MODE`` no longer chooses the page's source: when it says otherwise, a note
    says it is ignored."""
    from carbonflow.session.source import REPLAY_ENV, CarbonSource, replay_enabled

    replay = replay_enabled(None)
    if replay:
        source = CarbonSource(replay=True)
    else:
        try:
            from carbonflow.operators.common import carbon_source

            source = carbon_source(None, None)
        except ImportError:  # outside Airflow (tests, a bare install): the chain without connection keys
            source = CarbonSource(replay=False)
    raw = replay_text()
    why = f"{REPLAY_ENV}={raw}" if raw not in (None, "") else f"{REPLAY_ENV} unset"
    mode = "replay" if replay else "live"
    notes = []
    asked = _mode()
    if asked and asked != mode:
        notes.append(
            f"{CARBON_MODE_ENV}={asked} is ignored: the page shows the carbon source the tasks use ({mode}, {why})"
        )
    return TasksCarbonSource(source=source, mode=mode, why=why, notes=notes)


def page_forecast(upcoming: list[UpcomingJob], region: str | None = None, now: datetime | None = None) -> Forecast:
    """The forecast to draw: the latest one a waiting job planned on (its region), else the one a task would get
    now from the tasks' own carbon source (:func:`tasks_carbon_source`), fallbacks included.

    In replay ``now`` is mapped to an evening of the replayed period (as a task's clock is); the forecast says
    ``replay``. Live, offline, the chain falls back as a task's does (down to the static annual average), and
    its notes say which provider decided and why each earlier one was skipped.
    """
    with_forecast = [j for j in upcoming if j.forecast is not None and (region is None or j.plan.region == region)]
    if with_forecast:
        return max(with_forecast, key=lambda j: j.forecast.issued_at).forecast  # type: ignore[union-attr]
    from carbonflow.session.source import DEFAULT_REPLAY_EVENING_H

    region = region or ui_region_text()
    tasks = tasks_carbon_source()
    if tasks.mode == "replay":
        start = now or tasks.source.replay_window(region)[0] + timedelta(hours=DEFAULT_REPLAY_EVENING_H)
    else:
        start = now or datetime.now(UTC)
    forecast = tasks.source.forecast(region, start, start + timedelta(hours=24))
    label = f"the tasks' carbon source: {tasks.mode} ({tasks.why})"
    return forecast.model_copy(update={"notes": [label, *tasks.notes, *forecast.notes]})
