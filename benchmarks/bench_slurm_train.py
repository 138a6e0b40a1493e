"""`gpuops train` on a Slurm cluster against plain `sbatch` over ssh, on the idle local cluster (gpuops.sandbox.slurm:
Debian's slurmctld and slurmd, 4 nodes, its login node a real sshd on 127.0.0.1).

Prints, for N rounds each (median, min, max):
  1. gpuops: from starting `gpuops train --no-sync` (a fresh CLI process: the local plan, one connection, the run folder
     written and sbatch in one execution) to the job's first log line on the shared folder;
  2. plain: `ssh login 'cd run && sbatch --parsable job.sbatch'` of the very batch script gpuops wrote, to its first
     log line (what a user typing sbatch gets: no plan, no run folder, no record);
  3. gpuops' own part: the time `gpuops train` takes to return (the job is then Slurm's).
The job prints one line at once and exits (launcher none, 1 node). Everything lives in a temporary folder: its own
cluster, config and HOME.

Usage: uv run python benchmarks/bench_slurm_train.py [ROUNDS]
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

JOB = "print('first line', flush=True)\n"


def first_line(path_of, timeout: float = 60.0) -> float:
    """Poll (every 10 ms) until the log path_of() names has a line; the moment it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = path_of()
        if p is not None and p.is_file() and b"\n" in p.read_bytes():
            return time.monotonic()
        time.sleep(0.01)
    raise RuntimeError(f"no log line within {timeout} s")


def wait_idle(cluster) -> None:
    cluster.wait("no job left", lambda: not cluster.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 60)


def main(rounds: int = 5) -> None:
    from benchenv import isolated
    from gpuops.sandbox import slurm
    from support.slurm import start

    with tempfile.TemporaryDirectory(prefix="gbst-") as tmp:
        tmp = Path(tmp)
        env = isolated(tmp)
        cluster = start(tmp / "c", 4)
        try:
            project = tmp / "proj"
            project.mkdir()
            (project / "hello.py").write_text(JOB)
            login = cluster.info["login"]
            remote_dir = cluster.shared / "proj"
            (Path(env["GPUOPS_CONFIG_DIR"]) / "profiles").mkdir(parents=True)
            (Path(env["GPUOPS_CONFIG_DIR"]) / "profiles" / "clu.yaml").write_text(
                f"host: {login['host']}\nport: {login['port']}\nuser: {login['user']}\nkey: {login['key']}\n"
                f"remote_dir: {remote_dir}\nhost_key_policy: accept-new\n"
                "slurm:\n  nodes: 1\n  gpus_per_node: 8\n  launcher: none\n")
            gp = [sys.executable, "-m", "gpuops"]
            r = subprocess.run([*gp, "train", "-p", "clu", "--script", "hello.py"], cwd=project, env=env,
                               capture_output=True, text=True)  # the first: syncs, trusts the host key
            assert r.returncode == 0, r.stderr
            wait_idle(cluster)
            ours, returned, plain = [], [], []
            for _ in range(rounds):
                t0 = time.monotonic()
                r = subprocess.run([*gp, "train", "-p", "clu", "--script", "hello.py", "--no-sync"], cwd=project,
                                   env=env, capture_output=True, text=True)
                t_ret = time.monotonic()
                assert r.returncode == 0, r.stderr
                rid, job_id = re.search(r"submitted (\S+) to Slurm on clu: job (\d+)", r.stderr).groups()
                run_dir = remote_dir / ".gpuops" / "runs" / rid
                t1 = first_line(lambda: run_dir / f"slurm-{job_id}.out")
                ours.append(t1 - t0)
                returned.append(t_ret - t0)
                wait_idle(cluster)
                # the same script by hand: its own folder (a copy), sbatch over ssh, its log
                hand = remote_dir / "by-hand" / rid
                hand.mkdir(parents=True)
                text = (run_dir / "job.sbatch").read_text().replace(str(run_dir), str(hand))
                (hand / "job.sbatch").write_text(text)
                t0 = time.monotonic()
                sub = cluster.ssh(f"cd {hand} && sbatch --parsable job.sbatch")
                assert sub.returncode == 0, sub.stderr
                jid = sub.stdout.strip().split(";")[0]
                t1 = first_line(lambda: hand / f"slurm-{jid}.out")
                plain.append(t1 - t0)
                wait_idle(cluster)
        finally:
            slurm.stop(cluster.dir)

    def fig(xs):
        return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"

    print(f"Slurm {cluster.info.get('slurm_version')}, idle local cluster of 4 nodes, {rounds} rounds each")
    print(f"gpuops train -> first log line:      {fig(ours)}")
    print(f"  of which gpuops train returning:   {fig(returned)}")
    print(f"plain sbatch over ssh -> first line: {fig(plain)}")
    print(f"ratio (medians):                     {statistics.median(ours) / statistics.median(plain):.2f}x")
    print(json.dumps({"gpuops_s": ours, "gpuops_return_s": returned, "plain_sbatch_s": plain}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
