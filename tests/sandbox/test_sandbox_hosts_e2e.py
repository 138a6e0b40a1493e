"""Several sandbox hosts at once (gpuops.sandbox.host.start/stop): each on its own free 127.0.0.N:22 with its own host
key, authorized keys, emulated GPUs and profile; gpuops connects to each through its profile (host key checked)."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.fixture
def hosts(starts_hosts, tmp_path):
    from gpuops.sandbox import host

    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        host.stop(d)


def test_three_hosts_own_address_key_gpu_and_profile(hosts, tmp_path, gpuops):
    from gpuops.profiles.model import resolve
    from gpuops.remote.connection import connect
    from gpuops.sandbox import host

    hk = _keygen(tmp_path / "given_host_key")
    client = _keygen(tmp_path / "client")
    models = [("a100", 8), ("h100-sxm", 2), ("h100-pcie", 1)]
    t = time.monotonic()
    states = []
    for i, (gpu, n) in enumerate(models):
        d = tmp_path / f"h{i}"
        hosts.append(d)
        states.append(host.start(d, address=host.AUTO, gpu=gpu, gpus=n, profile=f"node{i}",
                                 host_key=hk.read_text() if i == 0 else None,
                                 authorized_keys=[client.with_suffix(".pub").read_text()] if i == 1 else None))
    elapsed = time.monotonic() - t
    addresses = [s["address"] for s in states]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.") and a != "127.0.0.1" for a in addresses)
    assert all(s["port"] == 22 for s in states) and elapsed < 10
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", addresses[0]], capture_output=True, text=True).stdout
    assert scan.split()[-1] == hk.with_suffix(".pub").read_text().split()[1]
    assert states[1]["client_key"] is None and states[0]["client_key"]
    # host 1 takes only the given key: its profile is pointed at it
    for i, (gpu, n) in enumerate(models):
        prof = resolve(f"node{i}")
        assert prof.host == addresses[i] and prof.port == 22
        if i == 1:
            prof = prof.model_copy(update={"key": client})
        with connect(prof, announce=lambda *a: None) as remote:
            r = remote.run("nvidia-smi -L | wc -l")
            assert r.ok and r.stdout.strip() == str(n), (i, r)
    # idempotent: a second start keeps the running sshd and its address
    again = host.start(Path(states[2]["dir"]), address=host.AUTO, gpu="a100", gpus=4)
    assert again["started"] is False and again["address"] == addresses[2]
    assert host.stop(Path(states[0]["dir"]))
    with pytest.raises(OSError):
        socket.create_connection((addresses[0], 22), timeout=1).close()


def test_sandbox_fixture_host_unchanged(sandbox, gpuops):
    """The default sandbox (127.0.0.1, random port, profile `sandbox`) is the same host as before the refactor."""
    from gpuops.sandbox import host

    st = host.status()
    assert st["running"] and st["address"] == "127.0.0.1" and st["port"] == sandbox["port"]
    r = gpuops("sandbox", "status")
    assert r.code == 0 and f"127.0.0.1:{sandbox['port']}" in r.out


def test_a_session_reads_the_hosts_own_home_not_this_machines(sandbox):
    """sshd starts each session with the user's login shell, which (bash, started by sshd) reads ~/.bashrc before
    anything else. It used to be this machine's (root's pyenv init, whose rehash lock, left by a killed session,
    made every later session wait 60 s and time out); it is the sandbox host's home, as on an instance."""
    home = sandbox["dir"] / "home"
    rc = home / ".bashrc"
    rc.write_text('echo "$HOME" > "$HOME/bashrc-ran"\n')
    try:
        r = subprocess.run(["ssh", "-p", str(sandbox["port"]), "-i", str(sandbox["dir"] / "client_ed25519"),
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                            f"{sandbox['user']}@127.0.0.1", "echo $HOME"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == str(home), r
        if Path("/bin/bash").samefile(_login_shell(sandbox["user"])):  # a bash login shell read the host's .bashrc
            assert (home / "bashrc-ran").read_text().strip() == str(home)
    finally:
        rc.unlink()
        (home / "bashrc-ran").unlink(missing_ok=True)


def _login_shell(user: str) -> str:
    import pwd

    return pwd.getpwnam(user).pw_shell


def test_an_address_another_host_takes_before_sshd_binds_is_never_reported_as_ours(hosts, tmp_path, monkeypatch):
    """Parallel runs (pytest-xdist workers, two emulators) probe 127.0.0.N as free, then start sshd, which binds only
    after it has daemonised: when another host took that address meanwhile, ours exits and the other one answers
    there. The host must move to the next address, not report the other host's (whose key is not the one pinned:
    'host key ... has CHANGED' on the first connection, as seen under xdist)."""
    from gpuops.sandbox import host

    first = tmp_path / "first"
    hosts.append(first)
    a = host.start(first, address=host.AUTO, profile=None)
    taken = a["address"]
    # several free addresses after it: other xdist workers start hosts meanwhile and may take the first of them
    free = [c for c in host._loopback_candidates() if c != taken and host._bindable(c, 22)][:10]
    # the race, made certain: the probe says the taken address is free, and it is tried first
    monkeypatch.setattr(host, "_loopback_candidates", lambda: [taken, *free])
    monkeypatch.setattr(host, "_bindable", lambda address, port: True)
    second = tmp_path / "second"
    hosts.append(second)
    b = host.start(second, address=host.AUTO, profile=None)
    assert b["address"] != taken and b["address"] in free, (b, taken)
    assert host.sshd_pid(second) and host.sshd_pid(first)
    keys = {d: (d / "host_ed25519_key.pub").read_text().split()[1] for d in (first, second)}
    scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", "22", b["address"]], capture_output=True,
                             text=True, timeout=20).stdout.split()
    assert keys[second] in scanned and keys[first] not in scanned  # the address answers with the second's own key
