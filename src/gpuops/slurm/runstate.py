"""A gpuops run on a Slurm cluster, judged (pure): what squeue, scontrol and sacct said of its job, the run folder's
files (attempts, stop.json) and the log's tail -> the run's row for `gpuops status`: Slurm's state in gpuops' words
(a pending job's reason and its fix, a running job's nodes and time, an ended job's state, exit code and reason), the
attempts (a requeued job's earlier ones and their nodes), the GPU-hours and their cost, and the ending: SlurmEnding's
facts given to the endings classifier (jobs/endings.py) with the log's tail, as a host's run is judged.

The talking part is slurm/commands.py (LoginNode.gather), the sequence slurm/runs.py.
"""
from __future__ import annotations

import json
import re
import time
from typing import Optional

from ..jobs import plan as core
from . import states
from .batch import parse_attempts
from .resume import words as resume_words
from .reasons import explain_pending

PENDING = "pending"  # a gpuops state of its own for a job Slurm has not started (a host's run never waits)
RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING")
WAITING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD")


def queue_job(job_id: str, squeue: Optional[str], as_json: bool, scontrol: str) -> Optional[states.QueueJob]:
    """The job as squeue listed it (its pending reason and estimated start) completed by scontrol's record (restarts,
    exit code); scontrol's alone when squeue did not list it; None when neither knows it."""
    listed = []
    if squeue:
        try:
            listed = states.parse_squeue_json(squeue) if as_json else states.parse_squeue(squeue)
        except (ValueError, AttributeError):
            listed = []
    q = next((j for j in listed if j.job_id == str(job_id)), None)
    recs = states.parse_scontrol(scontrol) if scontrol else []
    rec = next((r for r in recs if r.get("JobId") == str(job_id)), None)
    if rec is None:
        return q
    sc = states.job_from_scontrol(rec)
    if q is None:
        return sc
    q.restarts = max(q.restarts, sc.restarts)
    q.exit_code, q.signal = sc.exit_code, sc.signal
    if q.time_used_s is None:
        q.time_used_s = sc.time_used_s
    if not q.start:
        q.start = sc.start
    return q


def gpuops_state(slurm_state: Optional[str], ending: Optional[states.SlurmEnding], stopped: bool) -> str:
    """Slurm's state in gpuops' run words: pending, running, succeeded, failed, stopped (by gpuops), lost."""
    if slurm_state is None:
        return core.LOST
    if slurm_state in WAITING_STATES:
        return PENDING
    if slurm_state in RUNNING_STATES:
        return core.RUNNING
    if stopped:
        return core.STOPPED
    if slurm_state == "COMPLETED" and (ending is None or not ending.exit_code):
        return core.SUCCEEDED
    return core.FAILED


def job_gpus(rec_text: str, q: Optional[states.QueueJob], gpus_per_node: int) -> Optional[int]:
    """Every GPU of the allocation: scontrol's AllocTRES/TRES, else the nodes times the GPUs asked per node."""
    recs = states.parse_scontrol(rec_text) if rec_text else []
    if recs:
        g = states.tres_gpus(recs[0].get("AllocTRES") or recs[0].get("TRES"))
        if g is not None:
            return g
    if q is not None and q.nodes:
        return q.nodes * gpus_per_node
    return None


def ending_of(job_id: str, scontrol: str, sacct: Optional[str]) -> Optional[states.SlurmEnding]:
    """The job's ending: sacct's (every attempt billed) where accounting exists, else scontrol's."""
    if sacct:
        e = states.ending_from_sacct(sacct, job_id)
        if e is not None:
            return e
    return states.ending_from_scontrol(scontrol, job_id) if scontrol else None


_LABEL = re.compile(r"^\s*\d+: ")  # srun --label: the task's number before each line


def job_lines(tail: list) -> list:
    """The log's lines as the job printed them: srun's --label prefix taken off, srun's own words on the steps it
    ends left out (a traceback's last line is then the last exception, not `srun: ... Terminating StepId`).
    slurmstepd's lines stay: they say TIME LIMIT, NODE FAILURE, PREEMPTION."""
    return [_LABEL.sub("", x, count=1) for x in tail or [] if not x.startswith("srun: ")]


_TASK_EXIT = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,-]+): Exited with exit code (?P<code>\d+)")


def first_task_failure(tail: list) -> Optional[dict]:
    """The first task srun saw exit non-zero on its own (`srun: error: n2: task 1: Exited with exit code 1`), or None.
    With --kill-on-bad-exit srun then ends the other tasks (SIGTERM: `task 0: Terminated`), and its own exit, the
    batch script's, is the highest of them all (143): the first failure is the job's."""
    for line in tail or []:
        m = _TASK_EXIT.match(line.strip())
        if m and 0 < int(m.group("code")) < 128:
            return {"node": m.group("node"), "tasks": m.group("tasks"), "code": int(m.group("code"))}
    return None


