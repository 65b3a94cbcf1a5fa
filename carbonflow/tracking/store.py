"""Writing a :class:`RunRecord` to MLflow idempotently, and the small read helpers the rest share.

Idempotency: a run is created with its client-made key as a tag (in the same request), so a retry
finds it; a run is only marked complete (tag ``carbonflow.complete=true``, status set) after every
param, metric, artifact, nested run and model version is written, so a write interrupted by an
outage is resumed on the same run, never duplicated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carbonflow.tracking import schema
from carbonflow.tracking.records import RunRecord
from carbonflow.tracking.uri import experiment_artifact_location

if TYPE_CHECKING:
    from mlflow.client import MlflowClient
    from mlflow.entities import Run

log = logging.getLogger(__name__)

_PARAM_VALUE_MAX = 6000


def client_for(uri: str) -> MlflowClient:
    """An MLflow client bound to ``uri`` (no global state touched)."""
    from mlflow.client import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def get_experiment_id(client: MlflowClient, name: str) -> str | None:
    """The id of experiment ``name``, or None when it does not exist (or was deleted)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage != "active":
        return None
    return experiment.experiment_id


def ensure_experiment(client: MlflowClient, name: str, uri: str, job: str) -> str:
    """Get or create experiment ``name`` (local stores get artifacts under ``<home>/mlartifacts``)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    try:
        return client.create_experiment(
            name, artifact_location=experiment_artifact_location(uri, name), tags={schema.T_JOB: job}
        )
    except MlflowException as exc:  # created concurrently by another task
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def quote(value: str) -> str:
    """Quote a string literal for an MLflow filter string."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def tag_filter(tag: str, value: str) -> str:
    """``tags.`name` = 'value'`` (backticks because carbonflow tags contain dots)."""
    return f"tags.`{tag}` = {quote(value)}"


def search_all_runs(
    client: MlflowClient, experiment_ids: list[str], filter_string: str = "", *, include_deleted: bool = False
) -> list[Run]:
    """Every run matching ``filter_string``, following MLflow's pagination."""
    from mlflow.entities import ViewType

    view = ViewType.ALL if include_deleted else ViewType.ACTIVE_ONLY
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(
            experiment_ids,
            filter_string=filter_string,
            run_view_type=view,
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def find_run_by_key(client: MlflowClient, experiment_id: str, key: str) -> Run | None:
    """The run carrying idempotency key ``key`` (deleted runs count: a user's deletion is respected)."""
    runs = search_all_runs(client, [experiment_id], tag_filter(schema.T_IDEMPOTENCY_KEY, key), include_deleted=True)
    if len(runs) > 1:
        log.warning("%d runs carry idempotency key %s; using the oldest", len(runs), key)
    return runs[0] if runs else None


@contextmanager
def _no_client_retries() -> Iterator[None]:
    """MLflow's REST client retries a POST whose reply timed out; for ``create_run`` that makes a second run."""
    previous = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = previous


def create_run_once(client: MlflowClient, experiment_id: str, record: RunRecord, tags: dict[str, str]) -> Run:
    """Create the record's run exactly once: one attempt without client retries, then look the key up.

    A create whose reply was lost (timeout, reset) may still have been committed by the server; the
    idempotency-key lookup finds that run instead of creating a second one. Only when no run carries the
    key is the error raised (the caller spools or retries, and its retry looks the key up first).
    """
    try:
        with _no_client_retries():
            return client.create_run(
                experiment_id, start_time=record.start_time_ms, tags=tags, run_name=record.run_name
            )
    except Exception:
        committed = find_run_by_key(client, experiment_id, record.idempotency_key)
        if committed is None:
            raise
        log.warning("create_run of %s failed but the server had created it: using run %s",
                    record.idempotency_key, committed.info.run_id)  # fmt: skip
        return committed


def next_recurrence(client: MlflowClient, experiment_id: str) -> int:
    """1 + the highest recurrence index among the experiment's training runs (1 for a new job)."""
    runs = search_all_runs(client, [experiment_id], tag_filter(schema.T_KIND, schema.KIND_TRAINING))
    highest = 0
    for run in runs:
        try:
            highest = max(highest, int(run.data.tags.get(schema.T_RECURRENCE, "0")))
        except ValueError:
            continue
    return highest + 1


def _log_missing_fields(
    client: MlflowClient, run: Run, record: RunRecord, extra_tags: dict[str, str], *, complete: bool = False
) -> None:
    from mlflow.entities import Metric, Param, RunTag

    run_id = run.info.run_id
    have_params = run.data.params
    have_metrics = run.data.metrics
    params = [Param(k, str(v)[:_PARAM_VALUE_MAX]) for k, v in sorted(record.params.items()) if k not in have_params]
    metrics = [
        Metric(k, float(v), record.end_time_ms, 0) for k, v in sorted(record.metrics.items()) if k not in have_metrics
    ]
    tags = [RunTag(k, v) for k, v in sorted({**record.tags, **extra_tags}.items()) if k != schema.T_COMPLETE]
    starts = list(range(0, max(len(params), len(metrics), len(tags), 1), 100))
    for i in starts:
        batch_tags = tags[i : i + 100]
        if complete and i == starts[-1] and len(batch_tags) < 100:
            # the last batch completes the run: mark it in the same (single-transaction) request
            batch_tags.append(RunTag(schema.T_COMPLETE, "true"))
            complete = False
        client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100], tags=batch_tags)
    if complete:
        client.set_tag(run_id, schema.T_COMPLETE, "true")


