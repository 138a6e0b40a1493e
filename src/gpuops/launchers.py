"""Distributed launchers as data plus small renderers: what each node of a fleet runs, and its environment.

gpuops builds no distributed engine: `torchrun` (torch.distributed.run) and Ray do the work. This module only says,
purely, which command line each node runs with which addresses, ranks and ports; remote/launch.py starts it.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional

LAUNCHERS = ("none", "torchrun", "ray")
NEEDS = {"torchrun": "torch", "ray": "ray"}  # the package each launcher runs from, in the profile's python
MASTER_PORT = 29500  # torch's default rendezvous port
RAY_PORT = 6379  # Ray's default GCS port


@dataclass(frozen=True)
class Fleet:
    """The addresses the nodes reach each other on (rank order), the rendezvous port and GPUs per node."""
    addresses: tuple[str, ...]
    master_port: int = MASTER_PORT
    gpus_per_node: int = 1

    @property
    def nnodes(self) -> int:
        return len(self.addresses)

    @property
    def master_addr(self) -> str:
        return self.addresses[0]


def node_env(fleet: Fleet, rank: int) -> dict[str, str]:
    """The variables every node's job gets: gpuops' own names and torch's."""
    return {
        "GPUOPS_NODE_RANK": str(rank),
        "GPUOPS_NUM_NODES": str(fleet.nnodes),
        "GPUOPS_NODE_IPS": ",".join(fleet.addresses),
        "GPUOPS_MASTER_ADDR": fleet.master_addr,
        "GPUOPS_MASTER_PORT": str(fleet.master_port),
        "GPUOPS_GPUS_PER_NODE": str(fleet.gpus_per_node),
        "MASTER_ADDR": fleet.master_addr,
        "MASTER_PORT": str(fleet.master_port),
        "NODE_RANK": str(rank),
        "WORLD_SIZE": str(fleet.nnodes * fleet.gpus_per_node),
    }


def _python_words(python: str) -> list[str]:
    return shlex.split(python or "python3") or ["python3"]


def torchrun_argv(job: list[str], *, python: str, fleet: Fleet, rank: int, nproc_per_node: int) -> list[str]:
    """`python -m torch.distributed.run` (torchrun, from the profile's Python, so no PATH lookup) around the job:
    a .py job keeps its script; anything else runs with --no-python."""
    py = _python_words(python)
    head = [*py, "-m", "torch.distributed.run", "--nnodes", str(fleet.nnodes), "--node_rank", str(rank),
            "--master_addr", fleet.master_addr, "--master_port", str(fleet.master_port),
            "--nproc_per_node", str(nproc_per_node)]
    if job[:len(py)] == py:
        rest = job[len(py):]
        if rest[:1] == ["-u"]:
            rest = rest[1:]
        return head + rest
    return head + ["--no-python", *job]


def ray_address(fleet: Fleet, port: int = RAY_PORT) -> str:
    return f"{fleet.master_addr}:{port}"


def ray_start_argv(*, python: str, fleet: Fleet, rank: int, port: int = RAY_PORT, num_gpus: Optional[int] = None,
                   temp_dir: Optional[str] = None) -> list[str]:
    """`ray start` for one node: the head on rank 0 (dashboard kept to 127.0.0.1), a worker joining it elsewhere.
    Each node keeps its own temp dir when given (several sandbox hosts share one machine's /tmp)."""
    py = _python_words(python)
    argv = [*py, "-m", "ray.scripts.scripts", "start", f"--node-ip-address={fleet.addresses[rank]}",
            "--disable-usage-stats"]
    if rank == 0:
        argv += ["--head", f"--port={port}", "--dashboard-host=127.0.0.1"]
    else:
        argv += [f"--address={ray_address(fleet, port)}"]
    if temp_dir:
        argv.append(f"--temp-dir={temp_dir}")
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    return argv


