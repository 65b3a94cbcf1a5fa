"""A simulated GPU replaying the published Zeus power traces (always labelled ``simulated``).

``ZeusPowerModel`` reads the shipped copy of Zeus's ``summary_power_<gpu>.csv`` (see
``data/NOTICE.md``): for one GPU model and workload (dataset, network, batch size, optimizer) it
holds the measured average power (W) and time per epoch (s) at each power limit, and linearly
interpolates between measured limits. At a measured limit it returns the trace's numbers exactly.

``SimulatedGpu`` implements :class:`~carbonflow.energy.device.Device` on top of it. The simulated GPU has its
own clock, driven by the work done, never by the host's: the ``carbonflow run`` wrapper hands it the samples
the training reports (:meth:`SimulatedGpu.add_work`), each of which takes the trace's time per sample at the
current limit (time per epoch ÷ the Zeus dataset's training samples, :data:`DATASET_TRAIN_SAMPLES`) and
costs the trace's power × that time. A simulated run's energy, duration and measured windows are read on this
clock (:meth:`SimulatedGpu.simulated_s`), so the same work at the same configuration costs the same energy and
reports the same duration on an idle or a busy host; the host's wall time is kept apart. A GPU that is not
fed work (``set_busy``) integrates the trace's power over its host clock instead.

``slowdown_factor()`` says how much slower the workload runs at the current limit than at the maximum limit.
The training code itself runs for real on the CPU; the wrapper hands the factor to the child in
``CARBONFLOW_SIM_SLOWDOWN`` and the training hook sleeps ``(factor - 1)`` × each step's time, so the emulated
GPU is visibly slower at lower limits (the simulated clock does not depend on it).

A shared simulated GPU (:class:`SimulatedSharedGpu`, two jobs time-sliced) paces the two trainings while they
run; the pair's wrapper then reads its figures on the same simulated clock, from each job's work, the device's
kept speeds and the shared power (:func:`carbonflow.execution.pair_wrapper._on_simulated_clock`).
"""

from __future__ import annotations

import bisect
import csv
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from carbonflow.contract import SIM_SLOWDOWN_ENV
from carbonflow.domain import SimulatedGpuSpec
from carbonflow.energy.device import Device
from carbonflow.energy.errors import EnergyError

SLOWDOWN_ENV = SIM_SLOWDOWN_ENV
"""Environment variable carrying the simulated GPU's slowdown factor to the training child."""

GPU_FILES = {"V100": "v100", "A40": "a40", "RTX6000": "rtx6000", "P100": "p100"}
GPU_NAMES = {
    "V100": "Tesla V100",
    "A40": "NVIDIA A40",
    "RTX6000": "Quadro RTX 6000",
    "P100": "Tesla P100",
}
_SIM_NAMESPACE = uuid.UUID("6f1c2a52-5d0e-4d8a-9a43-2b7f0c1e9d10")

DATASET_TRAIN_SAMPLES = {
    "cifar100": 50_000,  # CIFAR-100 training images
    "imagenet": 1_281_167,  # ILSVRC-2012 training images
    "squad": 87_599,  # SQuAD v1.1 training questions
    "librispeech": 281_241,  # LibriSpeech train-960 utterances
    "movielens-1m": 1_000_209,  # MovieLens-1M ratings
    "sentiment140": 1_600_000,  # Sentiment140 training tweets
}
"""Samples in one epoch of each Zeus dataset (the datasets' published training-set sizes; the traces give time
per epoch only): what turns the trace's time per epoch into the simulated GPU's time per sample."""


@dataclass(frozen=True)
class TraceRow:
    """One row of a Zeus power trace."""

    dataset: str
    network: str
    batch_size: int
    optimizer: str
    power_limit_w: float
    time_per_epoch_s: float
    average_power_w: float

    @property
    def energy_per_epoch_j(self) -> float:
        return self.time_per_epoch_s * self.average_power_w


@cache
def load_trace(gpu_model: str) -> tuple[TraceRow, ...]:
    """All rows of the shipped Zeus power trace of ``gpu_model`` (V100, A40, RTX6000, P100)."""
    if gpu_model not in GPU_FILES:
        raise ValueError(f"gpu_model={gpu_model!r} is not allowed; use one of {', '.join(GPU_FILES)}")
    name = f"summary_power_{GPU_FILES[gpu_model]}.csv"
    text = resources.files("carbonflow.energy").joinpath("data", name).read_text(encoding="utf-8")
    rows = []
    for rec in csv.DictReader(text.splitlines()):
        rows.append(
            TraceRow(
                dataset=rec["dataset"],
                network=rec["network"],
                batch_size=int(rec["batch_size"]),
                optimizer=rec["optimizer"],
                power_limit_w=float(rec["power_limit"]),
                time_per_epoch_s=float(rec["time_per_epoch"]),
                average_power_w=float(rec["average_power"]),
            )
        )
    return tuple(rows)


