"""Why a job ended, judged (pure): the facts of its death (jobs/endfacts.EndFacts) against the causes of
playbooks/endings.yaml, each a row of knowledge with its source. classify() returns the verdict every surface shows
(watch, status, `run`'s summary and --json, the dashboard), or None for a job that succeeded or still runs:

    {"cause": "<id>", "title": "<one line>", "evidence": ["..."], "fix": "...", "source": "..."}

Rows are tried in order and the first that holds names the cause; the evidence is what made it hold, then the
exit code or signal, and whatever else was found about the death (an OOM kill, a full disk, the last exception)."""
from __future__ import annotations

import re
import signal as _signal
from typing import Optional

from .endfacts import DiskRow, EndFacts, kernel_time

_OOM = re.compile(r"(?:Memory cgroup out of memory|Out of memory)[^:]*: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                  r"(?:.*?anon-rss:(?P<rss>\d+)kB)?")
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+),?\s*(?P<text>.*)$")
_PREFIX = re.compile(r"^(?:\[[^\]]{1,40}\]:?\s*|\([^)]{1,60}\)\s*|\d+:\s+)+")  # [rank0]:, [default0]:, (pid=12) ...
_EXC = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<name>[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)?)"
                  r"(?::\s?(?P<msg>.*))?$")
_SMI_LOST = re.compile(r"GPU is lost|fallen off the bus|Unable to determine the device handle", re.I)
KILLING = {"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGABRT"}  # sent to end a process


def load(project_dir=None) -> dict:
    """playbooks/endings.yaml (the project's copy wins over the shipped one)."""
    from ..knowledge import load_playbook

    return load_playbook("endings", project_dir)


def xid_table(project_dir=None) -> dict:
    """playbooks/xid.yaml: what each Xid code means and how grave it is."""
    from ..knowledge import load_playbook

    return load_playbook("xid", project_dir)


def signal_name(code: Optional[int]) -> Optional[str]:
    """The signal a shell's exit code 128+N reports (SIGKILL for 137), or None."""
    if code is None or code <= 128 or code > 128 + 64:
        return None
    try:
        return _signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def clean(line: str) -> str:
    """A log line without a launcher's prefix (torchrun's `[rank0]:`, Ray's `(pid=12)`), trimmed."""
    return _PREFIX.sub("", line.strip()).strip()


def last_exception(tail: list) -> Optional[str]:
    """The last exception's line of the log's tail: the line ending the last traceback, else the last line that
    reads `SomethingError: message`."""
    lines = [clean(x) for x in tail]
    tb = max((i for i, x in enumerate(lines) if x.startswith("Traceback (most recent call last)")), default=None)
    scan = lines[tb + 1:] if tb is not None else lines
    found = None
    for x in scan:
        m = _EXC.match(x)
        if not m or x.startswith(("File ", "  ")):
            continue
        name = m.group("name")
        if tb is not None and (m.group("msg") is not None or name.endswith(("Error", "Exception", "Interrupt"))):
            found = x  # the traceback's last exception line (a chained one ends it again)
        elif tb is None and m.group("msg") is not None and name.endswith(("Error", "Exception")):
            found = x
    return found[:300] if found else None


