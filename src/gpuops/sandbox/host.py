"""`gpuops sandbox`: a real OpenSSH sshd on 127.0.0.1, run as the current user, with its own host key,
its own client key, an isolated home and an emulated nvidia-smi on its PATH. It writes a ready profile
`sandbox` into the user profile directory.

Layout of the sandbox directory (~/.local/state/gpuops/sandbox):
  host_ed25519_key   sshd's host key        client_ed25519   the key gpuops logs in with
  authorized_keys    sshd_config            sshd.pid / sshd.log
  gpu.json           emulated GPU state     bin/nvidia-smi, bin/session (ForceCommand wrapper)
  home/              the remote user's $HOME (the session starts there)

`up`/`down`/`status` drive THE sandbox host (that directory, 127.0.0.1, a random port, profile `sandbox`).
`start(dir, ...)`/`stop(dir)` drive any number of sandbox hosts at once, each with its own directory, listen address
(`address=AUTO`: a free 127.0.0.N, port 22 as on a cloud instance), host key, authorized keys, emulated GPUs and
optional profile: the cloud emulator's instances and multi-host fleets are built on them.
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
from ..paths import config_dir, state_dir, write_atomic, write_private

GPU_MODELS = ("h100-pcie", "h100-sxm", "h100-sxm5", "h200", "a100", "rtx6000ada", "b200", "rtxpro6000", "gh200", "a10")
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


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _port_free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def _keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    os.chmod(path, 0o600)


def sshd_pid(d: Path) -> int | None:
    """The pid of the host's running sshd: its pid file's, if that process is alive and is this host's sshd (its
    command line names this host's sshd_config), never a process that reused the pid of an sshd gone meanwhile."""
    try:
        pid = int((d / "sshd.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and str(d / "sshd_config").encode() in cmdline else None


def _alive(pid: int) -> bool:
    """Running, not a zombie (a daemonised sshd's parent may be a pid 1 that never reaps, as in containers)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _listening(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
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
                    na_fields: list[str] | None = None, faults: list[str] | None = None) -> dict:
    if gpu not in GPU_MODELS:
        raise UsageError(f"unknown --gpu {gpu!r}; choose one of: {', '.join(GPU_MODELS)}")
    if fail not in FAIL_MODES:
        raise UsageError(f"unknown --fail {fail!r}; choose one of: {', '.join(FAIL_MODES)}")
    from .nvidia_smi import fault_problem

    for text in faults or []:
        if fault_problem(text, gpus):
            raise UsageError(fault_problem(text, gpus))
    state = {"gpu": gpu, "count": gpus, "driver": driver, "cuda": cuda, "fail": None if fail == "none" else fail,
             "header": header, "na_fields": na_fields or [], "faults": list(faults or [])}
    write_atomic(d / "gpu.json", json.dumps(state, indent=1))
    (d / "kernel.jsonl").unlink(missing_ok=True)  # a fresh host state: its kernel's events (OOM kills) start over
    return state


def up(*, gpu: str = "h100-pcie", gpus: int = 1, port: int | None = None, driver: str = "570.148.08",
       cuda: str = "12.8", fail: str = "none", header: str = "legacy", python: str | None = None,
       na_fields: list[str] | None = None, write_profile: bool = True, faults: list[str] | None = None,
       image: str | None = None) -> dict:
    """Start (or reconfigure) the sandbox host. Idempotent: a running sshd keeps running; GPU state is rewritten.
    image: an emulated instance image (sandbox/image.py IMAGES, e.g. "lambda-stack": the host's python3 holds a
    CUDA torch and pip, as Lambda Stack's does), built once under the sandbox folder; None: this machine's python3."""
    image_python = None
    if image is not None:
        from . import image as images

        if image not in images.IMAGES:
            from ..errors import UsageError

            raise UsageError(f"unknown image {image!r}; known: {', '.join(images.IMAGES)}")
        image_python = str(images.build(sandbox_dir() / "images" / image, image))
    st = start(sandbox_dir(), port=port, gpu=gpu, gpus=gpus, driver=driver, cuda=cuda, fail=fail, header=header,
               python=python, na_fields=na_fields, profile=PROFILE_NAME if write_profile else None, faults=faults,
               image_python=image_python)
    st["image"] = image
    return st


AUTO = "auto"  # start(address=AUTO): a free 127.0.0.N (N >= 2) for this host


def start(d: Path, *, address: str = "127.0.0.1", port: int | None = None, gpu: str = "h100-pcie", gpus: int = 1,
          driver: str = "570.148.08", cuda: str = "12.8", fail: str = "none", header: str = "legacy",
          python: str | None = None, na_fields: list[str] | None = None, host_key: str | None = None,
          authorized_keys: list[str] | None = None, profile: str | None = None,
          faults: list[str] | None = None, image_python: str | None = None) -> dict:
    """Start (or reconfigure) one sandbox host in directory `d`. Several run at once, each in its own directory.

    address: the listen address; AUTO picks a free 127.0.0.N (then `port` defaults to 22, as on a cloud instance).
    host_key: an OpenSSH ed25519 private key (text) sshd presents; default: one generated in `d` once.
    authorized_keys: public key lines allowed to log in; default: a client key generated in `d` (client_ed25519).
    profile: write a ready profile under this name (user profile directory); None: no profile.
    image_python: the host's system `python3` (and `python`): an interpreter from sandbox/image.py, as an instance
    image's (Lambda Stack's python3 has a CUDA torch); None: the caller's python3 on PATH.
    Idempotent: a running sshd on the same address/port/keys keeps running; GPU state is rewritten."""
    for sub in ("bin", "home"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    gpu_state = write_gpu_state(d, gpu=gpu, gpus=gpus, driver=driver, cuda=cuda, fail=fail, header=header,
                                na_fields=na_fields, faults=faults)
    _install_tools(d, image_python)
    state = read_state(d)
    keys_changed = _write_keys(d, host_key, authorized_keys)
    pid = sshd_pid(d)
    same = (state.get("port") and (port is None or port == state["port"])
            and (address in (AUTO, state.get("address", "127.0.0.1"))))
    if pid and same and not keys_changed and _listening(state["port"], state.get("address", "127.0.0.1")):
        state.update(gpu=gpu_state, started=False)
    else:
        if pid:
            stop(d)
        moved_from = None
        if port is None and address != AUTO and state.get("port"):  # kept across restarts, so known_hosts and
            if _port_free(state["port"], address):                 # profiles stay valid
                port = state["port"]
            else:
                moved_from = state["port"]
        state = _start_sshd(d, address, port)
        state["port_moved_from"] = moved_from
    state.update(gpu=gpu_state, dir=str(d), python=python or "python3")  # every `up` states the whole host
    # every host gets the profile a launched instance gets (`gpuops up` writes no python:): commands use python3,
    # setup makes the job's environment from it (and records it), as on Lambda; an explicit --python is written as
    # given. Until #36 the default host's profile said `python: python3`, and `setup -p sandbox` refused it (exit 2)
    state["profile_python"] = python or None
    state["client_key"] = str(d / "client_ed25519") if authorized_keys is None else None
    write_atomic(d / "state.json", json.dumps({k: v for k, v in state.items() if k not in ("started", "port_moved_from")},
                                              indent=1))
    if profile:
        _write_profile(d, state, profile)
    return state


def _write_keys(d: Path, host_key: str | None, authorized_keys: list[str] | None) -> bool:
    """Host key and authorized_keys for `d`; True when either changed (a running sshd must restart)."""
    changed = False
    hk = d / "host_ed25519_key"
    if host_key is not None:
        text = host_key if host_key.endswith("\n") else host_key + "\n"
        if not hk.exists() or hk.read_text() != text:
            write_private(hk, text)
            (d / "host_ed25519_key.pub").unlink(missing_ok=True)
            changed = True
    else:
        _keygen(hk, "gpuops-sandbox-host")
    if authorized_keys is None:
        _keygen(d / "client_ed25519", "gpuops-sandbox-client")
        text = (d / "client_ed25519.pub").read_text()
    else:
        text = "".join(k.strip() + "\n" for k in authorized_keys if k.strip())
    ak = d / "authorized_keys"
    if not ak.exists() or ak.read_text() != text:
        write_private(ak, text)  # sshd reads it on every login: no restart needed
    return changed


def _loopback_candidates() -> list[str]:
    """127.0.0.2 .. 127.0.0.254, starting at a place that depends on this process (parallel test runs spread)."""
    first = os.getpid() % 253
    return [f"127.0.0.{2 + (first + i) % 253}" for i in range(253)]


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def _start_sshd(d: Path, address: str, port: int | None) -> dict:
    sshd = find_sshd()
    user = getpass.getuser()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    if address == AUTO:
        port = port or 22
        tries = [a for a in _loopback_candidates() if _bindable(a, port)]
        if not tries:
            raise GpuopsError(f"no free 127.0.0.N address for port {port}")
    else:
        tries = [address]
    last = ""
    for addr in tries[:20]:  # another run may take an address between our probe and sshd's bind: next one
        p = port or _free_port(addr)
        write_atomic(d / "sshd_config", _sshd_config(d, addr, p, user))
        proc = subprocess.run([sshd, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            log = (d / "sshd.log").read_text()[-300:] if (d / "sshd.log").exists() else ""
            last = (proc.stdout.strip() or log.strip() or f"exit {proc.returncode}")
            if address == AUTO and "Address already in use" in (proc.stdout + log):
                continue
            raise GpuopsError(f"sshd did not start: {last}", hint=f"see {d / 'sshd.log'}")
        deadline = time.monotonic() + 10
        while True:
            # Listening is not enough: sshd binds after it has daemonised, so when another host took the address
            # between our probe and that bind, ours exits and THAT host answers here (another key: refused later).
            mine = _listener_is_ours(d, addr, p) if _listening(p, addr) else None
            if mine:
                return {"address": addr, "port": p, "user": user, "started": True}
            log = (d / "sshd.log").read_text()[-500:] if (d / "sshd.log").exists() else ""
            gone = mine is False or (sshd_pid(d) is None and "Address already in use" in log)
            if gone and address == AUTO and sshd_pid(d) is None:
                last = f"{addr}:{p} taken by another host"
                break  # the next address
            if time.monotonic() > deadline:
                raise GpuopsError(f"sshd did not start listening on {addr}:{p}. {log}")
            time.sleep(0.02)
    raise GpuopsError(f"sshd did not start on any free 127.0.0.N:{port}: {last}")


def _listener_is_ours(d: Path, address: str, port: int) -> bool | None:
    """Is the socket listening on address:port this host's sshd's (/proc/net/tcp's inode among its descriptors)?
    None: not known yet (no pid file, or no such listener in the table)."""
    pid = sshd_pid(d)
    if pid is None:
        return None
    want = "%08X:%04X" % (int.from_bytes(socket.inet_aton(address), "little"), port)
    try:
        inodes = [f.split()[9] for f in Path("/proc/net/tcp").read_text().splitlines()[1:]
                  if f.split()[1] == want and f.split()[3] == "0A"]
        fds = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return None
    if not inodes:
        return None
    return any(f"socket:[{i}]" in fds for i in inodes)


def _sshd_config(d: Path, address: str, port: int, user: str) -> str:
    return f"""# written by gpuops sandbox
Port {port}
ListenAddress {address}
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
# sshd runs the ForceCommand with the user's login shell, and bash started by sshd reads ~/.bashrc: with this
# machine's HOME, its rc files (pyenv init, which takes a lock on every rehash) would run in every session, and a
# session killed while holding that lock made every later one wait 60 s. The host's own home is read instead.
SetEnv HOME={d / 'home'}
Subsystem sftp internal-sftp
"""


# The host's df: the machine's own, unless a disk fault is set (gpu.json), then the emulation (df.py, which rewrites
# the numbers). Shell builtins only until then: a real host's df costs a millisecond, and so does this one (a
# python start here made every sync's room check cost 40 ms: the sandbox, not gpuops, issue 42).
DF = """#!/bin/sh
if [ -n "${GPUOPS_SANDBOX_DIR:-}" ] && [ -r "$GPUOPS_SANDBOX_DIR/gpu.json" ]; then
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in *disk-full*|*inodes-full*|*disk-low*) exec "$GPUOPS_SANDBOX_DIR/bin/.df-emulated" "$@";; esac
  done < "$GPUOPS_SANDBOX_DIR/gpu.json"
fi
for real in /usr/bin/df /bin/df; do [ -x "$real" ] && exec "$real" "$@"; done
echo "df: not found" >&2; exit 127
"""


def _install_tools(d: Path, image_python: str | None = None) -> None:
    # the image's python3 is found on PATH in its own bin/ (a venv made from it names that folder as its home, and
    # Python finds the installation from there, as /usr/bin for a system python3)
    image_bin = Path(image_python).parent if image_python else None
    for tool, module in (("nvidia-smi", "nvidia_smi.py"), ("dmesg", "kernel_log.py"), ("journalctl", "kernel_log.py"),
                         (".df-emulated", "df.py")):
        src = (Path(__file__).parent / module).read_text()
        write_atomic(d / "bin" / tool, f"#!{sys.executable}\n" + src.split("\n", 1)[1])
        os.chmod(d / "bin" / tool, 0o755)
    write_atomic(d / "bin" / "df", DF)
    os.chmod(d / "bin" / "df", 0o755)
    # the remote PATH: the emulated tools first, then the caller's PATH without gpuops' own virtualenv
    venv_bin = str(Path(sys.prefix) / "bin") if sys.prefix != sys.base_prefix else None
    inherited = [p for p in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep) if p and p != venv_bin]
    path = os.pathsep.join([str(d / "bin")] + ([str(image_bin)] if image_bin else []) + inherited)
    session = f"""#!/bin/sh
# gpuops sandbox session: an isolated home and the emulated GPU tools on PATH.
HOME={shlex.quote(str(d / 'home'))}
PATH={shlex.quote(path)}
GPUOPS_SANDBOX_DIR={shlex.quote(str(d))}
export HOME PATH GPUOPS_SANDBOX_DIR
{SESSION_MARK}={shlex.quote(_session_mark(d))}; export {SESSION_MARK}
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME
cd "$HOME" || exit 1
# a login shell's /etc/profile sets PATH anew; an interactive sh reads $ENV after it: the tools come back first
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then ENV={shlex.quote(str(d / 'bin' / 'shrc'))}; export ENV; exec /bin/sh -l; fi
if [ "$SSH_ORIGINAL_COMMAND" = "internal-sftp" ]; then exec /usr/lib/openssh/sftp-server; fi
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""
    write_atomic(d / "bin" / "shrc", f"# gpuops sandbox: the interactive shell's PATH, as its sessions have it\n"
                                     f"PATH={shlex.quote(path)}; export PATH\n")
    write_atomic(d / "bin" / "session", session)
    os.chmod(d / "bin" / "session", 0o755)


def _write_profile(d: Path, state: dict, name: str = PROFILE_NAME) -> None:
    g = state["gpu"]
    from .nvidia_smi import CATALOG

    spec = CATALOG[g["gpu"]]
    py = state.get("profile_python", state.get("python", "python3"))
    python_line = f"python: {py}\n" if py else ""
    text = f"""# Written by `gpuops sandbox up`: the local sandbox host (real sshd on 127.0.0.1, emulated GPUs).
# Rehearse a run here before paying for GPU time. Regenerated on every `sandbox up`.
host: {state.get('address', '127.0.0.1')}
port: {state['port']}
user: {state['user']}
key: {state.get('client_key') or d / 'client_ed25519'}
{python_line}region: local
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
env_preset: {_preset(spec['name'])}
"""
    text = text.replace("env_preset: None\n", "")
    write_atomic(config_dir() / "profiles" / f"{name}.yaml", text)


def _preset(smi_name: str) -> str | None:
    from ..verify import gpus

    row = gpus.match(smi_name)
    return row.preset if row else None


SESSION_MARK = "GPUOPS_SANDBOX_SESSION"  # bin/session exports it into every session of the host


def _session_mark(d: Path, create: bool = True) -> str | None:
    """This host's session marker: a random value kept in <d>/session_mark, which only bin/session exports (as
    GPUOPS_SANDBOX_SESSION) into the sessions it starts. Unlike GPUOPS_SANDBOX_DIR, a user never has it in a shell of
    their own by accident, so it tells the host's jobs from everything else."""
    f = d / "session_mark"
    try:
        value = f.read_text().strip()
    except OSError:
        value = ""
    if not value and create:
        import secrets

        value = secrets.token_hex(12)
        write_private(f, value + "\n")
    return value or None


def _process_table() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, environment as started) of every process this user may read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        table[int(entry.name)] = (ppid, environ)
    return table


def session_processes(d: Path) -> list[int]:
    """The processes this host's sessions started: every one carrying its session marker (a job detached with setsid
    or a double fork keeps its environment when it leaves the session's process tree) and every descendant of its
    sshd (a session that cleared its environment). Never the sshd itself, this process or any of its ancestors: a
    caller whose shell exported GPUOPS_SANDBOX_DIR, its other shells and editors are not the host's."""
    table = _process_table()
    mark = _session_mark(d, create=False)
    needle = f"{SESSION_MARK}={mark}".encode() if mark else None
    found = {pid for pid, (_, env) in table.items() if needle and needle in env.split(b"\0")}
    sshd = sshd_pid(d)
    if sshd:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(sshd, []))
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, []))
    spared = {sshd} if sshd else set()
    pid = os.getpid()
    while pid > 1 and pid not in spared:  # this process and its ancestors
        spared.add(pid)
        pid = table[pid][0] if pid in table else 0
    return sorted(found - spared)


