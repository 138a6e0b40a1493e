"""What the benchmarks share: gpuops' state, config and HOME in a temporary folder, and the Lambda emulator with a
client key, as the tests have them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def isolated(tmp: Path) -> dict:
    """gpuops' folders and HOME under tmp: the environment (os.environ's, with them) for gpuops' processes."""
    (tmp / "home").mkdir()
    return {**os.environ, "HOME": str(tmp / "home"), "GPUOPS_STATE_DIR": str(tmp / "state"),
            "GPUOPS_CONFIG_DIR": str(tmp / "config"), "NO_COLOR": "1"}


def emulated_cloud(tmp: Path, env: dict):
    """The Lambda emulator started (instances boot in 1 s) and env pointed at it, quick polls; a client key.
    Returns (the gpuops command, the key, the emulator)."""
    from gpuops.cloud.emulator.server import Emulator

    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    emu = Emulator(tmp / "emu", api_key="bench_key_" + "x" * 20, boot_seconds=1.0, launch_window=0).start()
    env.update(emu.env, GPUOPS_CLOUD_POLL_S="0.3", GPUOPS_CLOUD_LAUNCH_INTERVAL_S="0")
    return [str(Path(sys.executable).parent / "gpuops")], key, emu
