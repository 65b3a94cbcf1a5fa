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


def test_a_misspelled_field_is_refused_naming_the_nearest_allowed_one() -> None:
    """User trial: 'sample_per_epoch: Extra inputs are not permitted' named the field but not what is allowed."""
    from carbonflow.models import parse_job

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
    from carbonflow.models import SimulatedGpuSpec

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
    from carbonflow.models import parse_job

    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "max_slowdown": -1})
    assert "max_slowdown: -1 is out of range; allowed: ≥ 0, ≤ 10" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_job({"name": "m", "region": "GB", "steps": 1, "simulated_gpu": {"count": 99}})
    assert "simulated_gpu.count: 99 is out of range; allowed: ≥ 1, ≤ 16" in str(err.value)
