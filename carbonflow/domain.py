"""Core types shared by every part of carbonflow (DESIGN.md "Core types").

They are pydantic models so that they validate user input with errors that name the field,
the value and what is allowed, and travel as JSON over XCom, MLflow artifacts and the
``carbonflow run`` wrapper's plan/result files. All datetimes are timezone-aware UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from carbonflow.contract import check_env_from_connections, check_job_env
from carbonflow.progress_pattern import (
    MATCH_TIMEOUT_S,
    MAX_PATTERN_CHARS,
    PATTERN_GROUPS,
    check_pattern_for_job,
    check_progress_pattern,
)

SignalKind = Literal["average-direct", "average-lifecycle", "marginal"]
"""What a carbon-intensity number means; never mix kinds in one comparison."""

EnergyLabel = Literal["measured", "estimated", "simulated"]
"""How an energy figure was obtained. Anything not read from a hardware counter says so."""

DeviceKind = Literal["gpu", "cpu"]

OBJECTIVE_PATTERN = r"^(carbon|energy|time|edp|eds:(?P<k>[0-9.]+)|zeus:(?P<eta>[0-9.]+))$"
"""The objective grammar, the one place it is written (the DAGs' Params take :data:`OBJECTIVE_PARAM_PATTERN`)."""
OBJECTIVE_PARAM_PATTERN = OBJECTIVE_PATTERN.replace("(?P<k>", "(").replace("(?P<eta>", "(")
"""The grammar as a JSON-schema ``pattern`` (no named groups) for Airflow Params."""
_OBJECTIVE_RE = re.compile(OBJECTIVE_PATTERN)
OBJECTIVES_HELP = "one of carbon, energy, time, edp, eds:<k> with k >= 1, zeus:<eta> with 0 <= eta <= 1"
JOB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"datetime {value.isoformat()} has no time zone; give it in UTC, e.g. '2023-03-15T06:00Z'")
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


def parse_objective(objective: str) -> tuple[str, float | None]:
    """Split an objective string into its name and parameter (k of eds:k, eta of zeus:eta)."""
    match = _OBJECTIVE_RE.match(objective)
    if not match:
        raise ValueError(f"objective={objective!r} is not allowed; use {OBJECTIVES_HELP}")
    if match.group("k") is not None:
        k = float(match.group("k"))
        if k < 1:
            raise ValueError(f"objective={objective!r}: k must be >= 1")
        return "eds", k
    if match.group("eta") is not None:
        eta = float(match.group("eta"))
        if not 0 <= eta <= 1:
            raise ValueError(f"objective={objective!r}: eta must be between 0 and 1")
        return "zeus", eta
    return objective, None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


# Bounds of a job's input (issue 21): every number finite and in a documented range, every text and list sized,
# so a job file or a trigger cannot ask for 1e12 epochs, a NaN target or an endless timeout.
MAX_EPOCHS = 100_000
MAX_STEPS = 100_000_000
MAX_SAMPLES_PER_EPOCH = 10_000_000_000
MAX_BATCH_SIZE = 1_048_576
MAX_CANDIDATES = 32
MAX_RECURRENCES = 100_000
"""Most entries of a candidate list (batch_sizes, power_limits_w, trigger_limits.batch_sizes)."""
MAX_POWER_LIMIT_W = 2000.0
"""Above any GPU's power limit; the validate task then checks the device's own range."""
MAX_PROFILE_STEPS = 100_000
MAX_TIMEOUT_S = 24 * 3600.0
MAX_PROFILE_AGE_S = 365 * 24 * 3600.0
MAX_ABS_TARGET_VALUE = 1e9
MAX_COMMAND_WORDS = 256
MAX_COMMAND_WORD_CHARS = 4096
MAX_COMMAND_CHARS = 32 * 1024
MAX_ENV_ENTRIES = 128
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 8192
MAX_TEXT_CHARS = 256
"""Longest short text field (workload, region, objective, target_metric, code_version, simulated GPU names)."""
MAX_PATH_CHARS = 4096
"""Longest working_dir or image reference."""


