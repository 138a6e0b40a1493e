"""verify's probe on every node of an allocation in ONE srun step (pure, stdlib only): the step's argument list, the
probe's wrapping (each task's JSON document cut into short lines tagged with its node name, so srun's interleaved
output of N tasks splits back per node), the login node's facts script, and the parsers of what comes back.

The talking part is slurm/cluster.py; verify's probe itself is remote/probe.py, unchanged.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Optional

from .batch import allocation_options
from .nodes import SINFO_FORMAT

NODE_MARK = "GPUOPS-NODE"  # a task's JSON document, cut: `GPUOPS-NODE <node> <i>/<n> <chunk>`
TASK_MARK = "GPUOPS-TASK"  # a task started: `GPUOPS-TASK <SLURM_PROCID> <SLURMD_NODENAME>`
SECTION_MARK = "@@gpuops"
CHUNK = 700  # characters of JSON per line: well under the 1024-byte buffers Slurm's I/O forwards lines in
JOB_NAME = "gpuops-verify"
SETUP_FAILED = 97
LOGIN_COMMAND_LIMIT_S = 20  # each Slurm command on the login node (a controller that does not answer: rc 124)  # the step script could not make its folder or write the probe there

# Put ahead of the probe's source in the file every task runs: the probe's one `sys.stdout.write(doc)` and flush
# become tagged lines written straight to fd 1 (the probe ends with os._exit: nothing is left in a buffer).
TAG_PRELUDE = '''import os as _gpuops_os, sys as _gpuops_sys


class _GpuopsTagged(object):
    """stdout of a task of gpuops' verify step: what is written comes out as tagged lines of %(chunk)d characters."""
    encoding = "utf-8"

    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)
        return len(text)

    def isatty(self):
        return False

    def flush(self):
        text, self.parts = "".join(self.parts).strip("\\n"), []
        if not text:
            return
        node = _gpuops_os.environ.get("SLURMD_NODENAME") or _gpuops_os.uname()[1]
        n = (len(text) + %(chunk)d - 1) // %(chunk)d
        lines = "".join("%(mark)s %%s %%d/%%d %%s\\n" %% (node, i, n, text[i * %(chunk)d:(i + 1) * %(chunk)d])
                        for i in range(n))
        data = lines.encode("utf-8", "replace")
        while data:
            data = data[_gpuops_os.write(1, data):]


