"""Every trigger survives Airflow's round trip: serialize() in the worker, rebuilt in the triggerer."""

from __future__ import annotations

import importlib
import inspect
from datetime import UTC, datetime, timedelta

import carbonflow.operators.triggers as triggers_module
from carbonflow.models import Config, JobSpec, Plan
from carbonflow.operators.triggers import CarbonWindowTrigger, KubernetesRunTrigger
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


def test_kubernetes_run_trigger_round_trips_with_its_handle_connection_and_state() -> None:
    from carbonflow.execution.backend import RunHandle

    handle = RunHandle(backend="kubernetes", run_id="cf-x-1", jobs=["digits-cnn"],
                       details={"namespace": "ml", "name": "cf-x-1", "kind": "Pod", "pod": "cf-x-1", "job": "",
                                "created": "[]", "spec": "{}", "lowers_power": "false"})  # fmt: skip
    connection = {
        "conn_id": None,
        "connection_extras": {"kube_config_path": "/etc/kube/config"},
        "cluster_context": None,
    }
    state = _state()
    trigger = KubernetesRunTrigger([handle.model_dump(mode="json")], connection, state=state.model_dump(mode="json"),
                                   clock_offset_s=-5.0, poll_s=2.0,
                                   backend_options={"namespace": "ml", "config_file": "/etc/kube/config"})  # fmt: skip
    rebuilt = _round_trip(trigger)
    assert [RunHandle.model_validate(h) for h in rebuilt.handles] == [handle]
    assert WaitState.read(rebuilt.state) == state and rebuilt.connection == connection
    assert rebuilt.backend_options == {"namespace": "ml", "config_file": "/etc/kube/config"}


def test_every_trigger_in_the_module_is_covered_here() -> None:
    from airflow.triggers.base import BaseTrigger

    found = {name for name, cls in inspect.getmembers(triggers_module, inspect.isclass)
             if issubclass(cls, BaseTrigger) and cls.__module__ == triggers_module.__name__}  # fmt: skip
    covered = {"CarbonWindowTrigger", "KubernetesRunTrigger"}
    assert found == covered, f"add a round-trip test for {found - covered}"
