"""Issue 25 finding: the report PNG listed runs newest first, with identical labels ("03-15 02:00 c1-pl250"), so
nights could not be told apart, and its accuracy axis ran past 1.0. Two on-demand nights replaying the same date
are logged to a real (embedded) MLflow store and reported."""

from __future__ import annotations

from pathlib import Path

import pytest
import tracking_factories as f

from carbonflow.tracking import schema
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.report import accuracy_ylim, build_report, render_energy_accuracy_png, run_labels


@pytest.fixture
def two_replayed_nights(home: Path) -> list[str]:
    """Night 1 then night 2: the same replayed start, no recurrence (REST-triggered), accuracies 0.97 and 0.99."""
    run_ids = []
    for accuracy in (0.97, 0.99):
        outcome = log_training_run(f.job_spec(), f.plan(), f.result(accuracy=accuracy),
                                   provenance={schema.T_RUN_KIND: "on_demand"})  # fmt: skip
        run_ids.append(outcome.run_id)
    return run_ids


def _axes_of(monkeypatch: pytest.MonkeyPatch) -> list:
    from matplotlib.figure import Figure

    seen: list = []
    original = Figure.savefig

    def capture(fig: Figure, *args: object, **kwargs: object) -> None:
        seen.extend(fig.axes)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    return seen


def test_report_png_lists_runs_in_time_order_with_distinct_labels_and_accuracy_axes_stop_at_1(
    two_replayed_nights: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    axes = _axes_of(monkeypatch)
    report = build_report("digits", png_path=tmp_path / "r.png")
    assert [r.run_id for r in report.rows] == two_replayed_nights  # oldest first
    assert report.rows[0].started_at == report.rows[1].started_at  # the same replayed start...
    labels = [t.get_text() for t in axes[0].get_xticklabels()]
    assert len(set(labels)) == 2, labels  # ...yet two labels
    for i, (label, run_id) in enumerate(zip(labels, two_replayed_nights, strict=True)):
        ran, date, config, run = label.splitlines()  # the night, when it ran (wall clock), its replayed start, ...
        assert ran == f"{i + 1}: ran {report.rows[i].ran[5:]}"
        assert date == f"{report.rows[0].started_at[5:]} replay" and config == report.rows[0].config_key
        assert run == f"run {run_id[:6]}"
    accuracy = next(ax for ax in axes if ax.get_title() == "test_accuracy")
    assert accuracy.get_ylim()[1] == 1.0
    axes.clear()
    render_energy_accuracy_png(report, tmp_path / "ea.png")
    assert axes[0].get_ylim()[1] == 1.0


def test_run_labels_use_the_recurrence_when_there_is_one_and_stay_distinct() -> None:
    from dataclasses import replace

    rows = [f_row(i) for i in range(3)]
    assert [label.splitlines()[-1] for label in run_labels(rows)] == ["#1", "#2", "#3"]
    same = [replace(rows[0], recurrence=None, run_id=None)] * 2
    assert len(set(run_labels(same))) == 2


def f_row(i: int):  # type: ignore[no-untyped-def]
    from carbonflow.tracking.report import ReportRow

    return ReportRow(recurrence=i + 1, run_id=f"{i}" * 32, started_at="2023-03-15 02:00", config_key="c1-pl250",
                     containers=1, power_limit_w=250.0, batch_size=None, colocated_with="-", duration_s=1,
                     energy_total_j=1, emissions_g=1, emissions_run_now_default_g=None, saving_g=None,
                     saving_fraction=None, test_accuracy=0.99, energy_labels="measured", replay=True,
                     predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1)  # fmt: skip


def test_accuracy_ylim_stops_at_1_and_never_below_0() -> None:
    assert accuracy_ylim([0.97, 0.99]) == (pytest.approx(0.92), 1.0)
    assert accuracy_ylim([None, 0.01]) == (0.0, 1.0)
    assert accuracy_ylim([]) == (0.0, 1.0)
