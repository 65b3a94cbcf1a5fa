"""What the batch-size explorer reads back from MLflow: a run at the job's own batch size (logged ``default (N)``)
counts at N in the planner's history, and a run stopped at its energy budget is logged as not reached with the
tag saying so (a real local MLflow, sqlite)."""

from __future__ import annotations

from pathlib import Path

import tracking_factories as f

from carbonflow.domain import Config
from carbonflow.tracking import schema
from carbonflow.tracking.history import job_history, realised_vs_predicted
from carbonflow.tracking.logger import log_training_run


def test_a_run_at_the_default_batch_size_counts_at_it_and_a_stopped_run_is_not_reached(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = f.job_spec("explore", batch_size=32, batch_sizes=[16, 32], target_metric="test_accuracy", target_value=0.9)
    default = f.plan("explore").model_copy(update={"config": Config(containers=1, power_limit_w=200)})
    at_default = f.result("explore", accuracy=0.95).model_copy(update={"config": default.config})
    assert not log_training_run(spec, default, at_default, tracking_uri=uri).spooled
    stopped = f.result("explore", accuracy=0.95)  # its last accuracy would count as reached: the session knows better
    tags = {schema.T_STOPPED_AT_ENERGY_J: "123.4"}
    outcome = log_training_run(spec, f.plan("explore"), stopped, tracking_uri=uri, reached_target=False,
                               extra_tags=tags)  # fmt: skip
    [first, second] = realised_vs_predicted("explore", tracking_uri=uri)
    assert first.batch_size is None and first.default_batch_size == 32  # the report shows it as logged
    assert [(r.batch_size, r.reached_target) for r in job_history(["explore"], tracking_uri=uri).for_job("explore")] \
        == [(32, True), (64, False)]  # fmt: skip
    run = MlflowClient(tracking_uri=uri).get_run(outcome.run_id)
    assert run.data.tags[schema.T_REACHED_TARGET] == "false"
    assert run.data.tags[schema.T_STOPPED_AT_ENERGY_J] == "123.4"
    assert second.reached_target is False
