"""Credentials for the keyed providers: Airflow connection types and their plain-value mapping (no Airflow import).

Each provider declares its connection type where it is registered (``carbonflow.carbon.providers``); the
operators register one Airflow connection type per keyed provider (``CONNECTION_TYPES``), read the
connection, and hand its plain fields to :func:`credentials_from_connection`; the resulting dict goes to
``default_chain(credentials=...)``. Values never appear in reprs produced here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def connection_types() -> dict[str, dict[str, Any]]:
    """One Airflow connection type per registered provider that has one (read from the provider registry)."""
    from carbonflow.carbon.providers import PROVIDERS

    return {
        entry.connection.conn_type: {
            "provider": key,
            "label": entry.connection.label,
            "fields": dict(entry.connection.fields),
            "env": dict(entry.env),
        }
        for key, entry in PROVIDERS.items()
        if entry.connection is not None
    }


CONNECTION_TYPES: dict[str, dict[str, Any]] = connection_types()
"""The built-in providers' connection types (a snapshot at import; :func:`connection_types` sees later ones)."""
SECRET_FIELDS = frozenset({"token", "password"})


def _extra(extra: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if extra is None or extra == "":
        return {}
    if isinstance(extra, Mapping):
        return dict(extra)
    try:
        value = json.loads(extra)
    except ValueError:
        raise ValueError('extra is not valid JSON; give a JSON object, e.g. {"token": "..."}') from None
    if not isinstance(value, dict):
        raise ValueError("extra must be a JSON object")
    return value


def credentials_from_connection(
    conn_type: str,
    *,
    login: str | None = None,
    password: str | None = None,
    host: str | None = None,
    extra: str | Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, str]]:
    """(provider key, plain credentials) for ``default_chain`` from one Airflow connection's fields."""
    types = connection_types()
    if conn_type not in types:
        raise ValueError(f"conn_type={conn_type!r} is not allowed; use one of {', '.join(sorted(types))}")
    from carbonflow.carbon.providers import PROVIDERS

    provider = types[conn_type]["provider"]
    connection = PROVIDERS[provider].connection
    assert connection is not None
    ext = _extra(extra)
    out: dict[str, str] = {}
    url = host or ext.get("url")
    if url:
        out["url"] = str(url)
    given = {"login": login, "password": password, "host": host}
    for airflow_field, name in connection.from_fields.items():
        value = given.get(airflow_field) or ext.get(name)
        if value:
            out[name] = str(value)
    for name in connection.extra_fields:
        if ext.get(name):
            out[name] = str(ext[name])
    return provider, out


def credentials_from_connections(connections: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Merge several connections (dicts with conn_type, login, password, host, extra) into one credentials dict."""
    merged: dict[str, dict[str, str]] = {}
    for conn in connections:
        provider, creds = credentials_from_connection(
            str(conn.get("conn_type")),
            login=conn.get("login"),
            password=conn.get("password"),
            host=conn.get("host"),
            extra=conn.get("extra"),
        )
        merged.setdefault(provider, {}).update(creds)
    return merged


def describe(credentials: Mapping[str, Mapping[str, Any]] | None) -> dict[str, list[str]]:
    """Which fields are set per provider, without values (safe to log, put in XCom or MLflow)."""
    return {provider: sorted(fields) for provider, fields in (credentials or {}).items()}
