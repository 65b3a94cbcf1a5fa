"""The environment of a training process: what carbonflow sets, and what a job's ``env`` may not set.

carbonflow starts every training through its wrapper and tells it, through environment variables,
where to report progress, where to save outputs, how much work to do and which GPUs it owns. A job
that set one of these itself would train on a GPU carbonflow is not measuring, report to a file
nobody reads, or move a power-limit journal where no restore looks. So a JobSpec's ``env`` is
refused, by name, when it sets any of :data:`PROTECTED_ENV_VARS` or any ``CARBONFLOW_*`` variable.

A job's ``env`` may not make a process load code it did not ask for either (:data:`CODE_LOADING_ENV_VARS`,
:data:`CODE_LOADING_ENV_PREFIXES`: ``PYTHONPATH``, ``LD_PRELOAD``, ``BASH_ENV``, ...): only the training
ever sees a job's ``env``, but these would turn any interpreter, shell or dynamic loader that inherits them
into the job's code.

The training's environment is built from an allow-list (:func:`training_base_env`), never from the
wrapper's whole environment: a worker's credentials (``AIRFLOW__*``, ``MLFLOW_TRACKING_*``, ``AWS_*``, ...)
never reach a training unless its job declares them (``env``, or ``env_from_connections`` resolved by the
operator).

This module is the one list. Code that sets these variables imports their names from here, and a training
reads them through its functions (:func:`progress_file`, :func:`work_epochs`, ...): besides
:mod:`carbonflow.settings`, this is the only module that reads a ``CARBONFLOW_*`` variable.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

# --- the training contract (set by the wrapper for the training child) -------------------------------
PROGRESS_FILE_ENV = "CARBONFLOW_PROGRESS_FILE"
"""JSON-lines file the training appends progress reports to."""
OUTPUT_DIR_ENV = "CARBONFLOW_OUTPUT_DIR"
"""Where the training saves its model (``model.pt``) and other outputs."""
STOP_FILE_ENV = "CARBONFLOW_STOP_FILE"
"""When this file exists, ``carbonflow.training.should_stop()`` is true."""
MAX_STEPS_ENV = "CARBONFLOW_MAX_STEPS"
"""Profile mode: a safety cap on steps."""
SIM_SLOWDOWN_ENV = "CARBONFLOW_SIM_SLOWDOWN"
"""Simulated GPU: fixed slowdown factor of the emulated device."""
SIM_SLOWDOWN_FILE_ENV = "CARBONFLOW_SIM_SLOWDOWN_FILE"
"""Simulated GPU: file holding the current slowdown factor (rewritten when the limit changes)."""

# --- the job's work (set by the wrapper for command jobs and built-in workloads alike) --------------
JOB_NAME_ENV = "CARBONFLOW_JOB"
EPOCHS_ENV = "CARBONFLOW_EPOCHS"
STEPS_ENV = "CARBONFLOW_STEPS"
BATCH_SIZE_ENV = "CARBONFLOW_BATCH_SIZE"
MODE_ENV = "CARBONFLOW_MODE"
"""``train`` or ``profile``."""
CONTAINERS_ENV = "CARBONFLOW_CONTAINERS"
TARGET_METRIC_ENV = "CARBONFLOW_TARGET_METRIC"
TARGET_VALUE_ENV = "CARBONFLOW_TARGET_VALUE"
"""A job trained to a target: the metric and the value that counts as reached (``target_metric``/``target_value``;
unset without one). ``carbonflow.training.should_stop()`` turns true once a report reaches it."""
LR_SCALE_ENV = "CARBONFLOW_LR_SCALE"
"""The factor the training multiplies its learning rate by at tonight's batch size (the job's ``lr_scaling``:
1 at its own batch size, or with ``none``)."""
LR_ENV = "CARBONFLOW_LR"
"""The built-in digits workload's learning rate (passed on from the wrapper's environment)."""
THREADS_PER_CONTAINER_ENV = "CARBONFLOW_THREADS_PER_CONTAINER"
"""The built-in digits workload's CPU threads per container (passed on from the wrapper's environment)."""

# --- node safety (set by carbonflow's deployment; never by a job) -----------------------------------
POWER_JOURNAL_DIR_ENV = "CARBONFLOW_POWER_JOURNAL_DIR"
GPU_LEASE_DIR_ENV = "CARBONFLOW_GPU_LEASE_DIR"
NODE_DIR_ENV = "CARBONFLOW_NODE_DIR"
"""The machine-wide state directory holding the leases and journals (see carbonflow.settings)."""
ZEUSD_SOCK_ENV = "ZEUSD_SOCK_PATH"
GPU_INDEX_MAP_ENV = "CARBONFLOW_GPU_INDEX_MAP"
"""JSON file mapping GPU UUID → host NVML index (zeusd's numbering), written on the node's host."""
GPU_WAIT_ENV = "CARBONFLOW_GPU_WAIT_S"
"""How long a wrapper waits for a GPU lease before it fails (seconds)."""
TRAINING_UID_ENV = "CARBONFLOW_TRAINING_UID"
TRAINING_GID_ENV = "CARBONFLOW_TRAINING_GID"
"""Run the training as this user (and group), without the wrapper's supplementary groups: set on shared nodes
so that the user's command can reach neither zeusd's socket (root-owned, mode 660) nor the power-limit
journals, while the wrapper (root in its container) can. Needs the wrapper to run as root."""

CARBONFLOW_PREFIX = "CARBONFLOW_"
"""Every variable with this prefix is carbonflow's own."""

PROTECTED_ENV_VARS: dict[str, str] = {
    # which GPUs the training sees: carbonflow pins the child to the GPUs it leased and measures
    "CUDA_VISIBLE_DEVICES": "carbonflow pins the training to the GPUs it leased, caps and measures",
    "NVIDIA_VISIBLE_DEVICES": "carbonflow pins the training to the GPUs it leased, caps and measures",
    "CUDA_DEVICE_ORDER": "carbonflow addresses GPUs by UUID; a changed order would point it at another GPU",
    "HIP_VISIBLE_DEVICES": "carbonflow pins the training to the GPUs it leased, caps and measures",
    "ROCR_VISIBLE_DEVICES": "carbonflow pins the training to the GPUs it leased, caps and measures",
    # data-parallel ranks: set by the distributed launcher carbonflow starts
    "RANK": "set by the distributed launcher for each container",
    "LOCAL_RANK": "set by the distributed launcher for each container",
    "WORLD_SIZE": "set by the distributed launcher from the planned container count",
    "LOCAL_WORLD_SIZE": "set by the distributed launcher from the planned container count",
    "GROUP_RANK": "set by the distributed launcher for each container",
    "MASTER_ADDR": "set by the distributed launcher / the Kubernetes headless service",
    "MASTER_PORT": "set by the distributed launcher / the Kubernetes headless service",
    # power-limit safety: where limits are set and where their restore journals live
    ZEUSD_SOCK_ENV: "only carbonflow's wrapper talks to the node's power-limit agent",
    # Kubernetes: the pod's identity names its power-limit journal
    "POD_NAME": "names the pod's power-limit journal, which the restore pod must find",
    "POD_NAMESPACE": "set from the pod's metadata by Kubernetes",
    "NODE_NAME": "set from the pod's metadata by Kubernetes",
    "JOB_COMPLETION_INDEX": "set by Kubernetes for each rank of an Indexed Job",
}
"""Variables a job's ``env`` may not set, with why (``CARBONFLOW_*`` is refused as a prefix too)."""


CODE_LOADING_ENV_PREFIXES: dict[str, str] = {
    "PYTHON": "PYTHON* variables make an interpreter import code it did not ask for (PYTHONPATH, PYTHONHOME, "
    "PYTHONSTARTUP, PYTHONUSERBASE, PYTHONWARNINGS, PYTHONBREAKPOINT, ...)",
    "LD_": "LD_* variables make the dynamic loader load other libraries (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)",
    "DYLD_": "DYLD_* variables make the dynamic loader load other libraries",
    "BASH_FUNC_": "exported shell functions run in every bash that inherits them",
}
"""Prefixes of variables that make a process load code it did not ask for (refused in a job's ``env``)."""

CODE_LOADING_ENV_VARS: dict[str, str] = {
    "BASH_ENV": "a non-interactive bash runs this file first",
    "ENV": "a POSIX sh runs this file first",
    "GCONV_PATH": "glibc loads character-set converters (shared libraries) from here",
    "GLIBC_TUNABLES": "changes the dynamic loader's behaviour (CVE-2023-4911)",
    "CUDA_INJECTION64_PATH": "every CUDA process loads this library",
    "NVTX_INJECTION64_PATH": "every NVTX-instrumented process loads this library",
    "OPENSSL_CONF": "OpenSSL loads engines and providers (shared libraries) named there",
    "OPENSSL_MODULES": "OpenSSL loads providers (shared libraries) from here",
    "OPENSSL_ENGINES": "OpenSSL loads engines (shared libraries) from here",
    "PERL5OPT": "every perl runs these options (-M loads a module)",
    "PERL5LIB": "every perl loads modules from here first",
    "PERLLIB": "every perl loads modules from here first",
    "RUBYOPT": "every ruby runs these options (-r loads a library)",
    "RUBYLIB": "every ruby loads libraries from here first",
    "NODE_OPTIONS": "every node runs these options (--require loads a module)",
    "NODE_PATH": "every node loads modules from here",
    "OMP_TOOL_LIBRARIES": "the OpenMP runtime loads these tool libraries",
    "JAVA_TOOL_OPTIONS": "every JVM runs these options (-javaagent loads code)",
    "_JAVA_OPTIONS": "every JVM runs these options (-javaagent loads code)",
    "JDK_JAVA_OPTIONS": "every java launcher runs these options (-javaagent loads code)",
}
"""Variables that make a process load or run code it did not ask for (refused in a job's ``env``).

The rule: anything that makes an interpreter, a shell or the dynamic loader load code that the command did
not name. Not refused, because they load no code: ``SSL_CERT_*`` (trust anchors), ``MALLOC_*`` (allocator
tuning), ``PATH`` (the job's command is the job's choice anyway)."""

PYTHON_SETTINGS_ALLOWED: frozenset[str] = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
     "PYTHONUTF8"}
)  # fmt: skip
"""``PYTHON*`` settings a job may still set: they change how Python runs, never what code it loads."""


