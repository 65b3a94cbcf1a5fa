"""End to end: nightly_retrain runs through Airflow on the embedded DB and leaves its MLflow runs.

profile → pair-profile → plan the night → wait (deferred; the trigger runs in-process under dag.test)
→ train → log, with the real digits CNN on this CPU, the simulated V100, and replayed NESO GB carbon
data.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow


def test_nightly_retrain_leaves_a_complete_mlflow_run_per_job(dag_bag) -> None:
    from mlflow import MlflowClient

    from carbonflow.tracking import schema as s

    dag = dag_bag.get_dag("nightly_retrain")
    assert dag is not None
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    jobs = ("digits-cnn", "digits-cnn-wide-batch")
    before = {job: _training_runs(client, job) for job in jobs}
    run = dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    # One mapped training task per GPU group of the night plan, labelled with its job names.
    labels = {ti.rendered_map_index for ti in run.get_task_instances() if ti.task_id == "train"}
    assert {job for label in labels for job in (label or "").split("+")} == set(jobs), labels

    for job in jobs:
        new = [r for r in _training_runs(client, job) if r.info.run_id not in {b.info.run_id for b in before[job]}]
        assert len(new) == 1, f"{job}: expected one new training run, found {len(new)}"
        data = new[0].data
        metrics = (s.M_DURATION_S, s.M_ENERGY_TOTAL_J, s.M_EMISSIONS_G, s.M_CARBON_INTENSITY_MEAN, s.M_TEST_ACCURACY)
        for metric in metrics:
            assert metric in data.metrics, metric
        assert data.metrics[s.M_TEST_ACCURACY] >= 0.95
        assert data.metrics[s.M_ENERGY_TOTAL_J] > 0 and data.metrics[s.M_EMISSIONS_G] > 0
        # Emissions are energy × the replayed intensity: the mean intensity ties them together.
        kwh = data.metrics[s.M_ENERGY_TOTAL_J] / 3.6e6
        assert data.metrics[s.M_EMISSIONS_G] == pytest.approx(kwh * data.metrics[s.M_CARBON_INTENSITY_MEAN], rel=1e-6)
        for param in (s.P_POWER_LIMIT_W, s.P_CONTAINERS, s.P_PLANNED_START, s.P_REGION, s.P_FORECAST_PROVIDER):
            assert param in data.params, param
        assert data.params[s.P_FORECAST_PROVIDER].startswith("replay")
        assert data.tags[s.T_JOB] == job
        assert data.tags[s.T_REPLAY] == "true"
        assert "simulated" in data.tags[s.T_ENERGY_LABELS] and "estimated" in data.tags[s.T_ENERGY_LABELS]
        artifacts = {a.path for a in client.list_artifacts(new[0].info.run_id)}
        assert s.A_PLAN in artifacts
        # The two jobs were pair-profiled and planned together: they share a GPU, or the plan says why not.
        partner = next(j for j in jobs if j != job)
        shared = data.params[s.P_COLOCATED_JOBS] == partner
        assert shared or f"not with {partner}" in data.params[s.P_PLAN_REASON], data.params[s.P_PLAN_REASON]


def _training_runs(client, job: str) -> list:
    from carbonflow.tracking import schema as s

    experiment = client.get_experiment_by_name(s.experiment_name(job))
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`{s.T_KIND}` = 'training'")


def test_nightly_retrain_launches_a_colocated_pair_once(dag_bag) -> None:
    """With room to slow down, the two jobs share one GPU: their one group task launches both, once."""
    from mlflow import MlflowClient

    from carbonflow.energy.simulated import pair_kept_speeds
    from carbonflow.tracking import schema as s

    dag = dag_bag.get_dag("nightly_retrain")
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    jobs = ("digits-cnn", "digits-cnn-wide-batch")
    before = {r.info.run_id for job in jobs for r in _training_runs(client, job)}
    # At a fixed 250 W neither job can save alone by capping, so sharing saves whenever the pair keeps speed.
    run = dag.test(run_conf={"max_slowdown": 3.0, "objective": "energy", "power_limit_w": 250})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    new = {job: [r for r in _training_runs(client, job) if r.info.run_id not in before] for job in jobs}
    for job in jobs:
        assert len(new[job]) == 1, f"{job}: expected one new training run, found {len(new[job])}"
    # The pair's kept speeds are the simulated V100's (Gavel's), however loaded this machine's 2 cores are: the
    # two real trainings' contention is measured and logged apart (host_pace_fraction), so the pair shares.
    gavel = dict(zip(jobs, pair_kept_speeds("ResNet-18 (batch size 64)", "A3C"), strict=True))
    for job, partner in (jobs, jobs[::-1]):
        data = new[job][0].data
        params = data.params
        assert params[s.P_COLOCATED_JOBS] == partner, params[s.P_PLAN_REASON]
        assert f"co-located with {partner}" in params[s.P_PLAN_REASON]
        assert data.metrics[s.M_KEPT_SPEED_FRACTION] == pytest.approx(gavel[job])
        assert data.metrics[s.M_HOST_PACE_FRACTION] > 0
    starts = {new[job][0].data.params[s.P_PLANNED_START] for job in jobs}
    assert len(starts) == 1  # one launch for the pair
