"""What `gpuops verify` asks of a Slurm cluster, over the login node's ONE connection (the talking part; the scripts
and parsers are slurm/probe_step.py's, the judgement slurm/cluster_checks.py's):

1. the login node's facts in one execution: sinfo (every partition's nodes, with states, gres and drain reasons),
   `scontrol show partition`, Slurm's version, the user's associations (sacctmgr, on a cluster with accounting);
2. the probe on every node in ONE srun step: its source written from stdin into the shared folder, `srun --nodes=N
   --ntasks-per-node=1 --immediate=S --time=T ...` running it once per node, each task's document tagged with its
   node name; removed after;
3. only when the nodes were busy: why, as Slurm says it (the step's job, and the partition's jobs holding the nodes);
4. with --bench on 2 nodes or more: the all-reduce across them in a second srun step (slurm/allreduce_step.py).
"""
from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ProfileError, RemoteError
from .cluster_checks import parse_assoc, parse_partitions
from .nodes import SinfoNode, parse_sinfo
from .probe_step import LOGIN_COMMAND_LIMIT_S, SETUP_FAILED, StepOutput, StepSpec, login_script, parse_sections, split_step, step_script, \
    tagged_probe
from .states import QueueJob, job_from_scontrol, parse_scontrol

LOGIN_TIMEOUT_S = 60.0


@dataclass
class LoginFacts:
    nodes: list = field(default_factory=list)  # SinfoNode, one per node and partition
    partitions: list = field(default_factory=list)  # scontrol's records
    assoc: Optional[list] = None  # None: no accounting (sacctmgr refused)
    version: Optional[str] = None
    home: Optional[str] = None
    groups: Optional[list] = None  # the user's groups on the login node (None: unknown)


def login_facts(remote, *, timeout: float = LOGIN_TIMEOUT_S) -> LoginFacts:
    """sinfo, the partitions, the version, the associations and $HOME: one remote execution."""
    res = remote.run(login_script(), timeout=timeout)
    sec = parse_sections(res.stdout)
    rc, text = sec.get("sinfo", (None, ""))
    if rc == 127 or rc is None:
        raise ProfileError(f"{remote.profile.host} has no sinfo: the profile's `slurm:` says it is a Slurm cluster's "
                           "login node" + (f" ({text.strip().splitlines()[-1]})" if text.strip() else ""),
                           hint="set host: to the cluster's login node, or remove `slurm:` from the profile")
    if rc == 124:
        raise RemoteError(f"sinfo did not answer within {LOGIN_COMMAND_LIMIT_S} s on the login node "
                          f"{remote.profile.host}: Slurm's controller is not answering",
                          hint="try `sinfo` there; `scontrol ping` says whether slurmctld is up")
    if rc != 0:
        raise RemoteError(f"sinfo failed on the login node {remote.profile.host} (exit {rc}): "
                          f"{(text.strip().splitlines() or ['no output'])[-1]}",
                          hint="is slurmctld reachable from the login node? try `sinfo` there")
    nodes: list[SinfoNode] = parse_sinfo(text)
    prc, ptext = sec.get("partitions", (None, ""))
    arc, atext = sec.get("assoc", (None, ""))
    vtext = sec.get("version", (None, ""))[1].strip()
    return LoginFacts(nodes=nodes, partitions=parse_partitions(ptext) if prc == 0 else [],
                      assoc=parse_assoc(atext) if arc == 0 else None,
                      version=vtext.split()[-1] if vtext else None,
                      home=(sec.get("home", (None, ""))[1].strip() or None),
                      groups=sec["groups"][1].split() if sec.get("groups", (None, ""))[0] == 0 else None)


def probe_nodes(remote, spec: StepSpec, *, folder: str, python: str, probe_source: str) -> StepOutput:
    """The probe once on every node, in one srun step (one remote execution): the tagged probe goes over stdin into
    `folder` (a shell word, ~ kept: the shared folder every node sees), srun runs it, the file goes."""
    token = secrets.token_hex(6)
    script = step_script(spec, folder=folder, python=python, token=token)
    res = _step(remote, script, tagged_probe(probe_source), spec, folder, "cannot write the probe")
    out = split_step(res.stdout, res.stderr)
    out.rc = res.rc
    return out


def why_busy(remote, job_id: Optional[str], partition: Optional[str], *,
             timeout: float = 30.0) -> tuple[Optional[QueueJob], list[str]]:
    """When the step's allocation was not had in time: the step's job as Slurm left it (its Reason: Resources,
    Priority, ReqNodeNotAvail...) and the partition's jobs holding or waiting for nodes (squeue). One execution."""
    parts = []
    if job_id:
        parts.append(f"scontrol --oneliner show job {shlex.quote(job_id)} 2>/dev/null")
    parts.append("echo @@gpuops squeue")
    squeue = ["squeue", "--noheader", "--format=%i|%u|%T|%D|%R"] + ([f"--partition={partition}"] if partition else [])
    parts.append(" ".join(shlex.quote(a) for a in squeue) + " 2>/dev/null | head -n 20")
    res = remote.run("; ".join(parts), timeout=timeout)
    head, _, tail = res.stdout.partition("@@gpuops squeue")
    recs = [r for r in parse_scontrol(head) if r.get("JobId")]
    job = job_from_scontrol(recs[0]) if recs else None
    return job, [ln.strip() for ln in tail.splitlines() if ln.strip()]


def allreduce_nodes(remote, spec: StepSpec, *, folder: str, python: str, worker: str):
    """The all-reduce across the nodes (slurm/allreduce_step.py), in one srun step (one remote execution): the worker
    goes over stdin into `folder` (the shared folder), srun runs it once per node, the file goes. An AllReduceRun."""
    from .allreduce_step import parse_step
    from .allreduce_step import step_script as allreduce_script

    token = secrets.token_hex(6)
    script = allreduce_script(spec, folder=folder, python=python, token=token, salt=secrets.randbelow(1 << 16))
    res = _step(remote, script, worker, spec, folder, "cannot write the all-reduce")
    run = parse_step(res.stdout, res.stderr)
    run.rc = res.rc
    return run


def _step(remote, script: str, stdin: str, spec, folder: str, unwritable: str):
    """One srun step's remote execution (its file over stdin into the shared folder); a folder the login node cannot
    write into (the step script's SETUP_FAILED with `unwritable` in its words) is the profile's error."""
    res = remote.run(script, stdin=stdin, timeout=spec.wait_s + spec.limit_s + 30)
    if res.rc == SETUP_FAILED and unwritable in res.stderr:
        raise ProfileError(f"cannot write into the remote folder on the login node ({folder}): "
                           f"{(res.stderr.strip().splitlines() or [''])[0]}",
                           hint="set remote_dir: in the profile to a folder of yours on the filesystem the nodes share")
    return res