def protected_env_problem(name: str) -> str | None:
    """Why a job's ``env`` may not set ``name``, or None when it may."""
    if name in PROTECTED_ENV_VARS:
        return PROTECTED_ENV_VARS[name]
    upper = name.upper()
    if upper.startswith(CARBONFLOW_PREFIX):
        return "carbonflow's own variables (CARBONFLOW_*) are set by carbonflow"
    if upper in CODE_LOADING_ENV_VARS:
        return CODE_LOADING_ENV_VARS[upper]
    if upper in PYTHON_SETTINGS_ALLOWED:
        return None
    prefix = next((p for p in CODE_LOADING_ENV_PREFIXES if upper.startswith(p)), None)
    return CODE_LOADING_ENV_PREFIXES[prefix] if prefix is not None else None


def check_job_env(env: Mapping[str, str], field: str = "env") -> None:
    """Raise ValueError naming every variable of ``env`` a job may not set, and why."""
    problems = [f"{field}.{name}: {why}" for name in sorted(env) if (why := protected_env_problem(name))]
    if problems:
        raise ValueError(
            f"a job's {field} may not set these variables (carbonflow sets them, or they make a process load code "
            "it did not ask for): " + "; ".join(problems)
        )


# --- the training's environment: an allow-list --------------------------------------------------------
TRAINING_ENV_BASE: dict[str, str] = {
    "PATH": "where the command's programs are found",
    "HOME": "where tools keep caches and settings (~/.cache/torch, ~/.cache/huggingface)",
    "LANG": "locale",
    "LANGUAGE": "locale",
    "TZ": "time zone",
    "TMPDIR": "where temporary files go",
}
"""Passed on from the wrapper's environment to every training."""
TRAINING_ENV_PREFIXES: dict[str, str] = {
    "LC_": "locale",
    "OPENBLAS_": "the host's BLAS settings (threads, a CPU type where OpenBLAS misdetects the CPU: without it the "
    "digits workload ran several times slower on the test hosts)",
}

