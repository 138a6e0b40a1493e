"""Issue 42: a no-change re-sync cost more than plain rsync, and part of it was the checks in rsync's own session
(transfer.plan.sync_guard): for a folder that exists they start no process but df (no mkdir, no tail), and still
stop rsync when the disk is short or the folder cannot be made. Run by the real sh with the real tools, each of them
behind a shim on PATH that notes its name first."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from gpuops.transfer.plan import guard_stop, sync_guard

TOOLS = ("mkdir", "df", "tail", "rsync")


def _shims(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "started"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real, tool
        shim = bin_dir / tool
        shim.write_text(f"#!/bin/sh\necho {tool} >> {shlex.quote(str(log))}\nexec {shlex.quote(real)} \"$@\"\n")
        shim.chmod(0o755)
    return bin_dir, log


def _guard(tmp_path: Path, folder: Path, need: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir, log = _shims(tmp_path)
    log.unlink(missing_ok=True)
    argv = shlex.split(sync_guard(shlex.quote(str(folder)), need=need)) + ["--version"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    return r, (log.read_text().split() if log.exists() else [])


def test_a_resync_starts_df_alone_before_rsync(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    r, started = _guard(tmp_path / "a", folder, need=1000)
    assert r.returncode == 0 and "rsync" in r.stdout, r.stderr
    assert started == ["df", "rsync"], started


def test_a_first_sync_makes_the_folder_and_a_short_disk_stops_rsync(tmp_path):
    folder = tmp_path / "new" / "project"
    r, started = _guard(tmp_path / "a", folder, need=1000)
    assert r.returncode == 0 and folder.is_dir() and started == ["mkdir", "df", "rsync"], (r.stderr, started)
    r, started = _guard(tmp_path / "b", folder, need=2**62)
    stop = guard_stop(r.stderr)
    assert r.returncode == 1 and stop is not None and stop[0] == "room" and stop[1].isdigit(), r.stderr
    assert "rsync" not in started, started
