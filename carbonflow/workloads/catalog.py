"""Example recurring jobs the shipped DAGs declare (built-in workloads on simulated GPUs).

Each is a plain JobSpec dict, so DAG files stay declarations. The simulated GPUs replay the Zeus
V100 measurements of two different workloads, so the two jobs react differently to power limits;
the training itself is the real digits CNN on this machine's CPU. When the two share one simulated
GPU, each keeps the fraction of its solo speed Gavel measured on a V100 for the job types that stand
for their Zeus workloads in carbonflow.simulation (ResNet-18 for the CIFAR-100 CNN, A3C for the light
Sentiment140 job): 1.00 / 0.75, so the light job runs 34 % slower while both work (1 / 0.75 − 1). It allows
35 %, so the pair may share a GPU from the first night, before any run has taught the planner the jobs'
fixed costs (start-up, data loading, evaluation), which sharing does not slow.
"""

from __future__ import annotations

from typing import Any

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
    "epochs": 15,
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
    "epochs": 12,
    "batch_size": 128,
    "region": "GB",
    "objective": "zeus:0.5",
    "max_slowdown": 0.35,
    "min_accuracy": 0.95,
    "power_limits_w": [250, 200, 150],
    "profile_steps": 40,
    "profile_warmup_steps": 5,
}

NIGHTLY_JOBS: list[dict[str, Any]] = [DIGITS_CNN, DIGITS_CNN_WIDE_BATCH]
JOBS_BY_NAME: dict[str, dict[str, Any]] = {job["name"]: job for job in NIGHTLY_JOBS}
