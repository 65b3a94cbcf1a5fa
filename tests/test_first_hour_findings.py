"""Issue 25 ("A user's first hour"): findings whose regression test was missing where the user met them. Each test
is named after its finding; the findings that already had one are listed in the issue's closing note."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carbonflow.cli import app

ROOT = Path(__file__).resolve().parents[1]
JOB = "name: x\ncommand: [python, train.py]\nsteps: 10\nregion: GB\n"


def _plan(args: list[str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["plan", *args], terminal_width=200)


def test_a_missing_working_dir_error_shows_the_path_it_resolved_in_carbonflow_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``carbonflow plan job.yaml`` run from the job's folder (a relative file name, as users type it) said
    ``working_dir='nope' ... is not a directory here``: the path as given, not where it looked."""
    monkeypatch.chdir(tmp_path)
    Path("job.yaml").write_text(JOB + "working_dir: nope\n")
    done = _plan(["job.yaml"])
    assert done.exit_code != 0
    assert f"working_dir='{tmp_path / 'nope'}'" in " ".join(done.output.split()), done.output
    assert "working_dir='nope'" not in done.output


def test_a_relative_job_file_resolves_working_dir_against_its_own_folder_not_the_shell_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same file named from another folder: its ``working_dir`` is beside the file wherever the shell is."""
    from carbonflow.registry import load_job_file

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text(JOB + "working_dir: ../project\n")
    monkeypatch.chdir(tmp_path)
    assert load_job_file(Path("jobs/job.yaml")).working_dir == str(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "jobs")
    assert load_job_file(Path("job.yaml")).working_dir == str(tmp_path / "project")


@pytest.mark.parametrize("page", ["getting-started.md", "own-job.md"])
def test_energy_md_and_own_job_md_disagree_on_what_happens_without_a_gpu_each_page_links_the_one_account(
    page: str,
) -> None:
    """The two first-hour pages each say "no GPU" somewhere; they link to energy.md's one account instead of
    giving their own (the rule for every page is tests/project/test_docs_without_a_gpu.py)."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert re.search(r"\bno GPU\b|\bwithout a GPU\b", text, re.IGNORECASE), page
    assert "energy.md#without-a-gpu" in text, page
    energy = (ROOT / "docs" / "energy.md").read_text(encoding="utf-8")
    assert energy.count("## Without a GPU") == 1


def test_carbonflow_demo_runs_from_any_folder_of_an_editable_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Getting started's commands run from a new folder: ``carbonflow demo`` found ``./dags`` only in the checkout
    ("run from the repository or set CARBONFLOW_DAGS_FOLDER"); it now falls back to the checkout it is installed
    from, and an explicit ``CARBONFLOW_DAGS_FOLDER`` is still obeyed."""
    from carbonflow.demo import DAG_ID, find_dags_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CARBONFLOW_DAGS_FOLDER", raising=False)
    assert find_dags_folder() == ROOT / "dags"
    assert (find_dags_folder() / f"{DAG_ID}.py").is_file()
    monkeypatch.setenv("CARBONFLOW_DAGS_FOLDER", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="set CARBONFLOW_DAGS_FOLDER"):
        find_dags_folder()