@cache
def workload_defaults() -> dict[tuple[str, str], dict]:
    """Zeus's per-workload defaults (b0, optimizer, ...) keyed by (dataset, network)."""
    text = resources.files("carbonflow.energy").joinpath("data", "zeus_workload_defaults.json").read_text()
    return {(w["dataset"], w["network"]): w for w in json.loads(text)["workloads"]}


def workloads(gpu_model: str) -> list[tuple[str, str, int, str]]:
    """Every (dataset, network, batch_size, optimizer) measured on ``gpu_model``."""
    return sorted({(r.dataset, r.network, r.batch_size, r.optimizer) for r in load_trace(gpu_model)})


@dataclass
class ZeusPowerModel:
    """Power and time per epoch of one workload on one GPU model, per power limit (interpolated)."""

    gpu_model: str
    dataset: str
    network: str
    batch_size: int
    optimizer: str
    power_limits_w: list[float]
    average_powers_w: list[float]
    times_per_epoch_s: list[float]
    notes: list[str] = field(default_factory=list)

    @classmethod
    def load(
        cls,
        gpu_model: str,
        dataset: str,
        network: str,
        batch_size: int | None = None,
        optimizer: str | None = None,
    ) -> ZeusPowerModel:
        """The measured curve of one workload; errors name the value and what the trace has."""
        rows = load_trace(gpu_model)
        notes: list[str] = []
        pairs = sorted({(r.dataset, r.network) for r in rows})
        if (dataset, network) not in pairs:
            allowed = ", ".join(f"{d}/{n}" for d, n in pairs)
            raise ValueError(
                f"dataset/network={dataset}/{network} is not in the Zeus {gpu_model} trace; use one of {allowed}"
            )
        rows = [r for r in rows if r.dataset == dataset and r.network == network]
        default = workload_defaults().get((dataset, network), {})
        optimizers = sorted({r.optimizer for r in rows})
        if optimizer is None:
            optimizer = default.get("optimizer") if default.get("optimizer") in optimizers else optimizers[0]
        elif optimizer not in optimizers:
            raise ValueError(
                f"optimizer={optimizer!r} is not in the Zeus {gpu_model} trace for {dataset}/{network}; "
                f"use one of {', '.join(optimizers)}"
            )
        rows = [r for r in rows if r.optimizer == optimizer]
        sizes = sorted({r.batch_size for r in rows})
        if batch_size is None:
            b0 = default.get("batch_size")
            if b0 in sizes:
                batch_size = b0
            else:
                below = [b for b in sizes if b0 is None or b <= b0]
                batch_size = below[-1] if below else sizes[0]
                notes.append(
                    f"Zeus default batch size {b0} was not measured on {gpu_model}; using {batch_size} instead"
                )
        elif batch_size not in sizes:
            raise ValueError(
                f"batch_size={batch_size} is not in the Zeus {gpu_model} trace for {dataset}/{network}/{optimizer}; "
                f"use one of {', '.join(map(str, sizes))}"
            )
        rows = sorted((r for r in rows if r.batch_size == batch_size), key=lambda r: r.power_limit_w)
        return cls(
            gpu_model=gpu_model,
            dataset=dataset,
            network=network,
            batch_size=batch_size,
            optimizer=optimizer,
            power_limits_w=[r.power_limit_w for r in rows],
            average_powers_w=[r.average_power_w for r in rows],
            times_per_epoch_s=[r.time_per_epoch_s for r in rows],
            notes=notes,
        )

    @classmethod
    def from_spec(cls, spec: SimulatedGpuSpec) -> ZeusPowerModel:
        return cls.load(spec.gpu_model, spec.dataset, spec.network, spec.batch_size, spec.optimizer)

    @property
    def min_power_limit_w(self) -> float:
        return self.power_limits_w[0]

    @property
    def max_power_w(self) -> float:
        """MAXPOWER of Zeus's cost: the highest power limit measured for this GPU model."""
        return self.power_limits_w[-1]

    def _interp(self, limit_w: float, values: list[float]) -> float:
        xs = self.power_limits_w
        if not xs[0] - 1e-9 <= limit_w <= xs[-1] + 1e-9:
            raise ValueError(
                f"power_limit_w={limit_w:g} is outside the measured range of the Zeus {self.gpu_model} trace "
                f"for {self.workload_key}: {xs[0]:g} W to {xs[-1]:g} W"
            )
        i = bisect.bisect_left(xs, limit_w)
        if i < len(xs) and abs(xs[i] - limit_w) < 1e-9:
            return values[i]
        lo, hi = i - 1, i
        frac = (limit_w - xs[lo]) / (xs[hi] - xs[lo])
        return values[lo] + frac * (values[hi] - values[lo])

    def average_power_w(self, limit_w: float) -> float:
        """Average GPU power while training at ``limit_w`` (W), interpolated between measured limits."""
        return self._interp(limit_w, self.average_powers_w)

    def time_per_epoch_s(self, limit_w: float) -> float:
        """Time of one epoch at ``limit_w`` (s), interpolated between measured limits."""
        return self._interp(limit_w, self.times_per_epoch_s)

    def energy_per_epoch_j(self, limit_w: float) -> float:
        return self.average_power_w(limit_w) * self.time_per_epoch_s(limit_w)

    @property
    def samples_per_epoch(self) -> int:
        """Training samples of one epoch of the Zeus workload's dataset (:data:`DATASET_TRAIN_SAMPLES`)."""
        if self.dataset not in DATASET_TRAIN_SAMPLES:
            raise ValueError(
                f"dataset={self.dataset!r} has no known training-set size; allowed: {', '.join(DATASET_TRAIN_SAMPLES)}"
            )
        return DATASET_TRAIN_SAMPLES[self.dataset]

    def seconds_per_sample(self, limit_w: float) -> float:
        """The simulated GPU's time for one training sample at ``limit_w`` (s): time per epoch ÷ samples per epoch."""
        return self.time_per_epoch_s(limit_w) / self.samples_per_epoch

    def energy_per_sample_j(self, limit_w: float) -> float:
        """GPU energy of one training sample at ``limit_w`` (J): average power × time per sample."""
        return self.average_power_w(limit_w) * self.seconds_per_sample(limit_w)

    def slowdown(self, limit_w: float) -> float:
        """time_per_epoch(limit) / time_per_epoch(max limit); 1.0 at the maximum limit."""
        return self.time_per_epoch_s(limit_w) / self.time_per_epoch_s(self.max_power_w)

    @property
    def workload_key(self) -> str:
        return f"{self.dataset}/{self.network}/b{self.batch_size}/{self.optimizer}"


