"""The session's batch-size decisions, without training processes: which probes the profile task runs
(``batch_size_probes``, priced by ``probe_cost_j``), the energy budget of a run (``energy_budget_j``), what a rerun
is planned from (``rerun_job``), and ``RunSession.launch`` stopping an exploratory run and rerunning at the best
known batch size through a backend that returns what a wrapper would (the real runs:
``test_batch_size_probes_and_early_stop.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from carbonflow.domain import Config, DeviceEnergy, JobSpec, Plan, Profile, ProfilePoint, utcnow
from carbonflow.execution.wrapper import WrappedRun
from carbonflow.planning.learning import JobHistory, RealisedRun
from carbonflow.session.early_stop import (
    best_known_batch_size,
    energy_budget_j,
    planner_explorer,
    rerun_job,
    stops_early,
)
from carbonflow.session.profile import batch_size_probes, probe_cost_j

T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped replay
PER_EPOCH = 640
SPEC = JobSpec(
    name="explore", command=["python", "train.py"], epochs=20, samples_per_epoch=PER_EPOCH, batch_size=8,
    batch_sizes=[4, 8, 16], target_metric="val_acc", target_value=0.9, region="GB", power_limits_w=[250, 100],
    profile_warmup_steps=2, profile_steps=10, objective="energy", max_slowdown=1.0,
    finish_by=T0 + timedelta(hours=12),
)  # fmt: skip
J_PER_SAMPLE = {250: 0.03, 100: 0.02}


def _point(batch_size: int | None, limit_w: float | None, j_per_sample: float) -> ProfilePoint:
    return ProfilePoint(
        config=Config(containers=1, power_limit_w=limit_w, batch_size=batch_size), throughput_samples_per_s=5000,
        power_per_device_w={"gpu": j_per_sample * 5000}, energy_per_sample_j=j_per_sample, duration_s=1.0,
        samples=100, label="simulated",
    )  # fmt: skip


def _profile(*extra: ProfilePoint) -> Profile:
    points = [_point(None, w, j) for w, j in J_PER_SAMPLE.items()]
    return Profile(job=SPEC.name, device_model="V100", device_kind="gpu", label="simulated", default_power_limit_w=250,
                   max_power_w=250, samples_per_epoch=PER_EPOCH, points=[*points, *extra])  # fmt: skip


def _history(*runs: tuple[int, float, bool, float]) -> JobHistory:
    """Runs of (batch size, realised energy J, reached the target, epochs), oldest first."""
    return JobHistory([
        RealisedRun(job=SPEC.name, config_key=f"c1-pl100-b{bs}", finished_at=T0 - timedelta(days=len(runs) - i),
                    predicted_duration_s=60, realised_duration_s=60, predicted_energy_j=energy,
                    realised_energy_j=energy, batch_size=bs, power_limit_w=100, epochs=epochs, reached_target=reached)
        for i, (bs, energy, reached, epochs) in enumerate(runs)
    ])  # fmt: skip


DEFAULT_RAN = (8, 0.021 * PER_EPOCH * 4, True, 4.0)
"""The default batch size reached the target in 4 epochs at 100 W: it saved 0.009 J/sample over 250 W."""


def test_no_probes_before_the_default_batch_size_ran_or_without_history_or_exploration() -> None:
    assert batch_size_probes(SPEC, _profile(), _history()) == []
    assert batch_size_probes(SPEC, _profile(), None) == []
    assert batch_size_probes(SPEC.model_copy(update={"target_metric": None}), _profile(), _history(DEFAULT_RAN)) == []
    assert not stops_early(SPEC.model_copy(update={"batch_sizes": None}))


def test_the_probes_are_the_defaults_neighbours_at_its_least_energy_limit() -> None:
    probes = batch_size_probes(SPEC, _profile(), _history(DEFAULT_RAN))
    assert probes == [Config(containers=1, power_limit_w=100, batch_size=4),
                      Config(containers=1, power_limit_w=100, batch_size=16)]  # fmt: skip
    # one probe window of the default batch size: its least energy per sample × (warm-up + measured) steps × batch
    assert probe_cost_j(SPEC, _profile()) == pytest.approx(0.02 * (2 + 10) * 8)
    # a probed size is profiled: the next ring (none beyond 4 and 16 here) is asked for once a neighbour converged
    probed = _profile(_point(4, 100, 0.02), _point(16, 100, 0.02))
    assert batch_size_probes(SPEC, probed, _history(DEFAULT_RAN)) == []


def test_the_explorers_budget_caps_the_probes() -> None:
    """What the default saved over its cost at 250 W pays for probes (1.92 J each): with no run left to save over
    (``recurrences`` reached), only what was banked, here one; without ``recurrences`` the incumbent's saving over a
    rolling 60 more runs counts too, here both."""
    saved_j = 3.0
    history = _history((8, 0.03 * PER_EPOCH * 4 - saved_j, True, 4.0))
    last = SPEC.model_copy(update={"recurrences": 1})
    assert [c.batch_size for c in batch_size_probes(last, _profile(), history)] == [4]
    assert batch_size_probes(last, _profile(), _history((8, 0.03 * PER_EPOCH * 4 + 1, True, 4.0))) == []
    assert [c.batch_size for c in batch_size_probes(SPEC, _profile(), history)] == [4, 16]


def test_a_cpu_only_job_is_probed_without_a_power_limit() -> None:
    spec = SPEC.model_copy(update={"device_kind": "cpu", "power_limits_w": None})
    profile = _profile().model_copy(update={"points": [_point(None, None, 0.02)], "device_kind": "cpu",
                                            "default_power_limit_w": None})  # fmt: skip
    history = _history((8, 0.02 * PER_EPOCH * 4 - 10, True, 4.0))
    probes = batch_size_probes(spec, profile, history)
    assert probes and all(c.power_limit_w is None for c in probes)


def test_the_energy_budget_is_the_explorers_threshold_of_the_plans_batch_size() -> None:
    profile = _profile(_point(4, 100, 0.019), _point(16, 100, 0.02))
    history = _history(DEFAULT_RAN)
    explorer = planner_explorer(SPEC, profile, history)
    assert explorer is not None
    at_4 = _plan(Config(containers=1, power_limit_w=100, batch_size=4))
    assert energy_budget_j(SPEC, profile, at_4, history) == pytest.approx(explorer.stop_threshold(4))
    best_j = DEFAULT_RAN[1]  # at least the best mean cost (else the run could not show it is better), at most beta x
    assert best_j <= energy_budget_j(SPEC, profile, at_4, history) <= explorer.beta * best_j
    assert energy_budget_j(SPEC, profile, at_4, _history()) is None  # no batch size reached the target yet
    assert energy_budget_j(SPEC, profile, at_4, None) is None
    assert energy_budget_j(SPEC.model_copy(update={"batch_sizes": None}), profile, at_4, history) is None


def test_no_budget_when_tonights_profile_has_no_point_at_the_best_batch_size() -> None:
    """Finding (user trial): after the training script changed, the profile was measured afresh at the default
    batch size only; the night's run at 8 was stopped at 2 x batch size 4's mean and the rerun at 4 failed every
    night (``batch_size=4 has no profile point``). A stop is only worth it where the rerun can be planned."""
    history = _history(DEFAULT_RAN, (4, 0.015 * PER_EPOCH * 3, True, 3.0))
    at_8 = _plan(Config(containers=1, power_limit_w=100, batch_size=8))
    defaults_only = _profile()
    assert best_known_batch_size(SPEC, defaults_only, history) is None
    assert energy_budget_j(SPEC, defaults_only, at_8, history) is None, "no rerun at 4 possible: no stop"
    with_4 = _profile(_point(4, 100, 0.015))
    assert best_known_batch_size(SPEC, with_4, history) == 4
    assert energy_budget_j(SPEC, with_4, at_8, history) == pytest.approx(2 * 0.015 * PER_EPOCH * 3)


def test_a_rerun_is_planned_from_its_batch_sizes_points_alone() -> None:
    profile = _profile(_point(16, 100, 0.02), _point(16, 250, 0.03))
    spec, at_16 = rerun_job(SPEC, profile, 16, T0)
    assert spec.batch_size == 16 and spec.batch_sizes is None and spec.finish_by == SPEC.finish_by
    assert sorted(p.config.key() for p in at_16.points) == ["c1-pl100-b16", "c1-pl250-b16"]
    spec, at_8 = rerun_job(SPEC, profile, 8, SPEC.finish_by + timedelta(minutes=1))  # type: ignore[operator]
    assert spec.batch_size == 8 and spec.finish_by is None  # late: the rerun starts now whatever
    assert sorted(p.config.key() for p in at_8.points) == ["c1-pl100", "c1-pl250"]
    with pytest.raises(ValueError, match="batch_size=4 has no profile point"):
        rerun_job(SPEC, profile, 4, T0)


def _plan(config: Config) -> Plan:
    return Plan(job=SPEC.name, config=config, start=T0, predicted_duration_s=60, predicted_energy_j=50,
                predicted_emissions_g=1, region="GB", forecast_provider="none", reason="test")  # fmt: skip


class _Wrapper:
    """A local backend's contract, answering what the wrapper measured: a run at batch size 4 spends past its energy
    budget short of the target (the wrapper stops it), one at 8 reaches the target."""

    name, supports_deferral, supports_shared, supports_energy_budget = "local", False, True, True

    def __init__(self, report_epochs: bool = True) -> None:
        self.runs: list[tuple[Plan, Any]] = []
        self.report_epochs = report_epochs

    def execute(self, spec: JobSpec, plan: Plan, options: Any = None, **fields: Any) -> WrappedRun:
        self.runs.append((plan, options))
        budget_j = getattr(options, "stop_above_energy_j", None)
        stopped = plan.config.batch_size == 4
        energy_j = budget_j + 1.0 if stopped else 54.0
        metrics = {"val_acc": 0.2, "epochs": 3.0} if stopped else {"val_acc": 0.95, "epochs": 4.0}
        if not self.report_epochs:
            metrics.pop("epochs")
        now = utcnow()
        return WrappedRun(
            job=spec.name, config_key=plan.config.key(), started_at=now, ended_at=now + timedelta(seconds=30),
            duration_s=30, exit_code=0, samples=3 * PER_EPOCH, steps=240, metrics=metrics,
            devices=[DeviceEnergy(device_id="gpu", device_model="V100", kind="gpu", energy_j=energy_j,
                                  label="simulated", power_limit_w=100)],
            stopped_at_energy_budget_j=budget_j if stopped else None,
        )  # fmt: skip

    def kill(self) -> None:
        pass


def test_launch_stops_an_exploratory_run_and_reruns_at_the_best_known_batch_size(tmp_path: Path) -> None:
    from carbonflow.session import RunSession, SessionClock
    from carbonflow.session.source import CarbonSource

    wrapper = _Wrapper()
    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path, tracking_uri=f"sqlite:///{tmp_path}/m.db",
                         backend_factory=lambda name, workdir, kubernetes: wrapper)  # fmt: skip
    history = _history(DEFAULT_RAN)
    session.history = lambda jobs: history  # type: ignore[method-assign]
    profile = _profile(_point(4, 100, 0.019), _point(4, 250, 0.028))
    clock = SessionClock.replaying(T0)
    state = session.plan_alone(SPEC, profile, clock.now())
    assert batch_size_of_plan(state) == 4  # the explorer tries batch size 4
    outcome = session.launch(state, clock)
    (_, first_options), (second, second_options) = wrapper.runs
    explorer = planner_explorer(SPEC, profile, history)
    assert explorer is not None and first_options.stop_above_energy_j == pytest.approx(explorer.stop_threshold(4))
    assert second.config.batch_size in (None, 8) and second_options is None  # the rerun: no budget
    assert "rerun at the best known batch size 8" in second.reason
    # user trial: the rerun said "(no forecast: starts now)" although the night had one and its run was counted with it
    assert "a rerun starts at once, not at a cleaner hour" in second.reason and "no forecast" not in second.reason
    [rerun] = outcome.jobs
    assert rerun.stopped is not None and rerun.stopped.stopped_at_energy_budget_j == first_options.stop_above_energy_j
    assert rerun.stopped.result is not None and rerun.result is not None
    assert rerun.stopped.result.metrics["epochs"] == 3.0
    assert rerun.stopped.result.saving_fraction is None and rerun.stopped.result.emissions_run_now_default_g is None
    assert rerun.night_energy_total_j == pytest.approx(rerun.stopped.result.energy_total_j + 54.0)
    assert rerun.failure is None and outcome.failures == []
    assert rerun.stopped.tracking["run_id"] != rerun.tracking["run_id"]


def batch_size_of_plan(state: Any) -> int:
    from carbonflow.planning.batch_size import batch_size_of

    return batch_size_of(state.members[0].plan.config, SPEC)


def test_a_run_that_reached_its_target_without_an_epochs_report_counts_the_epochs_it_ran(tmp_path: Path) -> None:
    """A user trial: a script that reported ``epoch`` (not ``epochs``) had every run that reached the target counted
    at the job's whole epoch budget, so the explorer learned nothing. Its samples over samples per epoch count."""
    from carbonflow.session import RunSession, SessionClock
    from carbonflow.session.source import CarbonSource
    from carbonflow.tracking.history import realised_vs_predicted

    wrapper = _Wrapper(report_epochs=False)
    uri = f"sqlite:///{tmp_path}/m.db"
    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path, tracking_uri=uri,
                         backend_factory=lambda name, workdir, kubernetes: wrapper)  # fmt: skip
    history = _history(DEFAULT_RAN)
    session.history = lambda jobs: history  # type: ignore[method-assign]
    profile = _profile(_point(8, 100, 0.02), _point(8, 250, 0.028))
    clock = SessionClock.replaying(T0)
    state = session.plan_alone(SPEC.model_copy(update={"batch_sizes": [8]}), profile, clock.now())
    outcome = session.launch(state, clock)
    [job] = outcome.jobs
    assert job.result is not None and job.result.metrics["epochs"] == pytest.approx(3.0)  # 3 epochs of samples
    [row] = realised_vs_predicted(SPEC.name, tracking_uri=uri)
    assert row.epochs == pytest.approx(3.0) and SPEC.epochs != 3
