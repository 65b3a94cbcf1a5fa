"""What the planner reads back from MLflow: fresh profiles, realised vs predicted, pair observations.

Reads the tracking store and the local spool (runs waiting out an outage count as history too, and
are never counted twice: the idempotency key ties a spooled run to its server copy). If the tracking
server is down, the read falls back to the spool alone and logs a warning instead of failing the
night (``strict=True`` raises instead).
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from carbonflow.domain import Profile, key_without_group
from carbonflow.tracking import schema
from carbonflow.tracking.spool import pending
from carbonflow.tracking.uri import (
    redacted_text,
    redacted_uri,
    resolve_tracking_uri,
    server_reachable,
    short_http_timeouts,
)

log = logging.getLogger(__name__)


class TrackingUnavailableError(RuntimeError):
    """The tracking store could not be read (only raised with ``strict=True``)."""


@dataclass(frozen=True)
class RunView:
    """A logged run seen the same way whether it came from MLflow or from the spool."""

    source: Literal["mlflow", "spool"]
    idempotency_key: str
    run_id: str | None
    start_time_ms: int
    end_time_ms: int | None
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    spool_path: Path | None = None

    @property
    def recurrence(self) -> int | None:
        value = self.tags.get(schema.T_RECURRENCE)
        return int(value) if value and value.isdigit() else None

    @property
    def started_at(self) -> datetime:
        return datetime.fromtimestamp(self.start_time_ms / 1000, UTC)

    @property
    def ended_at(self) -> datetime | None:
        return None if self.end_time_ms is None else datetime.fromtimestamp(self.end_time_ms / 1000, UTC)


def _server_views(uri: str, job: str, kind: str, extra_filter: str, strict: bool) -> list[RunView] | None:
    """Complete runs of ``kind`` in the job's experiment; None if the store could not be read."""
    from carbonflow.tracking.store import client_for, get_experiment_id, search_all_runs, tag_filter

    reachable, why = server_reachable(uri)
    try:
        if not reachable:
            raise ConnectionError(why)
        with short_http_timeouts():
            client = client_for(uri)
            experiment_id = get_experiment_id(client, schema.experiment_name(job))
            if experiment_id is None:
                return []
            filters = [tag_filter(schema.T_KIND, kind), tag_filter(schema.T_COMPLETE, "true")]
            if extra_filter:
                filters.append(extra_filter)
            runs = search_all_runs(client, [experiment_id], " and ".join(filters))
    except Exception as exc:
        if strict:
            why = redacted_text(str(exc))
            raise TrackingUnavailableError(f"cannot read tracking store {redacted_uri(uri)}: {why}") from exc
        log.warning("tracking store %s unreadable (%s: %s); history from the local spool only", redacted_uri(uri),
                    type(exc).__name__, redacted_text(str(exc)))  # fmt: skip
        return None
    return [
        RunView(
            source="mlflow",
            idempotency_key=run.data.tags.get(schema.T_IDEMPOTENCY_KEY, run.info.run_id),
            run_id=run.info.run_id,
            start_time_ms=run.info.start_time,
            end_time_ms=run.info.end_time,
            params=dict(run.data.params),
            metrics=dict(run.data.metrics),
            tags=dict(run.data.tags),
        )
        for run in runs
    ]


def _spool_views(uri: str, job: str, kind: str, spool_dir: Path | None) -> list[RunView]:
    views = []
    for entry in pending(root=spool_dir, tracking_uri=uri):
        record = entry.record
        if record.job != job or record.kind != kind:
            continue
        views.append(
            RunView(
                source="spool",
                idempotency_key=record.idempotency_key,
                run_id=None,
                start_time_ms=record.start_time_ms,
                end_time_ms=record.end_time_ms,
                params=dict(record.params),
                metrics=dict(record.metrics),
                tags=dict(record.tags),
                spool_path=entry.path,
            )
        )
    return views


