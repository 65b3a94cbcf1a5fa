"""Client for zeusd, Zeus's privileged node daemon, over its Unix socket (HTTP API).

zeusd (ml-energy/zeus, ``zeusd/``) runs once per node with the privileges to change GPU power
limits; unprivileged training processes ask it over HTTP on a Unix domain socket (documented API:
https://ml.energy/zeus/zeusd/api/). carbonflow uses it on Kubernetes so that the training pod is
never privileged. Endpoints used (query parameters, ``gpu_ids`` comma-separated NVML indices):

* ``GET  /discover`` → ``{"gpus": [{"id", "name", ...}], "enabled_api_groups": [...], ...}``
* ``POST /gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=200000&block=true``
* ``GET  /gpu/get_power_limit`` → ``{"0": {"power_limit_mw": 200000}}``
* ``GET  /gpu/get_power_limit_constraints`` → ``{"0": {"min_power_limit_mw": ..., "max_power_limit_mw": ...}}``
* ``GET  /gpu/get_cumulative_energy`` → ``{"0": {"energy_mj": 123456}}``
* ``GET  /gpu/get_power`` → ``{"timestamp_ms": ..., "power_mw": {"0": 75000}}``

Status codes: 400 bad input, 401/403 auth or NVML no-permission, 404 API group disabled.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import urlencode

from carbonflow.energy.errors import EnergyError, PowerLimitNotPermitted

ZEUSD_SOCK_ENV = "ZEUSD_SOCK_PATH"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


class ZeusdError(EnergyError):
    """zeusd answered with an error or could not be reached."""


class ZeusdClient:
    """Minimal client of zeusd's HTTP API over a Unix socket."""

    def __init__(self, socket_path: str | None = None, token: str | None = None, timeout_s: float = 5.0) -> None:
        socket_path = socket_path or os.environ.get(ZEUSD_SOCK_ENV)
        if not socket_path:
            raise ValueError(f"socket_path=None and {ZEUSD_SOCK_ENV} is unset; give zeusd's Unix socket path")
        self.socket_path = socket_path
        self.token = token
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        url = path + ("?" + urlencode(params) if params else "")
        headers = {"Host": "localhost"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = _UnixHTTPConnection(self.socket_path, self.timeout_s)
        try:
            conn.request(method, url, headers=headers)
            resp = conn.getresponse()
            body = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise ZeusdError(f"zeusd not reachable at {self.socket_path}: {exc}") from exc
        finally:
            conn.close()
        if resp.status in (401, 403):
            raise PowerLimitNotPermitted(f"zeusd refused {method} {path} (HTTP {resp.status}): {body.strip()}")
        if resp.status == 400:
            raise ValueError(f"zeusd rejected {method} {url} (HTTP 400): {body.strip()}")
        if resp.status == 404:
            raise ZeusdError(f"zeusd {method} {path}: HTTP 404 (API group disabled?): {body.strip()}")
        if resp.status != 200:
            raise ZeusdError(f"zeusd {method} {path}: HTTP {resp.status}: {body.strip()}")
        return json.loads(body) if body.strip() else None

    @staticmethod
    def _ids(gpu_ids: list[int] | None) -> dict[str, str]:
        return {} if gpu_ids is None else {"gpu_ids": ",".join(str(i) for i in gpu_ids)}

    def discover(self) -> dict[str, Any]:
        """Devices, capabilities and enabled API groups of the daemon."""
        return self._request("GET", "/discover")

    def set_power_limit_w(self, gpu_ids: list[int], limit_w: float, block: bool = True) -> None:
        """Set the power limit (W) of the given GPU indices (sent as mW)."""
        if not gpu_ids:
            raise ValueError("gpu_ids=[] is not allowed; zeusd needs at least one GPU index for a write")
        params = self._ids(gpu_ids) | {
            "power_limit_mw": str(round(limit_w * 1000)),
            "block": "true" if block else "false",
        }
        self._request("POST", "/gpu/set_power_limit", params)

    def get_power_limit_w(self, gpu_ids: list[int] | None = None) -> dict[int, float]:
        data = self._request("GET", "/gpu/get_power_limit", self._ids(gpu_ids))
        return {int(k): v["power_limit_mw"] / 1000.0 for k, v in data.items()}

    def get_power_limit_constraints_w(self, gpu_ids: list[int] | None = None) -> dict[int, tuple[float, float]]:
        data = self._request("GET", "/gpu/get_power_limit_constraints", self._ids(gpu_ids))
        return {int(k): (v["min_power_limit_mw"] / 1000.0, v["max_power_limit_mw"] / 1000.0) for k, v in data.items()}

    def get_cumulative_energy_j(self, gpu_ids: list[int] | None = None) -> dict[int, float]:
        data = self._request("GET", "/gpu/get_cumulative_energy", self._ids(gpu_ids))
        return {int(k): v["energy_mj"] / 1000.0 for k, v in data.items()}

    def get_power_w(self, gpu_ids: list[int] | None = None) -> dict[int, float]:
        data = self._request("GET", "/gpu/get_power", self._ids(gpu_ids))
        return {int(k): v / 1000.0 for k, v in data["power_mw"].items()}
