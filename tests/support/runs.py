"""A job on the sandbox host (train / logs / status / stop): its scripts, its remote folder, its run folder.
The fixture `cleanup_runs` (kill what a test left running) is in tests/conftest.py."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


STEPS = """\
import os, sys, time
n = int(os.environ.get("STEPS", "3"))
delay = float(os.environ.get("DELAY", "0.2"))
os.makedirs("checkpoints", exist_ok=True)
import json
json.dump({"sid": os.getsid(0), "pgid": os.getpgid(0), "fds": [os.readlink(f"/proc/self/fd/{i}") for i in range(3)]},
          open("session.json", "w"))
for step in range(1, n + 1):
    print(f"step {step}/{n} loss={1.0 / step:.4f}", flush=True)
    os.makedirs(f"checkpoints/global_step_{step}", exist_ok=True)
    time.sleep(delay)
print("done", flush=True)
"""

CRASH = """\
import sys
print("step 1 loss=0.5", flush=True)
raise RuntimeError("boom")
"""

OOM = """\
import sys
print("step 1 loss=0.5", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
sys.exit(1)
"""

FOREVER = """\
import os, sys, time
i = 0
try:
    while True:
        print(f"step {i}", flush=True)
        i += 1
        time.sleep(0.2)
except KeyboardInterrupt:
    print("interrupted: saving", flush=True)
    sys.exit(130)
"""


def remote_project(sandbox) -> Path:
    return Path(sandbox["dir"]) / "home" / Path.cwd().name


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def put(sandbox, name: str, text: str) -> None:
    """A script both in the local project and (for --no-sync) in the remote project folder."""
    write(Path.cwd() / name, text)
    write(remote_project(sandbox) / name, text)


def run_id_of(res) -> str:
    assert res.code == 0, res.all
    return res.out.strip().splitlines()[-1]


def run_dir(sandbox, rid: str) -> Path:
    return remote_project(sandbox) / ".gpuops" / "runs" / rid


def wait_ended(sandbox, rid: str, timeout: float = 30) -> int:
    f = run_dir(sandbox, rid) / "exit_code"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f.is_file() and f.read_text().strip():
            return int(f.read_text())
        time.sleep(0.05)
    raise AssertionError(f"run {rid} did not end within {timeout}s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def run_texts(remote_run_dir: Path, rid: str) -> dict[str, str]:
    """Every file of a run, remote (its run folder) and local (runs/<id>/), by where it is: for leak checks."""
    places = {}
    for f in remote_run_dir.rglob("*"):
        if f.is_file():
            places[f"remote {f.name}"] = f.read_text(errors="replace")
    for f in (Path("runs") / rid).rglob("*"):
        if f.is_file():
            places[f"local {f}"] = f.read_text(errors="replace")
    return places


def meta(rid: str) -> dict:
    return json.loads((Path.cwd() / "runs" / rid / "meta.json").read_text())


def kill_run_groups(run_dirs) -> None:
    """SIGKILL the process group of every run folder given whose job is still alive."""
    for d in run_dirs:
        try:
            pid = int((d / "pid").read_text())
        except (OSError, ValueError):
            continue
        if group_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
