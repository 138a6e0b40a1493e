"""The connection layer against the real sandbox sshd: commands, time limits, lost connections, OpenSSH interop."""
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gpuops.profiles import model as profiles
from gpuops.errors import ConnectError, RemoteError
from gpuops.remote.connection import connect, ssh_command

from support.proxy import Proxy


def test_run_stdin_exit_codes_and_streams(sandbox):
    p = profiles.resolve("sandbox")
    with connect(p, announce=lambda m: None) as r:
        res = r.run("cat; echo err >&2; exit 7", stdin=b"hello\n")
        assert (res.rc, res.stdout, res.stderr) == (7, "hello\n", "err\n")
        assert r.run("echo $HOME").stdout.strip().endswith("sandbox/home")
        assert r.exec_count == 2
        with pytest.raises(RemoteError, match="exit 3"):
            r.run("exit 3", check=True)
        with pytest.raises(RemoteError, match="without an exit status"):
            r.run("kill -9 $$")  # killed by a signal: sshd sends exit-signal, not exit-status


def test_output_sent_after_the_exit_status_is_kept(sandbox, monkeypatch):
    """sshd sends a command's exit status when it exits and may send output still in the pipe after it (here: a
    child that outlives the shell writes last): a command's output ends at the channel's EOF, not at its status.
    `gpuops logs` printed a log cut short this way under load. The grace is long here so the test never races."""
    from gpuops.remote import connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 30.0)
    p = profiles.resolve("sandbox")
    with connect(p, announce=lambda m: None) as r:
        res = r.run("(sleep 0.5; echo late; echo late-err >&2) & echo early")
        assert (res.rc, res.stdout, res.stderr) == (0, "early\nlate\n", "late-err\n")


def test_a_background_process_holding_the_output_does_not_hold_the_command(sandbox, monkeypatch):
    """No EOF ever comes while a process the command left keeps its output open: the output counts as complete
    EOF_GRACE_S after the exit status (never the background process's lifetime, nor a hang)."""
    from gpuops.remote import connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 0.5)
    p = profiles.resolve("sandbox")
    with connect(p, announce=lambda m: None) as r:
        t = time.monotonic()
        res = r.run("(sleep 20; echo never) & echo now", timeout=15)
        assert res.rc == 0 and res.stdout == "now\n"
        assert time.monotonic() - t < 10


def test_every_remote_command_has_a_time_limit(sandbox):
    p = profiles.resolve("sandbox")
    with connect(p, announce=lambda m: None) as r:
        t = time.monotonic()
        with pytest.raises(RemoteError, match="timed out after 1s"):
            r.run("sleep 30", timeout=1)
        assert time.monotonic() - t < 5
        assert r.run("echo still usable").ok  # the connection survives a timed-out command


def test_hostile_remote_paths_stay_literal(sandbox):
    p = profiles.resolve("sandbox")
    weird = "~/we ird;$(touch PWNED)`touch PWNED2`'q\""
    with connect(p, announce=lambda m: None) as r:
        res = r.run(f"mkdir -p {profiles.shell_path(weird)} && ls -a ~ && test ! -e PWNED && test ! -e PWNED2", check=True)
        assert "we ird;$(touch PWNED)`touch PWNED2`'q\"" in res.stdout


def test_cut_connection_is_a_connection_error(sandbox, tmp_path):
    proxy = Proxy(sandbox["port"])
    try:
        data = yaml.safe_load(sandbox["profile"].read_text())
        data["port"] = proxy.port
        f = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "viaproxy.yaml"
        f.write_text(yaml.safe_dump(data))
        p = profiles.resolve("viaproxy")
        r = connect(p, announce=lambda m: None)
        chan_started = time.monotonic()
        import threading

        threading.Timer(0.5, proxy.cut_all).start()
        with pytest.raises(ConnectError, match="lost"):
            r.run("sleep 20", timeout=30)
        assert time.monotonic() - chan_started < 10
        r.close()
    finally:
        proxy.close()


