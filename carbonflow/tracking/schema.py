"""The one documented MLflow schema of carbonflow runs.

Every name carbonflow writes to MLflow is a constant here, and :func:`schema_markdown` renders the
README's schema table from the same constants, so the README and the code cannot drift.
Layout: an experiment per job (``carbonflow/<job>``); a run per training (``kind=training``); a run
per profiling session (``kind=profile``) with a nested run per profiled configuration
(``kind=profile-point``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from carbonflow.accounting.energy import (
    M_HOST_PACE_FRACTION,
    M_KEPT_SPEED_FRACTION,
    M_SHARED_GPU_S,
    M_SHARING_ENERGY_J,
    M_SHARING_LOST_S,
)
from carbonflow.domain import OBJECTIVES_HELP

EXPERIMENT_PREFIX = "carbonflow/"
MODEL_NAME_PREFIX = "carbonflow-"


def experiment_name(job: str) -> str:
    """The MLflow experiment holding every run of ``job``."""
    return f"{EXPERIMENT_PREFIX}{job}"


def registered_model_name(job: str) -> str:
    """The model-registry name of ``job``'s trained models."""
    return f"{MODEL_NAME_PREFIX}{job}"


# --- metrics (units in the names) -------------------------------------------------------------
M_DURATION_S = "duration_s"
M_ENERGY_GPU_J = "energy_gpu_j"
M_ENERGY_CPU_J = "energy_cpu_j"
M_ENERGY_TOTAL_J = "energy_total_j"
M_ENERGY_TOTAL_KWH = "energy_total_kwh"
M_EMISSIONS_G = "emissions_g"
M_CARBON_INTENSITY_MEAN = "carbon_intensity_mean_gco2_per_kwh"
M_TEST_ACCURACY = "test_accuracy"
M_THROUGHPUT = "throughput_samples_per_s"
M_SAMPLES = "samples"
M_EMISSIONS_RUN_NOW_DEFAULT_G = "emissions_run_now_default_g"
M_SAVING_G = "saving_g"
M_SAVING_FRACTION = "saving_fraction"
M_PREDICTED_DURATION_S = "predicted_duration_s"
M_PREDICTED_ENERGY_TOTAL_J = "predicted_energy_total_j"
M_PREDICTED_EMISSIONS_G = "predicted_emissions_g"
M_PREDICTED_EMISSIONS_RUN_NOW_DEFAULT_G = "predicted_emissions_run_now_default_g"
M_EXIT_CODE = "exit_code"
# a co-located pair's members: M_KEPT_SPEED_FRACTION, M_HOST_PACE_FRACTION, M_SHARED_GPU_S, M_SHARING_LOST_S,
# M_SHARING_ENERGY_J (imported above from carbonflow.accounting.energy, which computes them; documented below)
# profile points
M_ENERGY_PER_SAMPLE_J = "energy_per_sample_j"
M_POWER_TOTAL_W = "power_total_w"

# --- params -----------------------------------------------------------------------------------
P_CONTAINERS = "containers"
P_POWER_LIMIT_W = "power_limit_w"
P_BATCH_SIZE = "batch_size"
P_PLANNED_START = "planned_start"
P_ACTUAL_START = "actual_start"
P_FINISH_BY = "finish_by"
P_REGION = "region"
P_FORECAST_PROVIDER = "forecast_provider"
P_SIGNAL_KIND = "signal_kind"
P_OBJECTIVE = "objective"
P_COLOCATED_JOBS = "colocated_jobs"
P_PLAN_REASON = "plan_reason"
P_REPLANS = "replans"
P_EPOCHS = "epochs"
P_STEPS = "steps"
P_DEVICE_KIND = "device_kind"
P_PROFILE_CONFIGURATIONS = "profile_configurations"
P_DEFAULT_POWER_LIMIT_W = "default_power_limit_w"
P_MAX_POWER_W = "max_power_w"

