"""Validate a DAG run's request before any work starts, and hand each task its JobSpec.

A trigger chooses; the author defines. A DAG run's conf (the Params form, the REST API, ``airflow dags test
--conf``) may choose a registered job (``only_param``) and set only the bounded fields of
:data:`carbonflow.validation.TRIGGER_FIELDS`, within the limits the job's author set (``trigger_limits``); any
other key is refused by name before any work starts — ``command``, ``working_dir``, ``env``, ``image``,
resources and the backend come only from the files the author controls. Beyond that, the checks a schema
cannot make: the region must be known to the carbon providers, finish-by must be in the future (and within
``TRIGGER_FINISH_BY_HORIZON``), a fixed power limit must lie in the job's device range, a local job's
working directory must exist. Each error names the field, the value and what is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from carbonflow.registry import with_code_fingerprint
from carbonflow.validation import (
    TRIGGER_FIELDS,
    RequestError,
    conf_problems,
    job_problems,
    trigger_overrides,
    validate_job,
    validate_trigger,
    working_dir_problem,
)

__all__ = [
    "RequestError",
    "ValidateJobsOperator",
    "apply_overrides",
    "check_conf_keys",
    "job_problems",
    "validate_job",
    "validate_trigger",
]

OVERRIDABLE = TRIGGER_FIELDS
"""JobSpec fields a DAG run's conf may override (each within the job's author's limits)."""
REQUESTED_KEY = "requested"
"""XCom key of the one job an on-demand run chose and validated."""


def apply_overrides(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job dict with the run's non-empty trigger fields applied (no limits checked: see
    :func:`carbonflow.validation.validate_trigger`, which the validate task runs)."""
    return {**base, **trigger_overrides(params)}


def check_conf_keys(conf: dict[str, Any], allowed: Sequence[str] | set[str]) -> None:
    """Refuse every conf key a trigger may not set, naming each and why (an author's field, or unknown with the
    nearest allowed key)."""
    problems = conf_problems(conf, sorted(allowed) if isinstance(allowed, set) else allowed)
    if problems:
        raise RequestError("; ".join(problems))


def _dag_folder(context: Any) -> str | None:
    """The folder of the DAG file: a job's relative ``working_dir`` is resolved against it."""
    dag = context.get("dag")
    fileloc = getattr(dag, "fileloc", None)
    return os.path.dirname(os.path.abspath(fileloc)) if fileloc else None


class ValidateJobsOperator(BaseOperator):
    """First task of a DAG run: check the run's conf, validate every job with the run's overrides, push each
    JobSpec to XCom.

    A trigger may set ``only_param`` (the param choosing one job by name) and the fields in ``overridable``
    (default: all of ``TRIGGER_FIELDS``; ``()``: the DAG takes no conf), each within the job's author's limits;
    any other conf key fails the task, naming the key, before any work starts — whether or not the DAG has a
    Params form. Each job's JSON is pushed under the job's name as XCom key, so later tasks read it with
    ``{{ ti.xcom_pull(task_ids='validate', key='<job>') }}`` (with ``only_param``: also under ``requested``).
    """

    ui_color = "#fff3c4"

    def __init__(
        self,
        *,
        jobs: Sequence[dict[str, Any]],
        only_param: str | None = None,
        overridable: Sequence[str] = TRIGGER_FIELDS,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", 0)  # a bad request stays bad: never retry it
        super().__init__(**kwargs)
        if not jobs:
            raise ValueError("jobs=[] is not allowed; give at least one job")
        beyond = sorted(set(overridable) - set(TRIGGER_FIELDS))
        if beyond:
            raise ValueError(
                f"overridable={beyond} is not allowed; a trigger may set only: {', '.join(TRIGGER_FIELDS)}"
            )
        self.jobs = list(jobs)
        self.only_param = only_param
        self.overridable = tuple(overridable)

    @property
    def allowed_conf_keys(self) -> list[str]:
        """The conf keys a trigger of this DAG may set."""
        return ([self.only_param] if self.only_param else []) + list(self.overridable)

    def execute(self, context: Any) -> list[str]:
        from airflow.sdk.exceptions import AirflowFailException

        try:
            return self._validate_all(context)
        except RequestError as err:
            raise AirflowFailException(f"invalid request: {err}") from None

    def _validate_all(self, context: Any) -> list[str]:
        conf = dict(getattr(context.get("dag_run"), "conf", None) or {})
        check_conf_keys(conf, self.allowed_conf_keys)  # always, Params form or not: before anything else
        params = dict(context.get("params") or {})
        overrides = {k: v for k, v in trigger_overrides(params).items() if k in self.overridable}
        dag_folder = _dag_folder(context)
        specs = [self._validated(base, overrides, dag_folder) for base in self._chosen(params)]
        for spec in specs:  # pushed only once every job is valid
            context["ti"].xcom_push(key=spec.name, value=spec.model_dump_json())
            if self.only_param:
                context["ti"].xcom_push(key=REQUESTED_KEY, value=spec.model_dump_json())
            self.log.info("job %s valid: region %s, objective %s", spec.name, spec.region, spec.objective)
        return [spec.name for spec in specs]

    def _chosen(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.only_param:
            return self.jobs
        wanted = params.get(self.only_param)
        jobs = [job for job in self.jobs if job.get("name") == wanted]
        if not jobs:
            allowed = ", ".join(sorted(str(job.get("name")) for job in self.jobs))
            raise RequestError(f"{self.only_param}={wanted!r} is not a known job; allowed: {allowed}")
        return jobs

    def _validated(self, base: dict[str, Any], overrides: dict[str, Any], dag_folder: str | None) -> Any:
        spec = validate_trigger(base, overrides)
        given = spec.working_dir
        if given is not None and dag_folder is not None and not os.path.isabs(given):
            spec = spec.model_copy(update={"working_dir": os.path.normpath(os.path.join(dag_folder, given))})
            # a path beside the DAG file is on every worker that parsed it (an absolute one may be a pod's own)
            problem = working_dir_problem(given, spec.working_dir, dag_folder) if spec.image is None else None
            if problem:
                raise RequestError(problem)
        return with_code_fingerprint(spec)  # after working_dir is resolved: the files it names are read
