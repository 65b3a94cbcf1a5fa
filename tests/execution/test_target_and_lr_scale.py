"""A job's target and learning-rate scaling reach its training (user trial: ``target_value`` lived in the JobSpec only,
so every script hard-coded it again; ``lr_scaling`` was a field nothing read).

The training reads ``CARBONFLOW_TARGET_METRIC``/``CARBONFLOW_TARGET_VALUE`` (``carbonflow.training.target()``), and in
a training run ``should_stop()`` turns true once a report reaches the target; ``CARBONFLOW_LR_SCALE``
(``training.lr_scale()``, ``{lr_scale}``) is the job's ``lr_scaling`` at tonight's batch size. Real parts: the local
backend runs a user's script through carbonflow's wrapper."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from carbonflow import training
from carbonflow.contract import LR_SCALE_ENV, MODE_ENV, TARGET_METRIC_ENV, TARGET_VALUE_ENV
from carbonflow.domain import Config, JobSpec, Plan
from carbonflow.execution.commands import lr_scale, resolved_command, work_env
from carbonflow.execution.local import LocalBackend

# A user's script: ten epochs at most, val_acc rising 0.3 an epoch; it ends when carbonflow says so.
SCRIPT = r"""
import json, os, sys
from carbonflow import training
epochs_run = 0
for epoch in range(1, 11):
    training.report(epoch, epoch * 32, val_acc=0.3 * epoch)
    epochs_run = epoch
    if training.should_stop():
        break
out = {"epochs_run": epochs_run, "target": training.target(), "lr_scale": training.lr_scale(), "argv": sys.argv[1:]}
open(os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "seen.json"), "w").write(json.dumps(out))
"""


def _spec(folder: Path, **fields: object) -> JobSpec:
    (folder / "train.py").write_text(SCRIPT)
    base: dict[str, object] = dict(
        name="my-mlp", command=["python", "train.py", "--lr-scale", "{lr_scale}"], epochs=10, samples_per_epoch=32,
        batch_size=64, region="GB", device_kind="cpu", working_dir=str(folder),
    )  # fmt: skip
    return JobSpec(**{**base, **fields})


def _run(spec: JobSpec, folder: Path, batch_size: int) -> dict:
    plan = Plan(
        job=spec.name, config=Config(containers=1, batch_size=batch_size), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
        forecast_provider="test", reason="test",
    )  # fmt: skip
    run = LocalBackend(folder / "runs").execute(spec, plan, trace=False)
    assert run.exit_code == 0
    return json.loads((Path(run.output_dir) / "seen.json").read_text())


def test_a_training_ends_at_its_target_and_reads_its_learning_rate_factor(tmp_path):
    spec = _spec(tmp_path, target_metric="val_acc", target_value=0.85, lr_scaling="linear")
    seen = _run(spec, tmp_path, batch_size=128)
    assert seen["epochs_run"] == 3  # 0.9 >= 0.85 at epoch 3: should_stop() turned true, not after 10 epochs
    assert seen["target"] == ["val_acc", 0.85]
    assert seen["lr_scale"] == 2.0 and seen["argv"] == ["--lr-scale", "2"]  # 128 / 64, linear


def test_without_a_target_the_training_runs_its_epochs_and_its_learning_rate_is_its_own(tmp_path):
    seen = _run(_spec(tmp_path), tmp_path, batch_size=128)
    assert seen["epochs_run"] == 10 and seen["target"] is None
    assert seen["lr_scale"] == 1.0 and seen["argv"] == ["--lr-scale", "1"]  # lr_scaling 'none' (the default)


def test_a_target_the_reports_never_reach_does_not_stop_the_training(tmp_path):
    seen = _run(_spec(tmp_path, target_metric="val_acc", target_value=5.0), tmp_path, batch_size=64)
    assert seen["epochs_run"] == 10


@pytest.mark.parametrize(
    ("scaling", "batch_size", "factor"),
    [("linear", 32, 0.5), ("sqrt", 256, 2.0), ("sqrt", 64, 1.0), ("none", 256, 1.0), ("linear", None, 1.0)],
)
def test_the_learning_rate_factor_follows_lr_scaling(tmp_path, scaling, batch_size, factor):
    spec = _spec(tmp_path, lr_scaling=scaling)
    config = Config(containers=1, batch_size=batch_size)
    assert math.isclose(lr_scale(spec, config), factor)
    assert float(work_env(spec, config, "train")[LR_SCALE_ENV]) == pytest.approx(factor)
    assert resolved_command(spec, config)[-1] == f"{factor:.12g}"


def test_the_target_is_in_the_environment_only_for_a_job_trained_to_one(tmp_path):
    with_target = work_env(_spec(tmp_path, target_metric="val_acc", target_value=0.9), Config(containers=1), "train")
    assert with_target[TARGET_METRIC_ENV] == "val_acc" and float(with_target[TARGET_VALUE_ENV]) == 0.9
    assert TARGET_METRIC_ENV not in work_env(_spec(tmp_path), Config(containers=1), "train")


def test_a_profile_is_not_cut_short_by_reaching_the_target(monkeypatch):
    monkeypatch.setenv(TARGET_METRIC_ENV, "val_acc")
    monkeypatch.setenv(TARGET_VALUE_ENV, "0.5")
    for mode, stops in (("profile", False), ("train", True)):
        monkeypatch.setenv(MODE_ENV, mode)
        training.reset()
        training.report(1, 32, val_acc=0.2)
        assert not training.should_stop()
        training.report(2, 64, val_acc=0.6)
        assert training.should_stop() is stops  # a profile measures its window whatever the metric says
    training.reset()


def test_a_malformed_target_or_factor_in_the_environment_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(TARGET_METRIC_ENV, "val_acc")
    monkeypatch.setenv(TARGET_VALUE_ENV, "nan")
    training.reset()
    with pytest.raises(ValueError, match="CARBONFLOW_TARGET_VALUE='nan' is not allowed"):
        training.target()
    monkeypatch.delenv(TARGET_VALUE_ENV)
    monkeypatch.setenv(LR_SCALE_ENV, "-2")
    with pytest.raises(ValueError, match="CARBONFLOW_LR_SCALE='-2' is not allowed"):
        training.lr_scale()
    training.reset()