_gpuops_sys.stdout = _GpuopsTagged()
''' % {"chunk": CHUNK, "mark": NODE_MARK}

# Each task first says which node it is, then becomes the probe (`sh -c SCRIPT gpuops-probe PYTHON FILE`)
TASK_WRAPPER = f'echo "{TASK_MARK} $SLURM_PROCID $SLURMD_NODENAME"; exec "$@"'


def tagged_probe(probe_source: str) -> str:
    """The file every task runs: the tagging prelude, then the probe as gather sends it (PARAMS line included)."""
    return TAG_PRELUDE + probe_source


# -- the login node's facts: one execution ------------------------------------------------------------------------
def login_script() -> str:
    """sinfo (every partition's nodes, hidden ones too), the partitions (scontrol), Slurm's version, the user's
    associations (the accounts and QOS Slurm would accept: sacctmgr, when the cluster has accounting), $HOME and the
    user's groups (a partition's AllowGroups), each a section."""
    sections = [
        ("sinfo", " ".join(shlex.quote(a) for a in ["sinfo", "--all", "--noheader", "--Node",
                                                     f"--format={SINFO_FORMAT}"])),
        ("partitions", "scontrol --all --oneliner show partition"),
        ("version", "sinfo --version"),
        ("assoc", 'sacctmgr --noheader --parsable2 show assoc where user="$(id -un)" format=Account,Partition,QOS'),
        ("home", 'printf "%s\\n" "$HOME"'),
        ("groups", "id -Gn"),
    ]
    limit = 'T=""; command -v timeout >/dev/null 2>&1 && T="timeout %d"; ' % LOGIN_COMMAND_LIMIT_S
    return limit + "".join(f"echo {SECTION_MARK} {name}; {'' if name in ('home', 'groups') else '$T '}{cmd} 2>&1; "
                           f"echo \"{SECTION_MARK} rc $?\"; " for name, cmd in sections)


def parse_sections(text: str) -> dict[str, tuple[Optional[int], str]]:
    """login_script's output -> {section: (exit code, its text)}."""
    out: dict[str, tuple[Optional[int], str]] = {}
    name, lines = None, []
    for line in (text or "").splitlines():
        if line.startswith(SECTION_MARK + " "):
            word = line[len(SECTION_MARK) + 1:].strip()
            if word.startswith("rc ") and name is not None:
                rc = word[3:].strip()
                out[name] = (int(rc) if rc.lstrip("-").isdigit() else None, "\n".join(lines))
                name, lines = None, []
            else:
                name, lines = word, []
        elif name is not None:
            lines.append(line)
    return out


# -- the step -----------------------------------------------------------------------------------------------------
@dataclass
class StepSpec:
    """What the step asks Slurm for: resolved from the profile's `slurm:` and what sinfo said."""
    nodes: int
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    nodelist: list = field(default_factory=list)
    exclude: list = field(default_factory=list)
    gpus_per_node: int = 0
    gpu_type: Optional[str] = None
    gpu_option: str = "gres"
    wait_s: int = 20  # --immediate: how long the allocation may take before verify says the nodes are busy
    limit_s: int = 240  # the probe's own time, the step's --time (rounded up to minutes) and the remote timeout

    def time_minutes(self) -> int:
        return max(1, math.ceil(self.limit_s / 60))


def srun_argv(spec: StepSpec) -> list[str]:
    """srun's options for the verify step (one task per node, each task its node's probe)."""
    argv = ["srun", f"--job-name={JOB_NAME}", f"--nodes={spec.nodes}", "--ntasks-per-node=1", "--label",
            "--input=none", f"--immediate={max(1, int(spec.wait_s))}", f"--time={spec.time_minutes()}"]
    return argv + allocation_options(partition=spec.partition, account=spec.account, qos=spec.qos,
                                     gpus_per_node=spec.gpus_per_node, gpu_type=spec.gpu_type,
                                     gpu_option=spec.gpu_option, exclude=spec.exclude, nodelist=spec.nodelist,
                                     check=False)


def step_script(spec: StepSpec, *, folder: str, python: str, token: str) -> str:
    """The one remote execution of the step: make `folder` (a shell word: shell_path's, ~ kept), write the tagged
    probe from stdin into it, srun it on every node (each task's cwd that folder, on the shared filesystem), remove
    it. Every value is quoted; the python is the profile's, its first word keeping a leading ~."""
    return file_step(srun_argv(spec), folder=folder, python=python, rel=f".gpuops/verify/probe-{token}.py",
                     wrapper=TASK_WRAPPER, name="gpuops-probe", what="the probe")


def file_step(srun_words: list, *, folder: str, python: str, rel: str, wrapper: str, name: str, what: str) -> str:
    """One remote execution that runs a python file on every node of an srun step: the file comes over stdin into
    `folder` (a shell word: the shared folder every node sees) as `rel`, srun runs `sh -c wrapper` around the
    profile's python on it once per node, the file goes. A folder it cannot write into: `cannot write <what>`, exit
    SETUP_FAILED. Every value is quoted; the python's first word keeps a leading ~."""
    from ..remote.shell import shell_command

    srun = " ".join(shlex.quote(a) for a in srun_words)
    task = " ".join(shlex.quote(a) for a in ["sh", "-c", wrapper, name])
    return (f"mkdir -p {folder}/.gpuops/verify && cd {folder} && cat > {shlex.quote(rel)} || "
            f"{{ echo 'gpuops: cannot write {what} into the remote folder' >&2; exit {SETUP_FAILED}; }}; "
            f"{srun} {task} {shell_command(python)} {shlex.quote(rel)}; rc=$?; rm -f {shlex.quote(rel)}; exit $rc")


@dataclass
class StepOutput:
    docs: dict = field(default_factory=dict)  # node -> its probe's JSON text (complete)
    tasks: dict = field(default_factory=dict)  # task number -> node
    task_errors: dict = field(default_factory=dict)  # node -> its task's stderr lines (srun's label)
    partial: list = field(default_factory=list)  # nodes whose document came cut
    srun_errors: list = field(default_factory=list)  # srun's own lines (`srun: error: ...`)
    job_id: Optional[str] = None  # `srun: job N queued and waiting for resources`
    rc: Optional[int] = None  # srun's exit status

    @property
    def nodes(self) -> list[str]:
        """Every node the step reached (a task started there), in task order, then any other that sent a document."""
        seen = [self.tasks[k] for k in sorted(self.tasks)]
        return seen + sorted(n for n in self.docs if n not in seen)


_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_QUEUED = re.compile(r"srun: job (\d+) queued")


def split_step(stdout: str, stderr: str) -> StepOutput:
    """The step's output (srun --label: `N: line` per task line) back per node."""
    out = StepOutput()
    chunks: dict[str, dict[int, str]] = {}
    totals: dict[str, int] = {}
    for line in (stdout or "").splitlines():
        m = _LABEL.match(line)
        text = m.group(2) if m else line
        if text.startswith(TASK_MARK + " "):
            parts = text.split()
            if len(parts) >= 3 and parts[1].isdigit():
                out.tasks[int(parts[1])] = parts[2]
        elif text.startswith(NODE_MARK + " "):
            parts = text.split(" ", 3)
            if len(parts) < 4 or "/" not in parts[2]:
                continue
            i, _, n = parts[2].partition("/")
            if i.isdigit() and n.isdigit():
                chunks.setdefault(parts[1], {})[int(i)] = parts[3]
                totals[parts[1]] = int(n)
    for node, got in chunks.items():
        if len(got) == totals[node] and set(got) == set(range(totals[node])):
            out.docs[node] = "".join(got[i] for i in range(totals[node]))
        else:
            out.partial.append(node)
    for line in (stderr or "").splitlines():
        m = _LABEL.match(line)
        if m and int(m.group(1)) in out.tasks:
            out.task_errors.setdefault(out.tasks[int(m.group(1))], []).append(m.group(2))
        elif line.strip():
            q = _QUEUED.search(line)
            if q:
                out.job_id = q.group(1)
            out.srun_errors.append(line.strip())
    return out


BUSY_WORDS = ("Requested nodes are busy", "queued and waiting for resources", "Resource temporarily unavailable",
              "Job allocation", "has been revoked")


def allocation_failed(out: StepOutput) -> Optional[str]:
    """Slurm's words when the step never started (no task ran): the allocation refused or not had in time."""
    if out.tasks or out.docs:
        return None
    for line in reversed(out.srun_errors):
        if "Unable to allocate resources" in line or "error:" in line:
            return line.split("error:", 1)[-1].strip()
    return out.srun_errors[-1] if out.srun_errors else None


def nodes_busy(out: StepOutput) -> bool:
    return allocation_failed(out) is not None and any(
        "busy" in line or "queued and waiting" in line or "temporarily unavailable" in line
        for line in out.srun_errors)
