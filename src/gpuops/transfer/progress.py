"""rsync's progress on screen, for sync and fetch: a bar at a terminal, a line now and then when piped."""
from __future__ import annotations

import time

from . import plan as tr


class ProgressView:
    """A rich bar at a terminal, a plain line every ~10% otherwise, nothing in JSON mode.

    The bar counts rsync's own percentage out of 100 (known before the first byte, so never `0/?`), shows the bytes
    sent beside it, never goes back (rsync refines its total estimate as it walks the tree, and a retry starts its
    count again) and ends at 100 % when rsync succeeded (its last progress line may say 99 %)."""

    def __init__(self, out, label: str):
        self.out, self.label = out, label
        self._bar = None
        self._task = None
        self._pct = 0  # the highest percentage seen: the bar never goes back
        self._bytes = 0
        self._last = None  # the last Progress seen
        self._last_pct = 0  # first plain line at 10 %: a no-change sync prints none
        self._last_t = 0.0

    def __enter__(self):
        if self.out.rich and not self.out.json_mode:
            from rich.progress import BarColumn, Progress, TextColumn

            # rate and ETA as rsync computes them: rich's own estimates reset whenever the total is refined, and
            # rsync refines its total estimate on every update
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}%"), TextColumn("{task.fields[sent]}"),
                                 TextColumn("{task.fields[rate]}"), TextColumn("eta {task.fields[eta]}"),
                                 console=self.out.err_console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=100, completed=0, sent="", rate="", eta="-")
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.finish()
        if self._bar is not None:
            self._bar.stop()

    def finish(self) -> None:
        """rsync succeeded: the bar (or the plain lines, once any was printed) ends at 100 %."""
        if self._bar is not None:
            self._pct = 100
            self._bar.update(self._task, completed=100, eta="0:00:00")
        elif not self.out.json_mode and self._last_pct and self._last_pct < 100 and self._last is not None:
            self._last_pct = 100
            self.out.step(f"{self.label}: 100% {tr.human_bytes(self._bytes)} at {self._last.rate}, eta 0:00:00")

    def update(self, p: tr.Progress) -> None:
        self._pct, self._bytes, self._last = max(self._pct, min(100, p.percent)), max(self._bytes, p.bytes), p
        if self._bar is not None:
            self._bar.update(self._task, completed=self._pct, sent=tr.human_bytes(self._bytes), rate=p.rate,
                             eta=p.eta)
            return
        if self.out.json_mode:
            return
        now = time.monotonic()
        if self._pct >= self._last_pct + 10 or (now - self._last_t > 10 and self._pct != self._last_pct):
            self._last_pct, self._last_t = self._pct, now
            self.out.step(f"{self.label}: {self._pct}% {tr.human_bytes(self._bytes)} at {p.rate}, eta {p.eta}")

    def retry(self, attempt: int, rc: int, detail: str) -> None:
        self.out.warn(f"rsync interrupted (exit {rc}: {detail}); retrying, continuing from what arrived")


# -- sync ------------------------------------------------------------------------------------
