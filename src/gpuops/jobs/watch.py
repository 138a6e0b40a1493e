"""Watching a run: ONE long-lived remote stream, its parser, a reconnecting follower and the dashboard model.

The stream (stream_command) is one remote shell that
  - writes the run's log to stdout from a byte offset (`tail -c +N -F`), so the client knows exactly how many
    bytes of the log it has and resumes from there after a reconnect, without repeating or losing lines;
  - writes tagged lines to stderr: `G` GPU samples (`nvidia-smi --query-gpu ... -lms`), `PS` GPU processes,
    `RUN` the run's state when it changes, `H` a heartbeat, and `END` after the run ended; on request (Extras),
    with the heartbeat, `HG` the GPUs' health fields and `HX` the kernel log's Xid lines (when they change), and at
    each sample `CK` a folder's signature (its file count and a checksum of their names, sizes and times: `gpuops run`
    fetches each new checkpoint).
Nothing here starts a remote command per refresh. The stream model (StreamModel) and the dashboard model are pure;
follow_to_end is the loop watch and logs -f run; rendering (JSON docs, plain lines, the rich screen) is at the bottom.
"""
from __future__ import annotations

import re
import select
import shlex
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from ..errors import ConnectError, RemoteError
from ..remote.shell import shell_path
from .plan import GPU_QUERY, RUNNING, RunInfo, cost, fmt_duration, parse_state_line

HEARTBEAT_TICKS = 10  # heartbeat every 10 ticks (5 s at the default tick)
DASH_LINES_MAX = 500  # the dashboard keeps at most this many log lines (--lines replays more, to stdout only)


# -- the remote stream ---------------------------------------------------------------------------------
# The health fields a running job's stream samples: what verify's FAIL rules read (verify/checks_health.health_failures).
# An older driver refuses a field it does not know (the whole query fails): the next set, without it, is tried.
HEALTH_FIELD_SETS = (
    "index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure,retired_pages.pending,"
    "gpu_recovery_action",
    "index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure,retired_pages.pending",
    "index,ecc.errors.uncorrected.volatile.total")


@dataclass
class Extras:
    """What a stream samples beyond the log, the GPU line and the processes (one stream, no extra execution)."""
    health: bool = False  # HG health fields and HX Xid lines, with the heartbeat
    checkpoints: Optional[str] = None  # a remote folder whose signature (CK: files, checksum of the listing)


def _extras_script(extras: Optional[Extras]) -> tuple[str, str, str]:
    """(shell functions, what runs with the heartbeat, what runs at each sample) for the extras."""
    if extras is None:
        return "", "", ""
    fns, beat, each = "", "", ""
    if extras.health:
        fns += ("HF=; lastx=\n"
                "gpuops_health() {\n"
                f"  for f in ${{HF:-{' '.join(HEALTH_FIELD_SETS)}}}; do\n"
                "    o=$(nvidia-smi --query-gpu=$f --format=csv,noheader,nounits 2>/dev/null) || continue\n"
                "    HF=$f; printf '%s\\n' \"$o\" | sed \"s/^/HG $f /\" >&2; break\n"
                "  done\n"
                "  x=$({ dmesg 2>/dev/null || journalctl -k -b -q --no-pager 2>/dev/null; } | grep -F 'NVRM: Xid' "
                "| tail -n 50)\n"
                "  if [ \"$x\" != \"$lastx\" ]; then printf '%s\\n' \"$x\" | sed 's/^/HX /' >&2; lastx=$x; fi\n"
                "}\n")
        beat = "gpuops_health; "
    if extras.checkpoints:
        C = shell_path(extras.checkpoints)
        fns += ("gpuops_ck() {\n"  # files, and a checksum of their names, sizes and times: any change shows
                f"  l=$(find -H {C} -type f -printf '%P %s %T@\\n' 2>/dev/null | sort)\n"
                "  echo \"CK $(printf '%s' \"$l\" | grep -c .) $(printf '%s' \"$l\" | cksum | cut -d' ' -f1)\" >&2\n"
                "}\n")
        each = "gpuops_ck; "
    return fns, beat, each


