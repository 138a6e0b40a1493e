"""Run the emulator as a background process that outlives the command starting it (`gpuops sandbox up --cloud`).

<dir>/emulator.json (0600): {url, pid, api_key, user}. The API key reaches the daemon through its environment, never
its command line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ...errors import GpuopsError
from ...paths import state_dir


def emulator_dir() -> Path:
    return Path(os.environ.get("GPUOPS_EMULATOR_DIR") or state_dir() / "lambda-emulator")


def read_info(d: Path | None = None) -> dict | None:
    """The running daemon's {url, pid, api_key, user}, or None when none answers."""
    d = d or emulator_dir()
    try:
        info = json.loads((d / "emulator.json").read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if _answers(info) else None


def _answers(info: dict) -> bool:
    req = urllib.request.Request(info["url"].rsplit("/api/v1", 1)[0] + "/_emulator/state",
                                 headers={"Authorization": f"Bearer {info['api_key']}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _knob(info: dict, name: str, args: dict) -> None:
    """POST /_emulator/<name> with the daemon's own key (docs/sandbox.md: the control paths)."""
    req = urllib.request.Request(info["url"].rsplit("/api/v1", 1)[0] + "/_emulator/" + name,
                                 data=json.dumps(args).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {info['api_key']}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
    except OSError as exc:
        raise GpuopsError(f"the running Lambda API emulator refused {name}: {exc}",
                          hint="gpuops sandbox down --cloud, then up again") from None


def start(*, port: int = 0, boot_seconds: float = 20.0, launch_window: float = 12.0, python: str | None = None,
          d: Path | None = None, image: str | None = None) -> tuple[dict, bool]:
    """Start the daemon unless one runs; -> (info, started). image: what instances launched from now on boot with
    (the emulator's `image` knob: sandbox/image.py IMAGES), set on a running daemon too."""
    d = d or emulator_dir()
    info = read_info(d)
    if info:  # already running: this `up`'s clock options (and --image) hold from now on, as a fresh start's would
        _knob(info, "boot_seconds", {"s": boot_seconds})
        _knob(info, "launch_window", {"s": launch_window})
        if image is not None:
            _knob(info, "image", {"python": image})
        return info, False
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    (d / "emulator.json").unlink(missing_ok=True)
    args = [sys.executable, "-m", "gpuops.cloud.emulator", "--dir", str(d), "--port", str(port),
            "--boot-seconds", str(boot_seconds), "--launch-window", str(launch_window)]
    if python:
        args += ["--python", python]
    if image:
        args += ["--image", image]
    env = dict(os.environ)
    env.pop("LAMBDA_API_KEY", None)  # the daemon keeps its own key (from its saved info, else a new one)
    with open(d / "emulator.log", "ab") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = read_info(d)
        if info:
            return info, True
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = (d / "emulator.log").read_text(errors="replace")[-400:] if (d / "emulator.log").exists() else ""
    raise GpuopsError(f"the Lambda API emulator did not start. {tail.strip()}", hint=f"see {d / 'emulator.log'}")


def stop(d: Path | None = None) -> bool:
    """Stop the daemon and every instance host it started. -> whether a daemon was running."""
    from ...sandbox import host

    d = d or emulator_dir()
    running = False
    try:
        pid = int(json.loads((d / "emulator.json").read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
        running = True
        for _ in range(250):
            os.kill(pid, 0)
            time.sleep(0.02)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for h in sorted((d / "hosts").glob("*")) if (d / "hosts").is_dir() else []:
        host.stop(h)  # the daemon stops them on SIGTERM; this covers a daemon that was killed
    return running
