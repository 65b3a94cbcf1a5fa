"""The job registry: a folder of JobSpec files, validated with field-named errors, fast and offline."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from carbonflow.registry import RegistryError, load_registry, registry_dir

YAML_JOB = """\
name: my-mlp
command: [python, train.py, --epochs, "{epochs}"]
working_dir: project
epochs: 10
samples_per_epoch: 60000
region: GB
"""


def test_a_folder_of_yaml_and_json_jobs_loads_by_name(tmp_path):
    (tmp_path / "my-mlp.yaml").write_text(YAML_JOB)
    (tmp_path / "digits.json").write_text(json.dumps({"name": "digits", "workload": "digits_cnn", "epochs": 2,
                                                      "region": "DE"}))  # fmt: skip
    (tmp_path / "README.md").write_text("not a job")
    jobs = load_registry(tmp_path)
    assert list(jobs) == ["digits", "my-mlp"]
    assert jobs["my-mlp"].working_dir == str(tmp_path / "project")  # relative to the registry folder


def test_every_problem_is_reported_with_file_field_and_value(tmp_path):
    (tmp_path / "a.yaml").write_text(YAML_JOB.replace("epochs: 10", "epochs: -1"))
    (tmp_path / "b.yaml").write_text(YAML_JOB.replace("region: GB", "regoin: GB"))
    with pytest.raises(RegistryError) as info:
        load_registry(tmp_path)
    text = str(info.value)
    assert "a.yaml: epochs=-1 is not allowed" in text  # the field is named once (user trial: twice)
    assert "b.yaml: regoin: unknown field; did you mean 'region'?" in text  # unknown keys are refused, not ignored


@pytest.mark.parametrize(("name", "text"), [
    ("twice.yaml", YAML_JOB + "epochs: 3\n"),
    ("twice.json", '{"name": "digits", "workload": "digits_cnn", "epochs": 2, "epochs": 9}'),
])  # fmt: skip
def test_a_field_given_twice_in_one_file_is_refused_not_last_one_wins(tmp_path, name, text):
    """User trial: a second ``epochs:`` in a job file silently replaced the first."""
    (tmp_path / name).write_text(text)
    with pytest.raises(RegistryError, match=rf"{name}: .*key 'epochs' is given twice; give each field once") as info:
        load_registry(tmp_path)
    assert name.endswith(".json") or "line 7: key 'epochs'" in str(info.value)  # YAML: the line of the repeat
    typo = text.replace("{", '{"regoin": "GB", ', 1) if name.endswith(".json") else text.replace("region:", "regoin:")
    (tmp_path / name).write_text(typo)
    with pytest.raises(RegistryError) as info:
        load_registry(tmp_path)
    assert "given twice" in str(info.value) and "regoin: unknown field" in str(info.value)  # both at once


def test_two_files_naming_one_job_are_refused(tmp_path):
    (tmp_path / "one.yaml").write_text(YAML_JOB)
    (tmp_path / "two.yaml").write_text(YAML_JOB)
    with pytest.raises(RegistryError, match=r"two.yaml: name='my-mlp' is already the job of one.yaml"):
        load_registry(tmp_path)


def test_the_registry_folder_comes_from_the_environment_or_the_dags_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("CARBONFLOW_JOBS_DIR", raising=False)
    assert registry_dir(tmp_path) == tmp_path / "jobs"
    monkeypatch.setenv("CARBONFLOW_JOBS_DIR", str(tmp_path / "elsewhere"))
    assert registry_dir(tmp_path) == tmp_path / "elsewhere"
    with pytest.raises(RegistryError, match="is not a directory"):
        load_registry(tmp_path / "missing")


def test_loading_100_jobs_is_fast_and_imports_no_airflow_or_torch(tmp_path):
    for i in range(100):
        (tmp_path / f"job{i:03d}.yaml").write_text(YAML_JOB.replace("my-mlp", f"job{i:03d}"))
    code = (
        "import sys, time; t = time.perf_counter(); from carbonflow.registry import load_registry; "
        f"jobs = load_registry({str(tmp_path)!r}); dt = time.perf_counter() - t; "
        "print(len(jobs), dt, 'airflow' in sys.modules, 'torch' in sys.modules)"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "100" and out[2] == "False" and out[3] == "False"
    assert time.perf_counter() - t0 < 30  # generous: machine-dependent; dag_parse.py measures it properly


def test_editing_a_command_jobs_script_changes_its_code_version(tmp_path):
    """User trial: editing train.py did not re-profile ('reusing the profile … younger than 604800 s'): the default
    code_version never changed. Now a command job without its own code_version carries a fingerprint of the files
    its command names under working_dir (the profile is kept per code version), and an explicit one is kept."""
    from carbonflow.registry import load_job_file

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('v1')\n")
    (project / "config.yaml").write_text("lr: 0.1\n")
    job = tmp_path / "my-mlp.yaml"
    job.write_text(YAML_JOB.replace("train.py,", "train.py, --config, config.yaml,"))
    first = load_job_file(job).code_version
    assert first.startswith("auto-")
    assert load_job_file(job).code_version == first, "the same files give the same version"
    (project / "train.py").write_text("print('v2')\n")
    assert load_job_file(job).code_version not in (first, "1"), "an edited script is a new code version"
    second = load_job_file(job).code_version
    (project / "config.yaml").write_text("lr: 0.2\n")
    assert load_job_file(job).code_version != second, "a file the command names counts too"
    job.write_text(job.read_text() + "code_version: '7'\n")
    assert load_job_file(job).code_version == "7", "a job's own code_version wins"


# --- issue 21: hostile job files -----------------------------------------------------------------------------------


def _billion_laughs(levels: int = 9) -> str:
    """The classic alias bomb: each level a list of nine aliases of the one before (9**levels strings), used by
    the job's command. Security review: 458 bytes like this took 389 MB while the DAG was parsed."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "name: bomb\nsteps: 1\nregion: GB\n" + "\n".join(lines) + f"\ncommand: *l{levels - 1}\n"


