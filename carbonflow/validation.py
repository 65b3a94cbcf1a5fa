"""A job checked as a request before any work starts: the one set of checks the DAG's ``validate`` task
(:class:`~carbonflow.operators.params.ValidateJobsOperator`) and ``carbonflow plan`` both run.

Checks go beyond the JobSpec schema: the region must be known to the carbon providers, finish-by must be
in the future (on the wall clock), a fixed power limit must lie in the job's device range, a simulated GPU's
pair type must be a measured one. Each problem names the field, the value and what is allowed. Importing
this module does not import Airflow.

A trigger chooses, the author defines (:func:`validate_trigger`): a DAG run's conf may set only
``TRIGGER_FIELDS``, within the limits the job's author set (``trigger_limits``) and ``TRIGGER_FINISH_BY_HORIZON``;
:func:`conf_problems` names every other key and why.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from carbonflow.domain import JobSpec, UtcDatetime, parse_job, utcnow

TRIGGER_FIELDS = (
    "epochs",
    "steps",
    "batch_size",
    "finish_by",
    "objective",
    "observe_only",
    "region",
    "max_slowdown",
    "power_limit_w",
)
"""JobSpec fields a trigger (a DAG run's conf or Params form) may set, each checked against the job's author's limits
or a bound of its own: work and batch size within ``trigger_limits``, finish-by within
``TRIGGER_FINISH_BY_HORIZON``, a known region, a slowdown within the schema's range, a power limit within the
device's range. Everything else (command, working_dir, env, image, resources, backend) comes only from files
the author controls."""
TRIGGER_FINISH_BY_HORIZON = timedelta(days=7)
"""How far ahead a trigger may set finish_by."""
AUTHOR_ONLY_KEYS = {
    "job_spec": "a job is defined by its author (a registry file or the DAG file); a trigger chooses one by name",
    "backend": "where a job trains is the DAG author's choice, made in the DAG file",
    "env_from_connections": "which secrets reach a training is the job's author's choice",
}
"""Conf keys refused with a reason of their own (a whole job, the backend, a training's secrets)."""


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
    problems.append(_power_limit_beside_the_schema(data, refused))
    return [problem for problem in problems if problem]


def _power_limit_beside_the_schema(data: dict, refused: set[str]) -> str | None:
    """A power limit the schema accepted, checked against the device range when that range is known here (the
    job's simulated GPU, or this host's GPU); None when it cannot be told yet."""
    if refused & {"power_limit_w", "power_limits_w", "simulated_gpu"}:
        return None
    from pydantic import TypeAdapter, ValidationError

    from carbonflow.domain import SimulatedGpuSpec

    try:
        simulated = TypeAdapter(SimulatedGpuSpec | None).validate_python(data.get("simulated_gpu"))
        limits = TypeAdapter(list[float]).validate_python(
            [w for w in [data.get("power_limit_w"), *(data.get("power_limits_w") or [])] if w is not None]
        )
    except ValidationError:
        return None
    gpus = _gpus(simulated) if limits else []
    return _limit_range_problem(limits, gpus) if gpus else None


def _gpus(simulated: object) -> list:
    """The GPUs a job would have here (its simulated one, else this host's), none when they cannot be listed."""
    from carbonflow.energy.discovery import discover_devices
    from carbonflow.energy.errors import EnergyError

    try:
        return [d for d in discover_devices(simulated, include_cpu=False) if d.kind == "gpu"]
    except EnergyError:
        return []


def _limit_range_problem(limits: list[float], gpus: list) -> str | None:
    """The first limit outside the first GPU's power-limit range, named with the range."""
    low, high = gpus[0].power_limit_constraints_w()
    for limit in limits:
        if not low <= limit <= high:
            return f"power_limit_w={limit:g} is outside the range of {gpus[0].model}: {low:g} W to {high:g} W"
    return None


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
    return _limit_range_problem([w for w in [spec.power_limit_w, *(spec.power_limits_w or [])] if w is not None], gpus)


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


def conf_problems(conf: Mapping[str, Any], allowed: Iterable[str]) -> list[str]:
    """One message per conf key a trigger may not set: a field the job's author defines (``command is defined by
    the job's author; a trigger may set only: ...``) or an unknown key (with ``did you mean 'epochs'?``)."""
    allowed = list(allowed)
    only = f"a trigger may set only: {', '.join(allowed)}" if allowed else "this DAG takes no conf"
    problems = []
    for key in sorted(set(conf) - set(allowed), key=str):
        if key in AUTHOR_ONLY_KEYS:
            problems.append(f"{key} is refused: {AUTHOR_ONLY_KEYS[key]}; {only}")
        elif key in JobSpec.model_fields:
            problems.append(f"{key} is defined by the job's author, not by a trigger; {only}")
        else:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {near[0]!r}? " if near else "; "
            problems.append(f"unknown conf key {str(key)!r}{hint}{only}")
    return problems


def trigger_overrides(params: Mapping[str, Any]) -> dict[str, Any]:
    """The trigger fields ``params`` sets (empty values left out: the job's own value applies)."""
    return {k: params[k] for k in TRIGGER_FIELDS if params.get(k) is not None and params.get(k) != ""}


def validate_trigger(
    base: JobSpec | dict[str, Any], overrides: Mapping[str, Any], *, now: datetime | None = None
) -> JobSpec:
    """The job its author defined with a trigger's overrides applied, validated as a request; the overrides must lie
    within the author's limits (RequestError naming every problem at once)."""
    refused = sorted(set(overrides) - set(TRIGGER_FIELDS))
    if refused:
        raise RequestError("; ".join(conf_problems(dict(overrides), TRIGGER_FIELDS)))
    try:
        author = parse_job(base)
    except ValueError as err:  # the author's own job is invalid: the trigger is not to blame, but nothing runs
        raise RequestError(str(err)) from None
    job = {**author.model_dump(mode="json", exclude_unset=True), **overrides}
    limits = trigger_limit_problems(author, overrides, now=now)
    try:
        spec = validate_job(job, now=now)
    except RequestError as err:
        raise RequestError("; ".join([str(err), *limits])) from None
    if limits:
        raise RequestError("; ".join(limits))
    return spec


def trigger_limit_problems(author: JobSpec, overrides: Mapping[str, Any], *, now: datetime | None = None) -> list[str]:
    """What in a trigger's overrides lies outside the limits of the job's author (``[]``: nothing)."""
    problems = [_work_problem(author, field, overrides[field]) for field in ("epochs", "steps") if field in overrides]
    if "batch_size" in overrides:
        problems.append(_batch_size_problem(author, overrides["batch_size"]))
    if "finish_by" in overrides:
        problems.append(_horizon_problem(overrides["finish_by"], now))
    if "observe_only" in overrides and not isinstance(overrides["observe_only"], bool):
        problems.append(f"observe_only={overrides['observe_only']!r} is not allowed; give true or false")
    return [problem for problem in problems if problem]


def trigger_work_limit(author: JobSpec, field: str) -> tuple[int | None, str]:
    """The most ``epochs`` or ``steps`` a trigger may ask of ``author``'s job and where that limit comes from
    (None: the job does not give its work that way)."""
    own = getattr(author, field)
    set_by_author = getattr(author.trigger_limits, f"max_{field}", None)
    if set_by_author is not None:
        return set_by_author, f"trigger_limits.max_{field}"
    return own, f"the job's own {field}"


def trigger_batch_sizes(author: JobSpec) -> tuple[list[int], str]:
    """The batch sizes a trigger may choose for ``author``'s job and where that list comes from."""
    if author.trigger_limits is not None and author.trigger_limits.batch_sizes:
        return sorted(author.trigger_limits.batch_sizes), "trigger_limits.batch_sizes"
    return sorted({author.batch_size, *(author.batch_sizes or [])}), "the job's own batch sizes"


def _work_problem(author: JobSpec, field: str, value: Any) -> str | None:
    own = getattr(author, field)
    if own is None:
        other = "steps" if field == "epochs" else "epochs"
        return (
            f"{field}={value!r} is not allowed: job {author.name!r} gives its work in {other}; a trigger may set that"
        )
    limit, source = trigger_work_limit(author, field)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        return (
            f"{field}={value!r} is not allowed for job {author.name!r}: a trigger may ask for 1 to {limit} {field} "
            f"(the limit its author set: {source})"
        )
    return None


def _batch_size_problem(author: JobSpec, value: Any) -> str | None:
    allowed, source = trigger_batch_sizes(author)
    if isinstance(value, bool) or value not in allowed:
        return (
            f"batch_size={value!r} is not allowed for job {author.name!r}; allowed: "
            f"{', '.join(str(b) for b in allowed)} (the limit its author set: {source})"
        )
    return None


def _horizon_problem(value: Any, now: datetime | None) -> str | None:
    from pydantic import TypeAdapter, ValidationError

    try:
        finish_by = TypeAdapter(UtcDatetime).validate_python(value)
    except ValidationError:
        return None  # the schema's own message names it
    latest = (now or utcnow()) + TRIGGER_FINISH_BY_HORIZON
    if finish_by > latest:
        return (
            f"finish_by={_iso(finish_by)} is more than {TRIGGER_FINISH_BY_HORIZON.days} days ahead; a trigger may set "
            f"a finish-by up to {_iso(latest)} (TRIGGER_FINISH_BY_HORIZON)"
        )
    return None


def working_dir_problem(given: str | None, resolved: str | None, base_folder: str | None = None) -> str | None:
    """What is wrong with a local job's ``working_dir`` on this machine, naming the path it resolved to and, when
    that differs, the path as given (None: it is a directory, or there is none)."""
    if resolved is None or os.path.isdir(resolved):
        return None
    against = f" against {base_folder}" if base_folder else ""
    given_as = "" if given == resolved else f" (given as {given!r}, resolved{against})"
    return f"working_dir={resolved!r}{given_as} is not a directory on this worker; create it or correct the path"
