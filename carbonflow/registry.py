"""The job registry: a folder of JobSpec files, one job per file — adding a model is adding a file.

Format: ``<registry>/<anything>.yaml`` (or ``.yml`` / ``.json``) holding one JobSpec, the same fields a DAG
declares (see "Bring your own job"); a relative ``working_dir`` is resolved against the registry folder.
The folder is ``$CARBONFLOW_JOBS_DIR``, else ``<dags folder>/jobs``. Loading reads files only — no network,
no Airflow, no ML framework — so a DAG can build itself from the registry at parse time. Every problem is
reported at once, each naming the file, the field, the value and what is allowed; two files naming the
same job are refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from carbonflow.models import JobSpec

JOBS_DIR_ENV = "CARBONFLOW_JOBS_DIR"
SUFFIXES = (".yaml", ".yml", ".json")


class RegistryError(ValueError):
    """The registry cannot be used; the message lists every problem with its file and field."""


def registry_dir(dags_folder: str | Path | None = None) -> Path:
    """``$CARBONFLOW_JOBS_DIR``, else ``<dags_folder>/jobs``."""
    env = os.environ.get(JOBS_DIR_ENV)
    if env:
        return Path(env)
    if dags_folder is None:
        raise RegistryError(f"{JOBS_DIR_ENV} is unset and no DAGs folder was given; set it to the registry folder")
    return Path(dags_folder) / "jobs"


def _read(path: Path) -> object:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    return yaml.safe_load(text)


def _field_problems(path: Path, err: ValidationError) -> list[str]:
    return [
        f"{path.name}: {'.'.join(str(p) for p in e['loc']) or 'job'}: {e['msg']} (got {e.get('input')!r})"
        for e in err.errors()
    ]


def load_job_file(path: Path) -> JobSpec:
    """One registry file as a JobSpec (RegistryError naming the file and fields)."""
    try:
        data = _read(path)
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path.name}: not readable as {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{path.name}: holds {type(data).__name__}, not one JobSpec (a mapping of fields)")
    workdir = data.get("working_dir")
    if isinstance(workdir, str) and not os.path.isabs(workdir):
        data = {**data, "working_dir": os.path.normpath(path.parent / workdir)}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise RegistryError("; ".join(_field_problems(path, err))) from None


def load_registry(folder: str | Path) -> dict[str, JobSpec]:
    """Every job in ``folder``, by name, in file-name order; all problems reported together."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RegistryError(f"job registry {folder} is not a directory; create it or set {JOBS_DIR_ENV}")
    jobs: dict[str, JobSpec] = {}
    where: dict[str, str] = {}
    problems: list[str] = []
    for path in sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and not p.name.startswith(".")):
        try:
            spec = load_job_file(path)
        except RegistryError as exc:
            problems.append(str(exc))
            continue
        if spec.name in jobs:
            problems.append(f"{path.name}: name={spec.name!r} is already the job of {where[spec.name]}")
            continue
        jobs[spec.name], where[spec.name] = spec, path.name
    if problems:
        raise RegistryError(f"job registry {folder}: " + " | ".join(problems))
    return jobs
