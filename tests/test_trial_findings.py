"""Regression tests for the findings of the no-context user trial of issue 25 (a plain PyTorch script printing
``epoch 3/20 loss 0.16 val_acc 0.96`` lines, with a progress_pattern, run through ``carbonflow dags test`` three
nights; its state was kept in /tmp/trial-user). One test (or a few) per finding, named after it."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carbonflow.accounting.run import to_run_result
from carbonflow.accounting.saving import format_saving, saving_fraction, saving_g
from carbonflow.cli import app
from carbonflow.dag_test import durations_text, parse_dags_test_log
from carbonflow.domain import DeviceEnergy, JobSpec
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.wrapper import WrappedRun
from carbonflow.planning import plan_job
from carbonflow.profiling.profiler import ProfilingError, profile_job
from carbonflow.progress_pattern import UNMATCHED_GRACE_S, check_progress_pattern
from carbonflow.terminal import short_time
from carbonflow.tracking.logger import saving_line
from carbonflow.tracking.report import (
    ReportData,
    ReportRow,
    render_energy_accuracy_png,
    render_table,
    run_labels,
    time_order,
    which_figures,
)
from carbonflow.units import format_column, nearest_minute
from tests.planning.planning_factories import NOW, make_forecast, make_profile, make_spec

TRIAL_PATTERN = r"epoch (?P<epoch>\d+)/\d+ loss (?P<loss>[\d.]+) val_acc (?P<accuracy>[\d.]+)"

# --- finding 1: one saving figure, named predicted (the plan's) or measured (the run's) --------------------------


def test_finding_1_the_plans_saving_is_named_predicted_against_its_named_baseline() -> None:
    """MLflow's plan_reason and the task log said ``saving 13.8 %`` beside the run's measured saving_fraction
    0.0758: the plan's figure is now written ``predicted saving … vs start now at <baseline>`` at its source."""
    forecast = make_forecast([300.0] * 4 + [100.0] * 8 + [300.0] * 36)
    plan = plan_job(make_spec(hours=12, max_slowdown=0.3), make_profile(), forecast, NOW)
    assert re.search(r"predicted saving [−-]?\d+\.\d % carbon vs start now at \d+ W", plan.reason), plan.reason
    assert not re.search(r"(?<!predicted )\bsaving [−-]?\d", plan.reason), plan.reason  # no bare "saving 13.8 %"
    no_forecast = plan_job(make_spec(hours=12, max_slowdown=0.3), make_profile(), None, NOW)
    assert "predicted saving" in no_forecast.reason and "energy vs start now at" in no_forecast.reason


def test_finding_1_the_task_logs_saving_is_named_measured_against_its_baseline() -> None:
    line = saving_line("digits-cnn-plain", 0.0758)
    assert f"measured saving {format_saving(0.0758)} carbon vs start now at the default configuration" in line
    assert "MLflow saving_fraction" in line and "predicted saving" not in line


# --- finding 2: a saving within floating-point noise of 0 is exactly 0 ------------------------------------------


def test_finding_2_float_noise_savings_are_exactly_zero_at_the_source() -> None:
    """Night 2 logged saving_g = 6.938893903907228e-17 and saving_fraction = 7.771561172376096e-16 (the trial's
    own figures: emissions 0.09551172241106162 g against a baseline of 0.09551172241106169 g)."""
    assert saving_g(0.09551172241106162, 0.09551172241106169) == 0.0
    assert saving_fraction(0.09551172241106162, 0.09551172241106169) == 0.0
    assert saving_fraction(0.058019482064279884, 0.05801948206427987) == 0.0  # night 3: -2.2e-16
    assert saving_g(0.0596, 0.0645) == pytest.approx(0.0049)  # a real saving is kept
    assert saving_fraction(0.0596, 0.0645) == pytest.approx(1 - 0.0596 / 0.0645)


def test_finding_2_a_run_that_saved_nothing_logs_exactly_zero() -> None:
    """Through the accounting the logger reads (its metrics and the registry's ``saving_g`` version tag)."""
    forecast = make_forecast([198.0] * 48)
    plan = plan_job(make_spec(hours=12, max_slowdown=0.3), make_profile(), forecast, NOW)
    start = plan.start
    run = WrappedRun(
        job=plan.job, config_key=plan.config.key(), started_at=start, ended_at=start + timedelta(seconds=217.0865),
        duration_s=217.0865, exit_code=0,
        devices=[DeviceEnergy(device_id="cpu0", device_model="AMD EPYC", kind="cpu", energy_j=1736.5767711102126,
                              label="estimated")],
    )  # fmt: skip
    # the baseline is the same energy at the intensity the run had: equal up to the order of summation
    result = to_run_result(run, plan, list(forecast.points), baseline_energy_ratio=1.0,
                           baseline_intensity_gco2_per_kwh=198.00000000000003)  # fmt: skip
    assert result.saving_g == 0.0 and result.saving_fraction == 0.0
    assert f"{result.saving_g:.6g}" == "0"  # the registry version tag


