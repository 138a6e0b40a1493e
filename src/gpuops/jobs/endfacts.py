"""What a job died of, the facts: gathered on the host by the remote execution that sees the death, read here.

Two places gather them, neither with an execution of its own:
  - the launcher (jobs/scripts.launcher_script), the job's parent, at the moment the job ends: the cgroup's OOM-kill
    count before and after (cgroup v2 memory.events, v1 memory.oom_control), the signal the launcher itself received,
    `df -Pk` and `df -Pi` of the folders the job writes (the project folder, $HOME, /tmp, GPUOPS_DATA, GPUOPS_FS,
    HF_HOME), and the job's processes (every pid that carried GPUOPS_RUN_DIR while it ran, sampled into <run
    dir>/pids by a loop of the launcher: twice a second for 10 s, then every 5 s), into <run dir>/end.facts, before
    it writes exit_code (so whoever sees the end sees them);
  - whatever notices the end (watch's stream, `watch --once`, `status`), in the execution it already runs: the
    kernel's OOM-killer and Xid lines (dmesg, else `journalctl -k -o short-unix`) with the host's clock and uptime to
    place them in time, when the log last changed, the log's last lines and end.facts. Tagged lines, one fact each:
        EN - now <epoch> <uptime>      EN - K <kernel line> (`@unreadable`: neither tool could read it)
        EN <run> M <log mtime>         EN <run> F <end.facts line>      EN <run> L <log line>
The parsing and the facts (EndFacts) are pure; the judgement is jobs/endings.py.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Optional

TAIL_LINES = 60  # the log's last lines read at the death (playbooks/endings.yaml settings.tail_lines)
TAIL_BYTES = 16000
KERNEL_LINES = 40
KERNEL_PATTERN = "Killed process|oom-kill:|invoked oom-killer|NVRM: Xid"
PIDS_MAX = 5000  # the job's pids the launcher keeps (more: the list is partial, and a pid not in it is not ruled out)

# launch.sh, before the job: the cgroup's OOM kills so far (v2: memory.events, counted for the cgroup and below it;
# v1: memory.oom_control), to compare with the count once the job has ended
LAUNCHER_BEFORE = r"""gpuops_oom() {
  gpuops_cg=$(sed -n 's/^0:://p' /proc/self/cgroup 2>/dev/null)
  if [ -n "$gpuops_cg" ] && [ -r "/sys/fs/cgroup$gpuops_cg/memory.events" ]; then
    sed -n 's/^oom_kill //p' "/sys/fs/cgroup$gpuops_cg/memory.events"; return 0; fi
  gpuops_cg=$(sed -n 's/^[0-9]*:[^:]*memory[^:]*://p' /proc/self/cgroup 2>/dev/null)
  [ -n "$gpuops_cg" ] && sed -n 's/^oom_kill //p' "/sys/fs/cgroup/memory$gpuops_cg/memory.oom_control" 2>/dev/null
}
gpuops_oom0=$(gpuops_oom)
gpuops_pids() {  # the job's processes while it runs (those carrying GPUOPS_RUN_DIR, as `stop` finds them), kept in
  # $D/pids: an OOM kill in the kernel log is tied to the job by the pid it names; its own commands carry no mark of
  # the run (neither `stop` nor a GPU tool counts them as the job's)
  unset GPUOPS_RUN_DIR GPUOPS_RUN_ID
  trap 'kill $gpuops_z 2>/dev/null; exit 0' TERM
  gpuops_i=0
  while [ ! -f "$D/exit_code" ]; do
    { cat "$D/pids" 2>/dev/null; grep -lzxF -- "GPUOPS_RUN_DIR=$D" /proc/[0-9]*/environ 2>/dev/null |
        sed 's#^/proc/##; s#/environ$##'; } | sort -un > "$D/pids.tmp" 2>/dev/null && mv -f "$D/pids.tmp" "$D/pids"
    if [ "$(wc -l < "$D/pids")" -ge """ + str(PIDS_MAX) + r""" ]; then : > "$D/pids.full"; exit 0; fi  # a bounded list
    gpuops_i=$((gpuops_i+1)); gpuops_t=5; [ $gpuops_i -lt 20 ] && gpuops_t=0.5
    sleep $gpuops_t & gpuops_z=$!; wait $gpuops_z
  done
}
gpuops_pids </dev/null >/dev/null 2>&1 &
gpuops_pidw=$!"""

# launch.sh, once the job has ended and before exit_code is written: end.facts (df bounded by `timeout`: a hung
# network mount never keeps the launcher from recording the exit code)
LAUNCHER_AFTER = r"""kill "$gpuops_pidw" 2>/dev/null
unset GPUOPS_RUN_DIR GPUOPS_RUN_ID  # the job is over: its launcher's own commands (df) carry no mark of the run
{
  echo "pids $(tr '\n' ' ' < "$D/pids" 2>/dev/null)"
  [ -f "$D/pids.full" ] && echo "pids_full"
  echo "oom_kill ${gpuops_oom0:--} $(gpuops_oom || true)"
  [ -n "$gpuops_signal" ] && echo "signal $gpuops_signal"
  echo "at $(date +%s)"
  if command -v timeout >/dev/null 2>&1; then
    set -- . "$HOME" /tmp
    for gpuops_p in "${GPUOPS_DATA:-}" "${GPUOPS_FS:-}" "${HF_HOME:-}"; do [ -n "$gpuops_p" ] && [ -e "$gpuops_p" ] && set -- "$@" "$gpuops_p"; done
    timeout 5 df -Pk "$@" 2>/dev/null | sed '1d; s/^/df /'
    timeout 5 df -Pi "$@" 2>/dev/null | sed '1d; s/^/dfi /'
  fi
} > "$D/end.facts.tmp" 2>/dev/null && mv "$D/end.facts.tmp" "$D/end.facts"
"""

# the host-wide facts (once per execution) and a run's, as shell functions; output on stdout (the stream: >&2)
GATHER_FN = r"""
gpuops_kern() {
  dmesg 2>/dev/null && return 0
  journalctl -k -b -q --no-pager -o short-unix 2>/dev/null | grep . && return 0
  return 1
}
gpuops_endhost() {
  echo "EN - now $(date +%s) $(cut -d' ' -f1 /proc/uptime 2>/dev/null)"
  { gpuops_kern || echo @unreadable; } | grep -E '""" + KERNEL_PATTERN + r"""|^@unreadable' | tail -n """ + str(
    KERNEL_LINES) + r""" | sed 's/^/EN - K /'
}
gpuops_endrun() {
  echo "EN $2 M $(stat -c %Y "$1/log" 2>/dev/null)"
  [ -f "$1/end.facts" ] && sed "s/^/EN $2 F /" "$1/end.facts"
  [ -f "$1/log" ] && tail -n """ + str(TAIL_LINES) + " \"$1/log\" | tail -c " + str(TAIL_BYTES) + r""" | tr -d '\r' | sed "s/^/EN $2 L /"
}
"""


def gather_lines(run_dir_shell: str, run_id: str) -> str:
    """Shell: the host's facts and one run's (its folder already quoted for the shell)."""
    return f"gpuops_endhost\ngpuops_endrun {run_dir_shell} {shlex.quote(run_id)}\n"


# -- the facts (pure) ---------------------------------------------------------------------------------------------
@dataclass
class DiskRow:
    mount: str
    size: int  # KiB, or inodes
    used: int
    avail: int
    use_pct: Optional[int]
    inodes: bool = False


@dataclass
class EndFacts:
    """Everything the classifier reads about one job's end (missing facts stay None / empty)."""
    run_id: str
    exit_code: Optional[int] = None
    alive: bool = False
    stopped: Optional[dict] = None  # stop.json: gpuops stopped it
    started: Optional[float] = None
    ended: Optional[float] = None
    log_mtime: Optional[float] = None
    log_tail: list = field(default_factory=list)
    now: Optional[float] = None  # the host's clock when the facts were read
    uptime: Optional[float] = None
    kernel: list = field(default_factory=list)  # raw kernel log lines (OOM killer, Xid)
    kernel_readable: Optional[bool] = None  # None: not asked
    end_facts: bool = False  # the launcher wrote end.facts
    ended_at: Optional[float] = None  # the launcher's clock when the job ended
    oom_kill: Optional[tuple] = None  # (before, after) of the cgroup's oom_kill count
    launcher_signal: Optional[str] = None  # a signal the launcher received (TERM, HUP, INT)
    disks: list = field(default_factory=list)  # DiskRow, at the job's end
    gpu_error: Optional[str] = None  # nvidia-smi's failure when the end was seen ("GPU is lost")
    gpu_util: list = field(default_factory=list)  # utilisation samples taken while it ran (watch)
    stop_reason: Optional[str] = None  # who stopped it when gpuops did (run: --max-cost reached)
    pids: Optional[set] = None  # the job's processes the launcher saw (None: no list; an OOM kill tied by time)
    pids_full: bool = False  # the list reached PIDS_MAX: a pid not in it may still have been the job's
    # a scheduler's word on the end (a Slurm job: slurm.states.SlurmEnding.facts(): state, reason, exit code and
    # signal, who cancelled it, its requeues and nodes, and `evidence`, the line that says so); None: no scheduler
    scheduler: Optional[dict] = None

    @property
    def boot(self) -> Optional[float]:
        """The host's boot time on its own clock."""
        if self.now is None or self.uptime is None:
            return None
        return self.now - self.uptime


