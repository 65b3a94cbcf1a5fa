"""carbonflow.carbon: carbon-intensity forecasts from real providers, a keyless fallback chain, window choice.

Public API (import from the submodules; this package imports nothing heavy at import time):

* :mod:`carbonflow.carbon.replay` — ``ReplayProvider`` (recorded forecasts/actuals, labelled ``replay``)
* :mod:`carbonflow.carbon.windows` — ``choose_start``, ``choose_intervals``, ``mean_intensity_gco2_per_kwh``
* :mod:`carbonflow.carbon.chain` — ``ForecastChain``, ``default_chain``
* :mod:`carbonflow.carbon.regions` — ``resolve_region``
* :mod:`carbonflow.carbon.calibration` — lead-time error model calibrated on real published forecasts
"""
