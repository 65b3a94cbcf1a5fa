"""carbonflow.planning: cost metrics, Pareto set, the joint optimiser, co-location and learning.

Decides from inputs it is handed (JobSpec, Profile, Forecast, history records) and does no I/O.
See the docstrings of :mod:`.costs`, :mod:`.optimizer`, :mod:`.night`, :mod:`.pairs` and :mod:`.learning` for the
signatures other parts call.
"""

from carbonflow.objectives import choose_power_limit
from carbonflow.planning.batch_size import BatchSizeExplorer, choose_batch_size
from carbonflow.planning.capacity import (
    CapacityLedger,
    ClusterLoad,
    deferral_budget_s,
    partner_slowdown_bound,
    power_limit_under_load,
    power_limit_with_delay_cost,
    waiting_slowdown_bound,
)
from carbonflow.planning.costs import (
    Reference,
    carbon_g,
    edp,
    eds,
    energy_gain_minus_time_loss_pct,
    objective_cost,
    pareto_front,
    zeus_cost,
)
from carbonflow.planning.early_observation import Separation, observed_slowdown, separate_if_slow
from carbonflow.planning.learning import Correction, JobHistory, RealisedRun, RunCostModel
from carbonflow.planning.night import choose_colocation_pairs, plan_night
from carbonflow.planning.optimizer import (
    Candidate,
    DeadlineError,
    pareto_alternatives,
    plan_job,
    predict_candidates,
    work_samples,
)
from carbonflow.planning.pairs import PairProfile, pair_timeline, predict_pair_slowdown

__all__ = [
    "BatchSizeExplorer",
    "Candidate",
    "CapacityLedger",
    "ClusterLoad",
    "Correction",
    "DeadlineError",
    "JobHistory",
    "PairProfile",
    "RealisedRun",
    "Reference",
    "RunCostModel",
    "Separation",
    "carbon_g",
    "choose_batch_size",
    "choose_colocation_pairs",
    "choose_power_limit",
    "deferral_budget_s",
    "edp",
    "eds",
    "energy_gain_minus_time_loss_pct",
    "objective_cost",
    "observed_slowdown",
    "pair_timeline",
    "pareto_alternatives",
    "pareto_front",
    "partner_slowdown_bound",
    "plan_job",
    "plan_night",
    "power_limit_under_load",
    "power_limit_with_delay_cost",
    "predict_candidates",
    "predict_pair_slowdown",
    "separate_if_slow",
    "waiting_slowdown_bound",
    "work_samples",
    "zeus_cost",
]
