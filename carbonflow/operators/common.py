"""What the operators share: state directories, the carbon source, devices."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from carbonflow.session.source import CarbonSource, replay_enabled
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
