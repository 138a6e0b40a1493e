"""The local Slurm cluster (sandbox/slurm.py) as a user meets it: a login node reached over SSH, and THE cluster of
`gpuops sandbox up --slurm N` (its folder under the state directory, its profile `slurm`).

The login node is a sandbox host (sandbox/host.py: a real sshd on 127.0.0.1, its own keys, no GPUs) in <cluster>/login.
The Slurm commands' wrappers (each sets the cluster's SLURM_CONF, whose AuthInfo names the cluster's munge socket) are
written into its bin/, which its sessions have first on PATH: `ssh login sinfo` and `ssh login 'cd shared && sbatch
job.sh'` drive the cluster, and a job's environment, which sbatch exports, carries SLURM_CONF for its own srun.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import GpuopsError
from ..paths import config_dir, state_dir, write_atomic
from .slurm import cluster_info, layout, start, stop
from .slurm_conf import CLIENT_COMMANDS

PROFILE_NAME = "slurm"


def cluster_dir() -> Path:
    """THE local cluster's folder (`gpuops sandbox up --slurm`): $GPUOPS_SLURM_DIR, else <state dir>/slurm."""
    return Path(os.environ.get("GPUOPS_SLURM_DIR") or state_dir() / "slurm")


def profile_path() -> Path:
    return config_dir() / "profiles" / f"{PROFILE_NAME}.yaml"


def start_login(d: Path, *, address: str = "127.0.0.1", port: int | None = None,
                authorized_keys: list[str] | None = None) -> dict:
    """Start (or keep) the cluster's login node: a sandbox host (real sshd, its own keys, no GPUs) in <d>/login whose
    bin/, first on its sessions' PATH, holds the cluster's Slurm command wrappers: `ssh login sbatch ...` submits to
    this cluster, and a job's environment (exported by sbatch) carries SLURM_CONF for its own srun. Returns the
    sandbox host's state."""
    from . import host

    lay = layout(d)
    st = host.start(lay.login, address=address, port=port, gpus=0, authorized_keys=authorized_keys)
    for command in CLIENT_COMMANDS:
        write_atomic(lay.login / "bin" / command, (lay.bin / command).read_text())
        os.chmod(lay.login / "bin" / command, 0o755)
    return st


def write_profile(d: Path, name: str = PROFILE_NAME) -> Path:
    """The profile of the cluster's login node: host, port, user, key as the sandbox host's; remote_dir the shared
    folder every node sees; `slurm:` with the cluster's partition, every node and its GPUs (cluster_info), so that
    `gpuops verify slurm` checks the whole cluster through Slurm."""
    info = cluster_info(d)
    login = info["login"]
    if not login:
        raise GpuopsError("the local Slurm cluster has no login node", hint="gpuops sandbox up --slurm 4")
    text = f"""# Written by `gpuops sandbox up --slurm {len(info['nodes'])}`: the local Slurm cluster's login node (a real sshd on
# 127.0.0.1; Slurm {info['slurm_version']}: partition {info['partition']}, nodes {','.join(info['nodes'])}, \
{info['gpus_per_node']} emulated GPUs each).
# The shared folder, seen by the login node and every node: {info['shared_dir']}. Regenerated on every `sandbox up`.
host: {login['host']}
port: {login['port']}
user: {login['user']}
key: {login['key']}
remote_dir: {info['shared_dir']}
region: local
price_per_hour: 0
host_key_policy: accept-new
slurm:
  partition: {info['partition']}
  nodes: {len(info['nodes'])}   # every node: `gpuops verify {name}` probes each in one srun step
  gpus_per_node: {info['gpus_per_node']}
"""
    path = config_dir() / "profiles" / f"{name}.yaml"
    write_atomic(path, text)
    return path


def up(nodes: int = 4, *, gpus_per_node: int = 8, gpu: str = "h100-sxm", port: int | None = None,
       profile: str | None = PROFILE_NAME) -> dict:
    """THE local cluster (`gpuops sandbox up --slurm N`): `nodes` nodes and a login node (sshd on `port`, default a
    free one kept across restarts) in cluster_dir(), and the profile `profile` (None: none). Returns cluster_info
    with `started` and `profile_path`."""
    d = cluster_dir()
    info = start(d, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu)
    start_login(d, port=port)
    out = dict(cluster_info(d), started=info["started"])
    out["profile_path"] = str(write_profile(d, profile)) if profile else None
    return out


def down() -> bool:
    """Stop THE local cluster and its login node (see stop)."""
    return stop(cluster_dir())
