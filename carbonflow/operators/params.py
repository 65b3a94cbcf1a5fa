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

from carbonflow.models import JobSpec, utcnow
from carbonflow.operators.common import parse_job

OVERRIDABLE = ("region", "finish_by", "objective", "max_slowdown", "power_limit_w", "epochs", "steps", "batch_size")
"""JobSpec fields a DAG run's params may override."""


JOB_SPEC_PARAM = "job_spec"
"""A run param holding a whole JobSpec: an on-demand run of a job that is not registered."""
REQUESTED_KEY = "requested"
"""XCom key of the one job an on-demand run validated (by name or as a whole JobSpec)."""


class RequestError(ValueError):
    """A DAG run's request is invalid; the message names the field, the value and what is allowed."""


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


def validate_job(job: JobSpec | dict[str, Any] | str, *, now: datetime | None = None) -> JobSpec:
    """Validate a job as a request: schema, region, finish-by, power limit range, work."""
    try:
        spec = parse_job(job)
    except ValueError as err:
        raise RequestError(str(err)) from None
    now = now or utcnow()
    if spec.finish_by is not None and spec.finish_by <= now:
        raise RequestError(
            f"finish_by={spec.finish_by.isoformat()} is in the past; give a UTC time after {now.isoformat()}"
        )
    _check_region(spec.region)
    if spec.power_limit_w is not None or spec.power_limits_w:
        _check_power_limits(spec)
    if spec.simulated_gpu is not None and spec.simulated_gpu.pair_type is not None:
        from carbonflow.energy.errors import EnergyError
        from carbonflow.energy.simulated import check_pair_type

        try:
            check_pair_type(spec.simulated_gpu.pair_type)
        except EnergyError as err:
            raise RequestError(str(err)) from None
    return spec


def _check_region(region: str) -> None:
    from carbonflow.carbon.regions import resolve_region

    try:
        resolve_region(region)
    except ValueError as err:
        raise RequestError(str(err)) from None


def _check_power_limits(spec: JobSpec) -> None:
    from carbonflow.energy.discovery import discover_devices

    gpus = [d for d in discover_devices(spec.simulated_gpu, include_cpu=False) if d.kind == "gpu"]
    if not gpus:
        raise RequestError(
            f"power_limit_w={spec.power_limit_w} is set but job {spec.name!r} has no GPU with a settable power "
            "limit here; leave it empty or run on a GPU (or a simulated_gpu)"
        )
    for limit in [spec.power_limit_w, *(spec.power_limits_w or [])]:
        if limit is None:
            continue
        low, high = gpus[0].power_limit_constraints_w()
        if not low <= limit <= high:
            raise RequestError(
                f"power_limit_w={limit:g} is outside the range of {gpus[0].model}: {low:g} W to {high:g} W"
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
            context["ti"].xcom_push(key=spec.name, value=spec.model_dump_json())
            if self.only_param or overrides.get(JOB_SPEC_PARAM):
                context["ti"].xcom_push(key=REQUESTED_KEY, value=spec.model_dump_json())
            self.log.info("job %s valid: region %s, objective %s", spec.name, spec.region, spec.objective)
            names.append(spec.name)
        return names
