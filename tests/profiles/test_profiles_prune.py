"""Issue #29 / #28: profiles of terminated instances and of `gpuops run`s (run-*) are marked in `gpuops profiles`,
and `gpuops profiles prune` removes them (asked, --yes), never the profile of a live instance."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpuops.cloud.ledger import Ledger, Record
from gpuops.profiles.marks import mark


def cloud_profile(name: str, instance: str, state: str = "active") -> None:
    d = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(f"host: 192.0.2.{len(name)}\ninstance_type: gpu_1x_h100_pcie\n"
                                    f"cloud:\n  instance_id: {instance}\n  launch_id: L-{instance}\n  state: {state}\n")


def plain_profile(name: str) -> None:
    d = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text("host: 192.0.2.9\n")


@pytest.fixture
def leftovers(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    led = Ledger()
    for iid, state in (("i-live", "launched"), ("i-done", "terminated"), ("i-runlive", "launched")):
        led.add(Record(launch_id=f"L-{iid}", profile="x", instance_type="gpu_1x_h100_pcie", region="us-east-1",
                       price_cents_per_hour=249, created_at=time.time(), state=state, instance_id=iid))
    cloud_profile("downed", "i-gone", state="gone")  # `gpuops down` marked it
    cloud_profile("ended", "i-done")  # the ledger says terminated (reaped)
    cloud_profile("h100", "i-live")  # live: kept
    cloud_profile("elsewhere", "i-other")  # no record on this machine: may be live, kept
    cloud_profile("run-20261127-1", "i-runlive")  # a run's instance still running: kept
    cloud_profile("run-20261126-9", "i-done2", state="gone")
    plain_profile("run-old")  # a run's profile without an instance
    plain_profile("mine")  # hand-written: never touched


def test_marks_are_pure_decisions():
    from types import SimpleNamespace as NS

    c = NS(instance_ids=["a"], state="active")
    assert mark("h100", c, {"a": "launched"}).prunable is False
    assert mark("h100", c, {"a": "terminated"}) == mark("h100", NS(instance_ids=["a"], state="gone"), {})
    assert mark("h100", c, {}).live and not mark("h100", c, {}).prunable  # unknown here: may bill
    fleet = NS(instance_ids=["a", "b"], state="active")
    assert not mark("f", fleet, {"a": "terminated", "b": "launched"}).prunable  # one node still runs
    assert mark("run-x", None, {}).prunable and mark("mine", None, {}).text is None


def test_profiles_marks_and_prune_removes_only_leftovers(leftovers, gpuops, monkeypatch):
    r = gpuops("profiles")  # the terminated instances' profiles are counted, not listed (they would pile up)
    assert r.code == 0 and "not shown: gpuops profiles --all" in r.err
    assert "downed" not in {ln.split()[0] for ln in r.out.splitlines()}
    r = gpuops("profiles", "--all")
    assert r.code == 0
    lines = {ln.split()[0]: ln for ln in r.out.splitlines()}
    assert lines["downed"].endswith("(instance terminated)") and lines["ended"].endswith("(instance terminated)")
    assert lines["run-20261127-1"].endswith("(run, instance live)")
    assert lines["run-20261126-9"].endswith("(run, instance terminated)") and lines["run-old"].endswith("(run)")
    assert "(" not in lines["h100"].split()[-1] and "(" not in lines["mine"].split()[-1]
    assert "4 leftover profile(s)" in r.err and "gpuops profiles prune" in r.err
    doc = json.loads(gpuops("profiles", "--all", "--json").out)
    assert {d["name"] for d in doc if d["prunable"]} == {"downed", "ended", "run-20261126-9", "run-old"}
    # not asked, not removed (no terminal, no --yes)
    r = gpuops("profiles", "prune")
    assert r.code == 1 and "not confirmed" in r.err and "--yes" in r.err
    assert (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "downed.yaml").exists()
    r = gpuops("profiles", "prune", "--dry-run", "--json")
    assert r.code == 0 and json.loads(r.out)["removed"] == []
    r = gpuops("profiles", "prune", "--yes", "--json")
    assert r.code == 0, r.all
    assert sorted(json.loads(r.out)["removed"]) == ["downed", "ended", "run-20261126-9", "run-old"]
    left = sorted(p.stem for p in (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles").iterdir())
    assert left == ["elsewhere", "h100", "mine", "run-20261127-1"]
    r = gpuops("profiles", "prune", "--yes")
    assert r.code == 0 and "no leftover profiles" in r.err
