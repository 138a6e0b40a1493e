"""Issue #36: nothing gpuops hands to W&B carries a secret. W&B records the process's argv (and the program) in a
run's metadata by default, so `gpuops train --env API_TOKEN=...` would land in ./wandb/offline-run-*/ (0644, in the
project folder) and, online, in the run's page. The real wandb library, offline, in the project folder."""
from __future__ import annotations

import sys
from pathlib import Path

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
