"""`gpuops ssh -L` tests share these: gpuops as a process, a free local port, a small HTTP server for the host's side
of a forward (the sandbox host is this machine's loopback) and what the forward's local end answers."""
from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import time
import urllib.request


def gpuops_proc(*args, **kw):
    return subprocess.run([sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"tensorboard-ish"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def through_forward(proc, local: int):
    """The HTTP body this machine's 127.0.0.1:LOCAL answers once `proc`'s forward is up (None after 30 s)."""
    body, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline and body is None:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5).read()
        except OSError:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
    return body
