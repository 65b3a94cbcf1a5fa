"""Log carbonflow's training and profiling runs to MLflow with the documented schema.

Every call goes through the outage-safe spool (:mod:`carbonflow.tracking.spool`): it returns a
:class:`TrackingOutcome` and never raises because the tracking server is down.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from datetime import datetime
from importlib import metadata
from pathlib import Path

from carbonflow.domain import Forecast, ForecastPoint, JobSpec, Plan, Profile, RunResult, utcnow
from carbonflow.tracking import schema
from carbonflow.tracking.plots import forecast_plot, pareto_plot
from carbonflow.tracking.records import ArtifactFile, RegistryRequest, RunRecord, TrackingOutcome
from carbonflow.tracking.spool import deliver, new_idempotency_key
from carbonflow.units import format_emissions_g, format_energy_j, kwh_from_j, nearest_minute

log = logging.getLogger(__name__)

_REASON_MAX = 500
_TAG_MAX_CHARS = 5000  # MLflow keeps a tag value up to 5000 characters (8000 in newer servers)


def carbonflow_version() -> str:
    """The installed carbonflow version (``unknown`` when running from a source tree)."""
    try:
        return metadata.version("carbonflow")
    except metadata.PackageNotFoundError:
        return "unknown"


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _iso(when: datetime | None) -> str:
    return "none" if when is None else when.isoformat()


def _fmt(value: float | None) -> str:
    return "default" if value is None else f"{value:g}"


def _labels(labels: list[str]) -> str:
    order = ["measured", "estimated", "simulated"]
    return ",".join(label for label in order if label in set(labels)) or "unknown"


def _device_model(result: RunResult, profile: Profile | None) -> str:
    gpus = [d for d in result.devices if d.kind == "gpu"]
    devices = gpus or result.devices
    if devices:
        model = ",".join(sorted({d.device_model for d in devices}))
        if all(d.label == "simulated" for d in devices) and "simulated" not in model.lower():
            model = f"{model} (simulated)"
        return model
    return profile.device_model if profile is not None else "unknown"


def _plot(problems: list[str], name: str, draw: Callable[[], object]) -> bool:
    """Draw one plot; a plotting failure is noted on the run instead of losing the run's numbers."""
    try:
        draw()
    except Exception as exc:
        log.exception("could not draw %s", name)
        problems.append(f"{name} not drawn: {type(exc).__name__}: {exc}")
        return False
    return True


ERROR_TAG_MAX = 4000
"""Characters of ``carbonflow.error`` kept (its end: the last lines say what broke); MLflow limits a tag's value."""


def _error_text(result: RunResult, error: str | None) -> str:
    text = error or f"training exited with code {result.exit_code}"
    return text if len(text) <= ERROR_TAG_MAX else "…" + text[-(ERROR_TAG_MAX - 1) :]


def _failed(result: RunResult, error: str | None) -> list[str]:
    """The description's first line for a failed training: what broke, before the plan."""
    return [] if result.succeeded else [f"FAILED: {_error_text(result, error)}"]


def _check_same_job(spec: JobSpec, plan: Plan, result: RunResult) -> None:
    if plan.job != spec.name:
        raise ValueError(f"plan.job={plan.job!r} does not match spec.name={spec.name!r}; log a run of one job")
    if result.job != spec.name:
        raise ValueError(f"result.job={result.job!r} does not match spec.name={spec.name!r}; log a run of one job")


