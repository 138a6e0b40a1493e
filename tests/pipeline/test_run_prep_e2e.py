"""`gpuops run --prep CMD --prep-out PATH --fs NAME` end to end through the Lambda emulator (issue 38): the preparation
on its own cheap instance in the filesystem's region writes data/train.bin, its outputs are moved whole onto the
filesystem and its instance terminated; the training instance (another type) reads them where the job expects them;
both instances and their costs in the summary, nothing left billing. A second run skips the preparation; an edited
preparation script runs again; a failing one launches no training instance; an interrupted one (SIGTERM) leaves
nothing billing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jsonschema import Draft202012Validator

from gpuops.cloud.ledger import Ledger
from support import ROOT
from support.cloud import TYPE, live_instances
from support.helpers import default_sigint

PREPARE = """\
import os, sys
os.makedirs("data", exist_ok=True)
text = open("corpus.txt").read()
tokens = [ord(c) % 251 for c in text]
with open("data/train.bin", "wb") as fh:
    fh.write(bytes(tokens))
print("tokenized", len(tokens), "tokens", flush=True)
"""

JOB = """\
import os
p = "data/train.bin"
print("LINK", os.path.islink(p), flush=True)
print("READ", len(open(p, "rb").read()), "bytes", flush=True)
"""

CHEAP = "gpu_1x_a10"  # the emulator's cheapest type ($0.75/h, 30 vCPUs): the preparation's


def _project(corpus: str = "hello tokens " * 100) -> None:
    (Path.cwd() / "prepare.py").write_text(PREPARE)
    (Path.cwd() / "corpus.txt").write_text(corpus)
    (Path.cwd() / "job.py").write_text(JOB)


def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.py",
                  "--fs", "work", "--prep", "python prepare.py", "--prep-out", "data/train.bin", *extra)


def _valid(doc: dict) -> dict:
    """The summary validates against run.schema.json (docs/json.md), the preparation's part included."""
    schema = json.loads((ROOT / "src" / "gpuops" / "schemas" / "run.schema.json").read_text())
    errors = list(Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).iter_errors(doc))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    return doc


def _launched_types(cloud) -> list:
    """The types of every instance the account launched, in launch order."""
    return [i["instance_type"]["name"] for i in cloud.instances()]


def test_prep_runs_on_the_cheap_type_and_the_job_on_another_reads_it(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "work", "--region", "us-east-1").code == 0
    _project()
    r = _run(gpuops, cloud)
    assert r.code == 0, r.all
    doc = _valid(json.loads(r.out))
    assert doc["outcome"] == "succeeded"
    assert "FileNotFoundError" not in r.err, r.err  # what the job reads is kept by --prep-out: no plan says otherwise
    prep = doc["prep"]
    assert prep["state"] == "ran" and prep["ok"] is True and prep["exit_code"] == 0, prep
    assert prep["type_used"] == CHEAP and prep["outputs"] == {"bytes": 1300, "files": 1}, prep
    # both instances, each with its type and cost; the total is theirs
    (pi,) = [i for i in doc["instances"] if i.get("role") == "prep"]
    (ti,) = [i for i in doc["instances"] if i.get("role") != "prep"]
    assert pi["type"] == CHEAP and ti["type"] == TYPE and pi["ids"] != ti["ids"], doc["instances"]
    assert pi["cost"] > 0 and ti["cost"] > 0 and pi["ended"].startswith("terminated"), doc["instances"]
    assert abs(doc["total_cost"] - (pi["cost"] + ti["cost"])) < 0.001, doc
    assert doc["stages"][0]["stage"] == "prep" and doc["stages"][0]["cost"] == pi["cost"], doc["stages"]
    assert _launched_types(cloud) == [CHEAP, TYPE]
    # the job read the preparation's output where it expected it: a link to the filesystem
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "LINK True" in log and "READ 1300 bytes" in log, log
    kept = cloud.fs_dir("work") / "gpuops" / "prep" / prep["folder"]
    assert (kept / "data" / "train.bin").stat().st_size == 1300
    marker = json.loads((kept / ".gpuops-prep.json").read_text())
    assert marker["key"] == prep["key"] and marker["exit_code"] == 0 and marker["run"] == doc["run"]
    assert "tokenized 1300 tokens" in (Path.cwd() / prep["log"]).read_text()
    assert (Path.cwd() / prep["environment"]).is_dir()
    assert not live_instances(cloud)
    assert not [rec for rec in Ledger().records() if rec.open]

    # a second run with the same preparation: skipped, said; no preparation instance launched
    r = _run(gpuops, cloud)
    assert r.code == 0, r.all
    doc2 = _valid(json.loads(r.out))
    assert doc2["prep"]["state"] == "kept" and doc2["prep"]["kept_by"] == doc["run"], doc2["prep"]
    assert "not prepared again" in r.err and doc2["prep"]["cost"] == 0
    assert _launched_types(cloud) == [CHEAP, TYPE, TYPE]
    assert "READ 1300 bytes" in (Path.cwd() / doc2["fetched"]["log"]).read_text()
    assert not [i for i in doc2["instances"] if i.get("role") == "prep"]

    # an edit to the preparation script: a new preparation, run again
    (Path.cwd() / "prepare.py").write_text(PREPARE.replace("% 251", "% 127"))
    r = _run(gpuops, cloud, "--name", "edited")
    assert r.code == 0, r.all
    doc3 = _valid(json.loads(r.out))
    assert doc3["prep"]["state"] == "ran" and doc3["prep"]["key"] != prep["key"], doc3["prep"]
    assert _launched_types(cloud) == [CHEAP, TYPE, TYPE, CHEAP, TYPE]
    assert "gpuops run edited" not in r.out and not live_instances(cloud)


