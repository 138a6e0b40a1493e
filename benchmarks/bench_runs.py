"""Run lifecycle figures against the local sandbox host (real sshd on 127.0.0.1, emulated GPU).

Prints:
  1. time from `gpuops train --no-sync` (a fresh CLI process) to the job running (its first line executed),
     without and with the launch snapshot;
  2. bytes per second `gpuops watch` receives while the job is idle (measured by a TCP proxy in front of sshd);
  3. time from the job's exit to `gpuops watch` reporting the final state.

Everything lives in temporary directories: its own sandbox, config, state and HOME.
Usage: uv run python benchmarks/bench_runs.py
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

JOB = """\
import os, sys, time
open("started-" + os.environ["GPUOPS_RUN_ID"], "w").write(repr(time.time()))
time.sleep(float(os.environ.get("SLEEP", "1")))
open("ended-" + os.environ["GPUOPS_RUN_ID"], "w").write(repr(time.time()))
"""


def gpuops(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuops", *args], cwd=cwd, capture_output=True, text=True, **kw)


# what a typical training script imports (the gate asks the host's python to find each; none is imported)
MODULES = ["os", "sys", "json", "time", "math", "numpy", "torch", "wandb", "yaml", "transformers", "datasets", "tqdm"]
TEST_CACHE = os.environ.get("GPUOPS_TEST_CACHE") or str(Path.home() / ".cache" / "gpuops-tests")


def preflight_figures(remote_proj: Path, project: Path) -> None:
    """The one preflight execution of `train`, timed on one connection: as before the launch gate, with it, and with
    it on a real CPU torch (the cached test venv of tests/support/distenv.py, when it exists: importing torch dominates)."""
    from gpuops.profiles import model as profiles
    from gpuops.jobs import gate as core
    from gpuops.jobs import scripts as rl
    from gpuops.remote.connection import connect

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    os.environ.setdefault("GPUOPS_TEST_CACHE", TEST_CACHE)  # read before main() moved HOME
    from support import distenv

    prof = profiles.resolve("sandbox", project)
    pythons = [("system python3 (no torch)", prof.python)]
    if (distenv.VENV / ".complete").exists():
        pythons.append(("CPU torch 2.13 venv", str(distenv.VENV / "bin" / "python")))
    remote = connect(prof, announce=lambda *_: None)
    try:
        for label, py in pythons:
            node = prof.model_copy(update={"python": py})
            full = core.gate_params(node, "~/proj", env={"CUDA_VISIBLE_DEVICES": "0"}, modules={"": MODULES})
            stack = {**full, "gpu_apps": False, "find_modules": {}}
            ts: list[list[float]] = [[], [], []]
            for _ in range(7):  # interleaved, so a busy moment of a shared machine weighs on each alike
                for i, params in enumerate((None, stack, full)):
                    t0 = time.perf_counter()
                    rl.preflight(remote, "~/proj", "job.py", py, ["vllm"], params)
                    ts[i].append(time.perf_counter() - t0)
            rows = [statistics.median(t) for t in ts]
            print(f"train preflight round trip, {label}: median {rows[0] * 1000:.0f} ms without the launch gate, "
                  f"{rows[1] * 1000:.0f} ms with its stack facts (torch/CUDA/GPU count/flash-attn + py_compile), "
                  f"{rows[2] * 1000:.0f} ms with the whole gate (+ {len(MODULES)} imports looked up, the GPUs' "
                  "processes), one remote execution each (n=7, interleaved)")
    finally:
        remote.close()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-runs-"))
    os.environ.update(GPUOPS_STATE_DIR=str(tmp / "state"), GPUOPS_CONFIG_DIR=str(tmp / "config"),
                      HOME=str(tmp / "home"), NO_COLOR="1", WANDB_MODE="disabled")
    (tmp / "home").mkdir()
    from gpuops.sandbox import host
    from support.proxy import Proxy

    st = host.up()
    try:
        project = tmp / "proj"
        project.mkdir()
        remote = Path(st["dir"]) / "home" / "proj"
        remote.mkdir(parents=True, exist_ok=True)
        for d in (project, remote):
            (d / "job.py").write_text(JOB)

        def launch(*extra: str, sleep: float = 0.5, profile: str = "sandbox") -> tuple[str, float]:
            t0 = time.time()
            res = gpuops("train", "-p", profile, "--script", "job.py", "--no-sync", "-e", f"SLEEP={sleep}", *extra,
                         cwd=project)
            if res.returncode != 0:
                raise SystemExit(f"train failed: {res.stderr}")
            rid = res.stdout.strip().splitlines()[-1]
            marker = remote / f"started-{rid}"
            while not marker.exists():
                time.sleep(0.005)
            return rid, float(marker.read_text()) - t0

        def wait_end(rid: str) -> None:
            while not (remote / ".gpuops" / "runs" / rid / "exit_code").exists():
                time.sleep(0.02)

        # 0. train's preflight round trip, without the launch gate, with its stack part, with all of it
        preflight_figures(remote, project)

        # 1. train -> running
        launch("--no-snapshot")  # first contact: trust the host key
        times = []
        for _ in range(5):
            rid, dt = launch("--no-snapshot")
            times.append(dt)
            wait_end(rid)
        snap = []
        for _ in range(2):
            rid, dt = launch()
            snap.append(dt)
            wait_end(rid)
        print(f"train --no-sync -> job running: median {statistics.median(times):.2f}s "
              f"(min {min(times):.2f}s, max {max(times):.2f}s, n={len(times)}; a fresh CLI process, "
              "connect, preflight, launch)")
        print(f"  same with the launch snapshot (default): median {statistics.median(snap):.2f}s to running "
              "(the snapshot is taken after the job starts)")

        # 2. idle bytes per second through a proxy, and 3. exit -> noticed
        proxy = Proxy(st["port"])
        prof = Path(host.profile_path())
        (prof.parent / "viaproxy.yaml").write_text(prof.read_text().replace(f"port: {st['port']}", f"port: {proxy.port}"))
        gpuops("status", "-p", "viaproxy", cwd=project)  # trust [127.0.0.1]:proxy-port
        idle_s = 30.0
        rid, _ = launch("--no-snapshot", sleep=idle_s + 8, profile="viaproxy")
        watch = subprocess.Popen([sys.executable, "-m", "gpuops", "watch", rid, "-p", "viaproxy", "--json"],
                                 cwd=project, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(4)
        b0, t0 = proxy.bytes_down, time.monotonic()
        time.sleep(idle_s)
        b1, t1 = proxy.bytes_down, time.monotonic()
        rate = (b1 - b0) / (t1 - t0)
        noticed = None
        for line in watch.stdout:
            doc = json.loads(line)
            if doc["type"] == "state" and doc["state"] != "running":
                noticed = time.time()
        watch.wait()
        ended = float((remote / f"ended-{rid}").read_text())
        print(f"watch while the job is idle (GPU sample every 2 s, state check every 0.5 s, heartbeat 5 s): "
              f"{rate:.0f} bytes/s server->client over {t1 - t0:.0f}s, one remote stream")
        if noticed:
            print(f"job exit -> watch shows the final state: {noticed - ended:.2f}s (exit code {watch.returncode})")
        proxy.close()
    finally:
        host.down()


if __name__ == "__main__":
    main()
