"""`gpuops watch`'s terminal screen (pure: the dashboard model in, a rich renderable out).

The screen is drawn to the terminal's size at every redraw: the header (the run's state, elapsed time and cost) is
its first line, the log panel takes the rows the rest leaves, and the newest log line is always its last line. Long
log lines are cut (…), never wrapped, so one long line cannot push the newest off screen; when the GPUs, signals
and processes leave too little room, they give up rows before the log does. Under 80 columns the GPU table is
compact: the GPU's short name (`H100 PCIe`), memory as `48.9/80 GB`, one history column.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Protocol

SPARK = "▁▂▃▄▅▆▇█"
COMPACT_BELOW = 80  # columns: below this the GPU table is compact
LOG_MIN_ROWS = 3  # the log panel keeps at least this many lines of log (plus its two borders); 1 on a tiny screen
COLOUR = {"running": "cyan", "succeeded": "green", "failed": "red", "stopped": "yellow", "lost": "red"}
_NOISE = re.compile(r"^(?:\d+\s*GB|HBM\w*|SXM\d*|Generation|Tensor|Core)$", re.I)


class DashboardView(Protocol):
    """What the screen and watch's text lines (jobs/watchtext.py) read of the dashboard model, jobs/watch.Dashboard:
    stated here, below both, so neither renderer imports the model's module."""
    gpus: dict  # (host rank, GPU index) -> jobs/watch.GpuView: index, host, name, last sample, util and mem history
    gpu_error: Optional[str]
    procs: list[dict]
    log: Iterable[tuple[str, Optional[str]]]  # (line, kind) for the log panel, oldest first (a deque)
    errors: int
    link: str  # "live", "connecting", or why the stream is reconnecting

    @property
    def state(self) -> str: ...

    @property
    def signals(self) -> list: ...

    def progress(self) -> Optional[dict]: ...

    def state_text(self) -> str: ...