def kill_gpu_jobs(d: Path, pids: "list[int] | None" = None) -> list[int]:
    """The host's GPU processes (its sessions' processes whose environment holds GPUOPS_RUN_ID: a gpuops job, as its
    emulated nvidia-smi counts them; or `pids`, found before the fault was written so that the fault and their
    deaths are microseconds apart, as on a GPU that falls off the bus) die at once with SIGKILL, as a CUDA job does
    when its GPU falls off the bus. Returns their pids."""
    import signal

    killed = []
    for pid in gpu_job_processes(d) if pids is None else pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue
    return killed


def gpu_job_processes(d: Path) -> list[int]:
    """The host's gpuops job processes (its sessions' processes whose environment holds GPUOPS_RUN_ID, as its
    emulated nvidia-smi counts them; never the launcher, whose own environment does not), oldest first."""
    table = _process_table()
    return [pid for pid in session_processes(d)
            if any(e.startswith(b"GPUOPS_RUN_ID=") for e in table.get(pid, (0, b""))[1].split(b"\0"))]


def oom_kill(d: Path, pid: int | None = None) -> int | None:
    """The emulated kernel's OOM killer: it picks the job's process with the most resident memory (or `pid`), prints
    the kill in the host's kernel log as Linux does (kernel_log.oom_lines, read back by its dmesg and journalctl) and
    sends it SIGKILL. Returns the pid killed, or None when the host runs no job."""
    from . import kernel_log

    def rss_kb(p: int) -> int:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return 0

    pids = [pid] if pid is not None else gpu_job_processes(d)
    if not pids:
        return None
    victim = max(pids, key=rss_kb)
    try:
        name = Path(f"/proc/{victim}/comm").read_text().strip()
    except OSError:
        name = "python3"
    for line in kernel_log.oom_lines(victim, name, os.getuid(), max(rss_kb(victim), 1)):
        kernel_log.record(d, line)
    try:
        os.kill(victim, signal.SIGKILL)
    except OSError:
        return None
    return victim


