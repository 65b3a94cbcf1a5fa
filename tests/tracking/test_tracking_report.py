"""``carbonflow report JOB`` on a real store with several runs: table numbers are the runs' metrics."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import tracking_factories as f
from PIL import Image
from rich.console import Console
from tracking_server_process import MlflowServer

from carbonflow.tracking.history import TrackingUnavailableError
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.report import PNG_SIZE_PX, build_report, render_table
from carbonflow.tracking.store import client_for
from carbonflow.units import energy_unit_for


@pytest.mark.slow
def test_report_matches_run_metrics(server: MlflowServer, home: Path, job_name: str, tmp_path: Path) -> None:
    spec = f.job_spec(job_name)
    nights = [(560.0, 65000.0, 2.8, 0.95), (610.0, 61000.0, 2.1, 0.96), (540.0, 70500.0, 3.4, 0.93)]
    run_ids = []
    for i, (duration, gpu_j, grams, acc) in enumerate(nights):
        start = f.T0 + timedelta(days=i, hours=5)
        outcome = log_training_run(
            spec,
            f.plan(job_name, start=start, pl=150.0 + 50 * i),
            f.result(
                job_name,
                started_at=start,
                duration_s=duration,
                energy_gpu_j=gpu_j,
                emissions_g=grams,
                accuracy=acc,
                pl=150.0 + 50 * i,
            ),
            tracking_uri=server.uri,
        )
        assert not outcome.spooled, outcome.reason
        run_ids.append(outcome.run_id)

    png = tmp_path / "out" / "report.png"
    report = build_report(job_name, tracking_uri=server.uri, png_path=png)
    assert [row.run_id for row in report.rows] == run_ids
    assert [row.recurrence for row in report.rows] == [1, 2, 3]
    client = client_for(server.uri)
    for row in report.rows:
        metrics = client.get_run(row.run_id).data.metrics
        assert row.energy_total_j == metrics["energy_total_j"]
        assert row.energy_total_j == pytest.approx(metrics["energy_total_j"])
        assert row.emissions_g == metrics["emissions_g"]
        assert row.emissions_run_now_default_g == metrics["emissions_run_now_default_g"]
        assert row.saving_g == metrics["saving_g"]
        assert row.saving_fraction == metrics["saving_fraction"]
        assert row.test_accuracy == metrics["test_accuracy"]
        assert row.duration_s == metrics["duration_s"]
    assert [row.config_key for row in report.rows] == ["c1-pl150-b64", "c1-pl200-b64", "c1-pl250-b64"]
    assert report.emissions_g == pytest.approx(2.8 + 2.1 + 3.4)

    console = Console(record=True, width=250)
    console.print(render_table(report))
    text = console.export_text()
    for row in report.rows:
        assert f"{row.emissions_g:.3g}" in text
        unit, per_unit = energy_unit_for([r.energy_total_j for r in report.rows])
        assert f"energy ({unit})" in text and f"{row.energy_total_j / per_unit:.4g}" in text
        assert f"{row.test_accuracy:.3f}" in text
        assert row.config_key in text
    assert "measured,estimated" in text and "+replay" in text

    assert png.stat().st_size > 10_000
    with Image.open(png) as image:
        assert image.size == PNG_SIZE_PX == (1200, 800)
        assert len(set(image.convert("L").getdata())) > 10, "the PNG shows something"

    last = build_report(job_name, tracking_uri=server.uri, png_path=tmp_path / "last.png", last_n=2)
    assert [row.run_id for row in last.rows] == run_ids[1:]


def test_report_errors_are_clear(server: MlflowServer, home: Path, tmp_path: Path) -> None:
    with pytest.raises(LookupError, match="no training runs of job 'nobody'"):
        build_report("nobody", tracking_uri=server.uri, png_path=tmp_path / "r.png")
    with pytest.raises(ValueError, match="last_n=0"):
        build_report("nobody", tracking_uri=server.uri, png_path=tmp_path / "r.png", last_n=0)
    with pytest.raises(TrackingUnavailableError, match="cannot read tracking store"):
        build_report("nobody", tracking_uri="http://127.0.0.1:9", png_path=tmp_path / "r.png")


def test_report_refuses_an_empty_tracking_store_without_creating_one(tmp_path: Path, monkeypatch) -> None:
    """Before: from another folder it silently created an empty .carbonflow/mlflow.db and found no runs."""
    from typer.testing import CliRunner

    from carbonflow.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CARBONFLOW_HOME", raising=False)
    result = CliRunner().invoke(app, ["report", "my-mlp"])
    assert result.exit_code == 1
    assert "no MLflow store at" in result.output and "--tracking-uri" in result.output
    assert not (tmp_path / ".carbonflow").exists()


def test_report_writes_files_only_where_asked_and_fits_100_columns(
    server: MlflowServer, home: Path, job_name: str, tmp_path: Path, monkeypatch
) -> None:
    """Before: the PNG landed in the current folder and the table needed ~200 columns."""
    from typer.testing import CliRunner

    from carbonflow.cli import app

    spec = f.job_spec(job_name)
    log_training_run(spec, f.plan(job_name), f.result(job_name), tracking_uri=server.uri)
    monkeypatch.chdir(tmp_path)
    plain = CliRunner().invoke(app, ["report", job_name, "--tracking-uri", server.uri], terminal_width=100)
    assert plain.exit_code == 0, plain.output
    assert not list(tmp_path.glob("*.png"))
    assert max(len(line) for line in plain.output.splitlines()) <= 100
    assert "kWh" not in plain.output  # one unit family (J, kJ, MJ) across carbonflow's output
    out = CliRunner().invoke(app, ["report", job_name, "--tracking-uri", server.uri, "--out", "plots"])
    assert out.exit_code == 0 and (tmp_path / "plots" / f"{job_name}-report.png").is_file()


def test_spool_status_lists_waiting_runs(home: Path, job_name: str) -> None:
    from typer.testing import CliRunner

    from carbonflow.cli import app
    from carbonflow.tracking.logger import training_record
    from carbonflow.tracking.spool import write_spool

    empty = CliRunner().invoke(app, ["spool", "status"])
    assert empty.exit_code == 0 and "the spool is empty" in empty.output
    record = training_record(f.job_spec(job_name), f.plan(job_name), f.result(job_name), workdir=home)
    write_spool(record, "http://mlflow.example:5000")
    listed = CliRunner().invoke(app, ["spool", "status"])
    assert listed.exit_code == 0 and job_name in listed.output and "waiting" in listed.output
