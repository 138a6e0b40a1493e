"""The local Slurm cluster's processes and ports on this machine (sandbox/slurm.py, slurm_nodes.py and
slurm_accounting.py share them): a daemon found by its pid file and command line, stopped politely or not; a node's
job processes; free ports chosen so parallel clusters (one per xdist worker) do not collide."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import time
from pathlib import Path

from ..errors import GpuopsError
from .host import _alive  # running, not a zombie (a pid 1 in a container may never reap a daemon)
from .slurm_conf import Layout

INSTALL_HINT = "sudo apt-get install -y slurmctld slurmd slurm-client munge   (scripts/install-system-deps.sh)"


def find_tool(name: str) -> str:
    for cand in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise GpuopsError(f"{name} is not installed; the local Slurm cluster needs Debian's slurmctld, slurmd, "
                      "slurm-client and munge", hint=INSTALL_HINT)


def pid_from_file(pid_file: Path, needle: str) -> int | None:
    """The pid in `pid_file` if that process lives and its command line holds `needle` (this cluster's conf or
    socket), never a process that reused the pid of a daemon gone meanwhile."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if needle.encode() in cmdline and _alive(pid) else None


def munged_pid(lay: Layout) -> int | None:
    return pid_from_file(lay.munge / "munged.pid", str(lay.munge_socket))


def ctld_pid(lay: Layout) -> int | None:
    return pid_from_file(lay.ctld / "slurmctld.pid", str(lay.conf))


def slurmd_pid(lay: Layout, node: str) -> int | None:
    return pid_from_file(lay.node(node) / "slurmd.pid", str(lay.conf))


def _spared() -> set[int]:
    """This process and its ancestors: never killed as a cluster's process (a test run from inside a job)."""
    spared, pid = set(), os.getpid()
    while pid > 1 and pid not in spared:
        spared.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return spared


def node_processes(lay: Layout, node: str) -> list[int]:
    """Node `node`'s job processes: its slurmstepds (each holds the node's slurmd.log open), their descendants (the
    tasks) and any process whose environment the TaskProlog gave the node's GPUOPS_SANDBOX_DIR (a task detached
    with setsid). Not its slurmd."""
    log = os.path.realpath(lay.node(node) / "slurmd.log")
    needle = f"GPUOPS_SANDBOX_DIR={lay.node(node)}".encode()
    stepds, tagged, children = set(), set(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            comm = (entry / "comm").read_text().strip()
            if comm == "slurmstepd":
                if any(os.readlink(entry / "fd" / fd) == log for fd in os.listdir(entry / "fd")):
                    stepds.add(pid)
            elif needle in (entry / "environ").read_bytes().split(b"\0"):
                tagged.add(pid)
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found, todo = set(stepds) | tagged, list(stepds)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found - _spared())


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def process_stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def stop_daemon(pid: int | None, wait: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL when it has not ended within `wait` seconds (at once when it is stopped: a lost node's,
    slurm_nodes.kill_node). Returns whether it was running."""
    if not pid:
        return False
    kill_pids([pid], signal.SIGKILL if process_stopped(pid) else signal.SIGTERM)
    deadline = time.monotonic() + wait
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _alive(pid):
        kill_pids([pid])
    return True


# -- ports -----------------------------------------------------------------------------------------------------------
def _port_free(port: int) -> bool:
    """Free on every address (slurmctld and slurmd listen on all of them)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _ephemeral() -> range:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return range(lo, hi + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_ports(count: int, keep: list[int] | None = None) -> list[int]:
    """`count` distinct free ports below the ephemeral range (an outgoing connection never takes one between this
    choice and the daemon's bind), starting at a place that depends on this process (parallel test workers spread);
    the ports in `keep` first when still free (a restarted cluster keeps its ports)."""
    eph = _ephemeral()
    out = [p for p in dict.fromkeys(keep or []) if p > 0 and _port_free(p)][:count]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    tries = 0
    while len(out) < count:
        p = rng.randrange(15000, eph.start if eph.start > 16000 else 30000)
        tries += 1
        if p not in out and _port_free(p):
            out.append(p)
        if tries > 5000:
            raise GpuopsError("no free port for the local Slurm cluster")
    return out
