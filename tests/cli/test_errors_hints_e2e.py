"""Issue #29, "Errors and hints": one message per error (no library's traceback), a hint that names the command
that ran, and the two usual slips of `train` explained."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml


class Slammer:
    """A TCP listener that accepts and closes at once: a host whose sshd is not up yet, or a firewall. `reset`: it
    reads the client's banner, then closes with a TCP reset (SO_LINGER 0): a proxy or a firewall that resets."""

    def __init__(self, reset: bool = False):
        self.reset = reset
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.reset:  # after the client's banner came (its write succeeded): the reset meets its read
                import struct

                c.settimeout(5)
                try:
                    c.recv(256)
                except OSError:
                    pass
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def dropping(sandbox):
    """A profile `dropper` (the sandbox's key and user) whose port drops every connection before the banner."""
    s = Slammer()
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["port"] = s.port
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "dropper.yaml").write_text(yaml.safe_dump(data))
    yield s
    s.close()


@pytest.mark.parametrize("cmd", [["verify", "dropper"], ["sync", "-p", "dropper"], ["fetch", "-p", "dropper", "ckpt"],
                                 ["status", "-p", "dropper"], ["watch", "r-0001", "-p", "dropper"]])
def test_a_host_dropping_before_the_banner_is_one_message_naming_the_command(dropping, cmd):
    """Run as the user runs it (a process of its own: pytest's log capture would hide paramiko's log in-process)."""
    Path("train.py").write_text("print('hi')\n")
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuops", *cmd], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    r = type("R", (), {"code": p.returncode, "err": p.stderr, "all": p.stdout + p.stderr})
    assert r.code == 3, r.all
    assert "Traceback" not in r.all and "paramiko" not in r.all, r.err
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.err
    assert "SSH protocol banner" in errors[0] or "Connection" in errors[0], errors
    assert f"`gpuops {cmd[0]}` tried" in r.err, r.err
    assert "gpuops verify` retried" not in r.err
    assert len(r.err.strip().splitlines()) <= 4, r.err
    assert dropping.accepted >= 1
    assert elapsed < 15, elapsed


def test_a_host_resetting_before_the_banner_is_said_in_words_not_glued(sandbox):
    """paramiko glues the reset onto its own words ("...protocol banner[Errno 104] Connection reset by peer"):
    the message parts them."""
    s = Slammer(reset=True)
    try:
        data = yaml.safe_load(sandbox["profile"].read_text())
        data["port"] = s.port
        (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "resetter.yaml").write_text(yaml.safe_dump(data))
        p = subprocess.run([sys.executable, "-m", "gpuops", "verify", "resetter"], capture_output=True, text=True,
                           timeout=60)
    finally:
        s.close()
    assert p.returncode == 3, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, p.stderr
    assert "banner[" not in errors[0], errors
    assert "Error reading SSH protocol banner: [Errno 104] Connection reset by peer" in errors[0], errors


def test_the_traceback_is_there_with_debug(dropping):
    p = subprocess.run([sys.executable, "-m", "gpuops", "--debug", "status", "-p", "dropper"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 3
    assert "Traceback" in p.stderr


def test_a_sync_gives_up_as_fast_as_verify(dropping, gpuops):
    t0 = time.monotonic()
    assert gpuops("verify", "dropper").code == 3
    t_verify = time.monotonic() - t0
    t0 = time.monotonic()
    r = gpuops("sync", "-p", "dropper")
    t_sync = time.monotonic() - t0
    assert r.code == 3
    assert "`gpuops sync` tried 3 times" in r.err, r.err
    assert t_sync < t_verify + 1.5, (t_sync, t_verify)


@pytest.mark.parametrize("argv,says", [
    (["train", "train.py"], "`train.py` was taken as an argument for the script, not as the script: name it with "
                            "--script: gpuops train --script train.py"),
    (["train", "-p", "x", "train.py", "5"], "gpuops train -p x --script train.py -- 5"),
    (["train", "train.py", "--lr", "3"], "gpuops train --script train.py -- --lr 3"),
    (["train", "--script", "s.sh", "--quick"], "--quick is not an option of gpuops train; the script's own arguments "
                                               "go after `--`: gpuops train --script s.sh -- --quick"),
    (["run", "-s", "s.sh", "--quick"], "the script's own arguments go after `--`: gpuops run -s s.sh -- --quick"),
])
def test_the_two_usual_slips_get_a_hint(gpuops, argv, says):
    r = gpuops(*argv)
    assert r.code == 2, r.all
    assert "Traceback" not in r.err
    hints = [ln for ln in r.err.splitlines() if ln.startswith("hint: ")]
    assert len(hints) == 1 and says in hints[0], r.err


def test_no_hint_where_there_is_no_slip(gpuops):
    r = gpuops("train", "--script", "s.sh", "--", "--quick", "--nosuch")
    assert "after `--`" not in r.err and "taken as an argument" not in r.err
    r = gpuops("verify", "--nosuch")
    assert r.code == 2 and "hint:" not in r.err
