"""One SSH connection per command (Fabric/Paramiko), reused for all of its steps.

- host keys checked (remote/hostkeys.py), key files must exist and be private;
- connect timeout, keepalive, and a time limit on every remote command;
- transient connect failures retried with backoff (tenacity); authentication and host-key failures are not.
"""
from __future__ import annotations

import os
import select
import shlex
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import AuthError, ConnectError, HostKeyError, RemoteError
from ..paths import known_hosts_file, user_known_hosts_file
from . import hostkeys

KEEPALIVE_S = 15
# OpenSSH's sshd sends a command's exit status when the command exits, and may send output still in the pipe after it
# (session.c: "we must not call chan_read_failed, since there could be some more data waiting in the pipe"): a
# command's output is complete at the channel's EOF. A background process that keeps the output open never lets EOF
# come: then the output counts as complete this long after the exit status (3 s, not 1: on a
# loaded machine sshd may forward the pipe's last bytes more than a second after the status, and a log's state line
# was lost so: 'run ... not found' on its own instance, and the instance kept).
EOF_GRACE_S = 3.0
DEFAULT_COMMAND_TIMEOUT = 120.0
BULK_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                "aes128-ctr", "aes192-ctr", "aes256-ctr")


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    elapsed: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


def check_key_file(key: Path | None) -> None:
    """Refuse a missing key or one readable by group/others, as OpenSSH does."""
    if key is None:
        return
    if not key.exists():
        raise AuthError(f"key file not found: {key}", hint="set 'key:' in the profile to your private key's path")
    if not key.is_file():
        raise AuthError(f"key file is not a file: {key}")
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        raise AuthError(
            f"key file {key} is readable by others (mode {mode:04o}); OpenSSH and gpuops refuse such keys",
            hint=f"chmod 600 {shlex.quote(str(key))}",
        )
    if not os.access(key, os.R_OK):
        raise AuthError(f"key file {key} is not readable by you")


DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # tried, in this order, when neither the profile nor
# ~/.ssh/config names a key (as `ssh` does, with the SSH agent first)


@dataclass
class Target:
    """Where and as whom to connect, as `ssh` would: the profile's own values first, then ~/.ssh/config's for the
    profile's host (HostName, User, Port, IdentityFile), then the defaults (user ubuntu, port 22; the SSH agent and
    ~/.ssh/id_ed25519, id_ecdsa, id_rsa)."""
    host: str
    port: int
    user: str
    keys: list  # private key files to offer, in order
    agent: bool  # also offer the SSH agent's keys
    explicit_key: bool  # the key came from the profile or ~/.ssh/config: it must exist and be private


def _ssh_config(host: str) -> dict:
    f = Path.home() / ".ssh" / "config"
    if not f.is_file():
        return {}
    import paramiko

    try:
        cfg = paramiko.SSHConfig.from_path(str(f))
        found = cfg.lookup(host)
    except Exception as exc:  # a broken ~/.ssh/config is one clear message, as ssh gives
        from ..errors import ProfileError

        raise ProfileError(f"{f}: cannot read it for host {host}: {exc}") from exc
    return found


def target(profile) -> Target:
    given = getattr(profile, "model_fields_set", set())
    cfg = _ssh_config(profile.host)
    host = cfg.get("hostname") or profile.host
    user = profile.user if "user" in given or "user" not in cfg else cfg["user"]
    port = profile.port
    if "port" not in given and cfg.get("port"):
        try:
            port = int(cfg["port"])
        except ValueError:
            pass
    if profile.key:
        return Target(host, port, user, [Path(profile.key)], agent=False, explicit_key=True)
    named = [Path(os.path.expanduser(k)) for k in cfg.get("identityfile") or []]
    named = [k for k in named if k.exists()] or named[:1]
    if named:
        return Target(host, port, user, named, agent=cfg.get("identitiesonly", "no").lower() != "yes",
                      explicit_key=True)
    ssh_dir = Path.home() / ".ssh"
    keys = [ssh_dir / n for n in DEFAULT_KEYS if (ssh_dir / n).is_file() and _private(ssh_dir / n)]
    return Target(host, port, user, keys, agent=True, explicit_key=False)


