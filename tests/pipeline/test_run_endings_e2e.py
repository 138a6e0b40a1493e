"""`gpuops run`'s summary says what the job died of, never "FAILED failed" alone: through the Lambda emulator, a job
that cannot import, one the instance's kernel kills for want of RAM, one whose GPU falls off the bus, one stopped
for the budget; the summary (plain and --json) and the run's record (runs/pipelines/<id>.json) carry the ending."""
from __future__ import annotations

import json
from pathlib import Path

from support.pipeline import run_json, run_process, write_script
from support.recovery import billing, records, wait_run
from support.schemas import valid

WAITS = """\
import os, time
open("job.pid", "w").write(str(os.getpid()))
print("step 1 loss 0.9", flush=True)
while True:
    time.sleep(0.2)
"""


def _record(doc: dict) -> dict:
    return json.loads((Path.cwd() / "runs" / "pipelines" / f"{doc['run']}.json").read_text())


def test_a_job_that_cannot_import_is_named_in_the_summary_json_and_record(cloud, gpuops):
    write_script(text="print('loading', flush=True)\nfrom json import no_such_name\n")
    r = run_json(gpuops, cloud, "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    valid("run", doc)
    e = doc["ending"]
    assert doc["outcome"] == "failed" and doc["job"] == "failed" and e["cause"] == "import-error", doc
    assert e["title"].startswith("an import failed: ImportError: cannot import name 'no_such_name' from 'json'"), e
    assert "exit code 1" in e["evidence"] and e["fix"] and e["source"]
    assert _record(doc)["ending"] == e
    assert f"job {doc['run_id']}: failed (exit 1): an import failed" in r.err
    assert not billing(cloud)


def test_the_instances_oom_killer_is_named_in_the_plain_summary(cloud):
    write_script(text=WAITS)
    p = run_process(cloud, "--script", "train.py")
    (iid,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    pid_file = cloud.home(iid) / Path.cwd().name / "job.pid"
    wait_run(lambda: pid_file.is_file() and pid_file.read_text().strip(), what="the job", p=p)
    pid = int(pid_file.read_text())
    assert cloud.oom_kill(iid) == pid
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    head = next(x for x in out.splitlines() if x.startswith("gpuops run "))  # after the job's own lines
    assert "FAILED  failed: killed by the kernel's OOM killer" in out  # the watch stage's row: never "failed" alone
    assert f"failed (job failed: killed by the kernel's OOM killer: the host ran out of RAM (process {pid} " in head, out
    assert "  why it ended: killed by the kernel's OOM killer" in out
    assert "    evidence: kernel log: Out of memory: Killed process" in out
    assert "    evidence: exit code 137 (128 + 9: SIGKILL)" in out and "    fix: host RAM, not GPU memory" in out
    assert records()[0]["ending"]["cause"] == "host-oom"
    assert not billing(cloud)


def test_a_gpu_falling_off_the_bus_without_recover_is_the_ending(cloud):
    write_script(text=WAITS)
    p = run_process(cloud, "--script", "train.py", "--json")
    (iid,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    pid_file = cloud.home(iid) / Path.cwd().name / "job.pid"
    wait_run(lambda: pid_file.is_file() and pid_file.read_text().strip(), what="the job", p=p)
    cloud.gpu_fault(iid, "xid=79", kill_jobs=True)
    out, err = p.communicate(timeout=120)
    doc = json.loads(out)
    e = doc["ending"]
    assert p.returncode == 1 and e["cause"] == "gpu-failed" and "Xid 79" in e["title"], (e, err)
    assert any("Xid" in x and "79" in x for x in e["evidence"]) and "replace the instance" in e["fix"]


def test_a_budget_stop_is_the_runs_own_stop(cloud, gpuops):
    write_script(text="import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n")
    r = run_json(gpuops, cloud, "--script", "train.py", "--max-cost", "0.01")
    assert r.code == 1, r.all
    e = json.loads(r.out)["ending"]
    assert e["cause"] == "stopped" and e["title"].startswith("stopped by gpuops run: --max-cost $0.01 reached"), e
    assert e["fix"] == "nothing to fix: it was stopped on purpose"
