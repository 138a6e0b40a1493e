"""A Slurm job's state, parsed (pure, stdlib only): what squeue, sacct and `scontrol show job` print, turned into small
records; the facts of a job's end that the endings classifier is given (SlurmEnding.facts() ->
jobs.endfacts.EndFacts.scheduler); GPU-hours and their cost; and the small readers every Slurm output needs (host
lists, durations, `code:signal`, TRES). The nodes are slurm/nodes.py's, a pending job's reason in words
slurm/reasons.py's (knowledge as data).

The talking part (slurm/commands.py) runs the commands with the formats defined here, so what it asks and what is
parsed cannot drift apart:

    squeue  --noheader --format=SQUEUE_FORMAT --jobs=ID                  -> parse_squeue   (plain, every version)
    squeue  --json --jobs=ID                    (Slurm >= 21.08)         -> parse_squeue_json (21.08 ... 24.x shapes)
    sacct   --parsable2 --noheader --duplicates --jobs=ID --format=SACCT_FORMAT   -> parse_sacct, ending_from_sacct
    scontrol --oneliner show job ID             (no accounting needed)   -> parse_scontrol, ending_from_scontrol
    sinfo   --noheader --Node --format=nodes.SINFO_FORMAT [--partition=P]         -> nodes.parse_sinfo

Every record keeps Slurm's own words (its state, its reason) beside what gpuops makes of them. Times are Slurm's:
the cluster's local time as it prints it (`2024-05-01T12:00:00`), or epochs where its JSON gives them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional

# -- what the talking part asks ---------------------------------------------------------------------------------
DELIM = "|"
# job id, state, nodes, time used, time limit, start (the expected start of a pending job), partition, node list,
# gres per node, name, reason (last: `ReqNodeNotAvail, UnavailableNodes:n[1-2]` holds a space and a comma)
SQUEUE_FIELDS = ("job_id", "state", "nodes", "time_used", "time_limit", "start", "partition", "node_list", "gres",
                 "name", "reason")
SQUEUE_FORMAT = "%i|%T|%D|%M|%l|%S|%P|%N|%b|%j|%r"
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "DerivedExitCode", "Reason", "ElapsedRaw", "Start", "End",
                "NNodes", "NodeList", "AllocTRES")
SACCT_FORMAT = ",".join(SACCT_FIELDS)


def squeue_argv(job_ids: Iterable[str], *, as_json: bool = False) -> list[str]:
    ids = ",".join(str(j) for j in job_ids)
    return ["squeue", "--json", f"--jobs={ids}"] if as_json else \
        ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", f"--jobs={ids}"]


def sacct_argv(job_ids: Iterable[str]) -> list[str]:
    """--duplicates: a requeued job's earlier attempts too (same job id), so its requeues are counted and billed."""
    return ["sacct", "--parsable2", "--noheader", "--duplicates", f"--jobs={','.join(str(j) for j in job_ids)}",
            f"--format={SACCT_FORMAT}"]


def scontrol_job_argv(job_id: str) -> list[str]:
    return ["scontrol", "--oneliner", "show", "job", str(job_id)]


# -- small readers ----------------------------------------------------------------------------------------------
_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(text: Optional[str]) -> list[str]:
    """Slurm's compact host list (`gpu[01-03,07],login1`, `n[1-2]-ib[0-1]`) as host names, in order. `(null)`,
    `None assigned` and empty give []."""
    text = (text or "").strip()
    if not text or text in ("(null)", "None assigned", "N/A"):
        return []
    out: list[str] = []
    for part in _split_top(text, ","):
        out += _expand_one(part)
    return out


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[:m.start()], name[m.end():]
    out = []
    for item in m.group(1).split(","):
        r = _RANGE.match(item.strip())
        if r:
            lo, hi, width = int(r.group(1)), int(r.group(2)), len(r.group(1))
            values = [str(i).zfill(width) for i in range(lo, hi + 1)]
        else:
            values = [item.strip()]
        for v in values:
            out += _expand_one(head + v + tail)
    return out


