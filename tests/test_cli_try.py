"""``carbonflow try -- CMD`` runs a command under the wrapper without a hand-written Plan (finding: the CLI's
``run`` needed a complete Plan JSON, 7 validation errors from a minimal one) and prints what it measured:
on this machine's CPU (energy **estimated**) and on the **fake** NVML node with a power limit, put back after."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from fakes.node import FakeNode

CARBONFLOW = str(Path(sys.executable).with_name("carbonflow"))
SCRIPT = """
import os, time
from carbonflow import training
for step in range(1, int(os.environ["CARBONFLOW_STEPS"]) + 1):
    time.sleep(0.01)
    training.report(step, step * 4, loss=1.0 / step)
"""


def _try(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (folder / "train.py").write_text(SCRIPT)
    return subprocess.run([CARBONFLOW, "try", *args, "--", "python", "train.py"], cwd=folder,
                          env={**(env or os.environ), "COLUMNS": "120"}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_try_runs_a_command_under_the_wrapper_and_prints_its_measurement(tmp_path: Path) -> None:
    done = _try(tmp_path, "--steps", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "progress reported: 20 steps, 80 samples" in done.stdout
    assert "estimated" in done.stdout and "loss=" in done.stdout


def test_try_with_a_power_limit_on_the_fake_gpu_node_puts_it_back(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", gpus=2)
    done = _try(tmp_path, "--steps", "10", "--power-limit", "200", env=node.env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "power limit (W)" in done.stdout and "200" in done.stdout and "measured" in done.stdout
    assert node.lowered() == 0


def test_try_without_a_command_says_how(tmp_path: Path) -> None:
    done = subprocess.run([CARBONFLOW, "try"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "give the command after --" in done.stdout + done.stderr


def test_try_help_shows_the_batch_size_default_the_command_gets(tmp_path: Path) -> None:
    """Finding: `try --help` showed no default for --batch-size, yet the command got 64 (a JobSpec's default)."""
    from typer.testing import CliRunner

    from carbonflow.cli import app
    from carbonflow.domain import JobSpec

    done = CliRunner().invoke(app, ["try", "--help"], terminal_width=100, env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    flat = " ".join(done.output.split())
    default = JobSpec.model_fields["batch_size"].default
    assert re.search(rf"--batch-size .*\[default: {default}\]", flat), done.output
    (tmp_path / "env.py").write_text("import os; open('batch.txt', 'w').write(os.environ['CARBONFLOW_BATCH_SIZE'])\n")
    ran = subprocess.run([CARBONFLOW, "try", "--steps", "1", "--", "python", "env.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (tmp_path / "batch.txt").read_text() == str(default)


def test_try_table_has_units_in_its_headers_and_fits_100_columns(tmp_path: Path) -> None:
    done = _try(tmp_path, "--steps", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"energy \((J|kJ|MJ)\)", done.stdout) and "power limit (W)" in done.stdout
    assert not re.search(r"│ [\d.]+ (J|kJ|MJ) ", done.stdout), done.stdout
