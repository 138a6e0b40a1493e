"""watch's rich screen at real terminal sizes (jobs/screen.py): the log panel sized to the terminal, the newest log
line last and on screen, long lines cut (not wrapped), the header the first row, a compact GPU table under 80
columns."""
from __future__ import annotations

import io

import pytest

from gpuops.jobs import watch as w
from gpuops.jobs.plan import RunInfo
from gpuops.jobs.screen import mem_gb, short_gpu_name

LONG = "x" * 300 + " END-OF-LONG-LINE"


def _dash(n_lines: int = 40) -> w.Dashboard:
    dash = w.Dashboard({"run_id": "20261127-120000-train"}, price_per_hour=2.49, clock=lambda: 1000.0,
                       log_lines=w.DASH_LINES_MAX)
    dash.apply({"type": "state", "info": RunInfo("20261127-120000-train", pid=42, alive=True, started=400.0)})
    for i in range(2):
        dash.apply({"type": "sample", "gpu": {"index": i, "name": "NVIDIA H100 80GB HBM3", "util": 95, "mem_used": 50073,
                                              "mem_total": 81559, "temp": 61, "power": 580}})
    dash.apply({"type": "processes", "processes": [{"pid": 4242, "name": "python3", "mem_used": 50073}]})
    for i in range(n_lines):
        dash.apply({"type": "log", "line": LONG if i == n_lines - 3 else f"line {i:04d}"})
    return dash


def _screen(dash, width: int, height: int) -> list[str]:
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height, color_system=None, force_terminal=False,
                      legacy_windows=False)
    console.print(w.render(dash))
    return buf.getvalue().rstrip("\n").split("\n")


@pytest.mark.parametrize("width,height", [(100, 30), (60, 30), (60, 24), (120, 12)])
def test_the_newest_line_is_last_and_on_screen(width, height):
    dash = _dash()
    lines = _screen(dash, width, height)
    assert len(lines) == height, lines  # the screen fills the terminal, never more
    assert all(len(ln) <= width for ln in lines)
    assert lines[0].startswith("20261127-120000-train: running")  # the header is the first row
    assert "line 0039" in lines[-2] and lines[-1].lstrip().startswith("╰")  # the newest line, then the border
    shown = [int(ln.split("line ")[1][:4]) for ln in lines if "line 0" in ln]
    assert shown == sorted(shown) and shown[-1] == 39  # oldest first, newest last, no gap at the bottom
    assert shown == list(range(39 - len(shown) + 1, 40)) or LONG[:10] in "".join(lines)
    cut = [ln for ln in lines if "xxxxxxxxxx" in ln]
    assert len(cut) == 1 and "…" in cut[0] and "END-OF-LONG-LINE" not in "".join(lines)  # cut, not wrapped


def test_the_panel_is_sized_to_the_terminal():
    small, tall = _screen(_dash(200), 100, 24), _screen(_dash(200), 100, 60)
    logged = [sum("line 0" in ln for ln in s) for s in (small, tall)]
    assert logged[1] - logged[0] == 60 - 24  # every added row goes to the log


def test_compact_layout_below_80_columns():
    narrow, wide = "\n".join(_screen(_dash(), 60, 30)), "\n".join(_screen(_dash(), 100, 30))
    assert "48.9/80 GB" in narrow and "H100" in narrow and "NVIDIA" not in narrow
    assert "50073/81559 MiB" in wide and "NVIDIA H100 80GB HBM3" in wide


def test_a_short_log_and_signals_still_fit():
    dash = _dash(3)
    for i in range(30):  # many GPUs: they give up rows before the log does
        dash.apply({"type": "sample", "gpu": {"index": i, "name": "NVIDIA H100 PCIe", "util": 0, "mem_used": 1,
                                              "mem_total": 81559, "temp": 30, "power": 50}})
    lines = _screen(dash, 60, 24)
    assert len(lines) == 24 and "line 0002" in lines[-2]


def test_short_names_and_memory():
    assert short_gpu_name("NVIDIA H100 80GB HBM3") == "H100"
    assert short_gpu_name("NVIDIA A100-SXM4-80GB") == "A100"
    assert short_gpu_name("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert short_gpu_name("NVIDIA RTX 6000 Ada Generation") == "RTX 6000 Ada"
    assert short_gpu_name("NVIDIA H100 PCIe") == "H100 PCIe"
    assert mem_gb(50073, 81559) == "48.9/80 GB"


# -- end to end: `gpuops watch` at a real pty, its screen replayed (tests/support/term.py) ------------------------------------
MANY = """\
import time
for i in range(120):
    print(f"line {i:04d}", flush=True)
print("y" * 200 + " TAIL-OF-LONG", flush=True)
print("the newest line", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("cols,rows", [(100, 30), (60, 24)])
def test_watch_at_a_pty_shows_the_header_and_the_newest_line(sandbox, gpuops, cols, rows):
    import os
    import sys

    from support.term import complete_frames, run_in_pty, screen
    from support.runs import put, run_id_of

    put(sandbox, "many.py", MANY)
    rid = run_id_of(gpuops("train", "--script", "many.py", "--no-sync", "--no-snapshot"))
    try:
        data = run_in_pty([sys.executable, "-m", "gpuops", "watch", rid, "--interval", "0.5", "--lines", "200"],
                          cols=cols, rows=rows, seconds=40, env=dict(os.environ), cwd=os.getcwd(),
                          until=b"the newest line")
        assert b"the newest line" in data, data[-2000:]
        shown = screen(complete_frames(data), cols=cols, rows=rows)
        text = "\n".join(shown)
        assert f"{rid}: " in text, text
        head = next((i for i, ln in enumerate(shown) if f"{rid}: " in ln), None)
        newest = next((i for i, ln in enumerate(shown) if "the newest line" in ln), None)
        assert head is not None and newest is not None, text
        # the header is the top row; the newest line is the panel's last, just above its border on the bottom row
        assert head == 0 and newest == rows - 2 and "╰" in shown[rows - 1], text
        assert "TAIL-OF-LONG" not in text and "…" in text  # the long line cut, not wrapped
    finally:
        assert gpuops("stop", rid, "--grace", "2").code == 0


def test_watch_at_a_pty_starts_with_a_full_panel_when_the_log_has_more(sandbox, gpuops):
    """Without --lines, the replay fills the terminal's panel: no blank rows above a log of 120 lines (15 lines
    replayed left the top of a 30-row panel empty)."""
    import os
    import sys

    from support.term import complete_frames, run_in_pty, screen
    from support.runs import put, run_id_of

    cols, rows = 100, 40
    put(sandbox, "many.py", MANY)
    rid = run_id_of(gpuops("train", "--script", "many.py", "--no-sync", "--no-snapshot"))
    try:
        data = run_in_pty([sys.executable, "-m", "gpuops", "watch", rid, "--interval", "0.5"],
                          cols=cols, rows=rows, seconds=40, env=dict(os.environ), cwd=os.getcwd(),
                          until=b"the newest line")
        shown = screen(complete_frames(data), cols=cols, rows=rows)
        text = "\n".join(shown)
        top = next((i for i, ln in enumerate(shown) if "╭" in ln), None)
        assert top is not None and rows - 2 - top > 16, text  # a panel taller than the 15 lines of the old default
        inside = [ln.strip("│ ") for ln in shown[top + 1:rows - 1]]
        assert all(inside), text  # every row of the panel holds a log line
        assert inside[-1] == "the newest line", text
    finally:
        assert gpuops("stop", rid, "--grace", "2").code == 0
