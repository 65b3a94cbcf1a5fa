"""Hooks for the keyed carbon-intensity providers: Airflow connections → plain credentials.

Each hook declares a connection type so that keys are entered in Airflow's connection form; the
operator turns the connection into the plain credentials dict ``carbonflow.carbon`` accepts. Keys
are never logged and never put in XCom.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from airflow.sdk import BaseHook

log = logging.getLogger(__name__)


class _CarbonProviderHook(BaseHook):
    """Reads one provider's connection and returns its credentials."""

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str]
    conn_type: ClassVar[str]
    hook_name: ClassVar[str]
    provider: ClassVar[str]

    def __init__(self, conn_id: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {"hidden_fields": ["schema", "port", "extra"], "relabeling": cls._relabel(), "placeholders": {}}

    @classmethod
    def _relabel(cls) -> dict[str, str]:
        return {}

    def credentials(self) -> dict[str, str] | None:
        """The provider's credentials, or None when the connection is not defined (the chain skips it)."""
        try:
            conn = self.get_connection(self.conn_id)
        except Exception as err:  # Airflow raises its own not-found error types across versions
            log.info(
                "connection %s not defined (%s); %s will be skipped", self.conn_id, type(err).__name__, self.provider
            )
            return None
        return self._from_connection(conn)

    def _from_connection(self, conn: Any) -> dict[str, str]:
        raise NotImplementedError


class ElectricityMapsHook(_CarbonProviderHook):
    """Electricity Maps v3: the API token goes in the password field (sent as ``auth-token``)."""

    default_conn_name = "carbonflow_electricitymaps"
    conn_type = "carbonflow_electricitymaps"
    hook_name = "carbonflow: Electricity Maps"
    provider = "electricitymaps"

    @classmethod
    def _relabel(cls) -> dict[str, str]:
        return {"password": "API token", "host": "Base URL (optional)"}

    def _from_connection(self, conn: Any) -> dict[str, str]:
        creds = {"token": conn.password or ""}
        if conn.host:
            creds["base_url"] = conn.host
        return creds


class WattTimeHook(_CarbonProviderHook):
    """WattTime v3: username and password for ``/login`` (basic auth)."""

    default_conn_name = "carbonflow_watttime"
    conn_type = "carbonflow_watttime"
    hook_name = "carbonflow: WattTime"
    provider = "watttime"

    @classmethod
    def _relabel(cls) -> dict[str, str]:
        return {"login": "Username", "password": "Password", "host": "Base URL (optional)"}

    def _from_connection(self, conn: Any) -> dict[str, str]:
        creds = {"username": conn.login or "", "password": conn.password or ""}
        if conn.host:
            creds["base_url"] = conn.host
        return creds


class CarbonAwareSdkHook(_CarbonProviderHook):
    """Green Software Foundation Carbon Aware SDK WebAPI (self-hosted, no key): its base URL."""

    default_conn_name = "carbonflow_carbon_aware_sdk"
    conn_type = "carbonflow_carbon_aware_sdk"
    hook_name = "carbonflow: Carbon Aware SDK"
    provider = "carbon_aware_sdk"

    @classmethod
    def _relabel(cls) -> dict[str, str]:
        return {"host": "WebAPI base URL"}

    def _from_connection(self, conn: Any) -> dict[str, str]:
        return {"base_url": conn.host or ""}


PROVIDER_HOOKS: tuple[type[_CarbonProviderHook], ...] = (ElectricityMapsHook, WattTimeHook, CarbonAwareSdkHook)


def provider_credentials(conn_ids: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Credentials of every keyed provider whose connection exists, keyed by provider name."""
    conn_ids = conn_ids or {}
    found: dict[str, dict[str, str]] = {}
    for hook_cls in PROVIDER_HOOKS:
        creds = hook_cls(conn_ids.get(hook_cls.provider)).credentials()
        if creds:
            found[hook_cls.provider] = creds
    return found
