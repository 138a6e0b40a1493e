"""python -m gpuops.cloud.emulator --dir D [--port P] ...: the emulator daemon (see daemon.py)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m gpuops.cloud.emulator")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--boot-seconds", type=float, default=20.0)
    ap.add_argument("--launch-window", type=float, default=12.0)
    ap.add_argument("--python")
    ap.add_argument("--image")
    a = ap.parse_args()
    from ...paths import write_private
    from .server import Emulator

    d = Path(a.dir)
    old = {}
    try:
        old = json.loads((d / "emulator.json").read_text())
    except (OSError, ValueError):
        pass
    emu = Emulator(d, api_key=os.environ.get("GPUOPS_EMULATOR_API_KEY") or old.get("api_key"), port=a.port,
                   boot_seconds=a.boot_seconds, launch_window=a.launch_window, python=a.python).start()
    if a.image:
        emu.image(python=a.image)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    write_private(d / "emulator.json", json.dumps({"url": emu.url, "pid": os.getpid(), "api_key": emu.api_key,
                                                   "user": emu.user}, indent=1))
    done.wait()
    emu.close()
    (d / "emulator.json").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