class _InputModel(_Model):
    """A model people write (a job file, a DAG's job dict): NaN and infinities are refused in every number."""

    model_config = ConfigDict(allow_inf_nan=False)


class SimulatedGpuSpec(_InputModel):
    """Which published Zeus measurement a simulated GPU replays (always labelled simulated)."""

    gpu_model: Literal["V100", "A40", "RTX6000", "P100"] = Field(default="V100", description="the GPU Zeus measured")
    dataset: str = Field(
        default="cifar100",
        max_length=MAX_TEXT_CHARS,
        description="Zeus workload's dataset (with network: which measurement)",
    )
    network: str = Field(default="shufflenetv2", max_length=MAX_TEXT_CHARS, description="Zeus workload's network")
    batch_size: int | None = Field(default=None, gt=0, le=MAX_BATCH_SIZE, description="None: the workload's default b0")
    optimizer: str | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="Zeus workload's optimizer, where it measured several"
    )
    count: int = Field(default=1, ge=1, le=16, description="simulated GPUs on this node")
    pair_type: str | None = Field(
        default=None,
        max_length=MAX_TEXT_CHARS,
        description="Gavel job type whose measured V100 pair speeds this job follows when it shares a simulated GPU",
    )


class TriggerLimits(_InputModel):
    """What a trigger (an on-demand run's conf) may change in this job, as its author allows: a trigger chooses,
    the author defines. Without limits a trigger may ask for at most the job's own work and its own batch sizes."""

    max_epochs: int | None = Field(
        default=None, ge=1, le=MAX_EPOCHS, description="most epochs a trigger may ask for; None: the job's own epochs"
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=MAX_STEPS, description="most steps a trigger may ask for; None: the job's own steps"
    )
    batch_sizes: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CANDIDATES,
        description="batch sizes a trigger may choose; None: the job's batch_size and batch_sizes",
    )

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 1 <= b <= MAX_BATCH_SIZE for b in v):
            raise ValueError(f"batch_sizes={v} is not allowed; give batch sizes from 1 to {MAX_BATCH_SIZE}")
        return v


COMMAND_PLACEHOLDERS = ("epochs", "steps", "batch_size", "lr_scale", "output_dir", "python")
"""Placeholders a command job may use; each is also in the environment (CARBONFLOW_EPOCHS, ...)."""


