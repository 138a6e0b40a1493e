"""Figures for fleets: `gpuops verify` of a fleet profile with 1, 4 and 16 hosts (one parallel command) against the
same number of one-host verifies run one after another. Goal: 16 hosts in at most 1.5x the time of one.

The hosts are sandbox hosts on loopback. Each host of the fleet is its own SSH connection, authentication and probe
execution (its own remote folder), served by the sandbox's real sshd. Not a pass/fail test.
Run: uv run python benchmarks/bench_fleet.py   (BENCH_RUNS=3 by default)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

RUNS = int(os.environ.get("BENCH_RUNS", "3"))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-fleet-"))
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    (tmp / "home").mkdir()
    proj = tmp / "proj"
    (proj / "profiles").mkdir(parents=True)
    gpuops = [str(Path(sys.executable).parent / "gpuops")]
    try:
        subprocess.run(gpuops + ["sandbox", "up"], env=env, check=True, capture_output=True)
        base = yaml.safe_load((tmp / "config" / "profiles" / "sandbox.yaml").read_text())
        shared = {k: base[k] for k in ("port", "user", "key", "python", "host_key_policy", "expect")}
        for n in (1, 4, 16):
            hosts = [{"host": "127.0.0.1", "remote_dir": f"~/bench-n{i}"} for i in range(n)]
            (proj / "profiles" / f"fleet{n}.yaml").write_text(yaml.safe_dump({**shared, "hosts": hosts}))
        subprocess.run(gpuops + ["verify", "fleet1", "--no-save"], env=env, cwd=proj, capture_output=True)  # trust
        one = []
        for _ in range(RUNS):
            t = time.perf_counter()
            subprocess.run(gpuops + ["verify", "fleet1", "--no-save", "--json"], env=env, cwd=proj, capture_output=True)
            one.append(time.perf_counter() - t)
        t1 = statistics.median(one)
        print(f"one host: verify median {t1:.2f} s over {RUNS} runs")
        for n in (4, 16):
            par = []
            for _ in range(RUNS):
                t = time.perf_counter()
                p = subprocess.run(gpuops + ["verify", f"fleet{n}", "--no-save", "--json"], env=env, cwd=proj,
                                   capture_output=True, text=True)
                par.append(time.perf_counter() - t)
            doc = json.loads(p.stdout)
            ok = sum(1 for h in doc["hosts"] if h["report"])
            tp = statistics.median(par)
            seq = t1 * n
            probe_cpu = sum(h["report"]["facts"]["probe_seconds"] or 0 for h in doc["hosts"] if h["report"])
            floor = probe_cpu / (os.cpu_count() or 1)
            print(f"{n:2d} hosts: one fleet verify median {tp:.2f} s ({ok}/{n} hosts answered, fleet checks "
                  f"{doc['fleet']['verdict']}); {n} one-host verifies one after another ~{seq:.2f} s; "
                  f"ratio to one host {tp / t1:.2f}x (goal <= 1.5x), speed-up over sequential {seq / tp:.1f}x")
            print(f"          the {n} probes' own time adds up to {probe_cpu:.2f} s, shared by this machine's "
                  f"{os.cpu_count()} cores (floor ~{floor:.2f} s); real hosts run their probes on their own CPUs")
    finally:
        subprocess.run(gpuops + ["sandbox", "down"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
