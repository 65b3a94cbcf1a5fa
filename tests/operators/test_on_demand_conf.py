"""retrain_on_demand refuses a bad request by name, in its first task, before any profiling or training
(issue 13 findings: ``{"epoch": -1}`` and ``{"command": []}`` ended in success; ``finish_by: "tomorrow"`` gave a
raw pydantic message; only the built-in examples could run)."""

from __future__ import annotations

import pytest

from carbonflow.operators.params import RequestError, apply_overrides, check_conf_keys, validate_job

OWN = {"name": "my-mlp", "command": ["python", "train.py"], "steps": 20, "region": "GB", "device_kind": "cpu"}

REJECTED = {
    "unknown key": ({"epoch": -1}, "unknown conf key(s) 'epoch'"),
    "empty command": ({"job_spec": {**OWN, "command": []}}, "command"),
    "unknown job": ({"job": "my-mlp"}, "job"),
    "bad finish-by text": ({"finish_by": "tomorrow"}, "finish_by='tomorrow' is not a date-time"),
    "power limit out of range": ({"power_limit_w": 9999}, "power_limit_w=9999 is outside the range"),
    "negative work": ({"job_spec": {**OWN, "steps": -3}}, "steps=-3"),
}


def _first_task_error(dag, conf: dict) -> str:
    """The message the validate task fails with, by the same path the task takes (its own context)."""
    from types import SimpleNamespace

    op = dag.get_task("validate")
    params = {k: v.value if hasattr(v, "value") else v for k, v in dag.params.items()} | conf
    pushed: dict = {}
    context = {
        "params": params, "dag": dag, "dag_run": SimpleNamespace(conf=conf),
        "ti": SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value)),
    }  # fmt: skip
    with pytest.raises(RequestError) as err:
        op._validate_all(context)
    assert not pushed  # nothing reaches the tasks after validation
    return str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REJECTED))
def test_a_bad_on_demand_request_fails_validate_naming_the_field_and_nothing_else_runs(dag_bag, case):
    from airflow.sdk.exceptions import ParamValidationError

    conf, named = REJECTED[case]
    dag = dag_bag.get_dag("retrain_on_demand")
    try:
        run = dag.test(run_conf=conf)
    except ParamValidationError as err:  # the form's own schema refused it before any task was created
        assert "param job" in str(err) and "digits-cnn" in str(err)
        return
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["validate"] == "failed", states
    assert states.get("profile") in ("upstream_failed", None) and states.get("train") in ("upstream_failed", None)
    assert named in _first_task_error(dag, conf)


def test_unknown_conf_keys_are_refused_with_the_allowed_ones():
    with pytest.raises(RequestError, match=r"unknown conf key\(s\) 'epoch'; allowed: backend, epochs"):
        check_conf_keys({"epoch": -1, "region": "GB"}, {"backend", "epochs", "region"})


def test_a_whole_job_spec_validates_as_a_request():
    spec = validate_job(apply_overrides(OWN, {"region": "DE"}))
    assert spec.name == "my-mlp" and spec.region == "DE"


def test_finish_by_text_gets_a_human_message():
    with pytest.raises(RequestError, match=r"finish_by='tomorrow' is not a date-time; give an ISO 8601 UTC time"):
        apply_overrides(OWN, {"finish_by": "tomorrow"})