def training_record(
    spec: JobSpec,
    plan: Plan,
    result: RunResult,
    *,
    workdir: Path,
    profile: Profile | None = None,
    forecast: Forecast | None = None,
    actual_points: list[ForecastPoint] | None = None,
    power_trace_csv: Path | None = None,
    model_path: Path | None = None,
    idempotency_key: str | None = None,
    provenance: dict[str, str] | None = None,
    would_have: Plan | None = None,
    error: str | None = None,
    reached_target: bool | None = None,
    extra_tags: Mapping[str, str] | None = None,
) -> RunRecord:
    """The complete MLflow record of one training run (artifacts rendered into ``workdir``).

    ``reached_target``: whether the run reached the job's target, when the caller knows better than the run's last
    ``target_metric`` (a run stopped at its energy budget did not); ``extra_tags``: further ``carbonflow.*`` tags of
    the schema (e.g. ``carbonflow.stopped_at_energy_j``).

    A failed training (non-zero exit) gets the tag ``carbonflow.error`` (``error``: its exit status and last output
    lines; else the exit status alone) and no saving: the work was not done, so nothing was saved.

    ``would_have``: an observe-only run's plan, the one carbonflow would have run (logged beside what ran).

    ``provenance``: the Airflow context the run came from (``carbonflow.dag_id``, ``carbonflow.dag_run_id``,
    ``carbonflow.task_id``, ``carbonflow.run_kind``), added to the run's tags.
    """
    _check_same_job(spec, plan, result)
    if power_trace_csv is not None and not Path(power_trace_csv).is_file():
        raise ValueError(f"power_trace_csv={str(power_trace_csv)!r} is not a file; give the monitor's CSV or None")
    if model_path is not None and not Path(model_path).exists():
        raise ValueError(f"model_path={str(model_path)!r} does not exist; give the saved model file or None")
    config = result.config
    metrics: dict[str, float] = {
        schema.M_DURATION_S: result.duration_s,
        schema.M_ENERGY_GPU_J: result.energy_gpu_j,
        schema.M_ENERGY_CPU_J: result.energy_cpu_j,
        schema.M_ENERGY_TOTAL_J: result.energy_total_j,
        schema.M_ENERGY_TOTAL_KWH: kwh_from_j(result.energy_total_j),
        schema.M_EMISSIONS_G: result.emissions_g,
        schema.M_CARBON_INTENSITY_MEAN: result.carbon_intensity_mean_gco2_per_kwh,
        schema.M_THROUGHPUT: result.throughput_samples_per_s,
        schema.M_SAMPLES: float(result.samples),
        schema.M_PREDICTED_DURATION_S: plan.predicted_duration_s,
        schema.M_PREDICTED_ENERGY_TOTAL_J: plan.predicted_energy_j,
        schema.M_PREDICTED_EMISSIONS_G: plan.predicted_emissions_g,
        schema.M_EXIT_CODE: float(result.exit_code),
    }
    optional = {
        schema.M_EMISSIONS_RUN_NOW_DEFAULT_G: result.emissions_run_now_default_g,
        schema.M_SAVING_G: result.saving_g,
        schema.M_SAVING_FRACTION: result.saving_fraction,
        schema.M_PREDICTED_EMISSIONS_RUN_NOW_DEFAULT_G: (
            plan.baseline.predicted_emissions_g if plan.baseline is not None else None
        ),
    }
    if would_have is not None:
        optional[schema.M_WOULD_HAVE_PREDICTED_ENERGY_J] = would_have.predicted_energy_j
        optional[schema.M_WOULD_HAVE_PREDICTED_EMISSIONS_G] = would_have.predicted_emissions_g
    if not result.succeeded:  # a crashed training saved nothing: its counterfactual and saving are not logged
        for name in (schema.M_EMISSIONS_RUN_NOW_DEFAULT_G, schema.M_SAVING_G, schema.M_SAVING_FRACTION):
            optional.pop(name)
    metrics.update({k: v for k, v in optional.items() if v is not None})
    for name, value in result.metrics.items():  # training metrics (test_accuracy, loss, ...) as reported
        metrics.setdefault(name, float(value))

    params = {
        schema.P_CONTAINERS: str(config.containers),
        schema.P_POWER_LIMIT_W: _fmt(config.power_limit_w),
        schema.P_BATCH_SIZE: str(config.batch_size)
        if config.batch_size is not None
        else f"default ({spec.batch_size})",
        schema.P_PLANNED_START: _iso(plan.start),
        schema.P_ACTUAL_START: _iso(result.started_at),
        schema.P_FINISH_BY: _iso(plan.finish_by),
        schema.P_REGION: plan.region,
        schema.P_FORECAST_PROVIDER: plan.forecast_provider,
        schema.P_SIGNAL_KIND: plan.signal_kind or "none",
        schema.P_OBJECTIVE: plan.objective,
        schema.P_COLOCATED_JOBS: ",".join(sorted(plan.colocated_with)) or "none",
        schema.P_PLAN_REASON: plan.reason[:_REASON_MAX],
        schema.P_REPLANS: str(plan.replans),
        schema.P_EPOCHS: str(spec.epochs) if spec.epochs is not None else "none",
        schema.P_STEPS: str(spec.steps) if spec.steps is not None else "none",
    }

    accuracy = result.metrics.get(schema.M_TEST_ACCURACY)
    register: RegistryRequest | None = None
    if model_path is None:
        registry_note = "no model file given"
    elif not result.succeeded:
        registry_note = f"not registered: training exited with code {result.exit_code}"
    elif spec.min_accuracy is not None and accuracy is None:
        registry_note = f"not registered: the job's bar is test_accuracy >= {spec.min_accuracy:g} but none was reported"
    elif spec.min_accuracy is not None and accuracy is not None and accuracy < spec.min_accuracy:
        registry_note = f"not registered: test_accuracy {accuracy:.4f} < min_accuracy {spec.min_accuracy:g}"
    else:
        bar = "no bar set" if spec.min_accuracy is None else f">= min_accuracy {spec.min_accuracy:g}"
        acc = "n/a" if accuracy is None else f"{accuracy:.4f}"
        registry_note = f"registered: test_accuracy {acc} ({bar})"
        version_tags = {
            schema.M_ENERGY_TOTAL_J: f"{result.energy_total_j:.6g}",
            schema.M_ENERGY_TOTAL_KWH: f"{kwh_from_j(result.energy_total_j):.6g}",
            schema.M_EMISSIONS_G: f"{result.emissions_g:.6g}",
            schema.M_DURATION_S: f"{result.duration_s:.6g}",
            schema.T_ENERGY_LABELS: _labels(list(result.energy_labels)),
            schema.T_JOB: spec.name,
            schema.T_CONFIG_KEY: config.key(),
        }
        if accuracy is not None:
            version_tags[schema.M_TEST_ACCURACY] = f"{accuracy:.6g}"
        if result.saving_g is not None:
            version_tags[schema.M_SAVING_G] = f"{result.saving_g:.6g}"
        register = RegistryRequest(
            model_name=schema.registered_model_name(spec.name),
            artifact_path=schema.A_MODEL_DIR,
            version_tags=version_tags,
            description=f"{config.key()}: {format_energy_j(result.energy_total_j)}, "
            f"{format_emissions_g(result.emissions_g)} CO2e",
        )

    if reached_target is not None:
        tags_extra = {schema.T_REACHED_TARGET: str(reached_target).lower()}
    elif spec.target_metric is not None and spec.target_value is not None and spec.target_metric in result.metrics:
        tags_extra = {schema.T_REACHED_TARGET: str(result.metrics[spec.target_metric] >= spec.target_value).lower()}
    else:
        tags_extra = {}
    tags_extra.update(extra_tags or {})
    replay = plan.replay or (forecast is not None and forecast.replay)
    tags = {
        schema.T_JOB: spec.name,
        schema.T_KIND: schema.KIND_TRAINING,
        schema.T_DEVICE_MODEL: _device_model(result, profile),
        schema.T_DEVICE_UUIDS: ",".join(d.device_id for d in result.devices) or "none",
        schema.T_ENERGY_LABELS: _labels(list(result.energy_labels)),
        schema.T_REPLAY: "true" if replay else "false",
        schema.T_VERSION: carbonflow_version(),
        schema.T_CODE_VERSION: spec.code_version,
        schema.T_CONFIG_KEY: config.key(),
        schema.T_POWER_LIMIT_APPLIED: "true" if result.power_limit_applied else "false",
        schema.T_POWER_LIMITS_NOT_RESTORED: "; ".join(result.power_limits_not_restored)[:_TAG_MAX_CHARS] or "none",
        schema.T_MODEL_REGISTERED: "true" if register is not None else "false",
        schema.T_MODEL_REGISTRY_NOTE: registry_note,
        schema.T_NOTE: "\n".join(
            [*_failed(result, error), f"Plan: {plan.reason}", *result.notes, *(forecast.notes if forecast else [])]
        ),
        schema.T_OBSERVE_ONLY: "true" if would_have is not None else "false",
        **tags_extra,
    }
    tags[schema.T_RECORDED_AT] = utcnow().isoformat()
    if not result.succeeded:
        tags[schema.T_ERROR] = _error_text(result, error)
    if would_have is not None:
        tags[schema.T_WOULD_HAVE_CONFIG] = would_have.config.key()
        tags[schema.T_WOULD_HAVE_START] = _iso(would_have.start)

    workdir.mkdir(parents=True, exist_ok=True)
    artifacts: list[ArtifactFile] = []
    plan_file = workdir / schema.A_PLAN
    plan_file.write_text(plan.model_dump_json(indent=2))
    result_file = workdir / schema.A_RESULT
    result_file.write_text(result.model_dump_json(indent=2))
    artifacts += [ArtifactFile(file=str(plan_file)), ArtifactFile(file=str(result_file))]
    if power_trace_csv is not None:
        trace = workdir / schema.A_POWER_TRACE
        trace.write_bytes(Path(power_trace_csv).read_bytes())
        artifacts.append(ArtifactFile(file=str(trace)))
    problems: list[str] = []
    if plan.alternatives or (profile is not None and profile.points):
        pareto = workdir / schema.A_PARETO_PNG
        if _plot(problems, schema.A_PARETO_PNG, lambda: pareto_plot(pareto, plan=plan, profile=profile)):
            artifacts.append(ArtifactFile(file=str(pareto)))
    if forecast is not None:
        forecast_file = workdir / schema.A_FORECAST
        forecast_file.write_text(forecast.model_dump_json(indent=2))
        artifacts.append(ArtifactFile(file=str(forecast_file)))
        png = workdir / schema.A_FORECAST_PNG
        draw = lambda: forecast_plot(png, forecast=forecast, plan=plan, result=result, actual_points=actual_points)  # noqa: E731
        if _plot(problems, schema.A_FORECAST_PNG, draw):
            artifacts.append(ArtifactFile(file=str(png)))
    if problems:
        tags[schema.T_NOTE] = "\n".join([tags[schema.T_NOTE], *problems])
    if model_path is not None:
        model_path = Path(model_path)
        files = sorted(p for p in model_path.rglob("*") if p.is_file()) if model_path.is_dir() else [model_path]
        for file in files:
            sub = file.parent.relative_to(model_path).as_posix() if model_path.is_dir() else "."
            folder = schema.A_MODEL_DIR if sub == "." else f"{schema.A_MODEL_DIR}/{sub}"
            artifacts.append(ArtifactFile(file=str(file), artifact_path=folder))

    tags.update(provenance or {})
    tags[schema.T_SCHEMA_VERSION] = schema.SCHEMA_VERSION
    return RunRecord(
        idempotency_key=idempotency_key or new_idempotency_key(),
        job=spec.name,
        kind=schema.KIND_TRAINING,
        experiment=schema.experiment_name(spec.name),
        run_name=f"{spec.name} {nearest_minute(result.started_at):%Y-%m-%d %H:%M} {config.key()}",
        start_time_ms=_ms(result.started_at),
        end_time_ms=_ms(result.ended_at),
        status="FINISHED" if result.succeeded else "FAILED",
        params=params,
        metrics=metrics,
        tags=tags,
        artifacts=artifacts,
        registry=register,
        # an on-demand run feeds the job's predictions but is not one of its nightly recurrences
        assign_recurrence=(provenance or {}).get(schema.T_RUN_KIND) != "on_demand",
    )


