"""benchmarks/gpu_sweep.py (issue #27): its --fake run end to end on the fake NVML node, and its parts.

The --fake run checks the result's keys and that its numbers agree with one another (every derived figure is
recomputed here from the rows it came from); it checks nothing about hardware, which only a GPU can.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "gpu_sweep.py"
FAST_FAKE = [
    "--fake", "--steady-s", "0.8", "--pair-steady-s", "0.8", "--warmup-s", "0.2", "--start-s", "3",
    "--profile-steps", "8", "--profile-warmup-steps", "2", "--profile-min-window-s", "0.2", "--profile-budget-s", "8",
    "--budget-s", "80",
]  # fmt: skip


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_sweep_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory) -> tuple[dict, Path, float]:
    out = tmp_path_factory.mktemp("gpu-sweep") / "gpu_sweep.json"
    results = REPO / "benchmarks" / "results" / "gpu_sweep.json"
    before = results.stat().st_mtime if results.exists() else None
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(BENCH), *FAST_FAKE, "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    wall_s = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = results.stat().st_mtime if results.exists() else None
    assert before == after, "--fake must never write benchmarks/results/gpu_sweep.json"
    return json.loads(out.read_text()), out, wall_s


@pytest.mark.slow
def test_fake_run_is_labelled_fake_and_ends_within_90_s(fake_run):
    result, _, wall_s = fake_run
    assert wall_s < 90
    assert result["label"] == "fake" and "fake" in result["gpu"]["driver"]
    assert result["gpu"]["name"] and result["date"]
    assert result["gpu"]["limit_at_end_w"] == result["gpu"]["limit_at_start_w"]


@pytest.mark.slow
def test_fake_sweep_rows_span_the_range_and_agree(fake_run):
    result, _, _ = fake_run
    gpu = result["gpu"]
    assert len(result["workloads"]) >= 2
    for w in result["workloads"]:
        limits = [r["limit_w"] for r in w["limits"]]
        assert len(limits) >= 5
        assert max(limits) == gpu["max_limit_w"] and min(limits) == gpu["min_limit_w"]
        for r in w["limits"]:
            assert r["samples_per_s"] > 0 and r["avg_power_w"] > 0
            assert math.isclose(r["energy_per_sample_j"], r["avg_power_w"] / r["samples_per_s"], rel_tol=1e-9)
            assert r["avg_power_w"] <= r["limit_w"] * 1.01  # the fake driver caps power at the limit


@pytest.mark.slow
def test_fake_planner_choices_are_recomputed_from_the_sweep(fake_run):
    result, _, _ = fake_run
    rows = {w["name"]: {r["limit_w"]: r for r in w["limits"]} for w in result["workloads"]}
    choices = result["planner_choice_vs_sweep_best"]
    assert set(choices) == set(rows)
    for name, per_objective in choices.items():
        assert set(per_objective) == {"energy", "carbon", "zeus:0.5"}
        for c in per_objective.values():
            chosen, best = rows[name][c["chosen_limit_w"]], rows[name][c["sweep_best_limit_w"]]
            gap = chosen["energy_per_sample_j"] / best["energy_per_sample_j"] - 1
            assert math.isclose(c["energy_per_sample_gap"], gap, rel_tol=1e-9, abs_tol=1e-12)
            assert c["sweep_energy_per_sample_j"] == chosen["energy_per_sample_j"]
            error = abs(c["predicted_gpu_energy_per_sample_j"] - chosen["energy_per_sample_j"])
            assert math.isclose(c["predicted_vs_sweep_error"], error / chosen["energy_per_sample_j"], rel_tol=1e-9)
    errors = result["profile_prediction_error"]
    assert errors["max"] == max(e for per in errors["per_workload"].values() for e in per.values())
    assert set(errors["per_workload"]) == set(rows)


@pytest.mark.slow
def test_fake_pair_split_and_errors_agree_with_their_parts(fake_run):
    result, _, _ = fake_run
    pair = result["pair"]["time_slicing"]
    counter = pair["counter_energy_j"]
    assert counter > 0 and len(pair["jobs"]) == 2
    assert math.isclose(sum(pair["carbonflow_split_j"].values()), counter, rel_tol=1e-9)
    assert math.isclose(sum(pair["utilisation_split_j"].values()), counter, rel_tol=1e-9)
    assert pair["split_sum_vs_counter_error"] <= 1e-9
    solo_total = sum(pair["solo_energy_same_work_j"].values())
    worst = max(
        abs(pair["carbonflow_split_j"][j] / counter - pair["solo_energy_same_work_j"][j] / solo_total)
        for j in pair["jobs"]
    )
    assert math.isclose(pair["split_vs_solo_error_max"], worst, rel_tol=1e-9)
    assert pair["utilisation_split_vs_solo_error_max"] is not None
    for job in pair["jobs"]:
        assert math.isclose(pair["slowdown"][job] * pair["kept_speed"][job], 1.0, rel_tol=1e-9)
    prediction = result["pair"]["prediction"]
    assert set(prediction["predicted_kept_speed"]) == set(pair["jobs"])
    assert result["pair"]["mps"]["measured"] is False and result["locked_clock"]["measured"] is False


@pytest.mark.slow
def test_fake_trace_csv_and_plot_hold_the_sweep(fake_run):
    result, out, _ = fake_run
    with (out.parent / "gpu_sweep_trace.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == sum(len(w["limits"]) for w in result["workloads"])
    assert {r["label"] for r in rows} == {"fake"}
    first = result["workloads"][0]["limits"][0]
    assert float(rows[0]["energy_per_sample_j"]) == pytest.approx(first["energy_per_sample_j"])
    assert out.with_suffix(".png").stat().st_size > 1000


def test_hardware_run_refuses_without_change_gpu_settings():
    bench = _bench()
    args = bench.parse([])
    with pytest.raises(SystemExit, match="--change-gpu-settings"):
        bench.check_args(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--change-gpu-settings", "--steady-s", "10"], "--steady-s=10 is not allowed on hardware"),
        (["--fake", "--out", "x.json", "--limits", "4"], "--limits=4 is not allowed"),
        (["--fake", "--out", "x.json", "--warmup-s", "-1"], "--warmup-s=-1 is not allowed"),
        (["--fake", "--out", "x.json", "--budget-s", "0"], "--budget-s=0 is not allowed"),
        (["--fake", "--out", "x.json", "--pair-steady-s", "0"], "--pair-steady-s=0 is not allowed"),
    ],
)
def test_bad_flags_are_refused_naming_the_value(argv, message):
    bench = _bench()
    with pytest.raises(SystemExit, match=message):
        bench.check_args(bench.parse(argv))


def test_fake_without_out_is_refused(capsys):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.parse(["--fake"])
    assert "--out" in capsys.readouterr().err


def test_no_gpu_here_writes_nothing_and_says_why(monkeypatch, capsys):
    """`make bench` runs every benchmark bare: on a machine with no GPU this one says so and writes nothing."""
    bench = _bench()
    monkeypatch.setattr(bench, "no_gpu_here", lambda: "NVML unavailable: test")
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("nothing may be measured without a GPU"))
    assert bench.main([]) == 0
    assert "no GPU here (NVML unavailable: test)" in capsys.readouterr().out


DEVICE_ARGS = ["--change-gpu-settings", "--budget-s", "440"]
"""The device command's flags (docs/energy.md, "Measured on a real GPU")."""


