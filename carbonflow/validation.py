"""A job checked as a request before any work starts: the one set of checks the DAG's ``validate`` task
(:class:`~carbonflow.operators.params.ValidateJobsOperator`) and ``carbonflow plan`` both run.

Checks go beyond the JobSpec schema: the region must be known to the carbon providers, finish-by must be
in the future (on the wall clock), a fixed power limit must lie in the job's device range, a simulated GPU's
pair type must be a measured one. Each problem names the field, the value and what is allowed. Importing
this module does not import Airflow.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from carbonflow.models import JobSpec, parse_job, utcnow


class RequestError(ValueError):
    """A DAG run's request is invalid; the message names the field, the value and what is allowed."""


def validate_job(job: JobSpec | dict[str, Any] | str, *, now: datetime | None = None) -> JobSpec:
    """Validate a job as a request: schema, region, finish-by, power limit range, work (every problem at once)."""
    try:
        spec = parse_job(job)
    except ValueError as err:
        raise RequestError(str(err)) from None
    problems = job_problems(spec, now=now)
    if problems:
        raise RequestError("; ".join(problems))
    return spec


def job_problems(spec: JobSpec, *, now: datetime | None = None) -> list[str]:
    """What is wrong with a schema-valid job as a request, one message per problem (``[]``: nothing)."""
    now = now or utcnow()
    problems = []
    if spec.finish_by is not None and spec.finish_by <= now:
        problems.append(f"finish_by={_iso(spec.finish_by)} is in the past; give a UTC time after {_iso(now)}")
    for check in (_region_problem, _power_limit_problem, _pair_type_problem):
        problem = check(spec)
        if problem:
            problems.append(problem)
    return problems


def _iso(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat()


def _region_problem(spec: JobSpec) -> str | None:
    from carbonflow.carbon.regions import resolve_region

    try:
        resolve_region(spec.region)
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
