"""`gpuops run`'s status line while training (pipeline/status.py): stage, elapsed time, cost so far, step and loss;
at a terminal the last row, with the job's log lines scrolling above it; piped, a plain line now and then."""
from __future__ import annotations

import io
import os
import sys
import textwrap

from gpuops.pipeline import status as st

from support.cloud import TYPE


def test_status_text():
    p = {"step": 40, "total": 200, "loss": 0.51234}
    assert st.status_text("training", 723, 0.5, p) == "training · 12m03s · $0.50 so far · step 40/200 · loss 0.5123"
    assert st.status_text("training", None, 0.0, None) == "training · $0.00 so far"


def test_piped_a_plain_line_now_and_then(monkeypatch):
    from gpuops.console import Output

    err = io.StringIO()
    out = Output(stdout=io.StringIO(), stderr=err)
    now = [0.0]
    with st.StatusLine(out, lambda: f"training · ${now[0] / 100:.2f} so far", clock=lambda: now[0]) as line:
        for t in range(0, 100, 5):
            now[0] = float(t)
            line.tick()
    lines = err.getvalue().splitlines()
    assert lines == ["· training · $0.30 so far", "· training · $0.60 so far", "· training · $0.90 so far"]


PROGRAM = textwrap.dedent("""
    import time
    from gpuops.console import Output
    from gpuops.pipeline.status import StatusLine
    out = Output()
    n = [0]
    with StatusLine(out, lambda: f"training · 0m{n[0]:02d}s · $0.01 so far · step {n[0]}") as line:
        for i in range(1, 41):
            n[0] = i
            out.print(f"log line {i:03d}")
            if i == 20:
                out.info("a message from the run")
            line.tick()
            time.sleep(0.05)
        time.sleep(1.2)
        print("DONE-MARK", file=__import__("sys").stderr, flush=True)
        time.sleep(30)
""")


def test_at_a_terminal_the_line_stays_at_the_bottom(tmp_path):
    from support.term import complete_frames, run_in_pty, screen

    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    data = run_in_pty([sys.executable, str(prog)], cols=80, rows=12, seconds=30, env=dict(os.environ),
                      cwd=str(tmp_path), until=b"DONE-MARK")
    rows = screen(complete_frames(data.split(b"DONE-MARK")[0]), cols=80, rows=12)
    text = "\n".join(rows)
    assert rows[-1].startswith("training · 0m40s · $0.01 so far · step 40"), text
    assert rows[-2] == "log line 040", text  # the raw log lines scroll above it, the newest just over it
    assert "step 3 " not in text and text.count("training ·") == 1, text  # one line, redrawn, not repeated


def test_run_prints_its_status_while_training(cloud, gpuops, monkeypatch):
    from pathlib import Path

    from support.pipeline import TRAIN

    monkeypatch.setattr(st, "STATUS_EVERY_S", 0.0)  # piped: a status line at every event
    (Path.cwd() / "train.py").write_text(TRAIN)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py")
    assert r.code == 0, r.all
    status = [ln for ln in r.err.splitlines() if ln.startswith("· training · ")]
    assert status and "so far" in status[-1], r.err
    assert any("step 3" in ln and "loss 0.3333" in ln for ln in status), status
    assert "step 3 loss 0.3333" in r.out  # the raw log lines, as before