# --- finding 3: the report in the order the runs ran, distinct labels, one format per column ------------------


def _row(ran: str, start: str, emissions_mg: float, saved_mg: float, **kw: object) -> ReportRow:
    fields: dict[str, object] = dict(
        recurrence=None, run_id=ran.replace(":", "").replace("-", "").replace("T", "") * 4, started_at=start,
        config_key="c1-pldefault", containers=1, power_limit_w=None, batch_size=None, colocated_with="-",
        duration_s=146.5, energy_total_j=1171.9, emissions_g=emissions_mg / 1000,
        emissions_run_now_default_g=(emissions_mg + saved_mg) / 1000, saving_g=saved_mg / 1000,
        saving_fraction=saved_mg / (emissions_mg + saved_mg), test_accuracy=0.98, energy_labels="estimated",
        replay=True, predicted_duration_s=146.5, predicted_energy_j=645.7, predicted_emissions_g=0.0638,
        recorded_at=f"{ran}:36.484179+00:00", energy_gpu_j=0.0, energy_cpu_j=1171.9,
    )  # fmt: skip
    fields.update(kw)
    return ReportRow(**fields)  # type: ignore[arg-type]


TRIAL_ROWS = [  # the trial's three nights, as the store returns them (night 1 replayed the later date)
    _row("2026-11-26T10:05", "2023-03-14 18:01", 58.0, 0.0),
    _row("2026-11-26T09:44", "2023-03-15 02:00", 59.6, 4.88),
    _row("2026-11-26T09:52", "2023-03-14 18:01", 95.5, 0.0),
]


def test_finding_3_the_report_lists_runs_in_the_order_they_ran_with_labels_that_tell_nights_apart() -> None:
    rows = sorted(TRIAL_ROWS, key=time_order)
    assert [r.started_at for r in rows] == ["2023-03-15 02:00", "2023-03-14 18:01", "2023-03-14 18:01"]
    assert [r.ran for r in rows] == ["2026-11-26 09:45", "2026-11-26 09:53", "2026-11-26 10:06"]
    labels = run_labels(rows)
    assert len(set(labels)) == 3
    firsts = [label.splitlines()[0] for label in labels]  # the night, and when it ran, lead each label
    assert firsts == ["1: ran 11-26 09:45", "2: ran 11-26 09:53", "3: ran 11-26 10:06"]
    assert all("replay" in label.splitlines()[1] for label in labels)


def test_finding_3_the_reports_columns_have_one_number_format_each() -> None:
    from rich.console import Console

    assert format_column([59.6, 95.5, 58.0]) == ["59.6", "95.5", "58.0"]
    assert format_column([4.88, 0.0, 0.0]) == ["4.88", "0.00", "0.00"]
    assert format_column([None, -0.0001, 4.88]) == ["–", "0.00", "4.88"]  # no -0.00
    assert format_column([0.0, 0.0]) == ["0", "0"]
    console = Console(width=100, record=True)
    console.print(render_table(ReportData(job="digits-cnn-plain", tracking_uri="sqlite:///x.db",
                                          rows=sorted(TRIAL_ROWS, key=time_order))))  # fmt: skip
    text = console.export_text()
    assert " 58.0 " in text and " 59.6 " in text and " 58 " not in text
    assert " 0.00 " in text and " 4.88 " in text and re.search(r"│\s+0\s+│", text) is None
    assert max(len(line) for line in text.splitlines()) <= 100


def _legend_texts(monkeypatch: pytest.MonkeyPatch, draw) -> list[str]:  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    seen: list = []
    original = Figure.savefig

    def capture(fig: Figure, *args: object, **kwargs: object) -> None:
        seen.extend(fig.axes)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    draw()
    legend = seen[0].get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def test_finding_3_a_pareto_front_of_one_point_gets_no_legend_entry(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    one = ReportData(job="j", tracking_uri="sqlite:///x.db", rows=list(TRIAL_ROWS))  # one configuration
    texts = _legend_texts(monkeypatch, lambda: render_energy_accuracy_png(one, tmp_path / "one.png"))
    assert "Pareto front (means)" not in texts and "c1-pldefault" in texts
    cheaper = replace(TRIAL_ROWS[0], config_key="c1-pl150", energy_total_j=900.0, test_accuracy=0.97)
    two = ReportData(job="j", tracking_uri="sqlite:///x.db", rows=[*TRIAL_ROWS, cheaper])
    monkeypatch.undo()
    texts = _legend_texts(monkeypatch, lambda: render_energy_accuracy_png(two, tmp_path / "two.png"))
    assert "Pareto front (means)" in texts  # two points: the line is drawn, and named


# --- finding 4: every command refuses bad input in one line, exit 2 --------------------------------------------


@pytest.fixture
def bad_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CARBONFLOW_HOME", str(tmp_path / "home"))
    no_dir = tmp_path / "no-working-dir.yaml"  # valid by the schema; its working_dir is not there
    no_dir.write_text("name: digits\ncommand: [python, train.py]\nworking_dir: no-such-dir\nsteps: 10\n"
                      "region: GB\ndevice_kind: cpu\n")  # fmt: skip
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("name: digits\ncommand: [python, train.py]\nepochs: 2\nregion: GB\n")  # no samples_per_epoch
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "request.json").write_text('{"x": 1}')
    (tmp_path / "not_a_dag.txt").write_text("")
    return {"no_dir": no_dir, "invalid": invalid}


