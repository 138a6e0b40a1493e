"""Figures for checkpoint evidence (issue 35): what the evidence costs the listing's one remote execution. Not a
pass/fail test.

The listing script (transfer/fetch.py's REMOTE_SCRIPT, the same text an instance runs) over a checkpoint folder of
10 step folders x 50 torch.save zips, run on this machine: the listing alone, then the listing with its evidence
(the job's processes found in /proc by GPUOPS_RUN_ID, read before and after the walk; marker files' contents; every
zip's end record and every safetensors header checked). Medians of 5.
Run: uv run python benchmarks/bench_ckpt_evidence.py   (BENCH_STEPS=10 BENCH_FILES=50 to change the folder)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from gpuops.pipeline import checkpoints as ck
from gpuops.transfer.fetch import REMOTE_SCRIPT


def _run(spec: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-", json.dumps(spec)], input=REMOTE_SCRIPT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return time.perf_counter() - t


def main() -> None:
    steps, files = int(os.environ.get("BENCH_STEPS", "10")), int(os.environ.get("BENCH_FILES", "50"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        for s in range(1, steps + 1):
            d = root / f"checkpoint-{s}"
            d.mkdir(parents=True)
            for i in range(files):
                with zipfile.ZipFile(d / f"shard-{i}.pt", "w") as z:
                    z.writestr("archive/data.pkl", os.urandom(20000))
        plain = {"list": {"checkpoints": str(root)}}
        ev = {**plain, "evidence": {"names": ["checkpoints"], **ck.evidence_spec("bench-run", ck.book())}}
        procs = sum(1 for p in os.listdir("/proc") if p.isdigit())
        _run(plain), _run(ev)  # warm: the page cache and the interpreter
        got = {"listing alone": [], "listing + evidence": []}
        for _ in range(5):  # interleaved: the machine's load weighs on both alike
            got["listing alone"].append(_run(plain))
            got["listing + evidence"].append(_run(ev))
        for label, ts in got.items():
            ts.sort()
            print(f"{label:<20} {ts[2] * 1000:7.0f} ms  ({steps * files} files, {procs} processes in /proc)")


if __name__ == "__main__":
    main()
