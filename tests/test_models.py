"""The core types validate user input with errors that name the field, the value and the rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from carbonflow.models import Config, JobSpec, parse_objective

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
