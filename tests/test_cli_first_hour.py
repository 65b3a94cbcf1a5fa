"""Issue 25 ("A user's first hour"), the command-line findings: each test is named after one."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carbonflow.cli import EXIT_BAD_FILE, app, package_version
from carbonflow.domain import Config, Plan

GOOD_YAML = "name: first-hour\nworkload: digits_cnn\nepochs: 1\nregion: GB\n"


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args, terminal_width=200)


def _assert_one_line_refusal(done, *words: str) -> None:
    assert done.exit_code == EXIT_BAD_FILE, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    assert "Traceback" not in done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1, done.output
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [\n", ["bad.yaml", "not readable as YAML"]),
        ("name: x\nepochz: 2\nregion: GB\nworkload: digits_cnn\n", ["epochz", "did you mean 'epochs'"]),
        ("- just\n- a list\n", ["not one JobSpec"]),
    ],
)
def test_profile_refuses_a_bad_job_file_in_one_line_never_a_traceback(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    _assert_one_line_refusal(_invoke(["profile", str(tmp_path / "bad.yaml")]), *words)


def test_profile_refuses_a_missing_job_file_in_one_line(tmp_path: Path) -> None:
    _assert_one_line_refusal(_invoke(["profile", str(tmp_path / "nope.yaml")]), "nope.yaml", "not a readable file")


def test_profile_accepts_the_yaml_job_that_plan_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding: ``profile job.yaml`` said "Invalid JSON" where ``plan job.yaml`` read the same file."""
    import carbonflow.profiling.profiler as profiler

    seen: list[str] = []

    def fake_profile_job(spec, *args, **kwargs):  # the sweep itself is tested in tests/profiling
        seen.append(spec.name)
        raise SystemExit(0)

    monkeypatch.setattr(profiler, "profile_job", fake_profile_job)
    (tmp_path / "job.yaml").write_text(GOOD_YAML)
    done = _invoke(["profile", str(tmp_path / "job.yaml"), "--workdir", str(tmp_path / "runs")])
    assert seen == ["first-hour"], done.output


def _plan_file(tmp_path: Path) -> Path:
    start = datetime(2023, 3, 15, 2, tzinfo=UTC)
    plan = Plan(job="first-hour", config=Config(containers=1, power_limit_w=None), start=start,
                predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
                forecast_provider="static", reason="test")  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def test_run_refuses_a_bad_job_file_in_one_line_never_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: x\nepochz: 2\n")
    done = _invoke(["run", "--job", str(tmp_path / "job.yaml"), "--plan", str(_plan_file(tmp_path)),
                    "--result", str(tmp_path / "r.json"), "--", "true"])  # fmt: skip
    _assert_one_line_refusal(done, "--job", "epochz")


def test_run_refuses_a_bad_plan_file_in_one_line_never_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(GOOD_YAML)
    (tmp_path / "plan.json").write_text('{"job": "first-hour"}')
    done = _invoke(["run", "--job", str(tmp_path / "job.yaml"), "--plan", str(tmp_path / "plan.json"),
                    "--result", str(tmp_path / "r.json"), "--", "true"])  # fmt: skip
    _assert_one_line_refusal(done, "--plan", "not a valid Plan JSON")


def test_run_accepts_the_yaml_job_that_plan_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import carbonflow.execution.wrapper as wrapper

    read: list[str] = []

    def fake_main(job_path: Path, *args, **kwargs) -> int:  # the wrapper reads JSON
        from carbonflow.domain import JobSpec

        read.append(JobSpec.model_validate_json(Path(job_path).read_text()).name)
        return 0

    monkeypatch.setattr(wrapper, "main_from_files", fake_main)
    (tmp_path / "job.yaml").write_text(GOOD_YAML)
    done = _invoke(["run", "--job", str(tmp_path / "job.yaml"), "--plan", str(_plan_file(tmp_path)),
                    "--result", str(tmp_path / "out" / "r.json"), "--", "true"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert read == ["first-hour"]


def test_there_is_no_version_option_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    done = _invoke(["--version"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"carbonflow {version('carbonflow')}"
    assert package_version() == version("carbonflow")


def test_profile_of_a_training_that_fails_says_why_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import carbonflow.profiling.profiler as profiler

    def failing(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise profiler.ProfilingError("profiling first-hour: the training failed (exit code 1); its log: /x/log")

    monkeypatch.setattr(profiler, "profile_job", failing)
    (tmp_path / "job.yaml").write_text(GOOD_YAML)
    done = _invoke(["profile", str(tmp_path / "job.yaml"), "--workdir", str(tmp_path / "runs")])
    assert done.exit_code == 1, done.output
    assert "Traceback" not in done.output and "error: profiling first-hour: the training failed" in done.output


def test_profile_reads_a_relative_job_file_with_a_relative_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``carbonflow profile job.yaml`` from the job's folder: its ``working_dir: .`` is that folder, not ``.``."""
    import carbonflow.profiling.profiler as profiler

    seen: list[str | None] = []

    def fake_profile_job(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(spec.working_dir)
        raise SystemExit(0)

    monkeypatch.setattr(profiler, "profile_job", fake_profile_job)
    monkeypatch.chdir(tmp_path)
    Path("job.yaml").write_text(GOOD_YAML + "command: [python, train.py]\nworking_dir: .\nsteps: 10\n")
    _invoke(["profile", "job.yaml", "--workdir", str(tmp_path / "runs")])
    assert seen == [str(tmp_path)]