class _ClockedGpu(Device):
    """A simulated GPU whose energy counter integrates :meth:`_power_locked` over its clock.

    Subclasses set ``_constraints_w``, ``_limit_w``, ``_clock`` and say what the device draws now.
    """

    kind = "gpu"
    label = "simulated"
    supports_power_limit = True

    def __init__(self, clock: Callable[[], float], constraints_w: tuple[float, float]) -> None:
        super().__init__()
        self._clock = clock
        self._lock = threading.Lock()
        self._constraints_w = constraints_w
        self._limit_w = constraints_w[1]
        self._energy_j = 0.0
        self._last_t = clock()

    def _power_locked(self) -> float:
        raise NotImplementedError

    def _advance(self) -> float:
        now = self._clock()
        self._energy_j += (now - self._last_t) * self._power_locked()
        self._last_t = now
        return self._energy_j

    def energy_j(self) -> float:
        with self._lock:
            return self._advance()

    def power_w(self) -> float:
        with self._lock:
            return self._power_locked()

    def power_limit_constraints_w(self) -> tuple[float, float]:
        return self._constraints_w

    def default_power_limit_w(self) -> float:
        return self._constraints_w[1]

    def power_limit_w(self) -> float:
        return self._limit_w

    def set_power_limit_w(self, limit_w: float) -> None:
        self.check_power_limit_w(limit_w)
        with self._lock:
            self._advance()
            self._limit_w = float(limit_w)


