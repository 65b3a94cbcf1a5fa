"""``carbonflow report JOB`` on a real store with several runs: table numbers are the runs' metrics."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import tracking_factories as f
from PIL import Image
from rich.console import Console
from tracking_server_process import MlflowServer

from carbonflow.tracking.history import TrackingUnavailableError
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.report import PNG_SIZE_PX, ReportRow, build_report, render_table
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
        assert f"({unit})" in text and f"{row.energy_total_j / per_unit:.4g}" in text
        assert f"{row.test_accuracy:.3f}" in text
        assert row.config_key in text
    assert "energy: measured + estimated for all runs" in text and "replayed grid intensity" in text  # said once

    assert png.stat().st_size > 10_000
    with Image.open(png) as image:
        assert image.size == PNG_SIZE_PX == (1200, 800)
        assert len(set(image.convert("L").getdata())) > 10, "the PNG shows something"

    last = build_report(job_name, tracking_uri=server.uri, png_path=tmp_path / "last.png", last_n=2)
    assert [row.run_id for row in last.rows] == run_ids[1:]


def test_report_errors_are_clear(server: MlflowServer, home: Path, job_name: str, tmp_path: Path) -> None:
    log_training_run(f.job_spec(job_name), f.plan(job_name), f.result(job_name), tracking_uri=server.uri)
    with pytest.raises(LookupError, match="no training runs of job 'nobody'") as info:
        build_report("nobody", tracking_uri=server.uri, png_path=tmp_path / "r.png")
    assert "jobs in this store: " in str(info.value) and job_name in str(info.value)  # a typo is seen at once
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
    flat = " ".join(result.output.split())
    assert "no MLflow store at" in flat and "--tracking-uri" in flat
    long_lines = [line for line in result.output.splitlines() if len(line) > 100]  # wrapped, paths kept whole
    assert all(" " not in line.strip() for line in long_lines), result.output
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
    assert [p.name for p in (tmp_path / "plots").iterdir()] == [f"{job_name}-report.png"]


def test_spool_status_reads_the_spool_of_the_home_given(home: Path, job_name: str, tmp_path: Path, monkeypatch) -> None:
    """Finding: `spool status` had no --home (it read only $CARBONFLOW_HOME or ./.carbonflow)."""
    from typer.testing import CliRunner

    from carbonflow.cli import app
    from carbonflow.tracking.logger import training_record
    from carbonflow.tracking.spool import spool_root, write_spool

    other = tmp_path / "elsewhere" / ".carbonflow"
    record = training_record(f.job_spec(job_name), f.plan(job_name), f.result(job_name), workdir=home)
    write_spool(record, "http://mlflow.example:5000", root=spool_root(other))
    monkeypatch.chdir(tmp_path)
    here = CliRunner().invoke(app, ["spool", "status"])
    assert here.exit_code == 0 and "the spool is empty" in here.output
    there = CliRunner().invoke(app, ["spool", "status", "--home", str(other)])
    assert there.exit_code == 0 and job_name in there.output and "waiting" in there.output, there.output
    assert max(len(line) for line in there.output.splitlines()) <= 100


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


def test_energy_against_accuracy_per_configuration_with_its_pareto_front(
    server: MlflowServer, home: Path, job_name: str, tmp_path: Path, monkeypatch
) -> None:
    """Finding: no view put energy against accuracy. Three configurations on a real MLflow server: the cheapest,
    a dearer one that is more accurate (both on the front), and a dearest one that is less accurate (not)."""
    from typer.testing import CliRunner

    from carbonflow.cli import app
    from carbonflow.tracking.report import energy_accuracy

    spec = f.job_spec(job_name)
    for i, (limit, gpu_j, acc) in enumerate([(150.0, 50000.0, 0.90), (200.0, 60000.0, 0.95), (250.0, 70000.0, 0.92),
                                              (150.0, 52000.0, 0.92)]):  # fmt: skip
        start = f.T0 + timedelta(days=i, hours=5)
        log_training_run(spec, f.plan(job_name, start=start, pl=limit),
                         f.result(job_name, started_at=start, energy_gpu_j=gpu_j, accuracy=acc, pl=limit),
                         tracking_uri=server.uri)  # fmt: skip
    report = build_report(job_name, tracking_uri=server.uri, png_path=tmp_path / "r.png")
    summaries = {c.config_key: c for c in energy_accuracy(report)}
    assert summaries["c1-pl150-b64"].runs == 2 and summaries["c1-pl150-b64"].accuracy_mean == pytest.approx(0.91)
    assert [k for k, c in summaries.items() if c.pareto] == ["c1-pl150-b64", "c1-pl200-b64"]
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["report", job_name, "--tracking-uri", server.uri, "--view", "energy-accuracy",
                                    "--out", "plots"], terminal_width=100)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "energy against accuracy" in done.output and "Pareto" in done.output
    png = tmp_path / "plots" / f"{job_name}-energy-accuracy.png"
    with Image.open(png) as image:
        assert len(set(image.convert("L").getdata())) > 10
    # finding: --view energy-accuracy also wrote the runs view's <job>-report.png; only the view asked for now
    assert [p.name for p in (tmp_path / "plots").iterdir()] == [png.name]
    bad = CliRunner().invoke(app, ["report", job_name, "--view", "scatter"])
    assert bad.exit_code != 0 and "--view='scatter' is not allowed" in bad.output


def _row(i: int, **kw: object) -> ReportRow:
    base = dict(recurrence=None, run_id=f"run-{i}", started_at=f"2023-03-1{4 + i} 02:00", config_key="c2-pldefault",
                containers=2, power_limit_w=None, batch_size=None, colocated_with="-", duration_s=13.4,
                energy_total_j=107.2 + i, emissions_g=0.00545, emissions_run_now_default_g=0.00981, saving_g=0.00436,
                saving_fraction=0.445, test_accuracy=0.944, energy_labels="estimated", replay=True,
                predicted_duration_s=12.0, predicted_energy_j=100.0, predicted_emissions_g=0.005)  # fmt: skip
    base.update(kw)
    return ReportRow(**base)  # type: ignore[arg-type]


def test_report_table_fits_100_columns_piped_without_breaking_words_and_shows_zero_as_zero(
    tmp_path: Path, monkeypatch
) -> None:
    """Findings: piped, the report squeezed to 80 columns and broke cells mid-word ('estimat/ed', 'accura/cy');
    an observe-only run's saving read '-8.67e-19 g' and '-0.0 %'."""
    from carbonflow.terminal import cli_console, output_width
    from carbonflow.tracking.report import ReportData

    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_width() == 100  # piped (pytest captures): 100 columns, not rich's 80
    rows = [_row(0), _row(1, saving_g=-8.67e-19, saving_fraction=-4.3e-16, emissions_run_now_default_g=0.00545),
            _row(2, energy_labels="measured,estimated", replay=False, config_key="c2-pl150-b64-long")]  # fmt: skip
    report = ReportData(job="digits-mlp", tracking_uri="sqlite:////some/where/.carbonflow/mlflow.db", rows=rows)
    console = cli_console(record=True)
    console.print(render_table(report))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    for word in ("estimated", "measured,", "acc.", "2023-03-14", "107.2", "5.45", "44.5", "c2-pldefault"):
        assert word in text, (word, text)  # whole: no mid-word folds
    assert "…" not in text
    assert "e-19" not in text and "-0.0" not in text
    zero_row = next(line for line in lines if "2023-03-15" in line)
    assert re.search(r"│\s+0\.00\s+│\s+0\.0\s+│", zero_row), zero_row  # zero, in its column's one format (issue 25)
    assert "(J)" in text and "(mg)" in text and "(%)" in text  # units in the headers, numbers in the cells
    assert not re.search(r"\d (J|kJ|mg|g) *│", text)


def test_report_png_axes_are_labelled_in_the_one_unit_family(tmp_path: Path, monkeypatch) -> None:
    """Finding: the PNG's energy panel was titled 'energy_total_j (kJ)' (a metric name with a unit bolted on)."""
    from matplotlib.figure import Figure

    from carbonflow.tracking.report import ReportData, render_png

    titles: list[str] = []
    original = Figure.savefig

    def capture(fig: Figure, *args: object, **kwargs: object) -> None:
        titles.extend(ax.get_title() for ax in fig.axes)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    rows = [_row(0, energy_total_j=65_000.0), _row(1, energy_total_j=72_000.0)]
    report = ReportData(job="j", tracking_uri="sqlite:///x", rows=rows, png_path=tmp_path / "r.png")
    render_png(report)
    assert "energy per run (kJ)" in titles and not any("energy_total_j" in t for t in titles), titles
