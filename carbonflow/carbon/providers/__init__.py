"""Live carbon-intensity providers, one module each, registered in :data:`PROVIDERS` by the module itself.

* :class:`NesoProvider` (``neso.py``) — UK NESO Carbon Intensity API v2 (no key): national, region id, postcode.
* :class:`ElectricityMapsProvider` (``electricitymaps.py``) — Electricity Maps v3 (``auth-token`` header).
* :class:`WattTimeProvider` (``watttime.py``) — WattTime v3, bearer token renewed on 401, marginal signal.
* :class:`CarbonAwareSdkProvider` (``carbon_aware_sdk.py``) — GSF Carbon Aware SDK WebAPI.

All share :class:`HttpSettings` (``http.py``). A new provider is one new module here that registers its class
with :func:`register_provider`, plus its import line below (see docs/architecture.md, "Extending carbonflow").
"""

from __future__ import annotations

from carbonflow.carbon.base import ProviderError
from carbonflow.carbon.providers.http import HttpProvider, HttpSettings, make_session
from carbonflow.carbon.providers.registry import (
    PROVIDERS,
    ConnectionType,
    ProviderEntry,
    register_provider,
    unregister_provider,
)

# The built-in providers: importing each module registers it (the order is the default chain's order).
from carbonflow.carbon.providers.neso import NesoProvider  # isort: skip
from carbonflow.carbon.providers.electricitymaps import ElectricityMapsProvider  # isort: skip
from carbonflow.carbon.providers.watttime import LBS_PER_MWH_TO_G_PER_KWH, WattTimeProvider  # isort: skip
from carbonflow.carbon.providers.carbon_aware_sdk import CarbonAwareSdkProvider  # isort: skip

__all__ = [
    "LBS_PER_MWH_TO_G_PER_KWH",
    "PROVIDERS",
    "CarbonAwareSdkProvider",
    "ConnectionType",
    "ElectricityMapsProvider",
    "HttpProvider",
    "HttpSettings",
    "NesoProvider",
    "ProviderEntry",
    "ProviderError",
    "WattTimeProvider",
    "make_session",
    "register_provider",
    "unregister_provider",
]