def test_device_command_budget_holds_the_required_phases_at_20_s_per_limit():
    bench = _bench()
    args = bench.parse(DEVICE_ARGS)
    bench.check_args(args)
    budget = bench.Budget(args.budget_s, args.warmup_s, args.steady_s, args.start_s, args.pair_steady_s)
    assert args.steady_s >= 20 and args.limits >= 5
    assert bench.required_s(budget, args, args.limits) <= args.budget_s < 8 * 60 - 20


def test_sweep_limits_span_the_gpu_range_highest_first():
    bench = _bench()
    gpu = argparse.Namespace(info={"min_limit_w": 200.0, "max_limit_w": 700.0})
    assert bench.sweep_limits_w(gpu, 5) == [700.0, 575.0, 450.0, 325.0, 200.0]


def test_profile_error_compares_gpu_energy_only():
    """Finding: the profiler's energy per sample adds the wrapper's CPU estimate; the sweep reads the GPU counter."""
    from carbonflow.domain import Config, ProfilePoint

    bench = _bench()
    point = ProfilePoint(
        config=Config(containers=1, power_limit_w=300.0), throughput_samples_per_s=100.0,
        power_per_device_w={"GPU-1": 250.0, "CPU-1": 10.0}, energy_per_sample_j=2.6, duration_s=2.0, samples=200,
        label="measured",
    )  # fmt: skip
    assert bench.gpu_energy_per_sample_j(point, "GPU-1") == pytest.approx(2.5)


def _window(power_w: float, energy_j: float, per: dict[str, dict]) -> dict:
    return {"avg_power_w": power_w, "energy_j": energy_j, "wall_s": 10.0, "per": per}


def test_pair_split_is_compared_with_solo_energy_by_share():
    bench = _bench()
    pair = _window(
        300.0, 3000.0,
        {"a": {"samples": 500, "samples_per_s": 50.0, "sm_util": 60.0, "busy_s": 0.0},
         "b": {"samples": 200, "samples_per_s": 20.0, "sm_util": 40.0, "busy_s": 0.0}},
    )  # fmt: skip
    pair["limit_w"] = 700.0
    solo = {
        "a": _window(250.0, 0.0, {"a": {"samples_per_s": 100.0}}),
        "b": _window(150.0, 0.0, {"b": {"samples_per_s": 40.0}}),
    }
    out = bench.pair_result(pair, solo, "nvml")
    assert out["kept_speed"] == {"a": 0.5, "b": 0.5}
    assert out["solo_energy_same_work_j"] == {"a": 500 * 2.5, "b": 200 * 3.75}
    assert sum(out["carbonflow_split_j"].values()) == pytest.approx(3000.0)
    # carbonflow's split: P_i * kept_i, so 250*0.5 : 150*0.5 = 0.625 : 0.375; solo shares 1250 : 750, the same
    assert out["split_vs_solo_error_max"] == pytest.approx(0.0, abs=1e-12)
    assert out["utilisation_split_j"] == {"a": pytest.approx(1800.0), "b": pytest.approx(1200.0)}
    assert out["utilisation_split_vs_solo_error_max"] == pytest.approx(0.025)


