"""The local Slurm cluster (gpuops.sandbox.slurm) through its real daemons: Debian's slurmctld, slurmd and munge, 4 nodes
and a login node per xdist worker (tests/conftest.py `slurm_cluster`). Each test finds it fresh (`slurm_idle`).

Times measured here (this machine, 2 cores; printed with -s): the cluster's start, a 2-node job from sbatch to its
end, a lost node to its job's requeue, and the quickest real TIMEOUT (a running job's limit set to 0 with `scontrol
update`: Slurm 22.05 checks time limits every 30 s, PERIODIC_TIMEOUT, so it ends within 30 s; `--time=1` takes 60 to
90 s, and Slurm has no limit finer than a minute).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from gpuops.sandbox import slurm, slurm_login, slurm_nodes, slurm_procs


def test_four_idle_nodes_and_the_login_node_finds_slurm(slurm_idle):
    c = slurm_idle
    print(f"cluster start: {c.started_in:.2f} s")
    out = c.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G|%P"], check=True).stdout.split()
    assert out == [f"n{i}|idle|gpu:8|gpu*" for i in range(1, 5)]
    # over SSH, as gpuops reaches a cluster: the login node's session finds the commands and this cluster's conf
    login = c.ssh("sinfo -h -o '%P %D %T'; command -v sbatch")
    assert login.returncode == 0, login.stderr
    assert login.stdout.splitlines()[0] == "gpu* 4 idle"
    info = slurm.cluster_info(c.dir)
    assert info["partition"] == "gpu" and info["nodes"] == ["n1", "n2", "n3", "n4"] and info["gpus_per_node"] == 8
    assert info["slurm_version"].startswith("22.05") and Path(info["shared_dir"]).is_dir()
    assert info["name"] in Path(info["conf"]).read_text()
    assert not info["accounting"]  # a user's cluster without slurmdbd: sacct says so
    sacct = c.run(["sacct", "-j", "1"])
    assert sacct.returncode == 1 and "Slurm accounting storage is disabled" in sacct.stdout + sacct.stderr


def test_a_two_node_job_runs_and_writes_to_the_shared_folder(slurm_idle):
    c = slurm_idle
    script = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:8\n"
              "#SBATCH --output=two-%j.out\n"
              "srun bash -c 'echo \"node=$SLURMD_NODENAME rank=$SLURM_PROCID gpus=$CUDA_VISIBLE_DEVICES\"'\n")
    t = time.monotonic()
    sub = c.ssh(f"cd {c.shared} && sbatch --parsable", input=script)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    job = c.wait_job(job_id)
    print(f"2-node job, sbatch over SSH to COMPLETED: {time.monotonic() - t:.2f} s")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0" and job["NumNodes"] == "2"
    lines = sorted((c.shared / f"two-{job_id}.out").read_text().split())
    assert lines == ["gpus=0,1,2,3,4,5,6,7"] * 2 + ["node=n1", "node=n2", "rank=0", "rank=1"]


def test_each_node_runs_its_own_emulated_gpus(slurm_idle):
    c = slurm_idle
    c.set_gpu_fault("n3", "xid=79@2")
    c.set_gpu_fault("n3", "ecc=4@2")
    c.set_gpu_fault("n4", "gpu-lost")
    step = ("echo $SLURMD_NODENAME $(command -v nvidia-smi)"
            " ecc=$(nvidia-smi --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader | paste -sd,)"
            " xid=$(dmesg | grep -c Xid)")
    job_id = c.sbatch("-N4", "--ntasks-per-node=1", "-o", "gpus-%j.out", "--wrap", f"srun bash -c '{step}'")
    assert c.wait_job(job_id)["JobState"] == "COMPLETED"
    seen = {line.split()[0]: line for line in (c.shared / f"gpus-{job_id}.out").read_text().splitlines()}
    for n in ("n1", "n2"):
        assert seen[n] == f"{n} {c.node_dir(n)}/bin/nvidia-smi ecc=0,0,0,0,0,0,0,0 xid=0"
    assert seen["n3"] == f"n3 {c.node_dir('n3')}/bin/nvidia-smi ecc=0,0,4,0,0,0,0,0 xid=1"
    assert seen["n4"].startswith(f"n4 {c.node_dir('n4')}/bin/nvidia-smi ecc=Unable to determine the device handle")


def test_a_drained_node_shows_its_reason(slurm_idle):
    c = slurm_idle
    c.drain("n2", "gpu xid 79 on GPU 3")
    reasons = c.run(["sinfo", "-h", "-R", "-o", "%N|%E"], check=True).stdout.split("\n")[0]
    assert reasons == "n2|gpu xid 79 on GPU 3"
    assert c.node_states()["n2"] == "drained"
    job_id = c.sbatch("-w", "n2", "--wrap", "true")
    pending = c.wait("a reason", lambda: c.job(job_id).get("Reason", "").startswith("ReqNodeNotAvail") and c.job(job_id))
    assert pending["JobState"] == "PENDING" and "UnavailableNodes:n2" in pending["Reason"]


def test_a_lost_node_goes_down_and_its_requeue_job_runs_again(slurm_idle):
    c = slurm_idle
    # --open-mode=append: each start's output is kept (Slurm truncates the file when a requeued job starts again)
    job_id = c.sbatch("-N2", "--requeue", "--open-mode=append", "-o", "rq-%j.out", "--wrap",
                      "echo start restarts=$SLURM_RESTART_COUNT nodes=$SLURM_JOB_NODELIST; srun sleep 300")
    first = c.wait_job(job_id, ("RUNNING",))
    victim = slurm.run(c.dir, ["scontrol", "show", "hostnames", first["NodeList"]], check=True).stdout.split()[1]
    t = time.monotonic()
    assert c.kill_node(victim)
    down = c.wait(f"{victim} down", lambda: c.node_states().get(victim) == "down*", timeout=30)
    t_down = time.monotonic() - t
    requeued = c.wait("requeued", lambda: c.job(job_id).get("Restarts") == "1" and c.job(job_id), timeout=30)
    t_requeue = time.monotonic() - t
    again = c.wait_job(job_id, ("RUNNING",), timeout=40)
    t_again = time.monotonic() - t
    print(f"lost node: DOWN after {t_down:.1f} s, job requeued after {t_requeue:.1f} s, running again after "
          f"{t_again:.1f} s (on {again['NodeList']})")
    assert down and requeued["Requeue"] == "1"
    assert victim not in slurm.run(c.dir, ["scontrol", "show", "hostnames", again["NodeList"]]).stdout.split()
    reason = c.run(["sinfo", "-h", "-R", "-o", "%N|%E"], check=True).stdout
    assert f"{victim}|Not responding" in reason
    c.wait("both starts logged", lambda: (c.shared / f"rq-{job_id}.out").read_text().count("start ") == 2)
    assert "start restarts=1" in (c.shared / f"rq-{job_id}.out").read_text()
    t = time.monotonic()
    assert c.restart_node(victim) in ("idle", "mixed")
    print(f"restart_node: {victim} back in {time.monotonic() - t:.2f} s")
    assert not slurm_nodes.node_lost(c.dir, victim)


def test_the_quickest_real_timeout(slurm_idle):
    c = slurm_idle
    job_id = c.sbatch("--time=5", "-o", "to-%j.out", "--wrap", "trap 'echo got TERM; exit 143' TERM; sleep 300 & wait")
    c.wait_job(job_id, ("RUNNING",))
    t = time.monotonic()
    c.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=0"], check=True)
    job = c.wait_job(job_id, timeout=45, every=0.2)
    print(f"TIMEOUT {time.monotonic() - t:.1f} s after the limit was set to 0 (slurmctld checks every 30 s)")
    assert job["JobState"] == "TIMEOUT" and job["Reason"] == "TimeLimit"
    out = c.wait("the job's output", lambda: (c.shared / f"to-{job_id}.out").read_text().count("TIME LIMIT") and
                 (c.shared / f"to-{job_id}.out").read_text())
    assert re.search(rf"\*\*\* JOB {job_id} ON n\d CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*", out)


def test_stop_leaves_no_process_and_start_keeps_a_running_cluster(sshd, tmp_path):
    d = tmp_path / "c"
    first = slurm.start(d, nodes=1, gpus_per_node=2)
    assert first["started"] and first["nodes"] == ["n1"]
    again = slurm.start(d, nodes=1, gpus_per_node=2)
    assert not again["started"] and again["ctld_port"] == first["ctld_port"]
    login = slurm_login.start_login(d)
    assert login["port"]
    job_id = slurm.run(d, ["sbatch", "--parsable", "-o", str(d / "shared" / "x.out"), "--wrap", "srun sleep 300"],
                       check=True).stdout.strip()
    lay = slurm.layout(d)
    deadline = time.monotonic() + 20
    while not slurm_procs.node_processes(lay, "n1"):
        assert time.monotonic() < deadline, f"job {job_id} never ran"
        time.sleep(0.05)
    assert slurm.stop(d)
    assert _processes_naming(str(lay.base)) == []
    assert not slurm.stop(d)  # idempotent
    # another shape in the same folder: stopped and started anew, on the ports kept
    bigger = slurm.start(d, nodes=2, gpus_per_node=2)
    try:
        assert bigger["started"] and bigger["nodes"] == ["n1", "n2"]
        assert slurm.node_states(d) == {"n1": "idle", "n2": "idle"}
    finally:
        slurm.stop(d)
    assert _processes_naming(str(lay.base)) == []


def _processes_naming(text: str) -> list[str]:
    """Live processes whose command line or environment names `text` (this cluster's folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z" or int(pid) == os.getpid():
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, IndexError):
            continue
        if text.encode() in cmd or f"GPUOPS_SANDBOX_DIR={text}".encode() in env:
            found.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.mark.parametrize("fault", ["xid=48@1", "driver-not-loaded"])
