"""Host key checking: trust on first use (accept-new) or strict; a changed key is always refused.

gpuops records keys in its own known_hosts (~/.config/gpuops/known_hosts, OpenSSH format) and also reads
~/.ssh/known_hosts; entries in gpuops' file take precedence. Fabric's default policy (add any key silently) is replaced.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable

from ..errors import HostKeyError
from ..paths import known_hosts_file, user_known_hosts_file


def host_id(host: str, port: int) -> str:
    """The known_hosts name of a host, as OpenSSH writes it."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load_known():
    """HostKeys from gpuops' file, plus ~/.ssh/known_hosts entries for hosts gpuops' file does not name."""
    import paramiko

    def read(f: Path):
        hk = paramiko.HostKeys()
        if f.is_file():
            try:
                hk.load(str(f))
            except (OSError, paramiko.SSHException, ValueError):
                pass
        return hk

    ours, theirs = read(known_hosts_file()), read(user_known_hosts_file())
    named = {n for e in ours._entries for n in e.hostnames}
    ours._entries.extend(e for e in theirs._entries if not named.intersection(e.hostnames))
    return ours


@contextlib.contextmanager
def _locked():
    """gpuops' known_hosts is changed under an exclusive lock (several gpuops processes, or a fleet's parallel
    connections, may record keys at once) and rewritten atomically: a crash never leaves half a file."""
    import fcntl

    f = known_hosts_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f.with_name(f.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield f
    finally:
        os.close(fd)


def _names(line: str) -> list[str]:
    return line.split(" ", 1)[0].split(",") if line.strip() and not line.startswith("#") else []


def _rewrite(f: Path, host: str, port: int, key=None) -> int:
    """Drop every entry for host:port and (if key) add key, in one atomic write; returns the entries dropped."""
    from ..paths import write_private

    name = host_id(host, port)
    lines = f.read_text().splitlines(keepends=True) if f.is_file() else []
    kept = [ln for ln in lines if name not in _names(ln)]
    removed = len(lines) - len(kept)
    if key is not None:
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        kept.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    if removed or key is not None:
        write_private(f, "".join(kept))
    return removed


def record(host: str, port: int, key) -> Path:
    """Add a host key to gpuops' known_hosts (created private; other hosts' entries kept)."""
    with _locked() as f:
        from ..paths import write_private

        lines = f.read_text() if f.is_file() else ""
        name = host_id(host, port)
        recorded = [ln.split() for ln in lines.splitlines() if name in _names(ln)]
        if any(len(r) >= 3 and r[1:3] == [key.get_name(), key.get_base64()] for r in recorded):
            return f  # recorded meanwhile by another gpuops (a fleet's parallel connections): nothing to add
        if recorded:  # checked and recorded under one lock: a key that appeared meanwhile is never joined by another
            raise HostKeyError(f"host key for {name} has CHANGED while connecting (now {key.get_name()} "
                               f"{fingerprint(key)}, just recorded by another gpuops: {recorded[0][1]}); refusing",
                               hint="run the command again; if it persists: gpuops trust <profile> --reset "
                                    f"--fingerprint {fingerprint(key)}")
        if lines and not lines.endswith("\n"):
            lines += "\n"
        write_private(f, lines + f"{host_id(host, port)} {key.get_name()} {key.get_base64()}\n")
    return f


def replace(host: str, port: int, key) -> int:
    """Forget host:port's recorded keys and record `key`, as one step; returns how many entries went."""
    with _locked() as f:
        return _rewrite(f, host, port, key)


def forget(host: str, port: int) -> int:
    """Remove every entry for host:port from gpuops' known_hosts; returns how many lines went."""
    with _locked() as f:
        return _rewrite(f, host, port) if f.is_file() else 0


def in_user_file(host: str, port: int) -> bool:
    """Whether ~/.ssh/known_hosts names this host (we never edit that file ourselves)."""
    import paramiko

    f = user_known_hosts_file()
    if not f.is_file():
        return False
    hk = paramiko.HostKeys()
    try:
        hk.load(str(f))
    except Exception:
        return False
    return hk.lookup(host_id(host, port)) is not None


def make_policy(profile_name: str, policy: str, announce: Callable[[str], None]):
    """A paramiko MissingHostKeyPolicy: record-and-announce (accept-new) or refuse (strict)."""
    import paramiko

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            fp = fingerprint(key)
            other = load_known().lookup(hostname)
            if other is not None and any(k == key for k in other.values()):
                client.get_host_keys().add(hostname, key.get_name(), key)  # recorded meanwhile (a parallel connection)
                return
            if other is not None and len(other):
                # paramiko calls this when no key of THIS type is recorded; a known host offering a key of another
                # type is a changed key, not a new host (a man in the middle would offer whatever type it has)
                old = next(iter(other.values()))
                raise HostKeyError(
                    f"host key for {hostname} has CHANGED (now {key.get_name()} {fp}, recorded {old.get_name()} "
                    f"{fingerprint(old)}); refusing to connect",
                    hint=f"if you expected this: gpuops trust {profile_name} --reset --fingerprint {fp}")
            if policy == "strict":
                raise HostKeyError(
                    f"host key for {hostname} is not known and profile '{profile_name}' uses host_key_policy: strict "
                    f"({key.get_name()} {fp})",
                    hint=f"check the fingerprint with your provider, then run: gpuops trust {profile_name} --fingerprint {fp}",
                )
            host, _, port = hostname.strip("[").partition("]:")
            client.get_host_keys().add(hostname, key.get_name(), key)
            record(host, int(port or 22), key)
            announce(f"trusted new host key for {hostname}: {key.get_name()} {fp}")

    return _Policy()


def changed_key_error(profile_name: str, host: str, port: int, exc) -> HostKeyError:
    got = fingerprint(exc.key)
    expected = fingerprint(exc.expected_key)
    hint = f"if you expected this (a new instance on a recycled IP): gpuops trust {profile_name} --reset --fingerprint {got}"
    if in_user_file(host, port):
        hint += f"; the old key is also in ~/.ssh/known_hosts: ssh-keygen -R '{host_id(host, port)}'"
    return HostKeyError(
        f"host key for {host_id(host, port)} has CHANGED (now {got}, recorded {expected}); refusing to connect. "
        "Someone could be intercepting the connection, or the address now belongs to another machine.",
        hint=hint,
    )


# -- a key pinned at the instance's launch (profile host_key): the host is judged by it alone ------------------------
def pinned(host: str, port: int, line: str):
    """paramiko HostKeys holding only the pinned key for host:port: an entry of known_hosts for the same address (a
    gone instance's: Lambda reuses addresses) neither blocks the host nor is trusted for it."""
    import paramiko

    hk = paramiko.HostKeys()
    kind, b64 = line.split()[:2]
    hk.add(host_id(host, port), kind, paramiko.PKey.from_type_string(kind, base64.b64decode(b64)))
    return hk


def pinned_policy(profile_name: str):
    """A key of another type than the pinned one is refused (a man in the middle offers whatever type it has)."""
    import paramiko

    class _Pinned(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            raise HostKeyError(f"host key for {hostname} is not the one pinned at its launch (now {key.get_name()} "
                               f"{fingerprint(key)}); refusing to connect",
                               hint=f"profile '{profile_name}' names the key its instance was launched with "
                                    "(host_key:); an instance that is gone leaves its address to another machine")

    return _Pinned()


def pinned_error(profile_name: str, host: str, port: int, exc) -> HostKeyError:
    return HostKeyError(
        f"host key for {host_id(host, port)} is not the one pinned at its launch (now {fingerprint(exc.key)}, "
        f"pinned {fingerprint(exc.expected_key)}); refusing to connect. Someone could be intercepting the connection, "
        "or the instance behind the profile is gone and its address now belongs to another machine.",
        hint=f"gpuops ls shows whether profile '{profile_name}''s instance still runs")


def pin_file(host: str, port: int, line: str) -> Path:
    """A known_hosts file holding only the pinned key (for OpenSSH: ssh, rsync -e), private, named by its content so
    that parallel commands write the same file; written whole under a temporary name first."""
    from ..paths import state_dir, write_private

    text = f"{host_id(host, port)} {' '.join(line.split()[:2])}\n"
    f = state_dir() / "pins" / (hashlib.sha256(text.encode()).hexdigest()[:24] + ".known_hosts")
    if not (f.is_file() and f.read_text() == text):
        f.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(f, text)
    return f
