"""``carbonflow plan JOB_FILE`` (finding: there was no way to plan a job without hand-writing a Plan): it plans
from a profile and the **replayed** NESO GB forecast and prints the chosen configuration, start and why."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carbonflow.cli import app
from carbonflow.domain import Config, Profile, ProfilePoint

JOB = "name: plan-me\nworkload: digits_cnn\nepochs: 2\nregion: GB\nobjective: carbon\nmax_slowdown: 0.2\n"


def _profile_file(tmp_path: Path) -> Path:
    def point(w: float) -> ProfilePoint:
        speed = 100 * (w / 250) ** 0.3
        return ProfilePoint(config=Config(containers=1, power_limit_w=w), throughput_samples_per_s=speed,
                            power_per_device_w={"gpu": 0.9 * w}, energy_per_sample_j=0.9 * w / speed,
                            duration_s=10, samples=1000, label="simulated")  # fmt: skip

    points = [point(w) for w in (250, 200, 150)]
    profile = Profile(job="plan-me", device_model="Tesla V100 (simulated)", device_kind="gpu", label="simulated",
                      default_power_limit_w=250, max_power_w=250, samples_per_epoch=1437, points=points)  # fmt: skip
    path = tmp_path / "profile.json"
    path.write_text(profile.model_dump_json())
    return path


def test_plan_prints_the_choice_and_why_from_a_profile_and_the_replayed_forecast(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))],
                              terminal_width=160)  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "replayed NESO GB" in done.output and "chosen" in done.output and "why:" in done.output
    assert "start now at default" in done.output and "objective carbon" in done.output


def test_plan_without_any_profile_says_what_to_do(tmp_path: Path, monkeypatch) -> None:
    from carbonflow.tracking.store import client_for

    store = tmp_path / "empty.db"
    client_for(f"sqlite:///{store}").search_experiments()  # a store that exists, without any profile
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    (tmp_path / "job.yaml").write_text(JOB)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml")], terminal_width=160)
    assert done.exit_code == 1 and "has no profile in MLflow yet" in done.output
    assert str(store) in " ".join(done.output.split()).replace(" ", "")  # it names the store it read
    bad = CliRunner().invoke(app, ["plan", str(tmp_path / "missing.yaml")])
    assert bad.exit_code == 2 and "missing.yaml" in bad.output  # bad input: exit 2, as every command (issue 25)


def _lines(output: str) -> list[str]:
    return output.splitlines()


def test_plan_checks_the_job_as_the_dags_validate_task_does_every_problem_on_its_own_line(
    tmp_path: Path, monkeypatch
) -> None:
    """Finding: `plan` checked less than the DAG's validate task: a CPU-only job's power_limit_w 1500 and a
    working_dir that does not exist were accepted (rc 0); region GBB and a past finish-by ended in tracebacks.
    Now: the DAG's own checks (carbonflow.validation), each problem on its own line, exit code 2."""
    from carbonflow.operators.params import RequestError, validate_job

    monkeypatch.delenv("COLUMNS", raising=False)
    job = {"name": "plan-me", "command": ["python", "train.py"], "working_dir": "nowhere", "steps": 10,
           "device_kind": "cpu", "region": "GBB", "power_limit_w": 1500,
           "finish_by": "2020-01-01T00:00:00Z"}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.json"), "--profile", str(_profile_file(tmp_path))])
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.output and isinstance(done.exception, SystemExit)
    with pytest.raises(RequestError) as dag_says:  # what the DAG's validate task says about the same job
        validate_job(job)
    flat = " ".join(done.output.split())
    for problem in ("finish_by=2020-01-01T00:00:00+00:00 is in the past", "region='GBB' is not a known region",
                    "power_limit_w=1500 is set but job 'plan-me' has no GPU", "working_dir="):  # fmt: skip
        assert problem in flat, done.output
    for problem in str(dag_says.value).split("; "):
        if problem.startswith(("finish_by=", "region=", "power_limit_w=")):
            assert problem.split(" give ")[0].split(" allowed")[0] in flat
    starts = [line for line in _lines(done.output) if line.startswith("  - ")]
    assert len(starts) == 4, done.output  # one line (and its continuation) per problem
    assert max(len(line) for line in _lines(done.output)) <= 100


def test_plan_lists_schema_problems_one_per_line_without_dumping_the_job(tmp_path: Path) -> None:
    bad = ("name: x\ncommand: [python, t.py]\nregion: GB\nsteps: -5\nobjective: carbn\n"
           "env: {CUDA_VISIBLE_DEVICES: '1'}\n")  # fmt: skip
    (tmp_path / "bad.yaml").write_text(bad)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "bad.yaml")])
    assert done.exit_code == 2, done.output
    starts = [line for line in _lines(done.output) if line.startswith("  - ")]
    fields = [line.split(":")[0].split("=")[0] for line in starts]  # a field is named once: steps=-5, env: ...
    assert fields == ["  - steps", "  - objective", "  - env"], done.output
    epochs = "name: y\ncommand: [python, t.py]\nregion: GB\nepochs: 8\n"  # no samples_per_epoch
    (tmp_path / "epochs.yaml").write_text(epochs)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "epochs.yaml")])
    assert done.exit_code == 2 and "samples_per_epoch" in done.output
    assert "'command': [" not in done.output  # the whole job is not repeated back


