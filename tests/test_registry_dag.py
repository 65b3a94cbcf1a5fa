"""The registry-generated nightly DAG is built at parse time from the spec files: mapped tasks per job and
per GPU group, a budgeted pair profiler, and a bad file reported as an import error naming file and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# a read of the run's params or conf: context["params"], dag_run.conf (not plan.config, not a conf_ word)
TRIGGER_READ = re.compile(r"""["']params["']|\.conf\b""")

REPO = Path(__file__).resolve().parents[1]
GOOD = "name: {name}\nworkload: digits_cnn\nepochs: 1\nregion: GB\n"


def _bag(monkeypatch: pytest.MonkeyPatch, registry: Path, airflow_db: Path):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CARBONFLOW_JOBS_DIR", str(registry))
    return DagBag(dag_folder=str(REPO / "dags" / "nightly_registry.py"))


def test_every_spec_file_joins_the_night_as_mapped_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / f"{name}.yaml").write_text(GOOD.format(name=name))
    bag = _bag(monkeypatch, tmp_path, airflow_db)
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("nightly_registry")
    profile, train, pairs = dag.get_task("profile"), dag.get_task("train"), dag.get_task("profile_pairs")
    assert [j["name"] for j in profile.expand_input.value["job"]] == ["alpha", "beta", "gamma"]
    assert profile.map_index_template and train.map_index_template
    assert sorted(pairs.jobs) == ["alpha", "beta", "gamma"] and pairs.profile_task_ids == "profile"
    assert pairs.max_pairs is not None  # pair profiling keeps to a budget


def test_a_bad_spec_file_is_an_import_error_naming_the_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    (tmp_path / "ok.yaml").write_text(GOOD.format(name="ok"))
    (tmp_path / "broken.yaml").write_text(GOOD.format(name="broken").replace("epochs: 1", "epochs: -3"))
    bag = _bag(monkeypatch, tmp_path, airflow_db)
    [error] = bag.import_errors.values()
    assert "broken.yaml" in error and "epochs" in error and "-3" in error


def test_an_empty_registry_parses_to_an_empty_night(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    bag = _bag(monkeypatch, tmp_path, airflow_db)
    assert not bag.import_errors
    assert bag.get_dag("nightly_registry").task_ids == []


def test_a_trigger_can_change_nothing_in_the_registry_night(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    """Issue 21: every carbonflow DAG that reads a trigger's conf checks it in a validate task. nightly_registry has
    no validate task, so it must read nothing from a trigger: no Params form, no task templated on params or
    dag_run, and no carbonflow operator but ValidateJobsOperator reads the run's params or conf."""
    (tmp_path / "alpha.yaml").write_text(GOOD.format(name="alpha"))
    dag = _bag(monkeypatch, tmp_path, airflow_db).get_dag("nightly_registry")
    assert not dag.params
    for task in dag.tasks:
        fields = [getattr(task, "partial_kwargs", {}), getattr(task, "expand_input", None)]
        fields += [getattr(task, name, None) for name in task.template_fields]
        assert not [f for f in map(repr, fields) if "params" in f or "dag_run" in f], task.task_id
    readers = [
        path.name
        for path in (REPO / "carbonflow" / "operators").glob("*.py")
        if path.name != "params.py" and TRIGGER_READ.search(path.read_text())
    ]
    assert not readers, f"these operators read a trigger's params or conf without the validate task: {readers}"