def _refused_in_one_line(args: list[str]) -> str:
    """Exit 2, no traceback, no Rich box, one ``error:`` message and nothing after it (``plan`` lists each problem
    of a job under its one error line, and ``dags test`` wraps its message at the terminal's width)."""
    result = CliRunner().invoke(app, args)
    output = result.output
    assert result.exit_code == 2, (args, result.exit_code, output)
    assert "Traceback" not in output and "╭" not in output, (args, output)
    assert output.strip().startswith("error:") and output.count("error:") == 1, (args, output)
    if args[0] not in ("plan", "dags"):
        assert output.count("\n") == 1, (args, output)  # one line
    return output.strip()


def test_finding_4_profile_with_a_missing_working_dir_is_refused_in_one_line(bad_jobs: dict[str, Path]) -> None:
    """The trial's case: a full Rich traceback (ValueError from LocalBackend.start) and exit 1."""
    line = _refused_in_one_line(["profile", str(bad_jobs["no_dir"])])
    assert "working_dir=" in line and "no-such-dir" in line and "is not a directory" in line


@pytest.mark.parametrize(
    "args",
    [
        ["profile", "{invalid}"],
        ["profile", "missing.yaml"],
        ["plan", "{invalid}"],
        ["plan", "missing.yaml"],
        ["run", "--job", "{invalid}", "--plan", "plan.json", "--result", "r.json", "--", "true"],
        ["run", "--job", "{no_dir}", "--plan", "missing.json", "--result", "r.json", "--", "true"],
        ["run-shared", "--request", "request.json", "--result", "r.json"],
        ["run-shared", "--request", "missing.json", "--result", "r.json"],
        ["dags", "test", "not_a_dag.txt"],
        ["serve", "--dags", "no-such-folder"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_finding_4_every_command_refuses_a_bad_file_in_one_line_with_exit_2(
    bad_jobs: dict[str, Path], args: list[str]
) -> None:
    _refused_in_one_line([a.format(**bad_jobs) for a in args])


def test_finding_4_the_command_boundary_turns_bad_values_into_one_line(bad_jobs: dict[str, Path]) -> None:
    """Any command's ValueError, ValidationError or missing file, raised while it runs, gets the same treatment."""
    import typer
    from pydantic import BaseModel

    from carbonflow.cli import one_line_errors

    class Job(BaseModel):
        epochs: int

    for err in (ValueError("epochs=-1 is not allowed"), FileNotFoundError(2, "No such file", "job.yaml")):

        @one_line_errors
        def command(err: Exception = err) -> None:
            raise err

        with pytest.raises(typer.Exit) as info:
            command()
        assert info.value.exit_code == 2

    @one_line_errors
    def validating() -> None:
        Job.model_validate({"epochs": "many"})

    runner_app = typer.Typer()
    runner_app.command()(validating)
    result = CliRunner().invoke(runner_app, [])
    assert result.exit_code == 2 and result.output.startswith("error: epochs: ") and result.output.count("\n") == 1


# --- finding 5: the pattern as written; profiling gives up early on a pattern that matches nothing ------------

EPOCH_SCRIPT = r"""
import sys, time
epochs = int(sys.argv[1])
print("loading data")
for e in range(1, epochs + 1):
    time.sleep(0.05)
    print(f"epoch {e}/{epochs} loss {1 / e:.4f} val_acc {0.5 + e / 1000:.4f}")
"""


def test_finding_5_the_pattern_is_shown_as_the_user_wrote_it() -> None:
    wrong = TRIAL_PATTERN.replace("epoch", "Epoch", 1)
    with pytest.raises(ValueError) as info:
        check_progress_pattern(wrong.replace("(?P<epoch>", "(?P<epoch_no>"))
    assert r"(?P<epoch_no>\d+)/\d+" in str(info.value) and r"\\d" not in str(info.value)


def test_finding_5_profiling_gives_up_early_when_the_pattern_matches_none_of_the_printed_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trial's mismatch (``Epoch`` for ``epoch``) was told only after the whole 20-epoch script ran (2 min
    45 s). Here a 400-epoch script (20 s) is stopped once it has printed a profile's worth of unmatched lines
    after the grace (profile_report_timeout_s / 10 = 1 s here, at most UNMATCHED_GRACE_S)."""
    (tmp_path / "train.py").write_text(EPOCH_SCRIPT)
    wrong = TRIAL_PATTERN.replace("epoch", "Epoch", 1)
    spec = JobSpec(name="unchanged", command=["python", "train.py", "{epochs}"], working_dir=str(tmp_path),
                   epochs=400, samples_per_epoch=1000, batch_size=50, region="GB", device_kind="cpu",
                   progress_pattern=wrong, profile_warmup_steps=1, profile_steps=3,
                   profile_report_timeout_s=10)  # fmt: skip
    assert spec.profile_report_timeout_s / 10 < UNMATCHED_GRACE_S
    started = time.monotonic()
    with pytest.raises(ProfilingError) as info:
        profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert elapsed < 15, elapsed  # the script alone takes 20 s; the silent-job timeout is 10 s
    assert "stopped the training early: progress_pattern matched none of" in message, message
    assert f"progress_pattern='{wrong}'" in message and r"\\d" not in message, message
    assert re.search(r"the last of them: epoch \d+/400 loss", message)  # the lines it saw
    assert "the training failed" not in message  # stopped by carbonflow, not a crash


def test_finding_5_a_matching_pattern_is_never_given_up_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train.py").write_text(EPOCH_SCRIPT)
    spec = JobSpec(name="unchanged", command=["python", "train.py", "{epochs}"], working_dir=str(tmp_path),
                   epochs=30, samples_per_epoch=1000, batch_size=50, region="GB", device_kind="cpu",
                   progress_pattern=TRIAL_PATTERN, profile_warmup_steps=1, profile_steps=3, profile_min_window_s=0,
                   profile_report_timeout_s=10)  # fmt: skip
    profile = profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    assert profile.points and profile.points[0].samples > 0


# --- finding 6: times rounded to the nearest minute, the same everywhere -----------------------------------------


def test_finding_6_a_start_of_01_59_59_9995_is_shown_02_00_everywhere() -> None:
    planned = "2023-03-15T01:59:59.999562+00:00"
    assert short_time(planned) == "03-15 02:00"  # the dags test summary (and the demo table)
    when = datetime.fromisoformat(planned)
    assert nearest_minute(when) == datetime(2023, 3, 15, 2, 0, tzinfo=UTC)
    assert nearest_minute(datetime(2023, 3, 15, 2, 0, 29, tzinfo=UTC)).minute == 0
    from carbonflow.planning.optimizer import _hm

    assert _hm(when) == "02:00"  # the plan's reason
    assert _row("2026-11-26T09:44", "2023-03-15 02:00", 1, 0).ran == "2026-11-26 09:45"  # the report (09:44:36)


# --- finding 7: the summary's duration says what it is ------------------------------------------------------------

FINISHED = (
    "DagRun Finished: dag_id=my_nightly, logical_date=2026-11-26 09:39:18.147599+00:00, "
    "run_id=manual__2026-11-26T09:39:27.790928+00:00, run_start_date=2026-11-26 09:39:18.147599+00:00, "
    "run_end_date=2026-11-26 09:44:41.855384+00:00, run_duration=323.707785, state=success, run_type=manual"
)


def test_finding_7_the_summary_shows_airflows_run_duration_and_names_the_wall_time() -> None:
    outcome = parse_dags_test_log(f"2026-11-26T09:44:41.855Z [info] {FINISHED}\n", "my_nightly")
    assert outcome.state == "success" and outcome.run_duration_s == pytest.approx(323.707785)
    text = durations_text(outcome.run_duration_s, 414.2)
    assert text == "Airflow run duration 324 s; 414 s wall time of `dags test`, parse and start-up included"
    assert durations_text(None, 414.2) == "414 s wall time of `dags test`, parse and start-up included"


# --- finding 8: the report's footer says which figures are estimated, simulated or measured ----------------------


def test_finding_8_the_footer_says_exactly_which_figures_are_estimated() -> None:
    notes = which_figures(sorted(TRIAL_ROWS, key=time_order))
    text = " ".join(notes)
    assert "not every figure" not in text
    assert notes[0] == "energy: estimated for all runs (a power model, not a hardware reading; CPU only, no GPU energy)"
    assert "CO2e: that energy × the replayed grid intensity" in text and "not measured either" in text
    assert "saved: vs a predicted baseline" in text and "never measured" in text
    mixed = [replace(TRIAL_ROWS[0], energy_labels="measured", energy_gpu_j=5.0), *TRIAL_ROWS[1:]]
    first = which_figures(mixed)[0]
    assert "estimated for runs 2, 3" in first and "measured for run 1 (read from hardware counters)" in first
