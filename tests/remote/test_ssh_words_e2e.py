"""Issue #36: `gpuops ssh` says nothing false. `-L ... -N` says "forwarding" only once the host is judged (host key,
key, reachability) and the local port is free; `-L A:B -L A:B` is one forward, said once; the sandbox's interactive
shell (a login shell, whose /etc/profile resets PATH) has the emulated nvidia-smi, as `ssh -- nvidia-smi` does.
Through the sandbox's real sshd."""
from __future__ import annotations

import http.server
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from support.helpers import default_sigint, record_another_host_key


def gpuops_proc(*args, **kw):
    return subprocess.run([sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"tensorboard-ish"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _through_forward(proc, local: int):
    """The HTTP body this machine's 127.0.0.1:LOCAL answers once `proc`'s forward is up (None after 30 s)."""
    import urllib.request

    body, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline and body is None:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5).read()
        except OSError:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
    return body


def test_a_forward_to_a_changed_host_key_never_says_forwarding(sandbox):
    record_another_host_key(sandbox["port"])
    p = gpuops_proc("ssh", "sandbox", "-L", f"{free_port()}:80", "-N")
    assert p.returncode == 3, p.stderr
    assert "CHANGED" in p.stderr and "forwarding" not in p.stderr, p.stderr


def test_a_forward_to_an_unreachable_host_never_says_forwarding(sandbox):
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["port"] = free_port()  # nothing listens there
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "gone.yaml").write_text(yaml.safe_dump(data))
    p = gpuops_proc("ssh", "gone", "-L", f"{free_port()}:80", "-N")
    assert p.returncode == 3, p.stderr
    assert "forwarding" not in p.stderr, p.stderr


def test_a_local_port_already_taken_is_said_before_connecting(sandbox, gpuops):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        r = gpuops("ssh", "sandbox", "-L", f"{port}:80", "-N")
    finally:
        busy.close()
    assert r.code == 2, r.all
    assert f"this machine's 127.0.0.1:{port} is already in use" in r.err and "forwarding" not in r.err, r.err
    assert "trusted new host key" not in r.err  # refused before connecting


def test_the_same_forward_twice_is_one_forward_said_once(sandbox, gpuops):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote, local = server.server_address[1], free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "ssh", "sandbox", "-L", f"{local}:{remote}",
                             "-L", f"{local}:{remote}", "-N"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    try:
        assert _through_forward(proc, local) == b"tensorboard-ish"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        server.shutdown()
    assert err.count(f"forwarding http://127.0.0.1:{local}") == 1, err
    r = gpuops("ssh", "sandbox", "-L", f"{local}:1", "-L", f"{local}:2", "-N")
    assert r.code == 2 and f"local port {local} is given twice" in r.err, r.all


def _interactive(argv: list[str], typed: bytes, until: bytes, seconds: float = 30) -> bytes:
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True, start_new_session=True,
                            env={**os.environ, "TERM": "dumb"})
    os.close(slave)
    out, sent, end = b"", False, time.monotonic() + seconds
    try:
        while time.monotonic() < end and until not in out:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not sent and out.rstrip(b" ").endswith((b"$", b"#")):  # the shell's prompt (a user's, root's)
                os.write(master, typed)
                sent = True
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
        os.close(master)
    return out


def test_the_sandbox_shell_has_the_emulated_gpu_tools(sandbox):
    out = _interactive([sys.executable, "-m", "gpuops", "ssh", "sandbox"],
                       b"nvidia-smi -L; echo END-$((6*7)); exit\n", b"END-42")
    assert b"END-42" in out, out[-2000:]
    assert b"GPU 0: NVIDIA" in out, out[-2000:]
    assert b"not found" not in out, out[-2000:]
