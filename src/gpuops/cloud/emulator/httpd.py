"""The emulator's HTTP layer: a threading HTTP server on 127.0.0.1 whose handler reads a request, asks
`Emulator.handle` (or a knob under /_emulator/), and writes the answer, the faults of the wire included (a dropped
connection, a delayed answer, a proxy's HTML page). What it asks of the emulator is EmulatorApi."""
from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ContextManager, Optional, Protocol

from .faults import ApiError, _Delayed, _Drop


class EmulatorApi(Protocol):
    """What the HTTP layer asks of the emulator (server.Emulator), stated here so this module does not import the one
    that starts it."""
    KNOBS: tuple[str, ...]  # the test knobs, each a method POST /_emulator/<name> calls with the body's arguments
    lock: ContextManager  # held while a request is answered and the state saved

    def proxy_page(self, path: str) -> Optional[tuple[int, str]]: ...

    def authorized(self, header: Optional[str]) -> bool: ...

    def handle(self, method: str, path: str, body) -> tuple[int, object]: ...

    def state(self) -> dict: ...

    def _take_fault(self, name: str, path: str = "") -> Optional[dict]: ...

    def _save(self) -> None: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a dropped answer's socket errors are expected
        pass


def _handler(emu: EmulatorApi):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpuops-lambda-emulator"

        def log_message(self, *a):
            pass

        def _send(self, status: int, doc, headers: dict | None = None) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body_bytes(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _body(self):
            raw = self._body_bytes()
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError("invalid-parameters", "The request body is not valid JSON.") from None

        def _page(self, status: int, html: str) -> None:
            body = html.encode()
            self.send_response(status)
            self.send_header("Server", "nginx")
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="proxy"')
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _any(self) -> None:
            page = emu.proxy_page(self.path)
            if page:
                self._body_bytes()  # read the request's body, so the connection stays usable
                return self._page(*page)
            try:
                if not emu.authorized(self.headers.get("Authorization")):
                    raise ApiError("invalid-api-key")
                body = self._body()
                if self.path.startswith("/_emulator/"):
                    status, doc = self._admin(body)
                else:
                    with emu.lock:
                        slow = emu._take_fault("slow-answer", self.path.split("?", 1)[0])
                    if slow:  # outside the lock: the other requests go on meanwhile
                        time.sleep(float(slow.get("seconds", 3)))
                    try:
                        with emu.lock:
                            try:
                                status, doc = emu.handle(self.command, self.path, body)
                            finally:
                                emu._save()
                    except _Delayed as d:
                        time.sleep(d.seconds)
                        status, doc = d.status, d.doc
                self._send(status, doc)
            except ApiError as e:
                self._send(e.status, {"error": e.body}, e.headers)
            except _Drop:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def _admin(self, body) -> tuple[int, object]:
            name = self.path.split("?", 1)[0][len("/_emulator/"):].strip("/")
            if self.command == "GET" and name == "state":
                return 200, {"data": emu.state()}
            if self.command == "POST" and name in emu.KNOBS:
                try:
                    getattr(emu, name)(**(body or {}))
                except (TypeError, ValueError, KeyError) as e:
                    raise ApiError("invalid-parameters", f"{name}: {e}") from None
                return 200, {"data": emu.state()}
            raise ApiError("not-found")

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

    return Handler
