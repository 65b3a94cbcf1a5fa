"""A Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[CarbonflowTrainerCallback()])``.

After each optimiser step it reports the step and the samples processed (``per_device_train_batch_size``
× gradient accumulation × processes), with the last logged loss; while carbonflow profiles the job it
stops training once the step budget is measured (``carbonflow.training.should_stop``). Evaluation metrics
are reported with their names (``eval_accuracy`` also as ``test_accuracy``, the metric carbonflow registers
models by); for a job trained to a target, training ends at the evaluation whose metric reaches it
(``target_metric``, e.g. ``eval_accuracy``). At the end the model's ``state_dict`` is saved as
``$CARBONFLOW_OUTPUT_DIR/model.pt``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from carbonflow import training


def _samples(args: Any, state: Any) -> int:
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
    return int(state.global_step * per_step)


class CarbonflowTrainerCallback(TrainerCallback):
    """Reports progress to carbonflow, honours its profiling stop, saves the model where it is registered."""

    def __init__(self, save_model: bool = True) -> None:
        self.save_model = save_model
        self._loss: float | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        metrics = {"loss": self._loss} if self._loss is not None else {}
        training.report(state.global_step, _samples(args, state), **metrics)
        if training.should_stop():
            control.should_training_stop = True
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None, **kwargs: Any):
        numbers = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, int | float)}
        if "eval_accuracy" in numbers:
            numbers["test_accuracy"] = numbers["eval_accuracy"]
        training.report(state.global_step, _samples(args, state), **numbers)
        if training.should_stop():  # e.g. the job's target_metric reached its target_value
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.save_model and model is not None and not training.profiling():
            torch.save(model.state_dict(), training.output_dir() / "model.pt")
