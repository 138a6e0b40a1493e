"""Figures for `gpuops verify` on a Slurm cluster: 4 nodes through one srun step against 1 node, on the local cluster.

    python benchmarks/bench_slurm_verify.py [NODES]     (default 4; BENCH_RUNS=5 runs per size)

A local Slurm cluster (gpuops.sandbox.slurm: Debian's slurmctld, slurmd and munge; NODES nodes of 8 emulated GPUs; its
login node a sandbox sshd) is started in a temporary folder, and two profiles of its login node are written: `one`
(slurm.nodes: 1) and `all` (slurm.nodes: NODES). Each run is the command as a person runs it (`gpuops verify PROFILE
--no-save --json`, a new process, the CLI's start in it); the medians, their ratio, and from the last --json document
the remote executions and the probe's own seconds per node. Beside them: one plain `srun --nodes=N hostname` over SSH
on the login node, the floor Slurm and SSH set. Not a pass/fail test. Every node is this machine: the N probes share
its cores, so the ratio is an upper bound of a real cluster's (where each node has its own).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchenv import isolated  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "5"))


def profile_text(info: dict, nodes: int) -> str:
    login = info["login"]
    return (f"host: {login['host']}\nport: {login['port']}\nuser: {login['user']}\nkey: {login['key']}\n"
            f"remote_dir: {info['shared_dir']}\nhost_key_policy: accept-new\n"
            f"slurm:\n  partition: {info['partition']}\n  nodes: {nodes}\n  gpus_per_node: {info['gpus_per_node']}\n")


def timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, dict]:
    t = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return took, json.loads(proc.stdout)


def plain_srun(info: dict, nodes: int) -> float:
    login = info["login"]
    argv = ["ssh", "-i", login["key"], "-p", str(login["port"]), "-o", "BatchMode=yes", "-o",
            "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            f"{login['user']}@{login['host']}", f"srun --nodes={nodes} --ntasks-per-node=1 hostname"]
    t = time.monotonic()
    subprocess.run(argv, capture_output=True, check=True, timeout=60)
    return time.monotonic() - t


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    from gpuops.sandbox import slurm, slurm_login

    with tempfile.TemporaryDirectory(prefix="gbs-") as tmp:
        tmp = Path(tmp)
        env = isolated(tmp)
        d = tmp / "c"
        t = time.monotonic()
        slurm.start(d, nodes=nodes)
        slurm_login.start_login(d)
        info = slurm.cluster_info(d)
        print(f"local Slurm {info['slurm_version']}: {nodes} nodes started in {time.monotonic() - t:.2f} s; "
              f"{os.cpu_count()} cores on this machine")
        proj = tmp / "proj"
        (proj / "profiles").mkdir(parents=True)
        (proj / "profiles" / "one.yaml").write_text(profile_text(info, 1))
        (proj / "profiles" / "all.yaml").write_text(profile_text(info, nodes))
        gpuops = [str(Path(sys.executable).parent / "gpuops")]
        try:
            timed(gpuops + ["verify", "one", "--no-save", "--json"], env, proj)  # the host key recorded, caches warm
            rows = {}
            for name in ("one", "all"):
                times, doc = [], {}
                for _ in range(RUNS):
                    took, doc = timed(gpuops + ["verify", name, "--no-save", "--json"], env, proj)
                    times.append(took)
                probe = [h["report"]["duration_s"] for h in doc["hosts"]]
                rows[name] = (statistics.median(times), min(times), max(times), doc, probe)
            srun = {n: statistics.median(plain_srun(info, n) for _ in range(RUNS)) for n in (1, nodes)}
        finally:
            slurm.stop(d)
    one, allnodes = rows["one"], rows["all"]
    for label, (med, lo, hi, doc, probe) in (("1 node", one), (f"{nodes} nodes", allnodes)):
        print(f"verify, {label:>8}: median {med:.2f} s (min {lo:.2f}, max {hi:.2f}; {RUNS} runs), "
              f"{doc['remote_executions']} remote executions, {doc['srun_steps']} srun step, verdict {doc['verdict']}; "
              f"probe per node {', '.join(f'{p:.2f}' for p in probe)} s")
    print(f"ratio {nodes} nodes / 1 node: {allnodes[0] / one[0]:.2f}x")
    print(f"plain `ssh login srun --nodes=N hostname`: 1 node {srun[1]:.2f} s, {nodes} nodes {srun[nodes]:.2f} s")


if __name__ == "__main__":
    main()
