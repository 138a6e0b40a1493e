"""`gpuops run`'s status line while the job trains: stage, elapsed time, cost so far, step and loss.

At a terminal it stays at the bottom (a rich Live on stderr, redrawn every half second, so the time and the cost move
between log lines) while the job's raw log lines and every message scroll above it; piped (or NO_COLOR), it is a
plain line every STATUS_EVERY_S; under --json, nothing. `status_text` is pure.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

STATUS_EVERY_S = 30.0  # piped: a status line at most this often


def status_text(stage: str, elapsed_s: Optional[float], spend: float, progress: Optional[dict]) -> str:
    """`watching the job · 12m03s · $0.50 so far · step 40/200 · loss 0.512` (step and loss when the log has them)."""
    from ..jobs.plan import fmt_duration

    parts = [stage]
    if elapsed_s is not None:
        parts.append(fmt_duration(elapsed_s))
    parts.append(f"${spend:.2f} so far")
    p = progress or {}
    if p.get("step") is not None:
        parts.append(f"step {p['step']}" + (f"/{p['total']}" if p.get("total") else ""))
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4g}")
    return " · ".join(parts)


class StatusLine:
    """A context: the line at the bottom of a terminal, or plain lines now and then. tick() after every event."""

    def __init__(self, out, text: Callable[[], str], *, clock: Callable[[], float] = time.monotonic):
        self.out, self.text, self.clock = out, text, clock
        self._live = None
        self._stdout = None
        self._next = 0.0

    def __enter__(self):
        if self.out.json_mode or self.out.quiet:
            return self
        if self.out.err_rich:
            from rich.file_proxy import FileProxy
            from rich.live import Live
            from rich.text import Text

            text, last = self.text, [""]

            class _Line:
                def __rich__(self):  # drawn by rich's refresh thread while the run's thread updates what it reads
                    try:
                        last[0] = text()
                    except (RuntimeError, KeyError, TypeError, ValueError):
                        pass
                    return Text(last[0], style="bold", no_wrap=True, overflow="ellipsis")

            console = self.out.err_console
            self._live = Live(_Line(), console=console, refresh_per_second=2, transient=True,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            # the job's log lines (out.print) scroll above the line, as the messages on this console do
            self._stdout, self.out.stdout = self.out.stdout, FileProxy(console, self.out.stdout)
        else:
            self._next = self.clock() + STATUS_EVERY_S
        return self

    def tick(self) -> None:
        if self._live is None and not self.out.json_mode and self.clock() >= self._next:
            self._next = self.clock() + STATUS_EVERY_S
            self.out.step(self.text())

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self.out.stdout.flush()
            self.out.stdout = self._stdout
            self._live.stop()
            self._live = None
