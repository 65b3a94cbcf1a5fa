"""benchmarks/attacks.py: a sample of every attack kind fails against the product, and each kind can see a success.

The sample runs every kind once through the same interfaces as the full benchmark (DAG run conf through
``dag.test``, registry files, the real wrapper on a fake NVML node, XCom records, docker-compose.yml, the
Carbon page's cache). The mutation tests put a known hole back and show the kind's counter rises above 0,
so a counter that stays at 0 means the defence held, not that the attack never ran.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _attacks():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("attacks_benchmark", REPO / "benchmarks" / "attacks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["attacks_benchmark"] = module
    spec.loader.exec_module(module)
    return module


attacks = _attacks()


def test_the_benchmark_covers_at_least_12_kinds_and_200_attempts_by_default():
    per_kind = attacks.parser().parse_args([]).per_kind
    assert len(attacks.KINDS) >= 12
    assert per_kind * len(attacks.KINDS) >= 200
    for name, kind in attacks.KINDS.items():
        assert kind.interface and kind.success_would_mean and kind.setting, name


@pytest.mark.slow
def test_a_sample_of_every_attack_kind_succeeds_in_nothing(dag_bag, tmp_path):
    result = attacks.run(per_kind=1, seed=7, kinds=None)
    assert result["attacks_tried"] == len(attacks.KINDS)
    assert result["ran_as_root"] is True  # the privilege-drop kinds need it; CI runs as root
    assert set(result["by_kind"]) == set(attacks.KINDS)
    assert result["harness_errors"] == {}, "every attempt reached the product"
    assert result["attacks_succeeded"] == 0, result["successes"]


def _one(kind: str, seed: int = 0) -> attacks.Attempt:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)
        return attacks.KINDS[kind].attempt(random.Random(seed), Path(tmp))


def test_path_component_kind_sees_a_name_that_leaves_its_folder(monkeypatch):
    from carbonflow.energy import lease

    monkeypatch.setattr(lease, "safe_name", lambda text: text)
    hits = [_one("path_component_escapes", seed).succeeded for seed in range(12)]
    assert any(hits)


def test_password_kind_sees_an_unredacted_uri(monkeypatch):
    from carbonflow.tracking import uri

    monkeypatch.setattr(uri, "redacted_uri", lambda text: text)
    assert _one("page_shows_a_password").succeeded


def test_held_run_kind_sees_a_delivery_that_trusts_the_record(monkeypatch):
    import base64

    from carbonflow.tracking import held

    def trusting(record, tracking_uri=None):  # the 0.2 delivery: writes files by the record's own names
        base = Path(tracking_uri.removeprefix("sqlite:///")).parent / "held"
        for name, data in record["files"].items():
            target = base / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(data))
        return "run"

    monkeypatch.setattr(held, "deliver_held", trusting)
    results = [_one("xcom_held_run_is_hostile", seed) for seed in range(8)]
    assert any(r.succeeded for r in results), results


def test_compose_kind_sees_a_port_published_on_every_interface(monkeypatch, tmp_path):
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(
        "services:\n  mlflow:\n    ports: ['5000:5000']\n    environment:\n      JWT_SECRET: change-me\n"
    )
    monkeypatch.setattr(attacks, "REPO", tmp_path)
    assert _one("compose_is_open").succeeded


def test_registry_kind_sees_a_loader_that_accepts_protected_env(monkeypatch, tmp_path):
    monkeypatch.setattr(
        attacks, "_load_registry_in_child", lambda folder: {"outcome": "accepted nodejob", "extra_kib": 0, "s": 0.1}
    )
    assert _one("job_file_reaches_the_node").succeeded


@pytest.mark.slow
def test_forging_kind_sees_a_training_that_runs_as_the_wrappers_own_user(monkeypatch):
    """Without ``CARBONFLOW_TRAINING_UID`` the training can read its wrapper's key from /proc and forge a signed
    result: the guarantee names that setting, and this shows the kind would count the forgery."""

    class Steal(random.Random):
        def choice(self, options):  # type: ignore[no-untyped-def]
            return "steal-key" if "steal-key" in options else options[0]

    monkeypatch.setattr(attacks, "_as_nobody", dict)
    with __import__("tempfile").TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)
        outcome = attacks.training_forges_its_result(Steal(0), Path(tmp))
    assert outcome.succeeded, outcome.detail


def test_an_attack_that_never_reaches_the_product_is_a_harness_error_not_a_defence(monkeypatch):
    """A broken harness (the wrapper cannot start) must not read as 'attack refused'."""
    monkeypatch.setattr(attacks, "TRAINING_PYTHON", "/nonexistent/python")
    result = attacks.run(per_kind=1, seed=0, kinds=["training_reads_secrets"])
    assert result["attacks_tried"] == 0 and result["harness_errors"], result
