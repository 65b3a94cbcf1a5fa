"""Finding 1 of the trust-boundary review (issue 21), the other half: a training that needs a secret declares it.

``env_from_connections`` maps a variable to an Airflow connection id; the operator resolves it (by the author's
definition, at launch) into the training's environment only: never into the waiting state that Airflow stores,
the trigger's kwargs, the job file other users could read, the task log or the MLflow record.
"""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.backend import RunHandle
from carbonflow.execution.local import LocalBackend
from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
from carbonflow.operators.common import state_with_connection_env, with_connection_env
from carbonflow.session import SessionClock, WaitState
from carbonflow.session.state import GroupMember

SECRET = "conn-secret-8c1f"
UNDECLARED = "undeclared-secret-41aa"
DUMP = """
import json, os
out = os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "env.json")
json.dump(dict(os.environ), open(out, "w"))
wrapper = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1]  # the guard's parent
wrapper_env = open(f"/proc/{wrapper}/environ", "rb").read().decode(errors="replace")
wrapper_argv = open(f"/proc/{wrapper}/cmdline", "rb").read().decode(errors="replace").split(chr(0))
json.dump({"env": wrapper_env.split(chr(0)), "argv": wrapper_argv}, open(out + ".wrapper", "w"))
open(os.environ["CARBONFLOW_PROGRESS_FILE"], "a").write(json.dumps({"step": 1, "samples": 8}) + "\\n")
"""


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Airflow connections defined the way a deployment may (``AIRFLOW_CONN_*``); the job declares one."""
    monkeypatch.setenv("AIRFLOW_CONN_DATASET_STORE", f"postgres://reader:{SECRET}@db.example:5432/train")
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_TEAM", f"postgres://them:{UNDECLARED}@db.example:5432/theirs")


def _spec(tmp_path: Path) -> JobSpec:
    (tmp_path / "train.py").write_text(DUMP)
    return JobSpec(name="secret-job", command=["python", "train.py"], steps=1, region="GB", device_kind="cpu",
                   working_dir=str(tmp_path), env={"PLAIN": "1"},
                   env_from_connections={"DATASET_URI": "dataset_store"})  # fmt: skip


def _plan(spec: JobSpec) -> Plan:
    return Plan(
        job=spec.name, config=Config(containers=1), start=datetime.now(UTC), predicted_duration_s=1,
        predicted_energy_j=1, predicted_emissions_g=1, region="GB", forecast_provider="test", reason="test",
    )  # fmt: skip


def test_declared_connection_reaches_the_training_only(tmp_path: Path, connections: None) -> None:
    spec = _spec(tmp_path)
    launched = with_connection_env(spec)
    assert SECRET in launched.env["DATASET_URI"] and "DATASET_URI" not in spec.env  # the stored spec holds none
    assert launched.env_from_connections == {}  # resolved: the launched job is an ordinary one
    run = LocalBackend(tmp_path / "runs").execute(launched, _plan(spec), trace=False)
    assert run.exit_code == 0
    env = json.loads((Path(run.output_dir) / "env.json").read_text())
    assert SECRET in env["DATASET_URI"] and env["PLAIN"] == "1"
    assert not any(UNDECLARED in v or SECRET in v for k, v in env.items() if k != "DATASET_URI")
    assert not any(k.startswith(("AIRFLOW_CONN_", "AIRFLOW__")) for k in env)
    job_file = tmp_path / "runs" / "train" / "job.json"
    assert stat.S_IMODE(job_file.stat().st_mode) == 0o600, "the job file holds the secret: its owner's only"
    assert SECRET not in (tmp_path / "runs" / "train" / "training.log").read_text()
    assert SECRET not in run.model_dump_json()


def test_a_local_wrapper_starts_without_the_workers_credentials(tmp_path: Path, connections: None) -> None:
    """The wrapper's own environment (which a training of its user could read in /proc) holds no credential of
    the worker (this test process has Airflow's DB URL and two connections), and its interpreter ignores the
    user's site-packages and never puts its working directory on sys.path."""
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in os.environ, "the test would prove nothing"
    spec = _spec(tmp_path).model_copy(update={"env_from_connections": {}})
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), trace=False)
    assert run.exit_code == 0
    wrapper = json.loads((Path(run.output_dir) / "env.json.wrapper").read_text())
    names = [entry.split("=", 1)[0] for entry in wrapper["env"] if "=" in entry]
    assert names and not [n for n in names if n.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "MLFLOW_TRACKING_"))]
    assert not any(UNDECLARED in entry or SECRET in entry for entry in wrapper["env"])
    assert wrapper["argv"][1:5] == ["-s", "-P", "-m", "carbonflow.cli"]


