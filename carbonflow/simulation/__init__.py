"""carbonflow.simulation: trace-driven replay of a GPU cluster running recurring training jobs.

Jobs (arrivals, durations, GPU counts) are replayed from a Philly-format job table; each recurring
family trains one Gavel job type, whose measured pair interference on a V100 decides how fast two jobs
sharing a GPU run; power and speed per power limit come from the Zeus measurements
(:mod:`carbonflow.energy.simulated`); the grid is a replayed carbon trace. Every decision is made by
carbonflow.planning / carbonflow.carbon through a :class:`~carbonflow.simulation.engine.Policy`.
Everything it reports is *simulated*.

API::

    load_philly_csv(path, start=None, end=None, max_jobs=None, max_gpus=None) -> JobTrace
    synthetic_trace(base, n_jobs, seed=0) -> JobTrace
    derive_families(trace, duration_ratio=1.25) -> Families
    load_pair_table(path=None, gpu="v100") -> PairTable
    DeviceModel.for_pairs(pairs, gpu_model="V100", shared_power_factor=1.2) -> DeviceModel
    grid_from_trace_file(path, origin=None) -> CarbonGrid;  constant_grid(gco2_per_kwh) -> CarbonGrid
    Experiment.build(trace, pairs, devices, grid, cluster, seed=0) -> Experiment; .run(policy) -> Run
    simulate(ctx, policy) -> SimResult;  SimResult.summary() -> dict
    standard_policies(objective="energy", max_slowdown=None, capacity_aware=False) -> list[policy]
    calibrate_gpus(experiment, target_median_queue_s) -> int
    NodeModel.from_acme_cdfs(path) -> NodeModel;  node_accounting(result, node_model, grid) -> dict
"""

from carbonflow.simulation.devices import DeviceModel
from carbonflow.simulation.engine import ClusterSpec, Policy, SimContext, SimJobs, SimResult, SimulationError, simulate
from carbonflow.simulation.experiment import Experiment, Run, calibrate_gpus, relative_to
from carbonflow.simulation.families import Families, assign_job_types, derive_families
from carbonflow.simulation.grid import CarbonGrid, GridError, constant_grid, grid_from_trace_file
from carbonflow.simulation.interference import GAVEL_TO_ZEUS, PairTable, PairTableError, load_pair_table
from carbonflow.simulation.nodes import NodeModel, node_accounting
from carbonflow.simulation.policies import FifoPolicy, PlannerPolicy, standard_policies
from carbonflow.simulation.trace import JobTrace, TraceError, load_philly_csv, synthetic_trace

__all__ = [
    "GAVEL_TO_ZEUS",
    "CarbonGrid",
    "ClusterSpec",
    "DeviceModel",
    "Experiment",
    "Families",
    "FifoPolicy",
    "GridError",
    "JobTrace",
    "NodeModel",
    "PairTable",
    "PairTableError",
    "PlannerPolicy",
    "Policy",
    "Run",
    "SimContext",
    "SimJobs",
    "SimResult",
    "SimulationError",
    "TraceError",
    "assign_job_types",
    "calibrate_gpus",
    "constant_grid",
    "derive_families",
    "grid_from_trace_file",
    "load_pair_table",
    "load_philly_csv",
    "node_accounting",
    "relative_to",
    "simulate",
    "standard_policies",
    "synthetic_trace",
]
