"""The local Slurm cluster's files, as text (pure: a layout and a spec in, file contents out; sandbox/slurm.py writes
them and runs the daemons).

One folder holds a whole cluster, every path in its files named from its `base` (the folder itself, or a short alias
of it under /tmp: Unix sockets, munge's and each slurmstepd's, must stay within 108 bytes):

  cluster.json          the spec below (name, ports, nodes, GPUs), written last: a cluster is known by it
  etc/slurm.conf        etc/gres.conf (beside it, where Slurm looks)   etc/taskprolog
  munge/                munge.key, munged's socket, pid, log and seed
  ctld/                 slurmctld's StateSaveLocation, pid and log
  db/                   with accounting: MariaDB's data, socket and log, slurmdbd's pid and log (etc/slurmdbd.conf)
  nodes/nK/             node nK: bin/nvidia-smi (its own emulated GPUs, gpu.json), spool/, slurmd.pid, slurmd.log
  dev/nvidia0..         gres.conf's device files (links to /dev/null: Slurm 22.05's gres/gpu drops a GPU without one)
  bin/                  wrappers of the Slurm client commands with this cluster's SLURM_CONF; env.sh for a shell
  shared/               the shared folder (the login node and every node see it: one machine)
  login/                the login node, a sandbox host (sandbox/host.py) whose bin/ holds the wrappers too
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

CLIENT_COMMANDS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sdiag", "sinfo",
                   "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")
PARTITION = "gpu"

# Slurm's clocks, shortened for a cluster on one machine (each measured in tests/sandbox/test_slurm_cluster_e2e.py):
#   SlurmdTimeout: a node whose slurmd stops answering is DOWN after this many seconds (22.05 pings every third):
#     a lost node is DOWN and its --requeue job requeued about 9 s after it died (3 s: about 6 s, but a slurmd
#     slowed by a loaded 2-core machine would be taken for dead);
#   MessageTimeout, TCPTimeout: how long one RPC (a ping of a dead node) may take;
#   cred_expire: a job step's credential lifetime, and how long a requeued job waits before it may start again
#     (Slurm 22.05 refuses a value under 5);
#   KillWait: between SIGTERM and SIGKILL at a time limit or scancel;
#   MinJobAge: how long a finished job stays in `scontrol show job` (without accounting, the only record of its
#     ending): Slurm's default, kept.
TIMERS = {"SlurmdTimeout": 5, "MessageTimeout": 3, "TCPTimeout": 2, "cred_expire": 5, "KillWait": 2,
          "MinJobAge": 300, "BatchStartTimeout": 10}


@dataclass
class Spec:
    """What a cluster is: its name (Slurm's ClusterName, unique per cluster), nodes, ports and clocks."""

    name: str
    nodes: list[str]
    ctld_port: int
    node_ports: dict[str, int]
    user: str
    gpus_per_node: int = 8
    gpu: str = "h100-sxm"
    cpus_per_node: int = 16
    memory_mb: int = 64000
    partition: str = PARTITION
    timers: dict = field(default_factory=lambda: dict(TIMERS))
    accounting: bool = False  # slurmdbd and a private MariaDB (sandbox/slurm_accounting.py): sacct answers
    db_port: int = 0
    dbd_port: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Spec":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def same_shape(self, other: "Spec") -> bool:
        """Would these two clusters be the same one (a running cluster kept, not restarted)?"""
        keys = ("nodes", "gpus_per_node", "gpu", "cpus_per_node", "memory_mb", "partition", "timers", "user",
                "accounting")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(1, count + 1)]


@dataclass(frozen=True)
class Layout:
    """Where each of a cluster's files lives, named from `base`."""

    base: Path

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.base / "etc" / "gres.conf"

    @property
    def taskprolog(self) -> Path:
        return self.base / "etc" / "taskprolog"

    @property
    def munge(self) -> Path:
        return self.base / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.sock"

    @property
    def dbd_conf(self) -> Path:
        return self.base / "etc" / "slurmdbd.conf"

    @property
    def db(self) -> Path:
        return self.base / "db"

    @property
    def ctld(self) -> Path:
        return self.base / "ctld"

    def node(self, name: str) -> Path:
        return self.base / "nodes" / name

    @property
    def dev(self) -> Path:
        return self.base / "dev"

    @property
    def bin(self) -> Path:
        return self.base / "bin"

    @property
    def env_file(self) -> Path:
        return self.base / "env.sh"

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    @property
    def login(self) -> Path:
        return self.base / "login"


