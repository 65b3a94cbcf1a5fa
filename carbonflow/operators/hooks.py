"""Hooks for the keyed carbon-intensity providers: Airflow connections → plain credentials.

One hook class per connection type in the provider registry (:mod:`carbonflow.carbon.providers`), made here
from the provider's :class:`~carbonflow.carbon.providers.ConnectionType`: Airflow's connection form shows the
fields the provider declares, and a connection's fields become the provider's credentials through the one
mapping, :func:`carbonflow.carbon.credentials.credentials_from_connection`. A new provider therefore needs no
line here: registering it with a ``connection`` gives it a connection type, a form and credentials.
Keys are never logged and never put in XCom.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from carbonflow.carbon.credentials import connection_types, credentials_from_connection
from carbonflow.operators.provider import hook_class_name

log = logging.getLogger(__name__)

_FORM_FIELDS = ("host", "schema", "login", "password", "port", "extra")


class CarbonProviderHook(BaseHook):
    """Reads one provider's connection and returns its credentials (subclassed once per connection type)."""

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str]
    conn_type: ClassVar[str]
    hook_name: ClassVar[str]
    provider: ClassVar[str]
    form_fields: ClassVar[dict[str, str]] = {}

    def __init__(self, conn_id: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The provider's declared fields, relabelled with what goes in each, and ``extra`` (any credential by
        name, as JSON); the others hidden."""
        shown = {*cls.form_fields, "extra"}
        return {
            "hidden_fields": [f for f in _FORM_FIELDS if f not in shown],
            "relabeling": {name: text.split(" (")[0] for name, text in cls.form_fields.items()},
            "placeholders": dict(cls.form_fields),
        }

    def credentials(self) -> dict[str, str] | None:
        """The provider's credentials, or None when the connection is not defined (the chain skips it)."""
        try:
            conn = self.get_connection(self.conn_id)
        except Exception as err:  # Airflow raises its own not-found error types across versions
            log.info(
                "connection %s not defined (%s); %s will be skipped", self.conn_id, type(err).__name__, self.provider
            )
            return None
        _, creds = credentials_from_connection(
            self.conn_type, login=conn.login, password=conn.password, host=conn.host, extra=conn.extra
        )
        return creds


def hook_classes() -> dict[str, type[CarbonProviderHook]]:
    """One hook class per registered provider connection type, by connection type (registration order)."""
    out: dict[str, type[CarbonProviderHook]] = {}
    for conn_type, spec in connection_types().items():
        attrs = {
            "default_conn_name": conn_type,
            "conn_type": conn_type,
            "hook_name": f"carbonflow: {spec['label']}",
            "provider": spec["provider"],
            "form_fields": dict(spec["fields"]),
            "__module__": __name__,
            "__doc__": f"{spec['label']}: the connection type {conn_type!r} of the provider {spec['provider']!r}.",
        }
        out[conn_type] = type(hook_class_name(conn_type), (CarbonProviderHook,), attrs)
    return out


_MADE: dict[str, type[CarbonProviderHook]] = {}


def __getattr__(name: str) -> type[CarbonProviderHook]:
    """A provider's hook by its class name (Airflow imports it by the dotted path
    :func:`carbonflow.operators.provider.connection_types` gives), also for a provider registered after this
    module was imported; made once per name."""
    if name not in _MADE:
        made = {cls.__name__: cls for cls in hook_classes().values()}
        if name not in made:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _MADE[name] = made[name]
    return _MADE[name]


def _key(provider: str) -> str:
    """A provider key as ``conn_ids`` may spell it: ``carbon_aware_sdk`` == ``carbon-aware-sdk``."""
    return provider.replace("_", "-")


def provider_credentials(conn_ids: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Credentials of every keyed provider whose connection exists, keyed by provider name.

    ``conn_ids`` maps a provider's key (``electricitymaps``, ``carbon-aware-sdk`` or ``carbon_aware_sdk``, ...)
    to the connection id to read (default: its connection type's name); an unknown key is refused, naming the
    keys allowed. Providers registered after import are included (the registry is read on each call).
    """
    hooks = hook_classes().values()
    wanted = {_key(k): v for k, v in (conn_ids or {}).items()}
    unknown = sorted(set(wanted) - {_key(h.provider) for h in hooks})
    if unknown:
        allowed = ", ".join(sorted(h.provider for h in hooks))
        raise ValueError(f"conn_ids has unknown provider keys {unknown}; allowed: {allowed}")
    found: dict[str, dict[str, str]] = {}
    for hook_cls in hooks:
        creds = hook_cls(wanted.get(_key(hook_cls.provider))).credentials()
        if creds:
            found[hook_cls.provider] = creds
    return found