def health_once_command() -> str:
    """ONE execution: the GPUs' health now, in the stream's own lines on stdout (HG health fields, HX the kernel
    log's Xid lines, G the GPU line or nvidia-smi's failure, "GPU is lost"): parse_stderr_line and HealthWatch read
    them as they read the stream. What `run` reads once more when its job fails (a GPU's failure, or the job's?)."""
    fns, beat, _ = _extras_script(Extras(health=True))
    return ("exec 2>&1\n" + fns + beat.strip().rstrip(";") + "\n"
            f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1 | sed 's/^/G /'\n")


def stream_command(run_id: str, run_dir: str, *, offset: int, interval: float = 2.0, samples: bool = True,
                   tick: float = 0.5, extras: Optional[Extras] = None) -> str:
    from .scripts import STATE_FN

    fns, beat, each = _extras_script(extras)
    D = shell_path(run_dir)
    rid = shlex.quote(run_id)
    ms = max(100, int(interval * 1000))
    every = max(1, int(round(interval / tick)))
    smi = ""
    if samples:
        smi = (f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits -lms {ms} 2>&1 "
               "| sed -u 's/^/G /' >&2 &\n")
        procs = ('echo "PS $(nvidia-smi --query-compute-apps=pid,process_name,used_memory '
                 '--format=csv,noheader,nounits 2>/dev/null | tr \'\\n\' \';\')" >&2')
    else:
        procs = ":"
    return STATE_FN + fns + f"""
D={D}
{smi}tail --pid=$$ -c +{int(offset) + 1} -F "$D/log" 2>/dev/null &
last=; n=0
while :; do
  gpuops_state "$D" {rid} >/dev/null
  key="$g_alive/$g_rc/$g_stop"
  if [ "$key" != "$last" ]; then echo "$g_line" >&2; last=$key; fi
  if [ "$g_alive" != 1 ]; then
    sleep 0.3
    trap '' TERM
    kill -TERM 0 2>/dev/null
    gpuops_state "$D" {rid} >&2
    {procs}
    echo END >&2
    exit 0
  fi
  if [ $((n % {every})) = 0 ]; then {each}{procs}; fi
  if [ $((n % {HEARTBEAT_TICKS})) = 0 ]; then {beat}echo "H $(date +%s) $(wc -c < "$D/log" 2>/dev/null || echo 0)" >&2; fi
  n=$((n+1))
  sleep {tick}
done
"""


def once_command(run_id: str, run_dir: str, lines: int) -> str:
    from .scripts import STATE_FN

    D = shell_path(run_dir)
    return STATE_FN + f"""
gpuops_state {D} {shlex.quote(run_id)}
nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1 | sed 's/^/G /'
echo "PS $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null | tr '\\n' ';')"
echo "@log"
[ -f {D}/log ] && tail -n {int(lines)} {D}/log
"""


def start_offset_command(run_id: str, run_dir: str, lines: Optional[int]) -> str:
    """State, then the byte offset where the last N lines of the log begin (both measured on the same first `sz`
    bytes, so a job writing meanwhile cannot move the offset into the middle of a line); lines=None: the log's
    first byte (`gpuops run` prints the job's lines from the first)."""
    from .scripts import STATE_FN

    D = shell_path(run_dir)
    if lines is None:
        return STATE_FN + f"\ngpuops_state {D} {shlex.quote(run_id)}\necho 'START 0'\n"
    return STATE_FN + f"""
gpuops_state {D} {shlex.quote(run_id)}
if [ -f {D}/log ]; then
  sz=$(wc -c < {D}/log | tr -d ' '); t=$(head -c "$sz" {D}/log | tail -n {int(lines)} | wc -c | tr -d ' ')
  echo "START $((sz - t))"
else
  echo "START 0"
fi
"""


def start_position(remote, run_id: str, run_dir: str, lines: Optional[int]) -> tuple[RunInfo, int]:
    """The run's state and the log offset that replays its last N lines; RemoteError when the run does not exist."""
    res = remote.run("sh -s", stdin=start_offset_command(run_id, run_dir, lines), timeout=60)
    info, start = None, 0
    for line in res.stdout.splitlines():
        if line.startswith("RUN "):
            info = parse_state_line(line)
        elif line.startswith("START "):
            start = max(0, int(line.split()[1]))
    if info is None or not info.exists:
        raise RemoteError(f"run {run_id} not found on the host ({run_dir})")
    return info, start


def once_events(remote, run_id: str, run_dir: str, lines: int) -> list[dict]:
    """One snapshot in one execution: state, GPU samples, processes, then the last N log lines (offset None)."""
    res = remote.run("sh -s", stdin=once_command(run_id, run_dir, lines), timeout=60)
    head, _, log = res.stdout.partition("@log\n")
    events = [ev for ev in map(parse_stderr_line, head.splitlines()) if ev]
    return events + [{"type": "log", "line": line, "offset": None} for line in log.splitlines()]


# -- parsing ------------------------------------------------------------------------------------------
def health_command(beat_s: float = 5.0) -> str:
    """A fleet's other hosts while a run watches node 0's stream: their health lines (HG, HX) and a heartbeat (H),
    every beat_s, as one long-lived command writing to its stdout (parse_stderr_line reads them)."""
    fns, beat, _ = _extras_script(Extras(health=True))
    return "exec 2>&1\n" + fns + f"while :; do {beat}echo \"H $(date +%s)\" >&2; sleep {beat_s:g}; done\n"


def sample_command(interval: float = 2.0) -> str:
    """The GPU samples alone, as one long-lived command (a fleet watch's other hosts: no command per refresh)."""
    return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits -lms {max(100, int(interval * 1000))} 2>&1"


def parse_gpu(text: str) -> Optional[dict]:
    """`0, NVIDIA H100 PCIe, 95, 48935, 81559, 63, 290.00` -> dict; None when not a sample (an error)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 7 or not parts[0].isdigit():
        return None

    def num(v: str):
        try:
            return float(v)
        except ValueError:
            return None

    idx, name, rest = int(parts[0]), ", ".join(parts[1:len(parts) - 5]), parts[-5:]
    util, used, total, temp, power = (num(v) for v in rest)
    return {"index": idx, "name": name, "util": util, "mem_used": used, "mem_total": total, "temp": temp,
            "power": power}


def parse_procs(text: str) -> list[dict]:
    out = []
    for item in text.split(";"):
        parts = [p.strip() for p in item.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            try:
                mem = float(parts[2])
            except ValueError:
                mem = None
            out.append({"pid": int(parts[0]), "name": parts[1], "mem_used": mem})
    return out


def parse_stderr_line(line: str) -> Optional[dict]:
    """One tagged line of the stream's stderr -> an event (None for an unknown line)."""
    if line.startswith("G "):
        g = parse_gpu(line[2:])
        return {"type": "sample", "gpu": g} if g else {"type": "gpu_error", "message": line[2:].strip()}
    if line.startswith("PS"):
        return {"type": "processes", "processes": parse_procs(line[2:])}
    if line.startswith("RUN "):
        info = parse_state_line(line)
        return {"type": "state", "info": info} if info else None
    if line.startswith("HG "):
        fields, _, values = line[3:].partition(" ")
        return {"type": "health", "fields": fields.split(","), "line": values}
    if line.startswith("HX "):
        return {"type": "xid", "line": line[3:]}
    if line.startswith("CK "):
        parts = line.split()
        return {"type": "checkpoints", "sig": tuple(parts[1:3])} if len(parts) >= 3 else None
    if line.startswith("H "):
        parts = line.split()  # H <the host's clock> [<the log's size>]: how far behind a follower reads
        try:
            return {"type": "heartbeat", "at": float(parts[1]),
                    **({"size": int(parts[2])} if len(parts) > 2 and parts[2].isdigit() else {})}
        except (ValueError, IndexError):
            return {"type": "heartbeat"}
    if line.strip() == "END":
        return {"type": "end"}
    return None


_ERR = [
    (re.compile(r"Traceback \(most recent call last\)"), "error"),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I), "error"),
    (re.compile(r"\bNCCL\b.*\b(error|failure|timed? ?out|unhandled)\b|\bNCCL_?(ERROR|WARN)\b|ncclInternalError|"
                r"ncclSystemError|ncclUnhandledCudaError", re.I), "error"),
    (re.compile(r"\bloss\b[^\n]{0,20}?[=:]\s*[-+]?(nan|inf)\b", re.I), "error"),
    (re.compile(r"^\w*(Error|Exception)\b[:(]|^\s*raise\b|RuntimeError:|Killed$|Segmentation fault"), "error"),
    (re.compile(r"warning\b|\bWARN\b", re.I), "warning"),
]


