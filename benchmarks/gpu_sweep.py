"""On one real GPU: a power-limit sweep of two trainings, the planner's choices against it, a co-located pair.

Issue #27. One command measures, on the GPU it finds (NVML), and writes ``benchmarks/results/gpu_sweep.json``
labelled with the GPU, driver and date, the trace ``benchmarks/data/gpu-sweep/trace.csv`` and a plot:

1. **Sweep.** Two real trainings on synthetic data, built from :data:`WORKLOADS`: ResNet-50 in bf16 at a large
   batch (compute-bound) and a small transformer at a small batch (launch-bound). Each runs in its own process
   (``gpu_sweep.py train``) and reports progress through ``carbonflow.training``; this process sets each power
   limit (carbonflow's journalled ``applied_power_limit``, restored after every window), lets the training settle
   for ``--warmup-s`` and measures ``--steady-s`` (>= 20 s on hardware): samples/s from the training's own
   timestamps, average power and energy per sample from the NVML energy counter. Then, as information, the SM
   clock seen at the best limit is locked (``nvmlDeviceSetGpuLockedClocks``) at the highest limit and measured.
2. **The planner's view.** carbonflow's own profiler (``profile_job``: its ``carbonflow run`` wrapper, its short
   per-limit windows) on each job, and ``plan_job``'s choice for the ``energy``, ``carbon`` and ``zeus:0.5``
   objectives; compared with the sweep's best limit for the same objective and slowdown bound.
3. **Pair.** Both trainings on the GPU at once (time-slicing; MPS when its daemon starts), then each alone:
   slowdowns, the counter's energy, carbonflow's split (``split_shared_gpu_energy_j``) against each job's solo
   energy for the same work and against a split by each process's SM-utilisation share (Kepler's way); and
   carbonflow's pair predictor (fitted on Gavel's V100 pairs) against the measured kept speeds.

``--fake`` runs the same code end to end with no GPU, in under 90 s: the fake NVML driver of the tests
(``tests/energy/fake_pynvml``, one node as ``tests/fakes/node.py`` builds it) and a simulated GPU in the training
process (:class:`FakePhysics`: each step padded to Zeus's published V100 time per step at the current limit, the
driver's power set to Zeus's power at that limit; a pair keeps Gavel's measured V100 speeds and draws
``shared_gpu_power_w``). Every number it writes is labelled ``fake``; it checks the plumbing, never the hardware.

This script changes the GPU's power limit and locks its clocks; on hardware it refuses to unless
``--change-gpu-settings`` is given (a machine whose rules forbid changing them cannot run this issue).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "gpu_sweep.json"
TRACE_DIR = BENCH / "data" / "gpu-sweep"
FAKE_NVML_DIR = REPO / "tests" / "energy" / "fake_pynvml"
OBJECTIVES = ("energy", "carbon", "zeus:0.5")
GOALS = {"choice_gap": 0.03, "profile_error": 0.05, "split_sum": 0.01, "split_vs_solo": 0.10}
MIN_STEADY_S_HARDWARE = 20.0

WORKLOADS: dict[str, dict[str, Any]] = {
    "resnet50_bf16": {
        "bound": "compute", "model": "resnet50", "batch_size": 256, "image_px": 224, "classes": 1000,
        "dtype": "bfloat16", "pair_type": "ResNet-50 (batch size 64)",
        "fake": {"dataset": "imagenet", "network": "resnet50", "batch_size": 256, "step_s": 0.03},
    },
    "transformer_small": {
        "bound": "launch/memory", "model": "transformer", "batch_size": 8, "seq_len": 128, "d_model": 256,
        "heads": 4, "layers": 4, "vocab": 8192, "dtype": "bfloat16", "pair_type": "Transformer (batch size 16)",
        "fake": {"dataset": "cifar100", "network": "shufflenetv2", "batch_size": 1024, "step_s": 0.015},
    },
}  # fmt: skip
"""The two trainings, as configs. ``fake``: the Zeus V100 measurement the simulated GPU replays under --fake."""


# ---------------------------------------------------------------------------------------------------------------
# The training process (``gpu_sweep.py train``): real torch steps, progress through carbonflow.training.
# ---------------------------------------------------------------------------------------------------------------


def _resnet(cfg: dict[str, Any], device: str):  # type: ignore[no-untyped-def]
    """ResNet-50 (channels-last) and one synthetic batch; the model returns (logits, labels) for the loss."""
    import torch

    try:
        import torchvision
    except ImportError as exc:
        raise SystemExit(
            f"the resnet50_bf16 workload needs torchvision ({exc}); install it beside torch (the sweep trains "
            "both resnet50_bf16 and transformer_small)"
        ) from exc
    net = torchvision.models.resnet50(num_classes=cfg["classes"]).to(device, memory_format=torch.channels_last)
    x = torch.randn(cfg["batch_size"], 3, cfg["image_px"], cfg["image_px"], device=device)
    y = torch.randint(0, cfg["classes"], (cfg["batch_size"],), device=device)
    x = x.to(memory_format=torch.channels_last)

    class WithLabels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, images, labels):  # type: ignore[no-untyped-def]
            return self.net(images), labels

    return WithLabels(), (x, y)


def _transformer(cfg: dict[str, Any], device: str):  # type: ignore[no-untyped-def]
    """A small transformer language model and one synthetic batch of tokens (next-token loss)."""
    import torch

    d = cfg["d_model"]
    layer = torch.nn.TransformerEncoderLayer(d, cfg["heads"], 4 * d, batch_first=True)
    body = torch.nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
    net = torch.nn.Sequential(torch.nn.Embedding(cfg["vocab"], d), body, torch.nn.Linear(d, cfg["vocab"])).to(device)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch_size"], cfg["seq_len"] + 1), device=device)

    class NextToken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, seq):  # type: ignore[no-untyped-def]
            return self.net(seq[:, :-1]).flatten(0, 1), seq[:, 1:].flatten()

    return NextToken(), (tokens,)


def _torch_job(cfg: dict[str, Any], device: str):  # type: ignore[no-untyped-def]
    """(step function, samples per step) of one workload config, on synthetic data (random, never zeros)."""
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = device == "cuda"
    dtype = getattr(torch, cfg["dtype"]) if device == "cuda" else torch.float32
    model, batch = _resnet(cfg, device) if cfg["model"] == "resnet50" else _transformer(cfg, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=device == "cuda"):
            loss = torch.nn.functional.cross_entropy(*model(*batch))
        loss.backward()
        opt.step()

    step.model = model  # type: ignore[attr-defined]  # for the tests: the parameters a step moves
    return step, cfg["batch_size"]


def _fake_cfg(cfg: dict[str, Any]) -> dict[str, Any]:
    """The tiny CPU version of a workload config that --fake trains for real (the simulated GPU pads its time)."""
    if cfg["model"] == "resnet50":
        return {**cfg, "model": "transformer", "batch_size": 4, "seq_len": 8, "d_model": 16, "heads": 2,
                "layers": 1, "vocab": 64}  # fmt: skip
    return {**cfg, "batch_size": 4, "seq_len": 8, "d_model": 16, "heads": 2, "layers": 1, "vocab": 64}


@dataclass
class FakePhysics:
    """The simulated GPU of --fake, shared by every training process through the fake NVML driver's state file.

    Time per step and power at the current limit replay the workload's Zeus V100 measurement; while two
    trainings are active each keeps Gavel's measured V100 pair speed and the GPU draws ``shared_gpu_power_w``.
    """

    name: str
    cfg: dict[str, Any]
    model: Any = None
    nvml: Any = None
    busy_s: float = 0.0

    def __post_init__(self) -> None:
        import importlib.util

        from carbonflow.energy.simulated import ZeusPowerModel

        spec = importlib.util.spec_from_file_location("fake_pynvml_physics", FAKE_NVML_DIR / "pynvml.py")
        fake_nvml = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fake_nvml)  # the tests' fake driver, whose state file FAKE_PYNVML_STATE names

        fake = self.cfg["fake"]
        self.model = ZeusPowerModel.load("V100", fake["dataset"], fake["network"], fake["batch_size"])
        self.nvml = fake_nvml

    def _update(self, active: bool) -> tuple[float, list[str]]:
        """Register this training's load at the current limit; returns (limit W, active trainings)."""
        from carbonflow.energy.simulated import shared_gpu_power_w

        with self.nvml._state() as state:
            dev = state["devices"][0]
            limit_w = dev["limit_mw"] / 1000
            loads = dev.setdefault("sweep_loads_w", {})
            if active:
                loads[self.name] = self.model.average_power_w(limit_w)
            else:
                loads.pop(self.name, None)
            powers = list(loads.values())
            total_w = shared_gpu_power_w(*powers, limit_w) if len(powers) == 2 else sum(powers)
            dev["load_power_mw"] = int(total_w * 1000)
            return limit_w, sorted(loads)

    def pace(self, started_s: float) -> None:
        """Stretch the step that began at ``started_s`` to the simulated GPU's time for it."""
        from carbonflow.energy.simulated import pair_kept_speeds

        limit_w, active = self._update(True)
        solo_s = self.cfg["fake"]["step_s"] * self.model.slowdown(limit_w)
        target_s = solo_s
        if len(active) == 2:
            other = next(n for n in active if n != self.name)
            kept = pair_kept_speeds(self.cfg["pair_type"], WORKLOADS[other]["pair_type"])[0]
            target_s = solo_s / kept
        self.busy_s += solo_s
        time.sleep(max(0.0, target_s - (time.monotonic() - started_s)))

    def stop(self) -> None:
        self._update(False)