class SimulatedGpu(_ClockedGpu):
    """A GPU whose power and speed per limit replay Zeus's measurements. Labelled ``simulated``.

    Its power limit lives in the process that owns it (the ``carbonflow run`` wrapper). Following the work
    (:meth:`follow_work`, then :meth:`add_work` with the samples trained), its clock and energy advance by the
    work only: each sample takes the trace's time per sample at the current limit and draws the trace's power
    meanwhile, so host load changes neither. Marked busy instead (:meth:`set_busy`, not following work), the
    counter advances with the host's clock at the trace's average power. Idle draw is not in the Zeus data,
    so an idle simulated GPU accrues nothing (said in notes).
    """

    def __init__(
        self,
        spec: SimulatedGpuSpec,
        index: int = 0,
        clock: Callable[[], float] = time.monotonic,
        busy: bool = True,
    ) -> None:
        self.power_model = ZeusPowerModel.from_spec(spec)
        super().__init__(clock, (self.power_model.min_power_limit_w, self.power_model.max_power_w))
        self.spec = spec
        self.index = index
        self._busy = busy
        self._follows_work = False
        self._simulated_s = 0.0
        key = f"{spec.gpu_model}:{self.power_model.workload_key}:{index}"
        self.id = f"SIM-GPU-{uuid.uuid5(_SIM_NAMESPACE, key)}"
        self.model = f"{GPU_NAMES[spec.gpu_model]} (simulated)"
        self.notes = [
            f"simulated from Zeus NSDI'23 measurements: {spec.gpu_model} {self.power_model.workload_key}",
            "idle power is not in the Zeus data: energy accrues only while busy",
            *self.power_model.notes,
        ]

    def _power_locked(self) -> float:
        """What the host clock integrates: nothing once the GPU follows the work (its own clock counts then)."""
        if self._follows_work or not self._busy:
            return 0.0
        return self.power_model.average_power_w(self._limit_w)

    def power_w(self) -> float:
        """The trace's power at the current limit while training (power traces), 0 while idle."""
        with self._lock:
            return self.power_model.average_power_w(self._limit_w) if self._busy else 0.0

    def set_busy(self, busy: bool) -> None:
        """Mark the simulated GPU as training (draws power) or idle (draws none)."""
        with self._lock:
            self._advance()
            self._busy = busy

    @property
    def busy(self) -> bool:
        return self._busy

    def follow_work(self) -> None:
        """From now on, time and energy advance with :meth:`add_work` only, never with the host's clock."""
        with self._lock:
            self._advance()
            self._follows_work = True
            if "simulated clock" not in " ".join(self.notes):
                self.notes.insert(
                    1,
                    "simulated clock: each sample takes the trace's time per sample at the current limit (time per "
                    f"epoch / {self.power_model.samples_per_epoch} samples of {self.power_model.dataset}) at the "
                    "trace's power; the host's load changes neither time nor energy",
                )

    def add_work(self, samples: float) -> float:
        """``samples`` trained at the current limit: advance the simulated clock by their time and the energy by
        the trace's power over it; returns the simulated seconds they took."""
        if not samples >= 0:
            raise EnergyError(f"samples={samples} is not allowed; the samples trained are a number >= 0")
        with self._lock:
            self._advance()
            seconds = samples * self.power_model.seconds_per_sample(self._limit_w)
            self._simulated_s += seconds
            self._energy_j += seconds * self.power_model.average_power_w(self._limit_w)
            return seconds

    def simulated_s(self) -> float:
        """Seconds on the simulated clock so far: the work's time at the limits it was done at."""
        return self._simulated_s

    def slowdown_factor(self) -> float:
        """How much slower the workload runs at the current limit than at the maximum (>= 1 typically)."""
        return self.power_model.slowdown(self._limit_w)


SHARED_POWER_FACTOR = 1.2
"""Simulator assumption: a GPU time-sliced by two jobs draws this × the higher solo power, capped at its
limit (Zeus measured jobs alone only). carbonflow.simulation's cluster replay makes the same assumption."""


def shared_gpu_power_w(
    power_a_w: float, power_b_w: float, limit_w: float, factor: float = SHARED_POWER_FACTOR
) -> float:
    """Power of a simulated GPU running two jobs whose solo powers are ``power_a_w`` and ``power_b_w``."""
    return min(limit_w, factor * max(power_a_w, power_b_w))


GAVEL_PAIRS_CSV = ("simulation", "data", "gavel_pairs_v100.csv")
"""Gavel's measured V100 pair throughputs (MIT; see carbonflow/simulation/data/NOTICE.md)."""


@cache
def _gavel_pairs() -> dict[tuple[str, str], float]:
    """(job type, next to job type) -> fraction of solo speed kept, for the pairs Gavel could run."""
    ref = resources.files("carbonflow").joinpath(*GAVEL_PAIRS_CSV)
    return {
        (row["job_a"], row["job_b"]): float(row["norm_tput_a"])
        for row in csv.DictReader(ref.read_text(encoding="utf-8").splitlines())
        if row["gpu"].lower() == "v100" and row["pair_ok"] == "1"
    }


