"""A run's checkpoints are its own, and a recovery that knows what happened (issue #27), end to end through the
Lambda emulator, its sandbox instances and real `gpuops run` processes: each test reproduces one of the issue's
"what goes wrong today" and fails on the code before it."""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from support.cloud import TYPE
from support.pipeline import run_process, write_script
from support.recovery import billing, done, fetched_log, records, wait_run

# argv: steps, delay, delay once resumed, a tag for its weights, the checkpoint folder, and (optional) HOLD: a job not
# resumed stops after checkpoint-HOLD and waits there until its instance is ended (a fault the test brings lands while
# it trains, whatever the load). Each checkpoint written under a temporary name then renamed; the weights name the run
# (the tag) that wrote them.
TAGGED = """\
import os, sys, time
steps, delay, tag, d = int(sys.argv[1]), float(sys.argv[2]), sys.argv[4], sys.argv[5]
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start, delay = int(open(os.path.join(src, "step")).read()), float(sys.argv[3])
    print(f"resumed from {src} at step {start}: " + open(os.path.join(src, "model.bin")).read(), flush=True)
for s in range(start + 1, steps + 1):
    time.sleep(delay)
    tmp = f"{d}/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "w").write(f"weights of step {s} by run {tag}")
    os.replace(tmp, f"{d}/checkpoint-{s}")
    print(f"step {s} saved", flush=True)
    if not src and len(sys.argv) > 6 and s == int(sys.argv[6]):
        while True:
            time.sleep(1)
"""


def _rec(prefix: str) -> dict:
    return next((r for r in records() if r["id"].startswith(prefix + "-")), {})


def _checkpoint_step(prefix: str) -> int:
    return ((_rec(prefix).get("checkpoint") or {}).get("step")) or 0


def test_two_runs_in_one_project_folder_each_resume_from_their_own_checkpoint(cloud):
    """Run A trains with --recover; run B of the same project runs to its end meanwhile, fetching checkpoints of
    the same names. A is preempted: its replacement resumes from A's own weights (before: B's, pushed from the
    shared ./checkpoints), and each run's checkpoints are in its own folder."""
    write_script(text=TAGGED)
    a = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1", "--name", "runa",
             "--", "12", "0.5", "0.3", "A", "checkpoints", "2")
    wait_run(lambda: _checkpoint_step("runa") >= 2, what="run A's checkpoint-2 fetched", p=a)
    (first,) = [i["id"] for i in billing(cloud)]  # A's
    b = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--name", "runb",
             "--", "6", "0.1", "0", "B", "checkpoints")
    doc_b, err_b = done(b)
    assert b.returncode == 0 and doc_b["outcome"] == "succeeded", err_b
    assert a.poll() is None, "run A ended before its preemption"
    cloud.preempt(first)
    doc_a, err_a = done(a)
    assert a.returncode == 0 and doc_a["outcome"] == "succeeded" and doc_a["recoveries"] == 1, err_a
    step = int(doc_a["resumed_from"].rsplit("-", 1)[1])
    assert f"resumed from checkpoints/checkpoint-{step} at step {step}: weights of step {step} by run A" in fetched_log(doc_a)
    a_dir, b_dir = Path.cwd() / doc_a["checkpoints"]["local"], Path.cwd() / doc_b["fetched"]["checkpoints"]
    assert a_dir != b_dir and a_dir.parent.name == doc_a["run"] and b_dir.parent.name == doc_b["run"]
    assert (a_dir / "checkpoint-12" / "model.bin").read_text() == "weights of step 12 by run A"
    assert (b_dir / "checkpoint-6" / "model.bin").read_text() == "weights of step 6 by run B"
    assert doc_a["checkpoints"]["newest"].startswith(doc_a["checkpoints"]["local"] + "/checkpoint-")
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]


