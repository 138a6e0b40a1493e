"""While it trains (issue #35), through the sandbox host: `watch` reads the GPUs' health and the disk from the
samples its one stream already takes and says a GPU throttled by heat, a GPU failing (Xid 79), a disk running low
while there is room; a job's throughput falling against its own median; a `Killed` line inside a .sh wrapper
highlighted, and the job's ending naming it."""
from __future__ import annotations

import json
import time

import pytest

from support.runs import put, run_id_of
from support.schemas import valid

pytestmark = pytest.mark.usefixtures("cleanup_runs")

STARVED = """\
import time
for step in range(1, 16):
    rate = 120.0 if step < 10 else 4.8  # the DataLoader cannot keep up from step 10 on
    print(f"step {step}/15 loss={1.0 / step:.4f} {rate} it/s", flush=True)
    time.sleep(0.25)
"""


def _signals(gpuops, rid: str) -> dict:
    res = gpuops("watch", rid, "--json", "--interval", "0.3", "--lines", "100")
    docs = [json.loads(x) for x in res.out.splitlines()]
    logged = [d["line"] for d in docs if d["type"] == "log"]
    assert logged and all(x.startswith("step ") for x in logged), logged  # the disk's samples never in the log
    return {d["id"]: d for d in docs if d["type"] == "signal"}


def test_a_throttled_gpu_a_low_disk_and_a_starved_job_are_said_while_it_trains(sandbox, gpuops):
    from gpuops.sandbox import host

    host.inject_fault(sandbox["dir"], "thermal")
    host.inject_fault(sandbox["dir"], "disk-low=93")
    put(sandbox, "starved.py", STARVED)
    rid = run_id_of(gpuops("train", "--script", "starved.py", "--no-sync", "--no-snapshot"))
    got = _signals(gpuops, rid)
    assert got["gpu-throttled"]["title"] == "GPU 0 throttled: hardware thermal slowdown, software thermal slowdown"
    assert got["disk-low"]["title"].startswith("disk running low on /") and " 93% used, " in got["disk-low"]["title"]
    assert "save_total_limit" in got["disk-low"]["hint"]
    assert got["throughput-drop"]["title"] == "throughput fell to 4.8 it/s from this run's median 120 (25x slower)"
    assert "gpu-health" not in got  # throttling is not a failing GPU


def test_a_gpu_failing_under_a_running_job_is_said_by_plain_watch(sandbox, gpuops):
    from gpuops.sandbox import host

    put(sandbox, "slow.py", "import time\nfor i in range(20):\n    print('step', i, flush=True)\n    time.sleep(0.3)\n")
    rid = run_id_of(gpuops("train", "--script", "slow.py", "--no-sync", "--no-snapshot"))
    time.sleep(0.5)
    host.inject_fault(sandbox["dir"], "xid=79")
    res = gpuops("watch", rid, "--interval", "0.3", "--lines", "5")
    assert "signal: GPU failing: Xid errors (kernel log): Xid 79" in res.out, res.out
    assert "replace the instance" in res.out


def test_a_killed_line_in_a_sh_wrapper_is_highlighted_and_names_the_ending(sandbox, gpuops):
    put(sandbox, "train.sh", "echo step 1\npython3 -c 'import os; os.kill(os.getpid(), 9)'\nexit $?\n")
    rid = run_id_of(gpuops("train", "--script", "train.sh", "--no-sync", "--no-snapshot"))
    res = gpuops("watch", rid, "--interval", "0.3", "--lines", "20")
    killed = [ln for ln in res.out.splitlines() if " Killed " in ln and "line 2:" in ln]
    assert killed and " log ! " in killed[0], res.out  # `!`: an error line
    assert "signal: a command of the script was killed" in res.out
    assert "why it ended: a command of the script was killed: line 2:" in res.err, res.err


def test_status_reads_the_gpus_health_and_the_disk_in_its_one_execution(sandbox, gpuops):
    from gpuops.sandbox import host

    host.inject_fault(sandbox["dir"], "thermal")
    host.inject_fault(sandbox["dir"], "inodes-full")
    doc = json.loads(gpuops("status", "--json").out)
    valid("status", doc)
    got = {s["id"]: s for s in doc["host_signals"]}
    assert got["gpu-throttled"]["title"].startswith("GPU 0 throttled: hardware thermal slowdown")
    assert got["disk-low"]["title"].startswith("inodes running low on /") and "100% used (0 left)" in \
        got["disk-low"]["title"]
    plain = gpuops("status").out
    assert "host: signal: GPU 0 throttled" in plain and "host: signal: inodes running low" in plain, plain
