"""Airflow provider metadata: registers carbonflow's operators and connection types.

Airflow discovers it through the ``apache_airflow_provider`` entry point, so keys for keyed
carbon-intensity providers are entered in Airflow's own connection form and reach
``carbonflow.carbon`` as plain credentials through the operator.
"""

from __future__ import annotations

from typing import Any

from carbonflow import __version__

CONNECTION_TYPES: dict[str, str] = {
    "carbonflow_electricitymaps": "carbonflow.operators.hooks.ElectricityMapsHook",
    "carbonflow_watttime": "carbonflow.operators.hooks.WattTimeHook",
    "carbonflow_carbon_aware_sdk": "carbonflow.operators.hooks.CarbonAwareSdkHook",
}


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
            {"hook-class-name": hook, "connection-type": conn_type} for conn_type, hook in CONNECTION_TYPES.items()
        ],
    }
