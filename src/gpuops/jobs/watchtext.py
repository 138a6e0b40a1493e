"""What watch shows, as text (pure): a log line's kind (error, warning), a line made harmless for a terminal, every
stream event as a plain timestamped line or a `watch --json` object, the training signals and progress lines, a
GPU sample's line, the rich screen (jobs/screen.py) and a job's ending (jobs/endings.py's verdict)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .screen import DashboardView

_ERR = [
    (re.compile(r"Traceback \(most recent call last\)"), "error"),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I), "error"),
    (re.compile(r"\bNCCL\b.*\b(error|failure|timed? ?out|unhandled)\b|\bNCCL_?(ERROR|WARN)\b|ncclInternalError|"
                r"ncclSystemError|ncclUnhandledCudaError", re.I), "error"),
    (re.compile(r"\bloss\b[^\n]{0,20}?[=:]\s*[-+]?(nan|inf)\b", re.I), "error"),
    (re.compile(r"^\w*(Error|Exception)\b[:(]|^\s*raise\b|RuntimeError:|Killed$|Segmentation fault"), "error"),
    # a .sh wrapper's child killed by a signal, as bash reports it: `train.sh: line 3:  4242 Killed   python train.py`
    (re.compile(r"\bline \d+: +\d+ (Killed|Terminated|Aborted)\b"), "error"),
    (re.compile(r"warning\b|\bWARN\b", re.I), "warning"),
]


def classify(line: str) -> Optional[str]:
    """'error' for tracebacks, CUDA OOM, NCCL errors, NaN/inf losses; 'warning' for warnings; else None."""
    for rx, kind in _ERR:
        if rx.search(line):
            return kind
    return None


def event_doc(ev: dict, ts: float) -> Optional[dict]:
    """An event as watch --json prints it (one object per line); None for events that are not shown."""
    t = ev["type"]
    if t in ("end", "heartbeat", "end_fact", "disk"):  # facts shown judged (an ending, a signal), not raw
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
        kind = ev["kind"] if "kind" in ev else classify(ev["line"])
        doc.update(line=ev["line"], offset=ev.get("offset"), kind=kind)
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


def event_text(ev: dict, dash: "DashboardView", stamp: str) -> Optional[str]:
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
        kind = ev["kind"] if "kind" in ev else classify(ev["line"])
        mark = {"error": "!", "warning": "~"}.get(kind or "", "|")
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


def render(dash: DashboardView):
    """A rich renderable of the whole screen, fitted to the terminal at every redraw (jobs/screen.py)."""
    from .screen import Screen

    return Screen(dash)


def ending_lines(ending: Optional[dict], *, indent: str = "  ", fix: bool = True) -> list[str]:
    """What a job died of (jobs/endings.py's verdict) as lines: the cause's title, each piece of evidence, the fix."""
    if not ending:
        return []
    lines = [f"why it ended: {ending_title(ending)}"]
    lines += [f"{indent}evidence: {e}" for e in ending.get("evidence") or []]
    if fix and ending.get("fix"):
        lines.append(f"{indent}fix: {ending['fix']}")
    return lines


def ending_title(ending: dict) -> str:
    """The cause's title, after the host it names on a fleet (`host #1: ...`)."""
    host = ending.get("host")
    return (f"host #{host}: " if host is not None else "") + ending["title"]


def ending_doc(ending: dict, ts: float) -> dict:
    """watch --json's last object for a job that failed or was killed: {"type": "ending", "at", cause, title,
    evidence, fix, source}."""
    from ..jsonvocab import iso

    return {"type": "ending", "at": iso(ts, "milliseconds"), **ending}
