"""A profile without `key:` connects as `ssh` would (#8.2): the SSH agent, ~/.ssh/id_ed25519 (id_ecdsa, id_rsa), and
~/.ssh/config's HostName, User, Port and IdentityFile for the profile's host; rsync uses the same key and host
(through the sandbox's real sshd, a real ssh-agent and real rsync)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from support import wait_for


def _profile(sandbox, name: str, drop=("key",), **over) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    for k in drop:
        data.pop(k, None)
    data.update(over)
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(data))


def _private_copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600)
    return dst


def _verify_and_sync(gpuops, name: str) -> None:
    (Path.cwd() / "train.py").write_text("print(1)\n")
    r = gpuops("verify", name, "--no-save", "--no-cuda-check")
    assert r.code == 0, r.all
    r = gpuops("sync", "-p", name)
    assert r.code == 0, r.all
    sandbox_home = Path(os.environ["GPUOPS_TEST_SANDBOX_HOME"])
    assert (sandbox_home / Path.cwd().name / "train.py").read_text() == "print(1)\n"  # rsync's ssh got there too


@pytest.fixture(autouse=True)
def no_agent(monkeypatch, sandbox):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("GPUOPS_TEST_SANDBOX_HOME", str(sandbox["dir"] / "home"))


def test_default_key_in_home_ssh(sandbox, gpuops):
    _private_copy(sandbox["dir"] / "client_ed25519", Path.home() / ".ssh" / "id_ed25519")
    _profile(sandbox, "nokey")
    _verify_and_sync(gpuops, "nokey")


def test_ssh_config_hostname_user_port_identityfile(sandbox, gpuops):
    key = _private_copy(sandbox["dir"] / "client_ed25519", Path.home() / "keys" / "box.key")
    st = yaml.safe_load(sandbox["profile"].read_text())
    cfg = Path.home() / ".ssh" / "config"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(f"Host mybox\n  HostName 127.0.0.1\n  Port {st['port']}\n  User {st['user']}\n"
                   f"  IdentityFile ~/keys/box.key\n")
    _profile(sandbox, "alias", drop=("key", "port", "user"), host="mybox")
    _verify_and_sync(gpuops, "alias")
    assert key.exists()


def test_ssh_agent(sandbox, gpuops, tmp_path, monkeypatch):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout=60, what="ssh-agent's socket")
        key = _private_copy(sandbox["dir"] / "client_ed25519", tmp_path / "agent-only.key")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(key)], check=True, capture_output=True)
        key.unlink()  # only the agent has it now
        _profile(sandbox, "agent")
        _verify_and_sync(gpuops, "agent")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(5)


def test_no_key_anywhere_is_one_clear_error(sandbox, gpuops):
    _profile(sandbox, "nothing")
    r = gpuops("verify", "nothing")
    assert r.code == 3 and "no SSH key" in r.err and "Traceback" not in r.err


def test_loose_default_key_is_not_offered_and_loose_identityfile_refused(sandbox, gpuops):
    k = _private_copy(sandbox["dir"] / "client_ed25519", Path.home() / ".ssh" / "id_ed25519")
    os.chmod(k, 0o644)
    _profile(sandbox, "loose")
    r = gpuops("verify", "loose")
    assert r.code == 3 and "readable by others" in r.err and "chmod 600" in r.err and str(k) in r.err, r.all
    cfg = Path.home() / ".ssh" / "config"
    cfg.write_text(f"Host 127.0.0.1\n  IdentityFile {k}\n")
    r = gpuops("verify", "loose")
    assert r.code == 3 and "readable by others" in r.err and "chmod 600" in r.err


def test_profile_values_win_over_ssh_config(sandbox, gpuops):
    """port:, user: and key: written in the profile beat ~/.ssh/config's Port, User and IdentityFile for that host."""
    cfg = Path.home() / ".ssh" / "config"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text("Host 127.0.0.1\n  Port 1\n  User nobody-here\n  IdentityFile ~/.ssh/does-not-exist\n")
    _profile(sandbox, "explicit", drop=())  # the sandbox profile names host, port, user and key
    _verify_and_sync(gpuops, "explicit")


def test_loose_default_key_is_skipped_when_the_agent_has_the_key(sandbox, gpuops, tmp_path, monkeypatch):
    loose = _private_copy(sandbox["dir"] / "client_ed25519", Path.home() / ".ssh" / "id_ed25519")
    os.chmod(loose, 0o644)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout=60, what="ssh-agent's socket")
        key = _private_copy(sandbox["dir"] / "client_ed25519", tmp_path / "agent-only.key")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(key)], check=True, capture_output=True)
        key.unlink()
        _profile(sandbox, "agent2")
        _verify_and_sync(gpuops, "agent2")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(5)