def classify(line: str) -> Optional[str]:
    """'error' for tracebacks, CUDA OOM, NCCL errors, NaN/inf losses; 'warning' for warnings; else None."""
    for rx, kind in _ERR:
        if rx.search(line):
            return kind
    return None


# -- the follower (network) ------------------------------------------------------------------------------
@dataclass
class FollowState:
    offset: int  # bytes of the log already delivered (complete lines only)
    info: Optional[RunInfo] = None
    connections: int = 0
    bytes_in: int = 0


GIVE_UP_S = 300.0  # a watch stops reconnecting after this long without a connection
MAX_LINE = 1 << 20  # a "line" longer than this (a job printing without newlines) is delivered in pieces


class LineSplitter:
    """Complete lines (without the newline, as raw bytes) of one byte stream, however it is chunked. Memory stays
    bounded: a line longer than max_line is delivered in pieces of max_line bytes (returned as (bytes, False))."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.pending = bytearray()  # an incomplete line
        self._scanned = 0  # bytes of pending already searched for a newline (a long line is not rescanned)
        self.max_line = max_line

    def feed_pieces(self, data: bytes) -> list[tuple[bytes, bool]]:
        """(bytes, ends_with_newline) pieces."""
        self.pending += data
        lines, start = [], 0
        while True:
            nl = self.pending.find(b"\n", max(start, self._scanned))
            if nl >= 0 and nl - start <= self.max_line:
                lines.append((bytes(self.pending[start:nl]), True))
                start = nl + 1
            elif (nl >= 0 or len(self.pending) - start > self.max_line):
                lines.append((bytes(self.pending[start:start + self.max_line]), False))
                start += self.max_line
            else:
                break
            self._scanned = start
        del self.pending[:start]
        self._scanned = len(self.pending)
        return lines

    def feed(self, data: bytes) -> list[bytes]:
        return [raw for raw, _ in self.feed_pieces(data)]


class StreamModel:
    """The pure half of stream_once: the stream's stdout (the log from fs.offset) and stderr (tagged lines) in, events
    out. Each has its own buffer: a log line of any length is one event however many chunks it arrives in, and a
    tagged line received meanwhile is its own event, never part of it. fs.offset counts the RAW bytes of the complete
    log lines delivered; decoding (invalid UTF-8 replaced) is for display only and never feeds an offset."""

    def __init__(self, fs: "FollowState"):
        self.fs = fs
        self.log = LineSplitter()
        self.tags = LineSplitter()
        self.ended = False

    def _log_event(self, raw: bytes, nl: bool) -> dict:
        """`raw`: the log's bytes exactly (for logs -f); `line`: decoded for display (invalid UTF-8 replaced);
        `nl`: whether a newline followed in the log."""
        self.fs.offset += len(raw) + (1 if nl else 0)
        return {"type": "log", "line": raw.decode("utf-8", "replace"), "raw": raw, "nl": nl, "offset": self.fs.offset}

    def log_bytes(self, data: bytes) -> list[dict]:
        return [self._log_event(raw, nl) for raw, nl in self.log.feed_pieces(data)]

    def tag_bytes(self, data: bytes) -> list[dict]:
        events = []
        for raw in self.tags.feed(data):
            ev = parse_stderr_line(raw.decode("utf-8", "replace"))
            if ev is None:
                continue
            if ev["type"] == "state":
                self.fs.info = ev["info"]
            elif ev["type"] == "end":
                self.ended = True
            events.append(ev)
        return events

    def restart_log(self) -> None:
        """The log's bytes from fs.offset are read again after the run ended (rest_of_log): they replace the
        incomplete line the stream held."""
        self.log = LineSplitter()

    def rest_of_log(self, data: bytes, *, last: bool = True) -> list[dict]:
        """A chunk of the log's rest; with last, a final line without a newline is delivered too."""
        events = self.log_bytes(data)
        if last and self.log.pending:
            events.append(self._log_event(bytes(self.log.pending), False))
            self.log = LineSplitter()
        return events