def test_openssh_reads_gpuops_known_hosts(sandbox):
    """The host key recorded by the Paramiko side is accepted by OpenSSH with StrictHostKeyChecking=yes (rsync's path)."""
    p = profiles.resolve("sandbox")
    connect(p, announce=lambda m: None).close()
    argv = ssh_command(p)
    assert "StrictHostKeyChecking=yes" in argv and not any("=no" in a or "/dev/null" in a for a in argv)
    out = subprocess.run(argv + [p.host, "echo ok-from-openssh"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok-from-openssh"


def test_openssh_refuses_unknown_host(sandbox):
    p = profiles.resolve("sandbox")  # no connect(): the key was never recorded in this test's known_hosts
    out = subprocess.run(ssh_command(p) + [p.host, "true"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 255 and "Host key verification failed" in out.stderr


def test_fabric_default_host_key_policy_is_replaced(sandbox):
    import paramiko

    p = profiles.resolve("sandbox")
    with connect(p, announce=lambda m: None) as r:
        policy = r.conn.client._policy
        assert not isinstance(policy, (paramiko.AutoAddPolicy, paramiko.WarningPolicy))


def test_known_hosts_are_read_once_while_unchanged_and_again_when_changed(sandbox, monkeypatch, tmp_path):
    """A fleet's connections share one reading of the known_hosts files (each used to parse every recorded host:
    N connections x N entries); a change to the file is seen by the next connection (a key replaced meanwhile is
    refused)."""
    from gpuops.errors import HostKeyError
    from gpuops.paths import known_hosts_file
    from gpuops.remote import hostkeys

    reads = []
    real = hostkeys.load_known
    monkeypatch.setattr(hostkeys, "load_known", lambda: reads.append(1) or real())
    p = profiles.resolve("sandbox")
    connect(p, announce=lambda m: None).close()  # records the key: the file changes
    before = len(reads)
    for _ in range(3):
        connect(p, announce=lambda m: None).close()
    assert len(reads) == before + 1  # read once for the three connections
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, b64 = key.with_suffix(".pub").read_text().split()[:2]
    known_hosts_file().write_text(f"[127.0.0.1]:{sandbox['port']} {kind} {b64}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        connect(p, announce=lambda m: None)


def test_a_read_on_a_connection_gone_half_way_is_a_lost_connection(sandbox):
    """paramiko acknowledges what a read consumed (a window adjust, once a fifth of the window is read); when the
    socket can no longer be written, that read raised a bare EOFError, and click took it for Ctrl-C: a watch
    reading a 300 kB log line when its connection dropped said "interrupted", exit 130, instead of reconnecting. Here
    the socket's sending side is shut while the peer (a proxy that holds the client's EOF) goes on sending, so the
    reader thread sees nothing and the read's own write is what fails: a ConnectError, every time."""
    import socket

    base = profiles.resolve("sandbox")
    proxy = Proxy(base.port, hold_on_eof=True)
    try:
        raw = yaml.safe_load(Path(base.source).read_text())
        raw["port"] = proxy.port
        path = Path(base.source).with_name("halfway.yaml")
        path.write_text(yaml.safe_dump(raw))
        with connect(profiles.resolve("halfway"), announce=lambda m: None) as r:
            chan = r.stream("head -c 1000000 /dev/zero; sleep 30")
            deadline = time.monotonic() + 30
            while not chan.recv_ready() and time.monotonic() < deadline:
                time.sleep(0.02)
            r.transport.sock.shutdown(socket.SHUT_WR)  # from here every write of this connection fails
            got = 0
            with pytest.raises(ConnectError, match="was lost"):
                while got < 1000000:  # the window adjust comes after about 200 kB: well inside
                    data = chan.recv(1 << 16)
                    assert data, "the stream ended before a read had to acknowledge"
                    got += len(data)
            assert 0 < got < 1000000
            with pytest.raises(ConnectError, match="was lost"):
                chan.sendall(b"more")
            chan.close()  # nothing left to close on a connection that is gone: no error in a `finally`
    finally:
        proxy.close()
