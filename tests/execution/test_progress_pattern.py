"""Progress from the script's own output (issue 25): a job's ``progress_pattern`` turns the lines an unchanged
script prints into progress reports.

Finding: an unchanged script that prints ``epoch 3/30 loss 0.41 val_acc 0.88`` could not run through a DAG, not
even with ``observe_only``: profiling needs progress reports, and the user had to write a 20-line wrapper.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.local import LocalBackend
from carbonflow.execution.printed_lines import PatternProgress
from carbonflow.profiling.profiler import ProfilingError, profile_job
from carbonflow.progress_pattern import (
    MAX_LINE_CHARS,
    MAX_PATTERN_CHARS,
    UNMATCHED_NOTE,
    LineMatcher,
    check_progress_pattern,
)

PRINT_PATTERN = r"epoch (?P<epoch>\d+)/\d+ loss (?P<loss>[\d.]+) val_acc (?P<accuracy>[\d.]+)"
KERAS_PATTERN = r"Epoch (?P<epoch>\d+)/\d+ .*loss: (?P<loss>[\d.]+) - accuracy: (?P<accuracy>[\d.]+)"
KERAS_V2_PATTERN = r"^\d+/\d+ - .*loss: (?P<loss>[\d.]+) - accuracy: (?P<accuracy>[\d.]+)"
LIGHTNING_PATTERN = r"Epoch (?P<epoch>\d+): 100%.*train_loss=(?P<loss>[\d.]+).*val_acc=(?P<accuracy>[\d.]+)"

# An unchanged script: no carbonflow import; one line per epoch, its own work from its arguments.
PRINT_SCRIPT = r"""
import sys, time
epochs = int(sys.argv[1])
print("loading data")
for e in range(1, epochs + 1):
    time.sleep(0.15)
    print(f"epoch {e}/{epochs} loss {1 / e:.4f} val_acc {0.5 + e / 100:.4f}")  # no flush: as scripts are
print("done")
"""

# A Lightning-shaped progress bar on stderr: redrawn with \r, the 100 % bar of each epoch carries val_acc.
LIGHTNING_SCRIPT = r"""
import sys, time
epochs = int(sys.argv[1])
for e in range(epochs):
    for pct, done in ((0, 0), (50, 4), (100, 8)):
        time.sleep(0.05)
        bar = f"Epoch {e}: {pct:3d}%|#####| {done}/8 [00:00<00:00, 99.0it/s, v_num=0, train_loss=0.{9 - e}"
        sys.stderr.write("\r" + bar + "]")
        sys.stderr.flush()
    sys.stderr.write("\r" + bar + f", val_acc=0.{80 + e}]")
    sys.stderr.flush()