def _loose_default_keys() -> list[Path]:
    """~/.ssh/id_* files that exist but are readable by others: never offered (OpenSSH skips them too)."""
    ssh_dir = Path.home() / ".ssh"
    return [ssh_dir / n for n in DEFAULT_KEYS if (ssh_dir / n).is_file() and not _private(ssh_dir / n)]


def _private(key: Path) -> bool:
    try:
        return not stat.S_IMODE(key.stat().st_mode) & 0o077 and os.access(key, os.R_OK)
    except OSError:
        return False


def _checked(res: Result) -> Result:
    if not res.ok:
        detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        raise RemoteError(f"remote command failed (exit {res.rc}): {detail[0]}")
    return res


def output_complete(chan, seen: dict, *, stderr: bool = True, got: bool = False) -> bool:
    """A command's output is all here: nothing buffered, and the channel's EOF (or close) came, or its exit status
    came and then EOF_GRACE_S passed with neither EOF nor a byte. `seen` keeps when that silence began (one dict a
    channel); got: the caller has just read bytes (the silence starts again: under load sshd may forward the exit
    status first and the pipe's last bytes seconds later, and a grace counted from the exit status alone dropped a
    run's state line: `run X not found` on its own instance, in a fresh-clone CI run).
    The end is read before the buffers: paramiko's transport thread buffers a channel's data before it takes its
    EOF, so once EOF was seen, empty buffers are final; read the other way round, the output and the EOF could both
    arrive between the two looks, and the output be dropped (a whole `gpuops logs` answer was lost that way)."""
    ended = chan.eof_received or chan.closed
    status = chan.exit_status_ready()
    if got:
        seen.pop("exit_at", None)
    if chan.recv_ready() or (stderr and chan.recv_stderr_ready()):
        seen.pop("exit_at", None)
        return False
    if ended:
        return True
    if status:
        first = seen.setdefault("exit_at", time.monotonic())
        return time.monotonic() - first >= EOF_GRACE_S
    return False


def _timed_out(host: str, timeout: float) -> RemoteError:
    return RemoteError(f"remote command timed out after {timeout:g}s on {host}",
                       hint="the host may be overloaded or a filesystem hung; try again or raise the limit")


