"""DeliverHeldRunsOperator: write run records that waited in XCom (MLflow was down) once MLflow is back.

A training task that could not reach MLflow pushes its records to XCom (``held_runs``); this task,
downstream of the training tasks with ``trigger_rule="all_done"`` and generous retries, writes them.
Wire it as a teardown (``train >> DeliverHeldRunsOperator(...).as_teardown()``): it then runs whatever the
training did, and a failed training still fails the DAG run (a plain ``all_done`` leaf would mark it a success).
While MLflow stays down it fails and Airflow retries it (with exponential backoff by default), so the
records reach MLflow exactly once (by idempotency key) even when the worker that trained is gone.
A held run that no delivery may trust (a file name with a folder, an artifact it does not carry, over the size
cap: :func:`carbonflow.tracking.held.deliver_held`) is refused, and retrying does not change that: when only
refused runs are left the task fails without a retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from carbonflow.operators.common import WarningCallback, tell
from carbonflow.tracking.held import HELD_RUNS_XCOM_KEY, deliver_held


class HeldRunsNotDelivered(RuntimeError):
    """MLflow could not take some held run records yet (the task is retried)."""


class DeliverHeldRunsOperator(BaseOperator):
    """Write the held run records of ``training_task_ids`` (every map index) to MLflow.

    :param training_task_ids: the CarbonAwareTrainingOperator tasks whose ``held_runs`` XCom to deliver.
    :param tracking_uri: where to write (default ``$MLFLOW_TRACKING_URI``, the deployment's store); the URI a
        held record names is never used (an XCom row is not trusted to pick the store).
    :param on_warning_callback: called as ``callback(context, message)`` for each run logged late.
    """

    template_fields: Sequence[str] = ("training_task_ids",)
    ui_color = "#e1f5fe"

    def __init__(
        self,
        *,
        training_task_ids: Sequence[str],
        tracking_uri: str | None = None,
        on_warning_callback: WarningCallback | list[WarningCallback] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        kwargs.setdefault("retries", 24)
        kwargs.setdefault("retry_delay", timedelta(minutes=1))
        kwargs.setdefault("retry_exponential_backoff", True)
        kwargs.setdefault("max_retry_delay", timedelta(hours=1))
        super().__init__(**kwargs)
        if not training_task_ids:
            raise ValueError("training_task_ids=[] is not allowed; name the training tasks whose held runs to deliver")
        self.training_task_ids = list(training_task_ids)
        self.tracking_uri = tracking_uri
        self.on_warning_callback = on_warning_callback

    def execute(self, context: Any) -> dict[str, Any]:
        pulled = context["ti"].xcom_pull(task_ids=self.training_task_ids, key=HELD_RUNS_XCOM_KEY) or []
        held = [run for value in pulled if value for run in value]
        delivered: dict[str, str] = {}
        failed: list[str] = []
        refused: list[str] = []
        for number, run in enumerate(held):
            key = _key_of(run, number)
            try:
                delivered[key] = deliver_held(run, self.tracking_uri)
                self.log.info("delivered held run %s as MLflow run %s", key, delivered[key])
            except ValueError as err:  # HeldRunRefused or a malformed record: a retry reads the same row
                refused.append(f"{key}: {type(err).__name__}: {err}")
            except Exception as err:
                failed.append(f"{key}: {type(err).__name__}: {err}")
        if failed:
            why = "; ".join(failed + refused)
            raise HeldRunsNotDelivered(
                f"{len(failed) + len(refused)} of {len(held)} held run(s) not delivered yet: {why}"
            )
        if refused:
            why = "; ".join(refused)
            raise AirflowFailException(f"{len(refused)} of {len(held)} held run(s) refused (not retried): {why}")
        if not held:
            self.log.info("no held runs: every training reached MLflow directly")
        late = [f"run {key} was logged late (after an MLflow outage) as {run}" for key, run in delivered.items()]
        tell(self, context, late)
        return {"delivered": delivered}


def _key_of(run: Any, number: int) -> str:
    """The held run's idempotency key for messages, or its position when the row has none."""
    try:
        return str(run["entry"]["record"]["idempotency_key"])
    except (KeyError, TypeError):
        return f"held run #{number}"
