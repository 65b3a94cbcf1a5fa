"""Airflow provider metadata: registers carbonflow's operators and connection types.

Airflow discovers it through the ``apache_airflow_provider`` entry point, so keys for keyed
carbon-intensity providers are entered in Airflow's own connection form and reach
``carbonflow.carbon`` as plain credentials through the operator.
"""

from __future__ import annotations

import re
from typing import Any

from carbonflow import __version__

HOOKS_MODULE = "carbonflow.operators.hooks"


def hook_class_name(conn_type: str) -> str:
    """The hook class made for a connection type: ``carbonflow_carbon_aware_sdk`` → ``CarbonAwareSdkHook``."""
    words = re.split(r"[^0-9A-Za-z]+", conn_type.removeprefix("carbonflow_"))
    return "".join(w[:1].upper() + w[1:] for w in words if w) + "Hook"


def connection_types() -> dict[str, str]:
    """Each registered carbon provider's connection type → the dotted path of its hook in :mod:`HOOKS_MODULE`
    (read from the provider registry; no Airflow import: Airflow calls this while it starts)."""
    from carbonflow.carbon.credentials import connection_types as registered

    return {conn_type: f"{HOOKS_MODULE}.{hook_class_name(conn_type)}" for conn_type in registered()}


def get_provider_info() -> dict[str, Any]:
    """Provider info in the schema Airflow's ProvidersManager validates."""
    return {
        "package-name": "carbonflow",
        "name": "carbonflow",
        "description": (
            "Carbon- and energy-aware training operators: power limits, containers, co-location and start time."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "carbonflow",
                "external-doc-url": "https://github.com/carbonflow/carbonflow",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "carbonflow",
                "python-modules": [
                    "carbonflow.operators.carbon_aware_training",
                    "carbonflow.operators.profile",
                    "carbonflow.operators.night",
                ],
            }
        ],
        "triggers": [
            {"integration-name": "carbonflow", "python-modules": ["carbonflow.operators.triggers"]},
        ],
        "hooks": [
            {"integration-name": "carbonflow", "python-modules": ["carbonflow.operators.hooks"]},
        ],
        "connection-types": [
            {"hook-class-name": hook, "connection-type": conn_type} for conn_type, hook in connection_types().items()
        ],
    }
