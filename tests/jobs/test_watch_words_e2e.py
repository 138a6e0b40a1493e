"""What watch, logs -f and stop say: logs -f's Ctrl-C suggests nothing else; plain watch prints a step's progress
once when the log prints each step in two formats; stop says "stopping" only for a run that runs."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from support.helpers import python_sigint
from support.runs import FOREVER, put, run_id_of, wait_ended
from gpuops.jobs import watch as w

pytestmark = pytest.mark.usefixtures("cleanup_runs")


@pytest.fixture
def ctrl_c():
    """Ctrl-C as a person presses it, even in a suite started with SIGINT ignored (nohup, a CI runner)."""
    main = threading.main_thread().ident

    def press(after: float) -> threading.Timer:
        t = threading.Timer(after, lambda: signal.pthread_kill(main, signal.SIGINT))
        t.start()
        return t

    with python_sigint():
        yield press


def test_plain_watch_prints_a_steps_progress_once_with_two_formats():
    dash = w.Dashboard({"run_id": "r"}, clock=lambda: 100.0)
    printed = []
    for step in range(1, 31):
        for line in (f"step {step}/30 loss {1 / step:.4f}", f"{{'loss': {1 / step:.4f}, 'step': {step}}}"):
            ev = {"type": "log", "line": line}
            dash.apply(ev)
            printed += [ln for ln in w.signal_lines(ev, "12:00:00") if " progress " in ln]
    steps = [ln.split("progress step ")[1].split("/")[0] for ln in printed]
    assert steps == ["10", "20", "30"], printed


def test_logs_follow_ctrl_c_suggests_no_watch(sandbox, gpuops, ctrl_c):
    put(sandbox, "forever.py", FOREVER)
    rid = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot"))
    timer = ctrl_c(1.5)
    res = gpuops("logs", rid, "-f")
    timer.join()
    assert res.code == 130, res.all
    assert f"run {rid} keeps running" in res.err and "gpuops watch" not in res.err, res.err
    assert gpuops("stop", rid, "--grace", "2").code == 0


def test_stop_says_stopping_only_for_a_running_run(sandbox, gpuops):
    put(sandbox, "quick.py", "print('done')\n")
    rid = run_id_of(gpuops("train", "--script", "quick.py", "--no-sync", "--no-snapshot"))
    assert wait_ended(sandbox, rid) == 0
    time.sleep(1.0)  # the launcher writes exit_code a moment before it exits: a run that ended a while ago
    res = gpuops("stop", rid, "--grace", "1")
    assert res.code == 0, res.all
    assert "not running" in res.err and "stopping" not in res.err, res.err

    put(sandbox, "forever.py", FOREVER)
    rid = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot"))
    res = gpuops("stop", rid, "--grace", "2")
    assert res.code == 0, res.all
    assert f"stopping {rid}" in res.err and f"stopped {rid} with SIGINT" in res.err, res.err