def stream_once(remote, run_id: str, run_dir: str, fs: FollowState, *, interval: float, samples: bool,
                idle_timeout: float = 20.0, tick: float = 0.5, extras: Optional[Extras] = None) -> Iterator[dict]:
    """Events of one stream on a live connection. Returns normally only after END (the run ended);
    raises ConnectError when the connection drops or goes silent."""
    chan = remote.stream(stream_command(run_id, run_dir, offset=fs.offset, interval=interval, samples=samples,
                                        tick=tick, extras=extras))
    model = StreamModel(fs)
    last = time.monotonic()
    try:
        while True:
            if not (chan.recv_ready() or chan.recv_stderr_ready()):
                select.select([chan], [], [], 0.25)
            got = False
            # one chunk of each per turn, so a long log line arriving in many chunks does not hold back the samples
            for ready, recv, feed in ((chan.recv_ready, chan.recv, model.log_bytes),
                                      (chan.recv_stderr_ready, chan.recv_stderr, model.tag_bytes)):
                data = recv(1 << 16) if ready() else b""
                if data:
                    got = True
                    fs.bytes_in += len(data)
                    yield from feed(data)
            if got:
                last = time.monotonic()
                continue
            if chan.exit_status_ready() or chan.eof_received or chan.closed:
                if not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
            if not remote.transport.is_active():
                raise ConnectError(f"connection to {remote.profile.host} was lost")
            if time.monotonic() - last > idle_timeout:
                raise ConnectError(f"no data from {remote.profile.host} for {idle_timeout:g}s")
    finally:
        try:
            chan.close()
        except Exception:
            pass
    if not model.ended:
        if remote.transport.is_active() and chan.exit_status_ready():
            raise RemoteError(f"the watch stream ended unexpectedly on the host (exit {chan.recv_exit_status()})")
        raise ConnectError(f"connection to {remote.profile.host} was lost")
    # the run ended: deliver the rest of the log (bytes tail had not sent yet, and a last line without newline),
    # streamed in chunks so memory stays bounded however much is left
    from .scripts import stream_from

    size = fs.info.log_size if fs.info else 0
    if size > fs.offset:
        model.restart_log()
        for chunk in stream_from(remote, run_dir, fs.offset, size):
            yield from model.rest_of_log(chunk, last=False)
        yield from model.rest_of_log(b"", last=True)