TRAINING_ENV_RUNTIME: dict[str, str] = {
    "LD_LIBRARY_PATH": "where the node's CUDA driver libraries are (e.g. /usr/local/nvidia/lib64 on GKE): the "
    "deployment's value; a job may not set it",
    "CUDA_HOME": "the CUDA toolkit, for kernels compiled at run time (torch.utils.cpp_extension, Triton)",
    "CUDA_VISIBLE_DEVICES": "the worker's own view of the GPUs; narrowed to the leased GPUs by the wrapper",
    "OMP_NUM_THREADS": "CPU threads per process, where the host limits them (shared CPUs)",
    "MKL_NUM_THREADS": "CPU threads per process, where the host limits them (shared CPUs)",
    "WORLD_SIZE": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    "RANK": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    "LOCAL_RANK": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    "LOCAL_WORLD_SIZE": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    "MASTER_ADDR": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    "MASTER_PORT": "a rank of a multi-pod run: set by Kubernetes for the training (never by a job)",
    SIM_SLOWDOWN_ENV: "a simulated GPU's fixed slowdown",
    LR_ENV: "the built-in digits workload's learning rate",
    THREADS_PER_CONTAINER_ENV: "the built-in digits workload's CPU threads per container",
}
"""The short named set a training needs to run Python and CUDA sensibly, passed on when the wrapper has it."""