# --- tags -------------------------------------------------------------------------------------
T_JOB = "carbonflow.job"
T_KIND = "carbonflow.kind"
T_RECURRENCE = "carbonflow.recurrence"
T_DEVICE_MODEL = "carbonflow.device_model"
T_DEVICE_UUIDS = "carbonflow.device_uuids"
T_ENERGY_LABELS = "carbonflow.energy_labels"
T_REPLAY = "carbonflow.replay"
T_VERSION = "carbonflow.version"
T_CODE_VERSION = "carbonflow.code_version"
T_CONFIG_KEY = "carbonflow.config_key"
T_MEASURED_AT = "carbonflow.measured_at"
T_IDEMPOTENCY_KEY = "carbonflow.idempotency_key"
T_COMPLETE = "carbonflow.complete"
T_SPOOLED = "carbonflow.spooled"
T_POWER_LIMIT_APPLIED = "carbonflow.power_limit_applied"
T_POWER_LIMITS_NOT_RESTORED = "carbonflow.power_limits_not_restored"
T_MODEL_REGISTERED = "carbonflow.model_registered"
T_MODEL_REGISTRY_NOTE = "carbonflow.model_registry_note"
T_ERROR = "carbonflow.error"
T_RECORDED_AT = "carbonflow.recorded_at"
"""Wall-clock UTC time a training's record was made: orders runs whose (replayed) start times are the same."""
"""A failed training's exit status and its command's last output lines (a failed run logs no saving)."""
T_REACHED_TARGET = "carbonflow.reached_target"
T_STOPPED_AT_ENERGY_J = "carbonflow.stopped_at_energy_j"
"""A run the wrapper stopped at its energy budget (the batch-size explorer's threshold, J), short of its target."""
T_FOLLOWS_STOPPED_RUN = "carbonflow.follows_stopped_run"
"""A rerun at the best known batch size: the MLflow run (else idempotency key) of the attempt stopped before it."""
T_DAG_ID = "carbonflow.dag_id"
T_DAG_RUN_ID = "carbonflow.dag_run_id"
T_TASK_ID = "carbonflow.task_id"
T_RUN_KIND = "carbonflow.run_kind"
"""Why the run happened: ``nightly`` (a scheduled recurrence), ``on_demand`` (a manual trigger), ``dev``."""
T_SCHEMA_VERSION = "carbonflow.schema_version"
T_LOGGED_LATE = "carbonflow.logged_late"
"""``true`` when the record reached MLflow after an outage (from the spool or a held XCom record)."""
T_OBSERVE_ONLY = "carbonflow.observe_only"
T_WOULD_HAVE_CONFIG = "carbonflow.would_have_config"
T_WOULD_HAVE_START = "carbonflow.would_have_start"
M_WOULD_HAVE_PREDICTED_ENERGY_J = "would_have_predicted_energy_total_j"
M_WOULD_HAVE_PREDICTED_EMISSIONS_G = "would_have_predicted_emissions_g"
T_HELD_WITHOUT = "carbonflow.held_without"
"""Files a held record could not carry through the metadata DB (over the size budget), left on the worker."""
SCHEMA_VERSION = "2"
"""Runs logged by carbonflow 0.1.0 carry no ``carbonflow.schema_version`` (version 1)."""
T_NOTE = "mlflow.note.content"  # MLflow's run description: plan reason + run notes
T_PARENT_RUN_ID = "mlflow.parentRunId"

Kind = Literal["training", "profile", "profile-point"]
KIND_TRAINING: Kind = "training"
KIND_PROFILE: Kind = "profile"
KIND_PROFILE_POINT: Kind = "profile-point"

# --- artifacts --------------------------------------------------------------------------------
A_PLAN = "plan.json"
A_RESULT = "result.json"
A_PROFILE = "profile.json"
A_FORECAST = "forecast.json"
A_POWER_TRACE = "power_trace.csv"
A_PARETO_PNG = "pareto.png"
A_FORECAST_PNG = "forecast.png"
A_MODEL_DIR = "model"


