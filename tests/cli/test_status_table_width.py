"""Issue #36: the `status` table with long run ids (`--name` makes them as long as the user likes): every column
stays under its header in plain output, and at a terminal each id stays whole on one line within the width."""
from __future__ import annotations

import io

from gpuops.cli.jobs import _status_lines
from gpuops.console import Output

LONG = "llama3-8b-sft-lr3e-5-warmup500-bs64-20260115-100000-ab12"  # 56 characters


class Prof:
    name = "h100"


def _doc():
    rows = [{"run_id": LONG, "script": "train.py", "state": "running", "started": 1768471200.0, "elapsed": 3725.0,
             "exit_code": None, "cost": None},
            {"run_id": "train-20260115-090000-cd34", "script": "scripts/finetune_long_name.py", "state": "failed",
             "started": 1768467600.0, "elapsed": 60.0, "exit_code": 1, "cost": None}]
    return {"runs": rows, "gpus": [], "gpu_error": None}


def test_plain_columns_stay_under_their_headers():
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    _status_lines(out, Prof(), _doc())
    lines = out.stdout.getvalue().splitlines()
    head = lines[0]
    col = head.index("STATE")
    assert lines[1][col:].startswith("running"), (head, lines[1])
    assert lines[2][col:].startswith("failed"), (head, lines[2])
    assert lines[1].startswith(LONG + " ")


def test_at_a_terminal_each_id_stays_whole_within_the_width(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("GPUOPS_FORCE_RICH", "1")
    monkeypatch.setenv("COLUMNS", "100")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    assert out.rich
    _status_lines(out, Prof(), _doc())
    text = out.stdout.getvalue()
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 100, text
    assert any(LONG in x for x in lines), text  # whole, on one line: it is pasted into watch/stop
    assert any("train-20260115-090000-cd34" in x for x in lines), text
