"""The batch script gpuops submits to Slurm, and sbatch's argument list (pure): a readable script (`gpuops train
--dry-run` prints it) that a user could submit by hand.

What it holds, in order:
  - #SBATCH lines: name, partition, account, QOS, nodes with one task per node, GPUs per node (`--gres=gpu[:type]:N`
    or `--gpus-per-node`), CPUs per task, the time limit, `--requeue`, `--signal=B:USR1@120` (why: see SIGNAL_NOTE),
    the log on the shared folder (`slurm-%j.out`, output and error in one file), `--exclude`, `--nodelist`, and the
    profile's extra lines. Every value is checked to be one an #SBATCH line can carry (sbatch splits it on spaces);
    anything else is refused before anything is submitted.
  - the run's folder, a line per attempt in its `attempts` file (`<epoch> <restart count> <job id> <node list>`: the
    nodes each attempt ran on, so a node that failed the job can be named), and --recover's bound on requeues;
  - the environment exactly as a single host's launch sets it (jobs/scripts.venv_lines: the profile's python
    environment first on PATH; the preset, profile and --env variables, every value shell-quoted; secrets sourced
    from a 0600 file the talking part writes, never on a command line), GPUOPS_RUN_ID and GPUOPS_RUN_DIR;
  - the checkpoint to resume from (RESUME_FILE, below);
  - srun starting, once on every node, torchrun with c10d rendezvous on the allocation's first node (`scontrol show
    hostnames "$SLURM_JOB_NODELIST" | head -n1`), or the job's plain command (a .sh, `python x.py`, `uv run ...`).

Resuming after a requeue. Slurm requeues a job (a node failed, it was preempted) by running the same batch script
again, from the top, with the environment captured when it was submitted: nothing in the script or its environment
can name a checkpoint written after the submission. So the script reads the checkpoint at start from a file in this
run's own folder, RESUME_FILE (`<run dir>/resume_from`): one line, the path of the newest complete checkpoint of
this run, which gpuops writes (judged complete by its evidence, as for a single host) before it submits and whenever
it sees a newer one. The script exports it as GPUOPS_RESUME_FROM, as `gpuops run --recover` does on a single host;
without the file, GPUOPS_RESUME_FROM stays what the environment says (usually unset: a fresh start). The file is read
as data (`read -r`), never run; and being this run's, it can only name this run's checkpoints.

The script is bash (sbatch runs it with its #! line; the srun wrapper and the wait loop use bash).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..errors import UsageError
from ..jobs.launchers import Fleet, torchrun_argv
from ..jobs.scripts import argv_command, venv_lines
from ..remote.shell import shell_command, shell_path

SCRIPT_NAME = "job.sbatch"  # in the run's folder on the shared filesystem
LOG_NAME = "slurm-%j.out"  # output and error of every attempt, one file per job id
RESUME_FILE = "resume_from"
ATTEMPTS_FILE = "attempts"
TIME_LIMIT_FILE = "time_limit"  # appears when Slurm's warning arrives (GPUOPS_TIME_LIMIT_FILE names it)
SIGNAL_NOTE = (
    "# --signal=B:USR1@{s}: {s} s before the time limit Slurm sends SIGUSR1 to this batch shell only (B:). Without B:\n"
    "# it would go to every process of every step, and SIGUSR1's default action ends a process: torchrun, and a\n"
    "# training script that does not catch it, would die {s} s early. The shell writes $GPUOPS_TIME_LIMIT_FILE and\n"
    "# says so in the log; a script that checks for that file saves a checkpoint. {s} s: time to write one to the\n"
    "# shared filesystem before Slurm's SIGTERM at the limit (and its SIGKILL KillWait later, 30 s by default).")
PORT_BASE = 20000  # the rendezvous port when none is given: PORT_BASE + job id % 10000 (below Linux's ephemeral ports)

_NAME = re.compile(r"[A-Za-z0-9._+-]{1,200}")
_LIST = re.compile(r"[A-Za-z0-9._,+-]{1,500}")  # partitions, accounts, QOS (a partition may be a comma list)
_HOSTS = re.compile(r"[A-Za-z0-9._,\[\]-]{1,4000}")
_TIME = re.compile(r"(?:\d+-)?\d+(?::\d+){0,2}|(?:\d+-\d+)|UNLIMITED|INFINITE|infinite|unlimited")
_EXTRA = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*(?:[= ][^\s'\"\\`$;|&<>]+)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BAD_PATH = re.compile(r"[\s'\"\\`$]|[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class BatchJob:
    """What the batch script is made of. Paths are the shared filesystem's, absolute (an #SBATCH line does not
    expand ~: the talking part resolves it on the login node)."""
    run_id: str
    run_dir: str  # the run's folder (the log, the resume file, the attempts)
    project_dir: str  # the project folder, where the job runs (the profile's remote_dir)
    argv: tuple = ()  # the job's command line (jobs.plan.job_argv: `python3 -u train.py --lr 3e-4`)
    command: Optional[str] = None  # or shell text, run by bash on every node (instead of argv)
    launcher: str = "torchrun"  # torchrun (c10d across the nodes) | none (the command once per node)
    python: str = "python3"  # the profile's python: torchrun's, and the venv put first on PATH
    nodes: int = 1
    gpus_per_node: int = 0  # 0: no GPU asked (a CPU cluster, the local rehearsal)
    gpu_type: Optional[str] = None  # --gres=gpu:h100:8
    gpu_option: str = "gres"  # gres (--gres=gpu:N) | gpus-per-node (--gpus-per-node=N)
    procs_per_node: Optional[int] = None  # torchrun's --nproc_per_node (default: the GPUs per node, else 1)
    name: Optional[str] = None  # Slurm's job name (default gpuops-<run id>)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None  # Slurm's form: minutes, [D-]HH:MM:SS ...
    cpus_per_task: Optional[int] = None
    requeue: bool = True
    signal_before_s: Optional[int] = 120  # None: no warning signal
    exclude: tuple = ()  # nodes (or Slurm host lists) to keep the job off
    nodelist: tuple = ()
    extra_sbatch: tuple = ()  # more `--option=value` for #SBATCH lines (the profile's)
    env: Mapping[str, str] = field(default_factory=dict)  # jobs.envplan.EnvPlan.exported
    unset: tuple = ()  # EnvPlan.unset
    rdzv_port: Optional[int] = None  # None: PORT_BASE + the job id % 10000, the same on every node
    max_requeues: Optional[int] = None  # --recover N: a later attempt refuses to start
    checkpoints: Optional[str] = None  # the run's checkpoint folder (absolute), judged on requeue

    @property
    def job_name(self) -> str:
        return self.name or re.sub(r"[^A-Za-z0-9._+-]", "-", f"gpuops-{self.run_id}")[:200]

    @property
    def nproc(self) -> int:
        return self.procs_per_node or self.gpus_per_node or 1

    @property
    def log_path(self) -> str:
        return f"{self.run_dir.rstrip('/')}/{LOG_NAME}"

    @property
    def script_path(self) -> str:
        return f"{self.run_dir.rstrip('/')}/{SCRIPT_NAME}"


def _check(value: str, rx, what: str, hint: str = "") -> str:
    value = str(value)
    if not rx.fullmatch(value):
        raise UsageError(f"slurm: {what} {value!r} cannot go on an #SBATCH line (sbatch splits it on spaces; quotes, "
                         "newlines and shell characters are refused)", hint=hint or None)
    return value


def _path(value: str, what: str) -> str:
    if not value.startswith("/") or _BAD_PATH.search(value):
        raise UsageError(f"slurm: {what} {value!r} must be an absolute path without spaces, quotes or shell "
                         "characters (Slurm reads it from an #SBATCH line and does not expand ~)",
                         hint="give the shared folder's absolute path (remote_dir on the shared filesystem)")
    return value


def allocation_options(*, partition: Optional[str], account: Optional[str], qos: Optional[str], gpus_per_node: int,
                       gpu_type: Optional[str], gpu_option: str, exclude=(), nodelist=(), check: bool = True) -> list:
    """The options that say where a job may run and what it holds there, the same for the batch job (#SBATCH lines)
    and verify's srun step (slurm/probe_step.py): partition, account, QOS, the GPUs per node (`--gres=gpu[:type]:N`
    or `--gpus-per-node`), the nodes to exclude and the node list. check: every value one an #SBATCH line can carry
    (an srun argument list is quoted word by word instead)."""
    def ok(value, rx, what, hint=""):
        return _check(value, rx, what, hint) if check else str(value)

    out = [f"--{opt}={ok(value, _LIST, 'the ' + opt)}" for opt, value in
           (("partition", partition), ("account", account), ("qos", qos)) if value]
    if gpus_per_node:
        kind = f"{ok(gpu_type, _NAME, 'the GPU type')}:" if gpu_type else ""
        if gpu_option == "gpus-per-node":
            out.append(f"--gpus-per-node={kind}{int(gpus_per_node)}")
        elif gpu_option == "gres":
            out.append(f"--gres=gpu:{kind}{int(gpus_per_node)}")
        else:
            raise UsageError(f"slurm: gpu_option {gpu_option!r}: gres or gpus-per-node")
    if exclude:
        out.append(f"--exclude={ok(','.join(exclude), _HOSTS, 'the nodes to exclude')}")
    if nodelist:
        out.append(f"--nodelist={ok(','.join(nodelist), _HOSTS, 'the node list')}")
    return out


def sbatch_lines(job: BatchJob) -> list[str]:
    """The #SBATCH lines (every value checked), with the note on --signal."""
    if job.nodes < 1 or job.gpus_per_node < 0 or job.nproc < 1:
        raise UsageError(f"slurm: {job.nodes} node(s) with {job.gpus_per_node} GPU(s) each is no job")
    lines = [f"--job-name={_check(job.job_name, _NAME, 'the job name')}", f"--nodes={int(job.nodes)}",
             "--ntasks-per-node=1"]
    lines += allocation_options(partition=job.partition, account=job.account, qos=job.qos,
                                gpus_per_node=job.gpus_per_node, gpu_type=job.gpu_type, gpu_option=job.gpu_option,
                                exclude=job.exclude, nodelist=job.nodelist)
    if job.cpus_per_task:
        lines.append(f"--cpus-per-task={int(job.cpus_per_task)}")
    if job.time:
        lines.append(f"--time={_check(job.time, _TIME, 'the time limit', 'minutes, or [days-]hours:minutes:seconds')}")
    lines.append("--requeue" if job.requeue else "--no-requeue")
    if job.signal_before_s:
        lines.append(f"--signal=B:USR1@{int(job.signal_before_s)}")
    log = _path(job.log_path, "the run folder").replace("%", "%%").replace("%%j", "%j")
    lines += [f"--output={log}", f"--error={log}"]
    lines += [_check(x, _EXTRA, "the extra option", "one `--option=value` per line") for x in job.extra_sbatch]
    out = []
    for line in lines:
        if line.startswith("--signal=") and job.signal_before_s:
            out.append(SIGNAL_NOTE.format(s=int(job.signal_before_s)))
        out.append(f"#SBATCH {line}")
    return out


