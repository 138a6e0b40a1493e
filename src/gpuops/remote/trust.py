"""Fetch a host's key without logging in, and record it (gpuops trust)."""
from __future__ import annotations

import socket

from ..errors import ConnectError, HostKeyError
from ..paths import known_hosts_file
from . import hostkeys


def fetch_key(host: str, port: int, timeout: float):
    import paramiko

    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    t = paramiko.Transport(sock)
    try:
        t.banner_timeout = timeout
        t.start_client(timeout=timeout)
        return t.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise ConnectError(f"{host}:{port} did not complete an SSH handshake: {exc}") from exc
    finally:
        t.close()


def trust(profile, *, reset: bool = False, expected: str | None = None) -> dict:
    removed = hostkeys.forget(profile.host, profile.port) if reset else 0
    key = fetch_key(profile.host, profile.port, profile.connect_timeout)
    fp = hostkeys.fingerprint(key)
    hid = hostkeys.host_id(profile.host, profile.port)
    if expected and expected.removeprefix("SHA256:") != fp.removeprefix("SHA256:"):
        raise HostKeyError(f"{hid} offers {key.get_name()} {fp}, not the expected {expected}; nothing recorded")
    known = hostkeys.load_known().lookup(hid)
    res = {"host": hid, "type": key.get_name(), "fingerprint": fp, "removed": removed, "file": str(known_hosts_file()),
           "already": False}
    if known is not None and key.get_name() in known:
        if known[key.get_name()] == key:
            res["already"] = True
            return res
        raise HostKeyError(
            f"host key for {hid} has CHANGED (now {fp}, recorded {hostkeys.fingerprint(known[key.get_name()])})",
            hint=f"if you expected this: gpuops trust {profile.name} --reset"
                 + (f"; also remove it from ~/.ssh/known_hosts: ssh-keygen -R '{hid}'"
                    if hostkeys.in_user_file(profile.host, profile.port) else ""),
        )
    hostkeys.record(profile.host, profile.port, key)
    return res
