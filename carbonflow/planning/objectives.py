"""What the planner minimises: :mod:`carbonflow.objectives` (below planning and execution both, so that the wrapper
chooses an in-run profile's limit by the planner's rule), re-exported here for the planner."""

from carbonflow.objectives import (
    EDP,
    EDS,
    Carbon,
    Energy,
    Gain,
    Objective,
    Reference,
    SlowdownConstraint,
    Time,
    ZeusCost,
    choose_power_limit,
    objective_for,
)

__all__ = [
    "EDP",
    "EDS",
    "Carbon",
    "Energy",
    "Gain",
    "Objective",
    "Reference",
    "SlowdownConstraint",
    "Time",
    "ZeusCost",
    "choose_power_limit",
    "objective_for",
]
