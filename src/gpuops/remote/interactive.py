"""`gpuops ssh`: a shell, a one-off command or port forwards on a profile's host, through OpenSSH itself.

The pure part: `forward(text)` reads `-L [LOCAL:]REMOTE`, `ssh_argv(...)` builds the client's command line from
`connection.ssh_command` (the profile's key, user and port, gpuops' own known_hosts, StrictHostKeyChecking=yes).
The talking part: `session(...)` judges the host first through `connection.connect` (one handshake: a new host key
trusted as the profile's policy says, a changed one refused with exit 3, a refused key or an unreachable host the
message every command gives), then runs ssh with this terminal and returns its exit code.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

from ..errors import UsageError
from .connection import ssh_command


@dataclass(frozen=True)
class Forward:
    local: int
    remote: int

    def spec(self) -> str:
        """ssh's -L value: this machine's loopback only (never every interface), to the host's own loopback."""
        return f"127.0.0.1:{self.local}:127.0.0.1:{self.remote}"


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"-L {whole}: {text!r} is not a port (1 to 65535)",
                         hint="-L 6006 forwards local 6006 to the host's 6006; -L 8000:8888 local 8000 to its 8888")
    return int(text)


def forward(text: str) -> Forward:
    """`6006` -> local 6006 to the host's 127.0.0.1:6006; `8000:8888` -> local 8000 to its 8888."""
    parts = text.split(":")
    if len(parts) == 1:
        p = _port(parts[0], text)
        return Forward(p, p)
    if len(parts) == 2:
        return Forward(_port(parts[0], text), _port(parts[1], text))
    raise UsageError(f"-L {text}: give [LOCAL:]REMOTE, two ports at most",
                     hint="-L 6006 forwards local 6006 to the host's 127.0.0.1:6006; -L 8000:8888 local 8000 to "
                          "the host's 8888")


def unique(forwards: list[Forward]) -> list[Forward]:
    """The forwards asked, each once (`-L 6006 -L 6006` is one forward); one local port asked for two remote ones
    is a usage error (ssh would refuse the second bind)."""
    by_local: dict[int, Forward] = {}
    for f in forwards:
        seen = by_local.setdefault(f.local, f)
        if seen != f:
            raise UsageError(f"local port {f.local} is given twice: -L {seen.local}:{seen.remote} and "
                             f"-L {f.local}:{f.remote}", hint="give each forward its own local port: -L 8000:8888 "
                                                              "-L 8001:9999")
    return list(by_local.values())


def local_port_taken(port: int) -> bool:
    """Does something on this machine already listen on 127.0.0.1:port (ssh's bind would fail)? Bound as ssh binds
    (SO_REUSEADDR), so a connection closing in TIME_WAIT does not count."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def ssh_argv(profile, *, forwards: list[Forward] = (), forward_only: bool = False, command: list[str] = (),
             tty: bool = False) -> list[str]:
    """The OpenSSH command for `gpuops ssh`. A command's words are joined as ssh joins them (the remote shell reads
    them): give one quoted word for anything the remote shell should not split."""
    argv = ssh_command(profile)
    for f in forwards:
        argv += ["-L", f.spec()]
    if forwards:
        argv += ["-o", "ExitOnForwardFailure=yes"]  # a local port already taken ends ssh, instead of a silent no-op
    if forward_only:
        argv.append("-N")
    elif tty:
        argv.append("-t")
    argv.append(profile.host)
    if command and not forward_only:
        argv += ["--", *command]
    return argv


def session(profile, argv: list[str], *, announce=print, on_ready=None) -> int:
    """Judge the host through gpuops' own connection (host key, key file, reachability), then run `argv` with this
    terminal. `on_ready()` is called once the host is judged, before ssh starts (what `-L` says: never before the
    host key is checked). Returns ssh's exit code: the remote command's, or 255 when ssh itself failed."""
    import subprocess

    from .connection import connect

    connect(profile, announce=announce).close()
    if on_ready is not None:
        on_ready()
    proc = subprocess.Popen(argv)
    terminated = []

    def on_term(signum, frame):  # `kill PID` reaches gpuops alone: ssh (a tunnel) must not outlive it as an orphan
        terminated.append(signum)
        proc.terminate()

    old = _set_handler(signal.SIGTERM, on_term)
    try:
        code = proc.wait()
        return 128 + signal.SIGTERM if terminated else code
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached ssh too (same process group): it ends by itself
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _set_handler(signum, handler):
    """Install `handler` for `signum` and return the one it replaced (None outside the main thread, where Python
    allows no handler: nothing is installed)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signum, handler)