def duration_s(text: Optional[str]) -> Optional[int]:
    """Slurm's durations in seconds: `[days-]hours:minutes:seconds`, `minutes:seconds`, `days-hours[:minutes]`, and
    bare minutes (squeue's time limit in JSON); None for UNLIMITED, INVALID, N/A, Partition_Limit or empty."""
    text = (text or "").strip()
    if not text or not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}(\.\d+)?", text):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(float(p)) for p in text.split(":")]
        parts += [0] * (3 - len(parts))  # days-hours[:minutes[:seconds]]
        h, m, s = parts
    else:
        parts = [int(float(p)) for p in text.split(":")]
        if len(parts) == 1:  # minutes alone
            return parts[0] * 60
        if len(parts) == 2:
            h, (m, s) = 0, parts
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s


def _time(text: Optional[str]) -> Optional[str]:
    """A Slurm time stamp as printed, or None for Unknown, N/A, None, (null) and empty."""
    text = (text or "").strip()
    return None if text in ("", "Unknown", "N/A", "None", "(null)", "0") else text


def exit_pair(text: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """Slurm's ExitCode `code:signal` (`0:15`: exit 0, ended by signal 15) as (code, signal); (None, None) when
    empty (a NODE_FAIL's batch step)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def tres_gpus(tres: Optional[str]) -> Optional[int]:
    """GPUs in a TRES string (`cpu=8,gres/gpu=16,gres/gpu:h100=16,node=2`): the untyped count, else the typed
    counts summed; None when it names no GPU."""
    untyped, typed = None, []
    for item in (tres or "").split(","):
        k, _, v = item.partition("=")
        k = k.strip()
        if not v.strip().isdigit():
            continue
        if k == "gres/gpu":
            untyped = int(v)
        elif k.startswith("gres/gpu:"):
            typed.append(int(v))
    return untyped if untyped is not None else (sum(typed) if typed else None)


def split_fields(line: str, fields: tuple) -> Optional[dict]:
    """A DELIM-separated line as {field: text}; a free-text field (reason) that holds the delimiter keeps it (the
    extra parts are joined back into it). None for a line with too few fields."""
    parts = line.split(DELIM)
    extra = len(parts) - len(fields)
    if extra < 0:
        return None
    if extra:
        i = fields.index("reason") if "reason" in fields else len(fields) - 1
        parts = parts[:i] + [DELIM.join(parts[i:i + extra + 1])] + parts[i + extra + 1:]
    return {f: p.strip() for f, p in zip(fields, parts)}


def _user(text: Optional[str]) -> Optional[str]:
    text = (text or "").strip()
    return None if text in ("", "Unknown", "(null)", "N/A") else text


def _int(text) -> Optional[int]:
    try:
        return int(str(text).strip().rstrip("+"))
    except (TypeError, ValueError):
        return None


def epoch_text(epoch: float) -> str:
    """An epoch of Slurm's JSON as Slurm spells times, in UTC and said so (the cluster's own zone is not known)."""
    import time as _t

    return _t.strftime("%Y-%m-%dT%H:%M:%S UTC", _t.gmtime(epoch))


# -- squeue and scontrol: a job in the queue ----------------------------------------------------------------------
@dataclass
class QueueJob:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: Optional[str] = None  # Slurm's reason code (Resources, ReqNodeNotAvail, ...), None for `None`
    reason_detail: Optional[str] = None  # what follows it: `UnavailableNodes:n[1-2]`
    nodes: Optional[int] = None
    node_list: str = ""
    partition: Optional[str] = None
    name: Optional[str] = None
    time_used_s: Optional[int] = None
    time_limit_s: Optional[int] = None  # None: unlimited or unknown
    start: Optional[str] = None  # a pending job's expected start, as Slurm prints it (cluster time)
    start_epoch: Optional[float] = None  # the same from its JSON
    gres: Optional[str] = None
    restarts: int = 0
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    description: Optional[str] = None  # JSON's state_description (`launch failed requeued held`)
    batch_host: Optional[str] = None  # the node the batch script runs on (the allocation's first)
    std_out: Optional[str] = None  # the log Slurm writes (scontrol's StdOut, JSON's standard_output; %j filled)
    requeue: Optional[bool] = None  # Slurm requeues it after a node failure or preemption

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def hosts(self) -> list[str]:
        return expand_hostlist(self.node_list)


def split_reason(text: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(code, detail) of a reason as squeue, scontrol or JSON print it: `(ReqNodeNotAvail, UnavailableNodes:n1)`,
    `ReqNodeNotAvail,_UnavailableNodes:n1` (scontrol writes spaces as _), `launch_failed_requeued_held`, `None`."""
    text = (text or "").strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    if not text or text in ("None", "(null)"):
        return None, None
    code, _, detail = text.partition(",")
    code = code.replace("_", " ").strip()
    detail = detail.strip().lstrip("_").strip()
    return code, detail or None


