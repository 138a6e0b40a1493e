"""rsync's progress on screen, for sync and fetch: a bar at a terminal, a line now and then when piped."""
from __future__ import annotations

import time

from . import plan as tr


class ProgressView:
    """A rich bar (bytes, rate, ETA) at a terminal, a plain line every ~10% otherwise, nothing in JSON mode."""

    def __init__(self, out, label: str):
        self.out, self.label = out, label
        self._bar = None
        self._task = None
        self._last_pct = 0  # first plain line at 10 %: a no-change sync prints none
        self._last_t = 0.0

    def __enter__(self):
        if self.out.rich and not self.out.json_mode:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            # rate and ETA as rsync computes them: rich's own estimates reset whenever the total is refined, and
            # rsync refines its total estimate on every update
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("eta {task.fields[eta]}"),
                                 console=self.out.err_console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None, rate="", eta="-")
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()

    def update(self, p: tr.Progress) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=p.bytes, total=p.total_estimate, rate=p.rate, eta=p.eta)
            return
        if self.out.json_mode:
            return
        now = time.monotonic()
        if p.percent >= self._last_pct + 10 or (now - self._last_t > 10 and p.percent != self._last_pct):
            self._last_pct, self._last_t = p.percent, now
            self.out.step(f"{self.label}: {p.percent}% {tr.human_bytes(p.bytes)} at {p.rate}, eta {p.eta}")

    def retry(self, attempt: int, rc: int, detail: str) -> None:
        self.out.warn(f"rsync interrupted (exit {rc}: {detail}); retrying, continuing from what arrived")


# -- sync ------------------------------------------------------------------------------------
