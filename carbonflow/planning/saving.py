"""carbonflow's one saving figure, computed and written the same way everywhere a user reads it.

"Saving" = ``1 − emissions / emissions of the same work started now at the default configuration``
(``saving_fraction``). The plan's reason shows it predicted; the run's MLflow metric ``saving_fraction``, the
demo table and the Carbon page show it realised (the counterfactual is predicted: the profile's energy ratio at
the run-now intensity). All of them format it with :func:`format_saving` (one decimal, in %).
"""

from __future__ import annotations


def saving_fraction(emissions_g: float, run_now_default_g: float | None) -> float | None:
    """``1 − emissions_g / run_now_default_g``; None without a counterfactual, 0 when it is zero."""
    if run_now_default_g is None:
        return None
    if run_now_default_g <= 0:
        return 0.0
    return 1.0 - emissions_g / run_now_default_g


def format_saving(fraction: float | None) -> str:
    """The saving as people read it: ``12.3 %`` (``−4.0 %`` when it costs more; ``–`` when unknown)."""
    if fraction is None:
        return "–"
    value = round(100.0 * fraction, 1)
    return f"−{-value:.1f} %" if value < 0 else f"{value:.1f} %"


def saving_phrase(
    fraction: float | None, objective: str, *, of: str = "carbon", default: str = "the default configuration"
) -> str:
    """``saving 12.3 % carbon vs start now at 250 W (objective zeus:0.5)``."""
    return f"saving {format_saving(fraction)} {of} vs start now at {default} (objective {objective})"
