"""The core types validate user input with errors that name the field, the value and the rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from carbonflow.domain import Config, JobSpec, parse_objective

BASE = {"name": "digits", "workload": "digits_cnn", "epochs": 3, "region": "GB"}


def test_a_valid_job_round_trips_through_json() -> None:
    spec = JobSpec.model_validate({**BASE, "finish_by": "2030-01-01T07:00Z", "objective": "eds:2"})
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert again.finish_by == datetime(2030, 1, 1, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("update", "field", "fragment"),
    [
        ({"steps": 0, "epochs": None}, "steps", "steps=0"),
        ({"epochs": -2}, "epochs", "epochs=-2"),
        ({"objective": "fastest"}, "objective", "objective='fastest'"),
        ({"objective": "zeus:1.5"}, "objective", "eta must be between 0 and 1"),
        ({"name": "Bad Name!"}, "name", "name='Bad Name!'"),
        ({"finish_by": "2030-01-01T07:00"}, "finish_by", "no time zone"),
        ({"min_containers": 3, "max_containers": 2}, "", "min_containers=3"),
        ({"workload": None}, "", "workload, command or image"),
    ],
)
def test_bad_input_names_field_value_and_rule(update: dict, field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({**BASE, **update})
    text = str(err.value)
    assert fragment in text
    if field:
        assert field in text


def test_objectives_parse_with_their_parameter() -> None:
    assert parse_objective("carbon") == ("carbon", None)
    assert parse_objective("eds:1.5") == ("eds", 1.5)
    assert parse_objective("zeus:0.5") == ("zeus", 0.5)


def test_config_key_is_stable_and_readable() -> None:
    assert Config(containers=2, power_limit_w=175).key() == "c2-pl175"
    assert Config().key() == "c1-pldefault"
    assert Config(containers=1, power_limit_w=150.5, batch_size=64).key() == "c1-pl150.5-b64"


def test_a_misspelled_field_is_refused_naming_the_nearest_allowed_one() -> None:
    """User trial: 'sample_per_epoch: Extra inputs are not permitted' named the field but not what is allowed."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "command": ["x"], "sample_per_epoch": 3})
    message = str(err.value)
    assert "sample_per_epoch: unknown field; did you mean 'samples_per_epoch'?" in message
    assert "allowed: batch_size, batch_sizes," in message and "Extra inputs" not in message
    with pytest.raises(ValueError) as err:  # a nested model's field, and a mapping given as a string
        parse_job({"name": "m", "region": "GB", "steps": 1, "simulated_gpu": {"gpu_modle": "V100"}})
    assert "simulated_gpu.gpu_modle: unknown field; did you mean 'gpu_model'?" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "simulated_gpu": "V100"})
    assert "simulated_gpu: must be a mapping with fields gpu_model, dataset" in str(err.value)


def test_every_job_field_says_what_it_is() -> None:
    """User trial: no field reference existed; the docs' table is generated from these descriptions."""
    from carbonflow.domain import SimulatedGpuSpec

    for model in (JobSpec, SimulatedGpuSpec):
        assert not [n for n, f in model.model_fields.items() if not f.description], model.__name__


def test_the_docs_job_reference_is_the_models_own_table() -> None:
    """docs/jobs.md holds the table ``python -m carbonflow.registry fields`` prints: regenerate it when a field
    changes."""
    from pathlib import Path

    from carbonflow.registry import job_fields_markdown

    page = (Path(__file__).resolve().parents[1] / "docs" / "jobs.md").read_text()
    generated = page.split("<!-- generated: python -m carbonflow.registry fields -->\n")[1].split("<!-- end")[0]
    assert generated.strip() == job_fields_markdown().strip(), "run: python -m carbonflow.registry fields"