def test_a_stale_step_folder_in_the_project_is_never_resumed_from(cloud):
    """`ckpt/checkpoint-99`, left here by an earlier experiment, is neither uploaded nor taken as the newest
    checkpoint (before: sync uploaded it, the fetcher took it, the replacement resumed from step 99)."""
    write_script(text=TAGGED)
    stale = Path.cwd() / "ckpt" / "checkpoint-99"
    stale.mkdir(parents=True)
    (stale / "step").write_text("99")
    (stale / "model.bin").write_text("weights of an earlier experiment")
    p = run_process(cloud, "--script", "train.py", "--fetch", "ckpt", "--json", "--recover", "1",
             "--", "6", "0.5", "0.3", "A", "ckpt", "2")
    wait_run(lambda: _checkpoint_step("train") >= 2, what="checkpoint-2 fetched", p=p)
    (first,) = [i["id"] for i in billing(cloud)]
    assert not (cloud.home(first) / Path.cwd().name / "ckpt" / "checkpoint-99").exists()  # never uploaded
    cloud.preempt(first)
    doc, err = done(p)
    assert p.returncode == 0 and doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    step = int(doc["resumed_from"].rsplit("-", 1)[1])
    assert 2 <= step < 6 and "checkpoint-99" not in err, err
    assert f"resumed from ckpt/checkpoint-{step} at step {step}: weights of step {step} by run A" in fetched_log(doc)
    assert (stale / "model.bin").read_text() == "weights of an earlier experiment"  # left alone here


# -- a recovery that knows what happened --------------------------------------------------------------------------
def _on_instance(cloud, iid: str, rel: str) -> Path:
    return cloud.home(iid) / Path.cwd().name / rel


def test_a_gpu_failure_that_kills_the_job_at_once_is_recovered_not_reported_as_the_jobs(cloud):
    """The GPU falls off the bus and the job dies in the same instant, before the stream's next health sample
    (before: `failed (job failed)`, terminated): the health is read once more, the instance replaced, the job resumed
    from the newest complete checkpoint."""
    write_script(text=TAGGED)
    # held after step 2 until its GPU kills it: under load, a job left to run could finish before the fault
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1",
             "--", "6", "1.5", "0.3", "A", "checkpoints", "2")
    wait_run(lambda: _checkpoint_step("train") >= 2, what="checkpoint-2 fetched", p=p)
    (first,) = [i["id"] for i in billing(cloud)]
    cloud.gpu_fault(first, "xid=79", kill_jobs=True)
    doc, err = done(p)
    assert p.returncode == 0 and doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert "Xid 79" in err and "the job died with its GPU" in err and "job failed" not in err, err
    assert doc["instances"][0]["ids"] == [first] and "Xid 79" in doc["instances"][0]["ended"]
    step = int(doc["resumed_from"].rsplit("-", 1)[1])
    assert f"resumed from checkpoints/checkpoint-{step} at step {step}" in fetched_log(doc)


def test_without_recover_a_gpu_failure_is_named_and_resume_recover_replaces_and_resumes(cloud, gpuops):
    """No --recover: the outcome names the hardware (not the job) and the command that replaces the instance and
    resumes; that command does so, from the newest checkpoint known complete."""
    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--", "6", "2", "0.3", "A",
             "checkpoints")
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    wait_run(lambda: _on_instance(cloud, first, "checkpoints/checkpoint-3").is_dir(), what="checkpoint-3", p=p)
    cloud.gpu_fault(first, "xid=79", kill_jobs=True)
    doc, err = done(p)
    assert p.returncode == 1 and doc["outcome"] == "failed", err
    assert "died with its GPU" in err and "Xid 79" in err and "not the job's" in doc["stop_reason"], err
    hint = f"gpuops run --resume --id {doc['run']} --recover 1 replaces the instance and resumes"
    assert hint in err, err
    assert not billing(cloud)  # terminated after the fetch, as a failed job's instance is
    r = gpuops("run", "--resume", "--id", doc["run"], "--recover", "1", "--json")
    assert r.code == 0, r.all
    doc2 = json.loads(r.out)
    assert doc2["outcome"] == "succeeded" and doc2["recoveries"] == 1 and doc2["instances"][0]["ids"] == [first]
    step = int(doc2["resumed_from"].rsplit("-", 1)[1])
    assert step >= 2 and f"resumed from checkpoints/checkpoint-{step} at step {step}: weights of step {step} " \
                         "by run A" in fetched_log(doc2)
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]