class JobSpec(_InputModel):
    """A recurring training job: what to run, on what, how much, where and by when."""

    name: str = Field(max_length=63, description="recurring key; the same name every night")
    workload: str | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="built-in workload, e.g. 'digits_cnn'"
    )
    command: list[str] | None = Field(
        default=None,
        max_length=MAX_COMMAND_WORDS,
        description="command to run instead of a workload; may use {epochs} {steps} {batch_size} {lr_scale} "
        f"{{output_dir}} {{python}}; 'python' as the first word is the worker's interpreter; words of at most "
        f"{MAX_COMMAND_WORD_CHARS} characters, {MAX_COMMAND_CHARS} in all",
    )
    working_dir: str | None = Field(
        default=None,
        max_length=MAX_PATH_CHARS,
        description="where the command runs; a relative path is resolved against the DAG file's folder",
    )
    samples_per_epoch: int | None = Field(
        default=None,
        gt=0,
        le=MAX_SAMPLES_PER_EPOCH,
        description="samples one epoch holds (command jobs that give their work in epochs)",
    )
    progress_pattern: str | None = Field(
        default=None,
        description="a regular expression searched in each line the command prints (stdout and stderr): its "
        f"matches are the progress reports of a script that writes none; named groups among {', '.join(PATTERN_GROUPS)}"
        f" (the last accuracy is the run's test_accuracy unless the script reports one); at most {MAX_PATTERN_CHARS} "
        f"characters; a line whose search takes over {MATCH_TIMEOUT_S} s counts as unmatched; see docs/own-job.md",
    )
    image: str | None = Field(
        default=None, max_length=MAX_PATH_CHARS, description="container image for the Kubernetes backend"
    )
    device_kind: DeviceKind = Field(default="gpu", description="what the job trains on: gpu or cpu")
    simulated_gpu: SimulatedGpuSpec | None = Field(
        default=None, description="replay a Zeus-measured GPU instead of NVML (labelled simulated)"
    )
    min_containers: int = Field(default=1, ge=1, le=64, description="fewest data-parallel processes/pods to consider")
    max_containers: int = Field(
        default=1, ge=1, le=64, description="most data-parallel processes/pods to consider (one GPU each)"
    )
    epochs: int | None = Field(default=None, ge=1, le=MAX_EPOCHS, description="work to do, in epochs")
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description="work to do, in optimiser steps")
    batch_size: int = Field(
        default=64,
        gt=0,
        le=MAX_BATCH_SIZE,
        description="batch size of each container (one data-parallel process loads this many samples a step)",
    )
    batch_sizes: list[int] | None = Field(
        default=None,
        max_length=MAX_CANDIDATES,
        description=f"opt-in batch-size candidates (each ≥ 1, ≤ {MAX_BATCH_SIZE})",
    )
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        default="none",
        description="how the learning rate follows a batch size other than batch_size: the training multiplies its "
        "learning rate by CARBONFLOW_LR_SCALE (carbonflow.training.lr_scale(), {lr_scale}): 'linear' batch size ÷ "
        "batch_size, 'sqrt' its square root, 'none' 1",
    )
    target_metric: str | None = Field(
        default=None,
        max_length=MAX_TEXT_CHARS,
        description="metric the job trains to (with batch_sizes: the batch-size explorer learns from it)",
    )
    target_value: float | None = Field(
        default=None,
        ge=-MAX_ABS_TARGET_VALUE,
        le=MAX_ABS_TARGET_VALUE,
        description="value of target_metric that counts as reached; the training reads it as "
        "CARBONFLOW_TARGET_VALUE and carbonflow.training.should_stop() turns true once a report reaches it",
    )
    recurrences: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RECURRENCES,
        description="how many times the job runs in all, past runs included (with batch_sizes: the explorer weighs "
        "what trying a batch size teaches, and what it may risk over the default, over the runs left; None: a "
        "rolling 60 more)",
    )
    min_accuracy: float | None = Field(default=None, ge=0, le=1, description="bar to register the model")
    region: str = Field(
        max_length=MAX_TEXT_CHARS,
        description="grid region (e.g. GB, DE, US-CAL-CISO) or cloud region (e.g. aws:eu-west-2)",
    )
    finish_by: UtcDatetime | None = Field(
        default=None, description="latest end (UTC); None: the operator's next deadline_time_utc"
    )
    objective: str = Field(
        default="carbon", max_length=MAX_TEXT_CHARS, description=f"what the plan minimises: {OBJECTIVES_HELP}"
    )
    max_slowdown: float = Field(default=0.10, ge=0, le=10, description="allowed extra run time, as a fraction")
    power_limit_w: float | None = Field(
        default=None,
        gt=0,
        le=MAX_POWER_LIMIT_W,
        description="fixed power limit; None lets the planner choose (the validate task checks the device's range)",
    )
    power_limits_w: list[float] | None = Field(
        default=None,
        max_length=MAX_CANDIDATES,
        description=f"candidate power limits to profile (each > 0, ≤ {MAX_POWER_LIMIT_W:g})",
    )
    profile_steps: int = Field(
        default=30, gt=0, le=MAX_PROFILE_STEPS, description="measured steps per profiled configuration"
    )
    profile_warmup_steps: int = Field(
        default=5, ge=0, le=MAX_PROFILE_STEPS, description="steps run before each configuration is measured"
    )
    profile_min_window_s: float = Field(
        default=2.0, ge=0, le=600, description="each profiled configuration is measured over at least this long"
    )
    profile_report_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="profiling stops a training that reports no progress for this long",
    )
    profile_max_age_s: float = Field(
        default=7 * 24 * 3600, gt=0, le=MAX_PROFILE_AGE_S, description="reuse a profile younger than this"
    )
    observe_only: bool = Field(
        default=False,
        description="shadow mode: profile, plan and log what carbonflow would have saved, but train at once at "
        "the GPU's current limit, alone (no power limit, start time or co-location changed); "
        "$CARBONFLOW_OBSERVE_ONLY=1 sets it for every job",
    )
    trigger_limits: TriggerLimits | None = Field(
        default=None,
        description="what an on-demand trigger may ask of this job (epochs, steps, batch size) and up to where; "
        "None: at most the job's own epochs or steps, and only its own batch sizes. Everything else (command, "
        "working_dir, env, image, resources) comes only from the job's definition",
    )
    code_version: str = Field(
        default="1",
        max_length=MAX_TEXT_CHARS,
        description="version of the training code; a new value makes the job's profile stale. Unset on a command job: "
        "a fingerprint of the files its command names under working_dir (auto-…), so editing the script re-profiles",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_ENTRIES,
        description="extra environment of the training (carbonflow's own variables refused); names of at most "
        f"{MAX_ENV_NAME_CHARS} characters, values of at most {MAX_ENV_VALUE_CHARS}",
    )
    env_from_connections: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_ENTRIES,
        description="secrets of the training: variable name → Airflow connection id, set to the connection's URI "
        "when the task launches the training (never logged, never in XCom); no other secret reaches a training",
    )

    @field_validator("env_from_connections")
    @classmethod
    def _env_from_connections(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        check_env_from_connections(v, info.data.get("env") or {})
        return v

    @field_validator("progress_pattern")
    @classmethod
    def _progress_pattern(cls, v: str | None) -> str | None:
        if v is not None:
            check_progress_pattern(v)
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not JOB_NAME_RE.match(v):
            raise ValueError(
                f"name={v!r} is not allowed; use 1-63 lowercase letters, digits, '_', '.', '-' "
                "starting with a letter or digit"
            )
        return v

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        parse_objective(v)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if len(name) > MAX_ENV_NAME_CHARS or len(value) > MAX_ENV_VALUE_CHARS:
                raise ValueError(
                    f"env entry {_short(name)} ({len(name)} + {len(value)} characters) is too long; allowed: names "
                    f"of at most {MAX_ENV_NAME_CHARS} characters, values of at most {MAX_ENV_VALUE_CHARS}"
                )
        check_job_env(v)
        return v

    @field_validator("epochs", "steps", mode="before")
    @classmethod
    def _positive_work(cls, v: Any, info: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool) and v <= 0:
            top = MAX_EPOCHS if info.field_name == "epochs" else MAX_STEPS
            raise ValueError(f"{info.field_name}={v} is not allowed; it must be a positive integer, at most {top}")
        return v

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(not 1 <= b <= MAX_BATCH_SIZE for b in v)):
            raise ValueError(
                f"batch_sizes={_short(v)} is not allowed; give one or more integers from 1 to {MAX_BATCH_SIZE}"
            )
        return v

    @field_validator("power_limits_w")
    @classmethod
    def _power_limits(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(not 0 < w <= MAX_POWER_LIMIT_W for w in v):
            raise ValueError(
                f"power_limits_w={_short(v)} is not allowed; give limits above 0 W and at most {MAX_POWER_LIMIT_W:g} W"
            )
        return v

    @field_validator("finish_by", mode="before")
    @classmethod
    def _finish_by_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                datetime.fromisoformat(v.strip().replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError:
                raise ValueError(
                    f"finish_by={_short(v)} is not a date-time; give an ISO 8601 UTC time such as "
                    "2026-11-25T07:00:00Z (or leave it empty for the next deadline)"
                ) from None
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v or not v[0].strip():
            raise ValueError(
                f"command={v!r} is not allowed; give the program and its arguments, e.g. ['python', 'train.py']"
            )
        longest = max(len(word) for word in v)
        if longest > MAX_COMMAND_WORD_CHARS or sum(len(word) for word in v) > MAX_COMMAND_CHARS:
            raise ValueError(
                f"command={_short(v)} is too long (a word of {longest} characters, {sum(len(w) for w in v)} in all); "
                f"allowed: words of at most {MAX_COMMAND_WORD_CHARS} characters, {MAX_COMMAND_CHARS} in all"
            )
        for word in v:
            for name in re.findall(r"{([^{}]*)}", word):
                if name not in COMMAND_PLACEHOLDERS:
                    raise ValueError(
                        f"command placeholder {{{name}}} in {word!r} is not known; allowed: "
                        + ", ".join(f"{{{p}}}" for p in COMMAND_PLACEHOLDERS)
                    )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.workload is None and self.command is None and self.image is None:
            raise ValueError("a job needs one of workload, command or image")
        if self.epochs is None and self.steps is None:
            raise ValueError("a job needs its work: epochs or steps (a positive integer)")
        if self.workload is None and self.epochs is not None and self.samples_per_epoch is None:
            raise ValueError(
                f"samples_per_epoch=None: job {self.name!r} gives its work in epochs={self.epochs}, so carbonflow must "
                "know how many samples one epoch holds to plan it; set samples_per_epoch, or give the work as steps"
            )
        if self.progress_pattern is not None:
            check_pattern_for_job(self.progress_pattern, self.samples_per_epoch)
        if self.min_containers > self.max_containers:
            raise ValueError(
                f"min_containers={self.min_containers} is above max_containers={self.max_containers}; it must be <= it"
            )
        if self.device_kind == "cpu" and self.simulated_gpu is not None:
            raise ValueError("simulated_gpu is set but device_kind='cpu'; use device_kind='gpu' with a simulated GPU")
        limits = self.trigger_limits
        if limits is not None and limits.max_epochs is not None and self.epochs is None:
            raise ValueError(
                f"trigger_limits.max_epochs={limits.max_epochs} is set but job {self.name!r} gives its work in steps; "
                "use trigger_limits.max_steps"
            )
        if limits is not None and limits.max_steps is not None and self.steps is None:
            raise ValueError(
                f"trigger_limits.max_steps={limits.max_steps} is set but job {self.name!r} gives its work in epochs; "
                "use trigger_limits.max_epochs"
            )
        return self


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error quotes a huge value without printing all of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


class Config(_Model):
    """How to train: containers, a power limit per GPU, batch size, co-location group."""

    containers: int = Field(default=1, ge=1)
    power_limit_w: float | None = Field(default=None, gt=0, description="None: the device's current/default limit")
    batch_size: int | None = Field(default=None, gt=0)
    colocation_group: str | None = None

    def key(self) -> str:
        """A short stable identifier, e.g. ``c1-pl175-b64``."""
        pl = "default" if self.power_limit_w is None else f"{self.power_limit_w:g}"
        parts = [f"c{self.containers}", f"pl{pl}"]
        if self.batch_size is not None:
            parts.append(f"b{self.batch_size}")
        if self.colocation_group:
            parts.append(f"g{self.colocation_group}")
        return "-".join(parts)


def key_without_group(config_key: str) -> str:
    """A :meth:`Config.key` without its co-location group (``c1-pl250-gjob-a+job-b`` → ``c1-pl250``): the
    configuration a co-located run had, as it would run alone."""
    return config_key.split("-g", 1)[0]


PROFILE_NOISE = "the profile cannot rank them (noise)"
"""Part of a profile's note when its configurations differ by less than their own step times' spread: the
profiler writes it, the planner then keeps the default power limit."""


class ProfilePoint(_Model):
    """What one configuration cost per sample while profiled."""

    config: Config
    throughput_samples_per_s: float = Field(gt=0)
    power_per_device_w: dict[str, float] = Field(description="device id -> mean power (W)")
    energy_per_sample_j: float = Field(ge=0)
    duration_s: float = Field(ge=0)
    samples: int = Field(ge=0)
    label: EnergyLabel
    throughput_spread: float | None = Field(
        default=None, ge=0, description="relative standard error of the throughput: step-time spread / √steps"
    )

    @property
    def power_total_w(self) -> float:
        return sum(self.power_per_device_w.values())


class Profile(_Model):
    """A job's profile: one point per configuration, measured or simulated, on one device model."""

    job: str
    device_model: str
    device_kind: DeviceKind
    label: EnergyLabel
    code_version: str = "1"
    measured_at: UtcDatetime = Field(default_factory=utcnow)
    default_power_limit_w: float | None = None
    max_power_w: float | None = Field(default=None, description="MAXPOWER of Zeus's cost (W)")
    samples_per_epoch: int | None = None
    points: list[ProfilePoint]
    notes: list[str] = Field(default_factory=list, description="what the profiler found, e.g. noise-limited points")


class ForecastPoint(_Model):
    """One slot of a carbon-intensity series."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: UtcDatetime
    length_s: float = Field(gt=0)
    gco2_per_kwh: float = Field(ge=0)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.length_s)


class Forecast(_Model):
    """A regional carbon-intensity forecast, normalised from any provider."""

    region: str
    provider: str
    signal_kind: SignalKind
    issued_at: UtcDatetime
    points: list[ForecastPoint]
    replay: bool = Field(default=False, description="served from recorded data, not a live API")
    error_mae_by_lead_h: dict[float, float] | None = Field(
        default=None, description="mean absolute error (gCO2/kWh) by lead time upper bound (h)"
    )
    notes: list[str] = Field(default_factory=list, description="why other providers were skipped, etc.")

    @field_validator("points")
    @classmethod
    def _sorted(cls, v: list[ForecastPoint]) -> list[ForecastPoint]:
        return sorted(v, key=lambda p: p.start)

    def intensity_at(self, when: datetime) -> float | None:
        """The intensity of the slot containing ``when`` (None outside the series)."""
        for point in self.points:
            if point.start <= when < point.end:
                return point.gco2_per_kwh
        return None


class PlanAlternative(_Model):
    """A configuration and start the planner considered."""

    config: Config
    start: UtcDatetime
    predicted_duration_s: float
    predicted_energy_j: float
    predicted_emissions_g: float
    cost: float
    feasible: bool = True
    why_not: str | None = None


class Plan(_Model):
    """The decision: which configuration, when, and what it should cost."""

    job: str
    config: Config
    start: UtcDatetime
    finish_by: UtcDatetime | None = None
    predicted_duration_s: float = Field(ge=0)
    predicted_energy_j: float = Field(ge=0)
    predicted_emissions_g: float = Field(ge=0)
    objective: str = "carbon"
    region: str
    forecast_provider: str
    signal_kind: SignalKind | None = Field(default=None, description="None when no forecast was used")
    replay: bool = False
    baseline: PlanAlternative | None = Field(default=None, description="start now at the default power limit")
    alternatives: list[PlanAlternative] = Field(default_factory=list)
    colocated_with: list[str] = Field(default_factory=list)
    reason: str
    created_at: UtcDatetime = Field(default_factory=utcnow)
    replans: int = Field(default=0, ge=0)


class DeviceEnergy(_Model):
    """Energy of one device over a run, with how it was obtained."""

    device_id: str
    device_model: str
    kind: DeviceKind
    energy_j: float = Field(ge=0)
    label: EnergyLabel
    share: float = Field(default=1.0, ge=0, le=1, description="fraction attributed to this job")
    power_limit_w: float | None = None
    notes: list[str] = Field(default_factory=list)


class RunResult(_Model):
    """What a run really cost and achieved."""

    job: str
    config: Config
    started_at: UtcDatetime
    ended_at: UtcDatetime
    duration_s: float = Field(ge=0)
    devices: list[DeviceEnergy]
    energy_gpu_j: float = Field(ge=0)
    energy_cpu_j: float = Field(ge=0)
    energy_total_j: float = Field(ge=0)
    energy_labels: list[EnergyLabel] = Field(description="labels of the figures inside energy_total_j")
    emissions_g: float = Field(ge=0)
    carbon_intensity_mean_gco2_per_kwh: float = Field(ge=0)
    samples: int = Field(default=0, ge=0)
    throughput_samples_per_s: float = Field(default=0, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict, description="training metrics, e.g. test_accuracy")
    exit_code: int = 0
    power_limit_applied: bool = True
    power_limits_not_restored: list[str] = Field(
        default_factory=list,
        description="one entry per GPU whose power limit could not be put back after the run: the GPU, the "
        "wanted and the actual limit (the task fails on it; a note says it in words too)",
    )
    notes: list[str] = Field(default_factory=list)
    emissions_run_now_default_g: float | None = None
    saving_g: float | None = None
    saving_fraction: float | None = None
    artifacts: dict[str, str] = Field(default_factory=dict, description="name -> local path")

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside a field's annotation (``SimulatedGpuSpec | None`` → ``SimulatedGpuSpec``), if any."""
    options = getattr(annotation, "__args__", (annotation,))
    return next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _owner_and_field(model: type[BaseModel], loc: list[str]) -> tuple[type[BaseModel] | None, Any]:
    """The model that holds the field at ``loc`` (nested models followed) and that field (None: unknown)."""
    owner: type[BaseModel] | None = model
    for part in loc[:-1]:
        inner = owner.model_fields.get(part) if owner is not None else None
        owner = _nested_model(inner.annotation) if inner is not None else None
    return owner, owner.model_fields.get(loc[-1]) if owner is not None else None


def _plain(number: Any) -> str:
    """A bound as people write it: 86400 not 86400.0, 1000000000 not 1e+09."""
    return str(int(number)) if isinstance(number, float) and number.is_integer() else str(number)


def field_bounds(field: Any) -> str:
    """A field's numeric bounds as `` (≥ 0, ≤ 10)``; empty when it has none."""
    marks = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥", "max_length": "length ≤"}
    found = [
        f"{marks[k]} {_plain(getattr(m, k))}"
        for m in getattr(field, "metadata", [])
        for k in marks
        if getattr(m, k, None) is not None
    ]
    return f" ({', '.join(found)})" if found else ""


def field_problem(error: Any, model: type[BaseModel] = JobSpec) -> str:
    """One pydantic error as ``field: what is wrong (got value)``; an unknown field also gets the nearest allowed
    one (``did you mean 'samples_per_epoch'?``) and the list of allowed fields, a value out of range the whole
    range, a mapping given as a string the fields it takes."""
    import difflib

    loc = [str(p) for p in error["loc"]]
    field = ".".join(loc)
    message = str(error["msg"]).removeprefix("Value error, ")
    if not field:  # a whole-model rule: its message names the fields
        return message
    owner, info = _owner_and_field(model, loc)
    value = error.get("input")
    kind = error.get("type")
    if kind == "extra_forbidden":
        allowed = sorted(owner.model_fields) if owner is not None else []
        near = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{field}: unknown field{hint} (allowed: {', '.join(allowed)})" if allowed else f"{field}: {message}"
    nested = _nested_model(info.annotation) if info is not None else None
    if kind == "model_type" and nested is not None:  # e.g. simulated_gpu: "V100" where an object is expected
        return f"{field}: must be a mapping with fields {', '.join(nested.model_fields)} (got {value!r})"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and info is not None:
        return f"{field}: {_short(value)} is out of range; allowed: {field_bounds(info).strip(' ()')}"
    if kind == "finite_number":
        allowed = field_bounds(info).strip(" ()") if info is not None else ""
        return f"{field}: {value!r} is not a finite number; allowed: a finite number {allowed}".rstrip()
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind == "string_too_long" else "entries"
        limit = (error.get("ctx") or {}).get("max_length")
        return f"{field}: {_short(value)} is too long ({len(value)} {unit}); allowed: at most {limit} {unit}"
    if message.startswith(f"{loc[-1]}=") and len(loc) == 1:  # the message names the field and value itself
        return message
    if f"{field}=" in message or isinstance(value, dict):
        return f"{field}: {message}"
    return f"{field}: {message} (got {_short(value)})"


def field_problems(err: Any, model: type[BaseModel] = JobSpec) -> list[str]:
    """Every problem of a ``ValidationError``, one line each (see :func:`field_problem`)."""
    return [field_problem(e, model) for e in err.errors()]


def parse_job(job: JobSpec | dict[str, Any] | str) -> JobSpec:
    """Validate a job given as a model, a dict or JSON; errors name the field, value and rule."""
    from pydantic import ValidationError

    if isinstance(job, JobSpec):
        return job
    try:
        return JobSpec.model_validate_json(job) if isinstance(job, str) else JobSpec.model_validate(job)
    except ValidationError as err:
        raise ValueError("invalid job: " + "; ".join(field_problems(err))) from None