def test_a_failing_prep_launches_no_training_instance(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "work", "--region", "us-east-1").code == 0
    _project()
    (Path.cwd() / "prepare.py").write_text("import sys\nprint('reading the corpus', flush=True)\n"
                                           "raise SystemExit('corpus.bin: no such shard')\n")
    r = _run(gpuops, cloud)
    assert r.code == 1, r.all
    doc = _valid(json.loads(r.out))
    assert doc["outcome"] == "failed" and doc["prep"]["state"] == "failed" and doc["prep"]["exit_code"] == 1
    assert "corpus.bin: no such shard" in doc["prep"]["why"], doc["prep"]
    assert "reading the corpus" in doc["prep"]["last_lines"], doc["prep"]
    assert "no such shard" in r.err and "no training instance was launched" in r.err, r.err
    assert _launched_types(cloud) == [CHEAP]  # the training type was never asked for
    assert [i["role"] for i in doc["instances"]] == ["prep"] and not live_instances(cloud)
    assert [s["stage"] for s in doc["stages"]] == ["prep"]
    # a preparation that dies of a cause the endings playbook knows says it as a training job's ending does
    (Path.cwd() / "prepare.py").write_text("print('reading the corpus', flush=True)\n"
                                           "open('shards/corpus-000.bin', 'rb').read()\n")
    r = _run(gpuops, cloud, "--name", "missing-shard")
    assert r.code == 1, r.all
    prep = _valid(json.loads(r.out))["prep"]
    assert prep["ending"]["cause"] == "file-missing", prep
    assert prep["why"] == "the preparation exited 1: a file the job reads is not on the instance: " \
                          "shards/corpus-000.bin", prep["why"]
    assert "why it ended: a file the job reads is not on the instance: shards/corpus-000.bin" in r.err, r.err
    assert "evidence: log: FileNotFoundError: [Errno 2] No such file or directory: 'shards/corpus-000.bin'" in r.err
    assert "fix: was it synced?" in r.err and "no training instance was launched" in r.err
    assert _launched_types(cloud) == [CHEAP, CHEAP] and not live_instances(cloud)


def test_prep_without_fs_is_refused_before_anything(cloud, gpuops):
    _project()
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py",
               "--prep", "python prepare.py", "--prep-out", "data/train.bin")
    assert r.code == 2 and "--prep needs --fs NAME" in r.err and "Traceback" not in r.all, r.all
    assert not cloud.launch_requests() and not (Path.cwd() / "runs" / "pipelines").exists()
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--fs", "work",
               "--prep", "python prepare.py", "--prep-out", "../elsewhere")
    assert r.code == 2 and "--prep-out '../elsewhere'" in r.err, r.all
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--fs", "work",
               "--prep-out", "data")
    assert r.code == 2 and "--prep-out without --prep" in r.err, r.all