def training_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` (the wrapper's environment) a training may see: the allow-list, nothing else."""
    allowed = TRAINING_ENV_BASE.keys() | TRAINING_ENV_RUNTIME.keys()
    prefixes = tuple(TRAINING_ENV_PREFIXES)
    return {k: v for k, v in environ.items() if k in allowed or k.startswith(prefixes)}


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_CONN_ID_CHARS = 250
"""Airflow's limit on a connection id."""


def check_env_from_connections(mapping: Mapping[str, str], env: Mapping[str, str]) -> None:
    """Raise ValueError naming every bad entry of a job's ``env_from_connections`` (variable → connection id)."""
    problems = []
    for name, conn_id in sorted(mapping.items()):
        if not ENV_NAME_RE.fullmatch(name):
            problems.append(
                f"env_from_connections.{name}: not a variable name; allowed: letters, digits and '_', not starting "
                "with a digit"
            )
        elif name in env:
            problems.append(f"env_from_connections.{name}: also set in env; give it in one of the two")
        if not conn_id or len(conn_id) > MAX_CONN_ID_CHARS or conn_id.strip() != conn_id:
            problems.append(
                f"env_from_connections.{name}: connection id {conn_id!r} is not allowed; give an Airflow connection "
                f"id of 1 to {MAX_CONN_ID_CHARS} characters without surrounding spaces"
            )
    if problems:
        raise ValueError("; ".join(problems))
    check_job_env(mapping, "env_from_connections")


# --- what a wrapper inherits from its worker ------------------------------------------------------------
CREDENTIAL_ENV_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "MLFLOW_TRACKING_", "AWS_", "AZURE_",
                           "GOOGLE_APPLICATION_CREDENTIALS")  # fmt: skip
CREDENTIAL_ENV_MARKERS = ("PASSWORD", "TOKEN", "SECRET", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL",
                          "DB_URL", "BROKER_URL", "SQL_ALCHEMY_CONN", "FERNET_KEY")  # fmt: skip
"""A worker's variables that hold or lead to credentials (by prefix, or by a marker anywhere in the name)."""


def holds_credentials(name: str) -> bool:
    """Whether a worker's variable ``name`` holds, or points at, a credential (Airflow, MLflow, clouds, keys)."""
    upper = name.upper()
    return upper.startswith(CREDENTIAL_ENV_PREFIXES) or any(marker in upper for marker in CREDENTIAL_ENV_MARKERS)


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less every variable that holds a credential: what a local wrapper starts with.

    A training running as the wrapper's user could read the wrapper's ``/proc/<pid>/environ``; the wrapper
    needs none of these (it never talks to Airflow, MLflow or a cloud), so it never has them."""
    return {k: v for k, v in environ.items() if not holds_credentials(k)}


# --- what a training reads of the environment the wrapper hands it ------------------------------------------
def training_value(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value the wrapper handed the training for ``name`` ("" when unset), from ``environ`` (default: this
    process's environment)."""
    return (os.environ if environ is None else environ).get(name, "")


def _path(name: str) -> Path | None:
    value = training_value(name)
    return Path(value) if value else None


def progress_file() -> Path | None:
    """The JSON-lines file to append progress reports to (``$CARBONFLOW_PROGRESS_FILE``); None: no reports."""
    return _path(PROGRESS_FILE_ENV)


def stop_file() -> Path | None:
    """The file whose existence tells the training to stop (``$CARBONFLOW_STOP_FILE``); None when unset."""
    return _path(STOP_FILE_ENV)


def output_dir() -> Path:
    """Where the training saves its outputs (``$CARBONFLOW_OUTPUT_DIR``, else the working folder; not created)."""
    return _path(OUTPUT_DIR_ENV) or Path(".")


def max_steps() -> int | None:
    """Profile mode's cap on steps (``$CARBONFLOW_MAX_STEPS``); None when unset."""
    value = training_value(MAX_STEPS_ENV)
    return int(value) if value else None


def training_mode() -> str:
    """``train`` or ``profile`` (``$CARBONFLOW_MODE``; "" when unset)."""
    return training_value(MODE_ENV)


def sim_slowdown(environ: Mapping[str, str] | None = None) -> float:
    """A simulated GPU's fixed slowdown factor (``$CARBONFLOW_SIM_SLOWDOWN``; 1.0 when unset); a value that is not
    a positive number is refused, naming the variable and the value."""
    raw = training_value(SIM_SLOWDOWN_ENV, environ).strip()
    if raw == "":
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SIM_SLOWDOWN_ENV}={raw!r} is not a number; expected a factor >= 1 such as 1.25") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{SIM_SLOWDOWN_ENV}={raw!r} is not allowed; expected a positive factor such as 1.25")
    return value


def sim_slowdown_file() -> Path | None:
    """The file holding a simulated GPU's current slowdown factor (``$CARBONFLOW_SIM_SLOWDOWN_FILE``)."""
    return _path(SIM_SLOWDOWN_FILE_ENV)


def _work_number(name: str, default: float, kind: type[int] | type[float]) -> int | float:
    value = training_value(name)
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not allowed; give a {kind.__name__} number") from None


def work_epochs(default: int) -> int:
    """The job's epochs (``$CARBONFLOW_EPOCHS``, else ``default``)."""
    return int(_work_number(EPOCHS_ENV, default, int))


def work_batch_size(default: int) -> int:
    """The job's batch size (``$CARBONFLOW_BATCH_SIZE``, else ``default``)."""
    return int(_work_number(BATCH_SIZE_ENV, default, int))


def work_target() -> tuple[str, float] | None:
    """The job's target (``$CARBONFLOW_TARGET_METRIC``, ``$CARBONFLOW_TARGET_VALUE``), or None when it has none."""
    metric, value = training_value(TARGET_METRIC_ENV), training_value(TARGET_VALUE_ENV)
    if not metric or not value:
        return None
    number = float(_work_number(TARGET_VALUE_ENV, 0.0, float))
    if not math.isfinite(number):
        raise ValueError(f"{TARGET_VALUE_ENV}={value!r} is not allowed; give a finite number")
    return metric, number


def lr_scale() -> float:
    """The factor for the learning rate at tonight's batch size (``$CARBONFLOW_LR_SCALE``, else 1)."""
    factor = float(_work_number(LR_SCALE_ENV, 1.0, float))
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(
            f"{LR_SCALE_ENV}={training_value(LR_SCALE_ENV)!r} is not allowed; give a positive factor such as 2"
        )
    return factor


def learning_rate(default: float) -> float:
    """The built-in digits workload's learning rate (``$CARBONFLOW_LR``, else ``default``)."""
    return float(_work_number(LR_ENV, default, float))


def threads_per_container(default: int) -> int:
    """The built-in digits workload's CPU threads per container (``$CARBONFLOW_THREADS_PER_CONTAINER``)."""
    return int(_work_number(THREADS_PER_CONTAINER_ENV, default, int))