def follow(connect: Callable[[], object], run_id: str, run_dir: str, fs: FollowState, *, interval: float = 2.0,
           samples: bool = True, give_up_after: float = GIVE_UP_S, backoff_max: float = 15.0,
           sleep: Callable[[float], None] = time.sleep, idle_timeout: float = 20.0,
           extras: Optional[Extras] = None) -> Iterator[dict]:
    """Events until the run ends, reconnecting with backoff when the connection drops (the log resumes at
    fs.offset). Authentication and host-key errors are not retried; after give_up_after seconds without a
    connection, ConnectError."""
    from ..errors import AuthError, HostKeyError

    delay, down_since, attempt = 1.0, None, 0
    remote = None
    while True:
        try:
            if remote is None:
                remote = connect()
                fs.connections += 1
                if down_since is not None:
                    yield {"type": "connected", "attempts": attempt}
                down_since, delay, attempt = None, 1.0, 0
            for ev in stream_once(remote, run_id, run_dir, fs, interval=interval, samples=samples,
                                  idle_timeout=idle_timeout, extras=extras):
                yield ev
            remote.close()
            return
        except (AuthError, HostKeyError):
            raise
        except ConnectError as exc:
            if remote is not None:
                remote.close()
                remote = None
            now = time.monotonic()
            down_since = down_since if down_since is not None else now
            if now - down_since > give_up_after:
                raise ConnectError(f"{exc}; gave up reconnecting after {give_up_after:g}s",
                                   hint="the job keeps running; `gpuops watch` again later") from exc
            attempt += 1
            yield {"type": "reconnecting", "attempt": attempt, "delay": delay, "error": str(exc)}
            sleep(min(delay, max(0.0, give_up_after - (now - down_since)) + 0.1))
            delay = min(delay * 2, backoff_max)