def test_yaml_alias_bomb_is_refused_quickly(tmp_path):
    import tracemalloc

    from carbonflow.registry import load_job_file

    path = tmp_path / "bomb.yaml"
    path.write_text(_billion_laughs())
    assert path.stat().st_size < 1024
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(RegistryError) as info:
            load_job_file(path)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 2.0
    assert peak_bytes < 5 * 1024 * 1024, f"{peak_bytes / 1e6:.1f} MB to refuse a {path.stat().st_size}-byte file"
    assert "bomb.yaml: not readable as YAML: line 4: YAML anchor &l0 is not allowed in a job file" in str(info.value)


def test_a_yaml_alias_alone_is_refused_too(tmp_path):
    """An alias of an undefined anchor, or a merge key (``<<: *base``), is refused at the alias."""
    from carbonflow.registry import load_job_file

    (tmp_path / "alias.yaml").write_text("name: a\nsteps: 1\nregion: GB\nworkload: *w\n")
    with pytest.raises(RegistryError, match=r"line 4: YAML alias \*w is not allowed in a job file"):
        load_job_file(tmp_path / "alias.yaml")


def test_a_job_file_over_the_size_limit_is_refused_before_parsing(tmp_path, monkeypatch):
    import yaml

    from carbonflow.registry import MAX_JOB_FILE_BYTES, load_job_file

    path = tmp_path / "big.yaml"
    path.write_text(YAML_JOB + "# " + "x" * MAX_JOB_FILE_BYTES + "\n")
    parsed = []
    monkeypatch.setattr(yaml, "load", lambda *a, **k: parsed.append(1))
    with pytest.raises(RegistryError, match=rf"big.yaml: .*allowed: at most {MAX_JOB_FILE_BYTES} bytes"):
        load_job_file(path)
    assert not parsed, "the file was parsed before its size was checked"
    (tmp_path / "big.json").write_text(" " * (MAX_JOB_FILE_BYTES + 1) + "{}")
    with pytest.raises(RegistryError, match=rf"big.json: .*allowed: at most {MAX_JOB_FILE_BYTES} bytes"):
        load_job_file(tmp_path / "big.json")


@pytest.mark.parametrize(
    ("name", "text"), [("deep.yaml", "[" * 5000 + "]" * 5000), ("deep.json", "[" * 30000 + "]" * 30000)]
)
def test_deeply_nested_job_files_are_refused_with_a_message(tmp_path, name, text):
    from carbonflow.registry import load_job_file

    (tmp_path / name).write_text(text)
    with pytest.raises(RegistryError, match=rf"{name}: not readable as .*nested deeper than"):
        load_job_file(tmp_path / name)
