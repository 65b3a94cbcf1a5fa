"""Finding: a failed restore, a run past its finish-by and a run logged late were only log lines. Now a failed
restore fails the task (its ``on_failure_callback`` hears it), and the other two reach the operator's
``on_warning_callback`` while the task succeeds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from carbonflow.domain import Config, DeviceEnergy, Plan, RunResult
from carbonflow.energy.power_limit import RESTORE_FAILED
from carbonflow.execution.errors import PowerLimitNotRestored
from carbonflow.operators.carbon_aware_training import CarbonAwareTrainingOperator
from carbonflow.operators.common import tell
from carbonflow.operators.delivery import DeliverHeldRunsOperator
from carbonflow.session.run import GroupOutcome, JobOutcome

START = datetime(2023, 3, 14, 22, 0, tzinfo=UTC)


def _plan(job: str = "j") -> Plan:
    return Plan(job=job, config=Config(power_limit_w=200), start=START, predicted_duration_s=600,
                predicted_energy_j=1e5, predicted_emissions_g=1.0, region="GB", forecast_provider="replay",
                reason="test")  # fmt: skip


def _result(job: str = "j", *, minutes: float = 10, notes: list[str] | None = None, code: int = 0) -> RunResult:
    gpu = DeviceEnergy(device_id="GPU-1", device_model="V100", kind="gpu", energy_j=1e5, label="measured")
    return RunResult(job=job, config=Config(power_limit_w=200), started_at=START,
                     ended_at=START + timedelta(minutes=minutes), duration_s=minutes * 60, devices=[gpu],
                     energy_gpu_j=1e5, energy_cpu_j=0, energy_total_j=1e5, energy_labels=["measured"],
                     emissions_g=1.0, carbon_intensity_mean_gco2_per_kwh=36.0, exit_code=code,
                     notes=notes or [])  # fmt: skip


UNRESTORED = "gpu GPU-1 (V100, measured): wanted 300 W, is at 200 W (NVMLError_NoPermission)"


def _unrestored(job: str = "j") -> RunResult:
    note = f"{RESTORE_FAILED} (exit) on gpu GPU-1 (V100, measured): wanted 300 W, NVMLError_NoPermission; after 3."
    result = _result(job, notes=[note])
    result.power_limits_not_restored = [UNRESTORED]
    return result


def test_a_limit_that_could_not_be_restored_fails_the_task_even_when_training_succeeded() -> None:
    """Read from the typed field, not from the note's words: a note alone fails nothing, the field does."""
    outcome = JobOutcome(plan=_plan(), tracking={"run_id": "r"}, result=_unrestored())
    assert outcome.failure == f"j: power limit not restored on {UNRESTORED}"
    assert JobOutcome(plan=_plan(), tracking={}, result=_result()).failure is None
    only_words = _result(notes=[f"{RESTORE_FAILED} (exit) on gpu GPU-1: wanted 300 W"])
    assert JobOutcome(plan=_plan(), tracking={}, result=only_words).failure is None
    both = _unrestored()
    both.exit_code = 1  # the training failed too: both reasons are told
    failure = JobOutcome(plan=_plan(), tracking={}, result=both).failure
    assert failure is not None and UNRESTORED in failure and "training of j failed with exit status 1" in failure


def test_the_task_fails_with_power_limit_not_restored_naming_the_gpu_and_its_limits() -> None:
    failed = GroupOutcome("pair", [JobOutcome(plan=_plan("a"), tracking={}, result=_result("a", code=1)),
                                   JobOutcome(plan=_plan("b"), tracking={}, result=_unrestored("b"))])  # fmt: skip
    with pytest.raises(PowerLimitNotRestored) as raised:
        failed.raise_if_power_limits_not_restored()
    message = str(raised.value)
    assert f"b: power limit not restored on {UNRESTORED}" in message
    assert "gpu GPU-1" in message and "wanted 300 W, is at 200 W" in message
    assert "training of a failed with exit status 1" in message  # the group's other failure is not lost
    assert "carbonflow.energy.power_limit restore" in message
    GroupOutcome("ok", [JobOutcome(plan=_plan(), tracking={}, result=_result())]).raise_if_power_limits_not_restored()


def test_a_run_result_written_before_the_field_still_reads() -> None:
    older = _result().model_dump(mode="json")
    del older["power_limits_not_restored"]
    assert RunResult.model_validate(older).power_limits_not_restored == []


def test_a_run_past_its_finish_by_and_a_held_record_are_warnings() -> None:
    late = JobOutcome(plan=_plan("late"), tracking={"spooled": True, "reason": "connection refused"},
                      result=_result("late", minutes=90))  # fmt: skip
    group = GroupOutcome("late", [late], finish_by={"late": START + timedelta(hours=1)})
    warnings = group.warnings
    assert any("finished 30 min after its finish-by" in w for w in warnings), warnings
    assert any("MLflow was unreachable" in w and "connection refused" in w for w in warnings), warnings
    on_time = GroupOutcome("ok", [JobOutcome(plan=_plan("ok"), tracking={}, result=_result("ok"))],
                           finish_by={"ok": START + timedelta(hours=1)})  # fmt: skip
    assert on_time.warnings == []