def log_training_run(
    spec: JobSpec,
    plan: Plan,
    result: RunResult,
    *,
    profile: Profile | None = None,
    forecast: Forecast | None = None,
    actual_points: list[ForecastPoint] | None = None,
    power_trace_csv: Path | None = None,
    model_path: Path | None = None,
    tracking_uri: str | None = None,
    spool_dir: Path | None = None,
    idempotency_key: str | None = None,
    provenance: dict[str, str] | None = None,
    would_have: Plan | None = None,
    error: str | None = None,
    reached_target: bool | None = None,
    extra_tags: Mapping[str, str] | None = None,
) -> TrackingOutcome:
    """Log one training run (schema, plan/result JSON, power trace, Pareto and forecast PNGs, model).

    Registers the model as ``carbonflow-<job>`` when training succeeded and ``test_accuracy`` meets
    ``spec.min_accuracy`` (or no bar is set), with energy and emissions as version tags. When the
    tracking store is unreachable the run waits in the spool: ``outcome.spooled`` is True and
    ``outcome.message`` says so; the caller should log that line and carry on.
    """
    with tempfile.TemporaryDirectory(prefix="carbonflow-track-") as tmp:
        record = training_record(
            spec,
            plan,
            result,
            workdir=Path(tmp),
            profile=profile,
            forecast=forecast,
            actual_points=actual_points,
            power_trace_csv=power_trace_csv,
            model_path=model_path,
            idempotency_key=idempotency_key,
            provenance=provenance,
            would_have=would_have,
            error=error,
            reached_target=reached_target,
            extra_tags=extra_tags,
        )
        outcome = deliver(record, tracking_uri, root=spool_dir)
    if result.succeeded and result.saving_fraction is not None:
        log.info("%s", saving_line(spec.name, result.saving_fraction))
    return outcome