def inject_fault(d: Path, fault: str, kill_jobs: bool = False) -> list[str]:
    """A running host's GPU fails from now on (`xid=79`, `ecc`, ... as `sandbox up --fault` takes them; `disk-full`,
    `inodes-full`: its df): added to its gpu.json, whose time places an Xid in its kernel log. kill_jobs: its GPU
    jobs die at that moment (SIGKILL, as a CUDA job does when its GPU falls off the bus). Returns its faults."""
    from .nvidia_smi import fault_problem

    f = d / "gpu.json"
    state = json.loads(f.read_text())
    why = fault_problem(fault, int(state.get("count") or 1))
    if why:
        raise UsageError(why)
    victims = gpu_job_processes(d) if kill_jobs else []  # found first: the fault and their deaths, together
    state["faults"] = list(state.get("faults") or []) + [fault]
    write_atomic(f, json.dumps(state, indent=1))
    if kill_jobs:
        kill_gpu_jobs(d, victims)
    return state["faults"]


def down() -> bool:
    """Stop the sandbox host (see stop)."""
    return stop(sandbox_dir())


def stop(d: Path) -> bool:
    """Stop sshd of the host in `d` and, as a host going down does, the jobs its sessions left running (see
    session_processes: only those). The profile and keys stay, so the host key is the same on the next start.
    Returns whether its sshd was running."""
    doomed = set(session_processes(d))  # while sshd runs: its sessions are its descendants
    pid = sshd_pid(d)
    stopped = False
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)  # no new sessions from here
            stopped = True
        except OSError:
            pass
        for _ in range(100):
            if not _alive(pid):
                break
            time.sleep(0.02)
        (d / "sshd.pid").unlink(missing_ok=True)
    doomed |= set(session_processes(d))  # a job a session forked meanwhile carries the marker
    for p in sorted(doomed):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return stopped


def status() -> dict:
    d = sandbox_dir()
    st = read_state(d)
    pid = sshd_pid(d)
    st["running"] = bool(pid and st.get("port") and _listening(st["port"], st.get("address", "127.0.0.1")))
    st["pid"] = pid
    st["dir"] = str(d)
    st["profile"] = str(profile_path()) if profile_path().exists() else None
    return st
