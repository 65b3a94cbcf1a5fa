"""What a job's runs say of its epochs to target at each batch size: a Gaussian-process belief over log epochs.

Epochs to target change smoothly with the batch size (Zeus's traces, NSDI'23: near flat below a batch size, then
rising; McCandlish et al. 2018 model it as ``E_min (1 + B / B_crit)``) and vary from run to run at one batch size
(a discrete 4 or 5 epochs, a bimodal 20-22 or 31). :class:`EpochsCurve` models ``y = ln(epochs)`` against
``x = log2(batch size)`` as

    y(x) = f(x) + noise,   f ~ GP(SLOPE_MEAN · ln 2 · (x − x0), k),
    k(x, x') = LEVEL_SD² + (SLOPE_SD · ln 2)² (x − x0)(x' − x0) + CURVE_SD² exp(−(x − x')² / 2 CURVE_DOUBLINGS²)
               + OWN_SD² [x = x']

(``x0``: the job's own batch size): an unknown level, a straight line in log-log around a prior slope (epochs ∝
batch size ** SLOPE_MEAN), smooth curvature over a few doublings, and each batch size's own departure. The noise
variance is pooled over the batch sizes run more than once, shrunk toward NOISE_SD_PRIOR (its weight:
NOISE_PRIOR_RUNS runs). A run that did not reach the target is a censored observation (it needed more epochs
than it ran): it counts as the mean of the predictive beyond what it ran (one step of expectation propagation).

Observations are summarised per batch size (mean log epochs, count): the posterior is exact for Gaussian noise and
costs one Cholesky factorisation of at most ``len(batch sizes)`` rows. Pure: no I/O.

The hyperparameters were chosen on ``benchmarks/vs_zeus.py``'s development seeds only (its docstring says which);
the benchmark's targets are judged on other seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import norm

LEVEL_SD = 2.0
"""Prior spread of the level of ln(epochs) (uninformative: e^±4 epochs)."""
SLOPE_MEAN = 0.3
"""Prior slope of ln(epochs) against ln(batch size): 0 below the critical batch size, 1 above it."""
SLOPE_SD = 0.6
"""Prior spread of that slope."""
CURVE_SD = 0.2
"""Spread of the smooth departure from the straight line (ln units)."""
CURVE_DOUBLINGS = 2.5
"""How many doublings of the batch size that departure stays alike over (the squared-exponential length)."""
OWN_SD = 0.07
"""Each batch size's own departure (ln units), shared with no neighbour: near-equal neighbours are told apart by
their own runs."""
NOISE_SD_PRIOR = 0.1
"""Run-to-run spread of ln(epochs) at one batch size before any is run twice."""
NOISE_PRIOR_RUNS = 4.0
"""The weight, in runs, of NOISE_SD_PRIOR against the spread observed."""


class EpochsCurve:
    """The belief over ln(epochs to target) per batch size of one job (see the module docstring).

    ``reached``: batch size → epochs of the runs that reached the target there; ``censored``: batch size → epochs
    of the runs that stopped (early, or at the epoch budget) without reaching it.
    """

    def __init__(
        self,
        default_batch_size: int,
        reached: Mapping[int, Sequence[float]],
        censored: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        if default_batch_size < 1:
            raise ValueError(f"default_batch_size={default_batch_size} is not allowed; give a batch size >= 1")
        self.x0 = math.log2(default_batch_size)
        self.reached = {b: [float(e) for e in es if e > 0] for b, es in reached.items()}
        self.censored = {b: [float(e) for e in es if e > 0] for b, es in (censored or {}).items()}
        self.noise_var = self._noise_var()
        self._obs = self._observations()

    # -- the model ------------------------------------------------------------------------------------------
    def _prior_mean(self, x: np.ndarray) -> np.ndarray:
        return SLOPE_MEAN * math.log(2) * (x - self.x0)

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        line = (SLOPE_SD * math.log(2)) ** 2 * np.outer(a - self.x0, b - self.x0)
        distance = np.subtract.outer(a, b)
        curve = CURVE_SD**2 * np.exp(-(distance**2) / (2 * CURVE_DOUBLINGS**2))
        return LEVEL_SD**2 + line + curve + OWN_SD**2 * (distance == 0)

    def _noise_var(self) -> float:
        squares, dof = 0.0, 0
        for epochs in self.reached.values():
            if len(epochs) >= 2:
                logs = np.log(epochs)
                squares += float(((logs - logs.mean()) ** 2).sum())
                dof += len(epochs) - 1
        return (NOISE_PRIOR_RUNS * NOISE_SD_PRIOR**2 + squares) / (NOISE_PRIOR_RUNS + dof)

    def _uncensored(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log2 batch size, mean ln epochs, runs) of the batch sizes with runs that reached the target."""
        seen = sorted(b for b, e in self.reached.items() if e)
        return (
            np.log2(np.array(seen, dtype=float)),
            np.array([float(np.mean(np.log(self.reached[b]))) for b in seen]),
            np.array([float(len(self.reached[b])) for b in seen]),
        )

    def _observations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The summaries the posterior conditions on: the uncensored ones, and each censored run as the mean of
        the predictive (given the uncensored runs) beyond the epochs it ran."""
        xs, ys, ns = self._uncensored()
        stopped = sorted(b for b, e in self.censored.items() if e)
        if not stopped:
            return xs, ys, ns
        mean, cov = self._posterior(np.log2(np.array(stopped, dtype=float)), (xs, ys, ns))
        sums = {x: (y * n, n) for x, y, n in zip(xs, ys, ns, strict=True)}
        for j, b in enumerate(stopped):
            sd = math.sqrt(max(cov[j, j], 0.0) + self.noise_var)
            for epochs in self.censored[b]:
                bound = math.log(epochs)
                z = (bound - mean[j]) / sd
                beyond = max(bound, mean[j] + sd * norm.pdf(z) / max(norm.sf(z), 1e-12))
                total, n = sums.get(math.log2(b), (0.0, 0.0))
                sums[math.log2(b)] = (total + beyond, n + 1)
        keys = sorted(sums)
        return (
            np.array(keys),
            np.array([sums[x][0] / sums[x][1] for x in keys]),
            np.array([sums[x][1] for x in keys]),
        )

    def _posterior(
        self, xq: np.ndarray, obs: tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        xs, ys, ns = obs
        if not len(xs):
            return self._prior_mean(xq), self._kernel(xq, xq)
        gram = self._kernel(xs, xs) + np.diag(self.noise_var / ns)
        chol = np.linalg.cholesky(gram)
        cross = self._kernel(xq, xs)
        weights = np.linalg.solve(chol.T, np.linalg.solve(chol, ys - self._prior_mean(xs)))
        solved = np.linalg.solve(chol, cross.T)
        return self._prior_mean(xq) + cross @ weights, self._kernel(xq, xq) - solved.T @ solved

    # -- what callers read ----------------------------------------------------------------------------------
    def posterior(self, batch_sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of ln(epochs to target) at ``batch_sizes`` (the curve, without the run noise)."""
        return self._posterior(np.log2(np.array(batch_sizes, dtype=float)), self._obs)

    def expected_epochs(self, batch_size: int) -> float:
        """Expected epochs to target of the next run at ``batch_size`` (log-normal: curve and run noise)."""
        mean, cov = self.posterior([batch_size])
        return float(math.exp(mean[0] + (max(cov[0, 0], 0.0) + self.noise_var) / 2))
