"""Batch-size exploration on the path users run, two nights of one job trained to a target, real parts: the simulated
GPU through the local backend, a real MLflow (sqlite in a temporary folder), EnergyProfileOperator and RunSession.

Night 1 profiles the job and trains it at its default batch size. Night 2's profile task reuses that profile and
probes exactly the neighbour batch sizes the explorer asks for (one short single-limit run each), merges them into
the profile and logs it. Night 2's training is planned at the probed batch size 4, sweeps its limits in-run, spends
the explorer's threshold without reaching the target, is stopped there and logged as not reached (its epochs and
energy), and the job reruns at once at the best known batch size 8, which reaches the target: the night's energy
is both runs'."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from carbonflow.domain import JobSpec, Profile, SimulatedGpuSpec
from carbonflow.execution.wrapper import ENERGY_BUDGET_STOP, IN_RUN_PROFILE
from carbonflow.planning.batch_size import batch_size_explorer, batch_size_of
from carbonflow.profiling.profiler import BATCH_SIZE_PROBE, needs_in_run_profile
from carbonflow.session import RunSession, SessionClock
from carbonflow.session.profile import batch_size_probes, probe_cost_j
from carbonflow.session.run import planning_history
from carbonflow.session.source import CarbonSource

pytestmark = pytest.mark.slow  # two nights of real runs, six wrapper processes (~50 s): in make test, not test-fast
T0 = datetime(2023, 3, 14, 19, 0, tzinfo=UTC)  # inside the shipped replay
PER_EPOCH, EVAL = 640, 96
# Epochs each batch size needs to reach val_acc 0.9 (4: never within the job's 20). Each epoch ends with an
# evaluation pass (EVAL samples of GPU work, as a validation set costs): a run costs more than its profile's
# epochs, as real ones do. Each step's pause is ∝ its batch size: the host's time per sample is the same for all.
TRAIN = """
import os, time
from carbonflow import training
epochs, batch = int(os.environ["CARBONFLOW_EPOCHS"]), int(os.environ["CARBONFLOW_BATCH_SIZE"])
needed = {4: 1000, 8: 4, 16: 6}[batch]
step = samples = 0
for epoch in range(1, epochs + 1):
    for _ in range((640 + 96) // batch):
        if training.should_stop():
            raise SystemExit(0)  # told to stop: a profile's window ended, or the run's energy budget
        time.sleep(0.0004 * batch)
        step, samples = step + 1, samples + batch
        training.report(step, samples)
    val_acc = 0.95 * epoch / needed
    training.report(step, samples, val_acc=val_acc, epochs=epoch)
    if val_acc >= 0.9:
        break
"""


def _spec(folder: Path) -> JobSpec:
    script = folder / "train.py"
    script.write_text(TRAIN)
    return JobSpec(
        name="bs-explore", command=[sys.executable, str(script)], epochs=20, samples_per_epoch=PER_EPOCH,
        batch_size=8, batch_sizes=[4, 8, 16], target_metric="val_acc", target_value=0.9, region="GB",
        simulated_gpu=SimulatedGpuSpec(), power_limits_w=[250, 100], profile_warmup_steps=2, profile_steps=10,
        profile_min_window_s=0.2, max_slowdown=1.0, objective="energy", finish_by=T0 + timedelta(days=2),
    )  # fmt: skip


def _profile_task(spec: JobSpec, uri: str, night: str) -> Profile:
    from carbonflow.operators import EnergyProfileOperator

    task = EnergyProfileOperator(task_id="profile", job=spec, tracking_uri=uri)
    return Profile.model_validate(task.execute({"run_id": f"bs-probes-{night}"}))


def _session(uri: str, folder: Path, key: str | None = None, **kwargs: Any) -> RunSession:
    identity = (lambda job: {"idempotency_key": key}) if key else None
    return RunSession(source=CarbonSource(replay=True), workdir=folder, tracking_uri=uri, identity=identity, **kwargs)


def _train(session: RunSession, spec: JobSpec, profile: Profile, now: datetime) -> tuple[Any, Any]:
    clock = SessionClock.replaying(now)
    state = session.plan_alone(spec, profile, clock.now())
    state.members[0].plan.start = clock.now()  # train at once: the plan's window is not what is tested here
    return state, session.launch(state, clock)


def _run(uri: str, run_id: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri).get_run(run_id)


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Night 1 (profiled, trained at the default batch size), then night 2's profile task."""
    folder = tmp_path_factory.mktemp("bs-explore")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    spec = _spec(folder)
    night_1 = _profile_task(spec, uri, "night-1")
    _, first = _train(_session(uri, folder / "night-1"), spec, night_1, T0)
    history = planning_history([spec.name], uri, logging.getLogger(__name__))
    asked = batch_size_probes(spec, night_1, history)
    night_2 = _profile_task(spec, uri, "night-2")
    return {"spec": spec, "uri": uri, "folder": folder, "night_1": night_1, "first": first, "history": history,
            "asked": asked, "night_2": night_2}  # fmt: skip


@pytest.fixture(scope="module")
def night_two(two_nights: dict[str, Any]) -> dict[str, Any]:
    """Night 2's training, planned from the probed profile (the task's idempotency key: night-2)."""
    spec, uri, profile = two_nights["spec"], two_nights["uri"], two_nights["night_2"]
    history = planning_history([spec.name], uri, logging.getLogger(__name__))
    explorer = batch_size_explorer(spec, profile, history)
    assert explorer is not None
    session = _session(uri, two_nights["folder"] / "night-2", key="night-2")
    state, outcome = _train(session, spec, profile, T0 + timedelta(days=1))
    return {**two_nights, "state": state, "outcome": outcome, "threshold_j": explorer.stop_threshold(4),
            "best_before": explorer.best_mean()}  # fmt: skip


def test_the_next_profile_task_probes_exactly_the_neighbours_the_explorer_asks_for(two_nights: dict) -> None:
    from carbonflow.tracking.history import latest_profile

    spec, night_1, night_2 = two_nights["spec"], two_nights["night_1"], two_nights["night_2"]
    [first] = two_nights["first"].jobs
    assert first.result is not None and first.result.metrics["val_acc"] >= 0.9  # night 1: the default reached it
    assert batch_size_of(first.plan.config, spec) == 8 and first.stopped is None
    # what the session asks for: the default's neighbours, at one limit each (its least energy per sample)
    least = min((p for p in night_1.points), key=lambda p: p.energy_per_sample_j)
    assert least.config.power_limit_w == 100
    assert [(c.batch_size, c.power_limit_w, c.containers) for c in two_nights["asked"]] == [(4, 100, 1), (16, 100, 1)]
    explorer = batch_size_explorer(spec, night_1, two_nights["history"])
    assert explorer is not None and explorer.runs == 1  # the night-1 run counts at its batch size
    assert explorer.budget() >= 2 * probe_cost_j(spec, night_1)  # the conservative budget covers both probes
    # the profile task probed exactly those, merged them (night 1's points kept) and logged the merged profile
    keys = sorted(p.config.key() for p in night_2.points)
    assert keys == sorted([*(p.config.key() for p in night_1.points), "c1-pl100-b4", "c1-pl100-b16"])
    probes = [p for p in night_2.points if p.config.batch_size in (4, 16)]
    assert all(p.samples < PER_EPOCH for p in probes)  # a short probe window each, its work thrown away
    assert any(note.startswith(BATCH_SIZE_PROBE) for note in night_2.notes)
    logged = latest_profile(spec.name, night_2.device_model, spec.code_version, 3600, datetime.now(UTC),
                            tracking_uri=two_nights["uri"])  # fmt: skip
    assert logged is not None and sorted(p.config.key() for p in logged.points) == keys
    # a probed batch size has one limit profiled: its first training there sweeps its limits in-run
    for probe in probes:
        assert needs_in_run_profile(spec, night_2, probe.config)
    assert not needs_in_run_profile(spec, night_2, first.plan.config)


def test_an_exploratory_run_stopped_at_its_budget_is_logged_as_not_reached_and_the_night_reruns_at_the_best(
    night_two: dict,
) -> None:
    from carbonflow.tracking import schema

    spec, uri, outcome = night_two["spec"], night_two["uri"], night_two["outcome"]
    assert batch_size_of(night_two["state"].members[0].plan.config, spec) == 4  # the explorer tries the probe
    assert outcome.failures == []
    [rerun] = outcome.jobs
    stopped = rerun.stopped
    assert stopped is not None and stopped.result is not None and rerun.result is not None
    # the exploratory attempt: swept its limits in-run, stopped once it spent the explorer's threshold
    budget_j = night_two["threshold_j"]
    best_j = night_two["best_before"][1]  # the explorer's limit: between the best mean cost and beta x it
    assert best_j <= budget_j <= 2.0 * best_j
    assert stopped.stopped_at_energy_budget_j == pytest.approx(budget_j)
    assert any(n.startswith(IN_RUN_PROFILE) for n in stopped.result.notes)
    assert any(n.startswith(ENERGY_BUDGET_STOP) for n in stopped.result.notes)
    assert stopped.profile is not None and not needs_in_run_profile(spec, stopped.profile, stopped.plan.config)
    assert stopped.result.energy_total_j > budget_j and stopped.result.metrics["val_acc"] < 0.9
    first = _run(uri, stopped.tracking["run_id"])
    assert first.data.tags[schema.T_REACHED_TARGET] == "false"
    assert float(first.data.tags[schema.T_STOPPED_AT_ENERGY_J]) == pytest.approx(budget_j, rel=1e-5)
    assert first.data.metrics["epochs"] == stopped.result.metrics["epochs"]
    assert 0 < first.data.metrics["epochs"] < spec.epochs  # the epochs it ran, short of the job's 20
    assert first.data.metrics[schema.M_ENERGY_TOTAL_J] == pytest.approx(stopped.result.energy_total_j)
    assert first.info.status == "FINISHED" and first.data.tags[schema.T_MODEL_REGISTERED] == "false"
    # the rerun at the best known batch size reaches the target and names the attempt it follows
    assert batch_size_of(rerun.plan.config, spec) == night_two["best_before"][0] == 8
    assert rerun.result.metrics["val_acc"] >= 0.9 and rerun.stopped_at_energy_budget_j is None
    second = _run(uri, rerun.tracking["run_id"])
    assert second.data.tags[schema.T_REACHED_TARGET] == "true"
    assert second.data.tags[schema.T_FOLLOWS_STOPPED_RUN] == stopped.tracking["run_id"]
    assert "follows an attempt at batch size 4 stopped at its energy budget" in second.data.tags[schema.T_NOTE]
    # the night's energy is both runs'; the next night's explorer learns batch size 4 did not reach the target
    night_j = stopped.result.energy_total_j + rerun.result.energy_total_j
    assert rerun.night_energy_total_j == pytest.approx(night_j)
    as_json = rerun.to_json()
    assert as_json["night_energy_total_j"] == pytest.approx(night_j) and "stopped_attempt" in as_json
    history = planning_history([spec.name], uri, logging.getLogger(__name__))
    runs = [(r.batch_size, r.reached_target) for r in history.for_job(spec.name)]
    assert runs == [(8, True), (4, False), (8, True)]


def test_a_retried_task_trains_no_run_an_earlier_try_logged(night_two: dict) -> None:
    """Every run logged: nothing trains again. Only the stopped attempt logged (the earlier try died before its
    rerun): the rerun alone trains."""
    from carbonflow.execution.backend import make_backend
    from carbonflow.tracking.logger import log_training_run

    spec, uri, folder = night_two["spec"], night_two["uri"], night_two["folder"]
    executed: list[Any] = []

    def recording(name: str, workdir: Path, kubernetes: Any) -> Any:
        backend = make_backend(name, workdir, kubernetes)
        real = backend.execute
        backend.execute = lambda spec, plan, *a, **kw: executed.append(plan.config) or real(spec, plan, *a, **kw)
        return backend

    state = night_two["state"]
    again = _session(uri, folder / "retry-1", key="night-2", backend_factory=recording).launch(
        state, SessionClock.replaying(T0 + timedelta(days=1))
    )
    assert executed == [] and [j.reused for j in again.jobs] == [True]
    stopped = night_two["outcome"].jobs[0].stopped
    logged = log_training_run(spec, stopped.plan, stopped.result, tracking_uri=uri, idempotency_key="died.stopped",
                              reached_target=False)  # fmt: skip
    assert not logged.spooled
    retried = _session(uri, folder / "retry-2", key="died", backend_factory=recording).launch(
        state, SessionClock.replaying(T0 + timedelta(days=1))
    )
    assert [batch_size_of(c, spec) for c in executed] == [8]  # the rerun only: the stopped attempt is not trained
    [rerun] = retried.jobs
    assert rerun.stopped is not None and rerun.stopped.reused and rerun.result is not None