def test_a_declared_connection_is_never_in_the_mlflow_record(tmp_path: Path, connections: None) -> None:
    from tracking.tracking_factories import plan, result

    from carbonflow.tracking.logger import training_record

    launched = with_connection_env(_spec(tmp_path))
    record = training_record(launched, plan(job="secret-job"), result(job="secret-job"), workdir=tmp_path / "rec")
    texts = [json.dumps(record.params), json.dumps(record.tags), json.dumps(record.metrics)]
    texts += [Path(a.file).read_text(errors="replace") for a in record.artifacts if Path(a.file).suffix == ".json"]
    assert not any(SECRET in text for text in texts)


class _Session:
    """Stands in for the run session at the operator's hand-off: records what it is given."""

    def __init__(self) -> None:
        self.given: list[WaitState] = []

    def start_deferred(self, state: WaitState) -> list[RunHandle]:
        self.given.append(state)
        return [RunHandle(backend="kubernetes", run_id="r1", jobs=[state.members[0].job.name])]

    def launch(self, state: WaitState, clock: Any) -> Any:
        self.given.append(state)
        raise RuntimeError("launched")

    def connection(self) -> dict[str, Any]:
        return {}

    def backend_options(self) -> dict[str, Any]:
        return {}


def _state(tmp_path: Path) -> WaitState:
    spec = _spec(tmp_path)
    return WaitState(members=[GroupMember(job=spec, plan=_plan(spec))], first_now=datetime.now(UTC))


@pytest.mark.parametrize("deferrable", [True, False])
def test_the_operator_launches_with_the_secret_and_stores_it_nowhere(tmp_path: Path, connections: None,
                                                                      deferrable: bool) -> None:  # fmt: skip
    """The session gets the resolved job; the trigger (Airflow's metadata DB) gets the job as declared."""
    state, session = _state(tmp_path), _Session()
    op = CarbonAwareTrainingOperator(task_id="t", job=state.members[0].job, deferrable=deferrable)
    if deferrable:
        with pytest.raises(TaskDeferred) as deferred:
            op._launch({}, session, state, SessionClock(0.0))  # type: ignore[arg-type]
        assert SECRET not in json.dumps(deferred.value.trigger.serialize(), default=str)
    else:
        with pytest.raises(RuntimeError, match="launched"):
            op._launch({}, session, state, SessionClock(0.0))  # type: ignore[arg-type]
    (given,) = session.given
    assert SECRET in given.members[0].job.env["DATASET_URI"]
    assert SECRET not in state.model_dump_json()
    assert SECRET not in json.dumps(op.job)


def test_an_undefined_connection_fails_the_launch_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_DATASET_STORE", raising=False)
    with pytest.raises(ValueError, match=r"env_from_connections\.DATASET_URI: Airflow connection 'dataset_store'"):
        state_with_connection_env(_state(tmp_path))


def test_bad_env_from_connections_are_refused_naming_the_entry() -> None:
    base = {"name": "j", "command": ["true"], "steps": 1, "region": "GB"}
    with pytest.raises(ValidationError, match=r"env_from_connections\.LD_PRELOAD"):
        JobSpec(**base, env_from_connections={"LD_PRELOAD": "c"})
    with pytest.raises(ValidationError, match=r"env_from_connections\.CARBONFLOW_OUTPUT_DIR"):
        JobSpec(**base, env_from_connections={"CARBONFLOW_OUTPUT_DIR": "c"})
    with pytest.raises(ValidationError, match=r"env_from_connections\.TOKEN: also set in env"):
        JobSpec(**base, env={"TOKEN": "x"}, env_from_connections={"TOKEN": "c"})
    with pytest.raises(ValidationError, match=r"env_from_connections\.1BAD: not a variable name"):
        JobSpec(**base, env_from_connections={"1BAD": "c"})
    with pytest.raises(ValidationError, match=r"env_from_connections\.OK: connection id ''"):
        JobSpec(**base, env_from_connections={"OK": ""})
