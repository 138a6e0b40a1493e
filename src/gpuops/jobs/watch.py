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
follow_to_end is the loop watch and logs -f run; rendering (JSON docs, plain lines, the rich screen) is watchtext.py.
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
# what watch shows as text lives in watchtext.py; its names are read as jobs.watch.* too (the dashboard, the tests)
from .watchtext import (classify, event_doc, event_text, gpu_text, render, safe_text,  # noqa: F401
                        signal_docs, signal_lines)
from .trainhealth import (FATAL_SMI_FAILURES, HEALTH_FIELD_SETS, HEALTH_FN, HealthWatch,  # noqa: F401
                          disk_command)  # the health and disk lines: read as jobs.watch.* (pipeline/recovery.py)

HEARTBEAT_TICKS = 10  # heartbeat every 10 ticks (5 s at the default tick)
DASH_LINES_MAX = 500  # the dashboard keeps at most this many log lines (--lines replays more, to stdout only)


# -- the remote stream ---------------------------------------------------------------------------------
@dataclass
class Extras:
    """What a stream samples beyond the log, the GPU line and the processes (one stream, no extra execution)."""
    health: bool = False  # HG health fields and HX Xid lines, with the heartbeat
    checkpoints: Optional[str] = None  # a remote folder whose signature (CK: files, checksum of the listing)
    disk: Optional[str] = None  # a remote folder whose disk (DK: df -Pk, DI: df -Pi), with every 6th heartbeat


def _extras_script(extras: Optional[Extras]) -> tuple[str, str, str]:
    """(shell functions, what runs with the heartbeat, what runs at each sample) for the extras."""
    if extras is None:
        return "", "", ""
    fns, beat, each = "", "", ""
    if extras.health:
        fns += HEALTH_FN
        beat = "gpuops_health; "
    if extras.disk:
        fns += "dn=0\ngpuops_disk() {\n  if [ $((dn % 6)) = 0 ]; then { " + disk_command(shell_path(extras.disk)) + \
            "; } >&2; fi\n  dn=$((dn+1))\n}\n"  # every line to stderr: stdout is the log's bytes alone
        beat += "gpuops_disk; "
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
    from .endfacts import GATHER_FN
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
    return STATE_FN + GATHER_FN + fns + f"""
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
    [ "$g_rc" = 0 ] || {{ gpuops_endhost; gpuops_endrun "$D" {rid}; }} >&2
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
    from .endfacts import GATHER_FN
    from .scripts import STATE_FN

    D = shell_path(run_dir)
    return STATE_FN + GATHER_FN + f"""
