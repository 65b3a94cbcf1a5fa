"""benchmarks/faults.py: a small sample of every kind leaves nothing lowered, booked twice, lost or duplicated,
and the benchmark can fail: with the recovery step broken, the lowered GPU is counted."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"


def _bench():
    spec = importlib.util.spec_from_file_location("faults_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_one_injection_of_every_kind_is_survived(tmp_path):
    bench = _bench()
    out = tmp_path / "faults.json"
    assert bench.main(["--per-kind", "1", "--seed", "3", "--out", str(out)]) == 0
    result = __import__("json").loads(out.read_text())
    assert result["faults_injected"] == len(bench.KINDS) >= 8
    assert result["power_limits_left_lowered"] == result["gpus_double_booked"] == 0
    assert result["runs_lost"] == result["runs_duplicated"] == 0


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
