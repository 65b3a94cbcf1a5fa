"""What the operators share: state directories, the carbon source, devices."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from carbonflow.domain import JobSpec
from carbonflow.session.source import CarbonSource, replay_enabled
from carbonflow.session.state import WaitState
from carbonflow.settings import home_dir

log = logging.getLogger(__name__)


def home() -> Path:
    """carbonflow's state directory (:func:`carbonflow.settings.home_dir`), created."""
    path = home_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def carbon_source(replay: bool | None, conn_ids: dict[str, str] | None) -> CarbonSource:
    """Replayed recorded data, or the live provider chain with keys from Airflow connections."""
    live_credentials = None
    if not replay_enabled(replay):
        from carbonflow.operators.hooks import provider_credentials

        live_credentials = provider_credentials(conn_ids)
    return CarbonSource(replay=replay_enabled(replay), credentials=live_credentials)


WarningCallback = Callable[[Any, str], None]
"""``callback(context, message)``: told what an operator should hear although the task succeeds."""


def tell(operator: Any, context: Any, messages: list[str]) -> None:
    """Log each message as a warning and pass it to the operator's ``on_warning_callback`` (one or a list)."""
    callbacks = operator.on_warning_callback
    callbacks = [] if callbacks is None else callbacks if isinstance(callbacks, list) else [callbacks]
    for message in messages:
        operator.log.warning("carbonflow: %s", message)
        for callback in callbacks:
            callback(context, message)


def with_connection_env(spec: JobSpec) -> JobSpec:
    """``spec`` with each of its ``env_from_connections`` variables set to its Airflow connection's URI.

    Called where an operator hands a job to a backend, and only there: the secret is read by the author's
    definition at run time, reaches the training's environment (``env``) and nothing else — never the waiting
    state, XCom, the task log or MLflow. A connection that cannot be read fails the task, naming it.
    """
    if not spec.env_from_connections:
        return spec
    from airflow.sdk import BaseHook

    resolved: dict[str, str] = {}
    for name, conn_id in spec.env_from_connections.items():
        try:
            resolved[name] = BaseHook.get_connection(conn_id).get_uri()
        except Exception as err:  # Airflow raises its own not-found error types across versions
            raise ValueError(
                f"env_from_connections.{name}: Airflow connection {conn_id!r} of job {spec.name!r} cannot be read "
                f"({type(err).__name__}); define it (Admin → Connections, or AIRFLOW_CONN_{conn_id.upper()})"
            ) from None
    return spec.model_copy(update={"env": {**spec.env, **resolved}, "env_from_connections": {}})


def state_with_connection_env(state: WaitState) -> WaitState:
    """A waiting group whose jobs carry their declared connections (:func:`with_connection_env`): launch it,
    never store it."""
    members = [m.model_copy(update={"job": with_connection_env(m.job)}) for m in state.members]
    return state.model_copy(update={"members": members})