class Remote:
    """A live connection: run commands (each with a time limit) and open streams."""

    shared_with_rsync = False  # rsync (ssh_argv) makes its own connection

    def __init__(self, profile, conn):
        self.profile = profile
        self.conn = conn
        self.transport = conn.client.get_transport()
        self.exec_count = 0  # remote executions on this connection, for benchmarks and tests

    # -- one command, with input, output and a deadline ---------------------------------
    def run(self, command: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT, stdin: bytes | str | None = None,
            check: bool = False) -> Result:
        started = time.monotonic()
        chan = self._open(command)
        try:
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            out, err, seen = bytearray(), bytearray(), {}
            deadline = started + timeout
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    got = True
                if output_complete(chan, seen, got=got):
                    break
                if time.monotonic() > deadline:
                    raise _timed_out(self.profile.host, timeout)
                if not got:  # the channel wakes select on data, EOF and close; the time out only paces the checks
                    # of the deadline, the transport and an exit status whose channel stays open: 50 ms at first, at
                    # most 0.5 s in a long command (64 hosts' probes polled 20 times a second cost a third of gpuops'
                    # CPU in a fleet verify: benchmarks/bench_fleet.py)
                    select.select([chan], [], [], min(0.5, max(0.05, (time.monotonic() - started) / 4)))
                if not self.transport.is_active():
                    raise ConnectError(f"connection to {self.profile.host} was lost")
            rc = chan.recv_exit_status()
            if rc == -1:  # paramiko's "no exit status": the connection died, or a signal killed the command
                if not self.transport.is_active():
                    raise ConnectError(f"connection to {self.profile.host} was lost during a remote command")
                raise RemoteError(f"remote command on {self.profile.host} ended without an exit status "
                                  "(killed by a signal?)")
        except socket.error as exc:
            raise ConnectError(f"connection to {self.profile.host} was lost: {exc}") from exc
        finally:
            chan.close()
        res = Result(rc if rc is not None else -1, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                     time.monotonic() - started)
        return _checked(res) if check else res

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client command (for rsync -e) that reaches this connection's host: a connection of its own."""
        return ssh_command(self.profile)

    def stream(self, command: str):
        """Start a long-lived command and return its paramiko channel (caller reads and closes)."""
        chan = self._open(command)
        return chan

    def iter_lines(self, chan, *, idle_timeout: float | None = None) -> Iterator[str]:
        """Lines of a stream's stdout as they arrive; ends when the command ends."""
        buf = bytearray()
        last = time.monotonic()
        seen: dict = {}
        while True:
            r, _, _ = select.select([chan], [], [], 0.2)
            if chan.recv_ready():
                data = chan.recv(1 << 16)
                last = time.monotonic()
                seen.pop("exit_at", None)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, _, rest = buf.partition(b"\n")
                    buf = bytearray(rest)
                    yield line.decode("utf-8", "replace")
            elif output_complete(chan, seen, stderr=False):
                break
            elif chan.exit_status_ready():
                continue  # its last output may still come (EOF_GRACE_S)
            elif not self.transport.is_active():
                raise ConnectError(f"connection to {self.profile.host} was lost")
            elif idle_timeout and time.monotonic() - last > idle_timeout:
                raise ConnectError(f"no data from {self.profile.host} for {idle_timeout:g}s")
        if buf:
            yield buf.decode("utf-8", "replace")

    def _open(self, command: str):
        if not self.transport or not self.transport.is_active():
            raise ConnectError(f"connection to {self.profile.host} was lost")
        try:
            chan = self.transport.open_session(timeout=self.profile.connect_timeout)
            chan.exec_command(command)
        except Exception as exc:  # paramiko.SSHException, EOFError, socket errors
            raise ConnectError(f"connection to {self.profile.host} was lost while starting a command: {exc}") from exc
        self.exec_count += 1
        return LiveChannel(chan, self.profile.host)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LiveChannel:
    """A command's paramiko channel whose reads and writes say a lost connection as ConnectError. Paramiko says it
    otherwise in its own ways, at any read: `recv` acknowledges what it consumed (a window adjust) once a fifth of
    the window is read, and that write on a socket the peer has closed, before the transport's thread has noticed
    the close, raises a bare EOFError. Escaping a command, click took that EOFError for Ctrl-C: a watch whose
    connection dropped while a 300 kB log line was read said "interrupted" (exit 130) instead of reconnecting (a
    fresh-clone CI run). Everything else is the channel's own (select() takes it through fileno())."""

    __slots__ = ("_chan", "_host")

    def __init__(self, chan, host: str) -> None:
        self._chan = chan
        self._host = host

    def __getattr__(self, name: str):
        return getattr(self._chan, name)

    def fileno(self) -> int:
        return self._chan.fileno()

    def _said(self, call, *args):
        try:
            return call(*args)
        except (EOFError, OSError) as exc:
            raise ConnectError(f"connection to {self._host} was lost: {str(exc) or type(exc).__name__}") from exc

    def recv(self, nbytes: int) -> bytes:
        return self._said(self._chan.recv, nbytes)

    def recv_stderr(self, nbytes: int) -> bytes:
        return self._said(self._chan.recv_stderr, nbytes)

    def sendall(self, data: bytes) -> None:
        self._said(self._chan.sendall, data)

    def shutdown_write(self) -> None:
        self._said(self._chan.shutdown_write)

    def close(self) -> None:
        """Closing a channel of a connection that is gone has nothing left to do (paramiko's close message would
        raise the same EOFError, and in a `finally` hide what went wrong)."""
        try:
            self._chan.close()
        except (EOFError, OSError):
            pass


_KNOWN: dict = {}


def _known_hosts():
    """The known host keys (hostkeys.load_known), read again only when a known_hosts file changed: a fleet's
    connections share one reading instead of each parsing every host's entry (N connections x N entries). Paramiko
    only reads this object (a key trusted on first use goes to the client's own host keys and to the file)."""
    def stamp(f: Path):
        try:
            st = f.stat()
        except OSError:
            return None
        return f, st.st_ino, st.st_size, st.st_mtime_ns

    key = (known_hosts_file(), user_known_hosts_file())
    key = key + tuple(stamp(f) for f in key)
    hit = _KNOWN.get("last")
    if hit is None or hit[0] != key:
        hit = _KNOWN["last"] = (key, hostkeys.load_known())
    return hit[1]


class LostDuringAuth(EOFError):
    """The connection ended while the host was judging the key (paramiko says "Authentication failed: transport shut
    down or saw EOF"): a lost connection, not a refusal."""