def parse_squeue(text: str, fields: tuple = SQUEUE_FIELDS) -> list[QueueJob]:
    """`squeue --noheader --format=SQUEUE_FORMAT` -> a QueueJob per line. `fields` names the columns of another
    format; `reason_or_nodes` is squeue's %R (`(Resources)` for a pending job, the node list for a running one)."""
    jobs = []
    for line in (text or "").splitlines():
        v = split_fields(line, fields) if line.strip() else None
        if v is None or not v.get("job_id"):
            continue
        either = v.get("reason_or_nodes", "")
        if either.startswith("("):
            v["reason"] = either
        elif either:
            v["node_list"] = either
        code, detail = split_reason(v.get("reason"))
        node_list, gres = v.get("node_list", ""), v.get("gres", "")
        jobs.append(QueueJob(
            job_id=v["job_id"], state=v.get("state", "").upper(), reason=code, reason_detail=detail,
            nodes=_int(v.get("nodes")), node_list="" if node_list in ("", "(null)") else node_list,
            partition=v.get("partition") or None, name=v.get("name") or None,
            time_used_s=duration_s(v.get("time_used")), time_limit_s=duration_s(v.get("time_limit")),
            start=_time(v.get("start")), gres=None if gres in ("", "N/A", "(null)") else gres))
    return jobs