def _num(text: str, cast=int):
    try:
        return cast(text)
    except (TypeError, ValueError):
        return None


def parse_df(line: str, inodes: bool) -> Optional[DiskRow]:
    """A `df -P` data row: `Filesystem Size Used Avail Use% Mounted-on` (the mount point may hold spaces)."""
    parts = line.split()
    if len(parts) < 6:
        return None
    size, used, avail = (_num(p) for p in parts[1:4])
    pct = _num(parts[4].rstrip("%"))
    if size is None or used is None or avail is None:
        return None
    return DiskRow(mount=" ".join(parts[5:]), size=size, used=used, avail=avail, use_pct=pct, inodes=inodes)


def _end_fact(f: EndFacts, line: str) -> None:
    key, _, rest = line.partition(" ")
    f.end_facts = True
    if key == "oom_kill":
        a, _, b = rest.partition(" ")
        f.oom_kill = (_num(a), _num(b.strip()))
    elif key == "signal":
        f.launcher_signal = rest.strip() or None
    elif key == "pids_full":
        f.pids_full = True
    elif key == "pids":
        got = {n for n in (_num(x) for x in rest.split()) if n is not None}
        f.pids = got or None
    elif key == "at":
        f.ended_at = _num(rest.strip(), float)
    elif key in ("df", "dfi"):
        row = parse_df(rest, key == "dfi")
        if row and not any(d.mount == row.mount and d.inodes == row.inodes for d in f.disks):
            f.disks.append(row)