def run_views(
    job: str,
    kind: str = schema.KIND_TRAINING,
    *,
    tracking_uri: str | None = None,
    include_spool: bool = True,
    spool_dir: Path | None = None,
    extra_filter: str = "",
    strict: bool = False,
) -> list[RunView]:
    """Complete runs of ``job`` of ``kind`` from MLflow plus the spool, each once, oldest first."""
    uri = resolve_tracking_uri(tracking_uri)
    server = _server_views(uri, job, kind, extra_filter, strict) or []
    seen = {view.idempotency_key for view in server}
    spooled = (
        [v for v in _spool_views(uri, job, kind, spool_dir) if v.idempotency_key not in seen] if include_spool else []
    )
    return sorted(server + spooled, key=lambda v: (v.recurrence or math.inf, v.start_time_ms))


# --- profiles -----------------------------------------------------------------------------------


def latest_profile(
    job: str,
    device_model: str,
    code_version: str,
    max_age_s: float,
    now: datetime,
    *,
    tracking_uri: str | None = None,
    spool_dir: Path | None = None,
    strict: bool = False,
) -> Profile | None:
    """The newest profile of ``job`` on ``device_model`` for ``code_version`` measured within ``max_age_s``.

    None when there is none (the DAG then profiles again). ``now`` must be UTC-aware.
    """
    if now.tzinfo is None:
        raise ValueError(f"now={now.isoformat()} has no time zone; give it in UTC")
    if max_age_s <= 0:
        raise ValueError(f"max_age_s={max_age_s} is not allowed; it must be > 0")
    from carbonflow.tracking.store import tag_filter

    uri = resolve_tracking_uri(tracking_uri)
    extra = " and ".join(
        [tag_filter(schema.T_DEVICE_MODEL, device_model), tag_filter(schema.T_CODE_VERSION, code_version)]
    )
    views = run_views(
        job, schema.KIND_PROFILE, tracking_uri=uri, spool_dir=spool_dir, extra_filter=extra, strict=strict
    )
    oldest = now - timedelta(seconds=max_age_s)
    fresh = []
    for view in views:
        if view.tags.get(schema.T_DEVICE_MODEL) != device_model or view.tags.get(schema.T_CODE_VERSION) != code_version:
            continue
        try:
            measured_at = datetime.fromisoformat(view.tags[schema.T_MEASURED_AT])
        except (KeyError, ValueError):
            continue
        if oldest <= measured_at <= now + timedelta(minutes=5):
            fresh.append((measured_at, view))
    for _, view in sorted(fresh, key=lambda item: item[0], reverse=True):
        profile = _load_profile(uri, view)
        if profile is not None:
            return profile
    return None


def newest_profile(job: str, *, tracking_uri: str | None = None) -> Profile | None:
    """The newest profile of ``job`` on any device and code version (None when it was never profiled)."""
    uri = resolve_tracking_uri(tracking_uri)
    views = run_views(job, schema.KIND_PROFILE, tracking_uri=uri, strict=True)
    for view in sorted(views, key=lambda v: v.tags.get(schema.T_MEASURED_AT, ""), reverse=True):
        profile = _load_profile(uri, view)
        if profile is not None:
            return profile
    return None


def _load_profile(uri: str, view: RunView) -> Profile | None:
    if view.source == "spool" and view.spool_path is not None:
        files = list((view.spool_path / "files").rglob(schema.A_PROFILE))
        return Profile.model_validate_json(files[0].read_text()) if files else None
    from carbonflow.tracking.store import client_for

    try:
        with short_http_timeouts(), tempfile.TemporaryDirectory() as tmp:
            assert view.run_id is not None
            local = client_for(uri).download_artifacts(view.run_id, schema.A_PROFILE, tmp)
            return Profile.model_validate_json(Path(local).read_text())
    except Exception as exc:
        log.warning("profile.json of run %s unreadable: %s: %s", view.run_id, type(exc).__name__, exc)
        return None


# --- realised vs predicted ----------------------------------------------------------------------


