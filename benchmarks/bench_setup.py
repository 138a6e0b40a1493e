"""Figures for `gpuops setup` on the project shapes of the runbooks (issue #20), through the sandbox host, and for how
long `gpuops run` bills before a refused launch ends. Not a pass/fail test.

Per project shape: the first setup (environment made, dependencies installed from this machine's local index) and
the no-op setup that follows (one remote execution). The shapes: requirements.txt with a `-r` include, a tool-only
pyproject next to requirements, a pyproject without a lock (editable), a uv project with its lock and all extras.
Then, through the local Lambda emulator with the lambda-stack image: `run` whose job imports a module nothing
provides (the launch gate refuses it on the host) and `run --from` a profile whose python is no interpreter (refused
before anything is launched): the seconds billed in each (goal: 0 for what is knowable locally, < 60 s on the host).
Run: uv run python benchmarks/bench_setup.py   (BENCH_RUNS=2)
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

RUNS = int(os.environ.get("BENCH_RUNS", "2"))
INDEX = "file:///opt/pypi/simple"
SHAPES = {
    "requirements + -r include": {"requirements.txt": "six==1.17.0\n-r reqs/base.txt\n", "reqs/base.txt": "idna\n"},
    "tool-only pyproject + requirements": {"pyproject.toml": "[tool.ruff]\nline-length = 100\n",
                                           "requirements.txt": "six==1.17.0\n"},
    "pyproject, no lock (editable)": {
        "pyproject.toml": '[project]\nname = "benchproj"\nversion = "0.1.0"\ndependencies = ["six"]\n\n'
                          '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
                          '[tool.setuptools.packages.find]\nwhere = ["src"]\n',
        "src/benchproj/__init__.py": "LR = 0.1\n"},
    "uv project + lock, extras all": {
        "pyproject.toml": '[project]\nname = "benchuv"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
                          'dependencies = ["six"]\n\n[project.optional-dependencies]\nnet = ["idna"]\n'},
}


def sh(g, *args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(g + list(args), env=env, cwd=cwd, capture_output=True, text=True)


def bench_shapes(tmp: Path, g: list[str], env: dict) -> None:
    from gpuops.sandbox import host

    os.environ.update({k: env[k] for k in ("GPUOPS_STATE_DIR", "GPUOPS_CONFIG_DIR")})
    host.up()
    sbhome = host.sandbox_dir() / "home"
    print("setup per project shape (sandbox host, packages from this machine's local index):")
    for name, files in SHAPES.items():
        firsts, noops = [], []
        for i in range(RUNS):
            proj = tmp / f"proj-{abs(hash(name)) % 10000}-{i}"
            proj.mkdir()
            for rel, text in files.items():
                (proj / rel).parent.mkdir(parents=True, exist_ok=True)
                (proj / rel).write_text(text)
            if "uv" in name:
                subprocess.run(["uv", "lock", "-q"], cwd=proj, check=True,
                               env={**env, "UV_INDEX_URL": INDEX, "UV_NO_CONFIG": "1"})
            venv = f"bench-env-{proj.name}"
            shutil.rmtree(sbhome / venv, ignore_errors=True)
            prof = host.profile_path().read_text().replace("python: python3", f"python: ~/{venv}/bin/python")
            (proj / "profiles").mkdir()
            (proj / "profiles" / "b.yaml").write_text(prof + f"setup:\n  index_url: {INDEX}\n  extras: all\n")
            assert sh(g, "sync", "-p", "b", env=env, cwd=proj).returncode == 0
            t0 = time.perf_counter()
            p = sh(g, "setup", "b", "--no-verify", env=env, cwd=proj)
            firsts.append(time.perf_counter() - t0)
            if p.returncode != 0:
                print(f"  {name}: setup failed: {p.stderr[-400:]}")
                break
            t0 = time.perf_counter()
            p = sh(g, "setup", "b", "--json", "--no-verify", env=env, cwd=proj)
            noops.append(time.perf_counter() - t0)
            doc = json.loads(p.stdout)
            assert doc["plan"]["nothing_to_do"] and doc["executions"] == 1, doc
            shutil.rmtree(sbhome / venv, ignore_errors=True)
        if firsts and noops:
            print(f"  {name:<36} first setup {statistics.median(firsts):5.2f} s   no-op {statistics.median(noops):5.2f} s"
                  f" (1 remote execution)   [{len(firsts)} run(s)]")
    host.down()


def bench_refusals(tmp: Path, g: list[str], env: dict) -> None:
    from gpuops.cloud.emulator.server import Emulator

    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    emu = Emulator(tmp / "emu", api_key="bench_key_" + "x" * 20, boot_seconds=2.0, launch_window=0).start()
    emu.image("lambda-stack")
    cenv = {**env, **emu.env, "GPUOPS_CLOUD_POLL_S": "0.5", "GPUOPS_CLOUD_LAUNCH_INTERVAL_S": "0"}
    proj = tmp / "refused"
    proj.mkdir()
    (proj / "train.py").write_text("import torch\nimport nosuchpkg_for_bench\n")
    (proj / "profiles").mkdir()
    (proj / "profiles" / "conda.yaml").write_text("host: 203.0.113.7\npython: conda run -n x python\n")
    print("run, billed before a refused launch ends (emulated boot 2 s):")
    try:
        t0 = time.perf_counter()
        p = sh(g, "run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--key", str(key), "--yes",
               "--from", "conda", env=cenv, cwd=proj)
        print(f"  --from a profile whose python is no interpreter: exit {p.returncode}, "
              f"{emu.launch_requests()} launch request(s), {time.perf_counter() - t0:.1f} s, $0 billed")
        p = sh(g, "run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--key", str(key), "--yes", "--json",
               env=cenv, cwd=proj)
        doc = json.loads(p.stdout)
        st = {s["stage"]: s for s in doc["stages"]}
        billed = sum(s["duration_s"] for s in doc["stages"])
        print(f"  a job importing a module nothing provides (found on the host): outcome {doc['outcome']}, "
              f"billed {billed:.1f} s (up {st['up']['duration_s']:.1f} s, launch refused after "
              f"{st['train']['duration_s']:.1f} s in the gate), ${doc['total_cost']:.4f} (goal < 60 s)")
    finally:
        emu.close()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-setup-"))
    env = {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
           "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}
    (tmp / "home").mkdir()
    g = [str(Path(sys.executable).parent / "gpuops")]
    try:
        bench_shapes(tmp, g, env)
        bench_refusals(tmp, g, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
