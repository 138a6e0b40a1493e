"""A job Slurm requeues resumes from the newest complete checkpoint of its own run, chosen on the cluster by the
requeued attempt itself (slurm/resume.py: the run folder's resume_judge.py, transfer/ckptjudge.py shipped whole), and
`--recover N` bounds the requeues. Through the CLI against the real local cluster (`slurm_idle`); the requeue is
Slurm's own (`scontrol requeue`, what a preemption does; a node's loss takes 9 s more and is tested in
test_jobs_e2e.py). Every wait polls."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from support.slurm import status_of, submitted, text_of as _text, write_profile

# The writer: per step a folder, the marker (trainer_state.json) first, then model.bin. Step 3 stops half
# way, its file open, when Slurm requeues the job. The second attempt says what it got and how big its model.bin is.
CKJOB = """import json, os, sys, time
ck = os.environ["GPUOPS_CHECKPOINT_DIR"]
got = os.environ.get("GPUOPS_RESUME_FROM", "-")
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
print("attempt", restart, "resume from", got, flush=True)
if restart != "0":
    size = os.path.getsize(os.path.join(got, "model.bin")) if got != "-" else -1
    print("resumed model.bin bytes", size, flush=True)
    sys.exit(0)
for n in (1, 2):
    d = os.path.join(ck, "checkpoint-%d" % n)
    os.makedirs(d)
    with open(os.path.join(d, "trainer_state.json"), "w") as fh:
        json.dump({"global_step": n}, fh)
    with open(os.path.join(d, "model.bin"), "wb") as fh:
        fh.write(b"w" * 200000)
d = os.path.join(ck, "checkpoint-3")
os.makedirs(d)
with open(os.path.join(d, "trainer_state.json"), "w") as fh:
    json.dump({"global_step": 3}, fh)
