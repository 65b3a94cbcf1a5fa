"""A PyTorch Lightning callback: ``pl.Trainer(..., callbacks=[CarbonflowLightningCallback()])``.

After each training batch it reports the global step and the samples processed (the batch's size, summed
over steps and processes), with the logged ``train_loss``/``loss`` when there is one; while carbonflow
profiles the job it stops training once the step budget is measured. Validation/test metrics are reported
(``val_acc``/``test_acc``/``*accuracy*`` also as ``test_accuracy``); for a job trained to a target, training
ends at the validation whose metric reaches it (``target_metric``, e.g. ``val_acc``). At the end the LightningModule's
``state_dict`` is saved as ``$CARBONFLOW_OUTPUT_DIR/model.pt``.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from carbonflow import training

ACCURACY_NAMES = ("test_accuracy", "test_acc", "val_accuracy", "val_acc", "accuracy")


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, list | tuple) else batch
    return int(first.shape[0]) if hasattr(first, "shape") else 1


class CarbonflowLightningCallback(pl.Callback):
    """Reports progress to carbonflow, honours its profiling stop, saves the model where it is registered."""

    def __init__(self, save_model: bool = True) -> None:
        self.save_model = save_model
        self.samples = 0

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        self.samples += _batch_size(batch) * max(trainer.world_size, 1)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k in ("loss", "train_loss")}
        training.report(trainer.global_step, self.samples, **metrics)
        if training.should_stop():
            trainer.should_stop = True

    def _report_eval(self, trainer: pl.Trainer) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
        accuracy = next((metrics[n] for n in ACCURACY_NAMES if n in metrics), None)
        if accuracy is not None:
            metrics["test_accuracy"] = accuracy
        training.report(trainer.global_step, self.samples, **metrics)

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._report_eval(trainer)
            if training.should_stop():  # e.g. the job's target_metric reached its target_value
                trainer.should_stop = True

    def on_test_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._report_eval(trainer)

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.save_model and not training.profiling() and trainer.is_global_zero:
            torch.save(module.state_dict(), training.output_dir() / "model.pt")
