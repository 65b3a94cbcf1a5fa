"""benchmarks/gpu_check.py: the device check of issue 26, run end to end on the fake NVML node, and its arithmetic.

The end-to-end runs start the script as a subprocess (as on the GPU machine): the real ``carbonflow run`` wrapper,
lease, journal, guard and restore command, with tests/energy/fake_pynvml as the driver. Their figures are the
fake's, labelled so; the tests check the script measures and judges correctly, not the hardware.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_check_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out" / "gpu_check_fake.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "CARBONFLOW_"))}
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    environ["TMPDIR"] = str(tmp_path)  # the check's work folder (fake driver state, wrappers' runs) goes here
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--out", str(out), "--model", "loop", *args],
        env={**environ, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return done, out


# --- the arithmetic -----------------------------------------------------------------------------------------


def _step_trace(step_at_s: float = 10.0, end_s: float = 20.0, low_w: float = 100.0, high_w: float = 300.0):
    times = [round(0.1 * i, 1) for i in range(int(end_s * 10) + 1)]
    power = [low_w if t < step_at_s else high_w for t in times]
    counter = [low_w * min(t, step_at_s) + high_w * max(0.0, t - step_at_s) for t in times]
    return times, power, counter


def test_polled_energy_error_of_a_step_in_power_is_what_the_held_reading_misses():
    """100 W then 300 W from 10 s: a 15 s poller reading at offset o holds 100 W for 15 s against 2500 + 200·o J."""
    bench = _bench()
    times, power, counter = _step_trace()
    got = bench.polled_energy_error(times, power, counter, 15.0, (0.0, 20.0))
    offsets = [0.75 * k for k in range(7)]  # 15 s / 20 offsets, while a whole interval fits in 20 s
    expected = [1500 / (2500 + 200 * o) - 1 for o in offsets]
    assert got["start_offsets"] == len(offsets)
    assert got["polls_per_offset"] == 1
    assert got["max_abs"] == pytest.approx(max(abs(e) for e in expected))
    assert got["mean_signed"] == pytest.approx(sum(expected) / len(expected))


def test_polled_energy_error_is_nil_for_steady_power_and_none_when_no_interval_fits():
    bench = _bench()
    times, power, counter = _step_trace(step_at_s=99.0)  # 100 W throughout
    assert bench.polled_energy_error(times, power, counter, 1.0, (0.0, 20.0))["max_abs"] == pytest.approx(0, abs=1e-9)
    assert bench.polled_energy_error(times, power, counter, 30.0, (0.0, 20.0)) is None


def test_a_limit_counts_as_restored_only_when_full_control_lowered_it_and_it_came_back():
    bench = _bench()
    assert bench.limit_restored("full", 700.0, 560.0, 700.0) is True
    assert bench.limit_restored("full", 700.0, 560.0, 560.0) is False  # left lowered
    assert bench.limit_restored("full", 700.0, 700.0, 700.0) is False  # never lowered: nothing shown
    assert bench.limit_restored("probe", 700.0, 700.0, 700.0) is None
    assert bench.limit_restored("read-only", 700.0, None, 700.0) is None


def test_a_refusal_is_reported_as_documented_only_when_every_result_says_not_applied():
    bench = _bench()
    said = {"result_written": True, "power_limit_applied": False, "result_notes": ["power limit not applied: no"]}
    silent = {"result_written": True, "power_limit_applied": False, "result_notes": []}
    killed = {"result_written": False}
    assert bench.refusal_reported([said, killed]) is True
    assert bench.refusal_reported([said, silent]) is False
    assert bench.refusal_reported([killed]) is None


def test_the_fake_training_step_runs_torch_on_the_cpu():
    bench = _bench()
    step, info = bench._build_step("tiny", 8)
    step(8)
    step(2)
    assert info["device"] == "cpu" and info["torch"]


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--fake"], "--fake needs --out"),
        (["--fake", "--out", str(REPO / "benchmarks" / "results" / "gpu_check.json")], "never go to the hardware"),
        (["--fake", "--out", "x.json", "--sections", "energy,power"], "--sections='energy,power': power not allowed"),
        (["--fake", "--out", "x.json", "--scenarios", "reboot"], "--scenarios='reboot': reboot not allowed"),
        (["--minutes", "0"], "'0' is not allowed"),
        (["--control", "write"], "invalid choice: 'write'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag_and_value(argv, named, capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_without_a_gpu_and_without_fake_it_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu_check.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=environ, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU here" in done.stdout
    assert not out.exists()


# --- end to end on the fake NVML node ----------------------------------------------------------------------


@pytest.mark.slow  # the whole GPU check end to end on the fake node (about 26 s): in make test, not test-fast
def test_fake_run_measures_energy_and_restores_every_limit_it_lowered(tmp_path):
    done, out = _run(tmp_path, "--control", "full", "--warmup-s", "1.5", "--steady-s", "3", "--light-s", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["label"] == "fake" and "fake" in result["device_name"] and result["complete"]
    assert result["notes"][0].startswith("FAKE")
    # energy: carbonflow's windows and the wrapper's run against the counter (the fake's call latency only)
    assert [w["phase"] for w in result["energy"]["windows"]] == ["warmup", "steady", "light"]
    assert result["counter_vs_carbonflow_energy_error_max"] < 0.05
    steady, light = result["energy"]["windows"][1:]
    assert steady["mean_power_w"] > light["mean_power_w"]  # the training drove the fake GPU per phase
    assert set(result["polled_energy_error_by_interval_s"]) == {"0.1", "1", "10", "15", "30"}
    assert result["polled_energy_error_by_interval_s"]["0.1"] < 0.1
    assert result["polled_energy_error_by_interval_s"]["30"] is None  # no 30 s interval in a 6.5 s run
    assert 0 < result["sampler_cpu_fraction"] < 1
    assert (out.parent / "gpu_check_fake_trace.csv").exists()
    # control: range, lowered, read back, restored after every way the run can end
    assert result["limit_range_w"] == [200.0, 700.0]
    assert result["power_limit_settable"] is True
    control = result["control"]
    assert control["limit_set_w"] == 560 and control["limit_read_back_ok"] is True
    assert control["limit_restored_after_normal_exit"] is True
    for key in ("wrapper_sigkill", "child_sigkill", "wrapper_sigterm"):
        assert result[f"limit_restored_after_{key}"] is True, key
    assert all(control["training_died_with_wrapper"].values())
    killed = control["scenarios"]["wrapper_sigkill_next_wrapper"]
    assert killed["journal_after_wrapper"] and killed["limit_after_wrapper_w"] == 560.0  # the journal did the work
    # identity: UUID pinning and the lease, as the lease and journal code assume
    assert all(result["identity"]["cuda_visible_devices_resolves"].values())
    live = result["energy"]["identity_while_training"]
    assert live["training_pinned_by_uuid"] and live["lease_held_while_training"] and live["lease_holder_is_wrapper"]


def test_fake_refusal_is_recorded_with_the_exact_nvml_error_and_the_run_goes_on(tmp_path):
    """A VM that refuses power limits: the NVML error is kept, the wrapper says 'not applied', nothing is judged."""
    done, out = _run(tmp_path, "--control", "probe", "--sections", "identity,control", "--scenarios", "normal_exit",
                     FAKE_NVML_UNPRIVILEGED="1")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["power_limit_settable"] is False
    assert result["power_limit_nvml_error"] == {"class": "NVMLError_NoPermission", "code": 4,
                                                "text": "Insufficient Permissions"}  # fmt: skip
    assert result["control"]["refusal_reported_as_documented"] is True
    assert result["limit_restored_after_wrapper_sigkill"] is None
    assert result["control"]["scenarios"]["normal_exit"]["training_died"] is True


def test_read_only_control_never_sets_a_limit(tmp_path):
    done, out = _run(tmp_path, "--sections", "control", "--scenarios", "normal_exit,wrapper_sigkill_restore_command")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    state = json.loads((Path(result["workdir"]) / "nvml_state.json").read_text())
    assert state["set_calls"] == []
    assert result["power_limit_settable"] is None and result["control"]["limit_set_w"] is None
    assert all(result["control"]["training_died_with_wrapper"].values())