def _num(metrics: dict[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return None if value is None or math.isnan(value) else float(value)


def _opt_float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "default", "none") else None
    except ValueError:
        return None


def _opt_int(text: str | None) -> int | None:
    value = _opt_float(text)
    return None if value is None else int(value)


def _default_batch_size(text: str | None) -> int | None:
    """N of a ``batch_size`` param logged as ``default (N)`` (a run at the job's own batch size), else None."""
    inner = (text or "").removeprefix("default (").removesuffix(")")
    return int(inner) if text and text.startswith("default (") and inner.isdigit() else None


def _colocated(params: dict[str, str]) -> tuple[str, ...]:
    value = params.get(schema.P_COLOCATED_JOBS, "none")
    return () if value in ("", "none") else tuple(sorted(value.split(",")))


@dataclass(frozen=True)
class RealisedVsPredicted:
    """One recurrence of a job: what the planner predicted next to what the run really cost."""

    job: str
    recurrence: int | None
    run_id: str | None
    source: Literal["mlflow", "spool"]
    config_key: str
    containers: int
    power_limit_w: float | None
    batch_size: int | None
    planned_start: str
    started_at: datetime
    finished_at: datetime
    predicted_duration_s: float
    duration_s: float
    predicted_energy_j: float
    energy_total_j: float
    predicted_emissions_g: float
    emissions_g: float
    carbon_intensity_mean_gco2_per_kwh: float | None
    throughput_samples_per_s: float | None
    test_accuracy: float | None
    saving_g: float | None
    saving_fraction: float | None
    energy_labels: str
    emissions_run_now_default_g: float | None = None
    replay: bool = False
    colocated_with: tuple[str, ...] = ()
    epochs: float | None = None
    reached_target: bool | None = None
    observed_slowdown: float | None = None
    succeeded: bool = True
    extra_metrics: dict[str, float] = field(default_factory=dict)
    samples: float | None = None
    """The samples the run reported (its work)."""
    sharing_lost_s: float | None = None
    """Co-located: time and energy the run spent because it shared its GPU (the pair wrapper's figures)."""
    sharing_energy_j: float | None = None
    default_batch_size: int | None = None
    """The job's own batch size a run at it was logged with (``default (N)``; ``batch_size`` is then None)."""

    @property
    def duration_ratio(self) -> float | None:
        """Realised / predicted duration."""
        return self.duration_s / self.predicted_duration_s if self.predicted_duration_s > 0 else None

    @property
    def energy_ratio(self) -> float | None:
        """Realised / predicted energy."""
        return self.energy_total_j / self.predicted_energy_j if self.predicted_energy_j > 0 else None

    def to_planning_record(self):  # -> carbonflow.planning.learning.RealisedRun
        """The planner's :class:`carbonflow.planning.learning.RealisedRun` of this run."""
        from carbonflow.planning.learning import RealisedRun as PlanningRecord

        return PlanningRecord(
            job=self.job,
            config_key=self.config_key,
            finished_at=self.finished_at,
            predicted_duration_s=self.predicted_duration_s,
            realised_duration_s=self.duration_s,
            predicted_energy_j=self.predicted_energy_j,
            realised_energy_j=self.energy_total_j,
            # a run at the job's own batch size is one of that batch size's: the batch-size explorer counts it there
            batch_size=self.batch_size if self.batch_size is not None else self.default_batch_size,
            power_limit_w=self.power_limit_w,
            containers=self.containers,
            epochs=self.epochs,
            reached_target=self.reached_target,
            colocated_with=self.colocated_with,
            observed_slowdown=self.observed_slowdown,
            samples=self.samples,
            sharing_lost_s=self.sharing_lost_s,
            sharing_energy_j=self.sharing_energy_j,
        )


def _row(job: str, view: RunView) -> RealisedVsPredicted | None:
    m, p, t = view.metrics, view.params, view.tags
    needed = (
        schema.M_DURATION_S,
        schema.M_ENERGY_TOTAL_J,
        schema.M_EMISSIONS_G,
        schema.M_PREDICTED_DURATION_S,
        schema.M_PREDICTED_ENERGY_TOTAL_J,
        schema.M_PREDICTED_EMISSIONS_G,
    )
    if any(_num(m, name) is None for name in needed):
        log.warning("run %s of %s lacks %s; skipped", view.run_id or view.idempotency_key, job, needed)
        return None
    reached = t.get(schema.T_REACHED_TARGET)
    known = {*schema.METRIC_NAMES}
    ended = view.ended_at or view.started_at + timedelta(seconds=m[schema.M_DURATION_S])
    return RealisedVsPredicted(
        job=job,
        recurrence=view.recurrence,
        run_id=view.run_id,
        source=view.source,
        config_key=t.get(schema.T_CONFIG_KEY, ""),
        containers=_opt_int(p.get(schema.P_CONTAINERS)) or 1,
        power_limit_w=_opt_float(p.get(schema.P_POWER_LIMIT_W)),
        batch_size=_opt_int(p.get(schema.P_BATCH_SIZE)) if p.get(schema.P_BATCH_SIZE, "").isdigit() else None,
        planned_start=p.get(schema.P_PLANNED_START, ""),
        started_at=view.started_at,
        finished_at=ended,
        predicted_duration_s=m[schema.M_PREDICTED_DURATION_S],
        duration_s=m[schema.M_DURATION_S],
        predicted_energy_j=m[schema.M_PREDICTED_ENERGY_TOTAL_J],
        energy_total_j=m[schema.M_ENERGY_TOTAL_J],
        predicted_emissions_g=m[schema.M_PREDICTED_EMISSIONS_G],
        emissions_g=m[schema.M_EMISSIONS_G],
        carbon_intensity_mean_gco2_per_kwh=_num(m, schema.M_CARBON_INTENSITY_MEAN),
        throughput_samples_per_s=_num(m, schema.M_THROUGHPUT),
        test_accuracy=_num(m, schema.M_TEST_ACCURACY),
        saving_g=_num(m, schema.M_SAVING_G),
        saving_fraction=_num(m, schema.M_SAVING_FRACTION),
        energy_labels=t.get(schema.T_ENERGY_LABELS, "unknown"),
        emissions_run_now_default_g=_num(m, schema.M_EMISSIONS_RUN_NOW_DEFAULT_G),
        replay=t.get(schema.T_REPLAY) == "true",
        colocated_with=_colocated(p),
        epochs=_num(m, "epochs") or _opt_float(p.get(schema.P_EPOCHS)),
        reached_target=None if reached is None else reached == "true",
        observed_slowdown=_num(m, "observed_slowdown"),
        succeeded=(_num(m, schema.M_EXIT_CODE) or 0.0) == 0.0,
        extra_metrics={k: v for k, v in m.items() if k not in known},
        samples=_num(m, schema.M_SAMPLES) or None,
        sharing_lost_s=_num(m, schema.M_SHARING_LOST_S),
        sharing_energy_j=_num(m, schema.M_SHARING_ENERGY_J),
        default_batch_size=_default_batch_size(p.get(schema.P_BATCH_SIZE)),
    )


def realised_vs_predicted(
    job: str,
    *,
    tracking_uri: str | None = None,
    include_spool: bool = True,
    spool_dir: Path | None = None,
    strict: bool = False,
) -> list[RealisedVsPredicted]:
    """Every training run of ``job``, one row per recurrence (oldest first), predicted next to realised."""
    views = run_views(job, tracking_uri=tracking_uri, include_spool=include_spool, spool_dir=spool_dir, strict=strict)
    return _with_slowdowns([row for row in (_row(job, view) for view in views) if row is not None])


def _with_slowdowns(rows: list[RealisedVsPredicted]) -> list[RealisedVsPredicted]:
    """Fill ``observed_slowdown`` of co-located runs not carrying one: solo median throughput / own − 1."""
    solo: dict[str, list[float]] = {}
    for row in rows:
        if not row.colocated_with and row.succeeded and row.throughput_samples_per_s:
            solo.setdefault(key_without_group(row.config_key), []).append(row.throughput_samples_per_s)
    out = []
    for row in rows:
        base = solo.get(key_without_group(row.config_key))
        if row.colocated_with and row.observed_slowdown is None and base and row.throughput_samples_per_s:
            row = replace(row, observed_slowdown=statistics.median(base) / row.throughput_samples_per_s - 1)
        out.append(row)
    return out


# --- co-location --------------------------------------------------------------------------------


def job_history(
    jobs: Iterable[str], *, tracking_uri: str | None = None, spool_dir: Path | None = None, strict: bool = False
):  # -> carbonflow.planning.learning.JobHistory
    """The planner's :class:`~carbonflow.planning.learning.JobHistory` of ``jobs`` (successful runs)."""
    from carbonflow.planning.learning import JobHistory

    records = []
    for job in jobs:
        rows = realised_vs_predicted(job, tracking_uri=tracking_uri, spool_dir=spool_dir, strict=strict)
        records.extend(row.to_planning_record() for row in rows if row.succeeded)
    return JobHistory(records)
