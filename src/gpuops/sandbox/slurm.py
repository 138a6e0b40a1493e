"""A local Slurm cluster for tests and rehearsal: Debian's slurmctld, slurmd and munge (Slurm 22.05), every daemon on
127.0.0.1 as the current user, in one folder (its files: sandbox/slurm_conf.py).

One munged with its own key and socket, one slurmctld, and one `slurmd -N nK` per node, each on its own free port;
each node's GPUs are gres backed by its own emulated nvidia-smi (sandbox/nvidia_smi.py, state in nodes/nK/gpu.json),
found first on PATH by every task through the cluster's TaskProlog. The login node is a sandbox host (sandbox/host.py)
whose bin/ holds wrappers of the Slurm commands, so `ssh login sinfo` drives the cluster. No accounting by default
(no slurmdbd): `scontrol show job` holds a job's ending, as on a cluster without sacct; accounting=True adds slurmdbd
and a private MariaDB (sandbox/slurm_accounting.py).

start(d)/stop(d) drive a cluster in any folder (the tests' fixture: one per xdist worker); run(d, args) is a Slurm
command with its environment. The login node and THE cluster of `gpuops sandbox up --slurm N` are in
sandbox/slurm_login.py; what happens to a node (drained, lost, a GPU fault) in sandbox/slurm_nodes.py; finding and
stopping the cluster's processes, and choosing its ports, in sandbox/slurm_procs.py.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..errors import GpuopsError
from ..paths import write_atomic, write_private
from . import slurm_accounting
from .slurm_conf import CLIENT_COMMANDS, PARTITION, TIMERS, Layout, Spec, client_wrapper, env_file, gres_conf, \
    node_names, slurm_conf, taskprolog
from .slurm_procs import ctld_pid, find_tool, free_ports, kill_pids, munged_pid, node_processes, slurmd_pid, \
    stop_daemon


def layout(d: Path, make: bool = True) -> Layout:
    """The cluster's layout, named from a short path: `d` itself, or a link /tmp/gpuops-slurm-<hash> to it when `d`
    is long (each job step's Unix socket, spool/nK_<job>.<step>, must stay within 108 bytes), made unless make=False
    (a stopped cluster's link is gone, and a look at it makes none)."""
    d = Path(d).absolute()
    if len(str(d)) <= 56:
        return Layout(d)
    alias = Path("/tmp") / f"gpuops-slurm-{hashlib.sha1(str(d).encode()).hexdigest()[:12]}"
    if make and os.path.realpath(alias) != os.path.realpath(d):
        alias.unlink(missing_ok=True)
        alias.symlink_to(d)
    return Layout(alias)


def read_spec(d: Path) -> Spec | None:
    try:
        return Spec.from_json(json.loads((Path(d) / "cluster.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


# -- the client side -------------------------------------------------------------------------------------------------
def client_env(d: Path, base: dict | None = None) -> dict:
    """The environment a Slurm command needs to drive this cluster (SLURM_CONF; munge's socket is in the conf)."""
    env = dict(os.environ if base is None else base)
    env["SLURM_CONF"] = str(layout(d).conf)
    return env


def run(d: Path, args: list[str], *, timeout: float = 30, check: bool = False,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A Slurm client command (["sinfo", "-h"]) against this cluster, as text; check: a failure raises."""
    proc = subprocess.run(list(args), env=client_env(d), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise GpuopsError(f"{' '.join(args)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def node_states(d: Path) -> dict[str, str]:
    """node -> Slurm's state in sinfo's long form ("idle", "down*", "drained", "allocated"...); {} when the
    controller does not answer."""
    try:
        proc = run(d, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
    except subprocess.TimeoutExpired:
        return {}
    if proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)


def wait_nodes(d: Path, states: tuple[str, ...] = ("idle",), nodes: list[str] | None = None,
               timeout: float = 30) -> dict[str, str]:
    """Poll sinfo until every node named (default: all) is in one of `states`; returns the states seen last."""
    deadline = time.monotonic() + timeout
    want = nodes or (read_spec(d).nodes if read_spec(d) else [])
    while True:
        seen = node_states(d)
        if seen and all(seen.get(n) in states for n in want):
            return seen
        if time.monotonic() > deadline:
            raise GpuopsError(f"the local Slurm cluster's nodes {', '.join(want)} did not reach "
                              f"{'/'.join(states)} within {timeout:.0f} s: {seen or 'no answer from slurmctld'}",
                              hint=f"see {layout(d).ctld / 'slurmctld.log'} and nodes/*/slurmd.log")
        time.sleep(0.05)


# -- the cluster -----------------------------------------------------------------------------------------------------
def _write_files(d: Path, lay: Layout, spec: Spec) -> None:
    from . import host

    for sub in ("etc", "munge", "ctld/state", "dev", "bin", "shared"):
        (lay.base / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)  # munged refuses a socket folder others may write
    key = lay.munge / "munge.key"
    if not key.exists():
        write_private(key, os.urandom(1024))
    write_atomic(lay.conf, slurm_conf(spec, lay))
    write_atomic(lay.gres_conf, gres_conf(spec, lay))
    write_atomic(lay.taskprolog, taskprolog(lay))
    os.chmod(lay.taskprolog, 0o755)
    for i in range(spec.gpus_per_node):
        link = lay.dev / f"nvidia{i}"
        if not link.is_symlink():
            link.symlink_to("/dev/null")
    for node in spec.nodes:
        nd = lay.node(node)
        (nd / "spool").mkdir(parents=True, exist_ok=True)
        if not (nd / "gpu.json").exists():
            host.write_gpu_state(nd, gpu=spec.gpu, gpus=spec.gpus_per_node, driver="570.148.08", cuda="12.8",
                                 fail="none", header="legacy")
        host._install_tools(nd)  # bin/nvidia-smi, dmesg, journalctl, df reading this node's gpu.json; its mark
    for command in CLIENT_COMMANDS:
        write_atomic(lay.bin / command, client_wrapper(command, lay, find_tool(command)))
        os.chmod(lay.bin / command, 0o755)
    write_atomic(lay.env_file, env_file(lay))


def _start_munged(lay: Layout) -> None:
    if munged_pid(lay):
        return
    proc = subprocess.run([find_tool("munged"), "--force", f"--socket={lay.munge_socket}",
                           f"--key-file={lay.munge / 'munge.key'}", f"--pid-file={lay.munge / 'munged.pid'}",
                           f"--log-file={lay.munge / 'munged.log'}", f"--seed-file={lay.munge / 'munged.seed'}"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise GpuopsError(f"munged did not start: {(proc.stderr or proc.stdout).strip()}",
                          hint=f"see {lay.munge / 'munged.log'}")
    deadline = time.monotonic() + 10
    while not (lay.munge_socket.exists() and munged_pid(lay)):
        if time.monotonic() > deadline:
            raise GpuopsError("munged did not create its socket", hint=f"see {lay.munge / 'munged.log'}")
        time.sleep(0.01)


def _daemon(argv: list[str], lay: Layout, err: Path) -> None:
    """Start a Slurm daemon (it forks into the background); what it says before it does goes to `err`."""
    with open(err, "w") as fh:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                              env=client_env(lay.base), timeout=30)
    if proc.returncode != 0:
        raise GpuopsError(f"{Path(argv[0]).name} did not start (exit {proc.returncode}): {err.read_text().strip()}",
                          hint=f"see {err}")


def _log_says(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def _start_ctld(d: Path, lay: Layout, fresh: bool) -> None:
    if ctld_pid(lay):
        return
    if fresh:  # another shape: nothing of the old state is recovered
        shutil.rmtree(lay.ctld / "state", ignore_errors=True)
        (lay.ctld / "state").mkdir(parents=True)
    (lay.ctld / "slurmctld.log").unlink(missing_ok=True)
    _daemon([find_tool("slurmctld"), "-f", str(lay.conf)] + (["-c"] if fresh else []), lay, lay.ctld / "start.err")
    deadline = time.monotonic() + 20
    while "UP" not in run(d, ["scontrol", "ping"], timeout=10).stdout:
        if _log_says(lay.ctld / "slurmctld.log", "Address already in use"):
            raise _PortTaken("slurmctld")
        if time.monotonic() > deadline:
            raise GpuopsError("slurmctld did not answer", hint=f"see {lay.ctld / 'slurmctld.log'}")
        time.sleep(0.02)


class _PortTaken(GpuopsError):
    """A port chosen free was taken before the daemon bound it (another worker's cluster): start again."""


def start_slurmd(lay: Layout, node: str, fresh: bool = False) -> None:
    if slurmd_pid(lay, node):
        return
    nd = lay.node(node)
    if fresh:
        shutil.rmtree(nd / "spool", ignore_errors=True)
        (nd / "spool").mkdir()
    (nd / "slurmd.log").unlink(missing_ok=True)
    _daemon([find_tool("slurmd"), "-N", node, "-f", str(lay.conf)], lay, nd / "start.err")


def start(d: Path, *, nodes: int = 4, gpus_per_node: int = 8, gpu: str = "h100-sxm", cpus_per_node: int = 16,
          memory_mb: int = 64000, partition: str = PARTITION, timers: dict | None = None, accounting: bool = False,
          timeout: float = 30) -> dict:
    """Start (or keep) a cluster of `nodes` nodes in folder `d`; returns cluster_info(d) with `started`: False when
    the same cluster was already running (a node whose slurmd had died is started again), True when it was started
    (anything of an older shape is stopped first; its munge key and ports are kept where still free).
    accounting: slurmdbd and a private MariaDB too (sandbox/slurm_accounting.py), so sacct answers."""
    from .host import GPU_MODELS

    if gpu not in GPU_MODELS:
        raise GpuopsError(f"unknown GPU model {gpu!r}; choose one of: {', '.join(GPU_MODELS)}")
    d = Path(d).absolute()
    d.mkdir(parents=True, exist_ok=True)
    lay = layout(d)
    for tool in ("munged", "slurmctld", "slurmd", "sinfo"):
        find_tool(tool)
    old = read_spec(d)
    want = Spec(name=old.name if old else f"gpuops{os.urandom(3).hex()}", nodes=node_names(nodes), ctld_port=0,
                node_ports={}, user=getpass.getuser(), gpus_per_node=gpus_per_node, gpu=gpu,
                cpus_per_node=cpus_per_node, memory_mb=memory_mb, partition=partition,
                timers={**TIMERS, **(timers or {})}, accounting=accounting)
    if old and old.same_shape(want) and ctld_pid(lay) and munged_pid(lay) \
            and (not accounting or slurm_accounting.dbd_pid(lay)):
        for node in old.nodes:
            start_slurmd(lay, node)
        wait_nodes(d, ("idle", "mixed", "allocated", "drained", "draining", "down*", "down"), timeout=timeout)
        return dict(cluster_info(d), started=False)
    stop(d, login=False)
    fresh = not (old and old.same_shape(want))
    keep = [old.ctld_port, *old.node_ports.values(), old.db_port, old.dbd_port] if old else []
    for attempt in range(4):
        ports = free_ports(3 + nodes, keep if attempt == 0 else None)
        want.ctld_port, want.node_ports = ports[0], dict(zip(want.nodes, ports[1:]))
        want.db_port, want.dbd_port = ports[-2:] if accounting else (0, 0)
        _write_files(d, lay, want)
        write_atomic(d / "cluster.json", json.dumps(want.to_json(), indent=1))
        try:
            _start_munged(lay)
            if accounting:
                slurm_accounting.start(lay, want, client_env(lay.base))
            _start_ctld(d, lay, fresh)
            for node in want.nodes:
                start_slurmd(lay, node, fresh)
            _wait_registered(d, lay, want, timeout)
            return dict(cluster_info(d), started=True)
        except _PortTaken:
            stop(d, login=False)
            fresh = True
    raise GpuopsError("the local Slurm cluster found no free ports in four tries")


def _wait_registered(d: Path, lay: Layout, spec: Spec, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen = node_states(d)
        if seen and all(seen.get(n) == "idle" for n in spec.nodes):
            return
        if any(_log_says(lay.node(n) / "slurmd.log", "Address already in use") for n in spec.nodes):
            raise _PortTaken("slurmd")
        if time.monotonic() > deadline:
            dead = [n for n in spec.nodes if not slurmd_pid(lay, n)]
            raise GpuopsError(f"the local Slurm cluster's nodes did not all become idle within {timeout:.0f} s: "
                              f"{seen or 'no answer from slurmctld'}" + (f"; slurmd gone on {dead}" if dead else ""),
                              hint=f"see {lay.ctld / 'slurmctld.log'} and {lay.base}/nodes/*/slurmd.log")
        time.sleep(0.03)


def stop(d: Path, login: bool = True) -> bool:
    """Stop everything of the cluster in `d`: its jobs' processes on every node, its slurmds, slurmctld and munged
    (and its login node's sshd unless login=False). Idempotent; returns whether anything was running. The folder
    stays (key, state, shared files), so a later start recovers the cluster's state."""
    d = Path(d).absolute()
    spec = read_spec(d)
    lay = layout(d) if spec or (d / "etc").is_dir() else None
    was = False
    if lay is not None:
        nodes = spec.nodes if spec else [p.name for p in (lay.base / "nodes").glob("*")]
        jobs = sorted({p for n in nodes for p in node_processes(lay, n)})
        kill_pids(jobs)
        was = bool(jobs)
        for pid in [slurmd_pid(lay, n) for n in nodes] + [ctld_pid(lay)]:
            if pid:
                kill_pids([pid], signal.SIGTERM)
                was = True
        for pid in [slurmd_pid(lay, n) for n in nodes] + [ctld_pid(lay)]:
            was = stop_daemon(pid) or was
        kill_pids(sorted({p for n in nodes for p in node_processes(lay, n)}))  # a step started meanwhile
        if (lay.base / "db").is_dir():
            was = slurm_accounting.stop(lay) or was
        was = stop_daemon(munged_pid(lay), wait=2) or was
    if login and lay is not None:
        if (d / "login" / "sshd_config").exists():
            from . import host

            was = host.stop(lay.login) or was  # its sshd names the folder as the cluster's files do
        if lay.base != d and lay.base.is_symlink():
            lay.base.unlink()  # a short alias of a long folder: the next start makes it again
    return was


def status(d: Path) -> dict:
    """Which of the cluster's daemons run (pids), without asking the controller."""
    d = Path(d).absolute()
    spec = read_spec(d)
    if spec is None:
        return {"running": False, "dir": str(d)}
    lay = layout(d, make=False)
    nodes = {n: slurmd_pid(lay, n) for n in spec.nodes}
    pids = {"munged": munged_pid(lay), "slurmctld": ctld_pid(lay)}
    return {"running": bool(pids["slurmctld"]), "dir": str(d), "daemons": pids, "slurmd": nodes}


def cluster_info(d: Path) -> dict:
    """The cluster's facts, for a profile's `slurm:` section and for tests: name, partition, nodes, GPUs per node,
    the shared folder, the conf, the env file and wrappers' folder, and the login node when it has one."""
    d = Path(d).absolute()
    spec = read_spec(d)
    if spec is None:
        raise GpuopsError(f"no local Slurm cluster in {d}", hint="gpuops sandbox up --slurm 4")
    lay = layout(d)
    info = {"name": spec.name, "dir": str(d), "partition": spec.partition, "nodes": list(spec.nodes),
            "gpus_per_node": spec.gpus_per_node, "gpu": spec.gpu, "cpus_per_node": spec.cpus_per_node,
            "memory_mb": spec.memory_mb, "shared_dir": str(lay.shared), "conf": str(lay.conf),
            "env_file": str(lay.env_file), "bin": str(lay.bin), "ctld_port": spec.ctld_port,
            "node_ports": dict(spec.node_ports), "slurm_version": _version(d), "accounting": spec.accounting,
            "login": None}
    from . import host

    st = host.read_state(lay.login) if (lay.login / "state.json").exists() else {}
    if st.get("port"):
        info["login"] = {"host": st.get("address", "127.0.0.1"), "port": st["port"], "user": st["user"],
                         "key": st.get("client_key") or str(lay.login / "client_ed25519"), "dir": str(lay.login)}
    return info


def _version(d: Path) -> str | None:
    """Slurm's version ("22.05.8"), as `sinfo --version` says it ("slurm-wlm 22.05.8")."""
    try:
        out = run(d, ["sinfo", "--version"], timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.split()[-1] if out.strip() else None