def follow_to_end(connect: Callable[[], object], run_id: str, run_dir: str, fs: FollowState, dash: "Dashboard", *,
                  interval: float, samples: bool, on_event: Callable[[dict], None] = lambda ev: None,
                  extras: Optional[Extras] = None, give_up_after: float = GIVE_UP_S) -> bool:
    """watch's and logs -f's loop: every event of follow() into the dashboard model, then to on_event (rendering).
    False when interrupted (Ctrl-C): the job keeps running; True when the run ended (fs.info holds its state)."""
    try:
        for ev in follow(connect, run_id, run_dir, fs, interval=interval, samples=samples, extras=extras,
                         give_up_after=give_up_after):
            if ev["type"] == "sample" and fs.info is not None and fs.info.exists and not fs.info.alive:
                continue  # the run has ended: a GPU sample now is another job's
            dash.apply(ev)
            on_event(ev)
    except KeyboardInterrupt:
        return False
    return True


# -- the instance's health and the checkpoints, as a run watches them (pure) --------------------------------
FATAL_SMI_FAILURES = ("gpu-lost",)  # nvidia-smi failures (knowledge.yaml ids) that end a GPU's usefulness


class HealthWatch:
    """The stream's health lines (HG: the health fields, HX: the kernel log's Xid lines) and nvidia-smi's own failure
    on the GPU line, judged by verify's rules (verify.checks_health.health_failures; playbooks/xid.yaml, knowledge.yaml):
    apply(ev) returns the facts that end a GPU's usefulness not returned before, a line each. Judged since boot, as
    verify judges: a host that passed verify had none."""

    def __init__(self, xid_table: Optional[dict] = None, smi_failures: Optional[list] = None):
        self.xid_table = xid_table
        self.smi_failures = smi_failures or []
        self.health: dict = {}  # GPU index -> GpuHealth (the newest sample)
        self.xids: dict = {}  # kernel log line -> parsed Xid
        self.said: set = set()

    def apply(self, ev: dict) -> list[str]:
        from ..verify.checks_health import health_failures
        from ..verify.facts import classify_smi_failure, parse_health, parse_xids

        t = ev.get("type")
        found = []
        if t == "health":
            for h in parse_health(ev["line"], ev["fields"]):
                self.health[h.index] = h
        elif t == "xid":
            for x in parse_xids([ev["line"]]):
                self.xids[x["line"]] = x
        elif t == "gpu_error":
            st = classify_smi_failure(None, ev["message"], self.smi_failures)
            if st.failure in FATAL_SMI_FAILURES:
                found.append(f"nvidia-smi: {st.title}: {st.message}")
        else:
            return []
        if t != "gpu_error":
            for r in health_failures(list(self.health.values()), list(self.xids.values()), xid_table=self.xid_table):
                found.append(f"{r.title}: {r.measured}" + (f" ({r.detail})" if r.detail and r.id == "gpu.xid" else ""))
        new = [f for f in found if f not in self.said]
        self.said.update(new)
        return new


class CheckpointWatch:
    """The stream's CK lines (the checkpoint folder's file count and listing checksum) in; apply(ev) is True when the
    folder changed and then held still for `samples` samples in a row (the same signature that many times), not yet
    fetched in that state, and no fetch is under way. done(sig) after the fetch: that state is not fetched again."""

    def __init__(self, samples: int = 2) -> None:
        self.samples = max(2, samples)
        self.last: Optional[tuple] = None
        self.seen = 0  # how many samples in a row showed `last`
        self.fetched: Optional[tuple] = None
        self.busy: Optional[tuple] = None  # the state being fetched

    def apply(self, ev: dict) -> bool:
        if ev.get("type") != "checkpoints":
            return False
        sig = ev["sig"]
        self.seen = self.seen + 1 if sig == self.last else 1
        self.last = sig
        if self.seen >= self.samples and self.busy is None and sig != self.fetched and sig[0] != "0":
            self.busy = sig
            return True
        return False

    def done(self) -> None:
        self.fetched, self.busy = self.busy, None


# -- the dashboard model (pure) ---------------------------------------------------------------------------
@dataclass
class GpuView:
    index: int
    host: int = 0  # a fleet run: the host's rank
    name: str = ""
    last: dict = field(default_factory=dict)
    util: deque = field(default_factory=lambda: deque(maxlen=40))
    mem: deque = field(default_factory=lambda: deque(maxlen=40))


