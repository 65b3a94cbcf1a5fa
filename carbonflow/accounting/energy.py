"""Per-job energy and emissions: one total per run, nothing counted twice, labels carried along.

Shared-GPU split rule (co-located jobs, time-sliced on one GPU)
---------------------------------------------------------------
When jobs 1..n share one GPU, the GPU's measured energy ``E`` over the shared period is split by
what each job's *completed work would have cost alone*, calibrated from solo profiles:

    w_i = P_i × s_i          share_i = w_i / Σ_j w_j          E_i = share_i × E

* ``P_i`` — the GPU power job i draws when it runs alone (W, from its solo profile);
* ``s_i`` — the speed it keeps when paired: paired throughput / solo throughput (0 < s_i ≤ 1,
  observed during the co-located run).

In time ``T`` paired, job i does ``s_i × X_i × T`` samples, which alone would have taken
``s_i × T`` seconds at ``P_i`` watts, i.e. ``P_i × s_i × T`` joules. Shares sum to one, so the
GPU's energy is counted exactly once, idle and interference overhead included (split in the same
proportion). Unlike an SM-utilisation split (Kepler), a memory-bound job that draws high power
with low SM occupancy is charged for the power it actually causes; unlike CodeCarbon/MLflow
defaults, no job is charged the whole GPU.

A pair's run is measured in *phases* (every time the set of working jobs changes): a phase with one job
working is charged to it, a phase with both is split by the rule above (:func:`charge_phases`). Each
member's sharing figures (:func:`sharing_metrics`) go to MLflow under the ``M_*`` names defined here, which
:mod:`carbonflow.tracking.schema` documents (it imports them from here: one definition).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from carbonflow.domain import DeviceEnergy

if TYPE_CHECKING:
    from carbonflow.energy.device import Device
    from carbonflow.energy.monitor import Measurement

logger = logging.getLogger(__name__)

# What the pair wrapper adds to each co-located member's metrics (documented in carbonflow.tracking.schema).
# The planner learns a co-located run's solo-equivalent cost from them: its measured duration minus
# ``sharing_lost_s``, its energy minus ``sharing_energy_j``.
M_KEPT_SPEED_FRACTION = "kept_speed_fraction"
M_HOST_PACE_FRACTION = "host_pace_fraction"
M_SHARED_GPU_S = "shared_gpu_s"
M_SHARING_LOST_S = "sharing_lost_s"
M_SHARING_ENERGY_J = "sharing_energy_j"


def device_energies(
    measurement: Measurement,
    devices: Sequence[Device],
    shares: Mapping[str, float] | None = None,
    power_limits_w: Mapping[str, float] | None = None,
) -> list[DeviceEnergy]:
    """One ``DeviceEnergy`` per device of the measurement: energy attributed to this job (J) and its label.

    ``shares`` (device id → fraction in [0, 1]) charges this job part of a shared device; the
    figure is ``share × measured``. Devices are keyed by id, so a device listed by several
    containers of one run is counted once.
    """
    shares = dict(shares or {})
    for dev_id, share in shares.items():
        if not 0 <= share <= 1:
            raise ValueError(f"shares[{dev_id!r}]={share} is not allowed; a share must be between 0 and 1")
    out: list[DeviceEnergy] = []
    seen: set[str] = set()
    for dev in devices:
        if dev.id in seen:
            continue
        seen.add(dev.id)
        if dev.id not in measurement.energy_j:
            raise ValueError(f"device {dev.id} is not in measurement {measurement.name!r}")
        share = shares.get(dev.id, 1.0)
        notes = list(dev.notes)
        if share < 1:
            notes.append(f"shared device: {share:.3f} of its {measurement.energy_j[dev.id]:.1f} J charged to this job")
        out.append(
            DeviceEnergy(
                device_id=dev.id,
                device_model=dev.model,
                kind=dev.kind,
                energy_j=measurement.energy_j[dev.id] * share,
                label=dev.label,
                share=share,
                power_limit_w=(power_limits_w or {}).get(dev.id),
                notes=notes,
            )
        )
    return out


@dataclass(frozen=True)
class SoloProfile:
    """A co-located job's calibration: GPU power alone (W) and speed kept when paired (fraction)."""

    job: str
    solo_power_w: float
    speed_kept: float

    def __post_init__(self) -> None:
        if not self.solo_power_w > 0:
            raise ValueError(f"solo_power_w={self.solo_power_w} for job {self.job!r} is not allowed; it must be > 0 W")
        if not 0 < self.speed_kept <= 1:
            raise ValueError(
                f"speed_kept={self.speed_kept} for job {self.job!r} is not allowed; "
                "use paired throughput / solo throughput, in (0, 1]"
            )


