"""Credentials for the keyed providers: Airflow connection types and their plain-value mapping (no Airflow import).

The operators register one Airflow connection type per keyed provider (``CONNECTION_TYPES``), read the
connection, and hand its plain fields to :func:`credentials_from_connection`; the resulting dict goes to
``default_chain(credentials=...)``. Values never appear in reprs produced here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

CONNECTION_TYPES: dict[str, dict[str, Any]] = {
    "carbonflow_electricitymaps": {
        "provider": "electricitymaps",
        "label": "Electricity Maps API (carbonflow)",
        "fields": {
            "password": "API token (sent as the auth-token header)",
            "host": "base URL (optional, default https://api.electricitymap.org/v3)",
        },
        "env": {"token": "CARBONFLOW_ELECTRICITYMAPS_TOKEN", "url": "CARBONFLOW_ELECTRICITYMAPS_URL"},
    },
    "carbonflow_watttime": {
        "provider": "watttime",
        "label": "WattTime API (carbonflow)",
        "fields": {
            "login": "username",
            "password": "password (basic auth to /login)",
            "host": "base URL (optional, default https://api.watttime.org)",
        },
        "env": {
            "username": "CARBONFLOW_WATTTIME_USERNAME",
            "password": "CARBONFLOW_WATTTIME_PASSWORD",
            "url": "CARBONFLOW_WATTTIME_URL",
        },
    },
    "carbonflow_carbon_aware_sdk": {
        "provider": "carbon-aware-sdk",
        "label": "Carbon Aware SDK WebAPI (carbonflow)",
        "fields": {"host": "base URL of the self-hosted WebAPI, e.g. http://carbon-aware-sdk:8080"},
        "env": {"url": "CARBONFLOW_CARBON_AWARE_SDK_URL"},
    },
    "carbonflow_neso": {
        "provider": "neso",
        "label": "UK NESO Carbon Intensity API (carbonflow, no key)",
        "fields": {"host": "base URL (optional, default https://api.carbonintensity.org.uk)"},
        "env": {"url": "CARBONFLOW_NESO_URL"},
    },
}
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
    if conn_type not in CONNECTION_TYPES:
        raise ValueError(f"conn_type={conn_type!r} is not allowed; use one of {', '.join(sorted(CONNECTION_TYPES))}")
    provider = CONNECTION_TYPES[conn_type]["provider"]
    ext = _extra(extra)
    out: dict[str, str] = {}
    url = host or ext.get("url")
    if url:
        out["url"] = str(url)
    if provider == "electricitymaps":
        token = password or ext.get("token")
        if token:
            out["token"] = str(token)
        if ext.get("emission_factor"):
            out["emission_factor"] = str(ext["emission_factor"])
    elif provider == "watttime":
        if login or ext.get("username"):
            out["username"] = str(login or ext.get("username"))
        if password or ext.get("password"):
            out["password"] = str(password or ext.get("password"))
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
