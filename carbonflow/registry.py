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
from typing import Any

from pydantic import ValidationError

from carbonflow import settings
from carbonflow.domain import JobSpec, field_bounds, field_problems

JOBS_DIR_ENV = settings.JOBS_DIR_ENV
SUFFIXES = (".yaml", ".yml", ".json")
MAX_JOB_FILE_BYTES = 64 * 1024
"""Largest job file read; checked before parsing (a job is a few hundred bytes)."""
MAX_JOB_FILE_DEPTH = 32
"""Deepest nesting of mappings and lists in a job file (a JobSpec nests two levels)."""


class RegistryError(ValueError):
    """The registry cannot be used; the message lists every problem with its file and field, and ``problems``
    holds them one by one (a job file's field problems without the file's name, for callers that name it)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


def registry_dir(dags_folder: str | Path | None = None) -> Path:
    """``$CARBONFLOW_JOBS_DIR``, else ``<dags_folder>/jobs``."""
    given = settings.jobs_dir_setting()
    if given:
        return given
    if dags_folder is None:
        raise RegistryError(f"{JOBS_DIR_ENV} is unset and no DAGs folder was given; set it to the registry folder")
    return Path(dags_folder) / "jobs"


def _given_twice(key: object, where: str = "") -> ValueError:
    """A key given twice in one file is refused: YAML and JSON would keep the last one silently, so a job
    file's second ``epochs:`` would win unseen."""
    return ValueError(f"{where}key {key!r} is given twice; give each field once")


def _json_keeping_repeats(repeated: list[str]) -> Any:
    """A ``json.loads`` ``object_pairs_hook`` that notes each repeated key in ``repeated`` (the last value kept,
    so the rest of the file is still checked)."""

    def mapping_of(pairs: list[tuple[object, object]]) -> dict:
        mapping: dict = {}
        for key, value in pairs:
            if key in mapping:
                repeated.append(str(_given_twice(key)))
            mapping[key] = value
        return mapping

    return mapping_of


def _yaml_loader(repeated: list[str]) -> type:
    """PyYAML's SafeLoader, noting each repeated mapping key with its line in ``repeated``."""
    import yaml

    class StrictSafeLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                kind = "alias" if isinstance(event, yaml.AliasEvent) else "anchor"
                raise ValueError(
                    f"line {event.start_mark.line + 1}: YAML {kind} {'*&'[kind == 'anchor']}{event.anchor} is not "
                    "allowed in a job file (anchors and aliases can expand a small file into gigabytes); write the "
                    "value out"
                )
            self._depth = getattr(self, "_depth", 0) + 1
            try:
                if self._depth > MAX_JOB_FILE_DEPTH:
                    raise ValueError(
                        f"line {event.start_mark.line + 1}: nested deeper than {MAX_JOB_FILE_DEPTH} levels; "
                        "a job file is a mapping of fields"
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            self.flatten_mapping(node)
            mapping: dict = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in mapping:
                    repeated.append(str(_given_twice(key, f"line {key_node.start_mark.line + 1}: ")))
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

    StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictSafeLoader.construct_mapping)
    return StrictSafeLoader


def read_job_data(path: Path) -> tuple[object, list[str]]:
    """A job file's raw content (YAML or JSON) and one problem per key given twice in it (ValueError: not
    YAML or JSON at all, larger than ``MAX_JOB_FILE_BYTES``, nested too deep, or with YAML anchors/aliases)."""
    text = _bounded_text(path)
    repeated: list[str] = []
    if path.suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_json_keeping_repeats(repeated)), repeated
        except RecursionError:
            raise ValueError("nested deeper than Python can read; a job file is a mapping of fields") from None
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader(repeated)), repeated
    except yaml.YAMLError as err:
        raise ValueError(" ".join(str(err).split())) from None


