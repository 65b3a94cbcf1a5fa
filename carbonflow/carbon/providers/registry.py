"""The carbon-provider registry: one entry per live provider, filled by the provider's own module.

A provider module defines its client class and registers it with :func:`register_provider` (a class decorator).
Everything that used to list the providers by hand reads this registry instead:

* :func:`carbonflow.carbon.chain.default_chain` builds every registered provider, in registration order,
  from its credentials (``credentials[key]``, else the environment variables in ``env``);
* :mod:`carbonflow.carbon.credentials` derives the Airflow connection types (``CONNECTION_TYPES``) and maps a
  connection's fields to plain credentials from ``connection``;
* the chain's orders accept the provider's ``key``; :class:`~carbonflow.carbon.chain.ForecastChain` asks the
  provider for its zone through ``zone_key`` (a column of ``data/regions.csv``, or ``grid``/``country``) or
  its own ``zone_for(region)``.

This module imports nothing heavy: the clients live in their own modules (``neso.py``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConnectionType:
    """The Airflow connection type a keyed provider's credentials come from (plain data, no Airflow import).

    ``fields``: the Airflow form fields used and what goes in each. ``from_fields``: Airflow field → credential
    name (``{"password": "token"}``), the credential falling back to the same name in ``extra``; ``url`` comes
    from ``host`` (or ``extra["url"]``) for every provider. ``extra_fields``: further credentials read from
    ``extra`` only.
    """

    conn_type: str
    label: str
    fields: Mapping[str, str]
    from_fields: Mapping[str, str] = field(default_factory=dict)
    extra_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProviderEntry:
    """One registered provider.

    ``key``: the name in chain orders and in ``default_chain(credentials=...)``. ``cls``: the client class; its
    ``from_credentials(credentials, settings)`` builds it from plain credentials (already completed from the
    environment) and the shared HTTP settings. ``env``: credential name → environment variable read when the
    credential is not given. ``connection``: its Airflow connection type (None: no connection).
    """

    key: str
    cls: type
    env: Mapping[str, str] = field(default_factory=dict)
    connection: ConnectionType | None = None

    def build(self, credentials: Mapping[str, Any], settings: Any) -> Any:
        return self.cls.from_credentials(credentials, settings)


PROVIDERS: dict[str, ProviderEntry] = {}
"""Every registered provider by key, in registration order (the order :func:`default_chain` asks them in)."""


def register_provider(
    key: str, *, env: Mapping[str, str] | None = None, connection: ConnectionType | None = None
) -> Callable[[type], type]:
    """Class decorator: register a provider client under ``key`` (see :class:`ProviderEntry`).

    A key registered twice is refused unless it is the same class (a module imported again), so a new provider
    cannot silently replace another.
    """

    def decorate(cls: type) -> type:
        if not callable(getattr(cls, "from_credentials", None)):
            raise TypeError(f"provider {key!r} ({cls.__name__}) has no from_credentials(credentials, settings)")
        known = PROVIDERS.get(key)
        if known is not None and known.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"provider key={key!r} is taken by {known.cls.__name__}; choose another key")
        if "key" not in cls.__dict__:
            cls.key = key  # type: ignore[attr-defined]  # the name chain orders use
        elif cls.__dict__["key"] != key:
            raise ValueError(f"{cls.__name__}.key={cls.__dict__['key']!r} differs from its registered key={key!r}")
        PROVIDERS[key] = ProviderEntry(key=key, cls=cls, env=dict(env or {}), connection=connection)
        return cls

    return decorate


def unregister_provider(key: str) -> None:
    """Remove a registration (for tests that register a toy provider)."""
    PROVIDERS.pop(key, None)
