"""A fake zeusd for the fake NVML node: zeusd's HTTP API over a Unix socket, acting on the node's *host* GPUs.

Like the real daemon it runs once per node with the privilege to change limits, addresses GPUs by their
host NVML index (``GET /discover`` → ``{"gpu_ids": [...], ...}``, no UUIDs), and acts on the same driver
state the fake ``pynvml`` reads (``FAKE_PYNVML_STATE``): a limit it sets is what every process's NVML then
reads back. The socket's mode is set like ``zeusd --socket-permissions``. Run it in a thread
(:func:`serve_fake_zeusd`) or as a process (``python -m tests.fakes.fake_zeusd STATE SOCKET``).

It is zeusd's API only, as the real daemon has no reference counts: on Kubernetes the count lives in carbonflow's
own power agent (:mod:`carbonflow.energy.power_agent`, real code), which the fake GPU node runs in front of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socketserver
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "energy" / "fake_pynvml"


def _fake_pynvml():
    """The fake driver, loaded under its own name: never on ``sys.path``, where a later ``import pynvml`` in the
    same process would take it for the real nvidia-ml-py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_pynvml_for_zeusd", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeZeusdNode:
    """State shared with the handler: the driver state file, enabled API groups, requests seen."""

    def __init__(self, state_path: str | Path, groups: tuple[str, ...] = ("gpu-control", "gpu-read")) -> None:
        self.state_path = str(state_path)
        self.groups = groups
        self.requests: list[tuple[str, str]] = []
        self.nvml = _fake_pynvml()
        self.reachable = True

    def devices(self) -> list[dict]:
        return self.nvml.read_state(self.state_path)["devices"]


def _handler(node: FakeZeusdNode):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
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
            node.requests.append((method, self.path))
            devices = node.devices()
            if url.path == "/discover":
                return self._send(200, {"gpu_ids": list(range(len(devices))), "cpu_ids": [], "dram_available": [],
                                        "enabled_api_groups": list(node.groups)})  # fmt: skip
            group = "gpu-control" if method == "POST" else "gpu-read"
            if not url.path.startswith("/gpu/") or group not in node.groups:
                return self._send(404, {"error": f"API group {group} disabled"})
            ids = [int(i) for i in params["gpu_ids"].split(",")] if "gpu_ids" in params else None
            if ids is not None and any(not 0 <= i < len(devices) for i in ids):
                return self._send(400, {"error": f"gpu_ids {ids}: this node has GPUs 0..{len(devices) - 1}"})
            sel = ids if ids is not None else range(len(devices))
            if method == "POST" and url.path == "/gpu/set_power_limit":
                return self._set(ids, params)
            if url.path == "/gpu/get_power_limit":
                return self._send(200, {str(i): {"power_limit_mw": devices[i]["limit_mw"]} for i in sel})
            if url.path == "/gpu/get_power_limit_constraints":
                bounds = {"min_power_limit_mw": "min_limit_mw", "max_power_limit_mw": "max_limit_mw"}
                return self._send(200, {str(i): {k: devices[i][v] for k, v in bounds.items()} for i in sel})
            return self._send(404, {"error": "no such endpoint"})

        def _set(self, ids, params) -> None:
            if ids is None or "power_limit_mw" not in params or "block" not in params:
                return self._send(400, {"error": "gpu_ids, power_limit_mw and block are required"})
            try:
                for i in ids:
                    node.nvml.host_set_power_limit(node.state_path, i, int(params["power_limit_mw"]))
            except node.nvml.NVMLError as exc:
                return self._send(400, {"error": str(exc)})
            return self._send(200)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@contextlib.contextmanager
def serve_fake_zeusd(
    state_path: str | Path, socket_path: str | Path, mode: int = 0o660, **kw
) -> Iterator[FakeZeusdNode]:
    """Serve a fake zeusd on ``socket_path`` (file mode ``mode``) in a thread for the block."""
    node = FakeZeusdNode(state_path, **kw)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socketserver.ThreadingUnixStreamServer(str(socket_path), _handler(node))
    os.chmod(socket_path, mode)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str]) -> int:
    state, sock = argv[:2]
    with serve_fake_zeusd(state, sock):
        print("FAKE ZEUSD READY", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
