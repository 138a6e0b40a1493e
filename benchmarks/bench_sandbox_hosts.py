"""Time to start and stop N sandbox hosts (sandbox.host.start(address=AUTO), each its own 127.0.0.N:22, host key and
GPUs), and one emulator launch -> active -> terminate round trip. Prints numbers; needs root (port 22) and sshd.

    uv run python benchmarks/bench_sandbox_hosts.py [N ...]   (default: 1 4 16)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from gpuops.sandbox import host


def hosts(n: int, base: Path) -> None:
    dirs = [base / f"n{n}-{i}" for i in range(n)]
    t = time.perf_counter()
    for d in dirs:
        host.start(d, address=host.AUTO, gpu="h100-sxm", gpus=8)
    started = time.perf_counter() - t
    t = time.perf_counter()
    for d in dirs:
        host.stop(d)
    stopped = time.perf_counter() - t
    print(f"{n:>3} hosts: start {started:6.2f} s ({started / n * 1000:5.0f} ms/host, keys generated), "
          f"stop {stopped:5.2f} s")


def emulator_round_trip(base: Path) -> None:
    import subprocess

    from gpuops.cloud.emulator.server import Emulator

    emu = Emulator(base / "emu", boot_seconds=0, launch_window=0)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / "k")], check=True)
    emu._add_key({"name": "k", "public_key": (base / "k.pub").read_text()})
    t = time.perf_counter()
    iid = emu._launch({"region_name": "us-east-1", "instance_type_name": "gpu_1x_h100_pcie", "ssh_key_names": ["k"]})
    launched = time.perf_counter() - t
    t = time.perf_counter()
    emu._terminate([iid])
    print(f"emulator: launch (host started) {launched * 1000:.0f} ms, terminate (host stopped) "
          f"{(time.perf_counter() - t) * 1000:.0f} ms")
    emu.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(a) for a in sys.argv[1:]] or [1, 4, 16]:
            hosts(n, Path(tmp))
        emulator_round_trip(Path(tmp))
