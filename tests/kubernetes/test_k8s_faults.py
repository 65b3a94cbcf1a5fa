"""benchmarks/faults.py's Kubernetes kinds can fail: each counts the GPU left lowered when the safety it
exercises is taken away (on the FAKE API and FAKE GPU node the benchmark uses)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
from fake_gpu_node import CAN_DROP_USERS, FakeGpuNode

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"
pytestmark = pytest.mark.timeout(180)


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("faults_bench_k8s", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not CAN_DROP_USERS, reason="the command runs as the pod's user only when the wrapper is root")
def test_a_journal_the_pods_command_could_move_is_counted_as_left_lowered(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bench = _bench()
    assert (
        bench.k8s_restore_pod_with_a_moved_journal(random.Random(0), tmp_path, "rename").power_limits_left_lowered == 0
    )
    real_start = FakeGpuNode._start

    def writable_journal(self, view, env):  # type: ignore[no-untyped-def]
        outcome = real_start(self, view, env)
        for host in view.host_paths.values():  # a deployment whose journal directory the training may write
            if "power-journal" in host:
                self.host_path(host).chmod(0o777)
        return outcome

    monkeypatch.setattr(FakeGpuNode, "_start", writable_journal)
    outcome = bench.k8s_restore_pod_with_a_moved_journal(random.Random(0), tmp_path, "rename")
    assert outcome.power_limits_left_lowered == 1


def test_a_failed_restore_the_error_does_not_explain_is_counted(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With the node agent down the restore pod fails; if the run's error did not say what to run, the GPU
    would stay lowered: counted."""
    bench = _bench()
    assert bench.KINDS["k8s_node_agent_unreachable_during_restore"](random.Random(1), tmp_path) == bench.FaultOutcome()
    monkeypatch.setattr(bench, "_by_hand_command", lambda notes: None)
    outcome = bench.KINDS["k8s_node_agent_unreachable_during_restore"](random.Random(1), tmp_path)
    assert outcome.power_limits_left_lowered == 2  # left lowered, and not reported