INCOMPLETE = """\
import os, sys, time
flag = sys.argv[1]
src = os.environ.get("GPUOPS_RESUME_FROM")
print(f"resume from {src}", flush=True)
if src:
    open(os.path.join(src, "optim.pt")).read()  # an incomplete checkpoint fails here
os.makedirs("checkpoints/checkpoint-1", exist_ok=True)
open("checkpoints/checkpoint-1/model.bin", "w").write("model")
print("model written", flush=True)
deadline = time.time() + 120
while not os.path.exists(flag) and time.time() < deadline:
    time.sleep(0.2)
open("checkpoints/checkpoint-1/optim.pt", "w").write("optimizer")
print("step 1 saved", flush=True)
"""


def test_an_incomplete_first_checkpoint_does_not_count(cloud, tmp_path):
    """checkpoint-1 has its model and not yet its optimizer when the GPU fails and the job dies: it has no
    predecessor to compare with, no marker, no successor, and the job died: the replacement starts from the
    beginning (before: it resumed from the incomplete checkpoint-1)."""
    flag = tmp_path / "go-on"
    write_script(text=INCOMPLETE)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1", "--", str(flag))
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    wait_run(lambda: _on_instance(cloud, first, "checkpoints/checkpoint-1/model.bin").is_file(), what="model.bin", p=p)
    cloud.gpu_fault(first, "xid=79", kill_jobs=True)
    flag.write_text("")  # from now on the optimizer is written at once
    doc, err = done(p)
    assert p.returncode == 0 and doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    assert doc["resumed_from"] is None and "resume from None" in fetched_log(doc), err
    assert "starts again from the beginning" in err, err


def test_gpuops_down_of_the_runs_own_instance_ends_the_run(cloud, gpuops):
    """The user ends the run's instance with `gpuops down` (the command the run's own messages name): the run ends,
    saying so; nothing is launched in its place (before: taken as a loss, a new instance launched)."""
    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "2",
             "--", "30", "1", "0", "A", "checkpoints")
    wait_run(lambda: (_rec("train").get("stages") or {}).get("watch"), what="training", p=p)
    r = gpuops("down", _rec("train")["profile"])
    assert r.code == 0, r.all
    doc, err = done(p)
    assert p.returncode == 1 and doc["outcome"] == "ended" and doc["recoveries"] == 0, err
    assert "terminated by `gpuops down` from this machine, as asked: the run ends here" in err, err
    assert cloud.launch_requests() == 1 and not billing(cloud)


def test_resume_from_a_second_shell_is_refused_while_the_first_process_lives(cloud, gpuops):
    """`run --resume` while the run's process is alive is refused (exit 2), naming it (before: both ran the run);
    once that process is gone (kill -9), --resume takes the run over and finishes it."""
    import socket

    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1",
             "--", "4", "3", "0", "A", "checkpoints")
    wait_run(lambda: (_rec("train").get("stages") or {}).get("watch"), what="training", p=p)
    r = gpuops("run", "--resume")
    assert r.code == 2 and f"process {p.pid} on host {socket.gethostname()}" in r.err, r.all
    assert "one process per run" in r.err and "Traceback" not in r.all
    p.kill()
    p.communicate(timeout=30)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and not billing(cloud)