def _lost_during_auth(conn, exc: BaseException) -> bool:
    """Did paramiko's AuthenticationException come from the connection ending rather than the host's answer? A host
    that refuses a key answers and keeps the connection open; a cut leaves the transport dead."""
    if "transport shut down or saw EOF" in str(exc):
        return True
    transport = getattr(getattr(conn, "client", None), "get_transport", lambda: None)()
    return transport is not None and not transport.is_active()


def _transient(exc: BaseException) -> bool:
    import paramiko

    if isinstance(exc, (HostKeyError, AuthError)):
        return False
    if isinstance(exc, (paramiko.BadHostKeyException, paramiko.AuthenticationException)):
        return False
    return isinstance(exc, (socket.timeout, TimeoutError, ConnectionError, EOFError, OSError,
                            paramiko.ssh_exception.NoValidConnectionsError, paramiko.SSHException))


def _preflight(profile) -> Target:
    """What is refused before any connection: a profile whose instance is gone, a missing or loose key file, no key
    at all. Returns where and as whom to connect."""
    cloud = getattr(profile, "cloud", None)
    if cloud is not None and cloud.state == "gone":  # its IP may be another machine's now: never offer to trust it
        raise ConnectError(f"profile '{profile.name}' is marked gone: its instance was terminated, and {profile.host} "
                           "may belong to another machine now", hint=f"gpuops up {profile.name} launches a new one")
    tg = target(profile)
    if tg.explicit_key:
        for k in tg.keys:
            check_key_file(k)
    elif not tg.keys and not os.environ.get("SSH_AUTH_SOCK"):
        for k in _loose_default_keys():
            check_key_file(k)  # refused as OpenSSH does: readable by others, with the chmod that fixes it
        raise AuthError(f"no SSH key for {profile.host}: the profile names none, ~/.ssh/config has no IdentityFile "
                        "for it, no ~/.ssh/id_ed25519, id_ecdsa or id_rsa exists and no SSH agent runs",
                        hint="set 'key:' in the profile to your private key's path")
    return tg


def connect(profile, *, announce=print, attempts: int = 3, tried: int = 0) -> Remote:
    """Open the profile's connection, checking key file and host key; retries transient failures (`tried`: the
    attempts already made another way, for the hint's count: SharedSsh's own ssh)."""
    tg = _preflight(profile)
    import paramiko
    from fabric import Config, Connection
    from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    kwargs = {"look_for_keys": False, "allow_agent": tg.agent, "banner_timeout": profile.connect_timeout,
              "auth_timeout": profile.connect_timeout}
    if tg.keys:
        kwargs["key_filename"] = [str(k) for k in tg.keys]
    offered = ", ".join(str(k) for k in tg.keys) + (" and the SSH agent's keys" if tg.agent else "")
    if not tg.explicit_key and _loose_default_keys():
        offered += " (not " + ", ".join(f"{k}: readable by others, chmod 600 it" for k in _loose_default_keys()) + ")"

    def attempt() -> Remote:
        conn = Connection(
            host=tg.host,
            user=tg.user,
            port=tg.port,
            connect_timeout=int(max(1, profile.connect_timeout)),
            config=Config(ssh_config=paramiko.SSHConfig()),  # resolved above (target), as ssh would
            connect_kwargs=dict(kwargs),
        )
        client = conn.client
        if profile.host_key:  # pinned at its launch: judged by that key alone (hostkeys.pinned)
            client._system_host_keys = hostkeys.pinned(tg.host, tg.port, profile.host_key)
            client.set_missing_host_key_policy(hostkeys.pinned_policy(profile.name))
        else:
            client._system_host_keys = _known_hosts()  # checked first by paramiko; merged, gpuops' file wins
            client.set_missing_host_key_policy(hostkeys.make_policy(profile.name, profile.host_key_policy, announce))
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            conn.close()
            if profile.host_key:
                raise hostkeys.pinned_error(profile.name, tg.host, tg.port, exc) from exc
            raise hostkeys.changed_key_error(profile.name, tg.host, tg.port, exc) from exc
        except paramiko.AuthenticationException as exc:
            lost = _lost_during_auth(conn, exc)
            conn.close()
            if lost:  # neither accepted nor refused: transient (retried), said as a lost connection
                raise LostDuringAuth("the connection was lost during authentication, before the host accepted or "
                                     "refused the key") from exc
            raise AuthError(
                f"{tg.user}@{tg.host} refused authentication with {offered or 'no key'}: {exc}",
                hint="check 'user:' and 'key:' in the profile (Lambda instances use user 'ubuntu')",
            ) from exc
        except (HostKeyError, AuthError):
            conn.close()
            raise
        except paramiko.PasswordRequiredException as exc:
            conn.close()
            raise AuthError(f"key file {offered} is encrypted; gpuops needs a key without passphrase or ssh-agent") from exc
        except Exception:
            conn.close()
            raise
        conn.transport.set_keepalive(KEEPALIVE_S)
        return Remote(profile, conn)

    try:
        for att in Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.5, max=4),
            retry=retry_if_exception(_transient),
            reraise=True,
        ):
            with att:
                return attempt()
    except (HostKeyError, AuthError):
        raise
    except RetryError as exc:  # pragma: no cover - reraise=True makes this rare
        raise ConnectError(f"cannot connect to {profile.host}:{profile.port}") from exc
    except Exception as exc:
        from ..errors import command

        n = attempts + tried
        raise ConnectError(f"cannot connect to {tg.user}@{tg.host}:{tg.port}: {_describe(exc)}",
                           hint=f"is the instance running and the address right? (`{command()}` tried "
                                + ("once)" if n == 1 else f"{n} times)")) from exc
    raise ConnectError(f"cannot connect to {profile.host}:{profile.port}")


