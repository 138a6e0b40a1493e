"""The host's list of running gpuops runs, as a preflight reads it (jobs/scripts.ACTIVE_LISTING), under the instant
the fresh-clone CI caught: a launch that completes between the preflight's two looks (no pid yet at the first, the
lock already released at the second) must stay listed, or a second `train` at the same moment launches too."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuops.jobs.scripts import ACTIVE_LISTING, STATE_FN

# `cat` as the host has it, but the first read of the run's pid finds nothing, and meanwhile the launch completes:
# its pid is written and the launch lock released (what the other `train`'s launch does at that instant)
CAT = """#!/bin/sh
case "$1" in
  */pid) if [ ! -e "$HOME/looked" ]; then : > "$HOME/looked"; echo "$LIVE_PID" > "$1"
           rmdir "$HOME/.gpuops/launch.lock"; exit 1; fi;;
esac
exec /bin/cat "$@"
"""


def _listing(tmp_path: Path, *, launched_meanwhile: bool) -> tuple[str, bool]:
    home = tmp_path / "home"
    run = home / "proj" / ".gpuops" / "runs" / "r1-20261207"
    run.mkdir(parents=True)
    (home / ".gpuops" / "active").mkdir(parents=True)
    entry = home / ".gpuops" / "active" / run.name
    entry.write_text(str(run) + "\n")
    (home / ".gpuops" / "launch.lock").mkdir()  # held: the launch is under way
    shims = tmp_path / "bin"
    shims.mkdir()
    if launched_meanwhile:
        (shims / "cat").write_text(CAT)
        (shims / "cat").chmod(0o755)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run)])
    try:
        env = {"HOME": str(home), "PATH": f"{shims}:/usr/bin:/bin", "LIVE_PID": str(live.pid)}
        out = subprocess.run(["/bin/sh", "-c", STATE_FN + ACTIVE_LISTING], capture_output=True, text=True, env=env,
                             check=True).stdout
    finally:
        live.kill()
        live.wait()
    return out, entry.exists()


def test_a_launch_that_completes_between_the_two_looks_stays_listed(tmp_path):
    out, kept = _listing(tmp_path, launched_meanwhile=True)
    assert os.path.exists(tmp_path / "home" / "looked")  # the instant happened
    lines = out.split("@active\n", 1)[1].split()
    assert lines[0] == "r1-20261207" and len(lines) == 2, out  # listed as running, with its pid
    assert kept


def test_a_launch_under_way_is_listed_without_a_pid(tmp_path):
    out, kept = _listing(tmp_path, launched_meanwhile=False)
    assert out.split("@active\n", 1)[1].split() == ["r1-20261207"] and kept, out


def test_a_dead_run_is_unlisted(tmp_path):
    home = tmp_path / "home"
    run = home / "proj" / ".gpuops" / "runs" / "r2-20261207"
    run.mkdir(parents=True)
    (run / "pid").write_text("999999\n")  # no such process
    (home / ".gpuops" / "active").mkdir(parents=True)
    entry = home / ".gpuops" / "active" / run.name
    entry.write_text(str(run) + "\n")
    out = subprocess.run(["/bin/sh", "-c", STATE_FN + ACTIVE_LISTING], capture_output=True, text=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert out.split("@active\n", 1)[1].split() == [] and not entry.exists(), out
