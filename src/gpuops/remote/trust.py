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


def trust(profile, *, reset: bool = False, expected: str | None = None,
          confirm=None) -> dict:
    """Fetch the host's key and record it. With reset, a recorded key is replaced only once the new key is fetched
    and accepted: it matches `expected`, or `confirm(question)` says yes. On any failure (host unreachable, wrong
    fingerprint, not confirmed) the known_hosts file is unchanged."""
    from .connection import target

    tg = target(profile)
    key = fetch_key(tg.host, tg.port, profile.connect_timeout)
    fp = hostkeys.fingerprint(key)
    hid = hostkeys.host_id(tg.host, tg.port)
    if expected and expected.removeprefix("SHA256:") != fp.removeprefix("SHA256:"):
        raise HostKeyError(f"{hid} offers {key.get_name()} {fp}, not the expected {expected}; nothing recorded"
                           + ("; the recorded key is kept" if reset else ""))
    known = hostkeys.load_known().lookup(hid)
    res = {"host": tg.host, "port": tg.port, "host_id": hid, "type": key.get_name(), "fingerprint": fp, "removed": 0, "file": str(known_hosts_file()),
           "already": False}
    if known is not None and key.get_name() in known and known[key.get_name()] == key:
        res["already"] = True
        return res
    if known is not None and len(known) and not reset:
        # a known host offering another key, of the same type or another one: refused, never added beside it
        recorded = known[key.get_name()] if key.get_name() in known else next(iter(known.values()))
        raise HostKeyError(
            f"host key for {hid} has CHANGED (now {key.get_name()} {fp}, recorded {recorded.get_name()} "
            f"{hostkeys.fingerprint(recorded)})",
            hint=f"if you expected this: gpuops trust {profile.name} --reset --fingerprint {fp}"
                 + (f"; also remove it from ~/.ssh/known_hosts: ssh-keygen -R '{hid}'"
                    if hostkeys.in_user_file(tg.host, tg.port) else ""),
        )
    if reset and known is not None and len(known) and not expected:
        question = (f"{hid} now offers {key.get_name()} {fp}; forget the recorded key and trust this one? "
                    "Check the fingerprint with your provider first.")
        if confirm is None or not confirm(question):
            raise HostKeyError(f"{hid} offers {key.get_name()} {fp}: not confirmed, the recorded key is kept",
                               hint=f"if that fingerprint is right: gpuops trust {profile.name} --reset "
                                    f"--fingerprint {fp}  (or --yes)")
    if reset:
        res["removed"] = hostkeys.replace(tg.host, tg.port, key)
    else:
        hostkeys.record(tg.host, tg.port, key)
    return res
