"""Figures for `gpuops --help` start-up and `gpuops verify` against the sandbox host.

Prints: CLI start-up time (median of N), verify wall time, remote executions per verify, and the same facts
gathered the runbook way (one ssh per check, as in seeds/002) for comparison. Not a pass/fail test.
Run: uv run python benchmarks/bench_verify.py
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

RUNS = int(os.environ.get("BENCH_RUNS", "10"))


def timed(cmd, env, n=RUNS, cwd=None):
    xs = []
    last = None
    for _ in range(n):
        t = time.perf_counter()
        last = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        xs.append(time.perf_counter() - t)
    return statistics.median(xs), min(xs), last


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    (tmp / "home").mkdir()
    (tmp / "proj").mkdir()
    gpuops = [str(Path(sys.executable).parent / "gpuops")]
    try:
        # An installed tool has bytecode (pip compiles at install; uv with --compile-bytecode). A checkout run with
        # PYTHONDONTWRITEBYTECODE=1 (as on this sandbox machine) would recompile typer & co. on every start instead.
        import site
        import gpuops as package

        for d in [*site.getsitepackages(), str(Path(package.__file__).parent)]:
            subprocess.run([sys.executable, "-m", "compileall", "-q", d], capture_output=True)
        print("(bytecode compiled first, as an installed gpuops has it)")
        med, best, _ = timed(gpuops + ["--help"], env)
        print(f"gpuops --help start-up: median {med * 1000:.0f} ms, best {best * 1000:.0f} ms over {RUNS} runs (goal < 300 ms)")
        med, best, _ = timed(gpuops + ["verify", "--help"], env)
        print(f"gpuops verify --help: median {med * 1000:.0f} ms, best {best * 1000:.0f} ms")
        med, best, _ = timed([sys.executable, "-c", "pass"], env)
        print(f"  (bare python start-up for reference: median {med * 1000:.0f} ms)")
        subprocess.run(gpuops + ["sandbox", "up"], env=env, check=True, capture_output=True)
        subprocess.run(gpuops + ["verify", "sandbox", "--no-save"], env=env, cwd=tmp / "proj", capture_output=True)  # trust
        med, best, last = timed(gpuops + ["verify", "sandbox", "--json", "--no-save"], env, n=5, cwd=tmp / "proj")
        doc = json.loads(last.stdout)
        print(f"gpuops verify sandbox: median {med:.2f} s, best {best:.2f} s over 5 runs; "
              f"{doc['remote_executions']} remote execution(s), {len(doc['checks'])} checks, "
              f"probe itself {doc['facts']['probe_seconds']:.2f} s on the host")
        st = json.loads((tmp / "state" / "sandbox" / "state.json").read_text())
        ssh = ["ssh", "-p", str(st["port"]), "-i", str(tmp / "state" / "sandbox" / "client_ed25519"), "-o", "BatchMode=yes",
               "-o", f"UserKnownHostsFile={tmp / 'config' / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
               f"{st['user']}@127.0.0.1"]
        runbook = ["nvidia-smi", "uname -a", "df -h", "free -h", "python3 --version",
                   "python3 -c 'import torch; print(torch.__version__)'",
                   "python3 -c 'import torch; assert torch.cuda.is_available()'",
                   "python3 -c 'import vllm; print(vllm.__version__)'"]
        t = time.perf_counter()
        for cmd in runbook:
            subprocess.run(ssh + [cmd], capture_output=True)
        manual = time.perf_counter() - t
        print(f"runbook way (seeds/002 'Verifying the Environment'): {len(runbook)} ssh round trips, {manual:.2f} s, "
              "and a person still has to read and judge the output")
    finally:
        subprocess.run(gpuops + ["sandbox", "down"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
