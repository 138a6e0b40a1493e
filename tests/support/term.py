"""A tiny terminal for tests: run a command under a pty of a given size and replay what it wrote on a screen grid
(the cursor moves, line erases and scrolling rich's Live uses), so a test asserts what a person would see."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time

from support.helpers import default_sigint


_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


def pty_read(master: int, wait: float = 0.2) -> bytes | None:
    """What the terminal's program wrote within `wait` seconds: None for nothing yet, b"" once it closed."""
    r, _, _ = select.select([master], [], [], wait)
    if not r:
        return None
    try:
        return os.read(master, 65536)
    except OSError:  # the program's side closed (Linux says EIO)
        return b""


def run_in_pty(argv: list[str], *, cols: int, rows: int, seconds: float, env: dict, cwd: str,
               until: bytes | None = None) -> bytes:
    """Run argv at a terminal of cols x rows for `seconds` (or until `until` was written and 1 s more), press Ctrl-C,
    and return every byte it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True,
                            start_new_session=True, preexec_fn=default_sigint)  # Ctrl-C works in a suite run with it ignored
    os.close(slave)
    out = b""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            chunk = pty_read(master)
            if chunk == b"":
                break
            if chunk:
                out += chunk
                if until and until in out and end - time.monotonic() > 1.0:
                    end = time.monotonic() + 1.0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return out


FRAME_START = b"\r\x1b[2K\x1b[1A\x1b[2K"  # rich Live going back to redraw: what came before is a whole frame


def complete_frames(data: bytes) -> bytes:
    """The output up to the last redraw rich's Live started: the screen then shows one whole frame (a redraw cut
    short by the read, or by Ctrl-C, is left out)."""
    i = data.rfind(FRAME_START)
    return data[:i] if i > 0 else data


def screen(data: bytes, *, cols: int, rows: int) -> list[str]:
    """The rows a terminal of cols x rows shows after receiving data (text, CR, LF, CSI A/B/C/D/G/H/J/K; others
    ignored), scrolling at the bottom."""
    grid = [[" "] * cols for _ in range(rows)]
    r = c = 0
    text = data.decode("utf-8", "replace")
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = _CSI.match(text, i)
            if m:
                args, cmd = m.group(1), m.group(2)
                n = int(args.split(";")[0]) if args and args[0].isdigit() else None
                if cmd == "A":
                    r = max(0, r - (n or 1))
                elif cmd == "B":
                    r = min(rows - 1, r + (n or 1))
                elif cmd == "C":
                    c = min(cols - 1, c + (n or 1))
                elif cmd == "D":
                    c = max(0, c - (n or 1))
                elif cmd == "G":
                    c = max(0, (n or 1) - 1)
                elif cmd == "H":
                    parts = [int(p) if p else 1 for p in args.split(";")] if args else [1, 1]
                    r, c = min(rows, parts[0]) - 1, min(cols, (parts + [1])[1]) - 1
                elif cmd == "K":
                    if not n:
                        grid[r][c:] = [" "] * (cols - c)
                    elif n == 2:
                        grid[r] = [" "] * cols
                elif cmd == "J" and n == 2:
                    grid = [[" "] * cols for _ in range(rows)]
                i = m.end()
                continue
            m = re.match(r"\x1b\][^\x07]*\x07|\x1b.", text[i:])
            i += m.end() if m else 1
            continue
        if ch == "\r":
            c = 0
        elif ch == "\n":
            if r == rows - 1:
                grid = grid[1:] + [[" "] * cols]
            else:
                r += 1
            c = 0  # the pty's onlcr turns \n into \r\n
        elif ch >= " ":
            if c >= cols:
                c = 0
                if r == rows - 1:
                    grid = grid[1:] + [[" "] * cols]
                else:
                    r += 1
            grid[r][c] = ch
            c += 1
        i += 1
    return ["".join(row).rstrip() for row in grid]
