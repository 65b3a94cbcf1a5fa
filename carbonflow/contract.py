"""The environment of a training process: what carbonflow sets, and what a job's ``env`` may not set.

carbonflow starts every training through its wrapper and tells it, through environment variables,
where to report progress, where to save outputs, how much work to do and which GPUs it owns. A job
that set one of these itself would train on a GPU carbonflow is not measuring, report to a file
nobody reads, or move a power-limit journal where no restore looks. So a JobSpec's ``env`` is
refused, by name, when it sets any of :data:`PROTECTED_ENV_VARS` or any ``CARBONFLOW_*`` variable.

This module is the one list. Code that sets these variables imports their names from here.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def protected_env_problem(name: str) -> str | None:
    """Why a job's ``env`` may not set ``name``, or None when it may."""
    if name in PROTECTED_ENV_VARS:
        return PROTECTED_ENV_VARS[name]
    if name.upper().startswith(CARBONFLOW_PREFIX):
        return "carbonflow's own variables (CARBONFLOW_*) are set by carbonflow"
    return None


def check_job_env(env: Mapping[str, str]) -> None:
    """Raise ValueError naming every variable of ``env`` a job may not set, and why."""
    problems = [f"env.{name}: {why}" for name in sorted(env) if (why := protected_env_problem(name))]
    if problems:
        raise ValueError("a job's env may not set these variables (carbonflow sets them): " + "; ".join(problems))
