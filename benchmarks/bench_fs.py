"""Figures for Lambda persistent filesystems (issue #27): setup's caches on the filesystem. Not a pass/fail test.

Through the local Lambda emulator (its instances are sandbox hosts; a filesystem is a folder every instance attaching
it sees at its mount point): three `gpuops run`s of one project whose requirements come from this machine's local
index, each on a fresh instance, and the seconds of each run's setup stage (environment made, dependencies installed):
  1. --fs cache, the filesystem empty: the first instance (uv's and pip's caches filled on the filesystem);
  2. --fs cache again: a second instance, as a replacement would be, with the caches already on the filesystem;
  3. no --fs: an instance whose caches start empty on its own disk (the reference).
Also `run --data DIR` twice: the bytes sent the first time and the second (only what changed).
Run: uv run python benchmarks/bench_fs.py   (BENCH_REQS="numpy pandas scipy" to change the requirements)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

INDEX = "file:///opt/pypi/simple"
REQS = os.environ.get("BENCH_REQS", "numpy pandas scipy").split()
TYPE = "gpu_1x_h100_pcie"


def sh(g, *args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(g + list(args), env=env, cwd=cwd, capture_output=True, text=True)


def main() -> None:
    from benchenv import emulated_cloud, isolated

    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-fs-"))
    env = isolated(tmp)
    g, key, emu = emulated_cloud(tmp, env)
    proj = tmp / "proj"
    (proj / "profiles").mkdir(parents=True)
    (proj / "requirements.txt").write_text("\n".join(REQS) + "\n")
    (proj / "train.py").write_text("import os\nprint('data', sorted(os.listdir(os.environ['GPUOPS_DATA'])))\n")
    (proj / "profiles" / "tmpl.yaml").write_text(f"host: 203.0.113.9\nsetup:\n  index_url: {INDEX}\n")
    data = tmp / "corpus"
    data.mkdir()
    for i in range(20):
        (data / f"shard-{i}.bin").write_bytes(os.urandom(256 * 1024))
    try:
        assert sh(g, "fs", "create", "cache", "--region", "us-east-1", env=env, cwd=proj).returncode == 0
        emu.capacity(TYPE, ["us-east-1"])
        rows = []
        for label, extra in (("first instance, --fs (caches filled on the filesystem)", ["--fs", "cache"]),
                             ("second instance, --fs (caches already on the filesystem)", ["--fs", "cache"]),
                             ("an instance without --fs (caches on its own disk, empty)", [])):
            t0 = time.perf_counter()
            p = sh(g, "run", "--type", TYPE, "--script", "train.py", "--key", str(key), "--yes", "--json",
                   "--from", "tmpl", "--data", str(data), *extra, env=env, cwd=proj)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                print(f"  {label}: run failed (exit {p.returncode}): {p.stderr[-600:]}")
                return
            doc = json.loads(p.stdout)
            st = {s["stage"]: s for s in doc["stages"]}
            sent = re.findall(r"data \S+ → \S+: (\d+) files changed, ([^\n]+) sent", p.stderr)
            rows.append((label, st["setup"]["duration_s"], wall, sent[-1] if sent else None))
        print(f"setup with {' '.join(REQS)} from {INDEX} (emulated instances, sandbox hosts):")
        for label, setup_s, wall, sent in rows:
            data_note = f"; --data: {sent[0]} files, {sent[1]} sent" if sent else ""
            print(f"  {label:<58} setup {setup_s:6.2f} s   whole run {wall:6.1f} s{data_note}")
        first, second = rows[0][1], rows[1][1]
        print(f"  a replacement's setup with the caches on the filesystem: {second:.2f} s against {first:.2f} s "
              f"({first / second if second else float('inf'):.1f}x)")
        cache = emu.fs_dir("cache") / "gpuops" / "cache"
        size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.is_dir() else 0
        print(f"  caches on the filesystem: {size / 1e6:.1f} MB ({', '.join(sorted(p.name for p in cache.iterdir())) if cache.is_dir() else 'none'})")
    finally:
        emu.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
