"""Airflow operators, triggers and hooks of carbonflow (the only part that imports Airflow besides web)."""

from carbonflow.operators.params import ValidateJobsOperator
from carbonflow.operators.profile import EnergyProfileOperator
from carbonflow.operators.training import CarbonAwareTrainingOperator

__all__ = ["CarbonAwareTrainingOperator", "EnergyProfileOperator", "ValidateJobsOperator"]
