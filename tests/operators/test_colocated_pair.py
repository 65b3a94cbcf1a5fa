"""Co-location across jobs through the operators: night plan → one launch for the pair → two MLflow runs.

The night is planned by the real NightPlanOperator from profiles and a pair profile; the first of the
pair's CarbonAwareTrainingOperators to reach the start launches both (the real digits CNN, twice, on
one simulated V100) while the other waits for the outcome; both runs land in the embedded MLflow.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from carbonflow.models import Config, Profile, ProfilePoint
from carbonflow.operators.night import NightPlanOperator, can_share
from carbonflow.operators.training import CarbonAwareTrainingOperator, TrainingFailed
from carbonflow.planning.colocation import PairProfile
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
    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, task_ids: str, **_: Any) -> Any:
        return self.xcoms.get(task_ids)


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


def _trainer(name: str, job: dict[str, Any]) -> CarbonAwareTrainingOperator:
    return CarbonAwareTrainingOperator(
        task_id=f"train_{name}", job=job, profile_task_id=f"profile_{name}", night_plan_task_id="plan_night",
        replay=True, replay_start=T0.isoformat(), replay_speedup=1e7, deferrable=False,
        tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
    )  # fmt: skip


def test_jobs_that_can_never_share_say_why() -> None:
    from carbonflow.models import JobSpec

    a = JobSpec.model_validate(_job(DIGITS_CNN, "a"))
    other_region = JobSpec.model_validate({**_job(DIGITS_CNN_WIDE_BATCH, "b"), "region": "DE"})
    assert "different regions" in (can_share(a, other_region) or "")
    no_type = JobSpec.model_validate({**_job(DIGITS_CNN_WIDE_BATCH, "b"), "simulated_gpu": {"gpu_model": "V100"}})
    assert "pair_type" in (can_share(a, no_type) or "")
    assert can_share(a, JobSpec.model_validate(_job(DIGITS_CNN_WIDE_BATCH, "b"))) is None


def test_a_colocated_pair_is_launched_once_and_both_runs_are_logged() -> None:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    jobs = {"pair-a": _job(DIGITS_CNN, "pair-a"), "pair-b": _job(DIGITS_CNN_WIDE_BATCH, "pair-b")}
    pair = PairProfile("pair-a", "pair-b", 0.95, 0.9, 240.0, label="simulated", power_limit_w=250)
    night, xcoms = _night(jobs, pair)
    plans = night["plans"]
    assert plans["pair-a"]["colocated_with"] == ["pair-b"] and plans["pair-b"]["colocated_with"] == ["pair-a"]
    assert plans["pair-a"]["config"]["colocation_group"] == "pair-a+pair-b"
    assert "co-located with pair-b" in plans["pair-a"]["reason"]
    guards = night["min_kept_speed"]
    assert 0 < guards["pair-a"] <= 0.95 and 0 < guards["pair-b"] <= 0.9

    context = {"ti": _Ti(xcoms), "run_id": "pair-test"}
    followed: dict[str, Any] = {}

    def follow() -> None:
        try:
            followed["outcome"] = _trainer("pair-b", jobs["pair-b"]).execute(context)
        except Exception as err:  # surfaced by the assertion below
            followed["error"] = err

    follower = threading.Thread(target=follow)
    follower.start()
    leader = _trainer("pair-a", jobs["pair-a"]).execute(context)
    follower.join(timeout=900)
    assert not follower.is_alive()
    assert "error" not in followed, followed.get("error")

    results = {"pair-a": leader["result"], "pair-b": followed["outcome"]["result"]}
    for result in results.values():
        assert result["exit_code"] == 0
        assert any("co-located with" in n for n in result["notes"]), result["notes"]
    gpu = [next(d for d in r["devices"] if d["kind"] == "gpu") for r in results.values()]
    assert gpu[0]["device_id"] == gpu[1]["device_id"]
    assert gpu[0]["share"] + gpu[1]["share"] == pytest.approx(1.0)

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    for name, partner in (("pair-a", "pair-b"), ("pair-b", "pair-a")):
        experiment = client.get_experiment_by_name(s.experiment_name(name))
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")
        assert len(runs) == 1
        assert runs[0].data.params[s.P_COLOCATED_JOBS] == partner
    assert followed["outcome"]["tracking"]["run_id"] == runs[0].info.run_id


def test_run_one_after_the_other_as_dags_test_does_the_first_task_launches_and_the_second_returns_at_once() -> None:
    jobs = {"seq-a": _job(DIGITS_CNN, "seq-a"), "seq-b": _job(DIGITS_CNN_WIDE_BATCH, "seq-b")}
    pair = PairProfile("seq-a", "seq-b", 0.95, 0.9, 240.0, label="simulated", power_limit_w=250)
    night, xcoms = _night(jobs, pair)
    assert night["plans"]["seq-b"]["colocated_with"] == ["seq-a"]
    context = {"ti": _Ti(xcoms), "run_id": "sequential-test"}
    # The second job by name runs first (dags test runs triggers inline: waiting on a partner that has
    # not started would never end).
    first = _trainer("seq-b", jobs["seq-b"]).execute(context)
    second = _trainer("seq-a", jobs["seq-a"]).execute(context)
    assert first["result"]["job"] == "seq-b" and second["result"]["job"] == "seq-a"
    assert any("co-located with seq-b" in n for n in second["result"]["notes"])


def test_a_member_whose_launcher_reported_a_failure_fails_with_the_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from carbonflow.operators.common import group_result_path

    op = _trainer("x", _job(DIGITS_CNN, "x"))
    path = group_result_path("run-1", "x+y", "x")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"error": "the pair's launch in task train_w failed: GPU lost"}))
    with pytest.raises(TrainingFailed, match="GPU lost"):
        op.execute_follow_complete({}, {"status": "done", "path": str(path)})
    with pytest.raises(TrainingFailed, match="never reported"):
        op.execute_follow_complete({}, {"status": "timeout", "path": str(tmp_path / "missing.json")})


def test_the_first_task_to_claim_a_pair_launches_it_and_a_retry_keeps_the_claim() -> None:
    from carbonflow.models import Plan
    from carbonflow.operators.training import _claim, _claimant

    plan = Plan(
        job="a", config=Config(colocation_group="a+b"), start=T0, predicted_duration_s=1, predicted_energy_j=1,
        predicted_emissions_g=0, region="GB", forecast_provider="test", reason="test", colocated_with=["b"],
    )  # fmt: skip
    context = {"run_id": "claim-test"}
    assert _claimant(context, plan) is None
    assert _claim(context, plan, "train_b") == "train_b"
    assert _claim(context, plan, "train_a") == "train_b"  # too late: follows
    assert _claim(context, plan, "train_b") == "train_b"  # a retry of the launcher launches again
    assert _claimant(context, plan) == "train_b"