def test_a_value_out_of_range_names_the_whole_range() -> None:
    """Second user trial: max_slowdown=-1 gave pydantic's 'greater than or equal to 0', without the upper bound."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "max_slowdown": -1})
    assert "max_slowdown: -1 is out of range; allowed: ≥ 0, ≤ 10" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "simulated_gpu": {"count": 99}})
    assert "simulated_gpu.count: 99 is out of range; allowed: ≥ 1, ≤ 16" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "recurrences": 0})
    assert "recurrences: 0 is out of range; allowed: ≥ 1, ≤ 100000" in str(err.value)


# --- issue 21: every number finite and bounded, every text and list sized ------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "update",
    [
        {"target_value": NAN},
        {"target_value": -INF},
        {"max_slowdown": NAN},
        {"power_limit_w": INF},
        {"profile_report_timeout_s": INF},
        {"profile_max_age_s": NAN},
        {"profile_min_window_s": NAN},
        {"min_accuracy": NAN},
        {"epochs": NAN},
        {"simulated_gpu": {"batch_size": INF}},
    ],
)
def test_nan_and_infinite_values_are_refused(update: dict) -> None:
    """Security review: a NaN target_value and an infinite timeout were accepted."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({**BASE, **update})
    field, value = next(iter(update.items()))
    if isinstance(value, dict):
        field, value = f"{field}.{next(iter(value))}", next(iter(value.values()))
    assert f"{field}: {value!r} is not a finite number; allowed: a finite number" in str(err.value)


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ({"epochs": 10**12}, "epochs: 1000000000000 is out of range; allowed: ≥ 1, ≤ 100000"),
        ({"epochs": 1e12}, "epochs: 1000000000000.0 is out of range; allowed: ≥ 1, ≤ 100000"),
        ({"epochs": None, "steps": 10**12}, "steps: 1000000000000 is out of range; allowed: ≥ 1, ≤ 100000000"),
        ({"batch_size": 10**9}, "batch_size: 1000000000 is out of range; allowed: > 0, ≤ 1048576"),
        ({"batch_sizes": [64, 10**9]}, "batch_sizes=[64, 1000000000] is not allowed; give one or more integers"),
        ({"samples_per_epoch": 10**15}, "samples_per_epoch: 1000000000000000 is out of range"),
        (
            {"profile_report_timeout_s": 1e9},
            "profile_report_timeout_s: 1000000000.0 is out of range; allowed: > 0, ≤ 86400",
        ),
        ({"profile_max_age_s": 1e12}, "profile_max_age_s: 1000000000000.0 is out of range"),
        ({"profile_steps": 10**9}, "profile_steps: 1000000000 is out of range; allowed: > 0, ≤ 100000"),
        ({"target_value": 1e300}, "target_value: 1e+300 is out of range; allowed: ≥ -1000000000, ≤ 1000000000"),
        ({"max_slowdown": 1e300}, "max_slowdown: 1e+300 is out of range; allowed: ≥ 0, ≤ 10"),
        ({"power_limit_w": 1e6}, "power_limit_w: 1000000.0 is out of range; allowed: > 0, ≤ 2000"),
        ({"power_limits_w": [150, 1e6]}, "power_limits_w=[150.0, 1000000.0] is not allowed; give limits above 0 W"),
        ({"trigger_limits": {"max_epochs": 10**9}}, "trigger_limits.max_epochs: 1000000000 is out of range"),
    ],
)
def test_unbounded_numbers_are_refused_naming_field_value_and_range(update: dict, fragment: str) -> None:
    """Security review: 1e12 epochs were accepted."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({**BASE, **update})
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ({"name": "a" * 64}, "is too long (64 characters); allowed: at most 63 characters"),
        ({"command": ["x"] * 257}, "command: ['x', 'x',"),
        ({"command": ["x"] * 257}, "is too long (257 entries); allowed: at most 256 entries"),
        ({"command": ["python", "y" * 5000]}, "allowed: words of at most 4096 characters, 32768 in all"),
        ({"command": ["python"] + ["z" * 4000] * 9}, "allowed: words of at most 4096 characters, 32768 in all"),
        ({"env": {f"V{i}": "1" for i in range(129)}}, "is too long (129 entries); allowed: at most 128 entries"),
        ({"env": {"BIG": "v" * 9000}}, "env entry 'BIG' (3 + 9000 characters) is too long"),
        ({"working_dir": "/" + "d" * 5000}, "working_dir: '/ddd"),
        ({"region": "G" * 300}, "allowed: at most 256 characters"),
        ({"simulated_gpu": {"pair_type": "p" * 300}}, "simulated_gpu.pair_type: 'ppp"),
    ],
)
def test_sizes_are_bounded(update: dict, fragment: str) -> None:
    """Security review: command length, argument count, env size and name length were unbounded; an error
    quotes a huge value cut short, not whole."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({**BASE, **update})
    assert fragment in str(err.value)
    assert len(str(err.value)) < 2000


def test_finish_by_that_is_not_a_date_gets_our_own_message() -> None:
    """User trial: finish_by: tomorrow gave pydantic's 'Input should be a valid datetime or date'."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({**BASE, "finish_by": "tomorrow"})
    text = str(err.value)
    assert "finish_by='tomorrow' is not a date-time; give an ISO 8601 UTC time such as 2026-11-25T07:00:00Z" in text
    assert "valid datetime" not in text


def test_an_objective_error_names_its_field_once() -> None:
    """User trial: 'objective: objective='greenest' is not allowed' named the field twice."""
    from carbonflow.domain import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({**BASE, "objective": "greenest"})
    text = str(err.value)
    assert "objective='greenest' is not allowed; use one of carbon" in text and "objective: objective=" not in text


def test_trigger_limits_must_match_how_the_job_gives_its_work() -> None:
    from carbonflow.domain import parse_job

    assert parse_job({**BASE, "trigger_limits": {"max_epochs": 30, "batch_sizes": [32, 64]}}).trigger_limits
    with pytest.raises(
        ValueError, match=r"trigger_limits.max_steps=9 is set but job 'digits' gives its work in epochs"
    ):
        parse_job({**BASE, "trigger_limits": {"max_steps": 9}})
    with pytest.raises(ValueError, match=r"trigger_limits.batch_sizes: .*allowed: at most 32 entries"):
        parse_job({**BASE, "trigger_limits": {"batch_sizes": list(range(1, 40))}})