def _register(client: MlflowClient, run: Run, record: RunRecord) -> str | None:
    from mlflow.exceptions import MlflowException

    request = record.registry
    if request is None:
        return None
    run_id = run.info.run_id
    existing = [mv for mv in client.search_model_versions(f"run_id = {quote(run_id)}") if mv.name == request.model_name]
    if existing:
        return str(existing[0].version)
    try:
        client.create_registered_model(
            request.model_name,
            tags={schema.T_JOB: record.job},
            description=f"Models trained by carbonflow job {record.job!r}; version tags say what each cost.",
        )
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(
        request.model_name,
        source=f"{run.info.artifact_uri.rstrip('/')}/{request.artifact_path}",
        run_id=run_id,
        tags=request.version_tags,
        description=request.description,
    )
    return str(version.version)


def write_record(
    client: MlflowClient,
    uri: str,
    record: RunRecord,
    base_dir: Path,
    *,
    parent_run_id: str | None = None,
    from_spool: bool = False,
    experiment_id: str | None = None,
    known_new: bool = False,
) -> tuple[str, str, str | None]:
    """Write ``record`` (files relative to ``base_dir``); returns (run_id, experiment_id, model_version).

    ``known_new`` skips the idempotency lookup (a nested run of a parent created in this same call).
    """
    if experiment_id is None:
        experiment_id = ensure_experiment(client, record.experiment, uri, record.job)
    run = None if known_new else find_run_by_key(client, experiment_id, record.idempotency_key)
    created = run is None
    if run is not None and run.data.tags.get(schema.T_COMPLETE) == "true":
        version = None
        if record.registry is not None:
            versions = client.search_model_versions(f"run_id = {quote(run.info.run_id)}")
            version = next((str(v.version) for v in versions if v.name == record.registry.model_name), None)
        return run.info.run_id, experiment_id, version

    late = "true" if from_spool else "false"
    extra_tags: dict[str, str] = {schema.T_SPOOLED: late, schema.T_LOGGED_LATE: late}
    if run is None:
        create_tags = {**record.tags, schema.T_IDEMPOTENCY_KEY: record.idempotency_key}
        create_tags.pop(schema.T_COMPLETE, None)
        if parent_run_id is not None:
            create_tags[schema.T_PARENT_RUN_ID] = parent_run_id
        if record.assign_recurrence:
            create_tags[schema.T_RECURRENCE] = str(next_recurrence(client, experiment_id))
        run = create_run_once(client, experiment_id, record, create_tags)
    else:
        log.info("resuming incomplete run %s (idempotency key %s)", run.info.run_id, record.idempotency_key)
    if schema.T_RECURRENCE in run.data.tags:
        extra_tags[schema.T_RECURRENCE] = run.data.tags[schema.T_RECURRENCE]
    run_id = run.info.run_id

    only_fields = not record.artifacts and not record.children and record.registry is None
    _log_missing_fields(client, run, record, extra_tags, complete=only_fields)
    for artifact in record.artifacts:
        client.log_artifact(run_id, str(base_dir / artifact.file), artifact.artifact_path)
    for child in record.children:
        write_record(
            client,
            uri,
            child,
            base_dir,
            parent_run_id=run_id,
            from_spool=from_spool,
            experiment_id=experiment_id if child.experiment == record.experiment else None,
            known_new=created,
        )
    version = _register(client, run, record) if record.registry is not None else None
    if version is not None:
        client.set_tag(
            run_id,
            schema.T_MODEL_REGISTRY_NOTE,
            f"{record.tags.get(schema.T_MODEL_REGISTRY_NOTE, 'registered')}; version {version}",
        )
    if not only_fields:
        client.set_tag(run_id, schema.T_COMPLETE, "true")
    client.set_terminated(run_id, status=record.status, end_time=record.end_time_ms)
    return run_id, experiment_id, version


def completed_run(job: str, key: str, tracking_uri: str | None = None) -> dict[str, Any] | None:
    """The complete run of ``job`` carrying idempotency key ``key`` (a retry's earlier try logged it), or None.

    None too when the store cannot be reached: the caller then cannot know, and goes on as if not logged.
    """
    from carbonflow.tracking.uri import resolve_tracking_uri, short_http_timeouts

    uri = resolve_tracking_uri(tracking_uri)
    try:
        with short_http_timeouts():
            client = client_for(uri)
            experiment_id = get_experiment_id(client, schema.experiment_name(job))
            run = find_run_by_key(client, experiment_id, key) if experiment_id else None
    except Exception as err:
        from carbonflow.tracking.uri import redacted_text, redacted_uri

        log.warning("cannot ask %s whether %s was already logged (%s)", redacted_uri(uri), job, redacted_text(str(err)))
        return None
    if run is None or run.data.tags.get(schema.T_COMPLETE) != "true" or run.info.status != "FINISHED":
        return None
    return {"tracking_uri": uri, "idempotency_key": key, "run_id": run.info.run_id,
            "experiment_id": experiment_id, "spooled": False}  # fmt: skip
