"""carbonflow's one saving figure, computed and written the same way everywhere a user reads it.

"Saving" = ``1 − emissions / emissions of the same work started now at the default configuration``
(``saving_fraction``). The plan's reason shows it predicted, always as ``predicted saving … vs start now at
<the default>`` (:func:`saving_phrase`); the run's MLflow metric ``saving_fraction``, the task log's ``measured
saving`` line, the demo table and the Carbon page show it realised (the counterfactual is predicted: the
profile's energy ratio at the run-now intensity). All of them format it with :func:`format_saving` (one
decimal, in %). A saving within floating-point noise of zero (:data:`NOISE_REL` of the baseline) is exactly 0.

Why it lives in accounting: the realised saving is computed when a run is accounted
(:func:`carbonflow.accounting.run.to_run_result`, which the execution backends call), and the planner predicts
the same figure. With the one definition here, in the layer both sit on, the planner imports it from accounting
and neither execution nor accounting imports the planner (``carbonflow.planning`` was imported lazily from the
run accounting before, to reach this same file).
"""

from __future__ import annotations

NOISE_REL = 1e-9
"""A saving smaller than this × its baseline is floating-point noise (two sums of one window): exactly 0."""


def saving_g(emissions_g: float, run_now_default_g: float) -> float:
    """``run_now_default_g − emissions_g``, exactly 0 within :data:`NOISE_REL` of the baseline (not ``6.9e-17``)."""
    saved = run_now_default_g - emissions_g
    return 0.0 if abs(saved) < NOISE_REL * max(abs(run_now_default_g), abs(emissions_g)) else saved


def saving_fraction(emissions_g: float, run_now_default_g: float | None) -> float | None:
    """``1 − emissions_g / run_now_default_g``; None without a counterfactual, 0 when it is zero or noise."""
    if run_now_default_g is None:
        return None
    if run_now_default_g <= 0:
        return 0.0
    return saving_g(emissions_g, run_now_default_g) / run_now_default_g


def format_saving(fraction: float | None) -> str:
    """The saving as people read it: ``12.3 %`` (``−4.0 %`` when it costs more; ``–`` when unknown)."""
    if fraction is None:
        return "–"
    value = round(100.0 * fraction, 1)
    return f"−{-value:.1f} %" if value < 0 else f"{value:.1f} %"


def saving_phrase(
    fraction: float | None, objective: str, *, of: str = "carbon", default: str = "the default configuration"
) -> str:
    """A plan's saving, named as the prediction it is and against its baseline:
    ``predicted saving 12.3 % carbon vs start now at 250 W (objective zeus:0.5)``."""
    return f"predicted saving {format_saving(fraction)} {of} vs start now at {default} (objective {objective})"


def measured_saving_phrase(fraction: float | None, *, of: str = "carbon") -> str:
    """A run's realised saving (MLflow ``saving_fraction``), named as measured and against its baseline:
    ``measured saving 7.6 % carbon vs start now at the default configuration``."""
    return f"measured saving {format_saving(fraction)} {of} vs start now at the default configuration"