def _env_lines(job: BatchJob) -> list[str]:
    bad = [k for k in [*job.env, *job.unset] if not _ENV_NAME.fullmatch(str(k))]
    if bad:  # validated where profiles and presets load; never let a name run as a command
        raise UsageError(f"not a variable name: {bad[0]!r}")
    return [f"unset {k}" for k in job.unset] + [f"{k}={shlex.quote(str(v))}; export {k}" for k, v in job.env.items()]


# each srun task (one per node) learns its node's rank, as a fleet's node does (jobs.launchers.node_env)
NODE_WRAPPER = ("bash -c 'GPUOPS_NODE_RANK=${SLURM_NODEID:-0}; NODE_RANK=$GPUOPS_NODE_RANK; "
                "export GPUOPS_NODE_RANK NODE_RANK; exec \"$@\"' gpuops-node")


def job_command(job: BatchJob) -> str:
    """The shell text srun runs on every node: torchrun around the job (c10d rendezvous on the first node, every
    node's rank assigned by the rendezvous), or the job itself. Values quoted; $SLURM_* and the head node expand in
    the batch shell, the same for every node."""
    if job.launcher not in ("torchrun", "none"):
        raise UsageError(f"slurm: launcher {job.launcher!r}: torchrun or none")
    if job.command is not None:
        if job.launcher == "torchrun":
            raise UsageError("slurm: a shell command runs once per node (launcher none); torchrun needs the job's "
                             "command line (argv)")
        return "bash -c " + shlex.quote(job.command)
    if not job.argv:
        raise UsageError("slurm: the job has no command")
    if job.launcher == "none":
        return argv_command(list(job.argv), job.python)
    # torchrun's own rule for the job's words (a .py keeps its script, anything else runs with --no-python): the
    # words after the fixed head that torchrun_argv puts before them
    full = torchrun_argv(list(job.argv), python=job.python, fleet=Fleet(("head",)), rank=0, nproc_per_node=job.nproc)
    tail = full[full.index("--nproc_per_node") + 2:]
    return (f"{shell_command(job.python)} -m torch.distributed.run --nnodes=\"$SLURM_NNODES\" "
            f"--nproc_per_node={int(job.nproc)} --rdzv_id=\"$SLURM_JOB_ID\" --rdzv_backend=c10d "
            f"--rdzv_endpoint=\"$gpuops_head:$gpuops_port\" " + " ".join(shlex.quote(w) for w in tail))