def short_gpu_name(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `H100`, `NVIDIA A100-SXM4-80GB` -> `A100`, `NVIDIA GeForce RTX 4090` ->
    `RTX 4090`, `NVIDIA RTX 6000 Ada Generation` -> `RTX 6000 Ada`, `NVIDIA H100 PCIe` -> `H100 PCIe`."""
    words = [w for w in name.replace("NVIDIA", " ").replace("GeForce", " ").split()]
    if words and "-" in words[0]:
        words = [words[0].split("-")[0], *words[1:]]
    kept = [w for w in words if not _NOISE.match(w)]
    return " ".join(kept) or name


def mem_gb(used_mib, total_mib) -> str:
    """`48.9/80 GB`: used with one decimal, the total as its size is said (81559 MiB is an 80 GB card)."""
    return f"{(used_mib or 0) / 1024:.1f}/{(total_mib or 0) / 1024:.0f} GB"


def sparkline(values) -> str:
    """Percentages (0-100, None as 0) as one block character each."""
    vals = list(values)
    if not vals:
        return ""
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int((v or 0) / 100.0 * (len(SPARK) - 1) + 0.5)))] for v in vals)


def _spark(values, width: int) -> str:
    return sparkline(list(values)[-width:]) if width > 0 else ""


def gpu_table(dash: "DashboardView", width: int):
    """The GPU table, fitted to the width: history columns get what the other columns leave."""
    from rich.table import Table
    from rich.text import Text

    compact = width < COMPACT_BELOW
    fleet = len({h for h, _ in dash.gpus}) > 1
    rows = []
    for key in sorted(dash.gpus):
        v = dash.gpus[key]
        g = v.last
        ident = f"#{v.host}/{v.index}" if fleet else str(v.index)
        name = short_gpu_name(v.name) if compact else v.name
        mem = mem_gb(g.get("mem_used"), g.get("mem_total")) if compact else \
            f"{g.get('mem_used') or 0:.0f}/{g.get('mem_total') or 0:.0f} MiB"
        cells = [ident, name, f"{g.get('util') or 0:.0f}%", mem, f"{g.get('temp') or 0:.0f}C"]
        if not compact:
            cells.append(f"{g.get('power') or 0:.0f}W")
        rows.append((v, cells))
    heads = ["GPU", "name", "util", "memory", "temp"] + ([] if compact else ["power"])
    used = sum(max([len(h)] + [len(c[i]) for _, c in rows]) + 1 for i, h in enumerate(heads))
    hist_cols = 1 if compact else 2
    hist = max(0, min(40, (width - used - hist_cols) // hist_cols))
    t = Table(box=None, expand=False, pad_edge=False, padding=(0, 1, 0, 0))
    for h in heads:
        t.add_column(h, no_wrap=True, overflow="ellipsis")
    if hist >= 4:
        t.add_column("util hist" if compact else "util history", no_wrap=True)
        if not compact:
            t.add_column("mem history", no_wrap=True)
    for v, cells in rows:
        extra = []
        if hist >= 4:
            extra.append(Text(_spark(v.util, hist), style="green"))
            if not compact:
                extra.append(Text(_spark(v.mem, hist), style="magenta"))
        t.add_row(*cells, *extra)
    return t


def _middle(dash: "DashboardView", width: int) -> list:
    """What stands between the header and the log: GPUs, progress, signals, nvidia-smi's error, processes."""
    from rich.table import Table
    from rich.text import Text

    from .signals import progress_text, signal_text

    parts = [gpu_table(dash, width)]
    prog = progress_text(dash.progress())
    if prog:
        parts.append(Text(prog, style="bold"))
    for sig in dash.signals:
        parts.append(Text(signal_text(sig), style="bold yellow"))
    if dash.gpu_error:
        parts.append(Text(f"nvidia-smi: {dash.gpu_error}", style="red"))
    if dash.procs:
        pt = Table(box=None, title=None, pad_edge=False)
        for col in ("pid", "process", "GPU memory"):
            pt.add_column(col, no_wrap=True, overflow="ellipsis")
        for p in dash.procs:
            pt.add_row(str(p["pid"]), p["name"], f"{p['mem_used'] or 0:.0f} MiB")
        parts.append(pt)
    else:
        parts.append(Text("no GPU processes", style="dim"))
    return parts


def header(dash: "DashboardView"):
    from rich.text import Text

    head = Text(dash.state_text(), style="bold " + COLOUR.get(dash.state, "white"))
    if dash.link != "live":
        head.append(f"   [{dash.link}]", style="yellow")
    return head


def log_panel(dash: "DashboardView", rows: int):
    """The log panel of `rows` rows (borders included): the newest lines, newest last, each cut to one row."""
    from rich.panel import Panel
    from rich.text import Text

    inner = max(0, rows - 2)
    lines = list(dash.log)[-inner:] if inner else []
    lines = [("", None)] * (inner - len(lines)) + lines  # a short log sits at the bottom, as a terminal's tail
    body = Text(no_wrap=True, overflow="ellipsis", end="")
    for i, (line, kind) in enumerate(lines):
        body.append(line + ("\n" if i < len(lines) - 1 else ""),
                    style={"error": "bold red", "warning": "yellow"}.get(kind or "", ""))
    title = f"log ({dash.errors} error lines)" if dash.errors else "log"
    return Panel(body, title=title, border_style="dim", height=rows)


class Screen:
    """The whole screen, fitted to the console it is drawn on (rich asks at every redraw, so a resize is followed)."""

    def __init__(self, dash: "DashboardView"):
        self.dash = dash

    def __rich_console__(self, console, options):
        # rich's refresh thread draws while the watch's thread feeds the model: a collection that changed under
        # the drawing is drawn again
        for attempt in range(3):
            try:
                return list(self._segments(console, options))
            except RuntimeError:
                if attempt == 2:
                    raise
        return []

    def _segments(self, console, options):
        from rich.segment import Segment

        width = options.max_width
        height = options.height or options.size.height
        free = options.update(height=None)
        head = console.render_lines(header(self.dash), free, pad=False)
        middle = [ln for part in _middle(self.dash, width) for ln in console.render_lines(part, free, pad=False)]
        keep = LOG_MIN_ROWS if height >= 4 * LOG_MIN_ROWS + 4 else 1
        head = head[:max(1, height - keep - 2)]  # the header's first row always stays
        middle = middle[:max(0, height - len(head) - keep - 2)]
        log_rows = max(keep + 2, height - len(head) - len(middle))
        log = console.render_lines(log_panel(self.dash, log_rows), options.update(height=log_rows), pad=False)
        lines = [*head, *middle, *log]
        for i, line in enumerate(lines):
            yield from line
            if i < len(lines) - 1:
                yield Segment.line()
