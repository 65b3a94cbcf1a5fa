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
        assert row.energy_total_kwh == pytest.approx(metrics["energy_total_kwh"])
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
        assert f"{row.emissions_g:.3f}" in text
        assert f"{row.energy_total_kwh:.6f}" in text
        assert f"{row.test_accuracy:.4f}" in text
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
