"""How long a checkpoint is complete before it is safe (issue 42): from the moment a step folder becomes complete by
evidence on the instance (the job's atomic rename: the folder appears whole) to the moment `gpuops run --recover`
holds it as safe (fetched and verified here, or judged complete on the filesystem with --fs): the `at` of the run
record's checkpoint entry. Not a pass/fail test.

Through the local Lambda emulator (its instances are sandbox hosts on this machine, so the job's clock and this
one are the same clock). The job writes checkpoint-N every INTERVAL seconds (a few KB each), renaming each whole into
place, and notes the time of each rename in a file here; the benchmark polls the run's record every 20 ms and keeps
each checkpoint entry it sees. A step never held as safe before the next one came is counted as skipped (a
preemption then resumes from an older one).

Run: uv run python benchmarks/bench_ckpt_safe.py   (BENCH_INTERVALS="1 4", BENCH_STEPS=8)
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

sys.path.insert(0, str(Path(__file__).parent))
INTERVALS = [float(x) for x in os.environ.get("BENCH_INTERVALS", "1 4").split()]
STEPS = int(os.environ.get("BENCH_STEPS", "8"))

JOB = """\
import os, sys, time
steps, interval, notes = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
for s in range(1, steps + 1):
    time.sleep(interval)
    tmp = f"checkpoints/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/model.bin", "wb").write(os.urandom(4096))
    open(f"{tmp}/COMPLETE", "w").write("")
    os.replace(tmp, f"checkpoints/checkpoint-{s}")
    with open(notes, "a") as f:
        f.write(f"{s} {time.time()}\\n")
    print(f"step {s} saved", flush=True)
time.sleep(3)  # the last one a moment to be taken while the job lives
"""


def one(tmp: Path, interval: float, fs: bool) -> dict:
    from benchenv import emulated_cloud, isolated

    env = isolated(tmp)
    g, key, emu = emulated_cloud(tmp, env)
    try:
        if fs:
            emu.capacity("gpu_1x_h100_pcie", ["us-east-1"])
        proj = tmp / "proj"
        proj.mkdir()
        (proj / "train.py").write_text(JOB)
        notes = tmp / "notes.txt"
        args = ["run", "--type", "gpu_1x_h100_pcie", "--key", str(key), "--yes", "--recover", "1", "--script",
                "train.py"] + (["--fs", "work"] if fs else ["--fetch", "checkpoints"]) + \
               ["--", str(STEPS), str(interval), str(notes)]
        p = subprocess.Popen(g + args, env=env, cwd=proj, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        safe: dict = {}
        while p.poll() is None:
            for f in (proj / "runs" / "pipelines").glob("*.json") if (proj / "runs" / "pipelines").is_dir() else []:
                try:
                    c = json.loads(f.read_text()).get("checkpoint") or {}
                except (OSError, ValueError):
                    continue
                if c.get("step") is not None and c["step"] not in safe:
                    safe[c["step"]] = c["at"]
            time.sleep(0.02)
        err = p.stderr.read()
        if p.returncode != 0:
            raise SystemExit(f"gpuops run failed ({p.returncode}):\n{err[-3000:]}")
        done = {int(a): float(b) for a, b in (ln.split() for ln in notes.read_text().splitlines())}
        delays = [safe[s] - done[s] for s in sorted(done) if s in safe]
        return {"interval": interval, "fs": fs, "steps": len(done), "taken": len(delays),
                "skipped": sorted(set(done) - set(safe)), "delays": delays}
    finally:
        emu.close()


def main() -> None:
    print(f"checkpoint complete -> safe, {STEPS} steps each; delays in seconds (median / max)")
    for interval in INTERVALS:
        for fs in (False, True):
            with tempfile.TemporaryDirectory() as d:
                r = one(Path(d), interval, fs)
            how = "--fs work (judged on the filesystem)" if fs else "--fetch checkpoints (fetched, verified)"
            ds = r["delays"]
            fig = f"{statistics.median(ds):.2f} / {max(ds):.2f}" if ds else "-"
            print(f"  a checkpoint every {interval:g} s, {how}: {fig}; {r['taken']} of {r['steps']} held as safe"
                  + (f", skipped {r['skipped']}" if r["skipped"] else ""))


if __name__ == "__main__":
    main()