def _jnum(value):
    """A number of Slurm's JSON: plain (21.08, 22.05) or {"set", "infinite", "number"} (23.02 on); None when unset
    or infinite."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _jstate(value) -> list[str]:
    """job_state: a string up to 23.02, a list from 23.11 (["PENDING"], ["RUNNING", "COMPLETING"])."""
    if isinstance(value, list):
        return [str(x).upper() for x in value]
    return [str(value).upper()] if value else []


def _jexit(value) -> tuple[Optional[int], Optional[int]]:
    """exit_code: a wait status (21.08 ... 23.02, plain or {"number"}) or, from 23.11, {"return_code", "signal"}."""
    if isinstance(value, dict) and ("return_code" in value or "signal" in value):
        sig = _jnum(((value.get("signal") or {}).get("id")))
        return _jnum(value.get("return_code")), sig or 0
    n = _jnum(value)
    if n is None:
        return None, None
    return (n >> 8) & 0xFF, n & 0x7F


def parse_squeue_json(text: str) -> list[QueueJob]:
    """`squeue --json` of Slurm 21.08 to 24.x (the same jobs list; numbers plain up to 22.05, as {"set",
    "number"} objects from 23.02, job_state a list and exit_code a structure from 23.11)."""
    doc = json.loads(text) if isinstance(text, str) else text
    jobs = []
    for j in doc.get("jobs") or []:
        states = _jstate(j.get("job_state"))
        code, detail = split_reason(j.get("state_reason"))
        desc = j.get("state_description") or ""
        if code and not detail and desc.replace("_", " ").startswith(code):  # `ReqNodeNotAvail, UnavailableNodes:..`
            detail = split_reason(desc)[1]
        limit = _jnum(j.get("time_limit"))
        start = _jnum(j.get("start_time"))
        rc, sig = _jexit(j.get("exit_code"))
        jobs.append(QueueJob(
            job_id=str(_jnum(j.get("job_id")) if isinstance(j.get("job_id"), dict) else j.get("job_id")),
            state=states[0] if states else "UNKNOWN", reason=code, reason_detail=detail,
            nodes=_jnum(j.get("node_count")), node_list=j.get("nodes") or "", partition=j.get("partition") or None,
            name=j.get("name"), time_limit_s=limit * 60 if limit is not None else None,
            start_epoch=float(start) if start else None,
            gres=j.get("tres_per_node") or j.get("tres_per_job") or None, restarts=int(j.get("restart_cnt") or 0),
            exit_code=rc, signal=sig, description=j.get("state_description") or None,
            batch_host=j.get("batch_host") or None, std_out=j.get("standard_output") or None,
            requeue=j.get("requeue") if isinstance(j.get("requeue"), bool) else None))
    return jobs


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol(text: str) -> list[dict]:
    """`scontrol --oneliner show job` or `show node` (or their multi-line form): a dict of Key=Value per job or node.
    A value may hold spaces (Command=, OS=, a node's Reason=): it runs to the next ` Key=`."""
    records, cur = [], None
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        matches = list(_KEY.finditer(line))
        if not matches:
            continue
        if matches[0].group(1) in ("JobId", "NodeName") or cur is None:
            cur = {}
            records.append(cur)
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
            cur[m.group(1)] = line[m.end():end].strip()
    return records


def job_from_scontrol(rec: dict) -> QueueJob:
    code, detail = split_reason(rec.get("Reason"))
    rc, sig = exit_pair(rec.get("ExitCode"))
    node_list = rec.get("NodeList") or ""
    return QueueJob(
        job_id=rec.get("JobId", ""), state=(rec.get("JobState") or "UNKNOWN").upper(), reason=code,
        reason_detail=detail, nodes=_int(rec.get("NumNodes", "").split("-")[0]),
        node_list="" if node_list == "(null)" else node_list, partition=rec.get("Partition"),
        name=rec.get("JobName"), time_used_s=duration_s(rec.get("RunTime")),
        time_limit_s=duration_s(rec.get("TimeLimit")), start=_time(rec.get("StartTime")),
        gres=rec.get("TresPerNode") or None, restarts=_int(rec.get("Restarts")) or 0, exit_code=rc, signal=sig,
        batch_host=rec.get("BatchHost") or None, std_out=rec.get("StdOut") or None,
        requeue={"1": True, "0": False}.get(rec.get("Requeue", "")))


# -- sacct: the accounting rows -----------------------------------------------------------------------------------
@dataclass
class SacctRow:
    job_id: str  # the job's id (123, 123_4 for an array task), without the step
    step: Optional[str]  # None for the job's allocation row; batch, extern, 0, 1, ...
    name: str = ""
    state: str = ""  # the state word: CANCELLED (of `CANCELLED by 1000`), TIMEOUT, ...
    cancelled_by: Optional[str] = None  # the uid in `CANCELLED by 1000`
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    derived: tuple = (None, None)
    reason: Optional[str] = None
    elapsed_s: Optional[int] = None
    start: Optional[str] = None
    end: Optional[str] = None
    nnodes: Optional[int] = None
    node_list: str = ""
    alloc_tres: str = ""

    @property
    def gpus(self) -> Optional[int]:
        return tres_gpus(self.alloc_tres)


def _state_word(text: str) -> tuple[str, Optional[str]]:
    """(state, cancelled by): `CANCELLED by 1000` -> (CANCELLED, 1000); `CANCELLED+` -> (CANCELLED, None)."""
    text = (text or "").strip()
    m = re.match(r"^([A-Z_]+)\+?(?:\s+by\s+(\S+))?", text)
    return (m.group(1), m.group(2)) if m else (text.upper(), None)


def parse_sacct(text: str, fields: Iterable[str] = SACCT_FIELDS) -> list[SacctRow]:
    """`sacct --parsable2 --noheader --format=...` rows, in the order sacct printed them. A header line (`JobID|...`)
    where there is one names the columns instead of `fields`."""
    names = list(fields)
    rows = []
    for line in (text or "").splitlines():
        if not line.strip() or DELIM not in line:
            continue
        parts = line.split(DELIM)
        if parts[0].strip() in ("JobID", "JobIDRaw"):
            names = [p.strip() for p in parts]
            continue
        v = {n: (parts[i].strip() if i < len(parts) else "") for i, n in enumerate(names)}
        jid = v.get("JobID") or v.get("JobIDRaw") or ""
        base, _, step = jid.partition(".")
        state, by = _state_word(v.get("State", ""))
        rc, sig = exit_pair(v.get("ExitCode"))
        reason = v.get("Reason") or None
        rows.append(SacctRow(
            job_id=base, step=step or None, name=v.get("JobName", ""), state=state, cancelled_by=by, exit_code=rc,
            signal=sig, derived=exit_pair(v.get("DerivedExitCode")), reason=None if reason == "None" else reason,
            elapsed_s=_int(v.get("ElapsedRaw")) if v.get("ElapsedRaw") else duration_s(v.get("Elapsed")),
            start=_time(v.get("Start")), end=_time(v.get("End")), nnodes=_int(v.get("NNodes")),
            node_list="" if v.get("NodeList") in (None, "None assigned", "(null)") else v.get("NodeList", ""),
            alloc_tres=v.get("AllocTRES", "")))
    return rows


# -- the end of a job: the facts the endings classifier is given --------------------------------------------------
# The states in which Slurm, not the job's own exit, ended the job: each is a row of playbooks/endings.yaml
SCHEDULER_ENDS = ("TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "CANCELLED",
                  "REVOKED")
ENDED = SCHEDULER_ENDS + ("COMPLETED", "FAILED", "SPECIAL_EXIT")
SIG_OOM = 125  # Slurm records an OOM kill as signal 125 in ExitCode (`0:125`: its SIG_OOM 253, & 0x7f)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}


@dataclass
class SlurmEnding:
    """How Slurm saw a job end: its state (the last attempt's), the exit code and signal (`0:15` is exit 0, signal
    15), Slurm's reason, who cancelled it, how often it was requeued and where it ran, and what it cost in GPU
    time (every attempt counted)."""
    job_id: str
    state: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    reason: Optional[str] = None
    cancelled_by: Optional[str] = None  # a uid (sacct's `CANCELLED by 1000`); 0 is root or Slurm itself
    restarts: int = 0  # requeues before the last attempt
    node_list: str = ""
    nodes: tuple = ()
    elapsed_s: Optional[int] = None  # the last attempt's
    gpus: Optional[int] = None  # the last attempt's, all nodes
    gpu_seconds: Optional[float] = None  # every attempt's
    attempts: tuple = ()  # the earlier attempts: ({"state", "node_list", "elapsed_s"} each)
    steps: tuple = ()  # the last attempt's steps: (step, state, "code:signal") each
    source: str = "sacct"  # or "scontrol" (no accounting: the controller's memory of the job)

    @property
    def by_scheduler(self) -> bool:
        """Slurm ended it (its time limit, a node, preemption, a cancel), not the job's own exit."""
        return self.state in SCHEDULER_ENDS

    @property
    def exit_status(self) -> Optional[int]:
        """The status a shell would report for the batch script: its code, or 128 + the signal that ended it (137 for
        an OOM kill, which the kernel delivers as SIGKILL); None when Slurm recorded nothing (a node failure)."""
        if self.signal == SIG_OOM:
            return 128 + 9
        if self.signal:
            return 128 + self.signal
        if self.exit_code is None or (self.exit_code == 0 and self.by_scheduler and not self.steps_said):
            return None
        return self.exit_code

    @property
    def steps_said(self) -> bool:
        return any(code for _, _, code in self.steps)

    @property
    def signal_name(self) -> Optional[str]:
        if self.signal == SIG_OOM:
            return "OOM kill"
        return _SIGNALS.get(self.signal, f"signal {self.signal}") if self.signal else None

    @property
    def gpu_hours(self) -> Optional[float]:
        return None if self.gpu_seconds is None else self.gpu_seconds / 3600.0

    def cost(self, price_per_gpu_hour: Optional[float]) -> Optional[float]:
        return gpu_cost(self.gpu_hours, price_per_gpu_hour)

    def words(self) -> str:
        """One line of evidence: `sacct: State=TIMEOUT ExitCode=0:15 (SIGTERM) Reason=TimeLimit on gpu[01-02];
        requeued 1 time (NODE_FAIL on gpu03)`."""
        state = self.state + (f" by {self.cancelled_by}" if self.cancelled_by else "")
        code = f"{self.exit_code if self.exit_code is not None else '?'}:{self.signal or 0}"
        text = f"{self.source}: State={state} ExitCode={code}"
        if self.signal_name:
            text += f" ({self.signal_name})"
        if self.reason:
            text += f" Reason={self.reason}"
        if self.node_list:
            text += f" on {self.node_list}"
        if self.restarts:
            before = ", ".join(f"{a['state']} on {a['node_list'] or '?'}" for a in self.attempts) if self.attempts \
                else ""
            text += f"; requeued {self.restarts} time{'s' if self.restarts != 1 else ''}" + (
                f" ({before})" if before else "")
        return text

    def facts(self) -> dict:
        """What jobs.endfacts.EndFacts.scheduler carries to the endings classifier: plain values only."""
        return {"scheduler": "slurm", "job_id": self.job_id, "state": self.state, "exit_code": self.exit_code,
                "signal": self.signal, "signal_name": self.signal_name, "reason": self.reason,
                "cancelled_by": self.cancelled_by, "restarts": self.restarts, "node_list": self.node_list,
                "nodes": list(self.nodes), "elapsed_s": self.elapsed_s, "gpu_hours": self.gpu_hours,
                "by_scheduler": self.by_scheduler, "evidence": self.words(), "source": self.source}


def _attempts(rows: list[SacctRow]) -> list[list[SacctRow]]:
    """The rows of one job grouped by attempt: each allocation row starts one, its steps follow it."""
    out: list[list[SacctRow]] = []
    for r in rows:
        if r.step is None or not out:
            out.append([r])
        else:
            out[-1].append(r)
    return out


def ending_from_sacct(text_or_rows, job_id: Optional[str] = None) -> Optional[SlurmEnding]:
    """The ending of `job_id` (else the first job listed) from sacct's rows (with --duplicates, a requeued job's
    earlier attempts come first); None while it has not ended or when sacct has no row of it."""
    rows = parse_sacct(text_or_rows) if isinstance(text_or_rows, str) else list(text_or_rows)
    if not rows:
        return None
    job_id = str(job_id) if job_id is not None else rows[0].job_id
    attempts = _attempts([r for r in rows if r.job_id == job_id])
    if not attempts or attempts[-1][0].state not in ENDED:
        return None
    last = attempts[-1]
    alloc = last[0]
    steps = tuple((s.step, s.state, f"{s.exit_code}:{s.signal}" if s.exit_code is not None else "")
                  for s in last[1:])
    signal = alloc.signal
    if not signal:  # the allocation row says 0:0 for TIMEOUT and cancels: the batch step (then any step) got it
        ordered = sorted(last[1:], key=lambda s: (s.step != "batch", s.step == "extern"))
        signal = next((s.signal for s in ordered if s.signal and s.step != "extern"), 0)
    gpu_seconds = None
    for a in attempts:
        g, el = a[0].gpus, a[0].elapsed_s
        if g is not None and el is not None:
            gpu_seconds = (gpu_seconds or 0.0) + g * el
    earlier = tuple({"state": a[0].state, "node_list": a[0].node_list, "elapsed_s": a[0].elapsed_s}
                    for a in attempts[:-1])
    return SlurmEnding(
        job_id=job_id, state=alloc.state, exit_code=alloc.exit_code, signal=signal or 0, reason=alloc.reason,
        cancelled_by=alloc.cancelled_by or (next((s.cancelled_by for s in last[1:] if s.cancelled_by), None)
                                            if alloc.state == "CANCELLED" else None),
        restarts=len(attempts) - 1, node_list=alloc.node_list, nodes=tuple(expand_hostlist(alloc.node_list)),
        elapsed_s=alloc.elapsed_s, gpus=alloc.gpus, gpu_seconds=gpu_seconds, attempts=earlier, steps=steps)


def ending_from_scontrol(text_or_record, job_id: Optional[str] = None) -> Optional[SlurmEnding]:
    """The ending from `scontrol --oneliner show job` (a cluster without accounting; the controller forgets a job
    MinJobAge after it ends, 300 s by default): None while it runs or is pending, or when it is not listed."""
    records = parse_scontrol(text_or_record) if isinstance(text_or_record, str) else [text_or_record]
    rec = next((r for r in records if job_id is None or r.get("JobId") == str(job_id)), None)
    if not rec:
        return None
    state = (rec.get("JobState") or "").upper()
    if state not in ENDED:
        return None
    rc, sig = exit_pair(rec.get("ExitCode"))
    code, detail = split_reason(rec.get("Reason"))
    node_list = rec.get("NodeList") or ""
    node_list = "" if node_list == "(null)" else node_list
    gpus = tres_gpus(rec.get("AllocTRES") or rec.get("TRES"))
    elapsed = duration_s(rec.get("RunTime"))
    return SlurmEnding(
        job_id=rec.get("JobId", ""), state=state, exit_code=rc, signal=sig or 0,
        reason=(code + (f", {detail}" if detail else "")) if code else None, restarts=_int(rec.get("Restarts")) or 0,
        node_list=node_list, nodes=tuple(expand_hostlist(node_list)), elapsed_s=elapsed, gpus=gpus,
        gpu_seconds=float(gpus * elapsed) if gpus is not None and elapsed is not None else None, source="scontrol")


def gpu_hours(rows_or_text, job_ids: Optional[Iterable[str]] = None) -> dict[str, float]:
    """GPU-hours per job from sacct's allocation rows (ElapsedRaw x GPUs of AllocTRES), every attempt counted;
    jobs whose rows name no GPU are left out."""
    rows = parse_sacct(rows_or_text) if isinstance(rows_or_text, str) else list(rows_or_text)
    wanted = {str(j) for j in job_ids} if job_ids is not None else None
    out: dict[str, float] = {}
    for r in rows:
        if r.step is not None or (wanted is not None and r.job_id not in wanted):
            continue
        if r.gpus is not None and r.elapsed_s is not None:
            out[r.job_id] = out.get(r.job_id, 0.0) + r.gpus * r.elapsed_s / 3600.0
    return out


def gpu_cost(hours: Optional[float], price_per_gpu_hour: Optional[float]) -> Optional[float]:
    """What the GPU-hours cost at the profile's price (a reserved cluster is priced per GPU-hour, not billed by the
    minute); None without a price."""
    if hours is None or price_per_gpu_hour is None:
        return None
    return round(hours * float(price_per_gpu_hour), 4)
