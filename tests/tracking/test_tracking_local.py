"""The embedded default store (no server), input checks, and the spool's durability."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import tracking_factories as f

from carbonflow.tracking import schema
from carbonflow.tracking.history import realised_vs_predicted
from carbonflow.tracking.logger import log_training_run, training_record
from carbonflow.tracking.records import TrackingOutcome
from carbonflow.tracking.spool import deliver, pending, replay_spool
from carbonflow.tracking.store import client_for
from carbonflow.tracking.uri import tracking_uri


def _closed_port_uri() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_embedded_default_store_keeps_artifacts_under_home(home: Path, files: dict[str, Path]) -> None:
    outcome = log_training_run(
        f.job_spec(), f.plan(), f.result(), forecast=f.forecast(), power_trace_csv=files["trace"]
    )
    assert not outcome.spooled, outcome.reason
    assert outcome.tracking_uri == f"sqlite:///{home / 'mlflow.db'}" == tracking_uri()
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    assert run.info.artifact_uri.startswith((home / "mlartifacts" / "carbonflow-digits").as_uri())
    stored = home / "mlartifacts" / "carbonflow-digits" / outcome.run_id / "artifacts"
    assert {"plan.json", "result.json", "power_trace.csv", "pareto.png", "forecast.png"} <= {
        p.name for p in stored.iterdir()
    }
    assert not (Path.cwd() / "mlruns").exists() or not any((Path.cwd() / "mlruns").iterdir())
    assert [r.run_id for r in realised_vs_predicted("digits")] == [outcome.run_id]
    assert [r.recurrence for r in realised_vs_predicted("digits")] == [1]


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"plan\.job='other' does not match spec\.name='digits'"):
        training_record(f.job_spec(), f.plan("other"), f.result(), workdir=tmp_path)
    with pytest.raises(ValueError, match=r"result\.job='other'"):
        training_record(f.job_spec(), f.plan(), f.result("other"), workdir=tmp_path)
    with pytest.raises(ValueError, match=r"power_trace_csv=.*is not a file"):
        training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path, power_trace_csv=tmp_path / "no.csv")
    with pytest.raises(ValueError, match=r"model_path=.*does not exist"):
        training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path, model_path=tmp_path / "no.pt")


def test_failed_training_is_logged_failed_and_not_registered(home: Path, files: dict[str, Path]) -> None:
    outcome = log_training_run(f.job_spec(), f.plan(), f.result(exit_code=3), model_path=files["model"])
    run = client_for(outcome.tracking_uri).get_run(outcome.run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics["exit_code"] == 3
    assert run.data.tags[schema.T_MODEL_REGISTERED] == "false"
    assert outcome.model_version is None


def test_spool_survives_the_loss_of_the_original_files(home: Path, tmp_path: Path, files: dict[str, Path]) -> None:
    dead = _closed_port_uri()
    work = tmp_path / "work"
    record = training_record(
        f.job_spec(), f.plan(), f.result(), workdir=work, power_trace_csv=files["trace"], model_path=files["model"]
    )
    outcome = deliver(record, dead)
    assert isinstance(outcome, TrackingOutcome) and outcome.spooled
    assert "unreachable" in (outcome.reason or "")
    for path in work.iterdir():  # the temporary files are gone, as after log_training_run returns
        path.unlink()
    files["trace"].unlink()
    assert replay_spool(dead) == 0  # still down: nothing written, nothing lost
    [entry] = pending(tracking_uri=dead)
    assert entry.record.idempotency_key == record.idempotency_key

    embedded = f"sqlite:///{home / 'mlflow.db'}"
    assert replay_spool(embedded) == 0, "entries meant for another store are not taken by default"
    assert replay_spool(embedded, all_targets=True) == 1
    assert pending() == []
    client = client_for(embedded)
    [run] = client.search_runs(
        [client.get_experiment_by_name("carbonflow/digits").experiment_id],
        filter_string=f"tags.`{schema.T_IDEMPOTENCY_KEY}` = '{record.idempotency_key}'",
    )
    assert run.data.tags[schema.T_SPOOLED] == "true"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plan.json", "power_trace.csv", "model"} <= names


def test_a_refused_run_does_not_block_the_others_and_is_kept(home: Path, tmp_path: Path) -> None:
    from carbonflow.tracking.spool import MAX_ATTEMPTS, failed_entries

    embedded = f"sqlite:///{home / 'mlflow.db'}"
    bad = training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path / "bad")
    bad.metrics["not|a valid metric name"] = 1.0  # MLflow refuses this name: not an outage
    refused = deliver(bad, embedded)
    assert refused.spooled and "not|a valid metric name" in (refused.reason or "")

    good = training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path / "good")
    written = deliver(good, embedded)
    assert not written.spooled and written.run_id, "a refused older entry must not hold back new runs"
    for _ in range(MAX_ATTEMPTS):
        replay_spool(embedded)
    assert pending() == []
    [kept] = failed_entries()
    assert kept.record.idempotency_key == bad.idempotency_key
    assert kept.meta.attempts >= MAX_ATTEMPTS and "not|a valid metric name" in (kept.meta.last_error or "")
    rows = realised_vs_predicted("digits", tracking_uri=embedded)
    assert [r.run_id for r in rows] == [written.run_id], "the half-written refused run is not history"


def test_without_a_spool_disk_the_run_is_written_directly(home: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the spool folder should be")
    embedded = f"sqlite:///{home / 'mlflow.db'}"
    record = training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path / "w")
    outcome = deliver(record, embedded, root=blocked)
    assert not outcome.spooled and outcome.run_id
    run = client_for(embedded).get_run(outcome.run_id)
    assert run.data.tags[schema.T_COMPLETE] == "true"


def test_a_plot_failure_keeps_the_run_and_says_so(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import carbonflow.tracking.logger as logger_module

    def broken_plot(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no fonts on this node")

    monkeypatch.setattr(logger_module, "forecast_plot", broken_plot)
    record = training_record(f.job_spec(), f.plan(), f.result(), workdir=tmp_path, forecast=f.forecast())
    names = {Path(a.file).name for a in record.artifacts}
    assert "forecast.png" not in names and {"forecast.json", "pareto.png", "plan.json"} <= names
    assert "forecast.png not drawn: RuntimeError: no fonts on this node" in record.tags[schema.T_NOTE]
    assert record.metrics["energy_total_j"] == f.result().energy_total_j


def test_a_power_limit_left_lowered_is_a_tag_on_the_run(home: Path) -> None:
    """The typed ``RunResult.power_limits_not_restored`` reaches MLflow (the task fails on it too): a platform
    engineer filters runs on the tag instead of reading notes."""
    clean = log_training_run(f.job_spec(), f.plan(), f.result())
    assert client_for(clean.tracking_uri).get_run(clean.run_id).data.tags[schema.T_POWER_LIMITS_NOT_RESTORED] == "none"
    lowered = f.result().model_copy(
        update={"power_limits_not_restored": ["GPU-0 (wanted 300 W, reads 150 W)", "GPU-1 (wanted 300 W, unreadable)"]}
    )
    outcome = log_training_run(f.job_spec(), f.plan(), lowered)
    tag = client_for(outcome.tracking_uri).get_run(outcome.run_id).data.tags[schema.T_POWER_LIMITS_NOT_RESTORED]
    assert tag == "GPU-0 (wanted 300 W, reads 150 W); GPU-1 (wanted 300 W, unreadable)"