def ray_stop_argv(python: str) -> list[str]:
    return [*_python_words(python), "-m", "ray.scripts.scripts", "stop", "--force"]


# -- shell text for launch.sh (every value quoted) ------------------------------------------------------------------
def _cmd(argv: list[str], python: str) -> str:
    from .profiles import shell_command

    py = _python_words(python)
    if argv[:len(py)] == py:
        return " ".join([shell_command(python)] + [shlex.quote(w) for w in argv[len(py):]])
    return " ".join(shlex.quote(w) for w in argv)


def ifname_prelude(address: str) -> str:
    """Export NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME as the interface that carries this node's address (found on
    the host when the job starts), unless the user set them."""
    a = shlex.quote(address)
    return ("gpuops_ip=$(command -v ip || { [ -x /usr/sbin/ip ] && echo /usr/sbin/ip; } || "
            "{ [ -x /sbin/ip ] && echo /sbin/ip; })\n"
            f"gpuops_if=$(\"${{gpuops_ip:-ip}}\" -o -4 addr show 2>/dev/null | awk -v a={a} '{{split($4, x, \"/\"); "
            "if (x[1] == a) {print $2; exit}}')\n"
            'if [ -n "$gpuops_if" ]; then\n'
            '  [ -n "${NCCL_SOCKET_IFNAME:-}" ] || { NCCL_SOCKET_IFNAME=$gpuops_if; export NCCL_SOCKET_IFNAME; }\n'
            '  [ -n "${GLOO_SOCKET_IFNAME:-}" ] || { GLOO_SOCKET_IFNAME=$gpuops_if; export GLOO_SOCKET_IFNAME; }\n'
            "fi")


def _port_probe(host: str, port: int, python: str) -> str:
    return _cmd([*_python_words(python), "-c", "import socket, sys; socket.create_connection((sys.argv[1], "
                 "int(sys.argv[2])), 2).close()", host, str(port)], python)


def wait_for_port(host: str, port: int, python: str, seconds: int = 180) -> str:
    """Shell text: wait until host:port accepts a TCP connection (a worker waiting for the Ray head); exit 1 if not."""
    return (f"gpuops_w=0; until {_port_probe(host, port, python)} 2>/dev/null; do gpuops_w=$((gpuops_w+1)); "
            f"if [ $gpuops_w -ge {int(seconds)} ]; then echo 'gpuops: the Ray head at {host}:{int(port)} did not "
            f"answer in {int(seconds)}s' >&2; exit 1; fi; sleep 1; done")


def ray_command(job: list[str], *, python: str, fleet: Fleet, rank: int, port: int = RAY_PORT,
                num_gpus: Optional[int] = None, temp_dir: Optional[str] = None) -> str:
    """What a node of a Ray run executes: rank 0 starts the head, runs the job with RAY_ADDRESS set, then stops the
    cluster; the others wait for the head, join it, stay while it answers, then stop their Ray processes and end
    with 0 (a worker fails only if it could not join). Workers run in a child `sh` so `gpuops stop` ends them."""
    start = _cmd(ray_start_argv(python=python, fleet=fleet, rank=rank, port=port, num_gpus=num_gpus,
                                temp_dir=temp_dir), python)
    stop = _cmd(ray_stop_argv(python), python)
    if rank == 0:
        addr = shlex.quote(ray_address(fleet, port))
        return (f"{start} && {{ RAY_ADDRESS={addr}; export RAY_ADDRESS; {_cmd(job, python)}; gpuops_j=$?; "
                f"{stop} >/dev/null 2>&1; (exit $gpuops_j); }}")
    worker = (f"{wait_for_port(fleet.master_addr, port, python)}; {start} || exit $?; "
              f"while {_port_probe(fleet.master_addr, port, python)} 2>/dev/null; do sleep 2; done; "
              f"echo 'gpuops: the Ray head has gone; leaving the cluster'; {stop} >/dev/null 2>&1; exit 0")
    return "sh -c " + shlex.quote(worker)