def slurm_conf(spec: Spec, lay: Layout) -> str:
    t = spec.timers
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={spec.node_ports[n]} "
        f"CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb}"
        + (f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else "") + " State=UNKNOWN"
        for n in spec.nodes)
    nodes_dir = lay.base / "nodes"
    return f"""# written by gpuops (sandbox/slurm.py): a local Slurm cluster, every daemon on 127.0.0.1 as {spec.user}
ClusterName={spec.name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={spec.ctld_port}
SlurmUser={spec.user}
SlurmdUser={spec.user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={lay.munge_socket},cred_expire={t['cred_expire']}
StateSaveLocation={lay.ctld / 'state'}
SlurmctldPidFile={lay.ctld / 'slurmctld.pid'}
SlurmctldLogFile={lay.ctld / 'slurmctld.log'}
SlurmdSpoolDir={nodes_dir}/%n/spool
SlurmdPidFile={nodes_dir}/%n/slurmd.pid
SlurmdLogFile={nodes_dir}/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# the nodes say what this file says they have (16 CPUs on a 2-core machine: tasks are not bound, task/none)
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={lay.taskprolog}
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_min_interval=0
{_accounting(spec, lay)}JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
SlurmdTimeout={t['SlurmdTimeout']}
SlurmctldTimeout=10
MessageTimeout={t['MessageTimeout']}
TCPTimeout={t['TCPTimeout']}
KillWait={t['KillWait']}
MinJobAge={t['MinJobAge']}
BatchStartTimeout={t['BatchStartTimeout']}
InactiveLimit=0
{node_lines}
PartitionName={spec.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _accounting(spec: Spec, lay: Layout) -> str:
    if not spec.accounting:
        return "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
    # a client's connection to slurmdbd takes munge's socket from AccountingStoragePass, not AuthInfo
    return ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={spec.dbd_port}\nAccountingStoragePass={lay.munge_socket}\n"
            "JobAcctGatherType=jobacct_gather/linux\nJobAcctGatherFrequency=5\n")


def slurmdbd_conf(spec: Spec, lay: Layout) -> str:
    """slurmdbd.conf (slurmdbd reads it beside SLURM_CONF; it must be private to SlurmUser): the cluster's own
    MariaDB on 127.0.0.1:db_port, its root without a password (mariadb-install-db's, reachable by this user only
    through this folder's port and socket)."""
    return f"""# written by gpuops (sandbox/slurm_accounting.py)
AuthType=auth/munge
AuthInfo=socket={lay.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={spec.dbd_port}
SlurmUser={spec.user}
PidFile={lay.db / 'slurmdbd.pid'}
LogFile={lay.db / 'slurmdbd.log'}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={spec.db_port}
StorageUser=root
StorageLoc=slurm_acct_db
"""


def gres_conf(spec: Spec, lay: Layout) -> str:
    if not spec.gpus_per_node:
        return "# no GPUs\n"
    last = spec.gpus_per_node - 1
    files = f"{lay.dev}/nvidia[0-{last}]" if last else f"{lay.dev}/nvidia0"
    return ("# Slurm 22.05's gres/gpu keeps only GPUs with a device file: links to /dev/null (task/none binds none)\n"
            f"Name=gpu File={files}\n")


def taskprolog(lay: Layout) -> str:
    """Run by slurmd before every task (the batch script and each srun task): what it prints as `export K=V` lands
    in the task's environment. Node nK's emulated GPU tools come first on PATH (any other node's are removed: a job
    submitted from inside a job), nvidia-smi reads nK's gpu.json, and the node's session mark (sandbox/host.py)
    makes the task one of nK's processes for its emulated GPUs and its kill_gpu_jobs."""
    nodes = shlex.quote(str(lay.base / "nodes"))
    return f"""#!/bin/sh
# written by gpuops: node $SLURMD_NODENAME's own emulated GPUs for each task
nodes={nodes}
nd="$nodes/$SLURMD_NODENAME"
[ -d "$nd" ] || exit 0
keep=$(printf '%s' "$PATH" | tr ':' '\\n' | grep -v "^$nodes/" | tr '\\n' ':')
echo "export PATH=$nd/bin:${{keep%:}}"
echo "export GPUOPS_SANDBOX_DIR=$nd"
[ -f "$nd/session_mark" ] && echo "export GPUOPS_SANDBOX_SESSION=$(cat "$nd/session_mark")"
exit 0
"""


def client_wrapper(command: str, lay: Layout, real: str) -> str:
    return (f"#!/bin/sh\n# written by gpuops: {command} of the local Slurm cluster in {lay.base}\n"
            f"SLURM_CONF={shlex.quote(str(lay.conf))}; export SLURM_CONF\n"
            f"exec {shlex.quote(real)} \"$@\"\n")


def env_file(lay: Layout) -> str:
    return (f"# written by gpuops: `. {lay.env_file}` and this shell drives the local Slurm cluster\n"
            f"SLURM_CONF={shlex.quote(str(lay.conf))}; export SLURM_CONF\n"
            f"PATH={shlex.quote(str(lay.bin))}:\"$PATH\"; export PATH\n")
