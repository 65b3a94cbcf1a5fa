"""An additional, clearly labelled energy accounting: whole servers (nodes) instead of busy GPUs only.

The engine's headline accounting counts the power of busy GPUs only (idle GPUs powered down or outside the
boundary). Energy papers on GPU sharing often count servers: a server is on while any of its GPUs is busy and
then draws its host power (CPUs, memory, fans, NICs) plus the idle power of its unused GPUs. Sharing a GPU
frees GPUs, fewer busy GPUs need fewer servers on, and that saving only shows in this accounting.

Model (an assumption, stated next to every number it produces):

* servers of ``gpus_per_node`` GPUs; at every instant ``ceil(busy GPUs / gpus_per_node)`` servers are on
  (*ideal packing*: the fewest servers that can hold the busy GPUs — a lower bound of server-on time, the
  same rule for every policy, the FIFO baseline included); empty servers are powered down and draw nothing
  (``power_down_empty=False``: every server of the cluster is on from the first submission to the last end);
* a server that is on draws ``host_w`` plus ``gpu_idle_w`` for each of its GPUs that is not busy; a busy GPU
  draws what the engine integrated (Zeus measurements).

:meth:`NodeModel.from_acme_cdfs` takes ``host_w`` and ``gpu_idle_w`` from real data: the Acme (NSDI'24)
IPMI server-power and DCGM GPU-power distributions of the Seren cluster (8 × A100 servers — no V100 server
power data is available, so a sensitivity row scales ``host_w``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from carbonflow.simulation.engine import SimResult
from carbonflow.simulation.grid import CarbonGrid
from carbonflow.units import kwh_from_j


@dataclass(frozen=True)
class NodeModel:
    """Servers of ``gpus_per_node`` GPUs: host power and idle GPU power while a server is on."""

    gpus_per_node: int = 8
    host_w: float = 0.0
    gpu_idle_w: float = 0.0
    power_down_empty: bool = True
    source: str = "given"

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.host_w < 0 or self.gpu_idle_w < 0:
            raise ValueError(
                f"NodeModel(gpus_per_node={self.gpus_per_node}, host_w={self.host_w}, "
                f"gpu_idle_w={self.gpu_idle_w}) is not allowed; need >= 1 GPU per node and powers >= 0"
            )

    @classmethod
    def from_acme_cdfs(
        cls, path: Path, cluster: str = "Seren", idle_percentile: float = 1.0, gpus_per_node: int = 8
    ) -> NodeModel:
        """Idle powers from Acme's distributions: the ``idle_percentile`` point of GPU-server power and of GPU power.

        ``gpu_idle_w`` = that percentile of per-GPU power (DCGM); ``host_w`` = that percentile of GPU-server
        power (IPMI) minus ``gpus_per_node × gpu_idle_w`` — an idle server's draw without its GPUs.
        """
        server: list[tuple[float, float]] = []
        gpu: list[tuple[float, float]] = []
        with Path(path).open(newline="") as fh:
            for row in csv.DictReader(fh):
                if row["cluster"] != cluster:
                    continue
                point = (float(row["cdf_percent"]), float(row["x"]))
                if row["metric"] == "server_power_gpu_servers":
                    server.append(point)
                elif row["metric"] == "gpu_power":
                    gpu.append(point)
        if not server or not gpu:
            raise ValueError(f"{path}: no server_power_gpu_servers / gpu_power rows for cluster {cluster!r}")

        def at(points: list[tuple[float, float]]) -> float:
            # the smallest x whose CDF reaches the percentile (CDF rows with x == 0 are the plots' anchors)
            for cdf, x in sorted(points):
                if cdf >= idle_percentile and x > 0:
                    return x
            raise ValueError(f"{path}: no point at or above the {idle_percentile} percentile")

        gpu_idle_w = at(gpu)
        host_w = at(server) - gpus_per_node * gpu_idle_w
        if host_w <= 0:
            raise ValueError(f"{path}: idle server power is below {gpus_per_node} idle GPUs; cannot derive host_w")
        return cls(
            gpus_per_node=gpus_per_node,
            host_w=host_w,
            gpu_idle_w=gpu_idle_w,
            source=f"Acme {cluster} IPMI server power and DCGM GPU power at their {idle_percentile:g} % point (CDF)",
        )

    def scaled(self, host_factor: float = 1.0, power_down_empty: bool | None = None) -> NodeModel:
        """The same model with ``host_w`` scaled (sensitivity) and optionally without powering down."""
        return NodeModel(
            self.gpus_per_node,
            self.host_w * host_factor,
            self.gpu_idle_w,
            self.power_down_empty if power_down_empty is None else power_down_empty,
            f"{self.source}; host power x{host_factor:g}",
        )


def node_accounting(result: SimResult, model: NodeModel, grid: CarbonGrid) -> dict[str, float]:
    """Server-level energy and emissions of one simulation: busy GPUs (as simulated) + hosts + idle GPUs.

    O(A log A) for A GPU allocations. Returns ``energy_j``, ``emissions_g``, ``node_hours`` and the part of
    the energy that is host and idle-GPU power (``overhead_energy_j``).
    """
    if result.alloc_start_s is None or result.alloc_end_s is None or result.alloc_gpus is None:
        raise ValueError("the result carries no GPU allocations (simulated before nodes were modelled)")
    n_nodes = math.ceil(result.gpus / model.gpus_per_node)
    t = np.concatenate([result.alloc_start_s, result.alloc_end_s])
    d = np.concatenate([result.alloc_gpus, -result.alloc_gpus])
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    busy = np.cumsum(d)[:-1]  # busy GPUs on [t[i], t[i+1])
    t0, t1 = t[:-1], t[1:]
    keep = t1 > t0
    t0, t1, busy = t0[keep], t1[keep], np.maximum(busy[keep], 0.0)
    if not model.power_down_empty:
        first = float(np.min(result.submit_s))
        if first < t0[0]:  # every server is on from the first submission, busy or not
            t0, t1, busy = np.concatenate([[first], t0]), np.concatenate([[t0[0]], t1]), np.concatenate([[0.0], busy])
        nodes = np.full(len(t0), float(n_nodes))
    else:
        nodes = np.ceil(busy / model.gpus_per_node - 1e-9)
    overhead_w = nodes * model.host_w + np.maximum(nodes * model.gpus_per_node - busy, 0.0) * model.gpu_idle_w
    overhead_j = float(np.sum(overhead_w * (t1 - t0)))
    overhead_g = kwh_from_j(float(np.sum(overhead_w * grid.integral_many(t0, t1))))  # J x g/kWh -> g
    return {
        "energy_j": result.energy_j + overhead_j,
        "energy_kwh": kwh_from_j(result.energy_j + overhead_j),
        "emissions_g": result.emissions_g + overhead_g,
        "overhead_energy_j": overhead_j,
        "node_hours": float(np.sum(nodes * (t1 - t0))) / 3600.0,
    }