gpuops_state {D} {shlex.quote(run_id)}
[ "$g_alive" = 1 ] || [ "$g_rc" = 0 ] || {{ gpuops_endhost; gpuops_endrun {D} {shlex.quote(run_id)}; }}
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
    head, _, log = ("\n" + res.stdout).partition("\n@log\n")
    events = [ev for ev in map(parse_stderr_line, head.splitlines()) if ev]
    ended = [{"type": "end"}] if any(ev["type"] == "end_fact" for ev in events) else []  # the ending judged
    return events + [{"type": "log", "line": line, "offset": None} for line in log.splitlines()] + ended


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
    if line.startswith("EN "):
        return {"type": "end_fact", "line": line}
    if line.startswith(("DK ", "DI ")):
        return {"type": "disk", "inodes": line.startswith("DI"), "row": line[3:]}
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
    from ..remote.connection import output_complete

    model = StreamModel(fs)
    last, seen = time.monotonic(), {}
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
                seen.pop("exit_at", None)  # output_complete's silence starts again
                continue
            if output_complete(chan, seen):  # the exit status may come before the stream's last lines
                break
            if chan.exit_status_ready():
                continue
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
class CheckpointWatch:
    """The stream's CK lines (the checkpoint folder's file count and listing checksum) in; apply(ev) is True when the
    folder changed and then held still for `samples` samples in a row (the same signature that many times), not yet
    fetched in that state, and no fetch is under way. done(sig) after the fetch: that state is not fetched again.
    eager: also True at once when the folder changed since the last look (`mode` "changed", else "quiet"): its step
    folders are judged by the evidence that needs no stillness (a marker, a successor, the predecessor's files), so
    a job that checkpoints more often than the folder holds still for two samples (a loaded machine stretches them)
    still has its checkpoints taken; the look when it holds still follows as before."""

    def __init__(self, samples: int = 2, eager: bool = False) -> None:
        self.samples = max(2, samples)
        self.eager = eager
        self.last: Optional[tuple] = None
        self.seen = 0  # how many samples in a row showed `last`
        self.fetched: Optional[tuple] = None  # the state last looked at while it held still
        self.looked: Optional[tuple] = None  # the state last looked at as it changed (eager)
        self.busy: Optional[tuple] = None  # the state being fetched
        self.mode: Optional[str] = None  # why it is being fetched: "quiet" or "changed"

    def apply(self, ev: dict) -> bool:
        if ev.get("type") != "checkpoints":
            return False
        sig = ev["sig"]
        self.seen = self.seen + 1 if sig == self.last else 1
        self.last = sig
        if self.busy is not None or sig == self.fetched or sig[0] == "0":
            return False
        if self.seen >= self.samples:
            self.busy, self.mode = sig, "quiet"
            return True
        if self.eager and sig != self.looked:
            self.busy, self.mode, self.looked = sig, "changed", sig
            return True
        return False

    def done(self) -> None:
        if self.mode == "quiet":
            self.fetched = self.busy
        self.busy = None


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
        self._train = None  # the GPUs' health and the disk while it trains (jobs/trainhealth.py), on the first event
        self.end_lines: list[str] = []  # the facts of the job's death (EN lines: jobs/endfacts.py)
        self.ending: Optional[dict] = None  # what it died of (jobs/endings.py), once the stream has ended
        self.stop_reason: Optional[str] = None  # gpuops run stopped it (--max-cost): said in the ending

    # -- training signals (jobs/signals.py; patterns in playbooks/signals.yaml) -------------------------------------
    def _signals(self, ev: dict) -> None:
        """Feed the signal model; the signals newly raised go into ev["signals"], a new parsed step into
        ev["progress"], for the renderers (each signal is raised once per run)."""
        from . import signals as sg

        if self.sig is None:
            spec = self._signal_spec if self._signal_spec is not None else sg.load_spec()
            self.sig = sg.SignalModel(spec, started=self.meta.get("started_ts"), price_per_hour=self.price)
        t, now = ev.get("type"), self.clock()
        if t in ("health", "xid", "gpu_error", "disk") and ev.get("host", self.host) == self.host:
            new = self._health_signals(ev, spec=self._signal_spec)
            if new:
                ev["signals"] = new
                self.sig.signals.extend(new)
            return
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

    def _health_signals(self, ev: dict, spec=None) -> list:
        """The GPUs' health and the disk while it trains (jobs/trainhealth.py), as signals."""
        from . import signals as sg
        from .trainhealth import TrainingHealth

        if self._train is None:
            from .. import knowledge as kb

            self._train = TrainingHealth(spec or sg.load_spec(), kb.load_playbook("xid"),
                                         kb.knowledge().get("nvidia_smi_failures", []))
        return self._train.apply(ev)

    def progress(self) -> Optional[dict]:
        return self.sig.progress(self.clock()) if self.sig else None

    @property
    def signals(self) -> list:
        return self.sig.signals if self.sig else []

    def apply(self, ev: dict) -> None:
        t = ev.get("type")
        if t in ("sample", "log", "state", "health", "xid", "gpu_error", "disk"):
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
            kind = ev["kind"] = classify(ev["line"])  # said once: the renderers and the dashboard's feed read it
            if kind == "error":
                self.errors += 1
            self.log.append((safe_text(ev["line"]), kind))
        elif t == "reconnecting":
            self.link = f"reconnecting (attempt {ev['attempt']}, next in {ev['delay']:g}s): {ev['error']}"
            self.end_lines = []  # a stream cut while it said the death says it again
        elif t == "connected":
            self.link = "live"
        elif t == "end_fact":
            self.end_lines.append(ev["line"])
        elif t == "end" and self.info is not None:
            self.ending = ev["ending"] = self.judge_ending()

    def judge_ending(self) -> Optional[dict]:
        """What the job died of (jobs/endings.py over the facts the stream gathered at its death), or None when it
        succeeded or runs; the GPUs' utilisation while watched and nvidia-smi's last failure are facts too."""
        from . import endfacts, endings

        if self.info is None or self.info.alive or (self.info.exit_code == 0 and not self.info.stopped):
            return None
        util = [u for v in self.gpus.values() if v.host == self.host for u in v.util]
        f = endfacts.facts_for(endfacts.parse(self.end_lines), self.info, gpu_error=self.gpu_error,
                               gpu_util=util or None, stop_reason=self.stop_reason)
        return endings.classify(f, endings.load(), endings.xid_table())

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
        why = f": {self.ending['title']}" if self.ending else ""
        return f"{self.run_id}: {s}, elapsed {fmt_duration(self.elapsed())}{money}{why}"