def torch_sync() -> None:
    import torch

    torch.cuda.synchronize()


def _no_step() -> None:
    """--fake without --fake-torch: the simulated GPU's padding is the whole step (no torch start-up)."""


def train(name: str, fake: bool, max_steps: int | None, fake_torch: bool = False) -> int:
    """Train ``name`` until carbonflow says stop (stop file, profile step budget) or ``max_steps``."""
    from carbonflow import training

    cfg = WORKLOADS[name]
    step = _no_step
    if fake and fake_torch:
        import torch

        torch.set_num_threads(1)
        step, _ = _torch_job(_fake_cfg(cfg), "cpu")
    elif not fake:
        step, _ = _torch_job(cfg, "cuda")
    batch = cfg["batch_size"]  # under --fake the simulated GPU trains the config's batch; the CPU a tiny one
    physics = FakePhysics(name, cfg) if fake else None
    done = 0
    try:
        while not training.should_stop() and (max_steps is None or done < max_steps):
            started = time.monotonic()
            step()
            if physics is not None:
                physics.pace(started)
            else:  # report device-complete steps: the report's timestamp is when the GPU finished it
                torch_sync()
            done += 1
            training.report(done, done * batch, busy_s=physics.busy_s if physics else 0.0)
    finally:
        if physics is not None:
            physics.stop()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The measuring process: the GPU, windows over a running training, the phases.
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Gpu:
    """The one GPU measured: carbonflow's NvmlGpu (energy, limits) and a raw pynvml handle (clocks, utilisation)."""

    dev: Any
    nv: Any
    handle: Any
    fake: bool
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, fake: bool) -> Gpu:
        from carbonflow.energy.nvml import nvml_devices

        dev = nvml_devices()[0]
        nv = dev._nv
        handle = nv.nvmlDeviceGetHandleByUUID(dev.id)
        low_w, high_w = dev.power_limit_constraints_w()
        info = {
            "name": dev.model, "uuid": dev.id, "driver": _driver(nv, fake), "min_limit_w": low_w,
            "max_limit_w": high_w, "default_limit_w": dev.default_power_limit_w(),
            "limit_at_start_w": dev.power_limit_w(),
        }  # fmt: skip
        return cls(dev, nv, handle, fake, info)

    def sm_clock_mhz(self) -> float | None:
        if self.fake:
            return None
        return float(self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_SM))

    def process_sm_util(self, since_us: int) -> dict[int, float]:
        """SM utilisation per process since ``since_us`` (NVML's per-process samples); {} under --fake."""
        if self.fake:
            return {}
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(self.handle, since_us)
        except self.nv.NVMLError:
            return {}
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = out.get(int(s.pid), 0.0) + float(s.smUtil)
        return out


