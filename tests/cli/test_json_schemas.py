"""Every `--json` document validates against its command's JSON Schema (src/gpuops/schemas/, docs/json.md): one
vocabulary (`host`, `*_s`, `*_at` ISO with a zone, `*_bytes`/`*_mib`, `warnings`, `profile` a name). The commands
run for real: against the session's one sandbox host, and the session's one Lambda API emulator for the cloud ones.
A change to a document's shape fails here until its schema (and docs/json.md) says so."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from support.cloud import TYPE
from support.runs import put
from support import ROOT


SCHEMAS = ROOT / "src" / "gpuops" / "schemas"
FORMATS = Draft202012Validator.FORMAT_CHECKER


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def check(name: str, doc) -> None:
    """doc valid against the command's schema; every `*_at` an ISO 8601 time WITH its zone (the schema's pattern)."""
    errors = sorted(Draft202012Validator(schema(name), format_checker=FORMATS).iter_errors(doc), key=str)
    assert not errors, f"{name}: " + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def run_json(gpuops, name: str, *args, codes=(0,)) -> dict:
    r = gpuops(*args, "--json")
    assert r.code in codes, r.all
    doc = json.loads(r.out)
    check(name, doc)
    return doc


def test_schemas_are_valid_draft_2020_12_and_each_names_its_command():
    names = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert len(names) >= 20, names
    for n in names:
        s = schema(n)
        Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema" and s["title"].startswith("gpuops ")
    docs = (ROOT / "docs" / "json.md").read_text()
    missing = [n for n in names if f"schemas/{n}.schema.json" not in docs]
    assert not missing, f"docs/json.md does not link: {missing}"


def test_a_schema_rejects_the_old_names():
    """The schemas enforce the vocabulary: the names this change replaced fail them."""
    v = Draft202012Validator(schema("sandbox-status"), format_checker=FORMATS)
    old = {"address": "127.0.0.1", "port": 22, "running": True, "profile": "/x/profiles/sandbox.yaml"}
    assert not v.is_valid(old)  # no host, no warnings, profile a path
    assert v.is_valid({"host": "127.0.0.1", "port": 22, "running": True, "profile": "sandbox",
                       "profile_path": "/x/profiles/sandbox.yaml", "warnings": []})
    w = Draft202012Validator(schema("watch"), format_checker=FORMATS)
    sample = {"type": "sample", "index": 0, "name": "H100", "util": 1.0, "mem_total_mib": 2.0, "temp": 1, "power": 1}
    assert not w.is_valid({**sample, "ts": 1795807424.173, "mem_used": 1.0})
    assert not w.is_valid({**sample, "at": "2026-11-27T19:23:37", "mem_used_mib": 1.0})  # no zone
    assert w.is_valid({**sample, "at": "2026-11-27T19:23:37.120+00:00", "mem_used_mib": 1.0})


SLOW = """\
import os, time
os.makedirs("checkpoints/step_1", exist_ok=True)
open("checkpoints/step_1/model.bin", "wb").write(os.urandom(2048))
for i in range(int(os.environ.get("N", "4"))):
    print(f"step {i + 1}/4 loss={1.0 / (i + 1):.4f}", flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.2")))
"""


@pytest.mark.usefixtures("cleanup_runs")
def test_every_sandbox_command_prints_its_schema(sandbox, gpuops, isolated):
    st = run_json(gpuops, "sandbox-status", "sandbox", "status")
    assert st["host"] == "127.0.0.1" and st["profile"] == "sandbox" and st["profile_path"].endswith("sandbox.yaml")
    up = run_json(gpuops, "sandbox-up", "sandbox", "up")
    assert up["profile"] == "sandbox" and up["host"] == "127.0.0.1"
    run_json(gpuops, "trust", "trust", "sandbox")
    v = run_json(gpuops, "verify", "verify", "sandbox", codes=(0, 1))
    assert v["host"] == "127.0.0.1" and datetime.fromisoformat(v["checked_at"]).tzinfo is not None
    put(sandbox, "t.py", SLOW)
    s = run_json(gpuops, "sync", "sync", "sandbox")
    assert s["duration_s"] >= 0 and s["bytes_sent"] > 0
    t = run_json(gpuops, "train", "train", "--script", "t.py", "--no-snapshot", "-e", "N=4")
    rid = t["run_id"]
    r = gpuops("watch", rid, "--json", "--interval", "0.3", "--lines", "50")
    assert r.code == 0, r.all
    types = set()
    for line in r.out.splitlines():
        d = json.loads(line)
        check("watch", d)
        types.add(d["type"])
    assert {"sample", "log", "state", "processes"} <= types, types
    doc = run_json(gpuops, "status", "status")
    row = next(x for x in doc["runs"] if x["run_id"] == rid)
    assert datetime.fromisoformat(row["started_at"]).tzinfo is not None and row["elapsed_s"] >= 0
    assert doc["gpus"][0]["mem_used_mib"] >= 0
    run_json(gpuops, "stop", "stop", rid)
    run_json(gpuops, "fetch-list", "fetch", "--list")
    f = run_json(gpuops, "fetch", "fetch", "checkpoints")
    assert f["duration_s"] >= 0
    run_json(gpuops, "snapshot", "snapshot", "sandbox", "--out", "snapA")
    run_json(gpuops, "diff", "diff", "snapA", "sandbox", codes=(0, 1))
    run_json(gpuops, "matrix", "matrix", "--from", "snapA")
    import yaml

    data = yaml.safe_load(sandbox["profile"].read_text())
    data["python"] = "~/json-senv/bin/python"  # setup's own environment (never the system Python); a dry run makes none
    sandbox["profile"].write_text(yaml.safe_dump(data))
    run_json(gpuops, "setup", "setup", "sandbox", "--dry-run")
    rows = json.loads(gpuops("profiles", "--json").out)
    check("profiles", rows)
    run_json(gpuops, "profiles-show", "profiles", "show", "sandbox")
    run_json(gpuops, "profiles-pin", "profiles", "pin", "sandbox", "--dry-run", codes=(0, 1, 2))
    run_json(gpuops, "profiles-prune", "profiles", "prune")


def test_every_cloud_command_prints_its_schema(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    run_json(gpuops, "cloud-types", "cloud", "types")
    run_json(gpuops, "cloud-keys", "cloud", "keys")
    run_json(gpuops, "fs-create", "fs", "create", "data-1", "--region", "us-east-1")
    run_json(gpuops, "fs-ls", "fs", "ls")
    run_json(gpuops, "fs-rm", "fs", "rm", "data-1", "--yes")
    run_json(gpuops, "up", "up", "box", "--type", TYPE, "--key", str(cloud.key), "--yes", "--no-verify")
    run_json(gpuops, "ls", "ls")
    run_json(gpuops, "down", "down", "box", "--yes")
    run_json(gpuops, "reap", "reap", "--yes")
    (Path.cwd() / "train.py").write_text("print('step 1 loss 0.5', flush=True)\n")
    run_json(gpuops, "run", "run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py")
    run_json(gpuops, "sandbox-status-cloud", "sandbox", "status", "--cloud")  # the daemon's: not running here
    run_json(gpuops, "sandbox-down", "sandbox", "down", "--cloud")
