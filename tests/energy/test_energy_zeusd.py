"""zeusd client against a local fake daemon speaking zeusd's documented HTTP API over a Unix socket."""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

import pytest

from carbonflow.energy.errors import PowerLimitNotPermitted
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import applied_power_limit
from carbonflow.energy.zeusd import ZeusdClient, ZeusdError


class FakeZeusd:
    """State of the fake daemon: GPUs as NVML would report them (mW, mJ), enabled groups, token."""

    def __init__(
        self,
        gpus: list[dict],
        groups: tuple[str, ...] = ("gpu-control", "gpu-read"),
        token: str | None = None,
        on_set=None,
    ) -> None:
        self.gpus = gpus
        self.groups = groups
        self.token = token
        self.requests: list[tuple[str, str]] = []
        self.on_set = on_set


def _handler(state: FakeZeusd):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # Unix-socket peers have no address to log
            pass

        def _send(self, status: int, payload=None) -> None:
            body = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            params = {k: v[0] for k, v in parse_qs(url.query).items()}
            state.requests.append((method, self.path))
            if url.path == "/discover":
                return self._send(
                    200,
                    {
                        "gpu_ids": list(range(len(state.gpus))),
                        "cpu_ids": [],
                        "dram_available": [],
                        "enabled_api_groups": list(state.groups),
                    },
                )
            if state.token is not None and self.headers.get("Authorization") != f"Bearer {state.token}":
                return self._send(401, {"error": "missing or invalid token"})
            group = "gpu-control" if method == "POST" else "gpu-read"
            if not url.path.startswith("/gpu/") or group not in state.groups:
                return self._send(404, {"error": f"API group {group} disabled"})
            ids = [int(i) for i in params["gpu_ids"].split(",")] if "gpu_ids" in params else None
            if method == "POST" and url.path == "/gpu/set_power_limit":
                if ids is None or "power_limit_mw" not in params or "block" not in params:
                    return self._send(400, {"error": "gpu_ids, power_limit_mw and block are required"})
                limit = int(params["power_limit_mw"])
                errors = {}
                for i in ids:
                    g = state.gpus[i]
                    if not g["min_mw"] <= limit <= g["max_mw"]:
                        errors[str(i)] = f"power limit {limit} mW out of range [{g['min_mw']}, {g['max_mw']}]"
                if errors:
                    return self._send(400, {"errors": errors})
                for i in ids:
                    state.gpus[i]["limit_mw"] = limit
                    if state.on_set:
                        state.on_set(i, limit)
                return self._send(200)
            sel = ids if ids is not None else range(len(state.gpus))
            if url.path == "/gpu/get_power_limit":
                return self._send(200, {str(i): {"power_limit_mw": state.gpus[i]["limit_mw"]} for i in sel})
            if url.path == "/gpu/get_power_limit_constraints":
                return self._send(
                    200,
                    {
                        str(i): {
                            "min_power_limit_mw": state.gpus[i]["min_mw"],
                            "max_power_limit_mw": state.gpus[i]["max_mw"],
                        }
                        for i in sel
                    },
                )
            if url.path == "/gpu/get_cumulative_energy":
                return self._send(200, {str(i): {"energy_mj": state.gpus[i]["energy_mj"]} for i in sel})
            if url.path == "/gpu/get_power":
                return self._send(
                    200, {"timestamp_ms": 1, "power_mw": {str(i): state.gpus[i]["power_mw"] for i in sel}}
                )
            return self._send(404, {"error": "no such endpoint"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@pytest.fixture
def zeusd_server(tmp_path):
    servers = []

    def start(state: FakeZeusd) -> str:
        sock = str(tmp_path / f"zeusd{len(servers)}.sock")
        server = socketserver.ThreadingUnixStreamServer(sock, _handler(state))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return sock

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _gpus(n: int = 2) -> list[dict]:
    return [
        {
            "name": "NVIDIA A40",
            "min_mw": 100000,
            "max_mw": 300000,
            "limit_mw": 300000,
            "energy_mj": 123456 * (i + 1),
            "power_mw": 75000,
        }
        for i in range(n)
    ]


def test_reads_convert_units(zeusd_server):
    sock = zeusd_server(FakeZeusd(_gpus()))
    client = ZeusdClient(sock)
    assert client.discover()["gpu_ids"] == [0, 1]
    assert client.get_power_limit_w() == {0: 300.0, 1: 300.0}
    assert client.get_power_limit_constraints_w([1]) == {1: (100.0, 300.0)}
    assert client.get_cumulative_energy_j([0, 1]) == {0: 123.456, 1: 246.912}
    assert client.get_power_w() == {0: 75.0, 1: 75.0}


def test_set_power_limit_query_parameters(zeusd_server):
    state = FakeZeusd(_gpus())
    client = ZeusdClient(zeusd_server(state))
    client.set_power_limit_w([0, 1], 175.5)
    assert state.requests[-1] == ("POST", "/gpu/set_power_limit?gpu_ids=0%2C1&power_limit_mw=175500&block=true")
    assert client.get_power_limit_w() == {0: 175.5, 1: 175.5}
    with pytest.raises(ValueError, match=r"HTTP 400.*out of range"):
        client.set_power_limit_w([0], 50)
    with pytest.raises(ValueError, match="gpu_ids=\\[\\]"):
        client.set_power_limit_w([], 200)


def test_token_and_disabled_groups(zeusd_server):
    sock = zeusd_server(FakeZeusd(_gpus(), groups=("gpu-read",), token="s3cret"))
    with pytest.raises(PowerLimitNotPermitted, match="HTTP 401"):
        ZeusdClient(sock).get_power_limit_w()
    authed = ZeusdClient(sock, token="s3cret")
    assert authed.get_power_limit_w() == {0: 300.0, 1: 300.0}
    with pytest.raises(ZeusdError, match="HTTP 404"):
        authed.set_power_limit_w([0], 200)


def test_unreachable_socket(tmp_path):
    with pytest.raises(ZeusdError, match="not reachable"):
        ZeusdClient(str(tmp_path / "missing.sock")).discover()
    with pytest.raises(ValueError, match="ZEUSD_SOCK_PATH is unset"):
        ZeusdClient(None)


def test_unprivileged_nvml_gpu_sets_limits_through_zeusd(fake_nvml, zeusd_server, journal_dir):
    """The training process may not set limits (NoPermission); zeusd does it for them and it is restored."""
    fake_nvml.setup([{"set_permission": False}, {"set_permission": False}])

    def privileged_set(index: int, limit_mw: int) -> None:  # what the daemon's NVML call does
        fake_nvml.update(index, limit_mw=limit_mw)

    client = ZeusdClient(zeusd_server(FakeZeusd(_gpus(), on_set=privileged_set)))
    gpus = nvml_devices(zeusd=client)
    with applied_power_limit(gpus, 180) as outcome:
        assert outcome.applied
        assert fake_nvml.limits_mw() == [180000, 180000]
    assert fake_nvml.limits_mw() == [300000, 300000]
    # without zeusd the same process is refused, and the run degrades
    with applied_power_limit(nvml_devices(), 180) as outcome:
        assert not outcome.applied and "no permission" in outcome.notes[-1]


def test_discovery_wires_zeusd_from_environment(fake_nvml, zeusd_server, journal_dir, monkeypatch):
    from carbonflow.energy.discovery import discover_devices

    fake_nvml.setup([{"set_permission": False}])
    sock = zeusd_server(FakeZeusd(_gpus(1), on_set=lambda i, mw: fake_nvml.update(i, limit_mw=mw)))
    monkeypatch.setenv("ZEUSD_SOCK_PATH", sock)
    (gpu,) = discover_devices(include_cpu=False)
    assert gpu.zeusd is not None and gpu.zeusd.socket_path == sock
    with applied_power_limit([gpu], 220) as outcome:
        assert outcome.applied and fake_nvml.limits_mw() == [220000]
    assert fake_nvml.limits_mw() == [300000]