sys.stderr.write("\n")
"""


def _plan(spec: JobSpec) -> Plan:
    return Plan(
        job=spec.name, config=Config(containers=1), start=datetime.now(UTC), predicted_duration_s=1,
        predicted_energy_j=1, predicted_emissions_g=1, region="GB", forecast_provider="test", reason="test",
    )  # fmt: skip


def _job(tmp_path: Path, script: str, **kw: object) -> JobSpec:
    (tmp_path / "train.py").write_text(script)
    fields: dict[str, object] = dict(
        name="unchanged", command=["python", "train.py", "{epochs}"], working_dir=str(tmp_path), epochs=6,
        samples_per_epoch=1000, batch_size=50, region="GB", device_kind="cpu", progress_pattern=PRINT_PATTERN,
    )  # fmt: skip
    fields.update(kw)
    return JobSpec(**fields)  # type: ignore[arg-type]


# --- validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"epoch (\d+)/\d+", "has no named group"),
        (r"epoch (?P<epoch>\d+) acc (?P<acc>[\d.]+)", "group(s) acc"),
        (r"epoch (?P<epoch>\d+", "not a valid regular expression: missing ) at position 19"),
        ("(?P<epoch>x)" + "y" * MAX_PATTERN_CHARS, f"allowed: at most {MAX_PATTERN_CHARS}"),
    ],
)
def test_a_bad_progress_pattern_is_refused_at_validation_with_its_reason(tmp_path, pattern, reason):
    with pytest.raises(ValidationError) as info:
        _job(tmp_path, PRINT_SCRIPT, progress_pattern=pattern)
    message = str(info.value)
    assert "progress_pattern=" in message and reason in message
    assert "epoch, epochs, step, samples, loss, accuracy" in message or "at most" in message


def test_an_epoch_counting_pattern_needs_samples_per_epoch(tmp_path):
    with pytest.raises(ValidationError, match="set samples_per_epoch"):
        _job(tmp_path, PRINT_SCRIPT, epochs=None, steps=100, samples_per_epoch=None)
    _job(tmp_path, PRINT_SCRIPT, epochs=None, steps=100, samples_per_epoch=None,
         progress_pattern=r"step (?P<step>\d+)")  # fmt: skip


def test_the_job_reference_documents_the_field(tmp_path):
    from carbonflow.registry import job_fields_markdown

    assert "`progress_pattern`" in job_fields_markdown()


# --- the line matcher ----------------------------------------------------------------------------------------


def test_print_shape_lines_count_epochs_with_the_jobs_samples_per_epoch():
    matcher = LineMatcher(PRINT_PATTERN, batch_size=50, samples_per_epoch=1000)
    assert matcher.match("loading data") is None
    first = matcher.match("epoch 1/30 loss 0.9100 val_acc 0.51")
    third = matcher.match("epoch 3/30 loss 0.41 val_acc 0.88")
    assert first == {"step": 1, "samples": 1000, "metrics": {"loss": 0.91}}
    assert third == {"step": 2, "samples": 2000, "metrics": {"loss": 0.41}}  # epochs seen, not as printed
    assert matcher.accuracy == 0.88 and matcher.matched == 2


def test_keras_shape_lines_match_on_one_line_and_in_verbose_2():
    matcher = LineMatcher(KERAS_PATTERN, batch_size=32, samples_per_epoch=320)
    line = "Epoch 3/30 10/10 [==============================] - 0s 2ms/step - loss: 0.4100 - accuracy: 0.8800"
    assert matcher.match(line) == {"step": 1, "samples": 320, "metrics": {"loss": 0.41}}
    assert matcher.accuracy == 0.88
    # verbose=2 prints "Epoch 3/30" on its own line, the metrics below: match the metrics line (one epoch each)
    v2 = LineMatcher(KERAS_V2_PATTERN, batch_size=32, samples_per_epoch=320)
    assert v2.match("Epoch 1/30") is None
    assert v2.match("10/10 - 0s - loss: 0.5000 - accuracy: 0.7000 - 31ms/epoch - 3ms/step")["step"] == 1
    assert v2.match("10/10 - 0s - loss: 0.4000 - accuracy: 0.8000 - 30ms/epoch - 3ms/step")["samples"] == 640
    assert v2.accuracy == 0.8


def test_lightning_bars_count_each_epoch_once_however_often_redrawn():
    matcher = LineMatcher(LIGHTNING_PATTERN, batch_size=8, samples_per_epoch=64)
    bar = "Epoch 0: 100%|██████████| 8/8 [00:00<00:00, 99.0it/s, v_num=0, train_loss=0.412, val_acc=0.875]"
    assert matcher.match("Epoch 0:  50%|█████     | 4/8 [00:00<00:00, 99.0it/s, v_num=0, train_loss=0.5]") is None
    assert matcher.match(bar)["step"] == 1
    assert matcher.match(bar)["step"] == 1  # the same epoch redrawn
    assert matcher.match(bar.replace("Epoch 0", "Epoch 1").replace("0.875", "0.9"))["samples"] == 128
    assert matcher.accuracy == 0.9


def test_step_and_samples_groups_are_taken_as_printed():
    by_step = LineMatcher(r"step (?P<step>\d+) loss (?P<loss>\S+)", batch_size=64)
    assert by_step.match("step 120 loss 0.3") == {"step": 120, "samples": 7680, "metrics": {"loss": 0.3}}
    by_samples = LineMatcher(r"seen (?P<samples>\d+)", batch_size=64)
    assert by_samples.match("seen 6400 images") == {"step": 100, "samples": 6400, "metrics": {}}
    assert by_step.match("step 121 loss nan-ish") is None  # a group that is no number makes no report


def test_a_long_line_is_searched_only_in_its_head():
    matcher = LineMatcher(r"epoch (?P<epoch>\d+)", batch_size=1, samples_per_epoch=1)
    assert matcher.match("x" * MAX_LINE_CHARS + "epoch 1") is None
    assert matcher.match("epoch 1" + "x" * 10 * MAX_LINE_CHARS) is not None


def test_check_progress_pattern_returns_the_compiled_pattern():
    assert check_progress_pattern(PRINT_PATTERN).groupindex.keys() == {"epoch", "loss", "accuracy"}
    assert LineMatcher(r"(?P<epoch>\d+)/(?P<epochs>\d+)", 1, 10).match("3/30") == {
        "step": 1,
        "samples": 10,
        "metrics": {},
    }


# --- reading a pipe -----------------------------------------------------------------------------------------


def test_the_reader_echoes_bytes_unchanged_and_splits_at_cr_and_lf(tmp_path):
    lines = PatternProgress(r"epoch (?P<epoch>\d+)", batch_size=1, samples_per_epoch=10)
    read_fd, write_fd = os.pipe()
    echo_path = tmp_path / "echo"
    long_line = b"y" * (5 * MAX_LINE_CHARS)
    data = b"start\repoch 1\r\nepoch 2\n" + long_line + b"\n\xff bad utf-8\nepoch 3"
    with open(read_fd, "rb", buffering=0) as pipe, echo_path.open("wb") as echo:
        lines.start([(pipe, echo)])
        writer = threading.Thread(target=lambda: (os.write(write_fd, data), os.close(write_fd)))
        writer.start()
        writer.join()
        lines.join()
    assert echo_path.read_bytes() == data
    assert [r["step"] for r in lines.drain()] == [1, 2, 3]
    assert lines.seen.count == 6 and all(len(line) <= 200 for line in lines.seen.last)
    assert lines.notes() == []


def test_a_catastrophically_backtracking_pattern_loses_lines_but_never_stalls_the_reader(tmp_path):
    """``(a|aa)+$`` on a line of a's ending in b backtracks exponentially: with ``re`` one such line held the GIL
    for minutes, the reader stopped draining the pipe and the training blocked on it. Now each search stops after
    MATCH_TIMEOUT_S, the line counts as unmatched, the note says why, and every byte is still echoed promptly."""
    from carbonflow.progress_pattern import MATCH_TIMEOUT_S

    lines = PatternProgress(r"(?P<epoch>(a|aa)+)$", batch_size=1, samples_per_epoch=10)
    read_fd, write_fd = os.pipe()
    echo_path = tmp_path / "echo"
    evil = b"a" * 60 + b"b\n"
    data = evil * 20 + b"aaa\n"
    started = time.monotonic()
    with open(read_fd, "rb", buffering=0) as pipe, echo_path.open("wb") as echo:
        lines.start([(pipe, echo)])
        writer = threading.Thread(target=lambda: (os.write(write_fd, data), os.close(write_fd)))
        writer.start()
        writer.join(timeout=5)
        assert not writer.is_alive(), "the writer blocked: the reader stopped draining the pipe"
        lines.join()
    assert time.monotonic() - started < 20 * MATCH_TIMEOUT_S * 4 + 5
    assert echo_path.read_bytes() == data
    assert lines.matcher.timed_out == 20
    assert [r["step"] for r in lines.drain()] == [1]
    assert any("backtracks too much" in note and "20 printed line(s)" in note for note in lines.notes())


# --- through the wrapper --------------------------------------------------------------------------------------


def test_an_unchanged_script_is_trained_with_its_printed_accuracy_and_its_log_intact(tmp_path):
    spec = _job(tmp_path, PRINT_SCRIPT)
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), trace=False)
    assert run.exit_code == 0, run.notes
    assert run.steps == 6 and run.samples == 6000
    assert run.metrics == {"loss": pytest.approx(1 / 6, abs=1e-4), "test_accuracy": 0.56}
    log = (tmp_path / "runs" / "train" / "training.log").read_text()
    assert "loading data\nepoch 1/6 loss 1.0000 val_acc 0.5100\n" in log and "\ndone\n" in log
    assert log.rstrip().splitlines()[-1].startswith("CARBONFLOW_RESULT")  # the result line stays last


def test_the_scripts_own_reports_still_count_and_its_own_accuracy_wins(tmp_path):
    own = (
        "import json, os\n"
        "print('epoch 1/1 loss 0.5 val_acc 0.5', flush=True)\n"
        "with open(os.environ['CARBONFLOW_PROGRESS_FILE'], 'a') as f:\n"
        "    f.write(json.dumps({'step': 7, 'samples': 70, 'metrics': {'test_accuracy': 0.99}}) + '\\n')\n"
    )
    spec = _job(tmp_path, own)
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), trace=False)
    assert run.exit_code == 0
    assert run.metrics["test_accuracy"] == 0.99 and run.steps == 7 and run.samples == 70


def test_an_unchanged_script_is_profiled_and_stopped_once_measured(tmp_path):
    spec = _job(tmp_path, PRINT_SCRIPT, epochs=40, profile_steps=3, profile_warmup_steps=1,
                profile_min_window_s=0.2)  # fmt: skip
    profile = profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    (point,) = profile.points
    assert point.samples == 3000 and point.throughput_samples_per_s == pytest.approx(1000 / 0.15, rel=0.5)
    log = next((tmp_path / "runs").glob("profile-c1*/training.log")).read_text()
    assert "epoch 6/40" in log and "epoch 40/40" not in log  # stopped once measured, not trained in full


def test_lightning_shaped_bars_on_stderr_are_progress(tmp_path):
    spec = _job(tmp_path, LIGHTNING_SCRIPT, epochs=4, samples_per_epoch=64, progress_pattern=LIGHTNING_PATTERN)
    run = LocalBackend(tmp_path / "runs").execute(spec, _plan(spec), trace=False)
    assert run.exit_code == 0
    assert run.steps == 4 and run.samples == 256 and run.metrics["test_accuracy"] == 0.83


def test_a_pattern_that_matches_nothing_in_the_first_profiling_window_shows_the_lines_it_saw(tmp_path):
    spec = _job(tmp_path, PRINT_SCRIPT, epochs=3, progress_pattern=r"Epoch (?P<epoch>\d+) - acc (?P<accuracy>\S+)")
    with pytest.raises(ProfilingError) as info:
        profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    message = str(info.value)
    assert UNMATCHED_NOTE in message and "matched none of the 5 line(s)" in message
    assert "epoch 3/3 loss 0.3333 val_acc 0.5300" in message and "loading data" in message
    assert "progress_pattern='Epoch" in message


def test_the_docs_shapes_are_the_tested_patterns_and_match_their_example_lines():
    page = (Path(__file__).resolve().parents[2] / "docs" / "own-job.md").read_text()
    section = page.split("### Progress from the script's own output")[1].split("\n### ")[0]
    rows = re.findall(r"^\| (.*`.*) \| `([^`]+)` \|$", section, re.MULTILINE)
    assert len(rows) == 4
    for printed, pattern in rows:
        assert pattern in (PRINT_PATTERN, KERAS_PATTERN, KERAS_V2_PATTERN, LIGHTNING_PATTERN), pattern
        example = re.findall(r"`([^`]+)`", printed)[-1].replace(r"\|", "|")
        if not example.startswith("print("):
            assert LineMatcher(pattern, batch_size=1, samples_per_epoch=1).match(example) is not None, example


def test_a_matcher_that_falls_behind_drops_lines_instead_of_blocking_the_reader():
    from carbonflow.execution.printed_lines import QUEUED_LINES

    lines = PatternProgress(r"epoch (?P<epoch>\d+)", batch_size=1, samples_per_epoch=10)  # matcher not started
    for _ in range(QUEUED_LINES + 5):
        lines.on_line("epoch 1")  # returns at once: the reader never waits on the pattern
    assert lines.dropped == 5
    assert any("5 printed line(s) not searched" in note for note in lines.notes())


def test_a_job_with_a_progress_pattern_trains_alone(tmp_path):
    """A co-located (shared-GPU) run reads only progress files: such a job is never paired."""
    from carbonflow.operators.night import can_share

    printed = _job(tmp_path, PRINT_SCRIPT)
    other = _job(tmp_path, PRINT_SCRIPT, name="other", progress_pattern=None)
    assert "progress_pattern" in (can_share(printed, other) or "") and "progress_pattern" in (
        can_share(other, printed) or ""
    )
    assert can_share(other, other.model_copy(update={"name": "third"})) is None


def test_a_silent_job_is_told_it_could_give_a_progress_pattern(tmp_path):
    spec = _job(tmp_path, "print('trained without telling anyone')\n", progress_pattern=None)
    with pytest.raises(ProfilingError, match="give the job a progress_pattern"):
        profile_job(spec, LocalBackend(tmp_path / "runs"), [])


def test_a_script_shorter_than_the_profile_budget_keeps_its_last_printed_epoch(tmp_path):
    """The last line printed just before the script exits still counts in the window kept at exit (the readers
    are joined before that window is closed; the race this closes is too narrow to provoke here)."""
    spec = _job(tmp_path, PRINT_SCRIPT, epochs=4, profile_steps=30, profile_warmup_steps=0, profile_min_window_s=0)
    profile = profile_job(spec, LocalBackend(tmp_path / "runs"), [])
    (point,) = profile.points
    assert point.samples == 3000  # epoch 1 → epoch 4
