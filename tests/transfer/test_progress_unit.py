"""sync's and fetch's progress (transfer/progress.py): the bar's total is known from the start, it never goes
back, and it ends at 100 % when rsync succeeded; piped, the plain lines end with 100 % too."""
from __future__ import annotations

import io

import pytest

from gpuops.transfer import plan as tr
from gpuops.transfer.progress import ProgressView

# what rsync --info=progress2 printed for a 208 MB sync: its total estimate shrinks (bytes*100/percent), a retry
# starts its count again, and its last line says 99 %
LINES = ["      1,048,576   0%    1.00MB/s    0:03:20", "      2,097,152   1%    2.00MB/s    0:01:40",
         "    104,857,600  50%   40.00MB/s    0:00:02", "     10,485,760   5%   10.00MB/s    0:00:20",
         "    200,000,000  98%   40.00MB/s    0:00:00", "    202,000,000  99%   40.00MB/s    0:00:00"]


class Out:
    def __init__(self, rich: bool):
        from rich.console import Console

        self.rich, self.json_mode, self.steps = rich, False, []
        self.err_console = Console(file=io.StringIO(), force_terminal=True, width=100)

    def step(self, text: str) -> None:
        self.steps.append(text)


def test_the_bar_knows_its_total_never_goes_back_and_ends_at_100():
    out = Out(rich=True)
    seen = []
    with ProgressView(out, "sync") as view:
        task = view._bar.tasks[0]
        assert task.total is not None and task.completed == 0  # never `0/? bytes`
        for line in LINES:
            view.update(tr.parse_progress(line))
            seen.append((task.completed, task.total))
    assert len({t for _, t in seen}) == 1  # the total never changes
    done = [c for c, _ in seen]
    assert done == sorted(done)  # monotone, through the retry
    assert task.completed == task.total  # 100 % on success


def test_a_failed_transfer_does_not_claim_100():
    out = Out(rich=True)
    with pytest.raises(RuntimeError):
        with ProgressView(out, "sync") as view:
            task = view._bar.tasks[0]
            view.update(tr.parse_progress(LINES[2]))
            raise RuntimeError("rsync failed")
    assert task.completed == 50


def test_plain_lines_end_at_100_and_never_go_back():
    out = Out(rich=False)
    with ProgressView(out, "fetch checkpoints") as view:
        for line in LINES:
            view.update(tr.parse_progress(line))
    pcts = [int(s.split(": ")[1].split("%")[0]) for s in out.steps]
    assert pcts == sorted(pcts) and pcts[-1] == 100, out.steps