class Dashboard:
    def __init__(self, meta: dict, *, price_per_hour: Optional[float] = None, log_lines: int = 15,
                 clock: Callable[[], float] = time.time, signal_spec: Optional[dict] = None, host: int = 0):
        self.meta = meta
        self.host = host  # the rank whose log and processes are shown; samples of other hosts carry "host"
        self.run_id = meta.get("run_id", "")
        self.price = price_per_hour if price_per_hour is not None else meta.get("price_per_hour")
        self.clock = clock
        self.gpus: dict[tuple[int, int], GpuView] = {}  # (host rank, GPU index)
        self.gpu_error: Optional[str] = None
        self.procs: list[dict] = []
        self.info: Optional[RunInfo] = None
        self.log: deque = deque(maxlen=log_lines)
        self.errors = 0
        self.link = "connecting"
        self._signal_spec = signal_spec
        self.sig = None  # the training-signal model (jobs/signals.py), made on the first event

    # -- training signals (jobs/signals.py; patterns in playbooks/signals.yaml) -------------------------------------
    def _signals(self, ev: dict) -> None:
        """Feed the signal model; the signals newly raised go into ev["signals"], a new parsed step into
        ev["progress"], for the renderers (each signal is raised once per run)."""
        from . import signals as sg

        if self.sig is None:
            spec = self._signal_spec if self._signal_spec is not None else sg.load_spec()
            self.sig = sg.SignalModel(spec, started=self.meta.get("started_ts"), price_per_hour=self.price)
        t, now = ev.get("type"), self.clock()
        if t == "state" and ev["info"].started is not None:
            self.sig.started = ev["info"].started
        elif t == "sample" and ev.get("host", self.host) == self.host:  # signals: the followed host's GPUs
            new = self.sig.sample(ev["gpu"], now)
            if new:
                ev["signals"] = new
        elif t == "log":
            before = (self.sig.step, len(self.sig.losses), self.sig.throughput)
            new = self.sig.line(ev["line"], now)
            if new:
                ev["signals"] = new
            if (self.sig.step, len(self.sig.losses), self.sig.throughput) != before:
                ev["progress"] = self.sig.progress(now)
                ev["new_step"] = self.sig.step != before[0]  # a second format's line of the same step: not a new one

    def progress(self) -> Optional[dict]:
        return self.sig.progress(self.clock()) if self.sig else None

    @property
    def signals(self) -> list:
        return self.sig.signals if self.sig else []

    def apply(self, ev: dict) -> None:
        t = ev.get("type")
        if t in ("sample", "log", "state"):
            self._signals(ev)
        if t == "sample":
            g = ev["gpu"]
            host = ev.get("host", self.host)
            v = self.gpus.setdefault((host, g["index"]), GpuView(g["index"], host))
            v.name, v.last = g["name"], g
            v.util.append(g["util"] or 0)
            if g["mem_total"]:
                v.mem.append(100.0 * (g["mem_used"] or 0) / g["mem_total"])
            if host == self.host:
                self.gpu_error = None
                self.link = "live"
        elif t == "gpu_error":
            self.gpu_error = (f"host #{ev['host']}: " if ev.get("host", self.host) != self.host else "") + ev["message"]
        elif t == "processes":
            self.procs = ev["processes"]
        elif t == "state":
            self.info = ev["info"]
            self.link = "live"
        elif t == "log":
            kind = classify(ev["line"])
            if kind == "error":
                self.errors += 1
            self.log.append((safe_text(ev["line"]), kind))
        elif t == "reconnecting":
            self.link = f"reconnecting (attempt {ev['attempt']}, next in {ev['delay']:g}s): {ev['error']}"
        elif t == "connected":
            self.link = "live"

    # derived
    @property
    def state(self) -> str:
        return self.info.state if self.info else "unknown"

    def elapsed(self) -> Optional[float]:
        if self.info and self.info.started is not None:
            return self.info.elapsed(self.clock())
        st = self.meta.get("started_ts")
        return max(0.0, self.clock() - st) if st else None

    def cost(self) -> Optional[float]:
        return cost(self.elapsed(), self.price)

    def state_text(self) -> str:
        s = self.state
        if self.info and self.info.exit_code is not None and s != RUNNING:
            s += f" (exit {self.info.exit_code})"
        if self.info and self.info.stopped:
            s += f" by {self.info.stopped.get('signal', '?')}"
        c = self.cost()
        money = f", cost ${c:.2f}" if c is not None else ""
        return f"{self.run_id}: {s}, elapsed {fmt_duration(self.elapsed())}{money}"