def test_solo_runs_reuse_the_sweep_window_when_the_budget_is_short():
    bench = _bench()
    budget = bench.Budget(total_s=1.0, warmup_s=3.0, steady_s=20.0, start_s=15.0)
    workloads = [
        {"name": "a", "limits": [{"limit_w": 700.0, "samples_per_s": 10.0, "avg_power_w": 600.0}]},
        {"name": "b", "limits": [{"limit_w": 700.0, "samples_per_s": 5.0, "avg_power_w": 400.0}]},
    ]
    solo, source = bench.solo_runs(None, workloads, 700.0, argparse.Namespace(), budget)
    assert "the sweep's window at the same limit" in source
    assert solo["a"]["avg_power_w"] == 600.0 and solo["b"]["per"]["b"]["samples_per_s"] == 5.0


def test_hardware_nvml_calls_exist_in_nvidia_ml_py():
    """The calls only a real GPU makes (clocks, per-process utilisation, driver version) are nvidia-ml-py's.

    Asked in a fresh interpreter: other tests put the fake NVML node in ``sys.modules["pynvml"]``."""
    import subprocess
    import sys

    calls = ["nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", "nvmlDeviceGetProcessUtilization", "nvmlSystemGetDriverVersion",
             "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"]  # fmt: skip
    probe = f"import pynvml; print([n for n in {calls!r} if not hasattr(pynvml, n)])"
    missing = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert missing.strip() == "[]"


@pytest.mark.parametrize("name", ["resnet50_bf16", "transformer_small"])
def test_fake_training_takes_real_torch_steps(name):
    """--fake-torch trains tiny CPU versions of both configs for real: parameters move, the loss is finite."""
    torch = pytest.importorskip("torch")
    bench = _bench()
    step, batch = bench._torch_job(bench._fake_cfg(bench.WORKLOADS[name]), "cpu")
    before = [p.detach().clone() for p in step.model.parameters()]
    step()
    step()
    after = list(step.model.parameters())
    assert batch > 0
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(torch.isfinite(p).all() for p in after)


def test_resnet50_config_builds_and_steps_on_a_small_batch_or_names_the_missing_torchvision():
    """Both cases of the machine: with torchvision the config trains; without it the benchmark stops with a
    message naming torchvision, not a bare ModuleNotFoundError."""
    bench = _bench()
    cfg = {**bench.WORKLOADS["resnet50_bf16"], "batch_size": 2, "image_px": 32}
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(SystemExit, match="resnet50_bf16 workload needs torchvision"):
            bench._torch_job(cfg, "cpu")
        return
    step, batch = bench._torch_job(cfg, "cpu")
    before = [p.detach().clone() for p in step.model.parameters()]
    step()
    assert batch == 2
    assert any(not (a == b).all() for a, b in zip(step.model.parameters(), before, strict=True))


class _Sample:
    def __init__(self, pid: int, sm_util: float) -> None:
        self.pid, self.smUtil = pid, sm_util


class _StubNvml:
    """Only what Gpu.process_sm_util calls: per-process samples, or NVML's NOT_FOUND when there are none."""

    class NVMLError(Exception):
        pass

    def __init__(self, samples: list[_Sample] | None) -> None:
        self.samples = samples

    def nvmlDeviceGetProcessUtilization(self, handle, since_us):
        if self.samples is None:
            raise self.NVMLError("Not Found")
        return self.samples


def test_process_sm_util_sums_samples_per_process_and_none_is_empty():
    bench = _bench()
    gpu = bench.Gpu(
        dev=None, nv=_StubNvml([_Sample(7, 30.0), _Sample(8, 10.0), _Sample(7, 20.0)]), handle=0, fake=False
    )
    assert gpu.process_sm_util(0) == {7: 50.0, 8: 10.0}
    assert bench.Gpu(dev=None, nv=_StubNvml(None), handle=0, fake=False).process_sm_util(0) == {}


@pytest.mark.slow
def test_trace_readme_states_provenance_and_licence(fake_run, tmp_path):
    result, _, _ = fake_run
    bench = _bench()
    trace = tmp_path / "trace.csv"
    bench.write_trace_readme(trace, result)
    text = (tmp_path / "README.md").read_text()
    for needed in (result["gpu"]["name"], result["gpu"]["driver"], result["date"], "Apache-2.0", "issue #27"):
        assert needed in text


def test_a_run_that_stops_still_writes_what_it_has_and_why(tmp_path):
    """Finding: a one-shot device run that failed part-way left nothing to read; it now writes the error."""
    out = tmp_path / "gpu_sweep.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), *FAST_FAKE, "--start-timeout-s", "0.001", "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert "reported no step" in result["error"]
    assert result["label"] == "fake" and result["workloads"] == []
    assert result["gpu"]["limit_at_end_w"] == result["gpu"]["limit_at_start_w"]