def _describe(exc: BaseException) -> str:
    import paramiko

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errs = {e.strerror or str(e) for e in exc.errors.values()}
        return "; ".join(sorted(errs)) or "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    text = str(exc) or type(exc).__name__
    banner = "Error reading SSH protocol banner"
    if text.startswith(banner) and len(text) > len(banner):  # paramiko glues its cause on: "...banner[Errno 104] ..."
        return f"{banner}: {text[len(banner):].strip()}"
    return text


def ssh_command(profile) -> list[str]:
    """The OpenSSH client command for the profile, for rsync -e: same key, gpuops' known_hosts, strict checking."""
    tg = target(profile)
    files = [str(known_hosts_file())]
    if user_known_hosts_file().is_file():
        files.append(str(user_known_hosts_file()))
    if profile.host_key:  # pinned at its launch: that key alone (hostkeys.pin_file)
        from . import hostkeys

        files = [str(hostkeys.pin_file(tg.host, tg.port, profile.host_key))]
    argv = [
        "ssh",
        "-F", "none",  # no config file: resolved by target() exactly as for gpuops' own connection (ssh would read the
        # passwd entry's ~/.ssh/config, not $HOME's)
        "-o", f"HostName={tg.host}",
        "-p", str(tg.port),
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UserKnownHostsFile=" + " ".join(files),
        "-o", f"ConnectTimeout={int(max(1, profile.connect_timeout))}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
        # OpenSSH's default order with AES-GCM first: AES-NI makes it ~2x cheaper per byte than chacha20-poly1305,
        # which matters for bulk checkpoint transfers (see benchmarks/bench_transfer.py)
        "-o", "Ciphers=" + ",".join(BULK_CIPHERS),
        "-l", tg.user,
    ]
    for k in tg.keys:
        argv += ["-i", str(k)]
    argv += ["-o", "IdentitiesOnly=" + ("no" if tg.agent else "yes")]
    return argv


MASTER_IDLE_S = 60  # a master connection left behind (gpuops killed) ends after this long without a client
_SSH_FAILED = ("ssh: ", "Connection closed", "Connection reset", "Connection to ", "Host key verification failed",
               "Permission denied (publickey", "Control socket", "mux_client", "kex_exchange_identification")


