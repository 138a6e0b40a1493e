"""A checkpoint counts because of evidence, not the clock (issue 35), end to end through the Lambda emulator, its
sandbox instances and real `gpuops run` processes: the issue's Xid-79 scenario with and without --fs (a half-written
first checkpoint held still for longer than two samples is never resumed from), a vouching only timing gave revoked
at the job's death, and the atomic-rename writer's newest folder kept after a preemption. Each fails on the code
before it."""
from __future__ import annotations

import re
import time
from pathlib import Path

from support.cloud import TYPE
from support.pipeline import run_process, write_script
from support.recovery import billing, done, fetched_log, records, wait_run

# The job writes its model, then gathers its optimizer state (FSDP, DeepSpeed: tens of seconds) until told to go
# on; a resumed job reads both, and fails on a checkpoint without its optimizer. argv: the flag file, the layout
# ("steps": checkpoints/checkpoint-1/...; "whole": checkpoints/... with no step folder).
HALF = """\
import os, sys, time
flag, layout = sys.argv[1], sys.argv[2]
d = "checkpoints/checkpoint-1" if layout == "steps" else "checkpoints"
src = os.environ.get("GPUOPS_RESUME_FROM")
print(f"resume from {src}", flush=True)
if src:
    print("optimizer:", open(os.path.join(src, "optim.pt")).read(), flush=True)
os.makedirs(d, exist_ok=True)
open(f"{d}/model.bin", "w").write("model")
print("model written", flush=True)
deadline = time.time() + 120
while not os.path.exists(flag) and time.time() < deadline:
    time.sleep(0.2)
open(f"{d}/optim.pt", "w").write("optimizer")
print("step 1 saved", flush=True)
"""


def _rec() -> dict:
    return (records() or [{}])[0]


def _half_written_then_xid79(cloud, flag: Path, *args: str, layout: str = "steps", vouched=None):
    """Run HALF with --recover 1; once the model is written and the folder has held still for more than two watch
    samples (or `vouched(record)` says the run took it), the GPU falls off the bus and the job dies with it."""
    write_script(text=HALF)
    p = run_process(cloud, "--script", "train.py", "--json", "--recover", "1", *args, "--", str(flag), layout)
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    rel = "checkpoints/checkpoint-1/model.bin" if layout == "steps" else "checkpoints/model.bin"
    wait_run(lambda: (cloud.home(first) / Path.cwd().name / rel).is_file(), what="model.bin", p=p)
    if vouched is None:  # the scenario is a matter of time: held still for several samples (2 s each),
        deadline = time.monotonic() + 12.0  # long enough for the run to judge it (and, before, to fetch it)
        while time.monotonic() < deadline and not _rec().get("checkpoint") and p.poll() is None:
            time.sleep(0.2)
    else:
        wait_run(lambda: vouched(_rec()), what="the run counting the folder by timing", p=p)
    cloud.gpu_fault(first, "xid=79", kill_jobs=True)
    flag.write_text("")  # from now on the optimizer is written at once
    return done(p)


def test_a_half_written_first_checkpoint_held_still_is_never_resumed_from(cloud, tmp_path):
    """The issue's Xid-79 scenario: model written, optimizer still gathered for longer than two samples, the GPU
    falls off the bus. Before: the folder counted by "held still", the replacement resumed from it (no optimizer)."""
    doc, err = _half_written_then_xid79(cloud, tmp_path / "go-on", "--fetch", "checkpoints")
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert doc["resumed_from"] is None and "resume from None" in fetched_log(doc), err
    assert "starts again from the beginning" in err and "resumes from checkpoints/checkpoint-1" not in err, err
    c = doc["checkpoints"]  # the replacement's job succeeded: its checkpoint-1 counts, by that evidence
    assert c["newest"] == f"runs/{doc['run']}/checkpoints/checkpoint-1" and c["evidence"] == ["succeeded"], c
    assert doc["checkpoint"] == c["newest"]
    assert not billing(cloud)


