"""`gpuops train | status | logs | stop` on a Slurm profile, through the CLI, against the real local cluster
(tests/conftest.py `slurm_idle`: Debian's slurmctld and slurmd 22.05, 4 nodes, no accounting; its login node a
sandbox sshd). Every wait polls; nothing sleeps a fixed time."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support.schemas import valid
from support.slurm import status_of, submitted, text_of as _text, write_profile

SLEEPER = ("import os, signal, sys, time\n"
           "def term(*a):\n    print('got TERM', flush=True)\n    sys.exit(143)\n"
           "signal.signal(signal.SIGTERM, term)\n"
           "print('started on', os.environ.get('SLURMD_NODENAME'), 'restart', os.environ.get('SLURM_RESTART_COUNT', '0'),"
           " flush=True)\n"
           "time.sleep(300)\n")


def test_train_a_two_node_torchrun_job_runs_writes_a_checkpoint_and_its_log_lands(slurm_idle, gpuops, dist_python,
                                                                                   isolated):
    c = slurm_idle
    write_profile(c, isolated, python=dist_python, nodes=2, launcher="torchrun")
    Path("ddp.py").write_text(
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\nr = dist.get_rank()\nx = torch.tensor([float(r + 1)])\n"
        "dist.all_reduce(x)\n"
        "print(f\"rank {r}/{dist.get_world_size()} on {os.environ['SLURMD_NODENAME']} sum {x.item()}\", flush=True)\n"
        "if r == 0:\n    os.makedirs('checkpoints/step_1', exist_ok=True)\n"
        "    torch.save({'sum': x.item()}, 'checkpoints/step_1/model.pt')\n    print('checkpoint saved', flush=True)\n"
        "dist.barrier()\ndist.destroy_process_group()\n")
    dry = gpuops("train", "-p", "clu", "--script", "ddp.py", "--nproc-per-node", "1", "--dry-run", "--exclude", "n3")
    assert dry.code == 0, dry.all
    assert "#SBATCH --exclude=n3" in dry.out
    assert "#SBATCH --nodes=2" in dry.out and "torch.distributed.run" in dry.out and "--rdzv_backend=c10d" in dry.out
    assert "nothing synced, written or submitted" in dry.err
    assert not (c.shared / isolated.name).exists()  # nothing synced
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "ddp.py", "--nproc-per-node", "1"))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    assert (run_dir / "job_id").read_text().strip() == job_id  # both ids recorded, there and here
    assert json.loads((run_dir / "meta.json").read_text())["run_id"] == rid
    local = json.loads((Path("runs") / rid / "meta.json").read_text())
    assert local["slurm"]["job_id"] == job_id and local["slurm"]["nodes"] == 2
    res = gpuops("logs", "-f", rid, "-p", "clu")
    assert res.code == 0, res.all
    ranks = sorted(re.findall(r"rank (\d)/2 on (n\d) sum 3.0", res.out))  # c10d gives the ranks: either node may be 0
    assert [r for r, _ in ranks] == ["0", "1"] and sorted(n for _, n in ranks) == ["n1", "n2"], res.out
    assert "checkpoint saved" in res.out
    assert (c.shared / isolated.name / "checkpoints" / "step_1" / "model.pt").is_file()
    row = status_of(gpuops, rid)
    assert row["state"] == "succeeded" and row["exit_code"] == 0 and row["ending"] is None
    # another machine's copy of the project (no local record) still lists it, from the shared folder
    import shutil

    shutil.move("runs", "runs.elsewhere")
    st = gpuops("status", "-p", "clu", "--json")
    assert st.code == 0, st.all
    there = [r for r in json.loads(st.out)["runs"] if r["run_id"] == rid]
    assert there and there[0]["state"] == "succeeded" and there[0]["slurm"]["job_id"] == job_id
    shutil.move("runs.elsewhere", "runs")
    s = row["slurm"]
    assert s["state"] == "COMPLETED" and s["job_id"] == job_id and s["nodes"] == 2 and s["node_list"] == "n[1-2]"
    assert s["gpus"] == 16 and s["gpu_hours"] is not None and s["accounting"] is False
    assert [a["job_id"] for a in s["attempts"]] == [job_id]
    tail = gpuops("logs", rid, "-p", "clu", "-n", "1")
    assert tail.code == 0 and len(tail.out.splitlines()) == 1 and tail.out in res.out


def test_a_pending_job_says_why_in_words_and_stop_cancels_it(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("train.py").write_text("print('never')\n")
    res = gpuops("train", "-p", "clu", "--script", "train.py", "--nodes", "5", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    valid("train", doc)
    rid, job_id = doc["run_id"], doc["job_id"]
    row = slurm_idle.wait("a reason", lambda: (r := status_of(gpuops, rid))["slurm"]["reason"] and r)
    assert row["state"] == "pending" and row["slurm"]["state"] == "PENDING"
    s = row["slurm"]  # 22.05 says PartitionConfig at first, PartitionNodeLimit once its scheduler looked again
    assert s["reason"] in ("PartitionConfig", "PartitionNodeLimit") and s["reason_words"] and s["fix"]
    assert s["gpu_hours"] is None
    logs = gpuops("logs", rid, "-p", "clu")
    assert logs.code == 0 and logs.out == "" and f"no log yet: Slurm job {job_id} is pending" in logs.err
    plain = gpuops("status", "-p", "clu")
    assert re.search(rf"{rid}: Slurm job {job_id} PENDING \(Partition(Config|NodeLimit)\): \w+", plain.out), plain.out
    assert "    fix: " in plain.out
    res = gpuops("stop", rid, "-p", "clu")
    assert res.code == 0 and f"cancelled {rid} (Slurm job {job_id}) before it started" in res.err
    assert slurm_idle.job(job_id)["JobState"] == "CANCELLED"
    row = status_of(gpuops, rid)
    assert row["state"] == "stopped" and row["ending"]["cause"] == "stopped"


def test_stop_is_polite_first_and_the_ending_says_gpuops_stopped_it(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("sleeper.py").write_text(SLEEPER)
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py"))
    run_dir = slurm_idle.shared / isolated.name / ".gpuops" / "runs" / rid
    slurm_idle.wait("the job started", lambda: "started on" in _text(run_dir / f"slurm-{job_id}.out"))
    row = status_of(gpuops, rid)
    assert row["state"] == "running" and row["slurm"]["state"] == "RUNNING" and row["slurm"]["nodes"] == 1
    res = gpuops("stop", rid, "-p", "clu", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    valid("stop", doc)
    assert doc["result"] == "TERM" and doc["state"] == "stopped" and doc["job_id"] == job_id
    assert "got TERM" in _text(run_dir / f"slurm-{job_id}.out")  # the job's own handler ran: SIGTERM, not a kill
    row = status_of(gpuops, rid)
    assert row["state"] == "stopped" and row["ending"]["cause"] == "stopped"
    assert any("gpuops stop" in e for e in row["ending"]["evidence"])


def test_a_job_that_fails_is_said_with_the_cause_in_its_log(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("crash.py").write_text("import os\nprint('token', len(os.environ.get('MY_TOKEN', '')))\n"
                                "raise RuntimeError('boom at step 1')\n")
    Path(".env").write_text("MY_TOKEN=s3cr3t-value-42\n")
    Path(".env").chmod(0o600)
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "crash.py"))
    run_dir = slurm_idle.shared / isolated.name / ".gpuops" / "runs" / rid
    secrets = run_dir / "secrets.env"  # a secret travels in a 0600 file the batch script sources, nowhere else
    assert secrets.stat().st_mode & 0o777 == 0o600 and "s3cr3t-value-42" in secrets.read_text()
    for f in ("job.sbatch", "meta.json"):
        assert "s3cr3t-value-42" not in (run_dir / f).read_text()
    assert "s3cr3t" not in (Path("runs") / rid / "meta.json").read_text()
    res = gpuops("logs", "-f", rid, "-p", "clu")
    assert res.code == 1 and "RuntimeError: boom at step 1" in res.out and "FAILED" in res.err
    assert "token 15" in res.out  # len("s3cr3t-value-42"): the job has it
    row = status_of(gpuops, rid)
    assert row["state"] == "failed" and row["slurm"]["state"] == "FAILED" and row["exit_code"] == 1
    e = row["ending"]
    assert e and "RuntimeError: boom at step 1" in " ".join(e["evidence"]) + e["title"]
    assert any(x.startswith("scontrol: State=FAILED") for x in e["evidence"])
    w = gpuops("watch", rid, "-p", "clu")  # a first watch on Slurm: the log, the state, the ending
    assert w.code == 1 and "RuntimeError: boom at step 1" in w.out
    assert "why it ended: the job raised RuntimeError: boom at step 1" in w.err
    wj = gpuops("watch", rid, "-p", "clu", "--json")
    docs = [json.loads(x) for x in wj.out.splitlines()]
    for d in docs:
        valid("watch", d)
    assert wj.code == 1 and any(d["type"] == "log" and "RuntimeError: boom" in d["line"] for d in docs)
    assert docs[-2]["type"] == "state" and docs[-2]["slurm_state"] == "FAILED" and docs[-1]["type"] == "ending"


def test_a_job_killed_by_its_time_limit_is_said_timeout(slurm_idle, gpuops, isolated):
    c = slurm_idle
    write_profile(c, isolated, time="5")
    Path("sleeper.py").write_text(SLEEPER)
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py"))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    c.wait("the job's step started", lambda: "started on" in _text(run_dir / f"slurm-{job_id}.out"))
    # (a limit of 0 before srun has started its step fails the step instead: FAILED, not TIMEOUT)
    # the quickest real TIMEOUT (tests/sandbox/test_slurm_cluster_e2e.py): the limit set to 0 while it runs; Slurm
    # 22.05 checks limits every 30 s
    c.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=0"], check=True)
    c.wait_job(job_id, ("TIMEOUT",), timeout=45, every=0.2)
    row = status_of(gpuops, rid)
    assert row["state"] == "failed" and row["slurm"]["state"] == "TIMEOUT" and row["slurm"]["reason"] == "TimeLimit"
    assert row["ending"]["cause"] == "slurm-timeout" and "TIMEOUT" in row["ending"]["title"]
    plain = gpuops("status", rid, "-p", "clu")
    assert "why it ended: it reached its time limit and Slurm ended it (TIMEOUT)" in plain.out


def test_a_node_lost_mid_job_is_said_requeued_with_its_attempts(slurm_idle, gpuops, isolated):
    c = slurm_idle
    write_profile(c, isolated, nodes=2)
    Path("sleeper.py").write_text(SLEEPER)
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py"))
    first = c.wait_job(job_id, ("RUNNING",))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    c.wait("both nodes started", lambda: _text(run_dir / f"slurm-{job_id}.out").count("started on") == 2)
    victim = c.run(["scontrol", "show", "hostnames", first["NodeList"]], check=True).stdout.split()[1]
    assert c.kill_node(victim)
    c.wait("requeued", lambda: c.job(job_id).get("Restarts") == "1", timeout=30)
    row = c.wait("the second attempt", lambda: len((r := status_of(gpuops, rid))["slurm"]["attempts"]) == 2 and r,
                 timeout=40)
    s = row["slurm"]
    assert s["restarts"] == 1 and row["state"] in ("running", "pending")
    assert s["attempts"][0]["node_list"] == first["NodeList"] and s["attempts"][1]["restarts"] == 1
    assert [f["node"] for f in s["failed_nodes"]] == [victim] and s["failed_nodes"][0]["reason"] == "Not responding"
    plain = gpuops("status", rid, "-p", "clu")
    assert "requeued 1 time by Slurm" in plain.out and f"#1 on {first['NodeList']}" in plain.out
    assert f"node {victim} is down* (Not responding): NODE_FAIL, the job was requeued off it" in plain.out
    assert "started on" in _text(run_dir / f"slurm-{job_id}.out")  # the first attempt's lines kept (append)


def test_sync_to_the_shared_folder_is_todays_sync(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("data.txt").write_text("x" * 100)
    res = gpuops("sync", "-p", "clu")
    assert res.code == 0, res.all
    assert (slurm_idle.shared / isolated.name / "data.txt").read_text() == "x" * 100


@pytest.fixture(autouse=True)
def _no_job_left(slurm_cluster):
    yield
    slurm_cluster.run(["scancel", "--user", slurm_cluster.info["login"]["user"]])


def test_with_accounting_sacct_says_who_cancelled_and_the_gpu_hours(slurm_accounting_cluster, gpuops, isolated):
    c = slurm_accounting_cluster
    write_profile(c, isolated, gpus_per_node=8)
    Path("sleeper.py").write_text(SLEEPER)
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "sleeper.py"))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    c.wait("the job started", lambda: "started on" in _text(run_dir / f"slurm-{job_id}.out"), timeout=30)
    c.wait("2 s of run time", lambda: c.job(job_id).get("RunTime", "00:00:00") >= "00:00:02", timeout=30, every=0.2)
    c.run(["scancel", job_id], check=True)  # someone else's scancel, not gpuops stop
    row = c.wait("sacct's ending", lambda: (r := status_of(gpuops, rid))["slurm"]["source"] == "sacct" and r,
                 timeout=30)
    s = row["slurm"]
    assert s["accounting"] is True and s["state"] == "CANCELLED" and row["state"] == "failed"
    assert row["ending"]["cause"] == "slurm-cancelled"
    import os

    assert f"uid {os.getuid()}" in row["ending"]["title"] or "root" in row["ending"]["title"]
    assert s["gpu_hours"] is not None and s["gpu_hours"] > 0 and s["cost"] == round(s["gpu_hours"] * 2.5, 4)
    c.run(["scancel", "--user", c.info["login"]["user"]])


def _waiting_job(gpuops, say: str, then: str = "") -> tuple[str, str]:
    """Submit waits.py: it prints `say` (python values), waits for a file `go` (60 s at most), then runs `then`."""
    Path("waits.py").write_text(f"import os, time\nprint({say}, flush=True)\n"
                                "t = time.time()\nwhile not os.path.exists('go') and time.time() - t < 60:\n"
                                "    time.sleep(0.1)\n" + then)
    return submitted(gpuops("train", "-p", "clu", "--script", "waits.py"))


def test_watch_shows_every_nodes_gpus_and_the_log_until_the_end(slurm_idle, gpuops, isolated):
    import os
    import subprocess
    import sys

    c = slurm_idle
    write_profile(c, isolated, nodes=2)
    rid, job_id = _waiting_job(gpuops, "'waiting'", then="print('went', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "watch", rid, "-p", "clu", "--interval", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    import threading

    seen: list = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()  # stderr read aside: the wait below polls what came, never blocks on a read
    try:
        c.wait("a node's GPUs", lambda: any(re.match(r"n[12]: 8 GPU\(s\) util [\d ]+ %, memory [\d.]+/[\d.]+ GiB", x)
                                            for x in list(seen)), timeout=30)
        (c.shared / isolated.name / "go").write_text("")
        out = proc.stdout.read()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        err = "".join(seen)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen)
    assert "waiting" in out and "went" in out
    assert "Slurm: job running" in err and "COMPLETED" in err


def test_a_requeued_attempt_starts_from_the_resume_file_gpuops_wrote(slurm_idle, gpuops, isolated):
    """The talking part writes the run folder's resume file over the login node's connection; Slurm's requeue runs
    the same batch script again, which reads it (GPUOPS_RESUME_FROM): the path a requeued run resumes from."""
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect
    from gpuops.slurm.commands import LoginNode

    c = slurm_idle
    write_profile(c, isolated)
    Path("resumer.py").write_text("import os, time\nprint('resume from', os.environ.get('GPUOPS_RESUME_FROM', '-'),"
                                  " flush=True)\ntime.sleep(300)\n")
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "resumer.py"))
    run_dir = c.shared / isolated.name / ".gpuops" / "runs" / rid
    log = run_dir / f"slurm-{job_id}.out"
    c.wait("the first attempt", lambda: "resume from -" in _text(log))
    remote = connect(profiles.resolve("clu", isolated), announce=lambda *_: None)
    try:
        LoginNode(remote).write_resume(str(run_dir), "/ckpt/step 12")  # a space: read as data, never run
    finally:
        remote.close()
    assert (run_dir / "resume_from").read_text() == "/ckpt/step 12\n"
    c.run(["scontrol", "requeue", job_id], check=True)
    c.wait("the second attempt resumed", lambda: "resume from /ckpt/step 12" in _text(log), timeout=40)
    assert "gpuops: resuming from /ckpt/step 12" in _text(log)
    row = status_of(gpuops, rid)
    assert row["slurm"]["restarts"] == 1 and len(row["slurm"]["attempts"]) == 2


def test_what_slurm_refuses_is_said_with_its_words(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated, partition="nosuch")
    Path("train.py").write_text("print('x')\n")
    res = gpuops("train", "-p", "clu", "--script", "train.py")
    assert res.code == 1 and "sbatch refused the job" in res.err and "invalid partition" in res.err.lower(), res.all
    assert not list(Path("runs").glob("*/meta.json"))  # nothing recorded for a job that does not exist
    ray = gpuops("train", "-p", "clu", "--script", "train.py", "--launcher", "ray")
    assert ray.code == 2 and "torchrun" in ray.err
    bad = gpuops("train", "-p", "clu", "--script", "train.py", "--exclude", "n1;reboot", "--dry-run")
    assert bad.code == 2 and "cannot go on an #SBATCH line" in bad.err


def test_stop_scancels_a_job_that_ignores_sigterm_after_the_grace(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle, isolated)
    Path("stubborn.py").write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                   "print('ignoring TERM', flush=True)\ntime.sleep(300)\n")
    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "stubborn.py"))
    run_dir = slurm_idle.shared / isolated.name / ".gpuops" / "runs" / rid
    slurm_idle.wait("the job started", lambda: "ignoring TERM" in _text(run_dir / f"slurm-{job_id}.out"))
    res = gpuops("stop", rid, "-p", "clu", "--grace", "1", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    assert doc["result"] == "KILL" and doc["slurm_state"] == "CANCELLED" and doc["state"] == "stopped"
    assert json.loads((run_dir / "stop.json").read_text())["signal"] == "KILL"
    row = status_of(gpuops, rid)
    assert row["state"] == "stopped" and row["ending"]["cause"] == "stopped"


def test_watch_once_is_one_snapshot_of_state_gpus_and_log(slurm_idle, gpuops, isolated):
    c = slurm_idle
    write_profile(c, isolated, nodes=2)
    rid, job_id = _waiting_job(gpuops, "'waiting on', os.environ.get('SLURMD_NODENAME')")
    log = c.shared / isolated.name / ".gpuops" / "runs" / rid / f"slurm-{job_id}.out"
    c.wait("both nodes started", lambda: _text(log).count("waiting on") == 2)
    r = gpuops("watch", rid, "-p", "clu", "--once")
    assert r.code == 0, r.all
    assert r.out.count("waiting on") == 2
    assert len(re.findall(r"^n[12]: 8 GPU\(s\) util [\d ]+ %", r.err, re.M)) == 2, r.err
    assert f"{rid}: Slurm job {job_id} RUNNING on 2 node(s)" in r.err
    j = gpuops("watch", rid, "-p", "clu", "--once", "--json")
    assert j.code == 0, j.all
    docs = [json.loads(x) for x in j.out.splitlines()]
    assert len({d["node"] for d in docs if d["type"] == "sample"}) == 2, docs
    assert docs[-1]["type"] == "state" and docs[-1]["slurm_state"] == "RUNNING"
    assert sum(1 for d in docs if d["type"] == "log" and "waiting on" in d["line"]) == 2  # srun's `0: ` kept
    (c.shared / isolated.name / "go").write_text("")
    c.wait_job(job_id)
    done = gpuops("watch", rid, "-p", "clu", "--once")
    assert done.code == 0 and "COMPLETED, exit 0:0" in done.err, done.all
