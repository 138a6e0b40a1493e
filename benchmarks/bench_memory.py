"""Peak memory of `gpuops logs`, `logs -f` and `watch --json` on 100 MB and 200 MB logs (goal: under 100 MB, flat as
the log grows). Each command runs as its own process against the sandbox; its peak RSS comes from the kernel
(wait4's ru_maxrss). `logs` and `logs -f` print the whole log (-n larger than its line count), `watch --json`
replays it all (--lines). Not a pass/fail test.
Run: uv run python benchmarks/bench_memory.py
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """\
import sys
mb = int(sys.argv[1])
line = ("x" * 99 + "\\n").encode()
chunk = line * 10000  # ~1 MB
out = sys.stdout.buffer
for i in range(mb):
    out.write(b"step %d loss 0.5 " % i + chunk)
out.flush()
"""


def peak(cmd, env, cwd) -> tuple[float, float, int]:
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    n = 0
    while True:
        b = p.stdout.read(1 << 20)
        if not b:
            break
        n += len(b)
    _, status, ru = os.wait4(p.pid, 0)
    return ru.ru_maxrss / 1024, time.perf_counter() - t, n  # KiB -> MiB


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-mem-"))
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    (tmp / "home").mkdir()
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "big.py").write_text(JOB)
    g = [str(Path(sys.executable).parent / "gpuops")]
    try:
        subprocess.run(g + ["sandbox", "up"], env=env, check=True, capture_output=True)
        base, _, _ = peak([sys.executable, "-c", "import gpuops.cli.main"], env, proj)
        print(f"(python + gpuops' imports alone: {base:.0f} MB)")
        for mb in (100, 200):
            r = subprocess.run(g + ["train", "-p", "sandbox", "--script", "big.py", "--no-snapshot", "--json", "--",
                                    str(mb)], env=env, cwd=proj, capture_output=True, text=True)
            rid = json.loads(r.stdout)["run_id"]
            time.sleep(1)
            subprocess.run(g + ["logs", "-f", rid, "-p", "sandbox", "-n", "0"], env=env, cwd=proj, capture_output=True)
            lines = str(mb * 10000 + 10)
            rows = [("logs", g + ["logs", rid, "-p", "sandbox", "-n", lines]),
                    ("logs -f", g + ["logs", rid, "-f", "-p", "sandbox", "-n", lines]),
                    ("watch --json", g + ["watch", rid, "-p", "sandbox", "--json", "--lines", lines])]
            for label, cmd in rows:
                rss, secs, n = peak(cmd, env, proj)
                print(f"{mb} MB log: {label:<13} peak RSS {rss:6.0f} MB (goal < 100 MB), {n / 1e6:7.1f} MB out "
                      f"in {secs:.1f} s")
    finally:
        subprocess.run(g + ["sandbox", "down"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