def test_with_fs_a_half_written_first_checkpoint_is_never_resumed_from_and_the_summary_agrees(cloud, tmp_path):
    """The same with --fs: the folder lives on the filesystem, the replacement judges it there. Before: it resumed
    from it, and the summary's checkpoints.newest named the half folder while `checkpoint` was null."""
    cloud.capacity(TYPE, ["us-east-1"])
    doc, err = _half_written_then_xid79(cloud, tmp_path / "go-on", "--fs", "work")
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert doc["resumed_from"] is None and "resume from None" in fetched_log(doc), err
    c = doc["checkpoints"]
    own = f"/gpuops/runs/{doc['run']}/checkpoints"
    assert c["newest"].endswith(own + "/checkpoint-1") and c["evidence"] == ["succeeded"], c
    assert not billing(cloud)


def test_a_vouching_only_timing_gave_is_revoked_when_the_job_dies(cloud, tmp_path):
    """A checkpoint folder with no step folders (one checkpoint) counts while the job lives by holding still, no file
    open (timing): the run fetched it. Its job dies with its GPU: that vouching is revoked, the replacement starts
    from the beginning (before: it resumed from the fetched half checkpoint)."""
    doc, err = _half_written_then_xid79(cloud, tmp_path / "go-on", "--fetch", "checkpoints", layout="whole",
                                        vouched=lambda r: bool(r.get("checkpoint")))
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert "counted only because its folder held still" in err and "no longer counts" in err, err
    assert "starts again from the beginning" in err, err
    assert doc["resumed_from"] is None and "resume from None" in fetched_log(doc), err
    assert not billing(cloud)


TAGGED = """\
import os, sys, time
steps, delay = int(sys.argv[1]), float(sys.argv[2])
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start, delay = int(open(os.path.join(src, "step")).read()), 0.1
    print(f"resumed from {src} at step {start}", flush=True)
for s in range(start + 1, steps + 1):
    time.sleep(delay)
    tmp = f"checkpoints/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "w").write(f"weights of step {s}")
    os.replace(tmp, f"checkpoints/checkpoint-{s}")
    print(f"step {s} saved", flush=True)
"""


def test_with_fs_the_atomic_rename_writers_newest_folder_is_kept_after_a_preemption(cloud):
    """checkpoint-3 appears (renamed whole) and the instance is preempted within a moment, before two samples: it
    has its predecessor's files, none smaller, so the replacement resumes from it (before: from checkpoint-2, a
    step lost)."""
    cloud.capacity(TYPE, ["us-east-1"])
    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fs", "work", "--json", "--recover", "1", "--", "5", "6")
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    wait_run(lambda: (cloud.fs_dir("work") / "gpuops" / "runs" / _rec()["id"] / "checkpoints" / "checkpoint-3").is_dir(),
             what="checkpoint-3", timeout=180, p=p)
    cloud.preempt(first)
    doc, err = done(p)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert doc["resumed_from"] == "checkpoints/checkpoint-3", err
    assert "resumed from checkpoints/checkpoint-3 at step 3" in fetched_log(doc)
    assert not billing(cloud)


# Issue 42: per step, the marker first (trainer_state.json), then model.bin in two halves of 100,000 bytes with a
# flush between; at step 3 the job stops halfway (the file open, half written) until its instance is gone. A
# resumed job prints what it was given and how much of model.bin it found, and runs to step 4.
MARKER_FIRST = """\
import os, sys, time
src = os.environ.get("GPUOPS_RESUME_FROM")
print(f"resume from {src}", flush=True)
start = 0
if src:
    start = int(open(os.path.join(src, "trainer_state.json")).read())
    print(f"model.bin of {src}: {os.path.getsize(os.path.join(src, 'model.bin'))} bytes", flush=True)
for s in range(start + 1, 5):
    d = f"checkpoints/checkpoint-{s}"
    os.makedirs(d, exist_ok=True)
    open(f"{d}/trainer_state.json", "w").write(str(s))
    with open(f"{d}/model.bin", "wb") as f:
        f.write(b"w" * 100000)
        f.flush()
        if s == 3 and not src:
            print("step 3 half written", flush=True)
            while True:
                time.sleep(1)
        f.write(b"w" * 100000)
    print(f"step {s} saved", flush=True)
    time.sleep(0.3)
"""