def _fmt(text: str, values: dict) -> str:
    """{name} placeholders filled from values; an unknown one left as it is."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]) if values.get(m.group(1)) is not None
                  else m.group(0), text or "")


def _dur(seconds: float) -> str:
    from .plan import fmt_duration

    return fmt_duration(seconds)


def _size(kib: int) -> str:
    for unit, div in (("TB", 1 << 30), ("GB", 1 << 20), ("MB", 1 << 10)):
        if kib >= div:
            return f"{kib / div:.1f} {unit}"
    return f"{kib} KB"


def _without_launchers_note(tail: list, signal: Optional[str]) -> list:
    """The log's tail without the launcher's own word on a job killed by a signal: launch.sh (sh, dash) prints a bare
    `Killed` (`Terminated`, ...) after its foreground job died of SIGKILL, which is not a command of a script being
    killed (bash's `script.sh: line 3: 1234 Killed  python ...` is)."""
    notes = {"SIGKILL": "Killed", "SIGTERM": "Terminated", "SIGHUP": "Hangup", "SIGABRT": "Aborted"}
    lines = list(tail)
    while lines and not lines[-1].strip():
        lines.pop()
    if signal in notes and lines and clean(lines[-1]) == notes[signal]:
        lines.pop()
    return lines


class Judge:
    """The facts of one death, and the derived facts the playbook's `fact:` rows name."""

    def __init__(self, f: EndFacts, spec: dict, xid_table: Optional[dict] = None):
        self.f = f
        self.settings = spec.get("settings") or {}
        self.xid_table = (xid_table or {}).get("xids") or {}
        self.window = float(self.settings.get("window_s", 10))
        self.code = f.exit_code
        self.signal = signal_name(f.exit_code)
        self.end = f.ended if f.ended is not None else (f.ended_at if f.ended_at is not None else f.now)
        self.tail = _without_launchers_note(f.log_tail, self.signal)
        self.exception = last_exception(self.tail)
        self.kernel = [kernel_time(x, f.boot, f.now) + (x,) for x in f.kernel]
        self.values = {"code": self.code, "signal": self.signal or (f"exit {self.code}" if self.code is not None
                                                                     else "a signal"),
                       "exception": self.exception}
        self.scheduler = f.scheduler or {}
        if self.scheduler:
            self.values.update(_scheduler_values(self.scheduler))

    def scheduler_ended(self, states) -> bool:
        """The scheduler (Slurm) ended the job in one of `states` (TIMEOUT, NODE_FAIL, ...) on its own: not a stop
        gpuops asked for (stop.json, a stop reason), which the `stopped` row names."""
        state = str(self.scheduler.get("state") or "").upper()
        return bool(state) and state in {str(x).upper() for x in states} and not (self.f.stopped or
                                                                                   self.f.stop_reason)

    # -- placed in the job's lifetime -------------------------------------------------------------------------------
    def _during(self, t: Optional[float]) -> Optional[bool]:
        """True/False: the time falls in the job's life (or just after: the launcher writes the end); None: unknown."""
        if t is None or self.f.started is None:
            return None
        end = self.end if self.end is not None else t
        return self.f.started - 1 <= t <= end + self.window

    def oom_kills(self) -> list:
        """The kernel's OOM-killer lines that were the job's: [(time, message, raw)]. With the launcher's list of the
        job's processes (end.facts `pids`), a line naming a pid is the job's when the pid is in it (and its time, where
        known, fits the job's life); without the list, by time: a line of the job's lifetime, or one that cannot be
        placed in time when the job died by SIGKILL or with its launcher (what the OOM killer leaves)."""
        return [k for k in self._oom_lines() if k[3] is not False]

    def oom_others(self) -> list:
        """OOM kills of the job's lifetime whose pid was not one of the job's: [(time, message, raw, False)]."""
        return [k for k in self._oom_lines() if k[3] is False and self._during(k[0])]

    def _oom_lines(self) -> list:
        """[(time, message, raw, mine)]: mine True (its pid is the job's), None (tied by time), False (not the job's
        pid, or not of its lifetime)."""
        killed = self.signal == "SIGKILL" or (self.code is None and not self.f.alive)
        out = []
        for t, msg, raw in self.kernel:
            m = _OOM.search(msg)
            if not m:
                continue
            during = self._during(t)
            if self.f.pids and (int(m.group("pid")) in self.f.pids or not self.f.pids_full):
                out.append((t, msg, raw, int(m.group("pid")) in self.f.pids and during is not False))
            else:  # no list, or a pid a full list lacks: by time
                out.append((t, msg, raw, None if during or (during is None and killed) else False))
        return out

    def xids(self) -> list:
        """Xid lines of the job's lifetime: [(code, severity, meaning, message)]."""
        out = []
        for t, msg, _ in self.kernel:
            m = _XID.search(msg)
            if m and self._during(t):
                code = int(m.group("code"))
                row = self.xid_table.get(code) or self.xid_table.get(str(code)) or {}
                out.append((code, row.get("severity", "warn"), row.get("meaning", ""), msg.strip()))
        return out

    # -- the facts rows name -----------------------------------------------------------------------------------------
    def fact(self, name: str) -> tuple[bool, list, Optional[str]]:
        """(holds, evidence, detail) of a derived fact."""
        return getattr(self, "fact_" + name, lambda: (False, [], None))()

    def fact_gpu(self):
        ev, detail = [], None
        bad = [x for x in self.xids() if x[1] == "fail"]
        for code, _, meaning, msg in bad:
            ev.append(f"kernel log: {msg}" + (f" ({meaning})" if meaning else ""))
            detail = detail or f"Xid {code}" + (f", {meaning.split(':')[0]}" if meaning else "")
        if self.f.gpu_error and _SMI_LOST.search(self.f.gpu_error):
            ev.append(f"nvidia-smi: {self.f.gpu_error.strip()[:200]}")
            detail = detail or "nvidia-smi: GPU is lost"
        return bool(ev), ev, detail

    def fact_host_oom(self):
        kills = self.oom_kills()
        ev = [f"kernel log: {msg.strip()[:240]}" for _, msg, _, _ in kills[-2:]]
        detail = None
        if kills:
            m = _OOM.search(kills[-1][1])
            ev.append(f"process {m.group('pid')} was one of the job's processes (the launcher's list: pids in the "
                      "run's folder on the host)"
                      if kills[-1][3] else "tied to the job by time only: the kill fell in its lifetime (no list of "
                                           "its processes to name the pid)")
            rss = f", {_size(int(m.group('rss')))} resident" if m and m.group("rss") else ""
            detail = f"process {m.group('pid')} {m.group('name')}{rss}" if m else None
        oom = self.f.oom_kill
        if oom and oom[0] is not None and oom[1] is not None and oom[1] > oom[0]:
            ev.append(f"the job's cgroup counted {oom[1] - oom[0]} OOM kill(s) while it ran (memory.events "
                      f"oom_kill {oom[0]} -> {oom[1]})")
            detail = detail or "the job's cgroup memory limit"
        return bool(ev), ev, detail

    def _full(self, inodes: bool) -> list:
        return [d for d in self.f.disks if d.inodes == inodes and d.size > 0 and
                (d.avail <= 0 or (d.use_pct is not None and d.use_pct >= 100))]

    def _disk_text(self, d: DiskRow) -> str:
        if d.inodes:
            return f"df -i at the end: {d.mount} {d.use_pct}% of inodes used ({d.avail} free of {d.size})"
        return f"df at the end: {d.mount} {d.use_pct}% used, {_size(d.avail)} free of {_size(d.size)}"

    def fact_inodes_full(self):
        full = self._full(True)
        enospc = self._log_match([r"No space left on device", r"\[Errno 28\]"])
        ok = bool(full) and (enospc is not None or not self._full(False))
        ev = ([f"log: {enospc}"] if enospc else []) + [self._disk_text(d) for d in full]
        return ok, ev, (f"{full[0].mount}: {full[0].avail} inodes free" if full else None)

    def fact_disk_full(self):
        full = self._full(False)
        return bool(full), [self._disk_text(d) for d in full], (
            f"{full[0].mount} {full[0].use_pct}% used" if full else None)

    def quiet(self) -> Optional[float]:
        """How long the log had been still when the job was stopped (stop.json: the log's time when the stop was
        asked, before a signal made it print), or when it ended."""
        s = self.f.stopped or {}
        if isinstance(s.get("log_mtime"), (int, float)) and isinstance(s.get("requested"), (int, float)):
            return max(0.0, s["requested"] - s["log_mtime"])
        if self.f.log_mtime is None or self.end is None:
            return None
        return max(0.0, self.end - self.f.log_mtime)

    def fact_hang(self):
        q = self.quiet()
        limit = float(self.settings.get("hang_quiet_s", 600))
        killed = bool(self.f.stopped) or self.signal in KILLING or self.code == 124 or (
            self.code is None and not self.f.alive)
        if q is None or q < limit or not killed:
            return False, [], None
        self.values["quiet"] = _dur(q)
        self.values["how"] = ("stopped" if self.f.stopped else "killed")
        ev = [f"no output for {_dur(q)} before it ended (the log last changed then; the limit: "
              f"{_dur(limit)}, playbooks/endings.yaml settings.hang_quiet_s)"]
        if self.f.gpu_util:
            recent = self.f.gpu_util[-10:]
            ev.append(f"GPU utilisation in its last {len(recent)} samples: {min(recent):.0f}-{max(recent):.0f} % "
                      "(a collective spinning on a lost peer reads 100 %)")
        return True, ev, None

    def fact_rebooted(self):
        boot = self.f.boot
        if self.code is not None or self.f.alive or boot is None or self.f.started is None or boot <= self.f.started:
            return False, [], None
        return True, [f"the host booted {_dur(boot - self.f.started)} after the job started (uptime "
                      f"{_dur(self.f.uptime or 0)}); the job left no exit code"], None

    def fact_stopped(self):
        s = self.f.stopped
        if not s and not self.f.stop_reason:
            return False, [], None
        by = self.f.stop_reason or f"{(s or {}).get('by', 'gpuops stop')} (SIG{(s or {}).get('signal', '?')})"
        self.values["stopped_by"] = by
        return True, [f"stop.json: stopped by {(s or {}).get('by', 'gpuops')} with SIG{(s or {}).get('signal', '?')}"
                      if s else f"stopped by gpuops run: {self.f.stop_reason}"], None

    def fact_killed_outside(self):
        if self.f.stopped or self.f.stop_reason:
            return False, [], None
        if self.signal in KILLING:
            return True, [], None
        if self.code is None and not self.f.alive:
            self.values["signal"] = "a signal that ended its launcher too"
            return True, ["no exit code: the launcher that records it ended with the job (a kill of the whole "
                          "process group, or of the session)"], None
        if self.f.launcher_signal:
            self.values["signal"] = f"SIG{self.f.launcher_signal}"
            return True, [f"the launcher received SIG{self.f.launcher_signal}"], None
        return False, [], None

    def fact_exception(self):
        return bool(self.exception), [], None

    def fact_failed(self):
        return (self.code not in (None, 0)) or (self.code is None and not self.f.alive), [], None

    # -- log rows ------------------------------------------------------------------------------------------------
    def _log_match(self, patterns: list) -> Optional[str]:
        """The newest line of the log's tail matching one of the patterns."""
        for line in (clean(x) for x in reversed(self.tail)):
            if line and any(re.search(p, line) for p in patterns):
                return line[:300]
        return None

    def log_row(self, row: dict) -> Optional[tuple[str, dict]]:
        pats = row.get("match") or []
        pats = [pats] if isinstance(pats, str) else pats
        lines = [self.exception] if row.get("scope") == "exception" else [clean(x) for x in reversed(self.tail)]
        for line in lines:
            if not line:
                continue
            for p in pats:
                m = re.search(p, line)
                if m:
                    return line[:300], {k: v for k, v in m.groupdict().items() if v is not None}
        return None


def _row_holds(j: Judge, row: dict) -> Optional[tuple[list, dict]]:
    """(evidence, values) when the row holds, else None."""
    ev, values = [], {}
    holds = False
    if row.get("fact"):
        ok, fev, detail = j.fact(row["fact"])
        if ok:
            holds, ev = True, list(fev)
            values["detail"] = detail
    if row.get("match"):
        got = j.log_row(row)
        if got:
            line, groups = got
            if not holds:
                values.update(groups)
            holds = True
            ev.insert(0, f"log: {line}")
    if j.code is not None and j.code in (row.get("exit") or []):
        holds = True
    if row.get("scheduler") and j.scheduler_ended(row["scheduler"]):
        holds = True
        ev.insert(0, j.scheduler.get("evidence") or f"the scheduler: {j.scheduler.get('state')}")
    return (ev, values) if holds else None


def _scheduler_values(s: dict) -> dict:
    """The placeholders a scheduler's row may use: {state}, {reason}, {node_list}, {restarts}, {cancelled_by}."""
    by = s.get("cancelled_by")
    who = ("uid 0 (root, or Slurm itself)" if str(by) == "0" else f"uid {by}") if by not in (None, "") else \
        "someone other than gpuops (Slurm did not record who)"
    return {"state": s.get("state"), "reason": s.get("reason") or "", "node_list": s.get("node_list") or "",
            "restarts": s.get("restarts") or 0, "cancelled_by": who}


def _scheduler_ended_it(f: EndFacts) -> bool:
    """A scheduler's state says it ended the job (a time limit, a node, preemption, a cancel), whatever exit code
    the batch script left: a job that traps SIGTERM at its time limit exits 0 and still timed out."""
    return bool(f.scheduler and f.scheduler.get("by_scheduler"))


def classify(f: EndFacts, spec: dict, xid_table: Optional[dict] = None) -> Optional[dict]:
    """The verdict on a job's end (the contract above), or None when it succeeded or still runs."""
    if f.alive or (f.exit_code == 0 and not f.stopped and not _scheduler_ended_it(f)):
        return None
    j = Judge(f, spec, xid_table)
    for row in spec.get("causes") or []:
        got = _row_holds(j, row)
        if got is None:
            continue
        ev, values = got
        values = {**j.values, **{k: v for k, v in values.items() if v is not None}}
        values.setdefault("detail", "")
        evidence = ev + _context(j, row["id"], ev)
        title = _fmt(row.get("title", row["id"]), values).replace(" ()", "").replace(": )", ")")
        return {"cause": row["id"], "title": title.strip(), "evidence": list(dict.fromkeys(evidence)),
                "fix": _fmt(row.get("fix", ""), values).strip(), "source": row.get("source", "")}
    return None


def verdict(cause: str, spec: dict, evidence: list, values: Optional[dict] = None) -> Optional[dict]:
    """The playbook's row `cause` as a verdict with the evidence given: what gpuops knows without the facts of the
    death (it stopped the job for --max-cost; its GPU failed, read by the health watch). None for an unknown id."""
    row = next((r for r in spec.get("causes") or [] if r.get("id") == cause), None)
    if row is None:
        return None
    values = {"detail": "", **(values or {})}
    return {"cause": cause, "title": _fmt(row.get("title", cause), values).replace(" ()", "").strip(),
            "evidence": list(dict.fromkeys(evidence)), "fix": _fmt(row.get("fix", ""), values).strip(),
            "source": row.get("source", "")}


def root(by_rank: dict, spec: dict) -> Optional[dict]:
    """A fleet run's ending: of the nodes that did not succeed ({rank: ending}), the one whose cause is not what
    another node's death does to the rest (settings.fleet_consequences: an NCCL timeout, a kill from outside by the
    launcher of the other ranks, ...), the lowest rank first; the verdict with its `host`."""
    later = set((spec.get("settings") or {}).get("fleet_consequences") or [])
    ranked = sorted((r, e) for r, e in by_rank.items() if e)
    if not ranked:
        return None
    rank, e = next(((r, e) for r, e in ranked if e.get("cause") not in later), ranked[0])
    return {**e, "host": rank}


def _context(j: Judge, cause: str, said: list) -> list:
    """What else the facts say about the death, after the row's own evidence: the exit code or signal, the last
    exception, an OOM kill or a full disk that did not name the cause, the kernel log unread."""
    f, out = j.f, []
    if f.stopped:
        pass  # stop.json said it
    elif j.code is not None:
        out.append(f"exit code {j.code}" + (f" (128 + {j.code - 128}: {j.signal})" if j.signal else ""))
    elif not f.alive and not f.scheduler and not any(s.startswith("no exit code") or "no exit code" in s
                                                     for s in said):
        out.append("no exit code: its launcher ended with it")
    if f.scheduler and f.scheduler.get("evidence") and f.scheduler["evidence"] not in said:
        out.append(f.scheduler["evidence"])
    if j.exception and not any(j.exception in s for s in said):
        out.append(f"last exception: {j.exception}")
    if cause != "host-oom":
        ok, ev, _ = j.fact_host_oom()
        out += ev if ok else []
    for _, msg, _, _ in j.oom_others()[-2:]:
        m = _OOM.search(msg)
        out.append(f"the kernel's OOM killer killed process {m.group('pid')} ({m.group('name')}) while the job ran, "
                   "not one of the job's processes (the launcher's list)")
    if cause not in ("disk-full", "inodes-full"):
        out += [j._disk_text(d) for d in j._full(False) + j._full(True)]
    if f.kernel_readable is False and cause in ("killed-outside", "killed-in-script", "failed", "hang"):
        out.append("the kernel log could not be read (dmesg not permitted, journalctl without the adm group): an "
                   "OOM kill cannot be ruled out")
    return out
