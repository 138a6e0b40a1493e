"""Run rsync (an argument list, never a shell string) with live progress, and retry transient failures.

A retry re-runs the same command: rsync's --partial-dir keeps what already arrived, so it continues rather than
starting over. Host-key and authentication failures are never retried.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import plan as tr
from ..errors import AuthError, ConnectError, GpuopsError, HostKeyError

ATTEMPTS = int(os.environ.get("GPUOPS_RSYNC_ATTEMPTS", "6"))


@dataclass
class RsyncResult:
    rc: int
    stats: dict
    changes: list
    stderr: str
    seconds: float
    attempts: int = 1
    items: list = field(default_factory=list)  # every itemized line's Change (all attempts)


class GuardStop(Exception):
    """The checks on rsync's remote side (transfer.plan.sync_guard) stopped it before it started: `kind` (mkdir,
    room), the value they gave (room: the free KiB) and what the host said before."""

    def __init__(self, kind: str, value: str, said: str):
        super().__init__(f"stopped on the host before rsync started: {kind}")
        self.kind, self.value, self.said = kind, value, said


class Transient(Exception):
    def __init__(self, rc: int, stderr: str):
        super().__init__(f"rsync exit {rc}")
        self.rc = rc
        self.stderr = stderr


_FOUND: dict = {}


def require_local_rsync() -> str:
    """rsync's path on this machine, or a GpuopsError (exit 1) naming the command that installs it here. Its version
    is asked once per process and rsync found (a command asks before connecting and again before each rsync)."""
    path = shutil.which("rsync")
    if path and _FOUND.get(path) == _stamp(path):
        return path
    if not path:
        managers = [m for m, _ in tr.INSTALL_COMMANDS if shutil.which(m) or os.path.exists(f"/usr/bin/{m}")]
        raise GpuopsError("rsync is not installed on this machine; sync and fetch need it on both ends",
                          hint="install it: " + tr.install_command(sys.platform, managers))
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    version = tr.parse_rsync_version(text)
    if version is None or version < tr.MIN_RSYNC:
        managers = [m for m, _ in tr.INSTALL_COMMANDS if shutil.which(m) or os.path.exists(f"/usr/bin/{m}")]
        found = ".".join(map(str, version)) if version else (text.splitlines() or ["an unknown rsync"])[0].strip()
        raise GpuopsError(f"{path} is {found}; gpuops needs rsync >= {'.'.join(map(str, tr.MIN_RSYNC))} "
                          "(macOS ships 2.6.9 or openrsync)",
                          hint="install a current rsync: " + tr.install_command(sys.platform, managers))
    _FOUND[path] = _stamp(path)
    return path


def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def missing_remote(host: str) -> GpuopsError:
    """rsync is not on the remote's PATH (exit 1): the message names the command to run there."""
    return GpuopsError(f"rsync is not installed on {host}; sync and fetch need it on both ends",
                       hint=f"install it on {host}: {tr.REMOTE_INSTALL}")


def run_once(argv: Sequence[str], *, on_progress: Callable[[tr.Progress], None] | None = None,
             on_item: Callable[[tr.Change], None] | None = None) -> RsyncResult:
    """Run rsync once; stream progress and itemized changes to the callbacks."""
    started = time.monotonic()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    err_chunks: list[bytes] = []

    def drain() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read1(65536), b""):
            err_chunks.append(chunk)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    changes: list[tr.Change] = []
    text_lines: list[str] = []
    buf = b""
    assert proc.stdout is not None
    try:
        while True:
            chunk = proc.stdout.read1(65536)
            if not chunk:
                break
            buf += chunk
            while True:
                cut = min((i for i in (buf.find(b"\r"), buf.find(b"\n")) if i >= 0), default=-1)
                if cut < 0:
                    break
                raw, buf = buf[:cut], buf[cut + 1:]
                line = raw.decode("utf-8", "replace")
                if not line.strip():
                    continue
                if line.startswith(tr.OUT_PREFIX):
                    ch = tr.parse_item(line)
                    if ch is not None:
                        changes.append(ch)
                        if on_item:
                            on_item(ch)
                    continue
                p = tr.parse_progress(line)
                if p is not None:
                    if on_progress:
                        on_progress(p)
                    continue
                text_lines.append(line)
        if buf.strip():
            text_lines.append(buf.decode("utf-8", "replace"))
        rc = proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    t.join(timeout=5)
    stderr = b"".join(err_chunks).decode("utf-8", "replace")
    stats = tr.parse_stats("\n".join(text_lines))
    return RsyncResult(rc, stats, changes, stderr, time.monotonic() - started)


def run(argv: Sequence[str], *, host: str, on_progress=None, on_item=None, on_retry=None,
        attempts: int | None = None, reconnect: Callable[[], None] | None = None) -> RsyncResult:
    """Run rsync, retrying transient failures with backoff; raise a GpuopsError on anything else. reconnect: called
    once, at the first failure to connect (a transient one, a host key or authentication refused), before rsync runs
    again (sync's lazy connection opens its master there, whose connect() judges: it raises what it refuses)."""
    require_local_rsync()
    attempts = attempts or ATTEMPTS
    count = 0
    items: list = []
    pending = [reconnect] if reconnect is not None else []
    started = time.monotonic()

    def once() -> RsyncResult:
        nonlocal count
        count += 1
        res = run_once(argv, on_progress=on_progress, on_item=on_item)
        items.extend(res.changes)
        if res.rc in (0, 24):  # 24: some source files vanished while copying (a running job); not a failure
            return res
        stop = tr.guard_stop(res.stderr)
        if stop:
            raise GuardStop(*stop)  # never retried: the host answered
        kind = tr.classify_failure(res.rc, res.stderr)
        if pending and kind in ("transient", "hostkey", "auth"):
            pending.pop()()  # the master opens (or the refusal is raised, in connect()'s words)
            if kind != "transient":
                raise Transient(res.rc, res.stderr)  # a host key just trusted: again, through the master
        if kind == "transient":
            if on_retry and count < attempts:
                on_retry(count, res.rc, tr.last_error_line(res.stderr))
            raise Transient(res.rc, res.stderr)
        raise _error(kind, res, host)

    try:
        try:
            res = once()
        except Transient:  # the retries, with backoff (0.5 s, 1, 2, 4, 8 at most): tenacity only when one is due
            if attempts <= 1:
                raise
            from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

            time.sleep(0.5)
            for att in Retrying(stop=stop_after_attempt(attempts - 1), wait=wait_exponential(multiplier=1, min=0.5,
                                                                                             max=8),
                                retry=retry_if_exception_type(Transient), reraise=True):
                with att:
                    res = once()
    except Transient as exc:
        raise ConnectError(f"rsync to {host} kept failing (exit {exc.rc}) after {count} attempts: "
                           f"{tr.last_error_line(exc.stderr)}",
                           hint="run the command again: it continues from what already arrived") from None
    res.attempts = count
    res.items = items
    res.seconds = time.monotonic() - started
    return res


def _error(kind: str, res: RsyncResult, host: str) -> GpuopsError:
    detail = tr.last_error_line(res.stderr)
    if kind == "hostkey":
        return HostKeyError(f"ssh refused the host key of {host} (it is unknown or has changed): {detail}",
                            hint="if you expected a new key (a new instance on a recycled IP): gpuops trust PROFILE --reset")
    if kind == "auth":
        return AuthError(f"{host} refused authentication for rsync: {detail}",
                         hint="check 'user:' and 'key:' in the profile")
    if kind == "missing-remote":
        return missing_remote(host)
    return GpuopsError(f"rsync failed (exit {res.rc}): {detail or 'no message'}")
