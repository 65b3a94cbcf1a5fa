"""On a real GPU: carbonflow's energy and power-limit control checked against the hardware, in one run.

Everything goes through carbonflow's own code paths: the NVML device (``carbonflow.energy.nvml``), the energy
monitor and its windows and the power sampler (``carbonflow.energy.monitor``), the ``carbonflow run`` wrapper
with its GPU lease, restore journal and training guard, and ``python -m carbonflow.energy.power_limit restore``.
A real training drives the GPU: a ResNet-50 built from its definition (torchvision, no weights) on synthetic
images, in phases the checker switches through a file (warm-up, steady, a lighter phase at a quarter of the
batch with the GPU idle half the time).

1. **Energy truth.** Per phase, carbonflow's window energy against the delta of
   ``nvmlDeviceGetTotalEnergyConsumption`` read beside it, and the wrapper's own run energy against the
   counter over the wrapper's run. On the same run, the energy a polled power sampler would report at 0.1, 1,
   10, 15 and 30 s (CodeCarbon's, MLflow system metrics' and dcgm-exporter's intervals): the power read by
   carbonflow's ``PowerSampler`` every 0.1 s, taken every N-th read from every start offset, each read held for
   one interval, against the counter over the same span. The sampler's own CPU time is its thread's clock.
2. **Control truth** (``--control``). ``read-only`` (the default) reads the limit range, default and current
   limit and changes nothing; ``probe`` also sets the limit to the value it already has (whether the driver
   lets this process set limits, and the exact NVML error if not) and runs the scenarios at that value (the
   journal and restore paths run, no limit changes); ``full`` (a GPU you own) runs them at a lowered limit:
   normal exit, the wrapper SIGKILLed (then the next wrapper, and separately the restore command, put it
   back), the training SIGKILLed, the wrapper SIGTERMed. In every mode each scenario checks that the training
   dies with its wrapper. A limit left lowered by the check is put back at the end whatever happened, and said.
3. **Identity.** GPU UUIDs and NVML (host) indices, ``CUDA_VISIBLE_DEVICES`` given as an index, a UUID and
   UUID prefixes, the training pinned by UUID as the wrapper does, and the lease held under the GPU's UUID.

Run on a GPU (docs/gpu-check.md gives the one command for a machine without network)::

    python benchmarks/gpu_check.py [--minutes 7] [--control read-only|probe|full] [--vm-kind NAME]
        → benchmarks/results/gpu_check.json (or --out), labelled with the GPU, driver, VM kind and date

With ``--fake`` it runs end to end on the fake NVML node (tests/energy/fake_pynvml: an H100-like GPU whose power
the training sets per phase) and writes ``--out``, labelled ``"fake"``: never hardware figures. Without a GPU
and without ``--fake`` it says so and exits 0 (``make bench`` runs every benchmark).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import csv
import importlib.util
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
FAKE_NVML_DIR = REPO / "tests" / "energy" / "fake_pynvml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_check.json"

POLL_INTERVALS_S = (0.1, 1.0, 10.0, 15.0, 30.0)
"""CodeCarbon (15 s), MLflow system metrics (10 s), dcgm-exporter (30 s by default; 1 s and 0.1 s for reference)."""
TRACE_INTERVAL_S = 0.1
MAX_START_OFFSETS = 20
ENERGY_ERROR_GOAL = 0.01
SAMPLER_CPU_GOAL = 0.01
LOWERED_FRACTION = 0.8
"""``--control full`` lowers the limit to this fraction of the current one (within the GPU's range)."""
PHASES = ("warmup", "steady", "light")
PHASE_SHARES = {"warmup": 0.15, "steady": 0.6, "light": 0.25}
RESERVED_S = {"real": 180.0, "fake": 40.0}
"""Seconds of ``--minutes`` kept for start-up, identity and control; the rest goes to the energy phases."""
MARKER_TIMEOUT_S = {"real": 180.0, "fake": 60.0}
SCENARIO_S = {"real": 30.0, "fake": 3.0}
"""About what one control scenario takes: one is started only while that much of the budget is left."""
CONTROL_MODES = ("read-only", "probe", "full")
MODELS = ("resnet50", "tiny", "loop")
SECTIONS = ("identity", "energy", "control")
SAMPLER_THREAD = "carbonflow-power-sampler"

FAKE_GPU = {
    "name": "NVIDIA H100 80GB HBM3 (fake NVML)", "arch": 9, "min_limit_mw": 200000, "max_limit_mw": 700000,
    "default_limit_mw": 700000, "limit_mw": 700000, "load_power_mw": 70000,
}  # fmt: skip
FAKE_PHASE_POWER_W = {"warmup": 450.0, "steady": 650.0, "light": 300.0, "idle": 70.0}
"""What the fake GPU draws while the training is in each phase (set by the training itself)."""


class CheckError(RuntimeError):
    """A step of the check could not run (the message says which and why)."""


# --- the training (a child of the wrapper: standard library and torch only, no carbonflow) -----------------


def _build_step(model: str, batch_size: int) -> tuple[Callable[[int], None], dict[str, Any]]:
    """One synchronous training step of ``bs`` samples, and what the training runs on."""
    if model == "loop":
        return (lambda bs: sum(i * i for i in range(2000 * bs)) and None), {"device": "cpu", "torch": None}
    import torch

    cuda = torch.cuda.is_available()
    if model == "resnet50" and not cuda:
        raise CheckError(
            f"model=resnet50 needs a CUDA GPU; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"
        )
    dev = torch.device("cuda" if cuda else "cpu")
    if model == "resnet50":
        import torchvision

        net = torchvision.models.resnet50(weights=None).to(dev, memory_format=torch.channels_last)
        x = torch.randn(batch_size, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch_size,), device=dev)
    else:
        net = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
        x, y = torch.randn(batch_size, 512, device=dev), torch.randint(0, 10, (batch_size,), device=dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step(bs: int) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(net(x[:bs]), y[:bs])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    info: dict[str, Any] = {
        "device": str(dev),
        "torch": torch.__version__,
        "cuda_device_count": torch.cuda.device_count(),
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info["cuda_device_name"] = props.name
        info["cuda_device_uuid"] = str(getattr(props, "uuid", "")) or None
    return step, info


def _fake_power_setter(state_path: str | None) -> Callable[[str], None]:
    """Under --fake: the training sets the fake GPU's draw per phase, as a real training's work would."""
    if not state_path:
        return lambda phase: None
    spec = importlib.util.spec_from_file_location("fake_pynvml_training", FAKE_NVML_DIR / "pynvml.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    uuids = [d["uuid"] for d in fake.read_state(state_path)["devices"]]
    index = uuids.index(uuid) if uuid in uuids else 0

    def set_phase(phase: str) -> None:
        fake.update_device(state_path, index, load_power_mw=int(FAKE_PHASE_POWER_W[phase] * 1000))

    return set_phase


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _read_phase(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip() or "warmup"
    except OSError:
        return "warmup"


def train_main(argv: Sequence[str]) -> int:
    """``gpu_check.py _train``: train until the phase file says stop (or --max-s passes), reporting progress."""
    parser = argparse.ArgumentParser(prog="gpu_check.py _train")
    parser.add_argument("--phase-file", type=Path, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-s", type=float, required=True)
    parser.add_argument("--fake-state", default=None)
    args = parser.parse_args(argv)
    step, info = _build_step(args.model, args.batch_size)
    set_power = _fake_power_setter(args.fake_state)
    progress = os.environ.get("CARBONFLOW_PROGRESS_FILE")
    start, steps, samples, phase = time.monotonic(), 0, 0, ""
    try:
        while time.monotonic() - start < args.max_s:
            now_phase = _read_phase(args.phase_file)
            if now_phase == "stop":
                break
            if now_phase != phase:
                phase = now_phase
                set_power(phase)
            bs = max(1, args.batch_size // 4) if phase == "light" else args.batch_size
            t0 = time.monotonic()
            step(bs)
            took_s = time.monotonic() - t0
            steps, samples = steps + 1, samples + bs
            if progress:
                with open(progress, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"step": steps, "samples": samples, "t_s": time.monotonic()}) + "\n")
            if steps == 1:
                seen = {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **info}
                _write_atomic(args.marker, json.dumps(seen))
            if phase == "light":
                time.sleep(took_s)  # the GPU idles half the time: a data-loading-bound phase
    finally:
        set_power("idle")
    return 0


# --- pure analysis (unit-tested) -----------------------------------------------------------------------


def relative_error(value: float, truth: float) -> float | None:
    """(value - truth) / truth; None when the truth is not positive."""
    return (value - truth) / truth if truth > 0 else None


def _interp(times: Sequence[float], values: Sequence[float], t: float) -> float:
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    return values[i - 1] + (values[i] - values[i - 1]) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)


def polled_energy_error(
    times_s: Sequence[float],
    power_w: Sequence[float],
    counter_j: Sequence[float],
    interval_s: float,
    span: tuple[float, float],
    max_offsets: int = MAX_START_OFFSETS,
) -> dict[str, Any] | None:
    """What a sampler polling power every ``interval_s`` would report over ``span``, against the counter.

    The sampler reads the power at ``t0 + offset + k·interval`` (the trace's latest read at or before that
    time) and holds it for one interval. Each start offset (up to ``max_offsets``, no finer than the trace)
    covers whole intervals inside the span; its truth is the counter's delta over exactly those intervals.
    Returns the median and largest |relative error| over the offsets and their signed mean; None when the span
    holds no whole interval.
    """
    t0, t1 = span
    gaps = [b - a for a, b in itertools.pairwise(times_s)]
    resolution = statistics.median(gaps) if gaps else interval_s
    step = max(interval_s / max_offsets, resolution)
    errors, polls = [], []
    offset = 0.0
    while offset < interval_s - 1e-9 and t0 + offset + interval_s <= t1 + 1e-9:
        n = int((t1 - t0 - offset) / interval_s + 1e-9)
        start = t0 + offset
        energy = 0.0
        for k in range(n):
            i = bisect.bisect_right(times_s, start + k * interval_s + 1e-9) - 1
            energy += power_w[max(i, 0)] * interval_s
        truth = _interp(times_s, counter_j, start + n * interval_s) - _interp(times_s, counter_j, start)
        err = relative_error(energy, truth)
        if err is not None:
            errors.append(err)
            polls.append(n)
        offset += step
    if not errors:
        return None
    magnitudes = [abs(e) for e in errors]
    return {
        "median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
        "mean_signed": statistics.fmean(errors), "start_offsets": len(errors), "polls_per_offset": min(polls),
    }  # fmt: skip


def limit_restored(mode: str, original_w: float, during_w: float | None, after_w: float | None) -> bool | None:
    """Whether a scenario shows a lowered limit put back: only ``full`` lowers one (else None: not shown)."""
    if mode != "full":
        return None
    lowered = during_w is not None and during_w < original_w - 0.5
    return bool(lowered and after_w is not None and abs(after_w - original_w) <= 0.5)


# --- the node: environment, wrappers, the restore command ----------------------------------------------


@dataclass
class Node:
    """Where the check runs: its folders, its subprocesses' environment, the fake driver state (--fake)."""

    root: Path
    env: dict[str, str]
    fake_state: str | None
    log_path: Path
    procs: list[subprocess.Popen] = field(default_factory=list)


def setup_node(fake: bool, root: Path, log_path: Path) -> Node:
    """Private lease, journal and home folders for the check (every subprocess shares them), and the fake."""
    env = {k: v for k, v in os.environ.items() if k != "CARBONFLOW_RESULT_KEY"}
    node_dir = root / "node"
    env.update({
        "CARBONFLOW_HOME": str(root / "home"), "CARBONFLOW_NODE_DIR": str(node_dir),
        "CARBONFLOW_GPU_LEASE_DIR": str(node_dir / "gpu-leases"),
        "CARBONFLOW_POWER_JOURNAL_DIR": str(node_dir / "power-journal"), "CARBONFLOW_GPU_WAIT_S": "60",
        "PYTHONUNBUFFERED": "1",
    })  # fmt: skip
    for name in ("ZEUSD_SOCK_PATH", "CARBONFLOW_TRAINING_UID", "CARBONFLOW_TRAINING_GID"):
        env.pop(name, None)
    state = None
    if fake:
        spec = importlib.util.spec_from_file_location("fake_pynvml_setup", FAKE_NVML_DIR / "pynvml.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        state = str(root / "nvml_state.json")
        module.make_state(state, [dict(FAKE_GPU)])
        env["FAKE_PYNVML_STATE"] = state
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_NVML_DIR), env.get("PYTHONPATH")) if p)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        sys.path.insert(0, str(FAKE_NVML_DIR))
    os.environ.clear()
    os.environ.update(env)  # this process's carbonflow calls use the same folders as its subprocesses
    return Node(root=root, env=env, fake_state=state, log_path=log_path)


def _pynvml_module() -> Any:
    from carbonflow.energy.nvml import nvml_init

    return nvml_init()


def _run_dir(node: Node, name: str) -> Path:
    path = node.root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_wrapper(node: Node, name: str, limit_w: float | None, command: list[str]) -> subprocess.Popen:
    """``carbonflow run`` for one run of the check; its files go to ``<root>/<name>/``."""
    from carbonflow.domain import Config, JobSpec, Plan

    run_dir = _run_dir(node, name)
    job = JobSpec(name=f"gpu-check-{name}"[:63], command=["true"], steps=1, region="GB")
    plan = Plan(
        job=job.name, config=Config(containers=1, power_limit_w=limit_w), start=datetime.now(UTC),
        predicted_duration_s=1, predicted_energy_j=1, predicted_emissions_g=1, region="GB",
        forecast_provider="gpu-check", reason="benchmarks/gpu_check.py",
    )  # fmt: skip
    (run_dir / "job.json").write_text(job.model_dump_json(), encoding="utf-8")
    (run_dir / "plan.json").write_text(plan.model_dump_json(), encoding="utf-8")
    with (run_dir / "stdout").open("w") as out, (run_dir / "stderr").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "carbonflow.cli", "run", "--job", str(run_dir / "job.json"),
             "--plan", str(run_dir / "plan.json"), "--result", str(run_dir / "result.json"), "--", *command],
            env=node.env, stdout=out, stderr=err, cwd=node.root,
        )  # fmt: skip
    node.procs.append(proc)
    return proc


