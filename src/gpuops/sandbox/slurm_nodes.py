"""What happens to one node of the local Slurm cluster (sandbox/slurm.py): drained by an admin, lost (its slurmd
and its jobs' processes gone at once, as when a machine dies), brought back, or its emulated GPUs failing."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from ..errors import GpuopsError, UsageError
from ..paths import write_atomic
from .slurm import layout, read_spec, run, start_slurmd, wait_nodes
from .slurm_procs import kill_pids, node_processes, process_stopped, slurmd_pid, stop_daemon


def _node(d: Path, node: str) -> str:
    spec = read_spec(d)
    if spec is None or node not in spec.nodes:
        raise UsageError(f"no node {node!r} in the local Slurm cluster in {d}"
                         + (f" (its nodes: {', '.join(spec.nodes)})" if spec else ""))
    return node


def drain(d: Path, node: str, reason: str) -> None:
    """An admin drains `node` with `reason` (shown by `sinfo -R` and `scontrol show node`)."""
    run(d, ["scontrol", "update", f"NodeName={_node(d, node)}", "State=DRAIN", f"Reason={reason}"], check=True)


def resume(d: Path, node: str) -> None:
    """An admin returns a drained or down node to service."""
    run(d, ["scontrol", "update", f"NodeName={_node(d, node)}", "State=RESUME"], check=True)


def kill_node(d: Path, node: str) -> list[int]:
    """`node` dies, as a machine that loses power: its slurmd, its slurmstepds and its jobs' processes stop at once
    (SIGSTOP: they answer nothing, and their connections stay open without a word, as a dead machine's do; a killed
    process's would be closed by this machine's kernel, which a dead machine never does). slurmctld finds the node
    not responding and, after SlurmdTimeout, DOWN; a job running there ends NODE_FAIL, and one submitted with
    --requeue is requeued. restart_node (or stop) kills what is left of it. Returns the pids stopped."""
    lay = layout(d)
    pids = [p for p in [slurmd_pid(lay, _node(d, node))] if p] + node_processes(lay, node)
    kill_pids(pids, signal.SIGSTOP)
    more = [p for p in node_processes(lay, node) if p not in pids]  # a task forked meanwhile
    kill_pids(more, signal.SIGSTOP)
    return pids + more


def stop_node(d: Path, node: str) -> bool:
    """`node`'s slurmd stops cleanly (SIGTERM), its jobs left running, as an admin restarting the daemon does."""
    return stop_daemon(slurmd_pid(layout(d), _node(d, node)))


def restart_node(d: Path, node: str, wait: bool = True, timeout: float = 30) -> str:
    """`node` comes back: whatever of it still ran is killed, its slurmd starts again and (ReturnToService=2)
    slurmctld returns it to service when it registers. wait: until sinfo says it is idle (or allocated, when a
    pending job took it at once). Returns its state."""
    lay = layout(d)
    _node(d, node)
    pid = slurmd_pid(lay, node)
    if pid:
        kill_pids([pid])
        deadline = time.monotonic() + 5
        while slurmd_pid(lay, node) and time.monotonic() < deadline:
            time.sleep(0.02)
    kill_pids(node_processes(lay, node))
    start_slurmd(lay, node)
    if not wait:
        return "starting"
    return wait_nodes(d, ("idle", "mixed", "allocated"), [node], timeout=timeout)[node]


def node_dir(d: Path, node: str) -> Path:
    """The node's emulated host folder: its GPUOPS_SANDBOX_DIR (gpu.json, bin/nvidia-smi, kernel.jsonl)."""
    return layout(d).node(_node(d, node))


SLURM_PROCESSES = ("slurm_script", "srun", "slurmstepd")  # a job's Slurm side, never its GPU process


def gpu_jobs(d: Path, node: str) -> list[int]:
    """`node`'s GPU job processes (GPUOPS_RUN_ID in their environment, sandbox/host.py's gpu_job_processes through
    the node's session mark the TaskProlog gives every task), without the job's Slurm side: its batch script and
    srun carry the same environment but hold no GPU."""
    from . import host

    out = []
    for pid in host.gpu_job_processes(node_dir(d, node)):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm not in SLURM_PROCESSES:
            out.append(pid)
    return out


def set_gpu_fault(d: Path, node: str, fault: str, kill_jobs: bool = False) -> list[str]:
    """A fault on `node`'s emulated GPUs from now on (`xid=79`, `ecc=2@1`... as `sandbox up --fault` takes them; or a
    failure mode of host.FAIL_MODES: `driver-not-loaded`, `gpu-lost`, `hang`...); the other nodes stay healthy.
    kill_jobs: the node's GPU processes (gpu_jobs) die at that moment, as a CUDA process does when its GPU falls off
    the bus; the job's batch script and srun live on and see their task killed. Returns the node's faults (and its
    failure mode, as `fail:NAME`)."""
    from . import host

    nd = node_dir(d, node)
    victims = gpu_jobs(d, node) if kill_jobs else []  # found first: the fault and their deaths, together
    if fault in host.FAIL_MODES:
        state = json.loads((nd / "gpu.json").read_text())
        state["fail"] = None if fault == "none" else fault
        write_atomic(nd / "gpu.json", json.dumps(state, indent=1))
        faults = list(state.get("faults") or []) + ([f"fail:{fault}"] if state["fail"] else [])
    else:
        faults = host.inject_fault(nd, fault)
    if victims:
        host.kill_gpu_jobs(nd, victims)
    return faults


def clear_gpu_faults(d: Path, node: str | None = None) -> None:
    """Every node's (or `node`'s) emulated GPUs healthy again: no fault, no failure mode, an empty kernel log."""
    spec = read_spec(d)
    if spec is None:
        raise GpuopsError(f"no local Slurm cluster in {d}")
    for n in [_node(d, node)] if node else spec.nodes:
        nd = layout(d).node(n)
        state = json.loads((nd / "gpu.json").read_text())
        state.update(faults=[], fail=None)
        write_atomic(nd / "gpu.json", json.dumps(state, indent=1))
        (nd / "kernel.jsonl").unlink(missing_ok=True)



def node_lost(d: Path, node: str) -> bool:
    """Is `node` down on this machine: its slurmd gone, or frozen by kill_node?"""
    pid = slurmd_pid(layout(d), _node(d, node))
    return pid is None or process_stopped(pid)
