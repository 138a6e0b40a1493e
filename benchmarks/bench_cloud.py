"""Figures for the Lambda Cloud commands, against the local Lambda API emulator (`gpuops sandbox up --cloud`).

Prints: API calls per `gpuops up` (launch + polls, by endpoint) and per `gpuops ls`, the time from `active` to
verified, and `gpuops --help` start-up with the cloud commands registered. Not a pass/fail test.
Run: uv run python benchmarks/bench_cloud.py
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", "10"))


def help_startup(env: dict) -> None:
    import site

    import gpuops as package

    for d in [*site.getsitepackages(), str(Path(package.__file__).parent)]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", d], capture_output=True)
    gpuops = str(Path(sys.executable).parent / "gpuops")
    xs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        p = subprocess.run([gpuops, "--help"], env=env, capture_output=True, text=True)
        xs.append(time.perf_counter() - t)
    assert " up " in p.stdout and " cloud " in p.stdout, "cloud commands not registered"
    print(f"gpuops --help (cloud commands registered): median {statistics.median(xs) * 1000:.0f} ms, "
          f"best {min(xs) * 1000:.0f} ms over {RUNS} runs (goal < 300 ms)")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-cloud-"))
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    (tmp / "home").mkdir()
    help_startup(env)
    up_and_ls(tmp, env)


def up_and_ls(tmp: Path, env: dict) -> None:
    raise SystemExit("the API figures need the emulator (gpuops sandbox up --cloud)")


if __name__ == "__main__":
    main()
