"""Co-location across jobs through the operators: night plan → one task per GPU group → two MLflow runs.

The night is planned by the real NightPlanOperator from profiles and a pair profile; it names the
night's GPU groups (XCom ``groups``), and one CarbonAwareTrainingOperator per group (mapped, in the DAG)
launches the pair once (the real digits CNN, twice, on one simulated V100) and logs both runs to the
embedded MLflow. Nothing is coordinated through files: no claim, no outcome file.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from carbonflow.domain import Config, Profile, ProfilePoint
from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
from carbonflow.operators.night import NightPlanOperator, can_share
from carbonflow.planning.pairs import PairProfile
from carbonflow.workloads.catalog import DIGITS_CNN, DIGITS_CNN_WIDE_BATCH

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped NESO GB replay


def _job(base: dict[str, Any], name: str) -> dict[str, Any]:
    return {**base, "name": name, "epochs": 1, "objective": "energy", "max_slowdown": 0.5, "max_containers": 1,
            "finish_by": (T0 + timedelta(hours=10)).isoformat()}  # fmt: skip


def _profile(job: str) -> Profile:
    # A slow solo throughput (the real CNN is faster): the observed kept speed is never below the guard.
    point = ProfilePoint(
        config=Config(containers=1, power_limit_w=250), throughput_samples_per_s=100.0,
        power_per_device_w={"gpu": 220.0}, energy_per_sample_j=2.2, duration_s=10, samples=1000, label="simulated",
    )  # fmt: skip
    return Profile(job=job, device_model="Tesla V100 (simulated)", device_kind="gpu", label="simulated",
                   default_power_limit_w=250, max_power_w=250, samples_per_epoch=1437, points=[point])  # fmt: skip


class _Ti:
    """Airflow's task instance at the library boundary: XCom, and the identity a run's key is made from."""

    def __init__(self, xcoms: dict[str, Any], task_id: str = "train", map_index: int = 0) -> None:
        self.xcoms = xcoms
        self.pushed: dict[str, Any] = {}
        self.dag_id, self.task_id, self.map_index = "pair_dag", task_id, map_index

    def xcom_pull(self, task_ids: str, key: str = "return_value", **_: Any) -> Any:
        return self.xcoms.get(task_ids) if key == "return_value" else self.pushed.get(key)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _night(jobs: dict[str, dict[str, Any]], pair: PairProfile) -> tuple[dict[str, Any], dict[str, Any]]:
    names = list(jobs)
    xcoms: dict[str, Any] = {f"profile_{n}": _profile(n).model_dump(mode="json") for n in names}
    xcoms["profile_pairs"] = [pair.__dict__]
    op = NightPlanOperator(
        task_id="plan_night", jobs=jobs, profile_task_ids={n: f"profile_{n}" for n in names},
        pair_profile_task_id="profile_pairs", replay=True, replay_start=T0.isoformat(),
        tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
    )  # fmt: skip
    night = op.execute({"ti": _Ti(xcoms), "run_id": "pair-test"})
    xcoms["plan_night"] = night
    return night, xcoms


def _trainer(group: list[str]) -> CarbonAwareTrainingOperator:
    return CarbonAwareTrainingOperator(
        task_id="train", gpu_group=group, night_plan_task_id="plan_night",
        replay=True, replay_start=T0.isoformat(), replay_speedup=1e7, deferrable=False,
        tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
    )  # fmt: skip


def _context(xcoms: dict[str, Any], run_id: str, clear_number: int = 0) -> dict[str, Any]:
    from types import SimpleNamespace

    dag_run = SimpleNamespace(run_id=run_id, clear_number=clear_number, run_type="scheduled")
    return {"ti": _Ti(xcoms), "run_id": run_id, "dag_run": dag_run}


def test_jobs_that_can_never_share_say_why() -> None:
    from carbonflow.domain import JobSpec

    a = JobSpec.model_validate(_job(DIGITS_CNN, "a"))
    other_region = JobSpec.model_validate({**_job(DIGITS_CNN_WIDE_BATCH, "b"), "region": "DE"})
    assert "different regions" in (can_share(a, other_region) or "")
    no_type = JobSpec.model_validate({**_job(DIGITS_CNN_WIDE_BATCH, "b"), "simulated_gpu": {"gpu_model": "V100"}})
    assert "pair_type" in (can_share(a, no_type) or "")
    assert can_share(a, JobSpec.model_validate(_job(DIGITS_CNN_WIDE_BATCH, "b"))) is None


def test_a_colocated_pair_is_launched_once_by_its_group_task_and_a_retry_does_not_train_again() -> None:
    from mlflow import MlflowClient

    from carbonflow.operators.common import home
    from carbonflow.tracking import schema as s

    jobs = {"pair-a": _job(DIGITS_CNN, "pair-a"), "pair-b": _job(DIGITS_CNN_WIDE_BATCH, "pair-b")}
    pair = PairProfile("pair-a", "pair-b", 0.95, 0.9, 240.0, label="simulated", power_limit_w=250)
    night, xcoms = _night(jobs, pair)
    plans = night["plans"]
    assert plans["pair-a"]["colocated_with"] == ["pair-b"] and plans["pair-b"]["colocated_with"] == ["pair-a"]
    assert plans["pair-a"]["config"]["colocation_group"] == "pair-a+pair-b"
    assert night["groups"] == [["pair-a", "pair-b"]]  # one GPU group: one mapped task trains both
    guards = night["min_kept_speed"]
    assert 0 < guards["pair-a"] <= 0.95 and 0 < guards["pair-b"] <= 0.9

    context = _context(xcoms, "pair-test")
    outcome = _trainer(["pair-a", "pair-b"]).execute(context)
    assert context["gpu_group"] == "pair-a+pair-b"  # the map label in Airflow's UI
    results = {name: run["result"] for name, run in outcome["runs"].items()}
    for result in results.values():
        assert result["exit_code"] == 0
        assert any("co-located with" in n for n in result["notes"]), result["notes"]
    gpu = [next(d for d in r["devices"] if d["kind"] == "gpu") for r in results.values()]
    assert gpu[0]["device_id"] == gpu[1]["device_id"]
    assert gpu[0]["share"] + gpu[1]["share"] == pytest.approx(1.0)
    assert not list(home().glob("runs/*/groups")), "no claim or outcome files: the group task owns the pair"

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])

    def training_runs(name: str) -> list[Any]:
        experiment = client.get_experiment_by_name(s.experiment_name(name))
        return client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")

    for name, partner in (("pair-a", "pair-b"), ("pair-b", "pair-a")):
        runs = training_runs(name)
        assert len(runs) == 1
        assert runs[0].data.params[s.P_COLOCATED_JOBS] == partner
        assert outcome["runs"][name]["tracking"]["run_id"] == runs[0].info.run_id

    # A retry of the task (the worker died after logging, before Airflow heard) trains nothing again.
    again = _trainer(["pair-a", "pair-b"]).execute(_context(xcoms, "pair-test"))
    assert all(run["reused"] and run["result"] is None for run in again["runs"].values())
    assert {n: r["tracking"]["run_id"] for n, r in again["runs"].items()} == {
        n: r["tracking"]["run_id"] for n, r in outcome["runs"].items()
    }
    assert [len(training_runs(n)) for n in ("pair-a", "pair-b")] == [1, 1]


def test_a_task_given_one_job_of_a_pair_says_how_to_map_over_groups() -> None:
    jobs = {"one-a": _job(DIGITS_CNN, "one-a"), "one-b": _job(DIGITS_CNN_WIDE_BATCH, "one-b")}
    pair = PairProfile("one-a", "one-b", 0.95, 0.9, 240.0, label="simulated", power_limit_w=250)
    _, xcoms = _night(jobs, pair)
    lone = CarbonAwareTrainingOperator(task_id="train_one_a", job=jobs["one-a"], night_plan_task_id="plan_night",
                                       replay=True, replay_start=T0.isoformat(), deferrable=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"expand\(gpu_group=night_gpu_groups\(plan_night.output\)\)"):
        lone.execute(_context(xcoms, "split"))
    with pytest.raises(ValueError, match="not a GPU group of the night plan"):
        _trainer(["one-a", "nobody"]).execute(_context(xcoms, "split"))


def test_gpu_groups_list_each_pair_once_by_start() -> None:
    from carbonflow.domain import Plan
    from carbonflow.operators.night import gpu_groups

    def plan(job: str, hours: float, partner: str | None = None) -> Plan:
        return Plan(job=job, config=Config(colocation_group="+".join(sorted([job, partner])) if partner else None),
                    start=T0 + timedelta(hours=hours), predicted_duration_s=1, predicted_energy_j=1,
                    predicted_emissions_g=0, region="GB", forecast_provider="test", reason="test",
                    colocated_with=[partner] if partner else [])  # fmt: skip

    plans = [plan("z", 1, "b"), plan("b", 1, "z"), plan("solo", 0), plan("late", 5)]
    assert gpu_groups(plans) == [["solo"], ["b", "z"], ["late"]]
