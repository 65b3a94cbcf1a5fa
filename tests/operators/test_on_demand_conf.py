"""retrain_on_demand: a trigger chooses, the author defines (issue 21, "trust boundary").

Security review: a ``job_spec`` conf ran ``sh -c 'id; env'`` on the worker with Airflow's secrets — permission to
trigger a DAG became permission to change its code. Now a DAG run's conf picks a registered job by name and may
set only bounded fields, within the limits the job's author set; any other key fails the ``validate`` task by name
before any work starts, whether or not the DAG has a Params form. Earlier (issue 13): ``{"epoch": -1}`` and
``{"command": []}`` ended in success; ``finish_by: "tomorrow"`` gave a raw pydantic message.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from carbonflow.operators.params import (
    REQUESTED_KEY,
    RequestError,
    ValidateJobsOperator,
    apply_overrides,
    check_conf_keys,
    validate_job,
)
from carbonflow.validation import TRIGGER_FIELDS, TRIGGER_FINISH_BY_HORIZON, validate_trigger

OWN = {"name": "my-mlp", "command": ["python", "train.py"], "steps": 20, "region": "GB", "device_kind": "cpu"}
AUTHOR_FIELDS = ["env", "working_dir", "image", "backend", "job_spec", "env_from_connections", "max_containers",
                 "simulated_gpu", "trigger_limits", "code_version", "device_kind", "name"]  # fmt: skip


def _params(dag, conf: dict) -> dict:
    return {k: v.value if hasattr(v, "value") else v for k, v in dag.params.items()} | conf


def _run_validate(dag, conf: dict) -> dict:
    """The validate task's own path (its context as Airflow builds it: params are the form's defaults and conf)."""
    pushed: dict = {}
    context = {
        "params": _params(dag, conf), "dag": dag, "dag_run": SimpleNamespace(conf=conf),
        "ti": SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value)),
    }  # fmt: skip
    dag.get_task("validate")._validate_all(context)
    return pushed


def _first_task_error(dag, conf: dict) -> str:
    """The message the validate task fails with; nothing reaches the tasks after it."""
    pushed: dict = {}
    with pytest.raises(RequestError) as err:
        pushed = _run_validate(dag, conf)
    assert not pushed
    return str(err.value)


@pytest.fixture(scope="module")
def on_demand(dag_bag):
    return dag_bag.get_dag("retrain_on_demand")


@pytest.mark.slow  # real Airflow DAG runs (dag.test())
def test_a_trigger_cannot_set_a_command(dag_bag, tmp_path):
    """Through Airflow for real (``dag.test``): a command that would touch a marker file, given as ``command`` and
    as a whole ``job_spec``, fails ``validate`` by name; the marker is never created, no task after it runs."""
    marker = tmp_path / "pwned"
    evil = ["sh", "-c", f"touch {marker}; id; env"]
    dag = dag_bag.get_dag("retrain_on_demand")
    for conf in (
        {"job": "digits-cnn", "command": evil},
        {"job_spec": {**OWN, "name": "digits-cnn", "command": evil}},
    ):
        run = dag.test(run_conf=conf)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["validate"] == "failed", states
        assert states.get("profile") in ("upstream_failed", None) and states.get("train") in ("upstream_failed", None)
        assert not marker.exists(), "the trigger's command ran"
        refused = next(iter(set(conf) - {"job"}))
        message = _first_task_error(dag, conf)
        assert message.startswith(f"{refused} is ") and "a trigger may set only: job, epochs" in message


@pytest.mark.parametrize("field", AUTHOR_FIELDS)
def test_a_trigger_cannot_set_env_working_dir_image_or_backend(on_demand, field):
    conf = {"job": "digits-cnn", field: {"LD_PRELOAD": "/tmp/evil.so"} if field == "env" else "x"}
    message = _first_task_error(on_demand, conf)
    assert message.startswith(f"{field} is ")
    assert "author" in message and f"a trigger may set only: {', '.join(['job', *TRIGGER_FIELDS])}" in message


def test_the_form_offers_only_what_a_trigger_may_set(dag_bag):
    """No ``job_spec`` or ``backend`` Param is left; every Param of a carbonflow DAG is a key its validate task
    allows (the UI sends every form field in the conf)."""
    for dag_id in ("retrain_on_demand", "nightly_retrain"):
        dag = dag_bag.get_dag(dag_id)
        assert set(dag.params) <= set(dag.get_task("validate").allowed_conf_keys), dag_id
    assert not {"job_spec", "backend", "command"} & set(dag_bag.get_dag("retrain_on_demand").params)


def test_refused_keys_are_checked_even_where_the_dag_has_no_params_form(dag_bag):
    """The conf check does not hang on a Params form: nightly_retrain (a form) and a DAG without one."""
    from airflow.sdk import DAG

    nightly = dag_bag.get_dag("nightly_retrain")
    assert _first_task_error(nightly, {"command": ["id"]}).startswith("command is defined by the job's author")
    with DAG(dag_id="no_form", schedule=None, start_date=datetime(2026, 1, 1)) as bare:
        ValidateJobsOperator(task_id="validate", jobs=[OWN])
    assert not bare.params
    assert "working_dir is defined by the job's author" in _first_task_error(bare, {"working_dir": "/etc"})
    no_conf = ValidateJobsOperator(task_id="v2", jobs=[OWN], overridable=(), dag=bare)
    with pytest.raises(
        RequestError, match=r"epochs is defined by the job's author, not by a trigger; this DAG takes no conf"
    ):
        no_conf._validate_all({"params": {}, "dag": bare, "dag_run": SimpleNamespace(conf={"epochs": 1}), "ti": None})


def test_misspelled_conf_key_says_did_you_mean(on_demand):
    message = _first_task_error(on_demand, {"job": "digits-cnn", "epoch": 3})
    assert message.startswith("unknown conf key 'epoch'; did you mean 'epochs'? a trigger may set only: job,")
    with pytest.raises(RequestError, match=r"'finishby'; did you mean 'finish_by'\?"):
        check_conf_keys({"finishby": "x"}, TRIGGER_FIELDS)


def test_trigger_epochs_above_the_authors_limit_are_refused(on_demand):
    own = 15  # digits-cnn's own epochs: without trigger_limits, the most a trigger may ask for
    assert _run_validate(on_demand, {"job": "digits-cnn", "epochs": own})  # at the limit: fine
    message = _first_task_error(on_demand, {"job": "digits-cnn", "epochs": own + 1})
    assert f"epochs={own + 1} is not allowed for job 'digits-cnn': a trigger may ask for 1 to {own} epochs" in message
    assert "the job's own epochs" in message
    for huge in (10**6, 10**12):
        assert f"epochs={huge} is not allowed" in _first_task_error(on_demand, {"job": "digits-cnn", "epochs": huge})
    author = {**OWN, "trigger_limits": {"max_steps": 100}}
    assert validate_trigger(author, {"steps": 100}).steps == 100
    with pytest.raises(RequestError, match=r"steps=101 .* 1 to 100 steps \(the limit its author set: "
                                           r"trigger_limits.max_steps\)"):  # fmt: skip
        validate_trigger(author, {"steps": 101})
    with pytest.raises(RequestError, match=r"epochs=3 is not allowed: job 'my-mlp' gives its work in steps"):
        validate_trigger(OWN, {"epochs": 3})


def test_trigger_batch_size_outside_the_authors_list_is_refused():
    with pytest.raises(RequestError, match=r"batch_size=1000000 is not allowed for job 'my-mlp'; allowed: 64 "):
        validate_trigger(OWN, {"batch_size": 10**6})
    author = {**OWN, "trigger_limits": {"batch_sizes": [32, 128]}}
    assert validate_trigger(author, {"batch_size": 128}).batch_size == 128
    with pytest.raises(RequestError, match=r"allowed: 32, 128 \(the limit its author set: trigger_limits.batch_sizes"):
        validate_trigger(author, {"batch_size": 64})


def test_trigger_finish_by_beyond_the_horizon_is_refused():
    now = datetime.now(UTC)
    inside = (now + TRIGGER_FINISH_BY_HORIZON - timedelta(hours=1)).isoformat()
    assert validate_trigger(OWN, {"finish_by": inside}, now=now).finish_by is not None
    with pytest.raises(RequestError, match=r"is more than 7 days ahead; a trigger may set a finish-by up to"):
        validate_trigger(OWN, {"finish_by": "2099-01-01T00:00:00Z"}, now=now)


def test_a_trigger_within_the_limits_runs_the_authors_job_with_its_overrides(on_demand):
    finish_by = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    conf = {"job": "digits-cnn", "epochs": 3, "batch_size": 64, "finish_by": finish_by.isoformat(),
            "objective": "energy", "observe_only": True, "region": "DE", "max_slowdown": 0.5}  # fmt: skip
    pushed = _run_validate(on_demand, conf)
    from carbonflow.domain import JobSpec

    spec = JobSpec.model_validate_json(pushed[REQUESTED_KEY])
    assert (spec.epochs, spec.objective, spec.observe_only, spec.region, spec.finish_by) == (
        3, "energy", True, "DE", finish_by)  # fmt: skip
    assert spec.workload == "digits_cnn" and spec.command is None  # the author's definition, untouched
    untouched = JobSpec.model_validate_json(_run_validate(on_demand, {"job": "digits-cnn"})[REQUESTED_KEY])
    assert (untouched.epochs, untouched.max_slowdown) == (15, 0.15)  # empty form fields: the job's own values


def test_a_registered_job_can_be_chosen(on_demand):
    """The registry's jobs (dags/jobs/) are offered beside the DAG's own."""
    assert "registry-digits-cnn" in on_demand.params.get_param("job").schema["enum"]
    assert REQUESTED_KEY in _run_validate(on_demand, {"job": "registry-digits-cnn", "epochs": 2})


REJECTED = {
    "unknown key": ({"epoch": -1}, "unknown conf key 'epoch'; did you mean 'epochs'?"),
    "unknown job": ({"job": "my-mlp"}, "job"),
    "bad finish-by text": ({"finish_by": "tomorrow"}, "finish_by='tomorrow' is not a date-time"),
    "power limit out of range": ({"power_limit_w": 9999}, "power_limit_w"),
    "nan work": ({"epochs": "NaN"}, "epochs='NaN' is not allowed"),
    "unbounded work": ({"epochs": 10**12}, "epochs=1000000000000 is not allowed"),
    "batch size not offered": ({"batch_size": 10**9}, "batch_size=1000000000 is not allowed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REJECTED))
def test_a_bad_on_demand_request_fails_validate_naming_the_field_and_nothing_else_runs(dag_bag, case):
    from airflow.sdk.exceptions import ParamValidationError

    conf, named = REJECTED[case]
    dag = dag_bag.get_dag("retrain_on_demand")
    try:
        run = dag.test(run_conf=conf)
    except ParamValidationError as err:  # the form's own schema refused it before any task was created
        assert f"param {next(iter(conf))}" in str(err)
        return
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["validate"] == "failed", states
    assert states.get("profile") in ("upstream_failed", None) and states.get("train") in ("upstream_failed", None)
    assert named in _first_task_error(dag, conf)


def test_unknown_conf_keys_are_refused_with_the_allowed_ones():
    with pytest.raises(RequestError, match=r"unknown conf key 'epoch'; did you mean 'epochs'\? a trigger may set only: "
                                           r"epochs, region"):  # fmt: skip
        check_conf_keys({"epoch": -1, "region": "GB"}, ["epochs", "region"])


def test_overrides_apply_to_a_declared_job():
    spec = validate_job(apply_overrides(OWN, {"region": "DE", "command": ["id"]}))
    assert spec.name == "my-mlp" and spec.region == "DE" and spec.command == ["python", "train.py"]


def test_finish_by_text_gets_a_human_message():
    with pytest.raises(RequestError, match=r"finish_by='tomorrow' is not a date-time; give an ISO 8601 UTC time such"):
        validate_trigger(OWN, {"finish_by": "tomorrow"})


def test_a_missing_working_dir_shows_the_path_it_resolved(tmp_path):
    """User trial: the error named the job's relative working_dir, not where it looked."""
    from airflow.sdk import DAG

    with DAG(dag_id="wd", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        ValidateJobsOperator(task_id="validate", jobs=[{**OWN, "working_dir": "project"}])
    dag.fileloc = str(tmp_path / "my_dag.py")
    message = _first_task_error(dag, {})
    resolved = tmp_path / "project"
    assert f"working_dir='{resolved}' (given as 'project', resolved against {tmp_path})" in message
    assert "is not a directory on this worker" in message
    resolved.mkdir()
    assert "my-mlp" in _run_validate(dag, {})