def test_set_gpu_fault_on_one_node_only(slurm_idle, fault):
    c = slurm_idle
    c.set_gpu_fault("n1", fault)
    assert slurm_nodes.node_dir(c.dir, "n2") != slurm_nodes.node_dir(c.dir, "n1")
    states = {n: (c.node_dir(n) / "gpu.json").read_text() for n in c.nodes}
    assert fault.split("@")[0] in states["n1"] and all(fault.split("@")[0] not in states[n] for n in ("n2", "n3", "n4"))


def test_sandbox_up_slurm_writes_the_profile_and_down_stops_it(starts_hosts, gpuops, monkeypatch, tmp_path):
    import json

    import yaml
    from support.schemas import valid

    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    try:
        r = gpuops("sandbox", "up", "--slurm", "2", "--gpus", "4", "--json")
        assert r.code == 0, r.all
        doc = json.loads(r.out)
        valid("sandbox-up-slurm", doc)
        assert doc["nodes"] == ["n1", "n2"] and doc["gpus_per_node"] == 4 and doc["partition"] == "gpu"
        assert doc["profile"] == "slurm" and doc["login"]["port"]
        profile = yaml.safe_load(Path(doc["profile_path"]).read_text())
        assert {k: profile[k] for k in ("host", "port", "user", "key", "remote_dir")} == {
            "host": "127.0.0.1", "port": doc["login"]["port"], "user": doc["login"]["user"],
            "key": doc["login"]["key"], "remote_dir": doc["shared_dir"]}
        again = gpuops("sandbox", "up", "--slurm", "2", "--gpus", "4")
        assert again.code == 0 and "running: 2 nodes" in again.all, again.all
        assert slurm.node_states(Path(doc["dir"])) == {"n1": "idle", "n2": "idle"}
    finally:
        down = gpuops("sandbox", "down", "--json")
    assert down.code == 0 and json.loads(down.out)["slurm_stopped"] is True, down.all
    valid("sandbox-down", json.loads(down.out))
    assert not slurm.status(Path(doc["dir"]))["running"]


def test_with_accounting_sacct_tells_each_ending(slurm_accounting_cluster):
    c = slurm_accounting_cluster
    print(f"cluster with accounting start: {c.started_in:.2f} s")
    assert c.info["accounting"]
    failed = c.sbatch("-J", "failed", "--wrap", "exit 3")
    cancelled = c.sbatch("-J", "cancelled", "--wrap", "sleep 300")
    c.wait_job(cancelled, ("RUNNING",))
    c.run(["scancel", cancelled], check=True)
    ids = f"{failed},{cancelled}"

    def ended():
        out = c.run(["sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobID,State,ExitCode"]).stdout.splitlines()
        # slurmdbd may record a job's FAILED state before its exit code (`FAILED|0:0` for a moment): wait for both
        final = len(out) == 2 and not any("RUNNING" in x or "PENDING" in x or x.endswith("|FAILED|0:0") for x in out)
        return out if final else None
    rows = c.wait("sacct has both endings", ended)
    assert rows == [f"{failed}|FAILED|3:0", f"{cancelled}|CANCELLED by {os.getuid()}|0:0"]
