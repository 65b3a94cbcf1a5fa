"""Early stop of a target-trained job's run at the batch-size explorer's threshold, and the night's rerun at the
best known batch size, in the session (no Airflow).

A job that explores batch sizes (``batch_sizes``, ``target_metric`` and ``target_value`` set) and has a history
gets an energy budget for its solo run: :meth:`~carbonflow.planning.batch_size.BatchSizeExplorer.stop_threshold`
of tonight's batch size (J, the explorer's arm cost is a run's realised energy). The wrapper stops the run once
its energy passes it (``RunOptions.stop_above_energy_j``). A run stopped short of the target is logged as its own
MLflow run, ``carbonflow.reached_target=false`` with the epochs it ran (the next night's explorer learns that the
batch size did not reach the target within the budget), and the job is rerun at once at the explorer's best known
batch size (:func:`rerun_job`), whose run notes that it follows the stopped attempt; both runs' energy is the
night's. :class:`~carbonflow.session.run.RunSession` does the running; these are its decisions.

Only a solo run on a backend that says ``supports_energy_budget`` (the local one) is stopped so: a co-located pair
and the Kubernetes backend run to their end as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from carbonflow.domain import JobSpec, Plan, Profile

STOPPED_KEY_SUFFIX = ".stopped"
"""The stopped attempt's idempotency key is the task's key with this suffix: a retried task finds it and does not
train that attempt again (it goes on with the rerun)."""
RERUN_RUN_NAME = "train-rerun"


def stops_early(spec: JobSpec) -> bool:
    """Whether the job's solo runs are stopped at the batch-size explorer's threshold: it explores batch sizes
    towards a target (``batch_sizes``, ``target_metric`` and ``target_value`` set)."""
    return bool(spec.batch_sizes) and spec.target_metric is not None and spec.target_value is not None


def planner_explorer(spec: JobSpec, profile: Profile, history: Any) -> Any:
    """The batch-size explorer the planner weighs tonight's batch size with: ``batch_size_explorer`` over the
    profile the planner may choose from (``decidable_profile``: a profile too noisy to rank its limits keeps its
    default limit's points); None when the job does not explore batch sizes or ``history`` is None."""
    from carbonflow.planning.batch_size import batch_size_explorer
    from carbonflow.planning.optimizer import decidable_profile

    return batch_size_explorer(spec, decidable_profile(profile), history)


def energy_budget_j(spec: JobSpec, profile: Profile | None, plan: Plan, history: Any) -> float | None:
    """The energy (J) the run of ``plan`` may spend before it is stopped: the explorer's
    ``stop_threshold`` of the plan's batch size; None when the job does not stop early, has no history or profile,
    the threshold is infinite (no batch size reached the target yet) or not positive, or tonight's profile has no
    point at the best known batch size (a profile measured afresh, e.g. for new code, at the default only): the
    rerun could not be planned there, so a stop would only waste the run."""
    from carbonflow.planning.batch_size import batch_size_of

    if not stops_early(spec) or profile is None or history is None:
        return None
    explorer = planner_explorer(spec, profile, history)
    batch_size = batch_size_of(plan.config, spec)
    if explorer is None or batch_size not in explorer.arms:
        return None
    if not _has_points(spec, profile, int(explorer.best_mean()[0])):
        return None
    threshold_j = float(explorer.stop_threshold(batch_size))
    return threshold_j if math.isfinite(threshold_j) and threshold_j > 0 else None


def reached_target(spec: JobSpec, metrics: Mapping[str, float]) -> bool | None:
    """Whether the run's last ``target_metric`` reached ``target_value`` (None: not reported, or no target)."""
    if spec.target_metric is None or spec.target_value is None or spec.target_metric not in metrics:
        return None
    return metrics[spec.target_metric] >= spec.target_value


def stopped_short(spec: JobSpec, wrapped: Any) -> bool:
    """The wrapper stopped the run at its energy budget, it ended as planned (exit 0) and it had not reached its
    target: the night reruns the job at the best known batch size."""
    return (
        wrapped.stopped_at_energy_budget_j is not None
        and wrapped.exit_code == 0
        and not reached_target(spec, wrapped.metrics)
    )


def epochs_run(spec: JobSpec, samples: int, metrics: Mapping[str, float]) -> float | None:
    """The epochs a run trained: its own last ``epochs`` report (as the runs that reached the target count them),
    else its samples over the job's samples per epoch (None: neither is known)."""
    from carbonflow.execution.commands import samples_per_epoch

    if "epochs" in metrics:
        return metrics["epochs"]
    per_epoch = samples_per_epoch(spec)
    return samples / per_epoch if per_epoch else None


def best_known_batch_size(spec: JobSpec, profile: Profile, history: Any) -> int | None:
    """The explorer's best known batch size (``best_mean()[0]``; the job's own without an explorer); None when
    ``profile`` has no point at it, so a run there could not be planned tonight."""
    explorer = planner_explorer(spec, profile, history)
    best = spec.batch_size if explorer is None else int(explorer.best_mean()[0])
    return best if _has_points(spec, profile, best) else None


def _has_points(spec: JobSpec, profile: Profile, batch_size: int) -> bool:
    """Whether ``profile`` has a point at ``batch_size`` (what a run there is planned from)."""
    return bool(_points_at(spec, profile, batch_size))


def _points_at(spec: JobSpec, profile: Profile, batch_size: int) -> list[Any]:
    """``profile``'s points at ``batch_size``."""
    from carbonflow.planning.batch_size import batch_size_of

    return [p for p in profile.points if batch_size_of(p.config, spec) == batch_size]


def rerun_job(spec: JobSpec, profile: Profile, batch_size: int, now: datetime) -> tuple[JobSpec, Profile]:
    """The job and profile a rerun at ``batch_size`` is planned from: that batch size alone (no exploration), its
    profile points only, and no finish-by when it has passed (the rerun starts now whatever)."""
    points = _points_at(spec, profile, batch_size)
    if not points:
        raise ValueError(f"batch_size={batch_size} has no profile point of job {spec.name!r}; profile it first")
    late = spec.finish_by is not None and spec.finish_by <= now
    update: dict[str, Any] = {"batch_sizes": None, "finish_by": None if late else spec.finish_by}
    if batch_size != spec.batch_size:  # its points carry the batch size: the job's own is that one tonight
        update["batch_size"] = batch_size
        points = [p.model_copy(update={"config": p.config.model_copy(update={"batch_size": batch_size})})
                  for p in points]  # fmt: skip
    return spec.model_copy(update=update), profile.model_copy(update={"points": points})


def stopped_note(spec: JobSpec, plan: Plan, budget_j: float) -> str:
    """The stopped attempt's note (its MLflow run's description)."""
    from carbonflow.units import format_energy_j

    target = f"{spec.target_metric} >= {spec.target_value:g}"
    return (
        f"stopped at the batch-size explorer's threshold: batch size {plan.config.batch_size or spec.batch_size} "
        f"spent more than {format_energy_j(budget_j)} without reaching {target}; logged as not reached, and the "
        "night reruns the job at the best known batch size"
    )


def follows_note(stopped: Any, first_plan: Plan, spec: JobSpec) -> str:
    """The rerun's note: which attempt it follows and what that attempt cost (``stopped``: its JobOutcome)."""
    from carbonflow.units import format_emissions_g, format_energy_j

    where = stopped.tracking.get("run_id") or stopped.tracking.get("idempotency_key") or "held for MLflow"
    head = (
        f"follows an attempt at batch size {first_plan.config.batch_size or spec.batch_size} stopped at its energy "
        f"budget (its own MLflow run {where})"
    )
    if stopped.result is None:
        return f"{head}, logged by an earlier try of this task; the night's energy is both runs'"
    cost = f"{format_energy_j(stopped.result.energy_total_j)}, {format_emissions_g(stopped.result.emissions_g)} CO2e"
    return f"{head}: it used {cost}; the night's energy is both runs'"
