"""Client for zeusd, Zeus's privileged node daemon, over its Unix socket (HTTP API).

zeusd (ml-energy/zeus, ``zeusd/``) runs once per node with the privileges to change GPU power
limits; unprivileged training processes ask it over HTTP on a Unix domain socket (documented API:
https://ml.energy/zeus/zeusd/api/). carbonflow uses it on Kubernetes so that the training pod is
never privileged. Endpoints used (query parameters, ``gpu_ids`` comma-separated NVML indices):

* ``GET  /discover`` → ``{"gpu_ids": [0, 1, ...], "cpu_ids": [...], "enabled_api_groups": [...], ...}``
* ``POST /gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=200000&block=true``
* ``GET  /gpu/get_power_limit`` → ``{"0": {"power_limit_mw": 200000}}``
* ``GET  /gpu/get_power_limit_constraints`` → ``{"0": {"min_power_limit_mw": ..., "max_power_limit_mw": ...}}``
* ``GET  /gpu/get_cumulative_energy`` → ``{"0": {"energy_mj": 123456}}``
* ``GET  /gpu/get_power`` → ``{"timestamp_ms": ..., "power_mw": {"0": 75000}}``

Status codes: 400 bad input, 401/403 auth or NVML no-permission, 404 API group disabled.

On Kubernetes the socket the pods use is carbonflow's power agent (:mod:`carbonflow.energy.power_agent`), which
forwards to zeusd and keeps a reference count per GPU: ``/discover`` then lists the API group
``carbonflow-holders``, this client names itself on every write (``holder=<namespace>/<pod>``, see
:func:`default_holder`) and gives its GPUs back with ``POST /gpu/release_power_limit?holder=...`` instead of
writing the limit it read (:func:`release_device`).

zeusd numbers GPUs as NVML does *on the host*. A process in a container enumerates only the GPUs it was
given, from 0, so its index is not zeusd's: carbonflow addresses GPUs by UUID and maps a UUID to zeusd's
host index with :meth:`ZeusdClient.host_index` — from the node's map file (``CARBONFLOW_GPU_INDEX_MAP``,
JSON ``{uuid: host index}``, written on the host by ``python -m carbonflow.energy.zeusd write-index-map``)
or, when this process sees as many GPUs as zeusd does (it is on the host), from its own NVML index.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from carbonflow.contract import GPU_INDEX_MAP_ENV, ZEUSD_SOCK_ENV
from carbonflow.energy.errors import EnergyError, PowerLimitNotPermitted
from carbonflow.settings import gpu_index_map_file

HOLDERS_GROUP = "carbonflow-holders"
"""The API group of carbonflow's power agent: writes name their holder, and holders are released, per GPU."""