# -- rendering ------------------------------------------------------------------------------------------------
def event_doc(ev: dict, ts: float) -> Optional[dict]:
    """An event as watch --json prints it (one object per line); None for events that are not shown."""
    t = ev["type"]
    if t in ("end", "heartbeat"):
        return None
    from ..jsonvocab import iso, renamed

    doc = {"type": t, "at": iso(ts, "milliseconds")}  # docs/json.md: times ISO 8601 with a zone, named *_at
    if t == "sample":
        doc.update(renamed(ev["gpu"]))
        if "host" in ev:
            doc["rank"] = ev["host"]  # a fleet's host number (`host` is an address everywhere else)
    elif t == "state":
        doc.update(renamed(ev["info"].to_json()))
    elif t == "log":
        doc.update(line=ev["line"], offset=ev.get("offset"), kind=classify(ev["line"]))
    else:
        doc.update(renamed({("rank" if k == "host" else k): v for k, v in ev.items() if k != "type"}))
    return doc


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe_text(line: str) -> str:
    """A job's log line made harmless for a terminal: what a carriage return would leave visible (progress bars),
    and every other control character (ESC starts cursor moves, title changes, screen clears) shown as \\xNN
    instead of interpreted. Raw `gpuops logs` keeps the bytes as they are, as `tail` does."""
    if "\r" in line:
        parts = [p for p in line.split("\r") if p]
        line = parts[-1] if parts else ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def event_text(ev: dict, dash: "Dashboard", stamp: str) -> Optional[str]:
    """An event as a plain timestamped line (not a terminal, or NO_COLOR); None for events that are not shown."""
    t = ev["type"]
    host = f"host#{ev['host']} " if "host" in ev else ""
    if t == "sample":
        return f"{stamp} {host}{gpu_text(ev['gpu'])}"
    if t == "gpu_error":
        return f"{stamp} {host}nvidia-smi: {ev['message']}"
    if t == "processes":
        procs = ", ".join(f"{p['pid']} {p['name']}" for p in ev["processes"]) or "none"
        return f"{stamp} gpu processes: {procs}"
    if t == "state":
        return f"{stamp} state {dash.state_text()}"
    if t == "log":
        mark = {"error": "!", "warning": "~"}.get(classify(ev["line"]) or "", "|")
        return f"{stamp} log {mark} {safe_text(ev['line'])}"
    if t == "reconnecting":
        return f"{stamp} reconnecting (attempt {ev['attempt']}, in {ev['delay']:g}s): {ev['error']}"
    if t == "connected":
        return f"{stamp} reconnected; resuming the log"
    return None


def signal_docs(ev: dict, ts: float) -> list[dict]:
    """watch --json: the training signals an event raised ({"type": "signal"}) and a new parsed step
    ({"type": "progress"})."""
    from ..jsonvocab import iso, renamed

    at = iso(ts, "milliseconds")
    docs = [{"type": "signal", "at": at, **renamed(sig)} for sig in ev.get("signals") or []]
    if ev.get("progress"):
        docs.append({"type": "progress", "at": at, **renamed(ev["progress"])})
    return docs


def signal_lines(ev: dict, stamp: str) -> list[str]:
    """Plain watch: `HH:MM:SS signal: <title>: <hint>` once per signal; progress every 10th parsed step, once per
    step when the log prints each step in two formats (a trainer's line and a logger's dict)."""
    from .signals import progress_text, signal_text

    lines = [f"{stamp} {signal_text(sig)}" for sig in ev.get("signals") or []]
    p = ev.get("progress")
    if p and ev.get("new_step", True) and (p.get("step") is None or p["step"] % 10 == 0 or (p.get("total") and p["step"] >= p["total"])):
        lines.append(f"{stamp} progress {progress_text(p)}")
    return lines


def gpu_text(g: dict) -> str:
    def n(v, fmt="{:.0f}"):
        return "?" if v is None else fmt.format(v)

    return (f"gpu{g['index']} util={n(g['util'])}% mem={n(g['mem_used'])}/{n(g['mem_total'])}MiB "
            f"temp={n(g['temp'])}C power={n(g['power'])}W")


def render(dash: Dashboard):
    """A rich renderable of the whole screen, fitted to the terminal at every redraw (jobs/screen.py)."""
    from .screen import Screen

    return Screen(dash)
