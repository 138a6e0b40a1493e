"""Issue #36: nothing gpuops hands to W&B carries a secret. W&B records the process's argv (and the program) in a
run's metadata by default, so `gpuops train --env API_TOKEN=...` would land in ./wandb/offline-run-*/ (0644, in the
project folder) and, online, in the run's page. The real wandb library, offline, in the project folder."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuops.transfer import snapshot as core
from support import DATA


def snap(name: str) -> dict:
    """A snapshot built from a recorded probe output (tests/data/snapshot/)."""
    import json

    return core.build(json.loads((DATA / "snapshot" / name).read_text()), captured_at="2026-01-15T10:00:00Z")

CANARY = "canary-4f1e9b2a7c"


def test_wandb_never_stores_the_command_line(isolated, monkeypatch):
    monkeypatch.delenv("WANDB_DIR", raising=False)  # W&B's default: ./wandb in the project folder
    monkeypatch.setattr(sys, "argv", [
        "/usr/local/bin/gpuops", "train", "train.py", "-p", "sandbox", "--env", f"API_TOKEN={CANARY}",
        "--data", f"https://alice:{CANARY}pw@data.example.com/set.tar?X-Amz-Signature={CANARY}sig"])
    s = snap("probe_h100_torch29_cu128.json")
    core.save(s, isolated / "env")
    info = core.log_to_wandb(isolated / "env", s, run_name="r1-environment", project="proj",
                             artifact_name="sandbox-environment", aliases=["r1"], config={"gpuops_run_id": "r1"})
    assert info["mode"] == "offline"
    runs = list((isolated / "wandb").glob("offline-run-*"))
    assert runs, sorted(p.name for p in (isolated / "wandb").iterdir())
    files = [f for r in runs for f in r.rglob("*") if f.is_file()]
    assert any(f.suffix == ".wandb" for f in files)
    leaked = [str(f) for f in files if CANARY.encode() in f.read_bytes()]
    assert not leaked, leaked
    # the debug logs W&B writes beside the runs too
    for f in (isolated / "wandb").rglob("*"):
        if f.is_file():
            assert CANARY.encode() not in f.read_bytes(), f


def test_a_run_after_one_that_gave_up_lands_where_w_and_b_says_at_the_call(isolated, monkeypatch):
    """A W&B server that never answers: the first call gives up (its wandb.init goes on in a thread, holding wandb's
    process-wide setup with the WANDB_DIR of then). The next call, WANDB_DIR unset, from another folder, lands in that
    folder's ./wandb, as W&B's own rule says at the call (before: in the first call's WANDB_DIR; under pytest-xdist, in
    an earlier test's folder, and the test that looked for it in its own failed)."""
    from gpuops.errors import GpuopsError
    from support.blackhole import Blackhole

    s = snap("probe_h100_torch29_cu128.json")
    core.save(s, isolated / "env")
    hole = Blackhole()
    try:
        first = isolated / "first"
        (first / "wb").mkdir(parents=True)
        monkeypatch.chdir(first)
        monkeypatch.setenv("WANDB_DIR", str(first / "wb"))
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{hole.port}")
        with pytest.raises(GpuopsError, match="gave up after 3s"):
            core.log_to_wandb(isolated / "env", s, run_name="first-environment", project="proj",
                              api_key="7a" * 20, mode="online", timeout=3)
        second = isolated / "second"
        second.mkdir()
        monkeypatch.chdir(second)
        monkeypatch.delenv("WANDB_DIR")
        info = core.log_to_wandb(isolated / "env", s, run_name="second-environment", project="proj", mode="offline")
        assert Path(info["run_dir"]).parent == second / "wandb", info["run_dir"]
    finally:
        hole.close()