@dataclass(frozen=True)
class SchemaEntry:
    """One documented name: what it is, where it appears, and what it means."""

    name: str
    kind: Literal["metric", "param", "tag", "artifact"]
    runs: str
    description: str


SCHEMA: tuple[SchemaEntry, ...] = (
    # metrics
    SchemaEntry(M_DURATION_S, "metric", "training, profile-point", "measured wall-clock run time (s)"),
    SchemaEntry(M_ENERGY_GPU_J, "metric", "training", "GPU energy attributed to the job (J)"),
    SchemaEntry(M_ENERGY_CPU_J, "metric", "training", "CPU/RAM energy attributed to the job (J)"),
    SchemaEntry(M_ENERGY_TOTAL_J, "metric", "training", "GPU + CPU energy (J); how it was obtained: tag energy_labels"),
    SchemaEntry(M_ENERGY_TOTAL_KWH, "metric", "training", "the same energy in kWh"),
    SchemaEntry(M_EMISSIONS_G, "metric", "training", "Σ energy(t)·intensity(t), grams CO2e"),
    SchemaEntry(M_CARBON_INTENSITY_MEAN, "metric", "training", "energy-weighted mean grid intensity over the run"),
    SchemaEntry(M_TEST_ACCURACY, "metric", "training", "held-out accuracy (0-1) reported by the workload"),
    SchemaEntry(M_THROUGHPUT, "metric", "training, profile-point", "training samples per second"),
    SchemaEntry(M_SAMPLES, "metric", "training, profile-point", "training samples processed"),
    SchemaEntry(
        M_EMISSIONS_RUN_NOW_DEFAULT_G,
        "metric",
        "training",
        "counterfactual: the same work started now at the default power limit (g)",
    ),
    SchemaEntry(
        M_SAVING_G,
        "metric",
        "training",
        "emissions_run_now_default_g − emissions_g (g); measured; exactly 0 within 1e-9 of the baseline (float noise)",
    ),
    SchemaEntry(M_SAVING_FRACTION, "metric", "training", "saving_g / emissions_run_now_default_g"),
    SchemaEntry(M_PREDICTED_DURATION_S, "metric", "training", "planner's predicted run time (s)"),
    SchemaEntry(M_PREDICTED_ENERGY_TOTAL_J, "metric", "training", "planner's predicted energy (J)"),
    SchemaEntry(M_PREDICTED_EMISSIONS_G, "metric", "training", "planner's predicted emissions (g)"),
    SchemaEntry(
        M_PREDICTED_EMISSIONS_RUN_NOW_DEFAULT_G,
        "metric",
        "training",
        "planner's predicted emissions of the run-now-at-default baseline (g)",
    ),
    SchemaEntry(M_EXIT_CODE, "metric", "training", "exit code of the training command (0 = success)"),
    SchemaEntry(
        M_KEPT_SPEED_FRACTION,
        "metric",
        "training (co-located)",
        "fraction of its solo speed the job kept while both worked; simulated GPU: the device's model (Gavel)",
    ),
    SchemaEntry(
        M_HOST_PACE_FRACTION,
        "metric",
        "training (co-located, simulated GPU)",
        "host-CPU contention, apart from the GPU: observed pace / the pace the simulated GPU prescribes",
    ),
    SchemaEntry(M_SHARED_GPU_S, "metric", "training (co-located)", "seconds both jobs worked on the GPU"),
    SchemaEntry(
        M_SHARING_LOST_S,
        "metric",
        "training (co-located)",
        "time lost to sharing: (1 − kept) × the GPU's time for the work done together (simulated: × host pace)",
    ),
    SchemaEntry(
        M_SHARING_ENERGY_J,
        "metric",
        "training (co-located)",
        "energy sharing added over that time: (power charged while both worked − solo power × kept) × time",
    ),
    SchemaEntry(M_ENERGY_PER_SAMPLE_J, "metric", "profile-point", "energy per training sample (J)"),
    SchemaEntry(M_POWER_TOTAL_W, "metric", "profile-point", "mean power of all devices (W)"),
    # params
    SchemaEntry(P_CONTAINERS, "param", "training, profile-point", "training containers (processes / pods)"),
    SchemaEntry(P_POWER_LIMIT_W, "param", "training, profile-point", "GPU power limit (W), `default` if unchanged"),
    SchemaEntry(P_BATCH_SIZE, "param", "training, profile-point", "batch size, `default (N)` when the job's own N"),
    SchemaEntry(P_PLANNED_START, "param", "training", "start chosen by the planner (UTC ISO 8601)"),
    SchemaEntry(P_ACTUAL_START, "param", "training", "when training really started (UTC ISO 8601)"),
    SchemaEntry(P_FINISH_BY, "param", "training", "the job's deadline (UTC ISO 8601) or `none`"),
    SchemaEntry(P_REGION, "param", "training", "grid or cloud region"),
    SchemaEntry(P_FORECAST_PROVIDER, "param", "training", "carbon-intensity provider that answered"),
    SchemaEntry(P_SIGNAL_KIND, "param", "training", "average-direct, average-lifecycle, marginal or `none`"),
    SchemaEntry(P_OBJECTIVE, "param", "training", f"what the plan minimised, {OBJECTIVES_HELP}"),
    SchemaEntry(P_COLOCATED_JOBS, "param", "training", "jobs sharing the GPU, comma-separated, `none` if alone"),
    SchemaEntry(
        P_PLAN_REASON,
        "param",
        "training",
        "the planner's one-line reason; its saving is written `predicted saving … vs start now at <baseline>`",
    ),
    SchemaEntry(P_REPLANS, "param", "training", "times the start moved after a wake-up re-plan"),
    SchemaEntry(P_EPOCHS, "param", "training", "work to do in epochs (`none` if given in steps)"),
    SchemaEntry(P_STEPS, "param", "training", "work to do in optimiser steps (`none` if given in epochs)"),
    SchemaEntry(P_DEVICE_KIND, "param", "profile", "gpu or cpu"),
    SchemaEntry(P_PROFILE_CONFIGURATIONS, "param", "profile", "number of profiled configurations"),
    SchemaEntry(P_DEFAULT_POWER_LIMIT_W, "param", "profile", "the device's default power limit (W)"),
    SchemaEntry(P_MAX_POWER_W, "param", "profile", "MAXPOWER of Zeus's cost (W)"),
    # tags
    SchemaEntry(T_JOB, "tag", "all", "the job's recurring key"),
    SchemaEntry(T_KIND, "tag", "all", "training, profile or profile-point"),
    SchemaEntry(T_RECURRENCE, "tag", "training", "1, 2, 3 … : which night of this job"),
    SchemaEntry(T_DEVICE_MODEL, "tag", "all", "device model, e.g. `NVIDIA A40` or `NVIDIA V100 (simulated)`"),
    SchemaEntry(T_DEVICE_UUIDS, "tag", "training", "device ids used, comma-separated"),
    SchemaEntry(T_ENERGY_LABELS, "tag", "all", "measured / estimated / simulated, comma-separated"),
    SchemaEntry(T_REPLAY, "tag", "training", "`true` when carbon data was replayed from recorded data"),
    SchemaEntry(T_VERSION, "tag", "all", "carbonflow version that logged the run"),
    SchemaEntry(T_CODE_VERSION, "tag", "training, profile", "the job's code version (profiles are reused per version)"),
    SchemaEntry(T_CONFIG_KEY, "tag", "training, profile-point", "configuration key, e.g. `c1-pl175-b64`"),
    SchemaEntry(T_MEASURED_AT, "tag", "profile", "when the profile was measured (UTC ISO 8601)"),
    SchemaEntry(T_POWER_LIMIT_APPLIED, "tag", "training", "`false` when the power limit could not be set"),
    SchemaEntry(
        T_POWER_LIMITS_NOT_RESTORED,
        "tag",
        "training",
        "`none`, or each GPU whose power limit could not be put back after the run, with the wanted and the actual "
        "limit (the task failed with `PowerLimitNotRestored`)",
    ),
    SchemaEntry(T_MODEL_REGISTERED, "tag", "training", "`true` when the model met the bar and was registered"),
    SchemaEntry(T_MODEL_REGISTRY_NOTE, "tag", "training", "why the model was or was not registered"),
    SchemaEntry(
        T_RECORDED_AT, "tag", "training", "wall-clock UTC time the record was made (a replayed run's start is not)"
    ),
    SchemaEntry(
        T_ERROR, "tag", "training (failed)", "the exit status and the command's last output lines; no saving logged"
    ),
    SchemaEntry(T_NOTE, "tag", "training, profile", "MLflow's run description: plan reason, run and forecast notes"),
    SchemaEntry(T_REACHED_TARGET, "tag", "training", "`true`/`false`: the job's target metric was reached"),
    SchemaEntry(
        T_STOPPED_AT_ENERGY_J,
        "tag",
        "training (stopped)",
        "the energy budget (J, the batch-size explorer's threshold) the run was stopped at, short of its target: "
        "`carbonflow.reached_target` is `false`, `epochs` the epochs it ran, and the night reran the job",
    ),
    SchemaEntry(
        T_FOLLOWS_STOPPED_RUN,
        "tag",
        "training (rerun)",
        "a rerun at the best known batch size: the MLflow run id of the attempt stopped before it (its energy is "
        "logged there; the night's energy is both runs')",
    ),
    SchemaEntry(T_IDEMPOTENCY_KEY, "tag", "all", "client-made key; replay from the spool never duplicates a run"),
    SchemaEntry(T_COMPLETE, "tag", "all", "`true` once every field and artifact was written"),
    SchemaEntry(T_SPOOLED, "tag", "all", "`true` when the run was written later from the local spool (outage)"),
    SchemaEntry(T_LOGGED_LATE, "tag", "all", "`true` when the run reached MLflow after an outage"),
    SchemaEntry(T_OBSERVE_ONLY, "tag", "training", "`true`: observe-only (shadow) run at the current limit, at once"),
    SchemaEntry(T_WOULD_HAVE_CONFIG, "tag", "training", "observe-only: the configuration carbonflow would have run"),
    SchemaEntry(T_WOULD_HAVE_START, "tag", "training", "observe-only: the start carbonflow would have chosen"),
    SchemaEntry(M_WOULD_HAVE_PREDICTED_ENERGY_J, "metric", "training", "observe-only: that plan's predicted energy"),
    SchemaEntry(M_WOULD_HAVE_PREDICTED_EMISSIONS_G, "metric", "training", "observe-only: its predicted emissions"),
    SchemaEntry(T_HELD_WITHOUT, "tag", "training", "files a record delivered from XCom left on the worker (too big)"),
    SchemaEntry(T_DAG_ID, "tag", "training", "the Airflow DAG whose task ran the training"),
    SchemaEntry(T_DAG_RUN_ID, "tag", "training", "the Airflow DAG run"),
    SchemaEntry(T_TASK_ID, "tag", "training", "the Airflow task"),
    SchemaEntry(T_RUN_KIND, "tag", "training", "`nightly` (scheduled recurrence) or `on_demand` (manual trigger)"),
    SchemaEntry(T_SCHEMA_VERSION, "tag", "training", "version of this schema (absent: carbonflow 0.1.0)"),
    # artifacts
    SchemaEntry(A_PLAN, "artifact", "training", "the Plan (configuration, start, predictions, alternatives)"),
    SchemaEntry(A_RESULT, "artifact", "training", "the RunResult (per-device energy and labels, notes)"),
    SchemaEntry(A_POWER_TRACE, "artifact", "training", "power samples over the run (CSV)"),
    SchemaEntry(
        A_PARETO_PNG,
        "artifact",
        "training, profile",
        "configurations: energy vs time, Pareto front, chosen one ringed; colour = predicted g CO2e (profile: W)",
    ),
    SchemaEntry(A_FORECAST_PNG, "artifact", "training", "forecast intensity with planned and actual windows"),
    SchemaEntry(A_FORECAST, "artifact", "training", "the Forecast used (provider, signal kind, points)"),
    SchemaEntry(A_PROFILE, "artifact", "profile", "the Profile (one point per configuration)"),
    SchemaEntry(A_MODEL_DIR, "artifact", "training", "trained weights, registered as `carbonflow-<job>` if good"),
)