def batch_script(job: BatchJob) -> str:
    """The whole batch script (see the module's docstring)."""
    D = shell_path(_path(job.run_dir.rstrip("/"), "the run folder"))
    port = f"$(({PORT_BASE} + SLURM_JOB_ID % 10000))" if job.rdzv_port is None else str(int(job.rdzv_port))
    cmd = job_command(job)
    srun = ["srun", "--nodes=\"$SLURM_NNODES\"", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label"]
    if job.cpus_per_task:  # srun no longer takes it from the allocation (Slurm 22.05)
        srun.append("--cpus-per-task=\"$SLURM_CPUS_PER_TASK\"")
    lines = ["#!/bin/bash", f"# gpuops batch script for run {shlex.quote(job.run_id)} (generated; submitted with "
             f"sbatch, requeued by Slurm as it is)", *sbatch_lines(job), "",
             f"D={D}", 'mkdir -p "$D" || exit 127',
             f'echo "$(date +%s) ${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_ID $SLURM_JOB_NODELIST" >> "$D/{ATTEMPTS_FILE}"']
    if job.max_requeues is not None:
        n = int(job.max_requeues)
        lines += [f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt {n} ]; then',
                  f'  echo "gpuops: requeued ${{SLURM_RESTART_COUNT}} times, more than --recover {n} allows: not '
                  'starting again" >&2', "  exit 1", "fi"]
    lines += _judge_lines(job)
    lines += ['if [ -f "$D/secrets.env" ]; then . "$D/secrets.env"; fi',  # 0600, written by gpuops; kept for requeues
              *venv_lines(job.python), *_env_lines(job),
              f"GPUOPS_RUN_ID={shlex.quote(job.run_id)}; export GPUOPS_RUN_ID",
              'GPUOPS_RUN_DIR="$D"; export GPUOPS_RUN_DIR',
              *([f"GPUOPS_CHECKPOINT_DIR={shell_path(job.checkpoints)}; export GPUOPS_CHECKPOINT_DIR"]
                if job.checkpoints else []),
              f'GPUOPS_TIME_LIMIT_FILE="$D/{TIME_LIMIT_FILE}"; export GPUOPS_TIME_LIMIT_FILE',
              'rm -f "$GPUOPS_TIME_LIMIT_FILE"',
              f'if [ -s "$D/{RESUME_FILE}" ]; then  # the newest complete checkpoint of this run, written by gpuops',
              f'  IFS= read -r GPUOPS_RESUME_FROM < "$D/{RESUME_FILE}"; export GPUOPS_RESUME_FROM',
              "  printf 'gpuops: resuming from %s\\n' \"$GPUOPS_RESUME_FROM\"",
              "fi",
              "gpuops_time_limit() {",
              "  gpuops_trapped=1",
              '  date +%s > "$GPUOPS_TIME_LIMIT_FILE"',
              f"  echo \"gpuops: Slurm's time limit is {int(job.signal_before_s or 0)} s away (SIGUSR1): save a "
              "checkpoint now\" >&2",
              "}",
              "trap gpuops_time_limit USR1",
              'gpuops_head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
              "# the first node's address as Slurm reaches it (NodeAddr: its name unless the cluster gives another)",
              'gpuops_addr=$(scontrol --oneliner show node "$gpuops_head" 2>/dev/null | '
              "sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
              'if [ -n "$gpuops_addr" ]; then gpuops_head=$gpuops_addr; fi',
              f"gpuops_port={port}",
              'GPUOPS_MASTER_ADDR=$gpuops_head; GPUOPS_MASTER_PORT=$gpuops_port; GPUOPS_NUM_NODES=$SLURM_NNODES',
              f"GPUOPS_GPUS_PER_NODE={int(job.gpus_per_node)}",
              "MASTER_ADDR=$gpuops_head; MASTER_PORT=$gpuops_port",
              "export GPUOPS_MASTER_ADDR GPUOPS_MASTER_PORT GPUOPS_NUM_NODES GPUOPS_GPUS_PER_NODE MASTER_ADDR MASTER_PORT",
              f"cd {shell_path(_path(job.project_dir, 'the project folder'))} || "
              f"{{ echo {shlex.quote('gpuops: cannot enter the project folder ' + job.project_dir)} >&2; exit 127; }}",
              "# srun in the background and a wait that a trapped signal interrupts: bash runs a trap only between",
              "# commands, so a foreground srun would hold SIGUSR1's note back until the job had ended",
              f"{' '.join(srun)} {NODE_WRAPPER} {cmd} &",
              "gpuops_srun=$!",
              "# a wait a trap interrupted says 128 + the signal, not srun's status: wait again (bash keeps the status of",
              "# a background child that ended meanwhile until a wait collects it); a wait no trap cut short is srun's",
              'while :; do gpuops_trapped=0; wait "$gpuops_srun"; gpuops_rc=$?; [ "$gpuops_trapped" = 1 ] || break; done',
              'exit "$gpuops_rc"']
    return "\n".join(lines) + "\n"