def end_facts(run_id: str, ending: states.SlurmEnding, tail: list, stopped: Optional[dict]):
    """What the endings classifier is given for a Slurm job: Slurm's facts (EndFacts.scheduler), the exit status
    the batch script left (or, when srun ended the other tasks after one failed, that task's), the log's tail and
    gpuops' own stop."""
    from ..jobs.endfacts import EndFacts

    facts, code = ending.facts(), ending.exit_status
    first = first_task_failure(tail) if not ending.by_scheduler else None
    if first is not None and code is not None and code > 128:
        code = first["code"]
        facts["evidence"] += (f"; srun: task {first['tasks']} on {first['node']} exited {first['code']} first, and "
                              "srun ended the other tasks (--kill-on-bad-exit)")
    return EndFacts(run_id=run_id, exit_code=code, alive=False, stopped=stopped, log_tail=job_lines(tail),
                    scheduler=facts)


def classify(run_id: str, ending: Optional[states.SlurmEnding], tail: list, stopped: Optional[dict], spec: dict,
             xids: Optional[dict] = None) -> Optional[dict]:
    """The verdict on the end (jobs/endings.py), None while it runs or when it succeeded."""
    from ..jobs import endings as en

    if ending is None:
        return None
    return en.classify(end_facts(run_id, ending, tail, stopped), spec, xids)


def read_json(text: Optional[str]) -> Optional[dict]:
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def slurm_doc(*, job_id: str, q: Optional[states.QueueJob], ending: Optional[states.SlurmEnding],
              attempts: list, gpus: Optional[int], price: Optional[float], reasons: dict,
              now: Optional[float] = None, accounting: Optional[bool] = None) -> dict:
    """status --json's `slurm` object of a run: Slurm's own words beside what gpuops makes of them."""
    now = time.time() if now is None else now
    state = ending.state if ending else (q.state if q else None)
    doc = {"job_id": str(job_id), "state": state, "reason": None, "reason_words": None, "fix": None,
           "estimated_start": None, "nodes": q.nodes if q else None, "node_list": (q.node_list if q else "") or
           (ending.node_list if ending else ""), "elapsed_s": None, "time_limit_s": q.time_limit_s if q else None,
           "exit_code": None, "signal": None, "restarts": 0, "attempts": attempts, "gpus": gpus,
           "gpu_hours": None, "cost": None, "accounting": accounting, "source": None, "failed_nodes": []}
    if q is not None:
        doc.update(restarts=q.restarts, elapsed_s=q.time_used_s, source="squeue")
        if q.state in WAITING_STATES:
            w = explain_pending(q, reasons, now=now)
            doc.update(reason=q.reason, reason_words=w.words, fix=w.fix, estimated_start=w.estimated_start)
        elif q.reason and q.state not in RUNNING_STATES:
            doc["reason"] = q.reason + (f", {q.reason_detail}" if q.reason_detail else "")
    if ending is not None:
        doc.update(state=ending.state, exit_code=ending.exit_code, signal=ending.signal, reason=ending.reason,
                   restarts=max(doc["restarts"], ending.restarts), elapsed_s=ending.elapsed_s, source=ending.source,
                   nodes=len(ending.nodes) or doc["nodes"])
        hours = ending.gpu_hours
        if hours is None and gpus is not None and ending.elapsed_s is not None:  # no GPU in the TRES Slurm kept
            hours = ending.elapsed_s * gpus / 3600.0
    elif q is not None and q.state in WAITING_STATES:
        hours = None  # nothing used yet (a requeued job's earlier attempts: sacct bills them once it has ended)
    else:
        hours = (doc["elapsed_s"] or 0) * gpus / 3600.0 if gpus is not None and doc["elapsed_s"] is not None else None
    doc["gpu_hours"] = round(hours, 6) if hours is not None else None
    doc["cost"] = states.gpu_cost(hours, price)
    return doc