def check_pair_type(job_type: str) -> None:
    """Raise naming the value and the allowed Gavel V100 job types unless ``job_type`` is one."""
    known = sorted({a for a, _ in _gavel_pairs()})
    if job_type not in known:
        raise EnergyError(f"simulated_gpu.pair_type={job_type!r} is not a Gavel V100 job type; allowed: {known}")


def pair_kept_speeds(type_a: str, type_b: str) -> tuple[float, float]:
    """Fractions of solo speed two Gavel job types keep while sharing one V100 (Gavel's measurements)."""
    pairs = _gavel_pairs()
    for job_type in (type_a, type_b):
        check_pair_type(job_type)
    if (type_a, type_b) not in pairs or (type_b, type_a) not in pairs:
        raise EnergyError(f"pair_type {type_a!r} with {type_b!r}: Gavel could not run this pair on one V100")
    return pairs[(type_a, type_b)], pairs[(type_b, type_a)]


class SimulatedSharedGpu(_ClockedGpu):
    """One simulated GPU time-sliced by two jobs (labelled ``simulated``).

    Each job's speed and power per limit replay its own Zeus workload; while both work, each keeps
    the fraction of its solo speed Gavel measured for their pair on a V100 (``pair_type`` of each
    spec; :attr:`kept_speeds`, the device's interference model), and the device draws
    :data:`SHARED_POWER_FACTOR` × the higher solo power, capped at the limit. While one works it draws
    that job's solo power; while none works, nothing.

    The two trainings it paces run for real on the host's CPUs, which they also share: what the host
    adds is not the GPU's. The pair's wrapper reports :attr:`kept_speeds` as the pair's kept speeds and
    measures the host's contention apart (:mod:`carbonflow.execution.pair_wrapper`).
    """

    def __init__(
        self, specs: list[SimulatedGpuSpec], index: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if len(specs) != 2:
            raise EnergyError(f"a simulated shared GPU holds exactly 2 jobs; got {len(specs)}")
        if len({s.gpu_model for s in specs}) != 1:
            raise EnergyError(f"jobs sharing a GPU must simulate the same model; got {[s.gpu_model for s in specs]}")
        missing = [i for i, s in enumerate(specs) if not s.pair_type]
        if missing:
            raise EnergyError(
                "simulated_gpu.pair_type is required to share a simulated GPU (a Gavel job type, e.g. "
                f"'ResNet-18 (batch size 64)'); missing for job {missing[0] + 1} of the pair"
            )
        self.specs = specs
        self.models = [ZeusPowerModel.from_spec(s) for s in specs]
        self.kept_speeds = pair_kept_speeds(specs[0].pair_type or "", specs[1].pair_type or "")
        low = max(m.min_power_limit_w for m in self.models)
        high = min(m.max_power_w for m in self.models)
        super().__init__(clock, (low, high))
        self.index = index
        self._active = [False, False]
        key = f"{specs[0].gpu_model}:shared:{index}:" + "+".join(m.workload_key for m in self.models)
        self.id = f"SIM-GPU-{uuid.uuid5(_SIM_NAMESPACE, key)}"
        self.model = f"{GPU_NAMES[specs[0].gpu_model]} (simulated)"
        self.notes = [
            "simulated shared GPU: "
            + " + ".join(f"{m.workload_key} as {s.pair_type}" for m, s in zip(self.models, specs, strict=True)),
            f"pair speeds from Gavel's V100 measurements: {self.kept_speeds[0]:.3f} / {self.kept_speeds[1]:.3f} "
            "(the kept speeds reported; this machine's CPU contention is measured apart)",
            f"assumed: a shared GPU draws {SHARED_POWER_FACTOR:g} × the higher solo power, capped at its limit",
        ]

    def _power_locked(self) -> float:
        solo = [m.average_power_w(self._limit_w) for m, on in zip(self.models, self._active, strict=True) if on]
        if len(solo) == 2:
            return shared_gpu_power_w(solo[0], solo[1], self._limit_w)
        return solo[0] if solo else 0.0

    def set_active(self, member: int, active: bool) -> None:
        """Mark job ``member`` (0 or 1) as working on the GPU or not."""
        with self._lock:
            self._advance()
            self._active[member] = active

    def set_busy(self, busy: bool) -> None:
        """Both jobs working (True) or none (False)."""
        with self._lock:
            self._advance()
            self._active = [busy, busy]

    def member_slowdown_factor(self, member: int) -> float:
        """How much slower job ``member`` runs than alone at the maximum limit (power limit × sharing)."""
        with self._lock:
            factor = self.models[member].slowdown(self._limit_w)
            return factor / self.kept_speeds[member] if all(self._active) else factor
