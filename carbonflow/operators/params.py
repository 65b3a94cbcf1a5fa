"""Validate a DAG run's request before any work starts, and hand each task its JobSpec.

Checks go beyond the Params form's JSON schema: the region must be known to the carbon providers,
finish-by must be in the future, a fixed power limit must lie in the job's device range, and the
work must be positive. Each error names the field, the value and what is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow.registry import with_code_fingerprint
from carbonflow.validation import RequestError, job_problems, validate_job

__all__ = ["RequestError", "ValidateJobsOperator", "apply_overrides", "check_conf_keys", "job_problems", "validate_job"]

OVERRIDABLE = ("region", "finish_by", "objective", "max_slowdown", "power_limit_w", "epochs", "steps", "batch_size")
"""JobSpec fields a DAG run's params may override."""


JOB_SPEC_PARAM = "job_spec"
"""A run param holding a whole JobSpec: an on-demand run of a job that is not registered."""
REQUESTED_KEY = "requested"
"""XCom key of the one job an on-demand run validated (by name or as a whole JobSpec)."""


def apply_overrides(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job dict with the run's non-empty overrides applied (``finish_by`` must read as a date-time)."""
    job = dict(base)
    for field in OVERRIDABLE:
        value = params.get(field)
        if value is None or value == "":
            continue
        job[field] = _finish_by(value) if field == "finish_by" else value
    return job


def _finish_by(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(
            f"finish_by={value!r} is not a date-time; give an ISO 8601 UTC time such as 2026-11-25T07:00:00Z "
            "(or leave it empty for the next 07:00 UTC)"
        ) from None
    return value


def check_conf_keys(conf: dict[str, Any], declared: set[str]) -> None:
    """Refuse keys a DAG run's conf sets that the DAG does not declare (a typo would otherwise be ignored)."""
    unknown = sorted(set(conf) - declared)
    if unknown:
        raise RequestError(
            f"unknown conf key(s) {', '.join(repr(k) for k in unknown)}; allowed: {', '.join(sorted(declared))}"
        )


def _full_job(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as err:
            raise RequestError(f"{JOB_SPEC_PARAM} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise RequestError(f"{JOB_SPEC_PARAM}={value!r} is not allowed; give a JobSpec object")
    return value


def _dag_folder(context: Any) -> str | None:
    """The folder of the DAG file: a job's relative ``working_dir`` is resolved against it."""
    dag = context.get("dag")
    fileloc = getattr(dag, "fileloc", None)
    return os.path.dirname(os.path.abspath(fileloc)) if fileloc else None


class ValidateJobsOperator(BaseOperator):
    """First task of a DAG run: validate every job with the run's params; push each JobSpec to XCom.

    The run's params (``context['params']``) override the fields in ``OVERRIDABLE``. Each job's JSON
    is pushed under the job's name as XCom key (``only_param`` names the param choosing one job), so
    later tasks read it with
    ``{{ ti.xcom_pull(task_ids='validate', key='<job>') }}``.
    """

    ui_color = "#fff3c4"

    def __init__(self, *, jobs: Sequence[dict[str, Any]], only_param: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("retries", 0)  # a bad request stays bad: never retry it
        super().__init__(**kwargs)
        if not jobs:
            raise ValueError("jobs=[] is not allowed; give at least one job")
        self.jobs = list(jobs)
        self.only_param = only_param

    def execute(self, context: Any) -> list[str]:
        from airflow.sdk.exceptions import AirflowFailException

        try:
            return self._validate_all(context)
        except RequestError as err:
            raise AirflowFailException(f"invalid request: {err}") from None

    def _validate_all(self, context: Any) -> list[str]:
        overrides = dict(context.get("params") or {})
        dag, dag_run = context.get("dag"), context.get("dag_run")
        if dag is not None and getattr(dag, "params", None) and getattr(dag_run, "conf", None):
            check_conf_keys(dict(dag_run.conf), set(dag.params.keys()))
        jobs = self.jobs
        if overrides.get(JOB_SPEC_PARAM):
            jobs = [_full_job(overrides[JOB_SPEC_PARAM])]
            # only what the request itself sets overrides a whole JobSpec (not the form's defaults)
            overrides = {k: v for k, v in dict(getattr(dag_run, "conf", None) or {}).items() if k in OVERRIDABLE}
        elif self.only_param:
            wanted = overrides.get(self.only_param)
            jobs = [job for job in self.jobs if job.get("name") == wanted]
            if not jobs:
                allowed = ", ".join(sorted(str(job.get("name")) for job in self.jobs))
                raise RequestError(f"{self.only_param}={wanted!r} is not a known job; allowed: {allowed}")
        names = []
        dag_folder = _dag_folder(context)
        for base in jobs:
            spec = validate_job(apply_overrides(base, overrides))
            if spec.working_dir is not None and dag_folder is not None and not os.path.isabs(spec.working_dir):
                spec = spec.model_copy(
                    update={"working_dir": os.path.normpath(os.path.join(dag_folder, spec.working_dir))}
                )
            spec = with_code_fingerprint(spec)  # after working_dir is resolved: the files it names are read
            context["ti"].xcom_push(key=spec.name, value=spec.model_dump_json())
            if self.only_param or overrides.get(JOB_SPEC_PARAM):
                context["ti"].xcom_push(key=REQUESTED_KEY, value=spec.model_dump_json())
            self.log.info("job %s valid: region %s, objective %s", spec.name, spec.region, spec.objective)
            names.append(spec.name)
        return names
