"""A job checked as a request before any work starts: the one set of checks the DAG's ``validate`` task
(:class:`~carbonflow.operators.params.ValidateJobsOperator`) and ``carbonflow plan`` both run.

Checks go beyond the JobSpec schema: the region must be known to the carbon providers, finish-by must be
in the future (on the wall clock), a fixed power limit must lie in the job's device range, a simulated GPU's
pair type must be a measured one. Each problem names the field, the value and what is allowed. Importing
this module does not import Airflow.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from carbonflow.models import JobSpec, UtcDatetime, parse_job, utcnow


class RequestError(ValueError):
    """A DAG run's request is invalid; the message names the field, the value and what is allowed."""


def validate_job(job: JobSpec | dict[str, Any] | str, *, now: datetime | None = None) -> JobSpec:
    """Validate a job as a request: schema, region, finish-by, power limit range, work (every problem at once)."""
    try:
        spec = parse_job(job)
    except ValueError as err:
        raise RequestError("; ".join([str(err), *problems_beside_the_schema(_raw(job), now=now)])) from None
    problems = job_problems(spec, now=now)
    if problems:
        raise RequestError("; ".join(problems))
    return spec


def _raw(job: dict[str, Any] | str) -> object:
    try:
        return json.loads(job) if isinstance(job, str) else job
    except ValueError:
        return None  # not JSON: the schema's message says so


def job_problems(spec: JobSpec, *, now: datetime | None = None) -> list[str]:
    """What is wrong with a schema-valid job as a request, one message per problem (``[]``: nothing)."""
    problems = [_finish_by_problem(spec.finish_by, now), region_problem(spec.region)]
    problems += [check(spec) for check in (_power_limit_problem, _pair_type_problem)]
    return [problem for problem in problems if problem]


def problems_beside_the_schema(data: object, *, now: datetime | None = None) -> list[str]:
    """For a job refused before its request checks ran (by the schema, or by a key given twice in its file):
    the request checks that need one field only (region, finish-by), run on the fields the schema did not
    refuse, so a job with a typo in one key still hears of its unknown region at once; all of
    :func:`job_problems` when the schema accepts the job."""
    from pydantic import TypeAdapter, ValidationError

    if not isinstance(data, dict):
        return []
    try:
        return job_problems(JobSpec.model_validate(data), now=now)
    except ValidationError as err:
        refused = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
    problems = []
    if isinstance(data.get("region"), str) and "region" not in refused:
        problems.append(region_problem(data["region"]))
    if data.get("finish_by") is not None and "finish_by" not in refused:
        problems.append(_finish_by_problem(TypeAdapter(UtcDatetime).validate_python(data["finish_by"]), now))
    return [problem for problem in problems if problem]


def _finish_by_problem(finish_by: datetime | None, now: datetime | None) -> str | None:
    now = now or utcnow()
    if finish_by is not None and finish_by <= now:
        return f"finish_by={_iso(finish_by)} is in the past; give a UTC time after {_iso(now)}"
    return None


def _iso(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat()


def region_problem(region: str) -> str | None:
    """What is wrong with ``region`` (None: the carbon providers know it)."""
    from carbonflow.carbon.regions import resolve_region

    try:
        resolve_region(region)
    except ValueError as err:
        return str(err)
    return None


def _power_limit_problem(spec: JobSpec) -> str | None:
    if spec.power_limit_w is None and not spec.power_limits_w:
        return None
    from carbonflow.energy.discovery import discover_devices

    gpus = [d for d in discover_devices(spec.simulated_gpu, include_cpu=False) if d.kind == "gpu"]
    if not gpus:
        limit = f"{spec.power_limit_w:g}" if spec.power_limit_w is not None else spec.power_limits_w
        return (
            f"power_limit_w={limit} is set but job {spec.name!r} has no GPU with a settable power "
            "limit here; leave it empty or run on a GPU (or a simulated_gpu)"
        )
    for limit in [spec.power_limit_w, *(spec.power_limits_w or [])]:
        if limit is None:
            continue
        low, high = gpus[0].power_limit_constraints_w()
        if not low <= limit <= high:
            return f"power_limit_w={limit:g} is outside the range of {gpus[0].model}: {low:g} W to {high:g} W"
    return None


def _pair_type_problem(spec: JobSpec) -> str | None:
    if spec.simulated_gpu is None or spec.simulated_gpu.pair_type is None:
        return None
    from carbonflow.energy.errors import EnergyError
    from carbonflow.energy.simulated import check_pair_type

    try:
        check_pair_type(spec.simulated_gpu.pair_type)
    except EnergyError as err:
        return str(err)
    return None