def parse(lines: Iterable[str]) -> dict:
    """`EN ...` lines (other lines ignored) -> {"host": {...}, "runs": {run id: {"M", "F": [...], "L": [...]}}}."""
    host: dict = {"kernel": [], "readable": None}
    runs: dict = {}
    for line in lines:
        if not line.startswith("EN "):
            continue
        rid, _, rest = line[3:].partition(" ")
        tag, _, value = rest.partition(" ")
        if rid == "-":
            if tag == "now":
                now, _, up = value.partition(" ")
                host["now"], host["uptime"] = _num(now, float), _num(up.strip(), float)
            elif tag == "K":
                if value.strip() == "@unreadable":
                    host["readable"] = False
                else:
                    host["kernel"].append(value)
                    host["readable"] = True
            continue
        r = runs.setdefault(rid, {"M": None, "F": [], "L": []})
        if tag == "M":
            r["M"] = _num(value.strip(), float)
        elif tag in ("F", "L"):
            r[tag].append(value)
    if host["readable"] is None and "now" in host:
        host["readable"] = True  # readable, with no line of interest
    return {"host": host, "runs": runs}


def facts_for(parsed: dict, info, **extra) -> EndFacts:
    """One run's EndFacts from parse()'s result and its RunInfo (jobs.plan); extra: gpu_error, gpu_util,
    stop_reason known to the caller."""
    host = parsed.get("host") or {}
    r = (parsed.get("runs") or {}).get(info.run_id) or {"M": None, "F": [], "L": []}
    f = EndFacts(run_id=info.run_id, exit_code=info.exit_code, alive=info.alive, stopped=info.stopped,
                 started=info.started, ended=info.ended, log_mtime=r["M"], log_tail=list(r["L"]),
                 now=host.get("now"), uptime=host.get("uptime"), kernel=list(host.get("kernel") or []),
                 kernel_readable=host.get("readable"))
    for line in r["F"]:
        _end_fact(f, line)
    for k, v in extra.items():
        if v is not None:
            setattr(f, k, v)
    return f


# -- kernel lines placed in time -----------------------------------------------------------------------------------
_DMESG = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?(.*)$")
_UNIX = re.compile(r"^(\d{9,}(?:\.\d+)?)\s+\S+\s+kernel:\s?(.*)$")
_SHORT = re.compile(r"^([A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d)\s+\S+\s+kernel:\s?(.*)$")


def kernel_time(line: str, boot: Optional[float], now: Optional[float] = None) -> tuple[Optional[float], str]:
    """(epoch on the host's clock or None, the message) of a kernel log line: dmesg's `[secs since boot]`,
    journalctl's `-o short-unix` epoch, or its short `Mon DD HH:MM:SS` (the year taken from `now`)."""
    m = _DMESG.match(line)
    if m:
        return (boot + float(m.group(1)) if boot is not None else None), m.group(2)
    m = _UNIX.match(line)
    if m:
        return float(m.group(1)), m.group(2)
    m = _SHORT.match(line)
    if m:
        import time as _t

        year = _t.localtime(now if now is not None else _t.time()).tm_year
        try:
            return _t.mktime(_t.strptime(f"{year} {m.group(1)}", "%Y %b %d %H:%M:%S")), m.group(2)
        except ValueError:
            return None, m.group(2)
    return None, line
