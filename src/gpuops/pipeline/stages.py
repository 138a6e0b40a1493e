"""`gpuops run`, the pure half: the stages in order, the local record that makes a run resumable, what was spent per
stage, and when a budget is reached. No I/O but the record file; the talking half is pipeline/runner.py.

The record is the source of truth for "where did this run get to": it is written (atomically) before each stage
starts and after it ends, so a crash of the local process leaves a record `gpuops run --resume` continues from.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from . import prepplan

# sync first: setup installs from the synced files; push (the checkpoint a replaced instance left) only on a relaunch
STAGES = ("up", "sync", "setup", "push", "train", "watch", "fetch", "down")
LABELS = {"up": "waiting for capacity, booting", "setup": "setup", "sync": "sync", "push": "push the checkpoint",
          "train": "launch", "watch": "training", "fetch": "fetch", "down": "termination",
          "recover": "recovery (fetch, terminate)"}
RECOVER_MIN_TTL_S = 300.0  # no instance is launched for less than this much of the run's --ttl
# outcomes of a whole run
RUNNING, SUCCEEDED, FAILED, KEPT, DETACHED = "running", "succeeded", "failed", "kept", "detached"
LOST = "lost"  # the instance ended under the run (terminated by someone else, preempted): the job went with it
ENDED = "ended"  # the user ended the run's instance (gpuops down, reap at its TTL): the run ends, nothing replaced
NAME_MAX = 38  # run-<name>-YYYYmmdd-HHMMSS-xxxx stays a profile name (63 characters at most)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


_SETUP_AGAIN = re.compile(r"(,? then|,? and) (?:run )?(`?)gpuops setup\2(?: again)?(?: \(finished steps are not "
                          r"repeated\))?")


_PROFILES = re.compile(r"the profile's (setup\.extras|expect\.packages|env:)")


def launch_failure(message: str, hint: Optional[str], *, kept: bool) -> tuple[str, Optional[str]]:
    """The train stage's error line when the launch failed: "not launched: ..." once (the gate's own "; not
    launching" ending dropped; a cut before the launch already says "nothing was launched"), and never "not launched"
    for a launch whose start is not known (issue #36): the run terminates the instance, and with it anything that
    started."""
    if "whether the job started is not known" in message:
        return message, (hint if kept else "the run goes on to terminate the instance: anything that started ends "
                         "with it; start gpuops run again")
    said = message.removesuffix("; not launching")
    return (said if "nothing was launched" in said else f"not launched: {said}"), refusal_hint(hint, kept=kept)


def refusal_hint(hint: Optional[str], *, kept: bool) -> Optional[str]:
    """The hints of the launch gate and of setup as a run says them: they speak to `gpuops train`/`setup` (fix the
    project, then gpuops setup on the same host), but a run terminates the instance and its profile after such a
    failure, so the next step is a new `gpuops run` (whose setup runs on the new instance), and a setting the fix
    names goes in the profile given with --from (the run's profile takes python, expect, setup, env from it). With
    --keep the instance and its profile stay: unchanged."""
    if not hint or kept:
        return hint
    hint = _PROFILES.sub(r"\1 of a profile given with --from (gpuops run --from PROFILE)", hint)  # the run's own is gone
    return _SETUP_AGAIN.sub(r"\1 start gpuops run again (its setup runs on the new instance)", hint).replace(
        "fix: run `gpuops setup` (it creates", "fix: start gpuops run again (its setup creates")


SAMPLE_S = 2.0  # the watch's sampling interval by default (runner.Seams.poll_s): --max-cost is checked at each


@dataclass
class Stage:
    started: Optional[float] = None
    ended: Optional[float] = None
    ok: Optional[bool] = None
    detail: Optional[str] = None


@dataclass
class Record:
    id: str
    profile: str
    instance_type: str  # the first --type asked ("" with --gpu); the profile records the type launched
    script: str
    args: list = field(default_factory=list)
    regions: list = field(default_factory=list)
    nodes: int = 1
    launcher: str = "none"  # on a fleet: torchrun / ray / none (the script on every node)
    nproc: str = "auto"  # torchrun processes per node
    template: Optional[dict] = None  # --from PROFILE: the settings carried into the run's profile
    fetch: list = field(default_factory=list)
    keep: bool = False
    ttl_s: Optional[float] = None
    max_cost: Optional[float] = None
    key: Optional[str] = None
    # what `run` takes from `train` and `up`: --seed, --env (names only: the values are in a 0600 file beside the
    # record, runs/pipelines/<id>.env), --force (the launch gate), --idle and --guard (each instance launched)
    seed: Optional[int] = None
    env_names: list = field(default_factory=list)
    force: bool = False
    idle_s: Optional[float] = None
    guard: Optional[str] = None
    created: float = 0.0
    price_per_hour: Optional[float] = None  # per node, known once `up` has read the type
    run_id: Optional[str] = None  # the training run's id, once launched
    job_state: Optional[str] = None  # succeeded / failed / stopped, once the job ended
    ending: Optional[dict] = None  # what the job died of (jobs/endings.py: cause, title, evidence, fix, source)
    stop_reason: Optional[str] = None  # max-cost, interrupted, ...
    hardware: Optional[str] = None  # the job died with its GPU (no --recover): what failed; --resume --recover N
    lost: Optional[str] = None  # why the instance is gone under the run (its status and what went with it)
    lost_at: Optional[float] = None  # when the API first showed it gone (preempted, terminated): billing ended there
    terminated_by: Optional[str] = None  # the instance was ended on purpose from here: the ledger's note
    outcome: str = RUNNING
    stages: dict = field(default_factory=dict)  # name -> Stage (the current instance's)
    # what the user asked to launch (cloud.instances.UpSpec takes it as launch_ask gives it): --type in order, or
    # --gpu NAME[:COUNT]; --max-price per hour; --wait-for-capacity
    types: list = field(default_factory=list)
    gpu: Optional[str] = None
    max_price: Optional[float] = None
    wait_for_capacity_s: float = 0.0
    billed_from: Optional[float] = None  # the first launch request that created an instance (billing starts there)
    terminate_s: Optional[float] = None  # a termination's expected time: the cloud's poll interval and a round trip
    # recovery (--recover N): an instance lost, unreachable or with a dead GPU is replaced up to N times
    recover: int = 0
    unreachable_s: Optional[float] = None  # an instance unreachable this long (API: running) is given up on
    ttl_deadline: Optional[float] = None  # the run's --ttl: every instance it launches ends by then
    instance: Optional[dict] = None  # the current instance: {"ids", "type", "region"}, once `up` has it
    checkpoint: Optional[dict] = None  # the newest checkpoint that counts: {name, dir, step, path, local, at, evidence}
    # every checkpoint that counted, oldest first, each with the evidence that vouched for it: a job's death revokes
    # those only timing vouched for (pipeline.checkpoints.after_death)
    vouched: list = field(default_factory=list)
    job_started: Optional[float] = None  # the current job's start on the instance's clock (its checkpoints are newer)
    ck_filesystem: Optional[str] = None  # run --fs: the mount point the run's checkpoint folder lives under
    resume_from: Optional[str] = None  # GPUOPS_RESUME_FROM of the next job: the checkpoint's path on the instance
    recovering: Optional[dict] = None  # a replacement under way: {kind, reason, at, fetch_tried, terminated, ended}
    attempts: list = field(default_factory=list)  # the instances replaced: their stages, time and price
    # instances that billed outside the stages: a bring-up cut off before its profile was written, reclaimed by
    # --resume (as attempts: {instance, price_per_hour, nodes, started, ended, reason}); never counted as recoveries
    reclaimed: list = field(default_factory=list)
    file_systems: list = field(default_factory=list)  # --fs: attached to every instance (replacements too)
    data: Optional[str] = None  # --data SOURCE as given (transfer.dataplan.parse)
    data_path: Optional[str] = None  # where the data is on the instance (GPUOPS_DATA), once put there
    plan: Optional[dict] = None  # the local plan made before the launch (project/plan.py's JSON document)
    # --prep CMD: the preparation, first, on its own instance (pipeline/prepplan.py, prepstage.py): {command, outs, type,
    # key, folder, path, state, stage {started, ended, ok, detail}, instances [...], job, log, ...}
    prep: Optional[dict] = None

    def stage(self, name: str) -> Stage:
        st = self.stages.get(name)
        if st is None:
            st = self.stages[name] = Stage()
        return st

    def to_json(self) -> dict:
        d = asdict(self)
        d["stages"] = {k: asdict(v) for k, v in self.stages.items()}
        return d

    @classmethod
    def from_json(cls, doc: dict) -> "Record":
        doc = dict(doc)
        stages = {k: Stage(**v) for k, v in (doc.pop("stages", None) or {}).items()}
        known = {f for f in cls.__dataclass_fields__}
        rec = cls(**{k: v for k, v in doc.items() if k in known})
        rec.stages = stages
        return rec


# -- deciding -------------------------------------------------------------------------------------------------------
def next_stage(rec: Record) -> Optional[str]:
    """Where a run goes on (after a crash too), or None when it is over:
    - stages run in order; one that started and did not end is run again (each is safe to repeat: `up` adopts its
      launch, setup and sync are idempotent, train finds its recorded run, watch re-attaches, fetch resumes);
    - a launch refused or failed (`train` not ok): nothing to watch or fetch; straight to `down`;
    - a job that failed (`watch` ended, job not succeeded): its logs are still fetched, then `down`;
    - a fetch that failed: the instance is kept (the data is only there), nothing more;
    - `--keep`: no `down`;
    - the instance ended under the run (`lost`: terminated by someone else, preempted): nothing is left to set up, run
      or fetch; `down` confirms it and closes its records (also with --keep);
    - a replacement under way (`recovering`): `recover` (fetch what is reachable, terminate), then the run starts again
      at `up` with a new instance (archive), `push` putting the checkpoint back before the launch."""
    st = rec.stages
    if rec.recovering:  # (after `down` too: a job that died with its GPU, resumed with --recover N)
        return "recover"
    if prepplan.pending(rec.prep):  # the preparation first: no training instance before it is complete
        return "prep"
    if prepplan.failed(rec.prep):  # a failed preparation (or its instance still billing) launches nothing
        return None
    if st.get("down") is not None and st["down"].ok:
        return None
    if rec.lost:
        return "down"
    for name in STAGES:
        s = st.get(name)
        if s is None or s.ended is None:
            if name == "down" and rec.keep:
                return None
            if name == "push" and s is None and not rec.resume_from:
                continue
            if name in ("watch", "fetch") and st.get("train") is not None and st["train"].ok is False:
                continue
            return name
        if s.ok:
            continue
        if name in ("train", "watch"):
            continue  # a failed launch or job: go on to what is left (fetch the logs, then down)
        if name == "fetch":
            return None  # kept: the checkpoints are only on the instance
        return name if name == "down" else ("down" if name in ("setup", "sync", "push") and not rec.keep else None)
    return None


def launch_ask(rec: Record) -> dict:
    """What the run asked to launch, as UpSpec's keyword arguments (a first launch and a relaunch alike)."""
    types = list(rec.types) or ([rec.instance_type] if rec.instance_type and not rec.gpu else [])
    return {"types": types, "gpu": rec.gpu, "max_price": rec.max_price, "wait_for_capacity_s": rec.wait_for_capacity_s,
            "file_systems": list(rec.file_systems)}


def billed_since(rec: Record) -> Optional[float]:
    """Billing starts with the launch request (Lambda bills from the moment the instance exists): not while `up`
    waits for capacity (--wait-for-capacity)."""
    if rec.billed_from is not None:
        return rec.billed_from
    return rec.stage("up").started if "up" in rec.stages else None


def billed_until(rec: Record, now: float) -> float:
    """The current instance bills until its termination was confirmed (at the end, or for its replacement)."""
    down = rec.stages.get("down")
    until = now
    if down is not None and down.ended is not None and down.ok:
        until = down.ended
    elif rec.recovering and rec.recovering.get("ended"):
        until = rec.recovering["ended"]
    return min(until, rec.lost_at) if rec.lost_at is not None else until


def attempt_cost(att: dict) -> float:
    """A replaced instance's dollars: from its launch to its confirmed termination, every node."""
    if att.get("started") is None or not att.get("price_per_hour"):
        return 0.0
    return max(0.0, att["ended"] - att["started"]) / 3600.0 * att["price_per_hour"] * max(1, att.get("nodes") or 1)


def spend(rec: Record, now: float) -> float:
    """Dollars spent so far on every instance of the run, every node (0 before `up` or without a price)."""
    past = sum(attempt_cost(a) for a in rec.attempts + rec.reclaimed) + prepplan.spend(rec.prep, now)
    start = billed_since(rec)
    if start is None or not rec.price_per_hour:
        return past
    return past + max(0.0, billed_until(rec, now) - start) / 3600.0 * rec.price_per_hour * max(1, rec.nodes)


def over_budget(rec: Record, now: float) -> bool:
    """--max-cost is reached: what the run spent, with what stopping now will still bill (money.tail_s: the job's
    stop, the final fetch, the termination), is the cap."""
    return rec.max_cost is not None and spend(rec, now) + tail_cost(rec) >= rec.max_cost


def tail_cost(rec: Record) -> float:
    """Dollars the run bills after it decides to stop (money.tail_s), from what this run measured: its sync stage
    (a connection and an rsync), the last checkpoint fetch's time."""
    from .money import tail_s

    if not rec.price_per_hour:
        return 0.0
    sync = rec.stages.get("sync")
    round_s = sync.ended - sync.started if sync is not None and sync.ended and sync.started else None
    last = (rec.checkpoint or {}).get("fetch_s")
    secs = tail_s(round_s, len(rec.fetch), last, SAMPLE_S, rec.terminate_s)
    return secs / 3600.0 * rec.price_per_hour * max(1, rec.nodes)


def _stage_rows(stages: dict, per_s: float, now: float, instance: int,
                billed_from: Optional[float] = None, billed_to: Optional[float] = None) -> list[dict]:
    rows = []
    for name in STAGES + ("recover",):
        st = stages.get(name)
        if st is None or st.started is None:
            continue
        end = st.ended if st.ended is not None else now
        secs = max(0.0, end - st.started)
        # `up`: nothing bills before the launch; nothing after the instance was seen gone (preempted)
        billed = max(0.0, min(end, billed_to if billed_to is not None else end) - max(st.started, billed_from or 0.0))
        rows.append({"stage": name, "label": LABELS[name], "seconds": round(secs, 1), "cost": round(billed * per_s, 4),
                     "ok": st.ok, "detail": st.detail, "instance": instance})
    return rows


def summary(rec: Record, now: float) -> list[dict]:
    """Time and money per stage, in order, every instance's (`instance`: 1 for the first): what `run` prints."""
    rows = []
    order = _launch_order(rec)  # the numbers instances() gives (a reclaimed bring-up has no stages of its own)
    for att in rec.attempts:
        per_s = (att.get("price_per_hour") or 0.0) * max(1, att.get("nodes") or 1) / 3600.0
        rows += _stage_rows({k: Stage(**v) for k, v in att["stages"].items()}, per_s, att["ended"],
                            order.index(id(att)) + 1, att.get("started"))
    per_s = (rec.price_per_hour or 0.0) * max(1, rec.nodes) / 3600.0
    first = [r for r in [prepplan.row(rec.prep, now) if rec.prep else None] if r]  # its own instance: its own price
    return first + rows + _stage_rows(rec.stages, per_s, now, len(order) + 1, rec.billed_from, rec.lost_at)


def _launch_order(rec: Record) -> list:
    """The ended instances (replaced, reclaimed), in launch order, as ids of their dicts."""
    return [id(a) for a in sorted(rec.attempts + rec.reclaimed,
                                  key=lambda a: a.get("started") or a.get("ended") or 0.0)]


def instances(rec: Record, now: float) -> list[dict]:
    """Each instance of the run, in launch order: its ids, type, region, billed time and cost, and how it ended. The
    preparation's instances (--prep) come first, numbered 0 with `role` prep; the training's are numbered from 1."""
    rows = []
    # in launch order: a reclaimed bring-up came before the instance launched after it
    for att in sorted(rec.attempts + rec.reclaimed, key=lambda a: a.get("started") or a.get("ended") or 0.0):
        inst = att.get("instance") or {}
        rows.append({"instance": len(rows) + 1, "ids": inst.get("ids") or [], "type": inst.get("type"),
                     "region": inst.get("region"), "started": att.get("started"), "ended_at": att.get("ended"),
                     "seconds": round(max(0.0, att["ended"] - (att["ended"] if att.get("started") is None
                                                              else att["started"])), 1),
                     "cost": round(attempt_cost(att), 4), "ended": att.get("reason")})
    start = billed_since(rec)
    up = rec.stages.get("up")
    failed = up is not None and up.ok is False and (not rec.instance or bool(rec.instance.get("failed")))
    if start is not None and not (failed and rec.billed_from is None):  # a launch that never billed is no row
        inst = rec.instance or {}
        down = rec.stages.get("down")
        ended = (rec.lost if rec.lost and not rec.terminated_by else "terminated" if down is not None and down.ok
                 else rec.lost or
                 ("replacing it: " + rec.recovering["reason"] if rec.recovering else
                  f"launch failed ({up.detail}); terminated by the launch" if failed else "running"))
        until = billed_until(rec, now) if not failed else (up.ended or now)
        secs = max(0.0, until - start)
        rows.append({"instance": len(rows) + 1, "ids": inst.get("ids") or [], "type": inst.get("type"),
                     "region": inst.get("region"), "started": start, "ended_at": None if ended == "running" else until,
                     "seconds": round(secs, 1),
                     "cost": round(secs / 3600.0 * (rec.price_per_hour or 0.0) * max(1, rec.nodes), 4),
                     "ended": ended})
    return prepplan.instance_rows(rec.prep, now) + rows


def overhead(rec: Record) -> dict:
    """Billed seconds gpuops itself adds around the job, boot aside: from `active` (the end of `up`) to the job's
    start (setup + sync + launch), and from the job's end to the termination request."""
    st = rec.stages
    before = after = None
    if "up" in st and st["up"].ended and "watch" in st and st["watch"].started:
        before = st["watch"].started - st["up"].ended
    if "watch" in st and st["watch"].ended and "down" in st and st["down"].started:
        after = st["down"].started - st["watch"].ended
    return {"before_job_s": before, "after_job_s": after}


# -- recovery ------------------------------------------------------------------------------------------------------
def why_not_recover(rec: Record, now: float) -> Optional[str]:
    """Why the run's instance is not replaced now (None: it is): no --recover, every recovery used, the job had ended,
    the run is stopping, --max-cost reached, or too little of --ttl left for another instance."""
    if rec.recover <= 0:
        return "no --recover"
    if len(rec.attempts) >= rec.recover:
        return f"--recover {rec.recover}: every replacement used"
    if rec.job_state in ("succeeded", "failed", "stopped"):
        return f"the job had ended ({rec.job_state})"
    if rec.stop_reason:
        return f"the run is stopping ({rec.stop_reason})"
    if over_budget(rec, now):
        return f"--max-cost ${rec.max_cost:.2f} reached"
    if rec.ttl_deadline is not None and rec.ttl_deadline - now < RECOVER_MIN_TTL_S:
        return "the run's --ttl ends in less than 5 minutes"
    return None


def ttl_left(rec: Record, now: float) -> Optional[float]:
    """The TTL of an instance launched now: what is left of the run's (None: no --ttl)."""
    if rec.ttl_deadline is None:
        return rec.ttl_s
    return max(1.0, rec.ttl_deadline - now)


def archive(rec: Record, ended: float) -> dict:
    """The replaced instance, its stages, job, time and price, moved into rec.attempts; the run starts again at `up`
    (the checkpoint to resume from stays in rec.resume_from)."""
    att = {"instance": rec.instance or {}, "price_per_hour": rec.price_per_hour, "nodes": rec.nodes,
           "started": billed_since(rec), "ended": ended, "reason": (rec.recovering or {}).get("reason"),
           "run_id": rec.run_id, "job_state": rec.job_state, "ending": rec.ending,
           "stages": {k: asdict(v) for k, v in rec.stages.items()}}
    rec.attempts.append(att)
    rec.stages, rec.run_id, rec.job_state, rec.instance, rec.recovering = {}, None, None, None, None
    rec.ending = None
    rec.job_started = None
    rec.billed_from = None  # the next instance bills from its own launch
    rec.lost_at = None
    return att


# -- the record on disk ---------------------------------------------------------------------------------------------
def records_dir(project: Path) -> Path:
    return project / "runs" / "pipelines"


def save(rec: Record, project: Path) -> Path:
    from ..paths import write_atomic

    path = records_dir(project) / f"{rec.id}.json"
    write_atomic(path, json.dumps(rec.to_json(), indent=1) + "\n")
    return path


def load_all(project: Path) -> list[Record]:
    out = []
    d = records_dir(project)
    if not d.is_dir():
        return out
    for f in d.glob("*.json"):
        try:
            out.append(Record.from_json(json.loads(f.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    out.sort(key=lambda r: r.created, reverse=True)
    return out


def find(project: Path, run: Optional[str]) -> Optional[Record]:
    """The run to resume: the id given (or a unique prefix), else the newest one not finished."""
    recs = load_all(project)
    if run:
        exact = [r for r in recs if r.id == run] or [r for r in recs if r.id.startswith(run)]
        return exact[0] if len(exact) == 1 else None
    return next((r for r in recs if r.outcome in (RUNNING, DETACHED)), None)


class RunLock:
    """One live process per run: an exclusive lock (flock) on runs/pipelines/<id>.lock, held while the process runs
    it and released by the kernel when the process ends, however it ends (kill -9 included: a dead process's lock
    is taken over). The file says which process holds it."""

    def __init__(self, rec_id: str, project: Path):
        self.rec_id, self.path, self.fd = rec_id, records_dir(project) / f"{rec_id}.lock", None

    def acquire(self, profile: str = "") -> "RunLock":
        import fcntl
        import os
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise UsageError(f"run {self.rec_id} is going on in {holder}: one process per run, nothing was done",
                             hint=(f"gpuops watch -p {profile} follows it; " if profile else "")
                             + "stop that process (Ctrl-C) before gpuops run --resume takes the run over") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        import os

        if self.fd is not None:
            if not self.path.with_suffix(".json").exists():  # the record was removed (nothing was launched):
                self.path.unlink(missing_ok=True)           # its lock goes too, while still held (issue #36)
            os.close(self.fd)  # the lock goes with the descriptor
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def begin(rec: Record, name: str, project: Path, clock=time.time) -> None:
    """A stage starts; one run again (resumed after a crash, or retried) keeps its first start, so the summary covers
    the whole run, the time the local process was gone included (the instance billed meanwhile)."""
    st = rec.stage(name)
    st.started, st.ended, st.ok, st.detail = st.started or clock(), None, None, None
    save(rec, project)


def setup_detail(doc: dict, *, verified: bool) -> str:
    """The setup row of the summary: what setup did (its steps, or nothing), then verify's word. Until #36 it read
    "the host matches the profile" after installing 36 to 120 packages."""
    steps = [s.get("title", "") for s in ((doc.get("plan") or {}).get("steps") or [])] if doc.get("ran") else []
    did = ("re-attached to the setup running there" if doc.get("attached") else
           f"{len(steps)} step{'s' if len(steps) != 1 else ''} done: {'; '.join(steps)}" if steps else
           "nothing to install")
    return f"{did}; verify passes" if verified else f"{did}; verify fails after setup: the host does not match the profile"


def run_name(name: Optional[str], script: str) -> str:
    """The run's name (its record file and its profile, run-<name>-<time>-<random>): --name as given, checked before
    anything is written (no '/', no leading '.', letters, digits, '-', '_', '.'); else the script's stem made one."""
    if name is not None:
        if not _NAME.match(name) or len(name) > NAME_MAX:
            raise UsageError(f"--name {name!r}: letters, digits, '-', '_' and '.' only, starting with a letter or digit, "
                             f"at most {NAME_MAX} characters", hint="the name becomes a file under runs/pipelines/ and "
                                                                    "the run's profile name")
        return name
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem).strip("-._")[:NAME_MAX].rstrip("-._")
    return stem or "run"


def end(rec: Record, name: str, project: Path, *, ok: bool, detail: Optional[str] = None, clock=time.time) -> None:
    st = rec.stage(name)
    st.ended, st.ok, st.detail = clock(), ok, detail
    save(rec, project)