class SharedSsh:
    """One OpenSSH connection for a whole command (`gpuops sync`): a master connection (ControlMaster) that every ssh
    the command starts goes through, its remote executions (`run`) and rsync (`ssh_argv()` for rsync -e), so the
    command pays for one handshake. The control socket lives in a folder of its own (0700, made for the command) and
    goes with the master at the end (`close`: ssh -O exit, the folder removed); a master left behind by a killed
    gpuops ends after MASTER_IDLE_S without a client. Host keys as ssh_command checks them: gpuops' known_hosts,
    StrictHostKeyChecking=yes.
    When ssh cannot open the master, connect() (Paramiko) judges: a new host key is trusted as the profile's policy
    says, then the master is opened again; any refusal is the message and exit code every other command gives."""

    shared_with_rsync = True  # rsync through ssh_argv() rides on this very connection

    def __init__(self, profile, *, announce=print, lazy: bool = False):
        self.profile = profile
        self.announce = announce
        self.exec_count = 0  # remote executions of gpuops' own (rsync's session is not one)
        self.folder: Path | None = None
        # lazy: no master until one is asked for (open_master): a command of one ssh (a plain sync: rsync's own
        # session carries the checks) connects directly, as plain rsync does, and pays no master's start and exit.
        # Its first failure to connect opens the master, whose connect() judges (host key policy, refusals).
        self.lazy = lazy

    def _ssh(self) -> list[str]:
        assert self.folder is not None, "SharedSsh.open() first"
        return ssh_command(self.profile) + ["-o", f"ControlPath={self.folder / 'm'}"]

    def ssh_argv(self) -> list[str]:
        """ssh through the master; should the master be gone (its connection cut), ssh connects on its own."""
        return self._ssh() + ["-o", "ControlMaster=no"]

    def open(self) -> "SharedSsh":
        import tempfile

        _preflight(self.profile)
        self.folder = Path(tempfile.mkdtemp(prefix="gpuops-ssh-"))  # made 0700, a short path (a socket's limit)
        os.chmod(self.folder, 0o700)
        if not self.lazy:
            self.open_master()
        return self

    @property
    def has_master(self) -> bool:
        return self.folder is not None and (self.folder / "m").exists()

    def open_master(self) -> None:
        """Start the master (a lazy connection's first failure asks for it: connect() then judges why)."""
        self.lazy = False
        try:
            failed = self._start()
            if failed:
                connect(self.profile, announce=self.announce, attempts=2, tried=1).close()  # the master was the first attempt
                failed = self._start()  # a host key just trusted, or a passing failure
            if failed:
                tg = target(self.profile)
                raise ConnectError(f"ssh could not connect to {tg.user}@{tg.host}:{tg.port}: {failed}")
        except BaseException:
            self.close()
            raise

    def _start(self) -> str | None:
        """Open the master (ssh -M -N -f returns once authenticated); None, or why it failed."""
        import subprocess

        argv = self._ssh() + ["-o", "ControlMaster=yes", "-o", f"ControlPersist={MASTER_IDLE_S}", "-N", "-f",
                              self.profile.host]
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=2 * self.profile.connect_timeout + 10)
        except FileNotFoundError:
            return "the OpenSSH client (ssh) is not installed on this machine"
        except subprocess.TimeoutExpired:
            return "timed out"
        if p.returncode == 0:
            return None
        lines = [ln.strip() for ln in p.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else f"ssh exit {p.returncode}"

    def run(self, command: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT, stdin: bytes | str | None = None,
            check: bool = False) -> Result:
        """As Remote.run: one remote command through the master, with input, output and a time limit."""
        import subprocess

        if self.lazy:  # an execution of gpuops' own: through the master, judged as every connection is
            self.open_master()
        started = time.monotonic()
        self.exec_count += 1
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        try:
            p = subprocess.run(self.ssh_argv() + [self.profile.host, command], input=data, capture_output=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise _timed_out(self.profile.host, timeout) from None
        out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
        lost = [ln for ln in err.splitlines() if ln.startswith(_SSH_FAILED) or "Permission denied (publickey" in ln]
        if p.returncode == 255 and lost:  # ssh's own failure, not the command's exit 255
            raise ConnectError(f"connection to {self.profile.host} was lost: {lost[-1].strip()}")
        res = Result(p.returncode, out, err, time.monotonic() - started)
        return _checked(res) if check else res

    def close(self) -> None:
        import shutil
        import subprocess

        if self.folder is None:
            return
        if (self.folder / "m").exists():
            try:
                subprocess.run(self._ssh() + ["-O", "exit", self.profile.host], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass  # the master ends by itself after MASTER_IDLE_S
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> "SharedSsh":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shared(profile, *, announce=print, lazy: bool = False) -> SharedSsh:
    """The command's one OpenSSH connection, open (see SharedSsh; lazy: its master only once asked for); use it as a
    context manager."""
    return SharedSsh(profile, announce=announce, lazy=lazy).open()