fh = open(os.path.join(d, "model.bin"), "wb")
fh.write(b"w" * 100000)
fh.flush()
print("step 3 half written", flush=True)
time.sleep(300)
"""


def test_a_requeued_job_resumes_from_the_newest_complete_checkpoint_of_its_own_run(slurm_idle, gpuops, isolated):
    c = slurm_idle
    write_profile(c, isolated)
    Path("ckjob.py").write_text(CKJOB)
    shared = c.shared / isolated.name
    # an earlier experiment's step folder in the same checkpoint folder, complete by its marker and newest by number:
    # not this run's
    old = shared / "checkpoints" / "checkpoint-9"
    old.mkdir(parents=True)
    (old / "trainer_state.json").write_text("{}")
    (old / "model.bin").write_bytes(b"o" * 200000)
    for f in old.iterdir():
        os.utime(f, (time.time() - 3600, time.time() - 3600))
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "ckjob.py", "--recover", "2"))
    run_dir = shared / ".gpuops" / "runs" / rid
    log = run_dir / f"slurm-{job_id}.out"
    c.wait("step 3 half written", lambda: "step 3 half written" in _text(log))
    assert "attempt 0 resume from -" in _text(log)
    c.run(["scontrol", "requeue", job_id], check=True)
    c.wait("the requeued attempt", lambda: "resumed model.bin bytes" in _text(log), timeout=60)
    text = _text(log)
    want = str(shared / "checkpoints" / "checkpoint-2")
    assert f"attempt 1 resume from {want}" in text, text  # the job's own view: GPUOPS_RESUME_FROM
    assert "resumed model.bin bytes 200000" in text, text  # a whole file, not the half-written step 3
    assert f"gpuops: attempt 2 resumes from {want} (complete by:" in text
    assert (run_dir / "resume_from").read_text() == want + "\n"
    c.wait_job(job_id, timeout=30)

    row = status_of(gpuops, rid)  # --json, checked against the schema
    s = row["slurm"]
    assert row["state"] == "succeeded" and s["restarts"] == 1, row
    assert s["checkpoints"] == str(shared / "checkpoints")
    [r] = s["resumes"]
    assert r["attempt"] == 1 and r["job_id"] == job_id and r["checkpoint"] == want and r["step"] == 2
    assert r["evidence"] == ["marker:hf-trainer"], r
    over = dict(map(tuple, r["passed_over"]))
    assert "cut short when the job died" in over["checkpoint-3"], over
    assert "before the job started" in over["checkpoint-9"], over  # not this run's
    plain = gpuops("status", rid, "-p", "clu")
    assert plain.code == 0, plain.all
    assert "attempt 2 resumed from checkpoints/checkpoint-2 (complete by: Hugging Face Trainer's" in plain.out, \
        plain.out


def test_recover_bounds_the_requeues_and_without_a_checkpoint_the_attempt_starts_fresh(slurm_idle, gpuops, isolated):
    c = slurm_idle
    write_profile(c, isolated)
    Path("sleeper.py").write_text("import os, time\nprint('attempt', os.environ.get('SLURM_RESTART_COUNT', '0'), "
                                  "'resume from', os.environ.get('GPUOPS_RESUME_FROM', '-'), flush=True)\n"
                                  "time.sleep(300)\n")
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py", "--recover", "1",
                                   "--checkpoints", "ck"))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    log = run_dir / f"slurm-{job_id}.out"
    c.wait("the first attempt", lambda: "attempt 0 resume from -" in _text(log))
    c.run(["scontrol", "requeue", job_id], check=True)
    c.wait("the second attempt", lambda: "attempt 1 resume from -" in _text(log), timeout=60)
    assert f"gpuops: attempt 2: no complete checkpoint of this run in {c.shared / isolated.name / 'ck'}" in _text(log)
    c.run(["scontrol", "requeue", job_id], check=True)
    c.wait_job(job_id, timeout=60)
    text = _text(log)
    assert "requeued 2 times, more than --recover 1 allows: not starting again" in text, text
    assert "attempt 2 resume from" not in text  # the bound holds before the job starts
    row = status_of(gpuops, rid)
    assert row["state"] == "failed" and [r["checkpoint"] for r in row["slurm"]["resumes"]] == [None], row


def test_dry_run_shows_the_judge_and_the_bound(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("train.py").write_text("print('x')\n")
    res = gpuops("train", "-p", "clu", "--script", "train.py", "--recover", "3", "--dry-run")
    assert res.code == 0, res.all
    assert "more than --recover 3 allows" in res.out
    assert 'resume_judge.py" "$D" ' in res.out and "GPUOPS_CHECKPOINT_DIR=" in res.out
    res = gpuops("train", "-p", "clu", "--script", "train.py", "--checkpoints", "a b", "--dry-run")
    assert res.code == 2 and "the checkpoint folder" in res.err, res.all
    doc = json.loads(gpuops("train", "-p", "clu", "--script", "train.py", "--dry-run", "--json").out)
    assert "--recover" not in doc["batch_script"]


def test_with_recover_a_requeued_job_is_kept_off_the_node_that_failed_it(slurm_idle, gpuops, isolated):
    """A running job's allocation is fixed (Slurm refuses ExcNodeList then); once its requeue waits, status keeps it
    off the node that failed it. Four nodes of four: without the lost node the job waits, so status sees it wait."""
    c = slurm_idle
    write_profile(c, isolated, nodes=4)
    Path("sleeper.py").write_text("import os, time\nprint('started on', os.environ.get('SLURMD_NODENAME'), "
                                  "flush=True)\ntime.sleep(300)\n")
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py", "--recover", "1"))
    log = c.shared / isolated.name / ".gpuops" / "runs" / rid / f"slurm-{job_id}.out"
    c.wait("every node started", lambda: _text(log).count("started on") == 4)
    victim = c.nodes[-1]
    assert c.kill_node(victim)
    c.wait("requeued", lambda: c.job(job_id).get("Restarts") == "1", timeout=30)
    row = c.wait("kept off", lambda: (r := status_of(gpuops, rid))["slurm"].get("kept_off") and r, timeout=30)
    assert row["slurm"]["kept_off"] == [victim] and row["state"] == "pending", row
    assert c.job(job_id).get("ExcNodeList") == victim
    plain = gpuops("status", rid, "-p", "clu")
    assert plain.code == 0 and "kept off" not in plain.err  # already kept off: not asked again
    assert f"node {victim} is down" in plain.out


def test_fetch_takes_a_jobs_checkpoint_from_the_shared_folder_through_the_login_node(slurm_idle, gpuops, isolated):
    """`gpuops fetch` on a Slurm profile: the job wrote on a node, the shared folder is read through the login node,
    every file verified (size and SHA-256 on both ends); --latest passes over a step folder lacking a file."""
    c = slurm_idle
    write_profile(c, isolated)
    Path("writer.py").write_text(
        "import os\nck = os.environ['GPUOPS_CHECKPOINT_DIR']\n"
        "for n in (1, 2, 3):\n    d = os.path.join(ck, 'checkpoint-%d' % n)\n    os.makedirs(d)\n"
        "    open(os.path.join(d, 'trainer_state.json'), 'w').write('{}')\n"
        "    if n < 3:\n        open(os.path.join(d, 'model.bin'), 'wb').write(os.urandom(300000))\n"
        "print('wrote on', os.environ.get('SLURMD_NODENAME'), flush=True)\n")
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "writer.py"))
    assert c.wait_job(job_id, timeout=30)["JobState"] == "COMPLETED"
    res = gpuops("fetch", "-p", "clu", "checkpoints", "--latest", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    assert doc["dirs"] == ["checkpoint-2"] and doc["skipped_partial"] == "checkpoint-3" and doc["verified"] == 2
    got = Path("checkpoints/checkpoint-2/model.bin").read_bytes()
    assert got == (c.shared / isolated.name / "checkpoints/checkpoint-2/model.bin").read_bytes()
    assert not Path("checkpoints/checkpoint-3").exists()