def default_holder() -> str:
    """Who holds a limit this process sets: ``<namespace>/<pod>`` in a pod (unique, and what its restore pod finds
    in the journal), else ``<host>/pid-<pid>``."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return f"{os.environ.get('POD_NAMESPACE', 'default')}/{pod}"
    return f"{os.uname().nodename}/pid-{os.getpid()}"


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

    def __init__(
        self, socket_path: str | None = None, token: str | None = None, timeout_s: float = 5.0,
        holder: str | None = None,
    ) -> None:  # fmt: skip
        socket_path = socket_path or os.environ.get(ZEUSD_SOCK_ENV)
        if not socket_path:
            raise ValueError(f"socket_path=None and {ZEUSD_SOCK_ENV} is unset; give zeusd's Unix socket path")
        self.socket_path = socket_path
        self.token = token
        self.timeout_s = timeout_s
        self.holder = holder or default_holder()
        self._counts_holders: bool | None = None

    def counts_holders(self) -> bool:
        """Whether the socket is carbonflow's power agent (reference-counted limits), asked once."""
        if self._counts_holders is None:
            self._counts_holders = HOLDERS_GROUP in self.discover().get("enabled_api_groups", [])
        return self._counts_holders

    def forward(self, method: str, url: str) -> tuple[int, bytes]:
        """Send ``method url`` as is; (HTTP status, body) — the power agent passes requests on to zeusd."""
        status, body = self._raw(method, url)
        return status, body.encode()

    def _raw(self, method: str, url: str) -> tuple[int, str]:
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
        return resp.status, body

    def _request(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        url = path + ("?" + urlencode(params) if params else "")
        status, body = self._raw(method, url)
        if status in (401, 403):
            raise PowerLimitNotPermitted(f"zeusd refused {method} {path} (HTTP {status}): {body.strip()}")
        if status == 400:
            raise ValueError(f"zeusd rejected {method} {url} (HTTP 400): {body.strip()}")
        if status == 404:
            raise ZeusdError(f"zeusd {method} {path}: HTTP 404 (API group disabled?): {body.strip()}")
        if status != 200:
            raise ZeusdError(f"zeusd {method} {path}: HTTP {status}: {body.strip()}")
        return json.loads(body) if body.strip() else None

    @staticmethod
    def _ids(gpu_ids: list[int] | None) -> dict[str, str]:
        return {} if gpu_ids is None else {"gpu_ids": ",".join(str(i) for i in gpu_ids)}

    def discover(self) -> dict[str, Any]:
        """Devices, capabilities and enabled API groups of the daemon."""
        return self._request("GET", "/discover")

    def host_gpu_count(self) -> int:
        return len(self.discover().get("gpu_ids", []))

    def host_index(self, gpu_uuid: str, local_index: int, local_count: int) -> int:
        """zeusd's (host) index of the GPU with ``gpu_uuid`` (see the module docstring); never a guess."""
        map_path = gpu_index_map_file()
        if map_path:
            try:
                mapping = json.loads(map_path.read_text())
            except (OSError, ValueError) as exc:
                raise ZeusdError(f"{GPU_INDEX_MAP_ENV}={str(map_path)!r} is not a readable JSON map: {exc}") from exc
            if gpu_uuid not in mapping:
                raise ZeusdError(f"GPU {gpu_uuid} is not in the node's index map {map_path} ({sorted(mapping)})")
            return int(mapping[gpu_uuid])
        host_count = self.host_gpu_count()
        if host_count == local_count:
            return local_index
        raise ZeusdError(
            f"GPU {gpu_uuid}: this process sees {local_count} GPU(s) but zeusd manages {host_count}, so its index "
            f"{local_index} is not zeusd's; give the node's UUID→index map in {GPU_INDEX_MAP_ENV}"
        )

    def set_power_limit_w(self, gpu_ids: list[int], limit_w: float, block: bool = True) -> None:
        """Set the power limit (W) of the given GPU indices (sent as mW)."""
        if not gpu_ids:
            raise ValueError("gpu_ids=[] is not allowed; zeusd needs at least one GPU index for a write")
        params = self._ids(gpu_ids) | {
            "power_limit_mw": str(round(limit_w * 1000)),
            "block": "true" if block else "false",
        }
        if self.counts_holders():
            params["holder"] = self.holder
        self._request("POST", "/gpu/set_power_limit", params)

    def release_power_limit_w(self, gpu_ids: list[int], holder: str | None = None) -> dict[int, float]:
        """Give ``holder``'s hold (default: this client's) on ``gpu_ids`` back to the power agent; index → limit
        (W) the GPU is left at: the latest remaining holder's, or the original once no holder remains."""
        params = self._ids(gpu_ids) | {"holder": holder or self.holder}
        data = self._request("POST", "/gpu/release_power_limit", params)
        return {int(k): v["power_limit_mw"] / 1000.0 for k, v in data.items()}

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


def release_device(device: Any, holder: str | None = None) -> float | None:
    """Release ``holder``'s hold on an NVML GPU behind carbonflow's power agent; the limit (W) it is left at, or
    None when the GPU's limits do not go through a reference-counting agent (then restore the limit read)."""
    client = getattr(device, "zeusd", None)
    if client is None or not client.counts_holders():
        return None
    from carbonflow.energy.nvml import nvml_init

    host_index = client.host_index(device.id, device.index, nvml_init().nvmlDeviceGetCount())
    return client.release_power_limit_w([host_index], holder)[host_index]


def holder_of(device: Any) -> str | None:
    """Who holds ``device``'s limit at the power agent (this process), or None without one."""
    client = getattr(device, "zeusd", None)
    try:
        return client.holder if client is not None and client.counts_holders() else None
    except EnergyError:  # the agent is unreachable: no limit will be set through it either
        return None


def write_index_map(path: Path) -> dict[str, int]:
    """On the host: write this node's GPU UUID → NVML (= zeusd) index map to ``path`` (atomically)."""
    from carbonflow.energy.nvml import nvml_devices

    mapping = {gpu.id: gpu.index for gpu in nvml_devices(all_devices=True)}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(mapping, indent=2))
    tmp.replace(path)
    return mapping


def main(argv: list[str] | None = None) -> int:
    """``python -m carbonflow.energy.zeusd write-index-map PATH`` (run on the host, e.g. by the node agent)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "write-index-map":
        print("usage: python -m carbonflow.energy.zeusd write-index-map PATH", file=sys.stderr)
        return 2
    print(json.dumps(write_index_map(Path(args[1])), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