def test_sigterm_while_preparing_terminates_its_instance(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "work", "--region", "us-east-1").code == 0
    _project()
    (Path.cwd() / "prepare.py").write_text("import time\nfor i in range(600):\n    print('shard', i, flush=True)\n"
                                           "    time.sleep(0.2)\n")
    p = subprocess.Popen([sys.executable, "-m", "gpuops", "run", "--type", TYPE, "--key", str(cloud.key), "--yes",
                          "--json", "--script", "job.py", "--fs", "work", "--prep", "python prepare.py",
                          "--prep-out", "data"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "NO_COLOR": "1"}, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    while True:
        recs = [json.loads(f.read_text()) for f in (Path.cwd() / "runs" / "pipelines").glob("*.json")]
        if recs and (recs[0].get("prep") or {}).get("job"):
            break
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.2)
    time.sleep(1.0)
    assert len(live_instances(cloud)) == 1
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted (SIGTERM) while preparing" in err and "nothing bills" in err, err
    assert not live_instances(cloud) and _launched_types(cloud) == [CHEAP]
    doc = _valid(json.loads(out))
    assert doc["outcome"] == "detached" and doc["prep"]["ok"] is False, doc["prep"]
    assert [i["ended"].startswith("terminated") for i in doc["instances"]] == [True]
    assert not [rec for rec in Ledger().records() if rec.open]
    # --resume prepares again (the script fixed meanwhile: a new key), then trains; both preparation instances billed
    (Path.cwd() / "prepare.py").write_text(PREPARE)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = _valid(json.loads(r.out))
    assert doc["outcome"] == "succeeded" and doc["prep"]["state"] == "ran", doc["prep"]
    assert "READ 1300 bytes" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    preps = [i for i in doc["instances"] if i.get("role") == "prep"]
    assert len(preps) == 2 and all(i["ended"].startswith("terminated") and i["cost"] > 0 for i in preps), preps
    assert _launched_types(cloud) == [CHEAP, CHEAP, TYPE] and not live_instances(cloud)


def test_the_preparations_command_is_judged_before_any_launch_request(cloud, gpuops, wheel_index):
    """The --prep command goes through the same local plan as --script, first: a script it reaches saved with
    Windows line endings, a .py it runs with relative imports, a module nothing setup installs provides: refused
    with no launch request at all (nothing billed), the fix said; the data the job reads from --prep-out is no
    warning, the data nothing keeps for it is."""
    cloud.capacity(TYPE, ["us-east-1"])
    _project()
    (Path.cwd() / "prep.sh").write_bytes(b"#!/bin/sh\r\nset -e\r\npython prepare.py\r\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--fs", "work",
               "--prep", "sh prep.sh", "--prep-out", "data/train.bin")
    assert r.code == 1 and "prep.sh (run by --prep) has Windows line endings" in r.err, r.all
    assert "sed -i 's/\\r$//' prep.sh" in r.err and "nothing was launched" in r.err and "Traceback" not in r.all
    assert cloud.launch_requests() == 0
    (Path.cwd() / "tok").mkdir()
    (Path.cwd() / "tok" / "__init__.py").write_text("")
    (Path.cwd() / "tok" / "run.py").write_text("from .vocab import size\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--fs", "work",
               "--prep", "python tok/run.py", "--prep-out", "data/train.bin")
    assert r.code == 1 and "tok/run.py (run by --prep) uses relative imports" in r.err, r.all
    assert "-m tok.run" in r.err and cloud.launch_requests() == 0
    (Path.cwd() / "requirements.txt").write_text(f"--no-index\n--find-links {wheel_index}\nnumpy\n")
    (Path.cwd() / "prepare.py").write_text("import tiktoken\n" + PREPARE)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--fs", "work",
               "--prep", "python prepare.py", "--prep-out", "data/train.bin")
    assert r.code == 1 and "prepare.py (run by --prep) imports tiktoken, which nothing setup installs provides" \
        in r.err, r.all
    assert "fix: add tiktoken to requirements.txt" in r.err and cloud.launch_requests() == 0
    assert not (Path.cwd() / "runs" / "pipelines").exists() or not list((Path.cwd() / "runs" / "pipelines").glob("*"))
    # gpuops plan says the same, and what the job reads that --prep-out does not keep
    (Path.cwd() / "job.py").write_text(JOB + "print(len(open('data/val.bin', 'rb').read()))\n")
    r = gpuops("plan", "--script", "job.py", "--prep", "python prepare.py", "--prep-out", "data/train.bin", "--json")
    doc = json.loads(r.out)
    assert r.code == 1 and doc["prep"] == "python prepare.py" and doc["runs"][0]["by"] == "--prep", r.all
    (w,) = [w for w in doc["warnings"] if "FileNotFoundError" in w]
    assert w.startswith("job.py (line 5) reads data/val.bin, which the project does not have"), w
    assert cloud.launch_requests() == 0
