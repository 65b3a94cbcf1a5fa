"""A DAG run's request is validated before any work starts; errors name field, value and rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from carbonflow.operators.params import RequestError, apply_overrides, validate_job

JOB = {
    "name": "digits-cnn",
    "workload": "digits_cnn",
    "simulated_gpu": {"gpu_model": "V100", "dataset": "cifar100", "network": "shufflenetv2"},
    "epochs": 2,
    "region": "GB",
}


def test_a_good_request_passes_and_overrides_apply() -> None:
    finish_by = (datetime.now(UTC) + timedelta(hours=10)).isoformat()
    overrides = {"region": "DE", "finish_by": finish_by, "power_limit_w": 175, "steps": ""}
    spec = validate_job(apply_overrides(JOB, overrides))
    assert spec.region == "DE"
    assert spec.power_limit_w == 175
    assert spec.finish_by is not None and spec.finish_by > datetime.now(UTC)


def test_unknown_region_is_refused_with_examples() -> None:
    with pytest.raises(RequestError) as err:
        validate_job({**JOB, "region": "Atlantis"})
    text = str(err.value)
    assert "region='Atlantis'" in text and "GB" in text


def test_finish_by_in_the_past_is_refused() -> None:
    past = datetime.now(UTC) - timedelta(hours=1)
    with pytest.raises(RequestError, match=r"finish_by=.* is in the past"):
        validate_job({**JOB, "finish_by": past.isoformat()})


@pytest.mark.parametrize("limit", [40, 400])
def test_power_limit_outside_the_device_range_is_refused(limit: float) -> None:
    with pytest.raises(RequestError) as err:
        validate_job({**JOB, "power_limit_w": limit})
    text = str(err.value)
    assert f"power_limit_w={limit}" in text and "100 W to 250 W" in text


def test_power_limit_without_a_gpu_is_refused() -> None:
    job = {**JOB, "simulated_gpu": None, "device_kind": "cpu", "power_limit_w": 150}
    with pytest.raises(RequestError, match="no GPU with a settable power limit"):
        validate_job(job)


@pytest.mark.parametrize("steps", [0, -5])
def test_zero_or_negative_steps_are_refused(steps: int) -> None:
    with pytest.raises(RequestError) as err:
        validate_job({**JOB, "epochs": None, "steps": steps})
    assert f"steps={steps}" in str(err.value) and "positive integer" in str(err.value)


@pytest.mark.slow
def test_bad_params_stop_the_dag_before_any_work(dag_bag) -> None:
    """Through Airflow: an unknown region fails `validate`; no profiling or training task runs."""
    dag = dag_bag.get_dag("nightly_retrain")
    assert dag is not None
    run = dag.test(run_conf={"region": "Atlantis"})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["validate"] == "failed"
    assert run.state == "failed"
    # deliver_runs is a teardown: it runs whatever happened (and finds no held run); no other task ran
    work = {task: state for task, state in states.items() if task not in ("validate", "deliver_runs")}
    assert all(state in ("upstream_failed", None) for state in work.values()), work


def test_an_unknown_pair_type_is_refused_before_any_work() -> None:
    job = {**JOB, "simulated_gpu": {**JOB["simulated_gpu"], "pair_type": "ResNet-19"}}
    with pytest.raises(
        RequestError, match=r"simulated_gpu.pair_type='ResNet-19'.*allowed: \[.*'ResNet-18 \(batch size 64\)'"
    ):
        validate_job(job)
    validate_job({**JOB, "simulated_gpu": {**JOB["simulated_gpu"], "pair_type": "ResNet-18 (batch size 64)"}})
