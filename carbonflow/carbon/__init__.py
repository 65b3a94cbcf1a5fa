"""carbonflow.carbon: carbon-intensity forecasts from real providers, a keyless fallback chain, window choice.

Public API (import from the submodules; this package imports nothing heavy at import time):

* :mod:`carbonflow.carbon.replay` — ``ReplayProvider`` (recorded forecasts/actuals, labelled ``replay``)
* :mod:`carbonflow.carbon.windows` — ``choose_start``, ``mean_intensity_gco2_per_kwh``
* :mod:`carbonflow.carbon.chain` — ``ForecastChain`` (``forecast``, ``history``), ``default_chain``
* :mod:`carbonflow.carbon.providers` — NESO, Electricity Maps v3, WattTime v3, Carbon Aware SDK clients
* :mod:`carbonflow.carbon.fallbacks` — ``ClimatologyProvider`` (hour-of-week), ``StaticProvider`` (codecarbon)
* :mod:`carbonflow.carbon.regions` — ``resolve_region`` (cloud regions → grid zones per provider)
* :mod:`carbonflow.carbon.credentials` — Airflow connection types → plain credentials
* :mod:`carbonflow.carbon.traces` — ``load_trace`` for every CSV shape carbonflow knows
* :mod:`carbonflow.carbon.calibration` — lead-time error model calibrated on real published forecasts
"""