def _bounded_text(path: Path) -> str:
    """The file's text, refused before parsing when larger than ``MAX_JOB_FILE_BYTES`` (read no further)."""
    with path.open("rb") as handle:
        data = handle.read(MAX_JOB_FILE_BYTES + 1)
    if len(data) > MAX_JOB_FILE_BYTES:
        size = path.stat().st_size
        raise ValueError(
            f"the file is {size} bytes; allowed: at most {MAX_JOB_FILE_BYTES} bytes (MAX_JOB_FILE_BYTES) for one job"
        )
    return data.decode("utf-8")


def load_job_file(path: Path) -> JobSpec:
    """One registry file as a JobSpec (RegistryError naming the file and fields)."""
    try:
        data, repeated = read_job_data(path)
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path.name}: not readable as {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{path.name}: holds {type(data).__name__}, not one JobSpec (a mapping of fields)")
    workdir = data.get("working_dir")
    if isinstance(workdir, str) and not os.path.isabs(workdir):
        data = {**data, "working_dir": os.path.normpath(path.absolute().parent / workdir)}  # the path it resolved
    try:
        spec, problems = JobSpec.model_validate(data), repeated
    except ValidationError as err:
        spec, problems = None, repeated + field_problems(err)
    if problems:  # a repeated key and the schema's problems, all at once
        raise RegistryError("; ".join(f"{path.name}: {problem}" for problem in problems), problems=problems)
    return with_code_fingerprint(spec)


FINGERPRINT_MAX_BYTES = 64 * 1024 * 1024
"""Files larger than this named in a command are not read for its fingerprint (data, not code)."""


def code_fingerprint(spec: JobSpec) -> str | None:
    """``auto-<sha256[:12]>`` of the files a command job's command names under its ``working_dir`` (its script
    and any config it passes), or None when it names none (or has no working_dir): an edited script changes it."""
    import hashlib

    if spec.command is None or spec.working_dir is None:
        return None
    base = Path(spec.working_dir)
    digest, found = hashlib.sha256(), 0
    for word in spec.command:
        if "{" in word or word.startswith("-") or os.path.isabs(word):
            continue  # placeholders, options, the interpreter and other absolute paths are not the job's code
        path = base / word
        if path.is_file() and path.stat().st_size <= FINGERPRINT_MAX_BYTES:
            digest.update(word.encode() + b"\0" + path.read_bytes())
            found += 1
    return f"auto-{digest.hexdigest()[:12]}" if found else None


def with_code_fingerprint(spec: JobSpec) -> JobSpec:
    """``spec`` with ``code_version`` set to :func:`code_fingerprint` when the job did not set its own: editing the
    script then makes the job's profile stale (it is profiled again), as a new ``code_version`` does."""
    if "code_version" in spec.model_fields_set:
        return spec
    fingerprint = code_fingerprint(spec)
    return spec if fingerprint is None else spec.model_copy(update={"code_version": fingerprint})


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


def _type_name(annotation: object) -> str:
    import typing

    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if args and origin in (typing.Union, __import__("types").UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " or null"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def job_fields_markdown() -> str:
    """The JobSpec fields as a Markdown table (docs/jobs.md holds it: ``python -m carbonflow.registry fields``)."""
    from pydantic_core import PydanticUndefined

    from carbonflow.domain import SimulatedGpuSpec, TriggerLimits

    lines = []
    models = (
        ("JobSpec", JobSpec),
        ("simulated_gpu (SimulatedGpuSpec)", SimulatedGpuSpec),
        ("trigger_limits (TriggerLimits)", TriggerLimits),
    )
    for title, model in models:
        lines += [f"**{title}**", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if field.default is PydanticUndefined and field.default_factory is None:
                default = "required"
            else:
                value = field.default_factory() if field.default_factory is not None else field.default
                default = "`null`" if value is None else f"`{json.dumps(value)}`"
            kind = _type_name(field.annotation) + field_bounds(field)
            lines.append(f"| `{name}` | {kind} | {default} | {field.description} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["fields"]:
        raise SystemExit("usage: python -m carbonflow.registry fields   (prints the JobSpec field table)")
    print(job_fields_markdown())
