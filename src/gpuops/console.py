"""The one place that decides how output looks: rich at a terminal, plain lines when piped or NO_COLOR, JSON on request.

Reports go to stdout; messages (progress, warnings, errors) go to stderr, so `--json` output stays parseable.
rich is imported only when rich output is actually drawn.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO


def _wants_rich(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    if os.environ.get("GPUOPS_FORCE_RICH"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """Injected into every command; tests build one around StringIO streams."""

    def __init__(self, *, json_mode: bool = False, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 debug: bool = False, quiet: bool = False):
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.json_mode = json_mode
        self.debug = debug
        self.quiet = quiet
        self.warnings: list[str] = []  # every warning shown, for the JSON document of commands that carry them
        self.rich = (not json_mode) and _wants_rich(self.stdout)
        self._out_console = None
        self._err_console = None

    @property
    def err_rich(self) -> bool:
        """Messages on stderr are drawn by rich (a terminal there too)."""
        return self.rich and _wants_rich(self.stderr)

    # -- rich consoles, built lazily -------------------------------------------------
    @property
    def console(self):
        if self._out_console is None:
            from rich.console import Console

            self._out_console = Console(file=self.stdout, highlight=False, soft_wrap=False)
        return self._out_console

    @property
    def err_console(self):
        if self._err_console is None:
            from rich.console import Console

            self._err_console = Console(file=self.stderr, highlight=False)
        return self._err_console

    # -- messages (stderr) -----------------------------------------------------------------
    def _msg(self, text: str, style: str | None, prefix: str) -> None:
        if self.rich and _wants_rich(self.stderr):
            from rich.markup import escape

            self.err_console.print(f"[{style}]{escape(prefix)}[/]{escape(text)}" if style else escape(prefix + text))
        else:
            print(prefix + text, file=self.stderr, flush=True)

    def info(self, text: str) -> None:
        if not self.quiet:
            self._msg(text, None, "")

    def step(self, text: str) -> None:
        """Progress of long work: shown to people, hidden under --json."""
        if not self.quiet and not self.json_mode:
            self._msg(text, "dim", "· ")

    def success(self, text: str) -> None:
        if not self.quiet:
            self._msg(text, "green", "✓ " if self.rich else "ok: ")

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self._msg(text, "yellow", "warning: ")

    def warn_once(self, text: str) -> None:
        """A warning two steps of one command may both find (`run` reads .env before the launch and again to send
        the job its secrets): said the first time only."""
        if text not in self.warnings:
            self.warn(text)

    def error(self, text: str, hint: str | None = None) -> None:
        self._msg(text, "bold red", "error: ")
        if hint:
            self._msg(hint, "cyan", "hint: ")

    def status(self, text: str):
        """A spinner while long work runs (rich), or one progress line (plain); silent under --json."""
        import contextlib

        if self.json_mode or self.quiet:
            return contextlib.nullcontext()
        if self.rich and _wants_rich(self.stderr):
            return self.err_console.status(text)
        self.step(text)
        return contextlib.nullcontext()

    # -- reports (stdout) ------------------------------------------------------------------
    def print(self, text: str = "") -> None:
        """A plain report line on stdout (never in JSON mode)."""
        if self.json_mode:
            return
        print(text, file=self.stdout, flush=True)

    def render(self, renderable: Any) -> None:
        """A rich renderable (table, panel) on stdout."""
        self.console.print(renderable)

    def emit_json(self, doc: Any) -> None:
        """One --json document; an object always carries `warnings` (docs/json.md): those this Output showed, when the
        command did not set its own."""
        if isinstance(doc, dict) and "warnings" not in doc:
            doc = {**doc, "warnings": list(self.warnings)}
        json.dump(doc, self.stdout, indent=2, sort_keys=False, default=str)
        self.stdout.write("\n")
        self.stdout.flush()

    def emit_json_line(self, doc: Any) -> None:
        self.stdout.write(json.dumps(doc, default=str) + "\n")
        self.stdout.flush()
