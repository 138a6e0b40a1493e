"""Issue #36: `gpuops ssh` says nothing false. `-L ... -N` says "forwarding" only once the host is judged (host key,
key, reachability) and the local port is free; `-L A:B -L A:B` is one forward, said once; the sandbox's interactive
shell (a login shell, whose /etc/profile resets PATH) has the emulated nvidia-smi, as `ssh -- nvidia-smi` does.
Through the sandbox's real sshd."""
from __future__ import annotations

import http.server
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from support.forward import Hello, free_port, gpuops_proc, through_forward
from support.helpers import default_sigint, record_another_host_key
from support.term import pty_read


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
    server = http.server.HTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote, local = server.server_address[1], free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "ssh", "sandbox", "-L", f"{local}:{remote}",
                             "-L", f"{local}:{remote}", "-N"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    try:
        assert through_forward(proc, local) == b"tensorboard-ish"
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
            chunk = pty_read(master)
            if chunk == b"":
                break
            out += chunk or b""
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
