"""benchmarks/faults.py: a small sample of every kind leaves nothing lowered, booked twice, lost or duplicated,
and the benchmark can fail: with each guarantee deliberately broken, its counter rises above 0.

The mutation tests break carbonflow itself, not the harness: in-process for the run records (the harness logs
them here), and in the wrapper and restore processes through ``tests/fakes/mutations/sitecustomize.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "faults.py"
MUTATIONS = REPO / "tests" / "fakes" / "mutations"


def _bench():
    spec = importlib.util.spec_from_file_location("faults_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _break_subprocesses(monkeypatch, mutation: str) -> None:
    """Every wrapper and restore command the benchmark starts runs carbonflow with ``mutation``."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(MUTATIONS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CARBONFLOW_FAULT_MUTATION", mutation)


@pytest.mark.slow
def test_one_injection_of_every_kind_is_survived(tmp_path):
    bench = _bench()
    out = tmp_path / "faults.json"
    code = bench.main(["--per-kind", "1", "--seed", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["faults_injected"] == len(bench.KINDS) >= 20
    assert result["counters_above_zero_in"] == {}, result["failures"]
    assert code == 0


def test_the_full_run_keeps_its_size_and_measures_double_booking_in_four_kinds():
    bench = _bench()
    assert len(bench.KINDS) >= 20 and bench.DEFAULT_PER_KIND * len(bench.KINDS) >= 400
    assert set(bench.DOUBLE_BOOKING_KINDS) <= set(bench.KINDS)
    assert len(bench.DOUBLE_BOOKING_KINDS) >= 4
    assert {"separate_homes_racing_for_gpus", "k8s_time_sliced_pairs_on_one_gpu",
            "two_wrappers_racing_for_gpus"} <= set(bench.DOUBLE_BOOKING_KINDS)  # fmt: skip
    assert any(k.startswith("rank_in_own_session") for k in bench.DOUBLE_BOOKING_KINDS)


def test_the_report_names_paths_root_and_where_double_booking_was_measured(tmp_path):
    bench = _bench()
    out = tmp_path / "faults.json"
    bench.main(["--kinds", "task_retried_after_logging", "trainer_gone_before_logging", "--per-kind", "2",
                "--sample", "3", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["faults_injected"] == 3
    assert result["by_kind"] == {"task_retried_after_logging": 2, "trainer_gone_before_logging": 1}
    assert 2 <= result["distinct_paths"] <= 3 and result["distinct_paths_definition"]
    assert result["ran_as_root"] is (os.geteuid() == 0)
    assert result["double_booking_measured_in"] == {}


@pytest.mark.parametrize("kind", ["two_wrappers_racing_for_gpus", "separate_homes_racing_for_gpus"])
def test_double_booking_is_counted_when_a_lease_always_succeeds(tmp_path, monkeypatch, kind):
    bench = _bench()
    _break_subprocesses(monkeypatch, "lease_always_free")
    outcome = bench.KINDS[kind](random.Random(0), tmp_path)
    assert outcome.gpus_double_booked > 0


@pytest.mark.parametrize("repair", ["next_wrapper_on_the_gpu", "restore_cli_of_the_node_agent"])
def test_a_gpu_left_lowered_is_counted_when_restore_is_a_no_op(tmp_path, monkeypatch, repair):
    """After a wrapper SIGKILL, with the repair that the node runs (the next wrapper, or the restore command)
    doing nothing, the GPU counts as left lowered."""
    bench = _bench()
    monkeypatch.setattr(bench, "REPAIRS_AFTER_SIGKILL", (repair,))
    _break_subprocesses(monkeypatch, "restore_noop")
    outcome = bench.KINDS["wrapper_sigkill"](random.Random(0), tmp_path)
    assert outcome.variant == repair
    assert outcome.power_limits_left_lowered == 1


def test_a_run_is_counted_lost_when_the_spool_write_is_dropped(tmp_path, monkeypatch):
    import carbonflow.tracking.spool as spool

    bench = _bench()
    monkeypatch.setattr(spool, "_write_entry", lambda folder, meta: None)
    outcome = bench.KINDS["mlflow_refusing_while_logging"](random.Random(0), tmp_path)
    assert outcome.runs_lost == 1


def test_a_retry_that_trains_again_is_counted_duplicated(tmp_path, monkeypatch):
    """With completed_run broken (it never finds the earlier try's run), the retry trains again: duplicated,
    although MLflow itself keeps one run per key."""
    import carbonflow.tracking.store as store

    bench = _bench()
    monkeypatch.setattr(store, "completed_run", lambda job, key, tracking_uri=None: None)
    outcome = bench.KINDS["task_retried_after_logging"](random.Random(0), tmp_path)
    assert outcome.runs_duplicated == 1


def test_a_retry_that_finds_its_run_is_not_counted(tmp_path):
    outcome = _bench().KINDS["task_retried_after_logging"](random.Random(0), tmp_path)
    assert outcome.counts() == {"power_limits_left_lowered": 0, "gpus_double_booked": 0, "runs_lost": 0,
                                "runs_duplicated": 0}  # fmt: skip


def test_a_rank_heartbeat_inside_the_retrys_training_is_double_booking(tmp_path):
    bench = _bench()
    beats = tmp_path / "rank.beats"
    beats.write_text("GPU-a 10.0\nGPU-a 10.5\n")
    assert bench._beats_inside(beats, ("GPU-a", (10.4, 12.0))) == 1
    assert bench._beats_inside(beats, ("GPU-a", (10.6, 12.0))) == 0  # the rank was gone before
    assert bench._beats_inside(beats, ("GPU-b", (10.0, 12.0))) == 0  # another GPU
    assert bench._beats_inside(tmp_path / "none", ("GPU-a", (10.0, 12.0))) == 0


def test_a_broken_recovery_is_counted(tmp_path, monkeypatch):
    bench = _bench()
    never = __import__("subprocess").CompletedProcess([], 1, "", "")
    monkeypatch.setattr(bench.FakeNode, "restore_cli", lambda self, **kw: never)  # the node agent never restores
    outcome = bench.KINDS["restore_without_zeusd_unprivileged"](random.Random(0), tmp_path)
    assert outcome.power_limits_left_lowered == 1


def test_a_lost_run_record_is_counted(tmp_path, monkeypatch):
    """With the delivery of held records broken, the run of a worker gone before logging counts as lost."""
    import carbonflow.tracking.held as held

    bench = _bench()
    monkeypatch.setattr(held, "deliver_held", lambda record, uri=None: "never-delivered")
    outcome = bench.KINDS["trainer_gone_before_logging"](random.Random(0), tmp_path)
    assert outcome.runs_lost == 1


def test_a_restore_pod_that_does_nothing_is_counted(tmp_path, monkeypatch):
    """With the Kubernetes restore pod doing nothing, the GPU the killed pod lowered counts as left lowered."""
    bench = _bench()  # puts tests/kubernetes (the fake Kubernetes API) on the path
    from fake_kube_api import ContainerOutcome

    monkeypatch.setattr(bench, "_restore_pod", lambda node, host_dir, sock: lambda view: ContainerOutcome())
    outcome = bench.KINDS["k8s_pod_sigkill"](random.Random(0), tmp_path)
    assert outcome.power_limits_left_lowered == 1


@pytest.mark.slow  # real Airflow clears and reruns a DAG run (benchmarks/faults_cleared_dag.py)
def test_a_cleared_dag_run_that_reuses_the_old_run_is_counted_lost(tmp_path, monkeypatch):
    """Airflow really clears the DAG run and runs it again; with the run's key blind to the clear number, the
    cleared run finds the old run and trains nothing: its own run is lost."""
    bench = _bench()
    _break_subprocesses(monkeypatch, "clear_number_ignored")
    outcome = bench.KINDS["dag_run_cleared"](random.Random(0), tmp_path)
    assert outcome.runs_lost >= 1


def test_an_env_attack_is_handed_to_the_backend_not_only_validated(tmp_path, monkeypatch):
    """The POD_NAME attack is not only a validation call: a spec that skipped validation reaches the real
    backend, which refuses it; with the backend's check gone, the pod is really started (and SIGKILLed)."""
    import carbonflow.execution.k8s_manifests as manifests

    bench = _bench()
    outcome = bench.k8s_restore_pod_with_a_moved_journal(random.Random(0), tmp_path / "a", "env:POD_NAME")
    assert outcome.variant == "env:POD_NAME, refused by the backend"
    assert outcome.power_limits_left_lowered == 0
    monkeypatch.setattr(manifests, "check_job_env", lambda env: None)
    outcome = bench.k8s_restore_pod_with_a_moved_journal(random.Random(0), tmp_path / "b", "env:POD_NAME")
    assert outcome.variant == "env:POD_NAME, started by the backend"
