"""`gpuops sandbox`: a real OpenSSH sshd on 127.0.0.1, run as the current user, with its own host key,
its own client key, an isolated home and an emulated nvidia-smi on its PATH. It writes a ready profile
`sandbox` into the user profile directory.

Layout of the sandbox directory (~/.local/state/gpuops/sandbox):
  host_ed25519_key   sshd's host key        client_ed25519   the key gpuops logs in with
  authorized_keys    sshd_config            sshd.pid / sshd.log
  gpu.json           emulated GPU state     bin/nvidia-smi, bin/session (ForceCommand wrapper)
  home/              the remote user's $HOME (the session starts there)
"""
from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import GpuopsError, UsageError
from ..paths import config_dir, state_dir, write_atomic

GPU_MODELS = ("h100-pcie", "h100-sxm", "a100", "rtx6000ada")
FAIL_MODES = ("none", "driver-not-loaded", "version-mismatch", "no-devices", "gpu-lost", "hang")
PROFILE_NAME = "sandbox"


def sandbox_dir() -> Path:
    return Path(os.environ.get("GPUOPS_SANDBOX_DIR") or state_dir() / "sandbox")


def profile_path() -> Path:
    return config_dir() / "profiles" / f"{PROFILE_NAME}.yaml"


def find_sshd() -> str:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise GpuopsError("sshd (OpenSSH server) is not installed; the sandbox host needs it",
                      hint="sudo apt-get install -y openssh-server   (the daemon is not enabled; gpuops starts its own)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    os.chmod(path, 0o600)


def _pid(d: Path) -> int | None:
    try:
        pid = int((d / "sshd.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def read_state(d: Path | None = None) -> dict:
    d = d or sandbox_dir()
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def write_gpu_state(d: Path, *, gpu: str, gpus: int, driver: str, cuda: str, fail: str, header: str,
                    na_fields: list[str] | None = None) -> dict:
    if gpu not in GPU_MODELS:
        raise UsageError(f"unknown --gpu {gpu!r}; choose one of: {', '.join(GPU_MODELS)}")
    if fail not in FAIL_MODES:
        raise UsageError(f"unknown --fail {fail!r}; choose one of: {', '.join(FAIL_MODES)}")
    state = {"gpu": gpu, "count": gpus, "driver": driver, "cuda": cuda, "fail": None if fail == "none" else fail,
             "header": header, "na_fields": na_fields or []}
    write_atomic(d / "gpu.json", json.dumps(state, indent=1))
    return state


def up(*, gpu: str = "h100-pcie", gpus: int = 1, port: int | None = None, driver: str = "570.148.08",
       cuda: str = "12.8", fail: str = "none", header: str = "legacy", python: str | None = None,
       na_fields: list[str] | None = None, write_profile: bool = True) -> dict:
    """Start (or reconfigure) the sandbox host. Idempotent: a running sshd keeps running; GPU state is rewritten."""
    d = sandbox_dir()
    for sub in ("bin", "home"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    gpu_state = write_gpu_state(d, gpu=gpu, gpus=gpus, driver=driver, cuda=cuda, fail=fail, header=header,
                                na_fields=na_fields)
    _install_tools(d)
    state = read_state(d)
    pid = _pid(d)
    if pid and state.get("port") and (port is None or port == state["port"]) and _listening(state["port"]):
        state.update(gpu=gpu_state, started=False)
    else:
        if pid:
            down()
        sshd = find_sshd()
        _keygen(d / "host_ed25519_key", "gpuops-sandbox-host")
        _keygen(d / "client_ed25519", "gpuops-sandbox-client")
        shutil.copyfile(d / "client_ed25519.pub", d / "authorized_keys")
        os.chmod(d / "authorized_keys", 0o600)
        moved_from = None
        if port is None and state.get("port"):  # kept across restarts, so known_hosts and profiles stay valid
            if _port_free(state["port"]):
                port = state["port"]
            else:
                moved_from = state["port"]
        port = port or _free_port()
        user = getpass.getuser()
        config = f"""# written by gpuops sandbox up
Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_ed25519_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
AllowUsers {user}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
AcceptEnv NONE
ClientAliveInterval 15
MaxSessions 64
MaxStartups 64:30:128
ForceCommand {d / 'bin' / 'session'}
Subsystem sftp internal-sftp
"""
        write_atomic(d / "sshd_config", config)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        proc = subprocess.run([sshd, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise GpuopsError(f"sshd did not start: {proc.stdout.strip() or 'exit ' + str(proc.returncode)}",
                              hint=f"see {d / 'sshd.log'}")
        deadline = time.monotonic() + 10
        while not _listening(port):
            if time.monotonic() > deadline:
                log = (d / "sshd.log").read_text()[-500:] if (d / "sshd.log").exists() else ""
                raise GpuopsError(f"sshd did not start listening on 127.0.0.1:{port}. {log}")
            time.sleep(0.05)
        state = {"port": port, "user": user, "started": True, "port_moved_from": moved_from}
    state.update(gpu=gpu_state, dir=str(d), python=python or "python3")  # every `up` states the whole host
    write_atomic(d / "state.json", json.dumps({k: v for k, v in state.items() if k not in ("started", "port_moved_from")},
                                              indent=1))
    if write_profile:
        _write_profile(d, state)
    return state


def _install_tools(d: Path) -> None:
    smi = d / "bin" / "nvidia-smi"
    src = (Path(__file__).parent / "nvidia_smi.py").read_text()
    write_atomic(smi, f"#!{sys.executable}\n" + src.split("\n", 1)[1])
    os.chmod(smi, 0o755)
    # the remote PATH: the emulated tools first, then the caller's PATH without gpuops' own virtualenv
    venv_bin = str(Path(sys.prefix) / "bin") if sys.prefix != sys.base_prefix else None
    inherited = [p for p in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep) if p and p != venv_bin]
    path = os.pathsep.join([str(d / "bin")] + inherited)
    session = f"""#!/bin/sh
# gpuops sandbox session: an isolated home and the emulated GPU tools on PATH.
HOME={shlex.quote(str(d / 'home'))}
PATH={shlex.quote(path)}
GPUOPS_SANDBOX_DIR={shlex.quote(str(d))}
export HOME PATH GPUOPS_SANDBOX_DIR
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME
cd "$HOME" || exit 1
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/sh -l; fi
if [ "$SSH_ORIGINAL_COMMAND" = "internal-sftp" ]; then exec /usr/lib/openssh/sftp-server; fi
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""
    write_atomic(d / "bin" / "session", session)
    os.chmod(d / "bin" / "session", 0o755)


def _write_profile(d: Path, state: dict) -> None:
    g = state["gpu"]
    from .nvidia_smi import CATALOG

    spec = CATALOG[g["gpu"]]
    text = f"""# Written by `gpuops sandbox up`: the local sandbox host (real sshd on 127.0.0.1, emulated GPUs).
# Rehearse a run here before paying for GPU time. Regenerated on every `sandbox up`.
host: 127.0.0.1
port: {state['port']}
user: {state['user']}
key: {d / 'client_ed25519'}
python: {state.get('python', 'python3')}
region: local
instance_type: sandbox_{g['count']}x_{g['gpu'].replace('-', '_')}
price_per_hour: 0
host_key_policy: accept-new
expect:
  gpu: "{spec['name'].replace('NVIDIA ', '')}"
  gpu_count: {g['count']}
  gpu_memory_mib: {spec['memory'] - 1000}
  driver: ">={g['driver'].split('.')[0]}"
  cuda: "{g['cuda']}"
  python: ">=3.8"
  min_disk_gb: 1
env_preset: {'ada' if g['gpu'] == 'rtx6000ada' else 'h100' if g['gpu'].startswith('h100') else None}
"""
    text = text.replace("env_preset: None\n", "")
    write_atomic(profile_path(), text)


def _session_processes(d: Path) -> list[int]:
    """Processes started through this sandbox host's sessions (their environment names its directory)."""
    mark = f"GPUOPS_SANDBOX_DIR={d}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def down() -> bool:
    """Stop sshd and, as a host going down does, the jobs its sessions left running. The profile and keys stay,
    so the host key is the same on the next `up`."""
    d = sandbox_dir()
    for pid in _session_processes(d):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pid = _pid(d)
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return False
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except OSError:
            break
        time.sleep(0.02)
    (d / "sshd.pid").unlink(missing_ok=True)
    return True


def status() -> dict:
    d = sandbox_dir()
    st = read_state(d)
    pid = _pid(d)
    st["running"] = bool(pid and st.get("port") and _listening(st["port"]))
    st["pid"] = pid
    st["dir"] = str(d)
    st["profile"] = str(profile_path()) if profile_path().exists() else None
    return st
