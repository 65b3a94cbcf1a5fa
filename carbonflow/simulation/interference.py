"""Measured pair interference on one GPU (Gavel, V100) and the map from job types to Zeus workloads.

:class:`PairTable` holds, for every ordered pair of Gavel job types, the fraction of its solo speed
each job keeps while the two share one GPU (``keep[a, b]`` for job ``a`` next to ``b``); ``NaN``
where Gavel could not run the pair. This is the simulator's ground truth. The planner never reads
it directly: it only sees pairs the simulator has already run (history), see ``policies``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from carbonflow.energy.simulated import GAVEL_PAIRS_CSV

# Gavel model -> the Zeus-measured workload whose power/speed-vs-power-limit curve stands in for it.
# Zeus measured six workloads; each Gavel model maps to the one closest in architecture and task.
# This is an assumption of the simulator and is printed next to its results.
GAVEL_TO_ZEUS: dict[str, tuple[str, str]] = {
    "ResNet-18": ("cifar100", "shufflenetv2"),  # small CNN, image classification
    "ResNet-50": ("imagenet", "resnet50"),  # same network
    "Transformer": ("squad", "bert_base_uncased"),  # transformer encoder
    "LM": ("librispeech", "deepspeech2"),  # recurrent sequence model
    "Recommendation": ("movielens-1m", "ncf"),  # same task (NCF on MovieLens)
    "A3C": ("sentiment140", "bert_base_uncased"),  # no RL workload in Zeus; a light, low-power job
    "CycleGAN": ("imagenet", "resnet50"),  # conv-heavy image model
}


class PairTableError(ValueError):
    """A pair table that cannot be used."""


@dataclass
class PairTable:
    """Fraction of solo speed kept by job ``a`` co-located with job ``b`` on one GPU."""

    gpu: str
    types: list[str]
    models: list[str]
    keep: np.ndarray  # shape (n, n); NaN = pair not runnable
    source: str

    def __len__(self) -> int:
        return len(self.types)

    def index(self, job_type: str) -> int:
        try:
            return self.types.index(job_type)
        except ValueError as exc:
            raise PairTableError(
                f"job_type={job_type!r} is not in the {self.gpu} pair table; allowed: {self.types}"
            ) from exc

    def runnable(self, a: int, b: int) -> bool:
        return bool(np.isfinite(self.keep[a, b]) and np.isfinite(self.keep[b, a]))

    def zeus_workload(self, type_index: int) -> tuple[str, str]:
        """(dataset, network) of the Zeus power curve used for this job type."""
        return GAVEL_TO_ZEUS[self.models[type_index]]


def load_pair_table(path: str | Path | None = None, gpu: str = "v100") -> PairTable:
    """Read the flattened Gavel pair CSV (default: the V100 table shipped with carbonflow)."""
    if path is None:
        text = resources.files("carbonflow").joinpath(*GAVEL_PAIRS_CSV).read_text()
        source = "carbonflow/simulation/data/gavel_pairs_v100.csv (Gavel, MIT)"
    else:
        p = Path(path)
        if not p.is_file():
            raise PairTableError(f"pairs={str(p)!r} is not a readable file")
        text = p.read_text()
        source = str(p)
    rows = [r for r in csv.DictReader(text.splitlines()) if r.get("gpu", "").lower() == gpu.lower()]
    if not rows:
        raise PairTableError(f"gpu={gpu!r}: no rows for this GPU in {source}")
    types = sorted({r["job_a"] for r in rows})
    models: dict[str, str] = {}
    for r in rows:
        models[r["job_a"]] = r["model_a"]
    unknown = sorted({m for m in models.values() if m not in GAVEL_TO_ZEUS})
    if unknown:
        raise PairTableError(f"models {unknown} have no Zeus workload mapping; known: {sorted(GAVEL_TO_ZEUS)}")
    pos = {t: i for i, t in enumerate(types)}
    keep = np.full((len(types), len(types)), np.nan)
    for r in rows:
        if r["pair_ok"] == "1":
            keep[pos[r["job_a"]], pos[r["job_b"]]] = float(r["norm_tput_a"])
    return PairTable(gpu=gpu.upper(), types=types, models=[models[t] for t in types], keep=keep, source=source)
