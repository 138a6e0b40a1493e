"""Training signals end to end through the sandbox: a job prints a trainer's lines (steps, losses, an OOM, all-zero
advantages, an NCCL error), watch (--json and plain) raises each once with its hint and shows the progress; status
shows them for a running run; a job that does not use the emulated GPU raises the GPU-idle signal."""
from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from gpuops.jobs import signals as sg
from support.runs import put, run_id_of


pytestmark = pytest.mark.usefixtures("cleanup_runs")

TRAINER = """\
import os, sys, time
print("Training: total_training_steps=20", flush=True)
for i in range(1, 21):
    print(f"step {i} | loss {2.0 / i:.4f} | lr 1e-4", flush=True)
    if i == 5:
        print("No non-zero advantages in batch (nothing to train on)", flush=True)
        print("No non-zero advantages in batch (nothing to train on)", flush=True)
    if i == 8:
        print("NCCL WARN NET/IB : Got async event : port error", flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.1")))
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 79.18 GiB", flush=True)
if os.environ.get("HOLD"):
    time.sleep(60)
sys.exit(1)
"""


def test_watch_json_raises_each_signal_once_with_progress(sandbox, gpuops):
    put(sandbox, "trainer.py", TRAINER)
    rid = run_id_of(gpuops("train", "--script", "trainer.py", "--no-sync", "--no-snapshot"))
    res = gpuops("watch", rid, "--json", "--interval", "0.5", "--lines", "200")
    assert res.code == 1, res.all
    docs = [json.loads(x) for x in res.out.splitlines()]
    sigs = [d for d in docs if d["type"] == "signal"]
    assert [s["id"] for s in sigs] == ["rl-no-advantages", "nccl-network", "cuda-oom"]
    assert "NCCL_IB_DISABLE=1" in sigs[1]["hint"] and "gpu_memory_utilization" in sigs[2]["hint"]
    assert all(s["source"] for s in sigs)
    prog = [d for d in docs if d["type"] == "progress"]
    assert [p["step"] for p in prog] == list(range(1, 21))
    assert prog[-1]["total"] == 20 and prog[-1]["loss"] == 0.1 and len(prog[-1]["sparkline"]) == 20
    assert "gpu-idle" not in {s["id"] for s in sigs}  # the job used the (emulated) GPU


def test_watch_plain_prints_signals_and_progress(sandbox, gpuops):
    put(sandbox, "trainer.py", TRAINER)
    rid = run_id_of(gpuops("train", "--script", "trainer.py", "--no-sync", "--no-snapshot"))
    res = gpuops("watch", rid, "--interval", "0.5", "--lines", "200")
    lines = res.out.splitlines()
    sig = [ln for ln in lines if " signal: " in ln]
    assert len(sig) == 3 and "RL training is learning nothing" in sig[0] and "CUDA out of memory" in sig[2]
    assert any(" progress step 10/20  loss 0.2 " in ln for ln in lines), lines
    assert any(" progress step 20/20 " in ln and "steps/min" in ln for ln in lines)


def test_status_shows_a_running_runs_signals_and_progress(sandbox, gpuops):
    put(sandbox, "trainer.py", TRAINER)
    rid = run_id_of(gpuops("train", "--script", "trainer.py", "--no-sync", "--no-snapshot", "-e", "HOLD=1",
                           "-e", "DELAY=0.01"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        doc = json.loads(gpuops("status", "--json").out)
        row = next(r for r in doc["runs"] if r["run_id"] == rid)
        if row.get("signals") and len(row["signals"]) == 3:
            break
        time.sleep(0.3)
    assert row["state"] == "running"
    assert [s["id"] for s in row["signals"]] == ["rl-no-advantages", "nccl-network", "cuda-oom"]
    assert row["progress"]["step"] == 20 and row["progress"]["total"] == 20
    out = gpuops("status").out
    assert f"{rid}: step 20/20" in out and f"{rid}: signal: CUDA out of memory" in out
    assert gpuops("stop", rid, "--grace", "2").code == 0


def test_gpu_idle_signal_for_a_job_not_on_the_gpu(sandbox, gpuops, isolated):
    # the project's own signals.yaml (a user's copy): idle after 2 s instead of 3 minutes
    spec = copy.deepcopy(sg.load_spec())  # load_spec's document is cached: never change it in place
    spec["gpu_idle"]["minutes"] = 2 / 60
    (isolated / "playbooks").mkdir()
    (isolated / "playbooks" / "signals.yaml").write_text(yaml.safe_dump(spec))
    put(sandbox, "idle.py", "import time\nprint('loading', flush=True)\ntime.sleep(5)\n")
    # CUDA_VISIBLE_DEVICES=7 on a 1-GPU host: the job sees no GPU, GPU 0 stays at 0 %
    rid = run_id_of(gpuops("train", "--script", "idle.py", "--no-sync", "--no-snapshot", "-e", "CUDA_VISIBLE_DEVICES=7"))
    res = gpuops("watch", rid, "--json", "--interval", "0.5")
    docs = [json.loads(x) for x in res.out.splitlines()]
    assert all(d["util"] == 0 for d in docs if d["type"] == "sample")
    sigs = [d for d in docs if d["type"] == "signal"]
    assert [s["id"] for s in sigs] == ["gpu-idle"] and "CPU-only torch" in sigs[0]["hint"]