def _judge_lines(job: BatchJob) -> list[str]:
    """A requeued attempt (SLURM_RESTART_COUNT > 0) first chooses the checkpoint it resumes from: the run folder's
    resume_judge.py (slurm/resume.py) judges the run's checkpoint folder and writes RESUME_FILE, read just after."""
    if not job.checkpoints:
        return []
    from .resume import JUDGE_NAME

    folder = shell_path(_path(job.checkpoints.rstrip("/") or "/", "the checkpoint folder"))
    return [f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && [ -f "$D/{JUDGE_NAME}" ]; then',
            "  # requeued: the newest complete checkpoint of this run, judged here by its evidence (slurm/resume.py)",
            f'  {shell_command(job.python)} "$D/{JUDGE_NAME}" "$D" {folder} "$SLURM_RESTART_COUNT" "$SLURM_JOB_ID" || '
            "echo \"gpuops: could not judge this run's checkpoints; the resume file stays as it was\" >&2",
            "fi"]


def sbatch_argv(script_path: str, *, test_only: bool = False, exclude: tuple = (), extra: tuple = ()) -> list[str]:
    """`sbatch --parsable [--test-only] [--exclude=...] SCRIPT`: the job id on stdout (`123` or `123;cluster`).
    --test-only asks Slurm whether and when it would start the job, without submitting it (verify's check of the
    partition, account, QOS and gres); --exclude on the command line wins over the script's (a node that failed
    the job, kept off the next attempt). The talking part quotes each word."""
    argv = ["sbatch", "--parsable"] + (["--test-only"] if test_only else [])
    if exclude:
        argv.append(f"--exclude={_check(','.join(exclude), _HOSTS, 'the nodes to exclude')}")
    return argv + [_check(x, _EXTRA, "the option") for x in extra] + [script_path]


def job_id_of(stdout: str) -> Optional[str]:
    """The job id `sbatch --parsable` printed (`123`, `123;cluster`), or None."""
    for line in (stdout or "").splitlines():
        m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line)
        if m:
            return m.group(1)
    return None


def resume_text(checkpoint: str) -> str:
    """What gpuops writes to RESUME_FILE: the checkpoint's path, one line (refused if it holds a newline)."""
    if "\n" in checkpoint or "\r" in checkpoint or not checkpoint.strip():
        raise UsageError(f"slurm: {checkpoint!r} cannot be a checkpoint path (one line, not empty)")
    return checkpoint + "\n"


def parse_attempts(text: str) -> list[dict]:
    """The run's `attempts` file: [{"at", "restarts", "job_id", "node_list"}] in the order they started."""
    out = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            out.append({"at": int(parts[0]), "restarts": int(parts[1]), "job_id": parts[2],
                        "node_list": parts[3] if len(parts) > 3 else ""})
    return out
