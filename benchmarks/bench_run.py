"""Figures for `gpuops run` through the local Lambda emulator (instances are sandbox hosts on 127.0.0.N:22): the
billed seconds gpuops itself adds, boot aside, from the instance being active to the job's start (setup, sync, launch)
and from the job's end to the termination request (log and checkpoint fetch, verified). Goal: under 60 s together,
termination requested within 10 s of the fetch being verified. Not a pass/fail test.
Run: uv run python benchmarks/bench_run.py   (BENCH_RUNS=3; BENCH_NODES=2 for a fleet run, the script on every node)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
NODES = int(os.environ.get("BENCH_NODES", "1"))
TRAIN = """\
import os, time
for s in range(1, 4):
    os.makedirs(f"checkpoints/step_{s}", exist_ok=True)
    open(f"checkpoints/step_{s}/model.bin", "wb").write(os.urandom(8 << 20))
    print("step", s, flush=True)
    time.sleep(1)
"""


def emulated(prefix: str):
    """A temporary folder, an SSH key, the Lambda emulator (boot 2 s) and the environment of a `gpuops` process using
    it with its own HOME, state and config: (tmp, key, emulator, env). bench_recovery.py uses it too."""
    from gpuops.cloud.emulator.server import Emulator

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    emu = Emulator(tmp / "emu", api_key="bench_key_" + "x" * 20, boot_seconds=2.0, launch_window=0).start()
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1", **emu.env, "GPUOPS_CLOUD_POLL_S": "0.5"}
    (tmp / "home").mkdir()
    return tmp, key, emu, env


def main() -> None:
    tmp, key, emu, env = emulated("gpuops-bench-run-")
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    g = [str(Path(sys.executable).parent / "gpuops")]
    rows = []
    try:
        for i in range(RUNS):
            p = subprocess.run(g + ["run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--fetch",
                                    "checkpoints", "--key", str(key), "--yes", "--json", "--name", f"b{i}"]
                               + (["--nodes", str(NODES), "--launcher", "none"] if NODES > 1 else []),
                               env=env, cwd=proj, capture_output=True, text=True)
            doc = json.loads(p.stdout)
            st = {s["stage"]: s for s in doc["stages"]}
            ov = doc["overhead"]
            rows.append((ov["before_job_s"], ov["after_job_s"], st["fetch"]["duration_s"], st["up"]["duration_s"],
                         st["watch"]["duration_s"], doc["outcome"]))
            shutil.rmtree(proj / "checkpoints", ignore_errors=True)
        for r in rows:
            print(f"{NODES} node(s), outcome {r[5]}: up {r[3]:.1f} s (emulated boot 2 s) | active -> job start {r[0]:.1f} s | training "
                  f"{r[4]:.1f} s | job end -> terminate requested {r[1]:.1f} s (of which fetch {r[2]:.1f} s)")
        before = statistics.median(r[0] for r in rows)
        after = statistics.median(r[1] for r in rows)
        print(f"median billed seconds gpuops adds, boot aside: {before:.1f} s before the job + {after:.1f} s after "
              f"= {before + after:.1f} s (goal < 60 s); termination requested {max(0.0, after - statistics.median(r[2] for r in rows)):.1f} s "
              "after the fetch was verified (goal < 10 s)")
    finally:
        emu.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
