"""Figures for start-up with shell completion on: `gpuops --help` with typer's completion options and without them
(the same code, the flag switched off in-process), `verify --help`, and how long the shell waits for completions
(commands, profile names, run ids, fetch names; local files only). Not a pass/fail test.
Run: uv run python benchmarks/bench_startup.py
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

RUNS = int(os.environ.get("BENCH_RUNS", "15"))
ON = "from gpuops.cli.main import run; run()"
OFF = "import gpuops.cli.app as a; a.app._add_completion = False; from gpuops.cli.main import run; run()"


def timed(cmd, env, cwd):
    xs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        xs.append(time.perf_counter() - t)
        assert p.returncode == 0, p.stderr[-500:]
    return statistics.median(xs) * 1000, min(xs) * 1000, p.stdout


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    proj = tmp / "proj"
    (proj / "profiles").mkdir(parents=True)
    for i in range(20):
        (proj / "profiles" / f"host{i:02d}.yaml").write_text("host: 203.0.113.7\nfetch: {checkpoints: c, logs: l}\n")
        run = proj / "runs" / f"20261123-1000{i:02d}-train-ab{i:02d}"
        run.mkdir(parents=True)
        (run / "meta.json").write_text(json.dumps({"run_id": run.name, "profile": "host00", "started_ts": i}))
    env = {**os.environ, "HOME": str(tmp), "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    import site
    import gpuops as package

    for d in [*site.getsitepackages(), str(Path(package.__file__).parent)]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", d], capture_output=True)
    py = [sys.executable, "-c"]
    print(f"(bytecode compiled first; median and best of {RUNS} runs)")
    for label, code, args in (("gpuops --help, completion options on ", ON, ["--help"]),
                              ("gpuops --help, completion options off", OFF, ["--help"]),
                              ("gpuops verify --help (completion on)  ", ON, ["verify", "--help"])):
        med, best, _ = timed(py + [code] + args, env, proj)
        print(f"{label}: median {med:.0f} ms, best {best:.0f} ms (goal < 300 ms)")
    for words in ("gpuops ver", "gpuops verify ", "gpuops logs ", "gpuops fetch -p host00 "):
        cenv = {**env, "_GPUOPS_COMPLETE": "complete_bash", "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        med, best, out = timed(py + [ON], cenv, proj)
        print(f"completion of {words!r:28}: median {med:.0f} ms, best {best:.0f} ms, {len(out.split())} values")


if __name__ == "__main__":
    main()
