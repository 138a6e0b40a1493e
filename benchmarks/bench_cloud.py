"""Figures for the Lambda Cloud commands, against the local Lambda API emulator (gpuops.cloud.emulator, the server of
`gpuops sandbox up --cloud`), readiness polled every 5 s as against Lambda.

Prints: API calls per `gpuops up` (launch + polls, by endpoint) and per `gpuops ls`, the time from `active` to
verified, the same for a two-node fleet (`up --nodes 2`, `down` of both), and `gpuops --help` start-up with the
cloud commands registered. Not a pass/fail test.
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
    """One `up` (verify included), one `ls`, one `down` in-process against the emulator, counting API requests."""
    os.environ.update({k: v for k, v in env.items() if k.startswith(("GPUOPS_", "HOME", "NO_COLOR"))})
    boot = float(os.environ.get("BENCH_BOOT_S", "10"))
    os.environ.update({"GPUOPS_CLOUD_POLL_S": "5", "GPUOPS_CLOUD_LAUNCH_INTERVAL_S": "12"})
    from gpuops.cloud.emulator.server import Emulator  # `gpuops sandbox up --cloud`: instances on 127.0.0.N:22

    emu = Emulator(tmp / "emu", api_key="bench-key", boot_seconds=boot).start()
    os.environ.update(emu.env)
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    proj = tmp / "proj"
    proj.mkdir()
    os.chdir(proj)
    from gpuops.cloud.instances import UpSpec, make_context
    from gpuops.cloud.down import down
    from gpuops.cloud.reap import listing
    from gpuops.cloud.up import up
    from gpuops.console import Output
    import io

    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    try:
        ctx = make_context(out)
        t0 = time.perf_counter()
        with ctx.client:
            res = up(UpSpec(name="bench", type_name="gpu_1x_h100_pcie", key=key, ttl_s=3600), ctx)
        wall = time.perf_counter() - t0
        calls = dict(sorted((f"{m} {p}", n) for (m, p), n in ctx.client.calls.items()))
        polls = ctx.client.calls[("GET", "/instances/{id}")]
        print(f"gpuops up: {ctx.client.total_calls} API calls ({calls}); launch requests "
              f"{ctx.client.calls[('POST', '/instance-operations/launch')]}, readiness polls {polls} for a {boot:g} s boot "
              f"polled every {ctx.poll_s:g} s; wall {wall:.1f} s; verified: {res['verified']}")
        ev = ctx.events
        print(f"  launch -> active {ev['active_at'] - ev['launched_at']:.1f} s; active -> SSH login "
              f"{ev['ssh_at'] - ev['active_at']:.2f} s; active -> verified {ev['verified_at'] - ev['active_at']:.2f} s")
        ctx = make_context(out)
        t0 = time.perf_counter()
        with ctx.client:
            doc = listing(ctx)
        print(f"gpuops ls: {ctx.client.total_calls} API call(s) for {len(doc['instances'])} instance(s), "
              f"{(time.perf_counter() - t0) * 1000:.0f} ms")
        ctx = make_context(out)
        with ctx.client:
            d = down("bench", ctx)
        print(f"gpuops down: {ctx.client.total_calls} API calls (terminate + read back), status {d['status']}")
        # a fleet: `up --nodes 2` (one launch request per node, 12 s apart as Lambda requires) and `down` of both
        ctx = make_context(out)
        t0 = time.perf_counter()
        with ctx.client:
            res = up(UpSpec(name="pair", type_name="gpu_1x_h100_pcie", key=key, ttl_s=3600, nodes=2), ctx)
        wall = time.perf_counter() - t0
        ev = ctx.events
        print(f"gpuops up --nodes 2: {ctx.client.total_calls} API calls, launch requests "
              f"{ctx.client.calls[('POST', '/instance-operations/launch')]}; wall {wall:.1f} s (first launch -> all "
              f"active {ev['active_at'] - ev['launched_at']:.1f} s, all active -> fleet verified "
              f"{ev['verified_at'] - ev['active_at']:.2f} s); verified: {res['verified']}")
        ctx = make_context(out)
        t0 = time.perf_counter()
        with ctx.client:
            d = down("pair", ctx)
        print(f"gpuops down (2 nodes): {ctx.client.total_calls} API calls (one terminate + read backs), "
              f"{(time.perf_counter() - t0):.2f} s, statuses {d['statuses']}")
    finally:
        emu.close()


if __name__ == "__main__":
    main()