def saving_line(job: str, saving_fraction: float) -> str:
    """The task log's line for the run's one saving figure: the same as MLflow's ``saving_fraction``, the
    ``dags test`` summary's and the Carbon page's."""
    from carbonflow.accounting.saving import measured_saving_phrase

    return (
        f"{job}: {measured_saving_phrase(saving_fraction)} (this run's emissions against the predicted emissions "
        "of that baseline; MLflow saving_fraction)"
    )


def profile_record(spec: JobSpec, profile: Profile, *, workdir: Path, idempotency_key: str | None = None) -> RunRecord:
    """The MLflow record of a profiling session: a parent run and a nested run per configuration."""
    if profile.job != spec.name:
        raise ValueError(f"profile.job={profile.job!r} does not match spec.name={spec.name!r}")
    if not profile.points:
        raise ValueError("profile.points is empty; a profile needs at least one configuration")
    key = idempotency_key or new_idempotency_key()
    workdir.mkdir(parents=True, exist_ok=True)
    profile_file = workdir / schema.A_PROFILE
    profile_file.write_text(profile.model_dump_json(indent=2))
    problems: list[str] = []
    pareto = workdir / schema.A_PARETO_PNG
    plotted = _plot(problems, schema.A_PARETO_PNG, lambda: pareto_plot(pareto, profile=profile))
    start_ms = _ms(profile.measured_at)
    total_s = sum(p.duration_s for p in profile.points)
    common_tags = {
        schema.T_JOB: spec.name,
        schema.T_DEVICE_MODEL: profile.device_model,
        schema.T_ENERGY_LABELS: profile.label,
        schema.T_VERSION: carbonflow_version(),
        schema.T_CODE_VERSION: profile.code_version,
    }
    children = []
    for i, point in enumerate(profile.points):
        children.append(
            RunRecord(
                idempotency_key=f"{key}.{i}",
                job=spec.name,
                kind=schema.KIND_PROFILE_POINT,
                experiment=schema.experiment_name(spec.name),
                run_name=point.config.key(),
                start_time_ms=start_ms,
                end_time_ms=start_ms + int(point.duration_s * 1000),
                params={
                    schema.P_CONTAINERS: str(point.config.containers),
                    schema.P_POWER_LIMIT_W: _fmt(point.config.power_limit_w),
                    schema.P_BATCH_SIZE: str(point.config.batch_size)
                    if point.config.batch_size is not None
                    else f"default ({spec.batch_size})",
                },
                metrics={
                    schema.M_THROUGHPUT: point.throughput_samples_per_s,
                    schema.M_ENERGY_PER_SAMPLE_J: point.energy_per_sample_j,
                    schema.M_POWER_TOTAL_W: point.power_total_w,
                    schema.M_DURATION_S: point.duration_s,
                    schema.M_SAMPLES: float(point.samples),
                },
                tags={
                    **common_tags,
                    schema.T_KIND: schema.KIND_PROFILE_POINT,
                    schema.T_ENERGY_LABELS: point.label,
                    schema.T_CONFIG_KEY: point.config.key(),
                },
            )
        )
    params = {
        schema.P_DEVICE_KIND: profile.device_kind,
        schema.P_PROFILE_CONFIGURATIONS: str(len(profile.points)),
        schema.P_DEFAULT_POWER_LIMIT_W: _fmt(profile.default_power_limit_w),
        schema.P_MAX_POWER_W: _fmt(profile.max_power_w),
    }
    return RunRecord(
        idempotency_key=key,
        job=spec.name,
        kind=schema.KIND_PROFILE,
        experiment=schema.experiment_name(spec.name),
        run_name=f"profile {spec.name} {profile.measured_at:%Y-%m-%d %H:%M} ({profile.label})",
        start_time_ms=start_ms,
        end_time_ms=start_ms + int(total_s * 1000),
        params=params,
        metrics={schema.M_DURATION_S: total_s},
        tags={
            **common_tags,
            schema.T_KIND: schema.KIND_PROFILE,
            schema.T_MEASURED_AT: profile.measured_at.isoformat(),
            **({schema.T_NOTE: "\n".join(problems)} if problems else {}),
        },
        artifacts=[ArtifactFile(file=str(profile_file))] + ([ArtifactFile(file=str(pareto))] if plotted else []),
        children=children,
    )


def log_profile(
    spec: JobSpec, profile: Profile, *, tracking_uri: str | None = None, spool_dir: Path | None = None
) -> TrackingOutcome:
    """Log a profiling session: a run (Profile JSON, Pareto PNG) with a nested run per configuration."""
    with tempfile.TemporaryDirectory(prefix="carbonflow-track-") as tmp:
        record = profile_record(spec, profile, workdir=Path(tmp))
        return deliver(record, tracking_uri, root=spool_dir)