METRIC_NAMES: frozenset[str] = frozenset(e.name for e in SCHEMA if e.kind == "metric")
PARAM_NAMES: frozenset[str] = frozenset(e.name for e in SCHEMA if e.kind == "param")
TAG_NAMES: frozenset[str] = frozenset(e.name for e in SCHEMA if e.kind == "tag")
ARTIFACT_NAMES: frozenset[str] = frozenset(e.name for e in SCHEMA if e.kind == "artifact")

#: What every training run carries, whatever happened (optional ones: test_accuracy, savings, predictions).
TRAINING_REQUIRED_METRICS: tuple[str, ...] = (
    M_DURATION_S,
    M_ENERGY_GPU_J,
    M_ENERGY_CPU_J,
    M_ENERGY_TOTAL_J,
    M_ENERGY_TOTAL_KWH,
    M_EMISSIONS_G,
    M_CARBON_INTENSITY_MEAN,
    M_THROUGHPUT,
    M_SAMPLES,
    M_PREDICTED_DURATION_S,
    M_PREDICTED_ENERGY_TOTAL_J,
    M_PREDICTED_EMISSIONS_G,
    M_EXIT_CODE,
)
TRAINING_REQUIRED_PARAMS: tuple[str, ...] = (
    P_CONTAINERS,
    P_POWER_LIMIT_W,
    P_BATCH_SIZE,
    P_PLANNED_START,
    P_ACTUAL_START,
    P_FINISH_BY,
    P_REGION,
    P_FORECAST_PROVIDER,
    P_SIGNAL_KIND,
    P_OBJECTIVE,
    P_COLOCATED_JOBS,
    P_PLAN_REASON,
    P_REPLANS,
    P_EPOCHS,
    P_STEPS,
)
TRAINING_REQUIRED_TAGS: tuple[str, ...] = (
    T_JOB,
    T_KIND,
    T_RECURRENCE,
    T_DEVICE_MODEL,
    T_DEVICE_UUIDS,
    T_ENERGY_LABELS,
    T_REPLAY,
    T_VERSION,
    T_CODE_VERSION,
    T_CONFIG_KEY,
    T_POWER_LIMIT_APPLIED,
    T_POWER_LIMITS_NOT_RESTORED,
    T_MODEL_REGISTERED,
    T_IDEMPOTENCY_KEY,
    T_COMPLETE,
)


README_START = "<!-- carbonflow-schema:start -->"
README_END = "<!-- carbonflow-schema:end -->"


def schema_markdown() -> str:
    """The README's schema section body, rendered from :data:`SCHEMA` (between README_START and README_END)."""
    lines = [
        f"An experiment per job, `{EXPERIMENT_PREFIX}<job>`; a run per training (`{T_KIND}=training`); a run per",
        "profiling session (`profile`) with a nested run per profiled configuration (`profile-point`); trained",
        f"models registered as `{MODEL_NAME_PREFIX}<job>` with energy and emissions as version tags.",
        "",
        "| name | kind | runs | meaning |",
        "|---|---|---|---|",
    ]
    for entry in SCHEMA:
        lines.append(f"| `{entry.name}` | {entry.kind} | {entry.runs} | {entry.description} |")
    return "\n".join(lines) + "\n"


def _main() -> None:  # pragma: no cover - convenience: python -m carbonflow.tracking.schema
    print(schema_markdown(), end="")


if __name__ == "__main__":  # pragma: no cover
    _main()
