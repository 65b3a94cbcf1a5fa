"""The local backend runs a job through the `carbonflow run` wrapper process and measures it."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from carbonflow.accounting.run import to_run_result
from carbonflow.domain import Config, ForecastPoint, JobSpec, Plan
from carbonflow.execution.local import LocalBackend

# A training job in "any language": it appends JSON lines to $CARBONFLOW_PROGRESS_FILE, honours
# $CARBONFLOW_MAX_STEPS and $CARBONFLOW_STOP_FILE, and stretches its steps by the simulated GPU's
# slowdown ($CARBONFLOW_SIM_SLOWDOWN_FILE) as carbonflow.training does.
SCRIPT = r"""
import json, os, sys, time
path = os.environ["CARBONFLOW_PROGRESS_FILE"]
max_steps = int(os.environ.get("CARBONFLOW_MAX_STEPS") or sys.argv[1])
slowdown_file = os.environ.get("CARBONFLOW_SIM_SLOWDOWN_FILE")
stop_file = os.environ.get("CARBONFLOW_STOP_FILE", "/nonexistent")

def slowdown():
    try:
        return float(open(slowdown_file).read())
    except (TypeError, OSError, ValueError):
        return 1.0

def write(line):
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")

for step in range(1, max_steps + 1):
    time.sleep(0.01 * slowdown())
    write({"step": step, "samples": step * 32, "t_s": time.monotonic(), "metrics": {"loss": 1 / step}})
    if os.path.exists(stop_file):
        break
write({"step": step, "samples": step * 32, "t_s": time.monotonic(), "metrics": {"test_accuracy": 0.97}})
"""


@pytest.fixture
def job(tmp_path: Path) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return JobSpec(
        name="script-job",
        command=[sys.executable, str(script), "60"],
        simulated_gpu={"gpu_model": "V100", "dataset": "cifar100", "network": "shufflenetv2"},
        steps=60,
        batch_size=32,
        region="GB",
        profile_min_window_s=0,  # these tests are about the step budget; the minimum window has its own tests
    )


def _plan(job: JobSpec, limit_w: float | None) -> Plan:
    return Plan(
        job=job.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=0, region="GB",
        forecast_provider="test", reason="test",
    )  # fmt: skip


def test_a_run_is_measured_per_device_with_labels(job: JobSpec, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work", trace_interval_s=0.05)
    run = backend.execute(job, _plan(job, 250.0), run_name="full")
    assert run.exit_code == 0
    assert run.samples == 60 * 32 and run.steps == 60
    assert run.metrics["test_accuracy"] == pytest.approx(0.97)
    labels = {d.kind: d.label for d in run.devices}
    assert labels == {"gpu": "simulated", "cpu": "estimated"}
    gpu = next(d for d in run.devices if d.kind == "gpu")
    # The simulated V100 draws the Zeus trace's power at 250 W while busy: energy ≈ P × wall time.
    assert 0 < gpu.energy_j <= 260 * run.duration_s
    assert gpu.power_limit_w == 250.0
    assert Path(run.power_trace_csv or "").exists()


def test_profile_mode_stops_at_the_budget_and_measures_after_warmup(job: JobSpec, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work")
    run = backend.execute(job, _plan(job, 250.0), run_name="profile", profile_steps=20, warmup_steps=5, trace=False)
    assert len(run.windows) == 1
    window = run.windows[0]
    assert window.power_limit_w == 250.0
    # The wrapper polls the progress file: a window starts and ends within a few steps of its marks.
    assert 15 * 32 <= window.samples <= 25 * 32
    assert window.window_s > 0 and window.energy_window_s > 0
    assert run.steps < 60  # stopped at the budget, not the job's full work


def test_a_sweep_profiles_every_limit_in_one_process(job: JobSpec, tmp_path: Path) -> None:
    """The limit changes inside the running training; the simulated slowdown follows it."""
    backend = LocalBackend(tmp_path / "work")
    run = backend.execute(
        job, _plan(job, 250.0), run_name="sweep", profile_steps=15, warmup_steps=2, trace=False,
        sweep_limits_w=[250.0, 150.0, 100.0],
    )  # fmt: skip
    assert [w.power_limit_w for w in run.windows] == [250.0, 150.0, 100.0]
    gpu_power = [
        next(j for d, j in w.energy_j.items() if d.startswith("SIM-GPU")) / w.energy_window_s for w in run.windows
    ]
    assert gpu_power[0] > gpu_power[1] > gpu_power[2]
    speed = [w.samples / w.window_s for w in run.windows]
    assert speed[2] < speed[0]  # 100 W on the simulated V100 is ~1.5x slower (Zeus trace)


def test_a_lower_simulated_limit_is_slower_and_draws_less_power(job: JobSpec, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work")
    fast = backend.execute(job, _plan(job, 250.0), run_name="pl250", profile_steps=40, warmup_steps=2, trace=False)
    slow = backend.execute(job, _plan(job, 100.0), run_name="pl100", profile_steps=40, warmup_steps=2, trace=False)
    power = {
        name: next(j for d, j in r.measured_energy_j.items() if d.startswith("SIM-GPU")) / r.measured_energy_window_s
        for name, r in (("fast", fast), ("slow", slow))
    }
    assert power["slow"] < power["fast"]
    assert slow.throughput_samples_per_s < fast.throughput_samples_per_s


def test_emissions_follow_the_intensity_of_each_interval(job: JobSpec, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work", trace_interval_s=0.05)
    plan = _plan(job, 200.0)
    run = backend.execute(job, plan, run_name="acct")
    start = run.started_at - timedelta(minutes=1)
    points = [ForecastPoint(start=start, length_s=3600, gco2_per_kwh=300.0)]
    result = to_run_result(run, plan, points, baseline_energy_ratio=1.25, baseline_intensity_gco2_per_kwh=400.0)
    kwh = result.energy_total_j / 3.6e6
    assert result.emissions_g == pytest.approx(kwh * 300.0, rel=1e-6)
    assert result.carbon_intensity_mean_gco2_per_kwh == pytest.approx(300.0)
    assert result.emissions_run_now_default_g == pytest.approx(kwh * 1.25 * 400.0, rel=1e-6)
    assert result.saving_fraction == pytest.approx(1 - 300 / (1.25 * 400), rel=1e-6)
    assert result.energy_labels == ["estimated", "simulated"]


def test_a_failing_training_reports_its_exit_code(tmp_path: Path) -> None:
    job = JobSpec(
        name="broken", command=[sys.executable, "-c", "raise SystemExit(3)"], steps=1, region="GB", device_kind="cpu"
    )
    run = LocalBackend(tmp_path / "work").execute(job, _plan(job, None), run_name="broken", trace=False)
    assert run.exit_code == 3
