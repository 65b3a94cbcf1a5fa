"""Airflow operators, triggers and hooks of carbonflow (the only part that imports Airflow besides web).

The operators are imported lazily: Airflow loads the provider metadata in every process, and
that must not pay for importing the operators.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
    from carbonflow.operators.delivery import DeliverHeldRunsOperator
    from carbonflow.operators.night import NightPlanOperator, PairProfileOperator
    from carbonflow.operators.params import ValidateJobsOperator
    from carbonflow.operators.profile import EnergyProfileOperator

_WHERE = {
    "DeliverHeldRunsOperator": "carbonflow.operators.delivery",
    "CarbonAwareTrainingOperator": "carbonflow.operators.carbon_aware_training",
    "EnergyProfileOperator": "carbonflow.operators.profile",
    "NightPlanOperator": "carbonflow.operators.night",
    "PairProfileOperator": "carbonflow.operators.night",
    "ValidateJobsOperator": "carbonflow.operators.params",
}

__all__ = [
    "CarbonAwareTrainingOperator",
    "DeliverHeldRunsOperator",
    "EnergyProfileOperator",
    "NightPlanOperator",
    "PairProfileOperator",
    "ValidateJobsOperator",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'carbonflow.operators' has no attribute {name!r}")
