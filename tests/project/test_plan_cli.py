"""`gpuops plan` in-process (no host, no cloud): its exit codes, its lines and its --json document against
plan.schema.json; the resolution off (--no-resolve) or against the tests' own index of metadata-only wheels."""
from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from support import ROOT

SCHEMA = json.loads((ROOT / "src" / "gpuops" / "schemas" / "plan.schema.json").read_text())


def valid(doc: dict) -> dict:
    errors = sorted(Draft202012Validator(SCHEMA).iter_errors(doc), key=str)
    assert not errors, [e.message for e in errors]
    return doc


def test_plan_refuses_with_exit_1_and_launches_with_0(gpuops, wheel_index):
    Path("requirements.txt").write_text(f"--no-index\n--find-links {wheel_index}\nnumpy\n")
    Path("run.sh").write_text("#!/bin/bash\nset -e\npython prepare.py\npython train.py\n")
    Path("prepare.py").write_text("import numpy\nimport tiktoken\n")
    Path("train.py").write_text("import yaml\nimport numpy\n")
    r = gpuops("plan", "--script", "run.sh", "--json")
    doc = valid(json.loads(r.out))
    assert r.code == 1 and doc["verdict"] == "refuse" and doc["resolution"]["available"], r.all
    assert [x["problem"].split(",")[0] for x in doc["refusals"]] == ["prepare.py (run by run.sh) imports tiktoken"]
    assert doc["index_lines"] == ["--no-index", f"--find-links {wheel_index}"]
    r = gpuops("plan", "--script", "run.sh")
    assert r.code == 1 and "REFUSED: prepare.py (run by run.sh) imports tiktoken" in r.out, r.all
    assert "module tiktoken: missing (tiktoken)  <- prepare.py (run by run.sh)" in r.out
    assert "gpuops run would refuse this job before launching anything (--force launches past these)" in r.err
    Path("requirements.txt").write_text(f"--no-index\n--find-links {wheel_index}\nnumpy\ntiktoken\n")
    r = gpuops("plan", "--script", "run.sh")
    assert r.code == 0 and "setup installs: tiktoken==0.12.0" in r.out, r.all
    assert "imports yaml, which no dependency file names: the image's system python may have it" in r.err


def test_no_resolve_and_bad_options(gpuops):
    Path("train.py").write_text("import wandb\n")
    Path("requirements.txt").write_text("numpy\n")
    r = gpuops("plan", "--script", "train.py", "--no-resolve", "--json")
    doc = valid(json.loads(r.out))
    assert r.code == 0 and doc["resolution"] == {**doc["resolution"], "available": False}
    assert "imports wandb, which no dependency file names" in doc["warnings"][0]
    r = gpuops("plan", "--script", "nope.py")
    assert r.code == 2 and "Traceback" not in r.all
    r = gpuops("plan", "--script", "train.py", "--image", "no-such-image")
    assert r.code == 2 and "--image no-such-image" in r.err and "Traceback" not in r.all
