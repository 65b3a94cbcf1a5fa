"""Issue 25 finding: a bad ``power_limit_w`` was not checked while the schema still refused the job, so a user
fixed one problem only to hear of the next. It is checked beside the schema's problems when the device range is
known (the job's simulated GPU, or this host's GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from carbonflow.plan_preview import job_file_problems
from carbonflow.validation import RequestError, problems_beside_the_schema, validate_job

JOB = {
    "name": "digits-cnn",
    "workload": "digits_cnn",
    "simulated_gpu": {"gpu_model": "V100", "dataset": "cifar100", "network": "shufflenetv2"},
    "epochs": 2,
    "region": "GB",
}


def test_a_bad_power_limit_w_is_checked_while_the_schema_still_refuses_the_job() -> None:
    with pytest.raises(RequestError) as err:
        validate_job({**JOB, "epochz": 3, "power_limit_w": 400})
    text = str(err.value)
    assert "epochz" in text  # the schema's problem
    assert "power_limit_w=400 is outside the range of" in text and "100 W to 250 W" in text  # and the range's


def test_a_bad_power_limits_w_entry_is_named_beside_the_schema() -> None:
    problems = problems_beside_the_schema({**JOB, "objective": "greenest", "power_limits_w": [250, 50]})
    assert problems == [next(p for p in problems if "power_limit_w=50 is outside" in p)]


def test_carbonflow_plan_lists_the_power_limit_beside_the_schemas_problems(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nworkload: digits_cnn\nepochs: 2\nregion: GB\nepochz: 1\npower_limit_w: 400\n"
                   "simulated_gpu: {gpu_model: V100, dataset: cifar100, network: shufflenetv2}\n")  # fmt: skip
    spec, problems = job_file_problems(job)
    assert spec is None
    assert any("epochz" in p for p in problems) and any("power_limit_w=400 is outside" in p for p in problems)


@pytest.mark.parametrize(
    "extra",
    [
        {"power_limit_w": -5},  # the schema refuses the value itself: said once, by the schema
        {"power_limit_w": 175},  # within the range
        {"simulated_gpu": "V100", "power_limit_w": 400},  # no device to tell the range from (the schema refuses it)
    ],
)
def test_no_power_limit_problem_beside_the_schema_when_the_value_is_refused_fine_or_the_range_unknown(
    extra: dict,
) -> None:
    problems = problems_beside_the_schema({**JOB, "epochz": 1, **extra})
    assert not [p for p in problems if "power_limit_w" in p], problems
