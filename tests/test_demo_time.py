"""benchmarks/demo_time.py's core and the demo's own choice of "tonight's run", on a hand-made MLflow store."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from carbonflow.tracking import schema as s

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("demo_time_bench", ROOT / "benchmarks" / "demo_time.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _run(client, job: str, partner: str | None, predicted: tuple[float, float], measured: tuple[float, float]) -> str:
    """One training run as carbonflow logs it (the demo's are on-demand: no recurrence tag)."""
    experiment = client.get_experiment_by_name(s.experiment_name(job))
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(s.experiment_name(job))
    run = client.create_run(experiment_id, tags={s.T_KIND: s.KIND_TRAINING, s.T_JOB: job, s.T_CONFIG_KEY: "c1-pl250"})
    client.log_param(run.info.run_id, s.P_COLOCATED_JOBS, partner or "none")
    for name, value in (
        (s.M_PREDICTED_ENERGY_TOTAL_J, predicted[0]),
        (s.M_ENERGY_TOTAL_J, measured[0]),
        (s.M_PREDICTED_DURATION_S, predicted[1]),
        (s.M_DURATION_S, measured[1]),
    ):
        client.log_metric(run.info.run_id, name, value)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[str]]]:
    """Two nights of two jobs: apart the first, sharing a GPU the second; plus a profile run that is no training."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    nights = {
        "first": [
            _run(client, "a", None, (380.0, 4.0), (530.0, 6.0)),
            _run(client, "b", None, (430.0, 5.0), (620.0, 7.0)),
        ],
        "second": [
            _run(client, "a", "b", (550.0, 6.3), (500.0, 6.0)),  # energy 10 % high, duration 5 % high
            _run(client, "b", "a", (600.0, 7.7), (640.0, 7.0)),  # energy 6.25 % low, duration 10 % high
        ],
    }
    profile = client.create_run(client.get_experiment_by_name(s.experiment_name("a")).experiment_id,
                                tags={s.T_KIND: s.KIND_PROFILE, s.T_JOB: "a"})  # fmt: skip
    client.set_terminated(profile.info.run_id)
    return uri, nights


def test_night_facts_give_the_worst_prediction_errors_and_whether_the_pair_shared(store) -> None:  # type: ignore[no-untyped-def]
    bench = _bench()
    uri, nights = store
    runs = bench.training_runs(uri)
    assert {r["run_id"] for r in runs} == set(nights["first"] + nights["second"])  # the profile run is no training
    first = bench.night_facts([r for r in runs if r["run_id"] in nights["first"]])
    second = bench.night_facts([r for r in runs if r["run_id"] in nights["second"]])
    assert first["shared_a_gpu"] is False and second["shared_a_gpu"] is True
    assert first["energy_prediction_error_max"] == pytest.approx(190 / 620)  # |430 − 620| / 620
    assert first["duration_prediction_error_max"] == pytest.approx(2 / 6)
    assert second["energy_prediction_error_max"] == pytest.approx(0.10)  # |550 − 500| / 500
    assert second["duration_prediction_error_max"] == pytest.approx(0.10)  # |7.7 − 7| / 7
    assert second["jobs"]["b"]["energy_prediction_error"] == pytest.approx(40 / 640)
    assert second["jobs"]["a"]["colocated_with"] == ["b"] and first["jobs"]["a"]["colocated_with"] == []


def test_a_pair_named_by_one_side_only_did_not_share() -> None:
    bench = _bench()
    runs = [
        {"job": "a", "params": {s.P_COLOCATED_JOBS: "b"}, "metrics": {}, "tags": {}},
        {"job": "b", "params": {s.P_COLOCATED_JOBS: "none"}, "metrics": {}, "tags": {}},
    ]
    facts = bench.night_facts(runs)
    assert facts["shared_a_gpu"] is False
    assert facts["energy_prediction_error_max"] is None  # nothing measured: no error, not zero


def test_the_demo_shows_the_run_it_just_logged(store) -> None:  # type: ignore[no-untyped-def]
    from carbonflow.demo import latest_training_runs, training_run_ids

    uri, nights = store
    earlier = set(nights["first"])
    assert training_run_ids(uri, ["a", "b"]) == set(nights["first"] + nights["second"])
    shown = latest_training_runs(uri, ["a", "b"], earlier=earlier)
    assert [r["run_id"] for r in shown] == nights["second"]
    assert training_run_ids("sqlite:////nonexistent/dir/mlflow.db", ["a"]) == set()


def test_the_demo_words_a_shared_gpu_and_host_contention_apart() -> None:
    from carbonflow.demo import sharing_line

    line = sharing_line({s.M_KEPT_SPEED_FRACTION: 0.75, s.M_HOST_PACE_FRACTION: 0.44})
    assert "kept 0.75 of its solo speed while both ran (33 % slower; the simulated GPU's pair model" in line
    assert "information only" in line and "ran at 0.44 of the simulated GPU's pace" in line and "neither" in line
    assert sharing_line({s.M_KEPT_SPEED_FRACTION: 0.5}).endswith("(100 % slower; measured)")  # a real GPU
    assert sharing_line({}) == ""  # ran alone


def test_night2_is_judged_against_a_copy_of_night1_too(store) -> None:  # type: ignore[no-untyped-def]
    """``night2_error_if_repeating_night1``: night 1's measured figures taken as night 2's prediction."""
    bench = _bench()
    uri, nights = store
    runs = bench.training_runs(uri)
    first = bench.night_facts([r for r in runs if r["run_id"] in nights["first"]])
    second = bench.night_facts([r for r in runs if r["run_id"] in nights["second"]])
    repeating = bench.repeating_errors(first, second)
    assert repeating["energy_error_max"] == pytest.approx(30 / 500)  # a: |530 − 500| / 500 (b: 20 / 640)
    assert repeating["duration_error_max"] == pytest.approx(0.0)  # 6 → 6, 7 → 7


def test_the_demo_second_night_trains_work_the_first_did_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's nights: 1 + the nights already in its home; from night 2 each job trains a third more epochs,
    and the light job allows 25 % slowdown (shares a GPU only when the planner predicts it pays)."""
    import importlib

    from carbonflow import demo
    from carbonflow.workloads import catalog

    assert demo.demo_night_of(set(), ["a", "b"]) == 1
    assert demo.demo_night_of({"r1", "r2"}, ["a", "b"]) == 2
    monkeypatch.delenv(catalog.DEMO_NIGHT_ENV, raising=False)
    first = importlib.reload(catalog)
    assert [j["epochs"] for j in first.NIGHTLY_JOBS] == [15, 12]
    assert first.JOBS_BY_NAME["digits-cnn-wide-batch"]["max_slowdown"] == 0.25
    monkeypatch.setenv(catalog.DEMO_NIGHT_ENV, "2")
    second = importlib.reload(catalog)
    assert [j["epochs"] for j in second.NIGHTLY_JOBS] == [20, 16]
    monkeypatch.setenv(catalog.DEMO_NIGHT_ENV, "zero")
    with pytest.raises(ValueError, match="CARBONFLOW_DEMO_NIGHT='zero' is not allowed"):
        importlib.reload(catalog)
    monkeypatch.delenv(catalog.DEMO_NIGHT_ENV)
    importlib.reload(catalog)