def _driver(nv: Any, fake: bool) -> str:
    if fake:
        return "fake NVML (tests/energy/fake_pynvml)"
    version = nv.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else str(version)


def train_flags(args: argparse.Namespace) -> list[str]:
    """The training process's flags: --fake (and --fake-torch) as this run was given them."""
    return (["--fake"] if args.fake else []) + (["--fake-torch"] if args.fake and args.fake_torch else [])


@dataclass
class Training:
    """One training process started by this script, and its progress file."""

    name: str
    proc: subprocess.Popen
    progress: Path
    stop_file: Path

    @classmethod
    def start(cls, name: str, args: argparse.Namespace, env: dict[str, str] | None = None) -> Training:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=args.workdir))
        progress, stop_file = run_dir / "progress.jsonl", run_dir / "stop"
        child_env = {**os.environ, **(env or {}), "CARBONFLOW_PROGRESS_FILE": str(progress),
                     "CARBONFLOW_STOP_FILE": str(stop_file), "PYTHONUNBUFFERED": "1"}  # fmt: skip
        command = [sys.executable, str(Path(__file__).resolve()), "train", "--workload", name, *train_flags(args)]
        with (run_dir / "log").open("w") as log:
            proc = subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT)
        return cls(name, proc, progress, stop_file)

    def last(self) -> dict[str, Any] | None:
        """The training's last progress report (step, samples, t_s, metrics), or None before its first."""
        if not self.progress.exists():
            return None
        with self.progress.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            lines = [line for line in fh.read().splitlines() if line.endswith(b"}")]
        return json.loads(lines[-1]) if lines else None

    def wait_started(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while self.last() is None or self.last()["step"] < 2:
            if self.proc.poll() is not None:
                log = (self.progress.parent / "log").read_text()[-2000:]
                raise RuntimeError(f"training {self.name} exited {self.proc.returncode} before its first steps: {log}")
            if time.monotonic() > end:
                raise RuntimeError(f"training {self.name} reported no step in {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _watch(seconds: float, gpu: Gpu, pids: list[int]) -> tuple[list[float], dict[int, float]]:
    """Wait ``seconds`` sampling the SM clock and each process's SM utilisation every half second."""
    clocks: list[float] = []
    util: dict[int, float] = {}
    since_us = int(time.time() * 1e6)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        clock = gpu.sm_clock_mhz()
        if clock is not None:
            clocks.append(clock)
        for pid, value in gpu.process_sm_util(since_us).items():
            if pid in pids:
                util[pid] = util.get(pid, 0.0) + value
        since_us = int(time.time() * 1e6)
    return clocks, util


def measure_window(gpu: Gpu, trainings: list[Training], warmup_s: float, steady_s: float) -> dict[str, Any]:
    """Let the trainings settle, then measure ``steady_s``: each one's throughput, the GPU's energy and power."""
    time.sleep(warmup_s)
    first = [t.last() for t in trainings]
    e0, w0 = gpu.dev.energy_j(), time.monotonic()
    clocks, util = _watch(steady_s, gpu, [t.proc.pid for t in trainings])
    e1, w1 = gpu.dev.energy_j(), time.monotonic()
    last = [t.last() for t in trainings]
    energy_j, wall_s = e1 - e0, w1 - w0
    per: dict[str, dict[str, float]] = {}
    for t, a, b in zip(trainings, first, last, strict=True):
        if a is None or b is None or b["t_s"] <= a["t_s"]:
            raise RuntimeError(f"training {t.name} reported no progress in a {steady_s:g} s window")
        per[t.name] = {
            "samples": b["samples"] - a["samples"], "steps": b["step"] - a["step"],
            "samples_per_s": (b["samples"] - a["samples"]) / (b["t_s"] - a["t_s"]),
            "busy_s": b["metrics"].get("busy_s", 0.0) - a["metrics"].get("busy_s", 0.0),
            "sm_util": util.get(t.proc.pid, 0.0),
        }  # fmt: skip
    return {
        "energy_j": energy_j, "wall_s": wall_s, "avg_power_w": energy_j / wall_s,
        "sm_clock_mhz": sum(clocks) / len(clocks) if clocks else None, "per": per,
    }  # fmt: skip


def sweep_limits_w(gpu: Gpu, n: int) -> list[float]:
    """``n`` limits evenly over the GPU's range, highest first, in whole watts."""
    low, high = gpu.info["min_limit_w"], gpu.info["max_limit_w"]
    return sorted({float(round(low + (high - low) * i / (n - 1))) for i in range(n)}, reverse=True)


@contextlib.contextmanager
def at_limit(gpu: Gpu, limit_w: float):  # type: ignore[no-untyped-def]
    """carbonflow's journalled, always-restored power limit; raises when the driver refuses it."""
    from carbonflow.energy.power_limit import applied_power_limit

    with applied_power_limit([gpu.dev], limit_w) as outcome:
        if abs(gpu.dev.power_limit_w() - limit_w) > 1.0:
            raise RuntimeError(f"power limit {limit_w:g} W not applied: {'; '.join(outcome.notes)}")
        yield


def sweep_workload(gpu: Gpu, name: str, limits: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """One training, kept running, measured at each limit."""
    training = Training.start(name, args)
    rows = []
    try:
        training.wait_started(args.start_timeout_s)
        for limit_w in limits:
            with at_limit(gpu, limit_w):
                w = measure_window(gpu, [training], args.warmup_s, args.steady_s)
            tput = w["per"][name]["samples_per_s"]
            rows.append({
                "limit_w": limit_w, "samples_per_s": tput, "avg_power_w": w["avg_power_w"],
                "energy_per_sample_j": w["avg_power_w"] / tput, "steady_s": w["wall_s"],
                "samples": w["per"][name]["samples"], "sm_clock_mhz": w["sm_clock_mhz"],
            })  # fmt: skip
            print(f"  {name} @ {limit_w:g} W: {tput:.1f} samples/s, {w['avg_power_w']:.1f} W", flush=True)
    finally:
        training.stop()
    cfg = {k: v for k, v in WORKLOADS[name].items() if k != "fake"}
    return {"name": name, "config": cfg, "limits": rows}


@contextlib.contextmanager
def clocks_locked(gpu: Gpu, mhz: int):  # type: ignore[no-untyped-def]
    """Lock the SM clock at ``mhz``; reset it on leaving, also when SIGTERM (a timeout) arrives meanwhile."""

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(f"signal {signum} while the SM clock was locked (reset)")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        gpu.nv.nvmlDeviceSetGpuLockedClocks(gpu.handle, mhz, mhz)
        try:
            yield
        finally:
            gpu.nv.nvmlDeviceResetGpuLockedClocks(gpu.handle)
    finally:
        signal.signal(signal.SIGTERM, previous)


def locked_clock(gpu: Gpu, workload: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Information: the SM clock seen at the best-energy limit, locked at the highest limit, measured."""
    best = min(workload["limits"], key=lambda r: r["energy_per_sample_j"])
    if gpu.fake or best["sm_clock_mhz"] is None:
        return {"measured": False, "why": "the fake NVML driver has no clock calls" if gpu.fake else "no SM clock read"}
    mhz = int(best["sm_clock_mhz"])
    training = Training.start(workload["name"], args)
    try:
        training.wait_started(args.start_timeout_s)
        with clocks_locked(gpu, mhz):
            w = measure_window(gpu, [training], args.warmup_s, args.pair_steady_s)
    except (gpu.nv.NVMLError, RuntimeError) as exc:  # information only: say why, keep the rest of the run
        return {"measured": False, "why": f"locking the SM clock at {mhz} MHz: {type(exc).__name__}: {exc}"}
    finally:
        training.stop()
    tput = w["per"][workload["name"]]["samples_per_s"]
    return {
        "measured": True, "workload": workload["name"], "locked_sm_clock_mhz": mhz, "best_limit_w": best["limit_w"],
        "samples_per_s": tput, "avg_power_w": w["avg_power_w"], "energy_per_sample_j": w["avg_power_w"] / tput,
        "best_limit_energy_per_sample_j": best["energy_per_sample_j"],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The planner's view: carbonflow's profiler and planner on the same trainings, against the long sweep.
# ---------------------------------------------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job_spec(name: str, limits: list[float], args: argparse.Namespace, objective: str = "energy"):  # type: ignore[no-untyped-def]
    from carbonflow.domain import JobSpec

    command = ["{python}", str(Path(__file__).resolve()), "train", "--workload", name, *train_flags(args)]
    return JobSpec(
        name=name.replace("_", "-"), command=command, steps=10_000, batch_size=WORKLOADS[name]["batch_size"],
        region="GB", objective=objective, max_slowdown=args.max_slowdown, power_limits_w=limits,
        profile_steps=args.profile_steps, profile_warmup_steps=args.profile_warmup_steps,
        profile_min_window_s=args.profile_min_window_s, finish_by=NOW + timedelta(days=30), code_version="1",
        env={"FAKE_PYNVML_STATE": os.environ["FAKE_PYNVML_STATE"]} if args.fake else {},
    )  # fmt: skip


def profile(gpu: Gpu, name: str, limits: list[float], args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from carbonflow.execution.local import LocalBackend
    from carbonflow.profiling.profiler import profile_job

    started = time.monotonic()
    result = profile_job(job_spec(name, limits, args), LocalBackend(args.workdir / "profiles" / name), [gpu.dev])
    print(f"  profiled {name}: {len(result.points)} limits in {time.monotonic() - started:.1f} s", flush=True)
    return result, time.monotonic() - started


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def sweep_best_w(rows: list[dict[str, Any]], objective: str, max_slowdown: float, default_w: float) -> float:
    """The sweep's best limit for ``objective`` under the same slowdown bound, by carbonflow's own rule."""
    from carbonflow.planning import choose_power_limit

    limits = [r["limit_w"] for r in rows]
    time_s = [1.0 / r["samples_per_s"] for r in rows]  # the same work: one sample
    power_w = [r["avg_power_w"] for r in rows]
    return choose_power_limit(limits, time_s, power_w, objective=objective, max_slowdown=max_slowdown,
                              default_power_limit_w=default_w, max_power_w=max(limits))  # fmt: skip


def gpu_energy_per_sample_j(point: Any, gpu_id: str) -> float:
    """A profile point's GPU energy per sample: what the NVML counter alone measured (the sweep's measure).

    The point's own ``energy_per_sample_j`` adds the wrapper's CPU estimate (carbonflow plans with both)."""
    return point.power_per_device_w[gpu_id] / point.throughput_samples_per_s


def sweep_cost(rows: dict[float, dict], limit_w: float, objective: str, default_w: float) -> float:
    """The objective's cost of one sample at ``limit_w`` on the sweep (carbon: energy at a flat intensity)."""
    from carbonflow.planning import Reference, objective_cost

    ref_row = rows[default_w]
    ref = Reference(ref_row["energy_per_sample_j"], 1 / ref_row["samples_per_s"], max(rows))
    row = rows[limit_w]
    objective = "energy" if objective == "carbon" else objective
    return objective_cost(objective, energy_j=row["energy_per_sample_j"], time_s=1 / row["samples_per_s"],
                          emissions_g=row["energy_per_sample_j"], reference=ref)  # fmt: skip


def choice_vs_sweep(plan: Any, rows: dict[float, dict], best_w: float, default_w: float, point: Any, gpu_id: str,
                    args: argparse.Namespace, objective: str) -> dict[str, Any]:  # fmt: skip
    chosen_w = float(plan.config.power_limit_w)
    swept = rows[chosen_w]["energy_per_sample_j"]
    predicted = gpu_energy_per_sample_j(point, gpu_id)
    slowdown = rows[default_w]["samples_per_s"] / rows[chosen_w]["samples_per_s"] - 1

    def cost(limit_w: float) -> float:
        return sweep_cost(rows, limit_w, objective, default_w)

    return {
        "chosen_limit_w": chosen_w, "sweep_best_limit_w": best_w,
        "energy_per_sample_gap": swept / rows[best_w]["energy_per_sample_j"] - 1,
        "objective_cost_gap": cost(chosen_w) / cost(best_w) - 1, "chosen_slowdown_on_sweep": slowdown,
        "chosen_within_max_slowdown_on_sweep": slowdown <= args.max_slowdown + 1e-9,
        "predicted_gpu_energy_per_sample_j": predicted, "sweep_energy_per_sample_j": swept,
        "predicted_vs_sweep_error": _rel(predicted, swept),
        "planner_energy_per_sample_j_with_cpu_estimate": point.energy_per_sample_j, "plan_reason": plan.reason,
    }  # fmt: skip


def planner_view(gpu: Gpu, workload: dict[str, Any], prof: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The planner's choice per objective against the sweep, and the profile's error per limit (GPU energy)."""
    from carbonflow.planning import plan_job

    rows = {r["limit_w"]: r for r in workload["limits"]}
    points = {p.config.power_limit_w: p for p in prof.points}
    errors = {
        f"{w:g}": _rel(gpu_energy_per_sample_j(points[w], gpu.dev.id), rows[w]["energy_per_sample_j"])
        for w in points
        if w in rows
    }
    default_w = min(rows, key=lambda w: abs(w - gpu.info["default_limit_w"]))
    choices = {}
    for objective in OBJECTIVES:
        plan = plan_job(job_spec(workload["name"], list(rows), args, objective), prof, None, NOW)
        best_w = sweep_best_w(workload["limits"], objective, args.max_slowdown, default_w)
        point = points[float(plan.config.power_limit_w)]
        choices[objective] = choice_vs_sweep(plan, rows, best_w, default_w, point, gpu.dev.id, args, objective)
    return {"choices": choices, "profile_error_per_limit": errors}


# ---------------------------------------------------------------------------------------------------------------
# The pair: both trainings at once, each alone, the energy split, the pair predictor.
# ---------------------------------------------------------------------------------------------------------------


def run_together(gpu: Gpu, names: list[str], args: argparse.Namespace, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    trainings = [Training.start(n, args, env) for n in names]
    try:
        for t in trainings:
            t.wait_started(args.start_timeout_s)
        return measure_window(gpu, trainings, args.warmup_s, args.pair_steady_s)
    finally:
        for t in trainings:
            t.stop()


def _shares(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {k: v / total for k, v in values.items()} if total > 0 else {}


def pair_result(pair: dict[str, Any], solo: dict[str, dict[str, Any]], util_source: str) -> dict[str, Any]:
    """Slowdowns, the counter's energy, carbonflow's split and the utilisation split against solo energy."""
    from carbonflow.accounting.energy import SoloProfile, split_shared_gpu_energy_j

    names = list(pair["per"])
    kept = {n: pair["per"][n]["samples_per_s"] / solo[n]["per"][n]["samples_per_s"] for n in names}
    solo_eps = {n: solo[n]["avg_power_w"] / solo[n]["per"][n]["samples_per_s"] for n in names}
    solo_energy = {n: pair["per"][n]["samples"] * solo_eps[n] for n in names}  # each alone, the same work
    counter_j = pair["energy_j"]
    split = split_shared_gpu_energy_j(
        counter_j, [SoloProfile(n, solo[n]["avg_power_w"], min(1.0, kept[n])) for n in names]
    )
    util_key = {"nvml": "sm_util", "fake": "busy_s"}.get(util_source.split(":")[0])
    util_share = _shares({n: pair["per"][n][util_key] for n in names}) if util_key else {}
    solo_share = _shares(solo_energy)
    split_share = _shares(split)
    return {
        "jobs": names, "power_limit_w": pair["limit_w"], "kept_speed": kept,
        "slowdown": {n: 1 / kept[n] for n in names}, "counter_energy_j": counter_j, "window_s": pair["wall_s"],
        "samples": {n: pair["per"][n]["samples"] for n in names},
        "solo_energy_same_work_j": solo_energy, "carbonflow_split_j": split,
        "utilisation_split_j": {n: s * counter_j for n, s in util_share.items()}, "utilisation_source": util_source,
        "split_sum_vs_counter_error": _rel(sum(split.values()), counter_j),
        "split_vs_solo_error_max": max(abs(split_share[n] - solo_share[n]) for n in names),
        "utilisation_split_vs_solo_error_max": (
            max(abs(util_share[n] - solo_share[n]) for n in names) if util_share else None
        ),
        "error_is": "largest difference between a job's share of the counter's energy and its share of the two "
        "jobs' solo energy for the same work",
        "co_location_saving": 1 - counter_j / sum(solo_energy.values()),
    }  # fmt: skip


def predicted_pair(profiles: dict[str, Any], measured_kept: dict[str, float]) -> dict[str, Any]:
    """carbonflow's pair predictor (fitted on Gavel's V100 pairs) on the two solo profiles, against the pair."""
    sys.path.insert(0, str(BENCH))
    from pair_prediction import gavel_outcomes, gavel_solo_features

    from carbonflow.planning.pairs import fit_pair_predictor, solo_features

    predictor = fit_pair_predictor(gavel_solo_features(), gavel_outcomes())
    a, b = (dataclasses.replace(solo_features(prof), job=name) for name, prof in profiles.items())
    p = predictor.predict(a, b)
    predicted = {a.job: p.kept_speed_a, b.job: p.kept_speed_b}
    return {
        "model": "carbonflow.planning.pairs' pair predictor fitted on Gavel's measured V100 pairs",
        "predicted_kept_speed": predicted, "measured_kept_speed": measured_kept,
        "abs_error": {n: abs(predicted[n] - measured_kept[n]) for n in predicted},
    }  # fmt: skip


@contextlib.contextmanager
def mps_daemon(root: Path):  # type: ignore[no-untyped-def]
    """Start NVIDIA MPS's control daemon in private directories; yields the clients' env, or None with why."""
    pipe, logs = root / "mps-pipe", root / "mps-log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    try:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **env}, check=True, timeout=30,
                       capture_output=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        yield None, f"nvidia-cuda-mps-control -d failed: {exc}"
        return
    try:
        yield env, None
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env={**os.environ, **env}, timeout=30,
                       check=False)  # fmt: skip


def _util_source(gpu: Gpu, pair: dict[str, Any]) -> str:
    if gpu.fake:
        return "fake: busy time the simulated GPU gave each process"
    if all(p["sm_util"] > 0 for p in pair["per"].values()):
        return "nvml"
    return "none: NVML gave no per-process utilisation samples"


def solo_runs(gpu: Gpu, workloads: list[dict[str, Any]], limit_w: float, args: argparse.Namespace, budget: Budget):  # type: ignore[no-untyped-def]
    """Each training alone at the pair's limit: rerun now, or (budget short) the sweep's window at that limit."""
    names = [w["name"] for w in workloads]
    rows = {w["name"]: next((r for r in w["limits"] if abs(r["limit_w"] - limit_w) <= 1.0), None) for w in workloads}
    if budget.allows(budget.pair_s(len(names))) or None in rows.values():
        return {n: run_together(gpu, [n], args) for n in names}, "each alone, right after the pair"
    solo = {
        n: {"avg_power_w": r["avg_power_w"], "per": {n: {"samples_per_s": r["samples_per_s"]}}} for n, r in rows.items()
    }
    return solo, "the sweep's window at the same limit (--budget-s left no time to rerun each alone)"


def pair_phase(gpu: Gpu, result_so_far: dict[str, Any], profiles: dict[str, Any], args: argparse.Namespace,
               budget: Budget) -> dict[str, Any]:  # fmt: skip
    names = list(WORKLOADS)
    limit_w = gpu.dev.power_limit_w()
    pair = {**run_together(gpu, names, args), "limit_w": limit_w}
    solo, solo_source = solo_runs(gpu, result_so_far["workloads"], limit_w, args, budget)
    result = {"time_slicing": {**pair_result(pair, solo, _util_source(gpu, pair)), "solo_source": solo_source}}
    result["prediction"] = predicted_pair(profiles, result["time_slicing"]["kept_speed"])
    result["mps"] = mps_pair(gpu, names, solo, args, budget)
    return result


def mps_pair(gpu: Gpu, names: list[str], solo: dict[str, Any], args: argparse.Namespace, budget: Budget) -> dict:
    if gpu.fake:
        return {"measured": False, "why": "--fake: no MPS daemon on the fake node"}
    if not budget.allows(budget.pair_s(1)):
        return {"measured": False, "why": "skipped: --budget-s leaves too little time"}
    with mps_daemon(args.workdir) as (env, why):
        if env is None:
            return {"measured": False, "why": why}
        try:
            pair = {**run_together(gpu, names, args, env), "limit_w": gpu.dev.power_limit_w()}
        except RuntimeError as exc:  # optional: the trainings could not run as MPS clients
            return {"measured": False, "why": f"MPS daemon started but the pair failed: {exc}"}
    return {"measured": True, **pair_result(pair, solo, "nvml")}


# ---------------------------------------------------------------------------------------------------------------
# Budget, outputs, main.
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Budget:
    """Wall-clock budget of the whole run: the required phases are sized to fit, optional ones skipped if not."""

    total_s: float
    warmup_s: float
    steady_s: float
    start_s: float
    pair_steady_s: float = 10.0
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.total_s - (time.monotonic() - self.started)

    def allows(self, need_s: float) -> bool:
        return self.left_s() >= need_s

    def window_s(self) -> float:
        return self.warmup_s + self.steady_s + 0.5

    def sweep_s(self, limits: int) -> float:
        return len(WORKLOADS) * (self.start_s + limits * self.window_s())

    def pair_s(self, runs: int) -> float:
        """``runs`` trainings started one after another, each measured once over --pair-steady-s."""
        return runs * (self.start_s + self.warmup_s + self.pair_steady_s + 0.5)


def write_trace(path: Path, result: dict[str, Any]) -> None:
    """The trace as data: one row per (workload, limit), labelled with its GPU, driver, date and label."""
    path.parent.mkdir(parents=True, exist_ok=True)
    gpu = result["gpu"]
    fields = ["gpu", "driver", "date", "label", "workload", "batch_size", "limit_w", "samples_per_s", "avg_power_w",
              "energy_per_sample_j", "steady_s", "sm_clock_mhz"]  # fmt: skip
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for w in result["workloads"]:
            for r in w["limits"]:
                writer.writerow({
                    "gpu": gpu["name"], "driver": gpu["driver"], "date": result["date"], "label": result["label"],
                    "workload": w["name"], "batch_size": w["config"]["batch_size"],
                    **{k: r[k] for k in fields[6:]},
                })  # fmt: skip


def write_plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["workloads"]), figsize=(5 * len(result["workloads"]), 3.6))
    for ax, w in zip(axes, result["workloads"], strict=True):
        rows = sorted(w["limits"], key=lambda r: r["limit_w"])
        ax.plot([r["limit_w"] for r in rows], [r["energy_per_sample_j"] for r in rows], "o-")
        choice = result["planner_choice_vs_sweep_best"][w["name"]]["energy"]
        ax.axvline(choice["chosen_limit_w"], ls="--", color="grey", label="planner's choice (energy)")
        ax.axvline(choice["sweep_best_limit_w"], ls=":", color="green", label="sweep's best (energy)")
        ax.set(title=f"{w['name']} ({result['label']})", xlabel="power limit (W)", ylabel="energy per sample (J)")
        ax.legend()
    fig.suptitle(f"{result['gpu']['name']}, driver {result['gpu']['driver']}, {result['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    choices = [c for w in result["planner_choice_vs_sweep_best"].values() for c in w.values()]
    gap = max(c["energy_per_sample_gap"] for c in choices)
    pair = result["pair"]["time_slicing"]
    met = {
        "planner_gap": gap <= GOALS["choice_gap"] and all(c["chosen_within_max_slowdown_on_sweep"] for c in choices),
        "profile_prediction_error": result["profile_prediction_error"]["max"] <= GOALS["profile_error"],
        "split_sum_vs_counter": pair["split_sum_vs_counter_error"] <= GOALS["split_sum"],
        "split_vs_solo": pair["split_vs_solo_error_max"] <= GOALS["split_vs_solo"],
    }
    return {
        "goals_met": met, "planner_gap_max": gap, "planner_gap_goal": GOALS["choice_gap"],
        "profile_prediction_error_max": result["profile_prediction_error"]["max"],
        "profile_prediction_error_goal": GOALS["profile_error"],
        "split_sum_vs_counter_error": pair["split_sum_vs_counter_error"], "split_sum_goal": GOALS["split_sum"],
        "split_vs_solo_error_max": pair["split_vs_solo_error_max"], "split_vs_solo_goal": GOALS["split_vs_solo"],
        "utilisation_split_vs_solo_error_max": pair["utilisation_split_vs_solo_error_max"],
    }  # fmt: skip


def fake_node(root: Path) -> dict[str, str]:
    """Under --fake: one fake GPU (the range of the replayed V100 measurements) and the env every process needs."""
    sys.path.insert(0, str(REPO))
    from carbonflow.energy.simulated import ZeusPowerModel
    from tests.fakes.node import FakeNode

    fake = WORKLOADS["resnet50_bf16"]["fake"]
    model = ZeusPowerModel.load("V100", fake["dataset"], fake["network"], fake["batch_size"])
    low_mw, high_mw = int(model.min_power_limit_w * 1000), int(model.max_power_w * 1000)
    node = FakeNode(root / "node")
    node.nvml.make_state(str(node.state_path), [{"min_limit_mw": low_mw, "max_limit_mw": high_mw,
                                                 "default_limit_mw": high_mw, "limit_mw": high_mw}])  # fmt: skip
    env = {"CARBONFLOW_NODE_DIR": str(root / "node" / "node-dir"), **node.env()}
    sys.path.insert(0, str(FAKE_NVML_DIR))
    return {k: v for k, v in env.items() if k == "PYTHONPATH" or k.startswith(("CARBONFLOW_", "FAKE_PYNVML_"))}


def check_args(args: argparse.Namespace) -> None:
    """Refuse what would not answer the issue, naming the flag, its value and what is allowed."""
    if args.limits < 5:
        raise SystemExit(f"--limits={args.limits} is not allowed; the sweep needs at least 5 power limits")
    if not args.fake and args.steady_s < MIN_STEADY_S_HARDWARE:
        raise SystemExit(f"--steady-s={args.steady_s:g} is not allowed on hardware; use >= {MIN_STEADY_S_HARDWARE:g} s")
    for flag, value in (("--steady-s", args.steady_s), ("--pair-steady-s", args.pair_steady_s),
                        ("--budget-s", args.budget_s)):  # fmt: skip
        if not value > 0:
            raise SystemExit(f"{flag}={value:g} is not allowed; it must be > 0 seconds")
    if args.warmup_s < 0:
        raise SystemExit(f"--warmup-s={args.warmup_s:g} is not allowed; it must be >= 0 seconds")
    if not args.fake and not args.change_gpu_settings:
        raise SystemExit(
            "this run changes the GPU's power limit (restored after each window) and locks its SM clock once "
            "(reset after); give --change-gpu-settings where the machine's owner allows that, or use --fake"
        )


@contextlib.contextmanager
def _timed(seconds: dict[str, float], phase: str):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    try:
        yield
    finally:
        seconds[phase] = round(time.monotonic() - started, 1)
        print(f"{phase}: {seconds[phase]:.1f} s", flush=True)


def planner_phase(gpu: Gpu, args: argparse.Namespace, result: dict[str, Any], limits: list[float]) -> dict[str, Any]:
    """Profile each job with carbonflow's profiler; the planner's choices and the profile's errors vs the sweep."""
    profiles, views = {}, {}
    for w in result["workloads"]:
        prof, seconds = profile(gpu, w["name"], limits, args)
        profiles[w["name"]] = prof
        views[w["name"]] = planner_view(gpu, w, prof, args)
        result["profiles"][w["name"]] = {"seconds": seconds, "points": len(prof.points), "notes": prof.notes}
    result["planner_choice_vs_sweep_best"] = {n: v["choices"] for n, v in views.items()}
    errors = {n: v["profile_error_per_limit"] for n, v in views.items()}
    worst = max(e for v in errors.values() for e in v.values())
    result["profile_prediction_error"] = {"per_workload": errors, "max": worst}
    return profiles


def required_s(budget: Budget, args: argparse.Namespace, limits: int) -> float:
    """Seconds the required phases are budgeted: the sweep, both profiles, the pair (solo runs may reuse the sweep)."""
    return budget.sweep_s(limits) + len(WORKLOADS) * args.profile_budget_s + budget.pair_s(1)


def phases(gpu: Gpu, args: argparse.Namespace, budget: Budget, result: dict[str, Any]) -> None:
    """Sweep, planner's view and pair (sized to fit --budget-s up front); the locked clock if time is left."""
    limits = sweep_limits_w(gpu, args.limits)
    need = required_s(budget, args, len(limits))
    if not budget.allows(need):
        raise SystemExit(f"--budget-s={args.budget_s:g} is too short: the sweep, profiles and pair need ~{need:.0f} s")
    timed = result.setdefault("phase_s", {})
    print(f"sweep at {limits} W on {gpu.info['name']}", flush=True)
    with _timed(timed, "sweep"):
        result["workloads"] = []  # filled as each finishes: a run stopped later keeps them
        for name in WORKLOADS:
            result["workloads"].append(sweep_workload(gpu, name, limits, args))
    with _timed(timed, "profiles"):
        profiles = planner_phase(gpu, args, result, limits)
    with _timed(timed, "pair"):
        result["pair"] = pair_phase(gpu, result, profiles, args, budget)
    with _timed(timed, "locked_clock"):
        enough = budget.allows(budget.pair_s(1))
        result["locked_clock"] = (
            locked_clock(gpu, result["workloads"][0], args) if enough else {"measured": False, "why": "budget"}
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_args(args)
    args.workdir = Path(tempfile.mkdtemp(prefix="gpu-sweep-"))
    if args.fake:
        os.environ.update(fake_node(args.workdir))
    budget = Budget(args.budget_s, args.warmup_s, args.steady_s, args.start_s, args.pair_steady_s)
    gpu = Gpu.open(args.fake)
    label = "fake" if args.fake else "measured"
    result: dict[str, Any] = {
        "label": label, "date": datetime.now(UTC).isoformat(timespec="seconds"), "gpu": gpu.info,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "goals": GOALS, "profiles": {},
        "settings": {k: v for k, v in vars(args).items() if k not in ("workdir", "command")},
    }  # fmt: skip
    if args.fake:
        result["fake_note"] = ("fake NVML driver + simulated GPU replaying Zeus's V100 measurements and Gavel's V100 "
                               "pair speeds: checks the plumbing, not the hardware")  # fmt: skip
    try:
        phases(gpu, args, budget, result)
        result["summary"] = summary(result)
    except Exception as exc:  # a one-shot device run: keep what was measured, and why it stopped
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        result["gpu"]["limit_at_end_w"] = gpu.dev.power_limit_w()
        result["wall_s"] = round(time.monotonic() - budget.started, 1)
        if not args.keep_workdir:
            shutil.rmtree(args.workdir, ignore_errors=True)
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command")
    t = sub.add_parser("train", help="(internal) one training process")
    t.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    t.add_argument("--fake", action="store_true")
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--fake-torch", action="store_true")
    p.add_argument("--fake", action="store_true", help="fake NVML node + simulated GPU; writes --out, labelled fake")
    p.add_argument("--fake-torch", action="store_true", help="--fake: also train tiny torch models on the CPU")
    p.add_argument("--out", type=Path, default=None, help=f"result JSON (default {RESULTS.relative_to(REPO)})")
    p.add_argument("--budget-s", type=float, default=450.0, help="whole run's wall-clock budget (s)")
    p.add_argument("--limits", type=int, default=5, help="power limits in the sweep (>= 5)")
    p.add_argument("--steady-s", type=float, default=20.0, help="measured seconds per limit (>= 20 on hardware)")
    p.add_argument("--pair-steady-s", type=float, default=10.0, help="measured seconds of the pair, solo, clock runs")
    p.add_argument("--warmup-s", type=float, default=3.0, help="settling seconds after each limit change")
    p.add_argument("--start-s", type=float, default=15.0, help="budgeted seconds for one training's start")
    p.add_argument("--start-timeout-s", type=float, default=120.0)
    p.add_argument("--profile-steps", type=int, default=30)
    p.add_argument("--profile-warmup-steps", type=int, default=5)
    p.add_argument("--profile-min-window-s", type=float, default=2.0)
    p.add_argument("--profile-budget-s", type=float, default=40.0, help="budgeted seconds for one job's profile")
    p.add_argument("--max-slowdown", type=float, default=0.10)
    p.add_argument("--keep-workdir", action="store_true", help="keep the trainings' logs and progress files")
    p.add_argument("--change-gpu-settings", action="store_true",
                   help="allow changing the power limit (restored) and locking the SM clock (reset)")  # fmt: skip
    args = p.parse_args(argv)
    if args.command is None and args.fake and args.out is None:
        p.error("--fake writes only where --out says (never benchmarks/results/gpu_sweep.json)")
    return args


def no_gpu_here() -> str | None:
    """Why NVML shows no GPU on this machine, or None when it shows one."""
    from carbonflow.energy.errors import NvmlUnavailable
    from carbonflow.energy.nvml import nvml_devices

    try:
        return None if nvml_devices() else "NVML shows no GPU"
    except NvmlUnavailable as exc:
        return str(exc)


def write_trace_readme(trace: Path, result: dict[str, Any]) -> None:
    """Provenance and licence of the published trace, from the run that measured it."""
    gpu = result["gpu"]
    trace.with_name("README.md").write_text(
        f"""# GPU power-limit sweep trace ({result["label"]})

`{trace.name}`: two trainings on synthetic data (configs in `benchmarks/gpu_sweep.py`, `WORKLOADS`), each held at
{len(result["workloads"][0]["limits"])} power limits for {result["settings"]["steady_s"]:g} s after
{result["settings"]["warmup_s"]:g} s of settling; one row per (workload, limit): samples/s from the training's own
timestamps, average power and energy per sample from the NVML total-energy counter, the mean SM clock.

- GPU: {gpu["name"]} (driver {gpu["driver"]}), limits {gpu["min_limit_w"]:g}-{gpu["max_limit_w"]:g} W,
  default {gpu["default_limit_w"]:g} W
- measured: {result["date"]}, by `{result["command"]}` (carbonflow issue #27)
- the whole result, with the planner's choices and the co-located pair: `benchmarks/results/gpu_sweep.json`
- licence: Apache-2.0, as carbonflow (measured by this project; no third-party data in it)
""",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "train":
        return train(args.workload, args.fake, args.max_steps, args.fake_torch)
    why = None if args.fake else no_gpu_here()
    if why is not None:
        print(f"gpu_sweep: nothing measured, no GPU here ({why}); run it on an NVIDIA GPU, or with --fake --out PATH")
        return 0
    result = run(args)
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if "error" in result:
        print(f"gpu_sweep stopped: {result['error']}; what it measured is in {out}")
        return 1
    trace = (out.parent / "gpu_sweep_trace.csv") if args.fake else TRACE_DIR / "trace.csv"
    write_trace(trace, result)
    if not args.fake:
        write_trace_readme(trace, result)
    write_plot(out.with_suffix(".png"), result)
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}, {trace}, {out.with_suffix('.png')} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
