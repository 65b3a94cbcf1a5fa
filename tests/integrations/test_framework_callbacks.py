"""The Hugging Face Trainer and PyTorch Lightning callbacks, on real tiny models built from a config (no hub
download): each job is profiled through the wrapper (the callback reports progress and stops at the
budget), then trained, and its run is logged to MLflow with the model saved where carbonflow registers it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow.accounting.run import to_run_result
from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.local import LocalBackend
from carbonflow.profiling.profiler import profile_job
from carbonflow.tracking import schema
from carbonflow.tracking.logger import log_training_run
from carbonflow.tracking.store import client_for

HF_SCRIPT = r"""
import os, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from carbonflow import training
from carbonflow.integrations.huggingface import CarbonflowTrainerCallback

class Data(torch.utils.data.Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50, (8,), generator=g)
        return {"input_ids": ids, "labels": int(ids[0] % 2)}

config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, num_labels=2)
model = BertForSequenceClassification(config)
steps = 10**6 if training.profiling() else int(os.environ["CARBONFLOW_STEPS"])
args = TrainingArguments(output_dir=os.environ["CARBONFLOW_OUTPUT_DIR"] + "/hf", max_steps=steps,
                         per_device_train_batch_size=int(os.environ["CARBONFLOW_BATCH_SIZE"]), logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[CarbonflowTrainerCallback()])
trainer.train()
"""

LIGHTNING_SCRIPT = r"""
import os, torch, pytorch_lightning as pl
from carbonflow import training
from carbonflow.integrations.lightning import CarbonflowLightningCallback

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss
    def test_step(self, batch, i):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(1) == y).float().mean())
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

x = torch.randn(4096, 8)
data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
loader = torch.utils.data.DataLoader(data, batch_size=int(os.environ["CARBONFLOW_BATCH_SIZE"]))
steps = -1 if training.profiling() else int(os.environ["CARBONFLOW_STEPS"])
trainer = pl.Trainer(max_steps=steps, max_epochs=-1 if steps == -1 else None, accelerator="cpu", logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[CarbonflowLightningCallback()])
trainer.fit(Tiny(), loader)
if not training.profiling():
    trainer.test(trainer.lightning_module, loader, verbose=False)
"""


def _profile_train_log(tmp_path: Path, script: str, name: str) -> tuple:
    (tmp_path / "train.py").write_text(script)
    spec = JobSpec(name=name, command=["python", "train.py"], working_dir=str(tmp_path), steps=30, batch_size=16,
                   region="GB", device_kind="cpu", profile_steps=5, profile_warmup_steps=2,
                   profile_min_window_s=0.5, min_accuracy=0.0)  # fmt: skip
    backend = LocalBackend(tmp_path / "runs")
    profile = profile_job(spec, backend, [])
    plan = Plan(job=name, config=Config(), start=datetime.now(UTC), predicted_duration_s=1, predicted_energy_j=1,
                predicted_emissions_g=1, region="GB", forecast_provider="test", reason="callback test")  # fmt: skip
    run = backend.execute(spec, plan, trace=False)
    result = to_run_result(run, plan, None, fallback_gco2_per_kwh=200.0)
    model = Path(run.output_dir) / "model.pt"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    outcome = log_training_run(spec, plan, result, profile=profile, model_path=model, tracking_uri=uri,
                               spool_dir=tmp_path / "spool")  # fmt: skip
    return profile, run, client_for(uri).get_run(outcome.run_id)


@pytest.mark.slow
def test_hugging_face_trainer_callback_profiles_trains_and_registers(tmp_path):
    profile, run, mlflow_run = _profile_train_log(tmp_path, HF_SCRIPT, "tiny-bert")
    (point,) = profile.points
    assert point.samples >= 5 * 16 and point.duration_s >= 0.5  # measured over the budget, then stopped
    assert run.exit_code == 0 and run.steps == 30 and run.samples == 30 * 16
    assert (Path(run.output_dir) / "model.pt").is_file()
    assert mlflow_run.data.tags[schema.T_KIND] == "training"


@pytest.mark.slow
def test_lightning_callback_profiles_trains_and_registers(tmp_path):
    profile, run, mlflow_run = _profile_train_log(tmp_path, LIGHTNING_SCRIPT, "tiny-lightning")
    (point,) = profile.points
    assert point.samples >= 5 * 16 and point.duration_s >= 0.5
    assert run.exit_code == 0 and run.steps == 30
    assert "test_accuracy" in run.metrics and 0.0 <= run.metrics["test_accuracy"] <= 1.0
    assert (Path(run.output_dir) / "model.pt").is_file()
    assert mlflow_run.data.tags[schema.T_KIND] == "training"


HF_EVAL_SCRIPT = HF_SCRIPT.replace("report_to=[],", "report_to=[], eval_strategy='steps', eval_steps=5,").replace(
    "train_dataset=Data(),",
    "train_dataset=Data(), eval_dataset=torch.utils.data.Subset(Data(), range(64)), "
    "compute_metrics=lambda p: {'accuracy': float((p.predictions.argmax(-1) == p.label_ids).mean())},",
)
LIGHTNING_VAL_SCRIPT = LIGHTNING_SCRIPT.replace(
    "    def configure_optimizers(self):",
    "    def validation_step(self, batch, i):\n"
    "        x, y = batch\n"
    "        self.log('val_acc', (self.net(x).argmax(1) == y).float().mean())\n"
    "    def configure_optimizers(self):",
).replace("trainer.fit(Tiny(), loader)", "trainer.fit(Tiny(), loader, loader)")


def _train_to(tmp_path: Path, script: str, name: str, metric: str) -> object:
    """Train a job whose target every evaluation reaches (``metric`` ≥ 0): it must end at its first one."""
    (tmp_path / "train.py").write_text(script)
    spec = JobSpec(name=name, command=["python", "train.py"], working_dir=str(tmp_path), steps=512, batch_size=16,
                   region="GB", device_kind="cpu", target_metric=metric, target_value=0.0)  # fmt: skip
    plan = Plan(job=name, config=Config(), start=datetime.now(UTC), predicted_duration_s=1, predicted_energy_j=1,
                predicted_emissions_g=1, region="GB", forecast_provider="test", reason="callback test")  # fmt: skip
    return LocalBackend(tmp_path / "runs").execute(spec, plan, trace=False)


@pytest.mark.slow
def test_the_hugging_face_callback_ends_training_at_the_evaluation_that_reaches_the_target(tmp_path):
    run = _train_to(tmp_path, HF_EVAL_SCRIPT, "tiny-bert", "eval_accuracy")
    assert run.exit_code == 0 and run.steps == 5  # the first evaluation (step 5) reached it, not max_steps 512
    assert (Path(run.output_dir) / "model.pt").is_file()  # saved as at any other end


@pytest.mark.slow
def test_the_lightning_callback_ends_training_at_the_validation_that_reaches_the_target(tmp_path):
    run = _train_to(tmp_path, LIGHTNING_VAL_SCRIPT, "tiny-lightning", "val_acc")
    assert run.exit_code == 0 and run.steps == 4096 // 16  # one epoch, then its validation reached it
    assert (Path(run.output_dir) / "model.pt").is_file()
