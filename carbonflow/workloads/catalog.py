"""Example recurring jobs the shipped DAGs declare (built-in workloads on simulated GPUs).

Each is a plain JobSpec dict, so DAG files stay declarations. The simulated GPUs replay the Zeus
V100 measurements of two different workloads, so the two jobs react differently to power limits;
the training itself is the real digits CNN on this machine's CPU. When the two share one simulated
GPU, each keeps the fraction of its solo speed Gavel measured on a V100 for the job types that stand
for their Zeus workloads in carbonflow.simulation (ResNet-18 for the CIFAR-100 CNN, A3C for the light
Sentiment140 job): 1.00 / 0.75, so the light job runs 34 % slower while both work (1 / 0.75 − 1). It allows
25 %: the pair shares a GPU only when the planner predicts the sharing pays within that bound.

The work grows after the first night, as a nightly retraining's data does: from the second night of the demo
(``CARBONFLOW_DEMO_NIGHT`` ≥ 2, set by ``carbonflow demo``) each job trains a third more epochs than on the
first, so the second night runs an amount of work the first did not and is predicted from what was learned.
"""

from __future__ import annotations

from typing import Any

from carbonflow.settings import DEMO_NIGHT_ENV as DEMO_NIGHT_ENV  # read in carbonflow.settings
from carbonflow.settings import demo_night


def night_epochs(first_night: int, night: int) -> int:
    """Epochs of a job on ``night``: ``first_night``'s on the first, a third more from the second (its data grew)."""
    return first_night if night <= 1 else round(first_night * 4 / 3)


DIGITS_CNN: dict[str, Any] = {
    "name": "digits-cnn",
    "workload": "digits_cnn",
    "simulated_gpu": {
        "gpu_model": "V100",
        "dataset": "cifar100",
        "network": "shufflenetv2",
        "count": 2,
        "pair_type": "ResNet-18 (batch size 64)",
    },
    "max_containers": 2,
    "epochs": night_epochs(15, demo_night()),
    "batch_size": 64,
    "region": "GB",
    "objective": "carbon",
    "max_slowdown": 0.15,
    "min_accuracy": 0.95,
    "profile_steps": 60,
    "profile_warmup_steps": 5,
}

DIGITS_CNN_WIDE_BATCH: dict[str, Any] = {
    "name": "digits-cnn-wide-batch",
    "workload": "digits_cnn",
    "simulated_gpu": {
        "gpu_model": "V100",
        "dataset": "sentiment140",
        "network": "bert_base_uncased",
        "pair_type": "A3C",
    },
    "epochs": night_epochs(12, demo_night()),
    "batch_size": 128,
    "region": "GB",
    "objective": "zeus:0.5",
    "max_slowdown": 0.25,
    "min_accuracy": 0.95,
    "power_limits_w": [250, 200, 150],
    "profile_steps": 40,
    "profile_warmup_steps": 5,
}

NIGHTLY_JOBS: list[dict[str, Any]] = [DIGITS_CNN, DIGITS_CNN_WIDE_BATCH]
JOBS_BY_NAME: dict[str, dict[str, Any]] = {job["name"]: job for job in NIGHTLY_JOBS}