def shared_gpu_shares(jobs: Sequence[SoloProfile]) -> dict[str, float]:
    """Each job's share of a shared GPU's energy: P_i·s_i / Σ P_j·s_j (see the module docstring)."""
    if not jobs:
        raise ValueError("jobs=[] is not allowed; give at least one job sharing the GPU")
    names = [j.job for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"jobs={names} names a job twice")
    weights = {j.job: j.solo_power_w * j.speed_kept for j in jobs}
    total = sum(weights.values())
    return {job: w / total for job, w in weights.items()}


def split_shared_gpu_energy_j(energy_j: float, jobs: Sequence[SoloProfile]) -> dict[str, float]:
    """Split one GPU's measured energy among the jobs sharing it (sums exactly to ``energy_j``)."""
    if energy_j < 0:
        raise ValueError(f"energy_j={energy_j} is not allowed; it must be >= 0")
    return {job: share * energy_j for job, share in shared_gpu_shares(jobs).items()}


def sharing_metrics(
    kept: float | None,
    pace: float | None,
    solo_power_w: float | None,
    shared_s: float,
    charged_j: float,
    device_s: float | None = None,
) -> dict[str, float]:
    """A pair member's sharing figures (see ``M_*`` above); none when its kept speed is unknown.

    They are taken over ``device_s``, the GPU's time for the work the job did while both worked (its samples then at
    its solo speed × the kept speed): not the ``shared_s`` both processes were up, which also holds what the GPU's
    sharing did not cause — the host's CPUs (on a simulated GPU), warm-up, evaluation — and which stays in the
    run's other figures, as it does on every run. Without ``device_s``: ``shared_s`` × the host's pace (at most 1).
    """
    if kept is None:
        return {}
    if device_s is None:
        device_s = shared_s * min(pace, 1.0) if pace is not None else shared_s
    device_s = min(device_s, shared_s)
    out = {M_KEPT_SPEED_FRACTION: kept, M_SHARED_GPU_S: shared_s, M_SHARING_LOST_S: (1.0 - kept) * device_s}
    if pace is not None:
        out[M_HOST_PACE_FRACTION] = pace
    if solo_power_w is not None and shared_s > 0:
        out[M_SHARING_ENERGY_J] = (charged_j / shared_s - solo_power_w * kept) * device_s
    return out


@dataclass
class PhaseCharge:
    """A pair's phases charged to its two members: joules per member and device, and the overlap's figures."""

    charged_j: list[dict[str, float]]
    charged_together_j: list[float]
    overlap_s: float = 0.0
    overlap_j: float = 0.0

    def fractions(self, member: int) -> dict[str, float]:
        """The member's fraction of each device's energy (normalised: phase windows leave microseconds between
        them, so the device total is split exactly; 0.5 for a device nobody used)."""
        return {
            dev_id: self.charged_j[member][dev_id] / both if (both := sum(c[dev_id] for c in self.charged_j)) > 0
            else 0.5
            for dev_id in self.charged_j[member]
        }  # fmt: skip


def charge_phases(
    phases: Sequence[tuple[tuple[int, ...], Measurement]], shares: Sequence[float], device_ids: Sequence[str]
) -> PhaseCharge:
    """Charge each phase's energy to the members (0, 1) working in it: alone, all of it; both, by ``shares``
    (the P_i × s_i split); nobody (start-up and shut-down), half each."""
    charge = PhaseCharge(charged_j=[dict.fromkeys(device_ids, 0.0) for _ in (0, 1)], charged_together_j=[0.0, 0.0])
    for active, measured in phases:
        for dev_id, joules in measured.energy_j.items():
            if not active:
                for i in (0, 1):
                    charge.charged_j[i][dev_id] += joules / 2
            elif len(active) == 1:
                charge.charged_j[active[0]][dev_id] += joules
            else:
                for i in active:
                    charge.charged_j[i][dev_id] += joules * shares[i]
                    charge.charged_together_j[i] += joules * shares[i]
        if len(active) == 2:
            charge.overlap_s += measured.elapsed_s
            charge.overlap_j += sum(measured.energy_j.values())
    return charge
