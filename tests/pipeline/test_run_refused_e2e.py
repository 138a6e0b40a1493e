"""Issue #36: a `gpuops run` refused before any launch request (no capacity anywhere, the user's no) leaves nothing
behind, not even runs/pipelines/<id>.lock, and never prints a `--resume` line for the record it removes a moment
later. Through the Lambda emulator."""
from __future__ import annotations

from pathlib import Path

from support.cloud import TYPE


def test_a_run_refused_before_launching_leaves_no_lock_and_no_resume_line(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "train.py").write_text("print('hi')\n")
    # a filesystem to create, and nobody to say yes (no --yes, no terminal): refused before any launch request
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--script", "train.py", "--fs", "newfs36")
    assert r.code == 2, r.all
    assert "nothing was launched" in r.err, r.err
    assert "--resume" not in r.err, r.err
    d = Path.cwd() / "runs" / "pipelines"
    assert not d.is_dir() or not list(d.iterdir()), list(d.iterdir())
    assert cloud.launch_requests() == 0