def test_the_summary_counts_every_instance_that_billed(cloud, gpuops):
    """kill -9 while the first instance boots: --resume reclaims it (terminates it) and launches another; the
    summary shows both, each with its id, times and cost, and their costs make the total (before: the reclaimed
    one was left out)."""
    write_script(text=TAGGED)
    cloud.boot_seconds(60)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--", "1", "0", "0", "A",
             "checkpoints")
    (first,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the launch", p=p)
    time.sleep(1.5)
    p.kill()
    p.communicate(timeout=30)
    cloud.boot_seconds(0.5)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 0, doc
    (one, two) = doc["instances"]
    assert one["ids"] == [first] and "reclaimed" in one["ended"] and one["cost"] > 0 and one["duration_s"] >= 1
    assert two["ids"] and two["ids"] != [first] and two["ended"] == "terminated" and two["cost"] > 0
    at = [datetime.fromisoformat(x) for x in (one["started_at"], one["ended_at"], two["started_at"], two["ended_at"])]
    assert at[0] < at[1] <= at[2] < at[3], doc["instances"]
    assert abs(one["cost"] + two["cost"] - doc["total_cost"]) < 0.001
    assert not billing(cloud)


def test_a_replacement_whose_launch_failed_is_not_shown_running(cloud):
    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1",
             "--", "30", "1", "0", "A", "checkpoints")
    wait_run(lambda: (_rec("train").get("stages") or {}).get("watch"), what="training", p=p)
    (first,) = [i["id"] for i in billing(cloud)]
    cloud.capacity(TYPE, [])
    cloud.preempt(first)
    doc, err = done(p)
    assert p.returncode == 1 and doc["stop_reason"].startswith("recovery failed"), err
    assert [i["ids"] for i in doc["instances"]] == [[first]], doc["instances"]  # nothing launched, nothing billed
    assert all(i["ended"] != "running" for i in doc["instances"])


# -- checkpoints on a Lambda filesystem (run --fs) ----------------------------------------------------------------
def test_with_fs_the_checkpoints_live_on_the_filesystem_and_a_replacement_resumes_from_there(cloud):
    """run --fs: the job writes checkpoints/... unchanged, which is the run's own folder on the filesystem; a
    preempted instance's replacement mounts it and resumes from there: nothing pushed, nothing fetched (no
    --fetch), and the summary says where they are and how to get them later."""

    cloud.capacity(TYPE, ["us-east-1"])
    write_script(text=TAGGED)
    p = run_process(cloud, "--script", "train.py", "--fs", "work", "--json", "--recover", "1",
             "--", "6", "0.5", "0.3", "A", "checkpoints", "2")
    wait_run(lambda: _checkpoint_step("train") >= 2, what="checkpoint-2 judged complete on the filesystem", p=p)
    (first,) = [i["id"] for i in billing(cloud)]
    assert _on_instance(cloud, first, "checkpoints").is_symlink()
    cloud.preempt(first)
    doc, err = done(p)
    assert p.returncode == 0 and doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    step = int(doc["resumed_from"].rsplit("-", 1)[1])
    assert f"resumed from checkpoints/checkpoint-{step} at step {step}: weights of step {step} by run A" in fetched_log(doc)
    c = doc["checkpoints"]
    own = cloud.fs_dir("work") / "gpuops" / "runs" / doc["run"] / "checkpoints"
    assert c["filesystem"].endswith(f"/gpuops/runs/{doc['run']}/checkpoints") and not c["fetched"]
    assert (own / "checkpoint-6" / "model.bin").read_text() == "weights of step 6 by run A"
    assert "gpuops up ckpt --fs work" in c["get_later"] and c["filesystem"] in c["get_later"]
    assert list(doc["fetched"]) == ["log"] and not (Path.cwd() / "runs" / doc["run"] / "checkpoints").exists()
    push = [s for s in doc["stages"] if s["stage"] == "push"]
    assert push and "nothing to push" in push[0]["detail"], push
    assert not billing(cloud)


def test_with_fs_and_fetch_the_checkpoints_are_brought_here_at_the_end(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    write_script(text=TAGGED)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py",
               "--fs", "work", "--fetch", "checkpoints", "--", "2", "0.1", "0", "A", "checkpoints")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["fetched"]["checkpoints"] == f"runs/{doc['run']}/checkpoints" and doc["checkpoints"]["fetched"]
    here = Path.cwd() / doc["fetched"]["checkpoints"]
    assert (here / "checkpoint-2" / "model.bin").read_text() == "weights of step 2 by run A"
    assert (cloud.fs_dir("work") / "gpuops" / "runs" / doc["run"] / "checkpoints" / "checkpoint-2").is_dir()