@pytest.mark.parametrize("as_list", [False, True])
def test_warnings_reach_every_on_warning_callback(as_list: bool) -> None:
    heard: list[tuple[Any, str]] = []

    def callback(context: Any, message: str) -> None:
        heard.append((context, message))

    op = CarbonAwareTrainingOperator(task_id="t", job={"name": "j", "workload": "digits_cnn", "epochs": 1},
                                     on_warning_callback=[callback] if as_list else callback)  # fmt: skip
    tell(op, {"run_id": "r"}, ["late by 30 min", "held"])
    assert heard == [({"run_id": "r"}, "late by 30 min"), ({"run_id": "r"}, "held")]


def test_the_deliver_task_tells_of_each_run_logged_late(monkeypatch: pytest.MonkeyPatch) -> None:
    import carbonflow.operators.delivery as delivery

    heard: list[str] = []
    monkeypatch.setattr(delivery, "deliver_held", lambda held, uri: "run-42")  # the MLflow side: test_tracking_held

    class _Ti:
        def xcom_pull(self, task_ids: list[str], key: str) -> list[Any]:
            return [[{"entry": {"record": {"idempotency_key": "k1"}}}]]

    op = DeliverHeldRunsOperator(task_id="d", training_task_ids=["train"],
                                 on_warning_callback=lambda context, message: heard.append(message))  # fmt: skip
    assert op.execute({"ti": _Ti()}) == {"delivered": {"k1": "run-42"}}
    assert heard == ["run k1 was logged late (after an MLflow outage) as run-42"]


def test_ranks_that_each_trained_the_whole_data_set_are_told_not_silently_logged() -> None:
    """User trial: with 2 containers each rank trained the full data set; the profile showed 5.6× the speed of
    one container and the plan a 94 % saving, with nothing said. A run reporting clearly more samples than
    ``epochs × samples_per_epoch`` now says why (in its notes and to ``on_warning_callback``)."""
    from carbonflow.domain import JobSpec
    from carbonflow.session.run import MORE_WORK, more_work_than_asked

    spec = JobSpec(name="mlp", command=["python", "train.py"], epochs=8, samples_per_epoch=1437, region="GB",
                   max_containers=2)  # fmt: skip
    two = _plan("mlp").model_copy(update={"config": Config(containers=2)})
    doubled = more_work_than_asked(spec, two, samples=2 * 8 * 1437)
    assert doubled is not None and doubled.startswith(MORE_WORK) and "DistributedSampler" in doubled
    assert more_work_than_asked(spec, two, samples=8 * 1437) is None, "the work asked for is not flagged"
    assert "$CARBONFLOW_EPOCHS" in (more_work_than_asked(spec, _plan("mlp"), samples=20 * 1437) or "")
    steps_job = spec.model_copy(update={"epochs": None, "samples_per_epoch": None, "steps": 100})
    assert more_work_than_asked(steps_job, two, samples=10**9) is None, "work in steps cannot be checked"
    told = JobOutcome(plan=two, tracking={}, result=_result("mlp", notes=[doubled]))
    assert any("DistributedSampler" in w for w in GroupOutcome("mlp", [told]).warnings)


def test_ranks_that_repeat_the_data_are_caught_by_their_steps_too() -> None:
    """Second user trial: a DDP script without a sampler that reported only rank 0's samples (8,960 for a job of
    8,520) passed unnoticed although rank 0 ran 280 steps where 134 do the work. Steps count too, and a script
    that shares its work — partial last batches included — is not flagged."""
    from carbonflow.domain import JobSpec
    from carbonflow.session.run import more_work_than_asked

    spec = JobSpec(name="ddp", command=["python", "t.py"], epochs=20, samples_per_epoch=426, batch_size=32,
                   region="GB", max_containers=2)  # fmt: skip
    two = _plan("ddp").model_copy(update={"config": Config(containers=2, batch_size=32)})
    told = more_work_than_asked(spec, two, samples=8_960, steps=280)
    assert told is not None and "280 steps" in told and "DistributedSampler" in told
    assert more_work_than_asked(spec, two, samples=8_520, steps=140) is None, "sharded: 20 × ceil(213 / 32) steps"
    tiny = spec.model_copy(update={"epochs": 1, "samples_per_epoch": 100, "batch_size": 64, "max_containers": 4})
    four = _plan("ddp").model_copy(update={"config": Config(containers=4, batch_size=64)})
    assert more_work_than_asked(tiny, four, samples=100, steps=1) is None, "one partial batch per rank is the work"