def training_command(node: Node, args: argparse.Namespace, name: str, max_s: float) -> list[str]:
    run_dir = _run_dir(node, name)
    cmd = [sys.executable, str(SCRIPT), "_train", "--phase-file", str(run_dir / "phase"),
           "--marker", str(run_dir / "marker.json"), "--model", args.model, "--batch-size", str(args.batch_size),
           "--max-s", f"{max_s:g}"]  # fmt: skip
    return [*cmd, "--fake-state", node.fake_state] if node.fake_state else cmd


def set_phase(node: Node, name: str, phase: str) -> None:
    _write_atomic(_run_dir(node, name) / "phase", phase)


def _tail(path: Path, chars: int = 1500) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    return ""


def wait_marker(node: Node, name: str, proc: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    """The training's first-step marker (it is training); CheckError with the wrapper's stderr if it never comes."""
    marker = _run_dir(node, name) / "marker.json"
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if marker.exists():
            return json.loads(marker.read_text(encoding="utf-8"))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise CheckError(
        f"the training of run {name!r} did not start within {timeout_s:g} s (wrapper exit {proc.poll()}); "
        f"wrapper stderr: {_tail(_run_dir(node, name) / 'stderr')}"
    )


def wrapper_result(node: Node, name: str) -> dict[str, Any] | None:
    path = _run_dir(node, name) / "result.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def restore_command(node: Node) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "carbonflow.energy.power_limit", "restore"]
    return subprocess.run(command, env=node.env, cwd=node.root, capture_output=True, text=True, timeout=120)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_dead(pid: int, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def stop_all(node: Node) -> None:
    """End every wrapper the check started that still runs (its guard then ends the training)."""
    for proc in node.procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with node.log_path.open("a", encoding="utf-8") as log:
        for run_dir in sorted(p for p in node.root.iterdir() if (p / "stderr").exists()):
            log.write(
                f"==== {run_dir.name} (wrapper stderr, last 4000 characters)\n{_tail(run_dir / 'stderr', 4000)}\n"
            )


# --- 3. identity ---------------------------------------------------------------------------------------------


def identity(gpu: Any) -> dict[str, Any]:
    """UUIDs and host indices as NVML gives them; CUDA_VISIBLE_DEVICES forms resolved by carbonflow."""
    from carbonflow.energy.nvml import _as_str, nvml_devices

    nv = _pynvml_module()
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        entry = {
            "index": i,
            "uuid": _as_str(nv.nvmlDeviceGetUUID(handle)),
            "name": _as_str(nv.nvmlDeviceGetName(handle)),
        }
        with contextlib.suppress(nv.NVMLError, AttributeError):
            entry["nvml_index"] = nv.nvmlDeviceGetIndex(handle)
        gpus.append(entry)
    host_index = next(g["index"] for g in gpus if g["uuid"] == gpu.id)
    forms = {
        "index": str(host_index),
        "uuid": gpu.id,
        "uuid_prefix": gpu.id[:12],
        "uuid_without_gpu_prefix": gpu.id[4:],
    }
    resolves = {}
    for form, value in forms.items():
        resolved = [d.id for d in nvml_devices(cuda_visible_devices=value)]
        resolves[form] = resolved == [gpu.id]
    return {
        "gpus": gpus, "gpu_uuid": gpu.id, "host_index": host_index, "mig": gpu.mig,
        "nvml_index_matches": all(g.get("nvml_index", g["index"]) == g["index"] for g in gpus),
        "cuda_visible_devices_resolves": resolves,
    }  # fmt: skip


def training_identity(gpu: Any, marker: dict[str, Any], wrapper_pid: int) -> dict[str, Any]:
    """What the training saw (pinned by UUID) and the lease the wrapper holds, checked while it trains."""
    from carbonflow.energy.lease import lease_dir, lease_holder_pid, lease_is_held, safe_name

    torch_uuid = marker.get("cuda_device_uuid")
    return {
        "training_cuda_visible_devices": marker.get("cuda_visible_devices"),
        "training_pinned_by_uuid": marker.get("cuda_visible_devices") == gpu.id,
        "training_cuda_device_count": marker.get("cuda_device_count"),
        "torch_uuid_matches_nvml": None if not torch_uuid else gpu.id.removeprefix("GPU-") == torch_uuid.removeprefix(
            "GPU-"
        ),
        "lease_file_named_by_uuid": (lease_dir() / f"{safe_name(gpu.id)}.lock").exists(),
        "lease_held_while_training": lease_is_held(gpu.id),
        "lease_holder_is_wrapper": lease_holder_pid(gpu.id) == wrapper_pid,
    }  # fmt: skip


# --- 1. energy truth ----------------------------------------------------------------------------------------


def _thread_cpu_s(thread: threading.Thread | None) -> float:
    """The sampler thread's CPU clock (s); without the thread, the whole process's (an upper bound)."""
    if thread is None or thread.ident is None:
        return time.process_time()
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _read_trace(path: Path, gpu_id: str) -> tuple[list[float], list[float], list[float]]:
    times, power, energy = [], [], []
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["device_id"] == gpu_id:
                times.append(datetime.fromisoformat(row["timestamp_utc"]).timestamp())
                power.append(float(row["power_w"]))
                energy.append(float(row["energy_j"]))
    return times, power, energy


def _sleep_watching(proc: subprocess.Popen, seconds: float, name: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise CheckError(f"the wrapper of run {name!r} exited ({proc.returncode}) during a measured phase")
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def energy_truth(node: Node, args: argparse.Namespace, gpu: Any, phases_s: dict[str, float], out_dir: Path) -> dict:
    """Per-phase windows vs the counter, the wrapper's run vs the counter, polled samplers, sampler overhead."""
    from carbonflow.energy.monitor import EnergyMonitor, PowerSampler
    from carbonflow.energy.nvml import _as_str

    nv = _pynvml_module()
    handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)  # NvmlGpu.index is the NVML (host) index
    if _as_str(nv.nvmlDeviceGetUUID(handle)) != gpu.id:
        raise CheckError(f"NVML index {gpu.index} is not GPU {gpu.id}: the counter cannot be read beside carbonflow")

    def counter_j() -> float:
        return nv.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0

    name, trace = "energy", out_dir / f"{args.out.stem}_trace.csv"
    trace.unlink(missing_ok=True)
    set_phase(node, name, "warmup")
    monitor = EnergyMonitor([gpu])
    sampler = PowerSampler([gpu], TRACE_INTERVAL_S, trace).start()
    thread = next((t for t in threading.enumerate() if t.name == SAMPLER_THREAD), None)
    wall0, cpu0 = time.perf_counter(), _thread_cpu_s(thread)
    try:
        proc = start_wrapper(node, name, None, training_command(node, args, name, sum(phases_s.values()) + 300))
        marker = wait_marker(node, name, proc, MARKER_TIMEOUT_S[args.kind])
        windows, live = [], {}
        for phase in PHASES:
            set_phase(node, name, phase)
            before = counter_j()
            monitor.begin_window(phase)
            before = (before + counter_j()) / 2  # the counter read on both sides of carbonflow's read
            if phase == "steady":
                live = training_identity(gpu, marker, proc.pid)
            _sleep_watching(proc, phases_s[phase], name)
            after = counter_j()
            measured = monitor.end_window(phase)
            truth = (after + counter_j()) / 2 - before
            got = measured.energy_j[gpu.id]
            windows.append({
                "phase": phase, "elapsed_s": measured.elapsed_s, "carbonflow_j": got, "counter_j": truth,
                "relative_error": relative_error(got, truth), "mean_power_w": got / measured.elapsed_s,
                "start_utc": measured.start_utc.timestamp(), "end_utc": measured.end_utc.timestamp(),
            })  # fmt: skip
        set_phase(node, name, "stop")
        exit_code = proc.wait(timeout=120)
        time.sleep(2 * TRACE_INTERVAL_S)
    finally:
        cpu_s, wall_s = _thread_cpu_s(thread) - cpu0, time.perf_counter() - wall0
        sampler.stop()
    times, power, energy = _read_trace(trace, gpu.id)
    span = (windows[0]["start_utc"], windows[-1]["end_utc"])
    polled = {f"{s:g}": polled_energy_error(times, power, energy, s, span) for s in POLL_INTERVALS_S}
    return {
        "windows": windows, "wrapper_run": _wrapper_run_truth(node, name, gpu, times, energy, exit_code),
        "training": marker, "identity_while_training": live, "polled": polled, "span_s": span[1] - span[0],
        "sampler": {"interval_s": TRACE_INTERVAL_S, "samples": sampler.samples, "thread_cpu_s": cpu_s,
                    "wall_s": wall_s, "cpu_fraction": cpu_s / wall_s if wall_s > 0 else None,
                    "cpu_ms_per_sample": 1000 * cpu_s / sampler.samples if sampler.samples else None,
                    "errors": sampler.errors, "trace_csv": trace.name,
                    "cpu_clock": "sampler thread" if thread is not None else "whole process (thread not found)"},
    }  # fmt: skip


def _wrapper_run_truth(node: Node, name: str, gpu: Any, times: list[float], energy: list[float], code: int) -> dict:
    """The wrapper's own GPU energy for its run against the counter (from the trace) over the same time."""
    result = wrapper_result(node, name)
    if result is None:
        return {"exit_code": code, "error": f"no result written; stderr: {_tail(_run_dir(node, name) / 'stderr')}"}
    got = next((d["energy_j"] for d in result["devices"] if d.get("device_id") == gpu.id), None)
    t0 = datetime.fromisoformat(result["started_at"]).timestamp()
    t1 = datetime.fromisoformat(result["ended_at"]).timestamp()
    truth = _interp(times, energy, t1) - _interp(times, energy, t0)
    return {
        "exit_code": code, "carbonflow_j": got, "counter_j": truth, "duration_s": result["duration_s"],
        "relative_error": relative_error(got, truth) if got is not None else None, "steps": result.get("steps"),
        "samples": result.get("samples"), "notes": result.get("notes", []),
    }  # fmt: skip


# --- 2. control truth ----------------------------------------------------------------------------------------


def read_limits(gpu: Any) -> dict[str, Any]:
    from carbonflow.energy.errors import EnergyError

    try:
        low, high = gpu.power_limit_constraints_w()
        return {"limit_range_w": [low, high], "default_limit_w": gpu.default_power_limit_w(),
                "limit_at_start_w": gpu.power_limit_w(), "error": None}  # fmt: skip
    except EnergyError as exc:
        return {"limit_range_w": None, "default_limit_w": None, "limit_at_start_w": None, "error": str(exc)}


def probe_setting(gpu: Any, current_w: float) -> dict[str, Any]:
    """Set the limit to the value it has (nothing changes): may this process set limits? The exact error if not."""
    from carbonflow.energy.errors import EnergyError

    try:
        gpu.set_power_limit_w(current_w)
        return {"power_limit_settable": True, "power_limit_error": None, "nvml_error": None}
    except (EnergyError, ValueError) as exc:
        cause = exc.__cause__
        nvml = (
            {"class": type(cause).__name__, "code": getattr(cause, "value", None), "text": str(cause)}
            if cause
            else None
        )
        return {"power_limit_settable": False, "power_limit_error": str(exc), "nvml_error": nvml}


@dataclass
class Scenario:
    """One control scenario: how the run is ended, and how a limit left behind is put back."""

    name: str
    end: str  # "normal" | "wrapper_sigkill" | "child_sigkill" | "wrapper_sigterm"
    recovery: str | None = None  # "next_wrapper" | "restore_command" after a wrapper SIGKILL


SCENARIOS = (
    Scenario("normal_exit", "normal"),
    Scenario("wrapper_sigkill_next_wrapper", "wrapper_sigkill", "next_wrapper"),
    Scenario("wrapper_sigkill_restore_command", "wrapper_sigkill", "restore_command"),
    Scenario("child_sigkill", "child_sigkill"),
    Scenario("wrapper_sigterm", "wrapper_sigterm"),
)


def run_scenario(node: Node, args: argparse.Namespace, gpu: Any, sc: Scenario, limit_w: float | None) -> dict:
    """Start a wrapper at ``limit_w`` with a training, end it as the scenario says, recover, read the limit."""
    from carbonflow.energy.power_limit import default_journal_dir, gpu_journal_path

    proc = start_wrapper(node, sc.name, limit_w, training_command(node, args, sc.name, 300))
    marker = wait_marker(node, sc.name, proc, MARKER_TIMEOUT_S[args.kind])
    training_pid = int(marker["pid"])
    journal = gpu_journal_path(default_journal_dir(), gpu.id)
    out: dict[str, Any] = {
        "limit_requested_w": limit_w, "limit_during_w": gpu.power_limit_w(), "journal_while_running": journal.exists()
    }  # fmt: skip
    if sc.end == "normal":
        set_phase(node, sc.name, "stop")
    elif sc.end == "child_sigkill":
        os.kill(training_pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL if sc.end == "wrapper_sigkill" else signal.SIGTERM)
    out["wrapper_exit_code"] = proc.wait(timeout=120)
    out["training_died"] = wait_dead(training_pid)
    out["limit_after_wrapper_w"] = gpu.power_limit_w()
    out["journal_after_wrapper"] = journal.exists()
    result = wrapper_result(node, sc.name)
    out["result_written"] = result is not None
    out["result_notes"] = result.get("notes", []) if result else []
    out["power_limit_applied"] = result.get("power_limit_applied") if result else None
    if sc.recovery == "next_wrapper":
        nxt = start_wrapper(node, f"{sc.name}_next", None, [sys.executable, "-c", "pass"])
        out["recovery_exit_code"] = nxt.wait(timeout=180)
        out["recovery_notes"] = (wrapper_result(node, f"{sc.name}_next") or {}).get("notes", [])
    elif sc.recovery == "restore_command":
        done = restore_command(node)
        out["recovery_exit_code"] = done.returncode
        out["recovery_output"] = (done.stdout + done.stderr)[-1500:]
    out["limit_final_w"] = gpu.power_limit_w()
    return out


def control_truth(node: Node, args: argparse.Namespace, gpu: Any, deadline: float, notes: list[str]) -> dict:
    """Limits read (and, by --control, probed or lowered), and the wrapper ended every way the issue lists."""
    limits = read_limits(gpu)
    out: dict[str, Any] = {"control_mode": args.control, **limits, "power_limit_settable": None,
                           "power_limit_error": None, "nvml_error": None, "scenarios": {}}  # fmt: skip
    original = limits["limit_at_start_w"]
    limit_w: float | None = None
    if args.control == "read-only":
        out["power_limit_error"] = "not tried: --control read-only changes nothing (see --control probe / full)"
    elif original is not None:
        out.update(probe_setting(gpu, original))
        # Asked for even when refused: the wrapper must then say so and run on at the current limit.
        limit_w = (
            original if args.control == "probe" else max(limits["limit_range_w"][0], round(LOWERED_FRACTION * original))
        )
        if args.control == "full" and limit_w >= original - 0.5:
            notes.append(f"the limit {original:g} W is at the GPU's minimum: nothing to lower; ran at it")
    out["limit_set_w"] = limit_w
    try:
        for sc in (s for s in SCENARIOS if s.name in args.scenarios):
            if time.monotonic() > deadline - SCENARIO_S[args.kind]:
                notes.append(f"control scenario {sc.name} skipped: out of the --minutes budget")
                continue
            out["scenarios"][sc.name] = run_scenario(node, args, gpu, sc, limit_w)
    finally:
        out["safety_net"] = put_back(gpu, original, args.control)
    _control_verdicts(out, args.control, original)
    return out


def put_back(gpu: Any, original_w: float | None, mode: str) -> str | None:
    """Whatever happened, leave the GPU at the limit it had: None when nothing was needed (the expected case)."""
    if mode == "read-only" or original_w is None:
        return None
    now_w = gpu.power_limit_w()
    if abs(now_w - original_w) <= 0.5:
        return None
    gpu.set_power_limit_w(original_w)
    return f"the check found the limit at {now_w:g} W after its scenarios and put it back to {original_w:g} W"


def refusal_reported(scenarios: Sequence[dict[str, Any]]) -> bool | None:
    """Every wrapper that wrote a result says ``power limit not applied: <reason>`` and ran on (as documented)."""
    with_result = [s for s in scenarios if s.get("result_written")]
    if not with_result:
        return None
    return all(
        s.get("power_limit_applied") is False
        and any(note.startswith("power limit not applied") for note in s.get("result_notes", []))
        for s in with_result
    )


def _control_verdicts(out: dict[str, Any], mode: str, original: float | None) -> None:
    sc = out["scenarios"]
    settable = out["power_limit_settable"] is True

    def restored(name: str) -> bool | None:
        s = sc.get(name)
        if s is None or original is None or not settable:
            return None
        return limit_restored(mode, original, s["limit_during_w"], s["limit_final_w"])

    def both(a: bool | None, b: bool | None) -> bool | None:
        return None if a is None or b is None else a and b

    normal = sc.get("normal_exit")
    out["limit_read_back_ok"] = (
        None if not settable or normal is None else abs(normal["limit_during_w"] - out["limit_set_w"]) <= 0.5
    )
    out["limit_restored_after_normal_exit"] = restored("normal_exit")
    out["limit_restored_after_wrapper_sigkill"] = both(
        restored("wrapper_sigkill_next_wrapper"), restored("wrapper_sigkill_restore_command")
    )
    out["limit_restored_after_child_sigkill"] = restored("child_sigkill")
    out["limit_restored_after_wrapper_sigterm"] = restored("wrapper_sigterm")
    out["training_died_with_wrapper"] = {name: s["training_died"] for name, s in sc.items()}
    refused = out["power_limit_settable"] is False
    out["refusal_reported_as_documented"] = refusal_reported(list(sc.values())) if refused else None


# --- the run ----------------------------------------------------------------------------------------------------


def phase_seconds(args: argparse.Namespace) -> dict[str, float]:
    """Explicit --warmup-s/--steady-s/--light-s, else the --minutes budget less what the rest needs, shared out."""
    energy_s = max(10.0, args.minutes * 60 - RESERVED_S[args.kind])
    given = {"warmup": args.warmup_s, "steady": args.steady_s, "light": args.light_s}
    return {p: given[p] if given[p] is not None else round(PHASE_SHARES[p] * energy_s, 1) for p in PHASES}


def labels(nv: Any, gpu: Any, args: argparse.Namespace) -> dict[str, Any]:
    import carbonflow
    from carbonflow.energy.nvml import _as_str

    def call(fn: str) -> str | None:
        with contextlib.suppress(Exception):
            return _as_str(getattr(nv, fn)())
        return None

    fake = "fake_pynvml" in (getattr(nv, "__file__", "") or "")
    return {
        "label": "fake" if fake else "hardware", "device_name": gpu.model, "gpu_uuid": gpu.id,
        "driver_version": call("nvmlSystemGetDriverVersion") or ("fake" if fake else None),
        "nvml_version": call("nvmlSystemGetNVMLVersion"), "cuda_driver_version": call("nvmlSystemGetCudaDriverVersion"),
        "vm_kind": args.vm_kind, "kernel": platform.release(), "host": platform.node(),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
        "carbonflow": str(Path(carbonflow.__file__).parent),
    }  # fmt: skip


def headline(result: dict[str, Any]) -> None:
    """The issue's keys at the top level, from the sections' details."""
    energy, control = result.get("energy") or {}, result.get("control") or {}
    errors = [w["relative_error"] for w in energy.get("windows", []) if w["relative_error"] is not None]
    run_err = (energy.get("wrapper_run") or {}).get("relative_error")
    errors += [run_err] if run_err is not None else []
    polled = energy.get("polled") or {}
    result.update({
        "counter_vs_carbonflow_energy_error_max": max((abs(e) for e in errors), default=None),
        "counter_vs_carbonflow_energy_goal": ENERGY_ERROR_GOAL,
        "polled_energy_error_by_interval_s": {k: (v or {}).get("median_abs") for k, v in polled.items()},
        "sampler_cpu_fraction": (energy.get("sampler") or {}).get("cpu_fraction"),
        "sampler_cpu_goal": SAMPLER_CPU_GOAL,
        "power_limit_settable": control.get("power_limit_settable"),
        "power_limit_error": control.get("power_limit_error"),
        "power_limit_nvml_error": control.get("nvml_error"),
        "limit_range_w": control.get("limit_range_w"),
        "limit_restored_after_wrapper_sigkill": control.get("limit_restored_after_wrapper_sigkill"),
        "limit_restored_after_child_sigkill": control.get("limit_restored_after_child_sigkill"),
        "limit_restored_after_wrapper_sigterm": control.get("limit_restored_after_wrapper_sigterm"),
    })  # fmt: skip


def write(result: dict[str, Any], out: Path) -> None:
    headline(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(out, json.dumps(result, indent=2, default=str))


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.minutes * 60 - 20
    root = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    node = setup_node(args.fake, root, args.out.with_name(f"{args.out.stem}_wrappers.log"))
    node.log_path.unlink(missing_ok=True)
    from carbonflow.energy.errors import NvmlUnavailable
    from carbonflow.energy.nvml import nvml_devices

    try:
        gpus = nvml_devices()
    except NvmlUnavailable as exc:
        raise CheckError(f"no NVIDIA GPU here ({exc})") from exc
    if not gpus:
        raise CheckError("NVML sees no GPU this process may use (CUDA_VISIBLE_DEVICES?)")
    gpu = gpus[0]
    phases_s = phase_seconds(args)
    result: dict[str, Any] = {"benchmark": "gpu_check", **labels(_pynvml_module(), gpu, args), "complete": False,
                              "model": args.model, "batch_size": args.batch_size, "phases_s": phases_s,
                              "minutes_budget": args.minutes, "workdir": str(root), "notes": []}  # fmt: skip
    if args.fake:
        result["notes"].append("FAKE: tests/energy/fake_pynvml stands in for the GPU; no figure here is a measurement")
    if len(gpus) > 1:
        result["notes"].append(f"{len(gpus)} GPUs visible; the check uses the first, {gpu.id}")
    started = time.monotonic()
    try:
        for section in args.sections:
            t0 = time.monotonic()
            try:
                if section == "identity":
                    result["identity"] = identity(gpu)
                elif section == "energy":
                    result["energy"] = energy_truth(node, args, gpu, phases_s, args.out.parent)
                else:
                    result["control"] = control_truth(node, args, gpu, deadline, result["notes"])
            except CheckError as exc:
                result["notes"].append(f"{section}: {exc}")
            result.setdefault("section_s", {})[section] = round(time.monotonic() - t0, 1)
            write(result, args.out)
        result["complete"] = True
    finally:
        stop_all(node)
        result["total_s"] = round(time.monotonic() - started, 1)
        write(result, args.out)
    return result


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a positive number of seconds or minutes")
    return value


def _names(parser: argparse.ArgumentParser, flag: str, text: str, allowed: Sequence[str]) -> list[str]:
    """A comma-separated choice of names, each one of ``allowed`` (else a usage error naming the flag)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        parser.error(f"{flag}={text!r}: {', '.join(bad) or 'none given'} not allowed; use some of {', '.join(allowed)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="run on the fake NVML node (needs --out; labelled fake)")
    parser.add_argument("--out", type=Path, default=None, help=f"result JSON (default {DEFAULT_OUT.relative_to(REPO)})")
    parser.add_argument("--minutes", type=_positive, default=7.0, help="the whole check's budget (default 7)")
    parser.add_argument("--warmup-s", type=_positive, default=None, help="warm-up phase (default: from --minutes)")
    parser.add_argument("--steady-s", type=_positive, default=None, help="steady phase (default: from --minutes)")
    parser.add_argument("--light-s", type=_positive, default=None, help="lighter phase (default: from --minutes)")
    parser.add_argument(
        "--control",
        choices=CONTROL_MODES,
        default="read-only",
        help="read-only: change nothing; probe: set the limit it has; full: lower it (your own GPU)",
    )
    parser.add_argument("--model", choices=MODELS, default=None, help="resnet50 (default), tiny (--fake default), loop")
    parser.add_argument("--batch-size", type=int, default=None, help="default 128 (resnet50), 64 otherwise")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument(
        "--scenarios", default=",".join(s.name for s in SCENARIOS), help="control scenarios to run (default: all)"
    )
    parser.add_argument("--vm-kind", default="unknown", help="the machine's kind, for the label (e.g. firecracker)")
    args = parser.parse_args(argv)
    args.sections = _names(parser, "--sections", args.sections, SECTIONS)
    args.scenarios = _names(parser, "--scenarios", args.scenarios, [s.name for s in SCENARIOS])
    if args.fake and args.out is None:
        parser.error("--fake needs --out PATH: fake results never go to the hardware results file")
    args.out = (args.out or DEFAULT_OUT).resolve()
    if args.fake and args.out == DEFAULT_OUT:
        parser.error(f"--out={args.out}: fake results never go to the hardware results file; give another path")
    args.kind = "fake" if args.fake else "real"
    args.model = args.model or ("tiny" if args.fake else "resnet50")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size={args.batch_size} is not allowed; give a positive number of samples")
    args.batch_size = args.batch_size or (128 if args.model == "resnet50" else 64)
    return args


def summary(result: dict[str, Any]) -> str:
    keys = ("label", "device_name", "driver_version", "counter_vs_carbonflow_energy_error_max",
            "polled_energy_error_by_interval_s", "sampler_cpu_fraction", "power_limit_settable", "power_limit_error",
            "limit_range_w", "limit_restored_after_wrapper_sigkill", "limit_restored_after_child_sigkill",
            "limit_restored_after_wrapper_sigterm", "complete", "total_s")  # fmt: skip
    lines = [f"{k:<42} {json.dumps(result.get(k), default=str)}" for k in keys]
    return "\n".join(lines + [f"note: {n}" for n in result.get("notes", [])])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_train"]:
        return train_main(argv[1:])
    args = parse_args(argv)
    try:
        result = run_check(args)
    except CheckError as exc:
        if args.fake:
            raise
        print(f"gpu_check: {exc}: nothing measured (on a machine with an NVIDIA GPU it runs; here, try --fake)")
        return 0
    print(summary(result))
    print(f"wrote {args.out}")
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