def test_plan_checks_finish_by_on_the_wall_clock_as_the_dag_does(tmp_path: Path) -> None:
    """Before: finish_by 2023-03-15T06:00Z (past on the wall clock) was compared with the replay clock and
    accepted; the DAG refuses it. Replay and wall clocks are not mixed: checked on the wall clock, then moved."""
    (tmp_path / "job.yaml").write_text(JOB + "finish_by: '2023-03-15T06:00:00Z'\n")
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))])
    assert done.exit_code == 2 and "is in the past" in done.output, done.output
    later = (datetime.now(UTC) + timedelta(hours=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "job.yaml").write_text(JOB + f"finish_by: '{later}'\n")
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))])
    assert done.exit_code == 0, done.output
    assert "finish by 2023-03-1" in done.output  # the wall-clock finish-by, moved onto the replayed clock


def test_a_region_the_replay_has_no_data_for_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB.replace("region: GB", "region: DE"))
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))])
    assert done.exit_code == 2, done.output
    assert "region='DE'" in done.output and "--live" in done.output and "Traceback" not in done.output


def test_plan_from_another_folder_names_the_missing_store_and_creates_nothing(tmp_path: Path, monkeypatch) -> None:
    """Finding: from another folder `plan` created ./.carbonflow/mlflow.db, printed MLflow's INFO lines and said
    'no profile in MLflow yet' without naming the store. Now it behaves as `report` does."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CARBONFLOW_HOME", raising=False)
    (tmp_path / "job.yaml").write_text(JOB)
    done = CliRunner().invoke(app, ["plan", "job.yaml"])
    assert done.exit_code == 1, done.output
    flat = " ".join(done.output.split())
    assert "no MLflow store at" in flat and "--tracking-uri" in flat and "INFO" not in done.output
    assert not (tmp_path / ".carbonflow").exists()
    profiled = CliRunner().invoke(app, ["plan", "job.yaml", "--profile", str(_profile_file(tmp_path))])
    assert profiled.exit_code == 0, profiled.output
    assert "planned from the profile alone" in profiled.output
    assert not (tmp_path / ".carbonflow").exists()


def test_plan_output_has_units_in_headers_and_fits_100_columns_when_piped(tmp_path: Path, monkeypatch) -> None:
    """Finding: header 'energy' with '117 J' in cells; a 175-character 'why:' line."""
    monkeypatch.delenv("COLUMNS", raising=False)
    (tmp_path / "job.yaml").write_text(JOB)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))])
    assert done.exit_code == 0, done.output
    assert re.search(r"energy \((J|kJ|MJ)\)", done.output) and re.search(r"CO2e \((mg|g|kg|t)\)", done.output)
    assert "time (s)" in done.output
    rows = [line for line in _lines(done.output) if line.startswith("│ chosen")]
    assert rows and not re.search(r"\d (J|kJ|MJ|g) ", rows[0]), rows  # numbers in cells, units in the header
    assert max(len(line) for line in _lines(done.output)) <= 100
    assert any(line.startswith("why: ") for line in _lines(done.output))


def test_plan_says_when_the_profile_is_of_another_code_version(tmp_path: Path) -> None:
    """User trial: with code_version "2" `plan` used the version-1 profile without saying so."""
    (tmp_path / "job.yaml").write_text(JOB + "code_version: '2'\n")
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))],
                              terminal_width=100)  # fmt: skip
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "the newest profile is of code version 1, the job is at 2" in text
    assert "[yellow]" not in done.output and "[/]" not in done.output, "second user trial: raw markup was printed"
    (tmp_path / "job.yaml").write_text(JOB)
    same = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml"), "--profile", str(_profile_file(tmp_path))])
    assert "code version" not in same.output


def test_a_schema_problem_does_not_hide_the_unknown_region_or_past_finish_by(tmp_path: Path) -> None:
    """User trial: `plan` (and the DAG's validate task) reported a typo'd key alone, and the unknown region only
    on the next try; the request checks that need one field now run beside the schema's."""
    from carbonflow.operators.params import RequestError, validate_job

    bad = (
        JOB.replace("region: GB", "region: GBB").replace("epochs: 2", "epochz: 2") + "finish_by: '2020-01-01T00:00Z'\n"
    )
    (tmp_path / "bad.yaml").write_text(bad)
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "bad.yaml")])
    assert done.exit_code == 2, done.output
    flat = " ".join(done.output.split())
    for problem in ("epochz: unknown field", "region='GBB' is not a known region", "finish_by=2020-01-01T00:00:00"):
        assert problem in flat, done.output
    (tmp_path / "twice.yaml").write_text(bad.replace("objective: carbon", "objective: carbon\nobjective: energy"))
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "twice.yaml")])  # second trial: a repeat hid the rest
    flat = " ".join(done.output.split())
    assert done.exit_code == 2 and "(4 problems)" in flat, done.output
    assert "key 'objective' is given twice" in flat and "region='GBB'" in flat and "epochz" in flat
    (tmp_path / "only-twice.yaml").write_text(JOB.replace("region: GB", "region: GBB") + "epochs: 3\n")
    done = CliRunner().invoke(app, ["plan", str(tmp_path / "only-twice.yaml")])  # schema-valid but for the repeat
    flat = " ".join(done.output.split())
    assert "key 'epochs' is given twice" in flat and "region='GBB'" in flat, done.output
    with pytest.raises(RequestError) as dag_says:
        validate_job({"name": "x", "workload": "digits_cnn", "epochz": 2, "region": "GBB"})
    assert "epochz" in str(dag_says.value) and "region='GBB'" in str(dag_says.value)
    with pytest.raises(RequestError, match="invalid job"):
        validate_job("{not json")  # not JSON: the schema's message, no traceback from the extra checks