def failed_nodes(doc: dict, ending: Optional[states.SlurmEnding], sinfo: Optional[str]) -> list[dict]:
    """The nodes that failed the job, as sinfo says them now: of a requeued job, the nodes of its earlier attempts
    that Slurm holds down, drained or not responding (the requeue's cause: NODE_FAIL); of a job that ended, its own
    (nodes.failed_nodes). Each {"node", "state", "reason"}."""
    from .nodes import parse_sinfo

    listed = parse_sinfo(sinfo or "")
    if not listed:
        return []
    attempts = doc.get("attempts") or []
    if doc.get("state") not in WAITING_STATES:  # the last attempt is the one running (or that ended) now
        attempts = attempts[:-1]
    earlier = {n for a in attempts for n in states.expand_hostlist(a.get("node_list"))}
    if ending is not None and ending.state in ("NODE_FAIL", "BOOT_FAIL"):
        earlier |= set(ending.nodes)
    out, seen = [], set()
    for n in listed:
        if n.name in earlier and (n.down or n.drained) and n.name not in seen:
            seen.add(n.name)
            out.append({"node": n.name, "state": n.raw_state or n.state, "reason": n.reason})
    return out


def to_keep_off(row: dict, meta: dict, g) -> list:
    """The nodes a --recover run's requeued job, now pending, should be kept off: those that failed an attempt
    (failed_nodes) and that the job does not exclude yet (scontrol's ExcNodeList). [] for anything else."""
    s = row.get("slurm") or {}
    if (meta.get("slurm") or {}).get("recover") is None or s.get("state") not in WAITING_STATES:
        return []
    if not (s.get("restarts") or 0) or not s.get("failed_nodes") or g is None:
        return []
    recs = states.parse_scontrol(g.scontrol.get(s["job_id"], ""))
    have = set(states.expand_hostlist((recs[0].get("ExcNodeList") if recs else None) or ""))
    want = [f["node"] for f in s["failed_nodes"] if f["node"] not in have]
    return sorted(have | set(want)) if want else []


def keep_off_argv(job_id: str, nodes: list) -> list:
    """scontrol's update of a pending job's excluded nodes (the whole list: it replaces the old one)."""
    return ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"]


def attempts_of(text: Optional[str]) -> list[dict]:
    return parse_attempts(text or "")


def words(row: dict) -> list[str]:
    """The lines status prints under a Slurm run's row: its state in words, the attempts, the GPU-hours."""
    s = row.get("slurm") or {}
    rid, out = row["run_id"], []
    if not s:
        return out
    state = s.get("state") or "unknown to Slurm"
    if row["state"] == PENDING:
        line = f"{rid}: Slurm job {s['job_id']} {state}"
        if s.get("reason"):
            line += f" ({s['reason']}): {s.get('reason_words') or ''}".rstrip(": ")
        out.append(line)
        if s.get("fix"):
            out.append(f"    fix: {s['fix']}")
        if s.get("estimated_start"):
            out.append(f"    Slurm's estimated start: {s['estimated_start']}")
    elif row["state"] == core.RUNNING:
        out.append(f"{rid}: Slurm job {s['job_id']} {state} on {s.get('nodes') or '?'} node(s) "
                   f"{s.get('node_list') or ''} for {core.fmt_duration(s.get('elapsed_s'))}".replace("  ", " "))
    elif s.get("state"):
        code = "?" if s.get("exit_code") is None else s["exit_code"]
        line = f"{rid}: Slurm job {s['job_id']} {state}, exit {code}:{s.get('signal') or 0}"
        if s.get("reason"):
            line += f", reason {s['reason']}"
        out.append(line + (f", on {s['node_list']}" if s.get("node_list") else ""))
    else:
        out.append(f"{rid}: Slurm job {s['job_id']} is no longer known to Slurm (it forgets a job MinJobAge after "
                   "its end, and this cluster keeps no accounting)")
    att = s.get("attempts") or []
    if s.get("restarts") or len(att) > 1:
        n = max(int(s.get("restarts") or 0), len(att) - 1)
        said = "; ".join(f"#{i + 1} on {a.get('node_list') or '?'}" for i, a in enumerate(att))
        out.append(f"    requeued {n} time{'s' if n != 1 else ''} by Slurm (a node failed or it was preempted); "
                   f"attempts: {said or '?'}")
    for r in s.get("resumes") or []:
        out.append("    " + resume_words(r, (s.get("checkpoints") or "").rpartition("/")[0] or None))
    for f in s.get("failed_nodes") or []:
        out.append(f"    node {f['node']} is {f['state']}" + (f" ({f['reason']})" if f.get("reason") else "")
                   + (": NODE_FAIL, the job was requeued off it" if row["state"] not in core.ENDED
                      else ": the job's node failed") + f"; keep jobs off it: --exclude {f['node']}")
    if s.get("kept_off"):
        out.append(f"    kept off {','.join(s['kept_off'])} for its next attempt (--recover: a node that failed it)")
    if s.get("gpu_hours") is not None:
        cost = f", ${s['cost']:.2f}" if s.get("cost") is not None else ""
        out.append(f"    GPU-hours: {s['gpu_hours']:.4f} ({s.get('gpus')} GPU(s)){cost}")
    return out
