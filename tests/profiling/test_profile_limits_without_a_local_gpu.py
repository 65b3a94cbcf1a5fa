"""Profiling on Kubernetes: the worker that picks the limits to sweep has no GPU of its own (the GPU is the pod's).
A real-GPU job then sweeps its own ``power_limits_w`` (the wrapper in the pod applies them), else none."""

from __future__ import annotations

from carbonflow.domain import JobSpec
from carbonflow.profiling.profiler import candidate_power_limits_w


def _spec(**kw: object) -> JobSpec:
    return JobSpec(**{"name": "remote", "command": ["python", "train.py"], "steps": 10, "region": "GB", **kw})


def test_a_gpu_job_profiled_without_a_local_gpu_sweeps_its_own_limits_highest_first() -> None:
    spec = _spec(device_kind="gpu", power_limits_w=[200.0, 250.0, 200.0, 150.0])
    assert candidate_power_limits_w(spec, None) == [250.0, 200.0, 150.0]


def test_without_a_local_gpu_or_its_own_limits_a_job_is_profiled_at_the_default_limit() -> None:
    assert candidate_power_limits_w(_spec(device_kind="gpu"), None) == [None]
    assert candidate_power_limits_w(_spec(device_kind="cpu"), None) == [None]
