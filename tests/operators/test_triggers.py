"""Every trigger survives Airflow's round trip: serialize() in the worker, rebuilt in the triggerer."""

from __future__ import annotations

import importlib
import inspect
from datetime import UTC, datetime, timedelta

import pytest

import carbonflow.operators.triggers as triggers_module
from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.operators.triggers import BackendRunTrigger, CarbonWindowTrigger, KubernetesRunTrigger
from carbonflow.session import GroupMember, WaitState
from carbonflow.workloads.catalog import DIGITS_CNN

START = datetime(2023, 3, 14, 22, 0, tzinfo=UTC)


def _state() -> WaitState:
    plan = Plan(job="digits-cnn", config=Config(power_limit_w=200), start=START, predicted_duration_s=60,
                predicted_energy_j=1e4, predicted_emissions_g=1.0, region="GB", forecast_provider="replay",
                reason="test")  # fmt: skip
    job = JobSpec.model_validate({**DIGITS_CNN, "name": "digits-cnn"})
    return WaitState(members=[GroupMember(job=job, plan=plan)], first_now=START - timedelta(hours=3))


def _round_trip(trigger):  # type: ignore[no-untyped-def]
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    return rebuilt


def test_carbon_window_trigger_round_trips_with_its_typed_wait_state() -> None:
    state = _state()
    trigger = CarbonWindowTrigger(START.isoformat(), -1.0e8, 3600.0, reason="start of digits-cnn",
                                  state=state.model_dump(mode="json"), min_real_wait_s=15.0)  # fmt: skip
    rebuilt = _round_trip(trigger)
    assert WaitState.read(rebuilt.state) == state
    assert (rebuilt.wake_at, rebuilt.clock_offset_s, rebuilt.speedup, rebuilt.min_real_wait_s) == (
        START.isoformat(),
        -1.0e8,
        3600.0,
        15.0,
    )


def _handle():  # type: ignore[no-untyped-def]
    from carbonflow.execution.backend import RunHandle

    return RunHandle(backend="kubernetes", run_id="cf-x-1", jobs=["digits-cnn"],
                     details={"namespace": "ml", "name": "cf-x-1", "kind": "Pod", "pod": "cf-x-1", "job": "",
                              "created": "[]", "spec": "{}", "lowers_power": "false"})  # fmt: skip


def test_backend_run_trigger_round_trips_with_its_backend_handles_and_state() -> None:
    from carbonflow.execution.backend import RunHandle

    handle, state = _handle(), _state()
    options = {"namespace": "ml", "config_file": "/etc/kube/config"}
    trigger = BackendRunTrigger("kubernetes", [handle.model_dump(mode="json")], options,
                                state=state.model_dump(mode="json"), clock_offset_s=-5.0, poll_s=2.0)  # fmt: skip
    rebuilt = _round_trip(trigger)
    assert [RunHandle.model_validate(h) for h in rebuilt.handles] == [handle]
    assert WaitState.read(rebuilt.state) == state
    assert (rebuilt.backend, rebuilt.backend_options, rebuilt.clock_offset_s, rebuilt.poll_s) == (
        "kubernetes", options, -5.0, 2.0,
    )  # fmt: skip


def test_backend_run_trigger_refuses_a_handle_of_another_backend_and_no_handles() -> None:
    handle = _handle().model_dump(mode="json")
    with pytest.raises(ValueError, match=r"handles of backend\(s\) kubernetes given to a trigger of backend='local'"):
        BackendRunTrigger("local", [handle])
    with pytest.raises(ValueError, match=r"handles=\[\] is not allowed"):
        BackendRunTrigger("kubernetes", [])


def test_a_trigger_deferred_by_0_2_is_rebuilt_as_the_generic_one() -> None:
    """A task deferred on 0.2's KubernetesRunTrigger resumes after an upgrade: its kwargs still build a trigger,
    which polls through the kubernetes backend (a kubeconfig path from the old connection when no options)."""
    connection = {"conn_id": None, "connection_extras": {"kube_config_path": "/etc/kube/config"},
                  "cluster_context": "prod"}  # fmt: skip
    old = KubernetesRunTrigger([_handle().model_dump(mode="json")], connection, state=None, clock_offset_s=-5.0,
                               poll_s=2.0, backend_options=None)  # fmt: skip
    classpath, kwargs = old.serialize()
    assert classpath == "carbonflow.operators.triggers.BackendRunTrigger"
    assert kwargs["backend"] == "kubernetes"
    assert kwargs["backend_options"] == {"config_file": "/etc/kube/config", "context": "prod", "in_cluster": False}
    assert _round_trip(BackendRunTrigger(**kwargs)).serialize() == (classpath, kwargs)


def test_every_trigger_in_the_module_is_covered_here() -> None:
    from airflow.triggers.base import BaseTrigger

    found = {name for name, cls in inspect.getmembers(triggers_module, inspect.isclass)
             if issubclass(cls, BaseTrigger) and cls.__module__ == triggers_module.__name__}  # fmt: skip
    covered = {"CarbonWindowTrigger", "BackendRunTrigger", "KubernetesRunTrigger"}
    assert found == covered, f"add a round-trip test for {found - covered}"
