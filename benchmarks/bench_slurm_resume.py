"""What a requeued Slurm attempt pays to choose its checkpoint: the run folder's resume_judge.py (slurm/resume.py,
gpuops' own judge shipped beside the batch script) run as the batch script runs it, on a checkpoint folder of
HF-Trainer-shaped step folders (trainer_state.json, a safetensors model whose header is checked against its size, an
optimizer file, the RNG state), the newest one cut short.

    uv run python benchmarks/bench_slurm_resume.py [--steps 20] [--mb 64] [--rounds 5]

Prints the medians (and max) of the judge's wall time, and what it chose. Not a pass/fail test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def safetensors(path: Path, size: int) -> None:
    """A file in the safetensors format: an 8-byte header length, a JSON header, then `size` bytes of data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}}).encode()
    with open(path, "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + size)  # sparse: the judge reads headers and sizes, not the data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mb", type=int, default=64, help="size of each step's model file")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from gpuops.pipeline import checkpoints as ck
    from gpuops.slurm import resume

    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-resume-"))
    run, root = tmp / "run", tmp / "checkpoints"
    run.mkdir()
    start = time.time() - 60
    for n in range(1, a.steps + 1):
        d = root / f"checkpoint-{n}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": n}))
        safetensors(d / "model.safetensors", a.mb << 20 if n < a.steps else (a.mb << 20) // 2)
        if n == a.steps:  # cut short: the header says more than the file holds
            with open(d / "model.safetensors", "r+b") as fh:
                fh.truncate((a.mb << 20) // 3)
        (d / "optimizer.pt").write_bytes(b"PK\x03\x04" + b"\0" * 1000 + b"PK\x05\x06" + b"\0" * 18)
        (d / "rng_state.pth").write_bytes(b"r" * 100)
    (run / "attempts").write_text(f"{int(start)} 0 1 n1\n{int(time.time())} 1 1 n2\n")
    (run / resume.JUDGE_NAME).write_text(resume.judge_script(ck.book()))
    times = []
    for i in range(a.rounds):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, str(run / resume.JUDGE_NAME), str(run), str(root), "1", "1"],
                           capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t)
    doc = resume.parse_resumes((run / resume.RESUMES_FILE).read_text())[-1]
    files = sum(1 for _ in root.rglob("*") if _.is_file())
    print(f"cores: {os.cpu_count()} (load average {os.getloadavg()[0]:.1f})  python {sys.version.split()[0]}  "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"checkpoint folder: {a.steps} step folders, {files} files, model {a.mb} MB each (the newest cut short)")
    print(f"the judge at a requeued attempt's start: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms ({a.rounds} rounds; a python start included)")
    print(f"chose {doc['dir']} ({doc.get('evidence_words')}); passed over: "
          + "; ".join(f"{d}: {why}" for d, why in doc["passed_over"][:2]))
    print(p.stdout.strip())
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