def _marker_first_preempted(cloud, *args: str):
    """MARKER_FIRST's first job preempted while its step 3 hangs half written, after the run took checkpoint-2."""
    write_script(text=MARKER_FIRST)
    p = run_process(cloud, "--script", "train.py", "--json", "--recover", "1", *args)
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    wait_run(lambda: (_rec().get("checkpoint") or {}).get("step") == 2, what="checkpoint-2 taken", timeout=180, p=p)
    log = cloud.home(first) / Path.cwd().name / ".gpuops" / "runs"
    wait_run(lambda: any("step 3 half written" in f.read_text() for f in log.glob("*/log")), what="step 3 hanging",
             p=p)
    cloud.preempt(first)
    return done(p)


def _resumed_as_said(doc: dict, err: str) -> None:
    """The job's own view (GPUOPS_RESUME_FROM as it printed it) is the folder the run chose and said."""
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    log = fetched_log(doc)
    assert doc["resumed_from"] == "checkpoints/checkpoint-2", err
    assert "resume from checkpoints/checkpoint-2" in log and "200000 bytes" in log, log
    said = {m for ln in err.splitlines() if "resum" in ln or "starts again" in ln
            for m in re.findall(r"checkpoint-\d+", ln)}
    assert said == {"checkpoint-2"}, [ln for ln in err.splitlines() if "resum" in ln or "starts again" in ln]


def test_with_fs_a_marker_first_half_written_step_is_not_resumed_from(cloud):
    """Before: the replacement's environment held checkpoints/checkpoint-3 (100,000 of 200,000 bytes) while every
    line said checkpoint-2, nothing was set aside, and the run ended succeeded."""
    cloud.capacity(TYPE, ["us-east-1"])
    doc, err = _marker_first_preempted(cloud, "--fs", "work")
    _resumed_as_said(doc, err)
    assert "checkpoint-3" in err and "set aside" in err, err
    assert not billing(cloud)


def test_without_fs_a_marker_first_half_written_step_is_not_resumed_from(cloud):
    doc, err = _marker_first_preempted(cloud, "--fetch", "checkpoints")
    _resumed_as_said(doc, err)
    assert not billing(cloud)


DANGLING = """\
import os
for s in (1, 2, 3):
    os.makedirs(f"checkpoints/global_step{s}", exist_ok=True)
    open(f"checkpoints/global_step{s}/mp_rank_00_model_states.pt", "w").write("weights")
open("checkpoints/latest", "w").write("global_step99")
print("saved", flush=True)
"""


def test_a_deepspeed_latest_naming_a_folder_not_there_is_said_in_the_summary(cloud, gpuops):
    """Issue 42: before, the summary said "resumable from global_step3 (complete by: the job succeeded)" and no word of
    `latest`, on which DeepSpeed's own load_checkpoint without a tag fails."""
    import json

    write_script(text=DANGLING)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py",
               "--fetch", "checkpoints")
    assert r.code == 0, r.all
    c = json.loads(r.out)["checkpoints"]
    assert c["newest"].endswith("global_step3"), c
    (w,) = c["warnings"]
    assert w.startswith("latest names global_step99, which is not there") and "echo global_step3 > latest" in w, w
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py", "--fetch",
               "checkpoints")
    assert r.code == 0 and "warning: latest names global_step99, which is not there" in r.all, r.all
    assert not billing(cloud)


def test_a_job_that_checkpoints_every_second_is_resumed_from_a_recent_checkpoint(cloud):
    """Issue 42: a step folder every second never lets the folder hold still for two watch samples, so before nothing
    was taken and a preemption restarted the job from the beginning. Each change is now looked at as it comes: a
    checkpoint complete for a few seconds before the preemption is resumed from."""
    from support.recovery import RESUMABLE

    write_script(text=RESUMABLE)
    p = run_process(cloud, "--script", "train.py", "--json", "--recover", "1", "--fetch", "checkpoints", "--", "14",
                    "1", "0.05", "11")  # the first job holds after checkpoint-11 until its instance is gone
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    folder = cloud.home(first) / Path.cwd().name / "checkpoints"
    wait_run(lambda: (folder / "checkpoint-8").is_dir(), what="checkpoint-8", timeout=180, p=p)
    cloud.preempt(first)
    doc, err = done(p)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert doc["resumed_from"] and int(doc["resumed_from"].rsplit("-", 1)[1]) >= 5, (doc["resumed_from"], err)
    assert f"resumed from {doc['resumed_from']}" in fetched_log(doc)
    assert not billing(cloud)
