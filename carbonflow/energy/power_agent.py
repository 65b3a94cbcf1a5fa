"""The one owner of a GPU's power limit on a Kubernetes node: a reference count per GPU in front of zeusd.

zeusd sets what it is told, and the last writer wins. Two pods on one time-sliced GPU (a co-located pair, or two
pairs) each read the limit, lower it and put back what they read: the second reads the first's lowered limit and,
ending last, leaves the GPU lowered for good. zeusd has no notion of holders, so this agent — beside zeusd in its
DaemonSet (``deploy/k8s/zeusd-daemonset.yaml``), on the socket the pods use, with zeusd itself on an inner socket
no pod mounts — keeps per host GPU index:

* ``original_mw``: the limit before the first holder lowered it, read from zeusd on the first hold;
* ``holders``: each holder's requested limit, in the order they set it (a holder is a pod, ``<namespace>/<pod>``).

``POST /gpu/set_power_limit?...&holder=H`` holds (count + 1, or H's new limit) and sets H's limit;
``POST /gpu/release_power_limit?holder=H[&gpu_ids=...]`` releases (count − 1) and sets the latest remaining holder's
limit, or ``original_mw`` when none remains. A pod's wrapper releases when it ends; a pod that dies (SIGKILL, OOM)
is released by its restore pod, which replays the pod's journal (it names the holder). A ``set_power_limit``
without a holder on a held GPU is refused (409): nothing bypasses the count. Every other request is forwarded to
zeusd unchanged, and ``GET /discover`` adds the API group ``carbonflow-holders`` so clients know to name
themselves. The state is a JSON file on the host, written before each change, so a restarted agent still knows
the originals.

Run: ``python -m carbonflow.energy.power_agent --socket S --zeusd-socket Z --state FILE [--socket-permissions 660]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socketserver
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from carbonflow.energy.errors import EnergyError, PowerLimitNotPermitted
from carbonflow.energy.zeusd import HOLDERS_GROUP, ZeusdClient


class HoldConflict(EnergyError):
    """A write without a holder on a GPU that carbonflow runs hold."""


class PowerAgent:
    """The reference counts and the zeusd they front (thread-safe; state persisted to ``state_path``)."""

    def __init__(self, zeusd: ZeusdClient, state_path: str | Path) -> None:
        self.zeusd = zeusd
        self.state_path = Path(state_path)
        self._lock = threading.Lock()
        self.gpus: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            return dict(json.loads(self.state_path.read_text())["gpus"])
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EnergyError(f"power agent state {self.state_path} is unreadable: {exc}") from exc

    def _save(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": self.gpus}, indent=2))
        os.replace(tmp, self.state_path)

    def hold(self, gpu_ids: list[int], limit_mw: int, holder: str) -> None:
        """``holder`` wants ``limit_mw`` on ``gpu_ids``: recorded (with the original on a first hold), then set."""
        with self._lock:
            before = json.loads(json.dumps(self.gpus))
            for index in gpu_ids:
                record = self.gpus.get(str(index))
                if record is None:
                    original_w = self.zeusd.get_power_limit_w([index])[index]
                    record = {"original_mw": round(original_w * 1000), "holders": {}}
                record["holders"].pop(holder, None)  # re-inserted last: the latest request wins
                record["holders"][holder] = limit_mw
                self.gpus[str(index)] = record
            self._save()  # before the change: a crash after it still knows the original
            try:
                self.zeusd.set_power_limit_w(gpu_ids, limit_mw / 1000)
            except Exception:  # refused or unreachable: nothing is held by this request
                self.gpus = before
                self._save()
                raise

    def release(self, holder: str, gpu_ids: list[int] | None = None) -> dict[int, dict[str, int]]:
        """Drop ``holder`` from ``gpu_ids`` (default: every GPU it holds); returns index → limit left, holders left."""
        with self._lock:
            if gpu_ids is None:
                gpu_ids = [int(k) for k, record in self.gpus.items() if holder in record["holders"]]
            out = {}
            for index in gpu_ids:
                record = self.gpus.get(str(index))
                if record is None:  # nothing held (e.g. released already): report what the GPU is at
                    out[index] = {"power_limit_mw": round(self.zeusd.get_power_limit_w([index])[index] * 1000),
                                  "holders": 0}  # fmt: skip
                    continue
                remaining = {h: mw for h, mw in record["holders"].items() if h != holder}
                target_mw = list(remaining.values())[-1] if remaining else record["original_mw"]
                if holder not in record["holders"]:  # released already: nothing changes
                    out[index] = {"power_limit_mw": target_mw, "holders": len(remaining)}
                    continue
                self.zeusd.set_power_limit_w([index], target_mw / 1000)  # raises: the holder stays, retry later
                if remaining:
                    record["holders"] = remaining
                else:
                    del self.gpus[str(index)]
                self._save()
                out[index] = {"power_limit_mw": target_mw, "holders": len(remaining)}
            return out

    def check_unheld(self, gpu_ids: list[int]) -> None:
        """Refuse a holder-less write on a held GPU (it would bypass the count)."""
        with self._lock:
            held = {i: sorted(self.gpus[str(i)]["holders"]) for i in gpu_ids if str(i) in self.gpus}
        if held:
            raise HoldConflict(
                f"GPU(s) {sorted(held)} are held by carbonflow runs {held}: set_power_limit needs holder=<name> "
                "(released with POST /gpu/release_power_limit?holder=<name>)"
            )


def _status_of(exc: Exception) -> int:
    if isinstance(exc, HoldConflict):
        return 409
    if isinstance(exc, PowerLimitNotPermitted):
        return 403
    if isinstance(exc, ValueError):
        return 400
    return 502  # zeusd unreachable or failing


def _handler(agent: PowerAgent) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: Any) -> None:
            self._send(status, b"" if payload is None else json.dumps(payload).encode())

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            params = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if method == "POST" and url.path == "/gpu/release_power_limit":
                    return self._release(params)
                if method == "POST" and url.path == "/gpu/set_power_limit":
                    return self._set(params)
                if method == "GET" and url.path == "/holders":
                    return self._json(200, agent.gpus)
                if method == "GET" and url.path == "/discover":
                    found = agent.zeusd.discover()
                    found["enabled_api_groups"] = [*found.get("enabled_api_groups", []), HOLDERS_GROUP]
                    return self._json(200, found)
                status, body = agent.zeusd.forward(method, self.path)
                return self._send(status, body)
            except (EnergyError, ValueError) as exc:
                return self._json(_status_of(exc), {"error": str(exc)})

        def _ids(self, params: dict[str, str]) -> list[int] | None:
            if "gpu_ids" not in params:
                return None
            try:
                return [int(i) for i in params["gpu_ids"].split(",")]
            except ValueError:
                raise ValueError(f"gpu_ids={params['gpu_ids']!r}: give comma-separated host GPU indices") from None

        def _set(self, params: dict[str, str]) -> None:
            ids = self._ids(params)
            if not ids or "power_limit_mw" not in params:
                raise ValueError("set_power_limit needs gpu_ids and power_limit_mw")
            if "holder" not in params:
                agent.check_unheld(ids)
                status, body = agent.zeusd.forward("POST", self.path)
                return self._send(status, body)
            agent.hold(ids, int(params["power_limit_mw"]), params["holder"])
            return self._json(200, None)

        def _release(self, params: dict[str, str]) -> None:
            if not params.get("holder"):
                raise ValueError("release_power_limit needs holder=<name>")
            left = agent.release(params["holder"], self._ids(params))
            return self._json(200, {str(i): v for i, v in left.items()})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@contextlib.contextmanager
def serve_power_agent(
    socket_path: str | Path, zeusd_socket: str | Path, state_path: str | Path, mode: int = 0o660
) -> Iterator[PowerAgent]:
    """Serve the agent on ``socket_path`` (file mode ``mode``) in a thread for the block."""
    agent = PowerAgent(ZeusdClient(str(zeusd_socket)), state_path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socketserver.ThreadingUnixStreamServer(str(socket_path), _handler(agent))
    os.chmod(socket_path, mode)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m carbonflow.energy.power_agent", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="the socket the pods use (ZEUSD_SOCK_PATH)")
    parser.add_argument("--zeusd-socket", required=True, help="zeusd's own socket (mounted in no pod)")
    parser.add_argument("--state", required=True, help="the reference counts' file, on the host")
    parser.add_argument("--socket-permissions", default="660", help="octal mode of --socket (never world-writable)")
    args = parser.parse_args(argv)
    mode = int(args.socket_permissions, 8)
    if mode & 0o007:
        print(f"error: --socket-permissions={args.socket_permissions}: others may not reach the socket; use 660",
              file=sys.stderr)  # fmt: skip
        return 2
    with serve_power_agent(args.socket, args.zeusd_socket, args.state, mode):
        print(f"carbonflow power agent on {args.socket} (zeusd at {args.zeusd_socket})", flush=True)
        threading.Event().wait()
    return 0  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
