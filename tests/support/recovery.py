"""`gpuops run --recover` in a test: a resumable job, the run records on disk, the instances still billing."""
from __future__ import annotations

import json
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from support import wait_for
from support.cloud import live_instances
from support.pipeline import run_process, write_script


STEPS = 6


# Resumes from GPUOPS_RESUME_FROM; each checkpoint written under a temporary name, then renamed (complete or absent).
# argv: steps, the first job's delay per step, the resumed job's, and (optional) HOLD: the first job stops after
# checkpoint-HOLD and waits there until its instance is ended, so a fault the test brings lands while it trains
# whatever the machine's load, without a slow first job; the resumed job runs to the end.
RESUMABLE = """\
import os, sys, time
steps, delay = int(sys.argv[1]), float(sys.argv[2])
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start, delay = int(open(os.path.join(src, "step")).read()), float(sys.argv[3])
    print(f"resumed from {src} at step {start}", flush=True)
for s in range(start + 1, steps + 1):
    time.sleep(delay)
    tmp = f"checkpoints/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "w").write(f"weights of step {s}, written on {os.uname().nodename} "
                                        f"from {src or 'scratch'}")
    os.replace(tmp, f"checkpoints/checkpoint-{s}")
    print(f"step {s} saved", flush=True)
    if not src and len(sys.argv) > 4 and s == int(sys.argv[4]):
        print(f"holding at step {s}", flush=True)
        while True:
            time.sleep(1)
"""


def billing(cloud) -> list[dict]:
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating", "preempted")]


def records() -> list[dict]:
    d = Path.cwd() / "runs" / "pipelines"
    return [json.loads(f.read_text()) for f in d.glob("*.json")] if d.is_dir() else []


def wait_run(pred, timeout: float = 120, what: str = "", p=None):
    """wait_for with a run's patience: up to 120 s, polled every 0.2 s, failing at once if the run `p` ended."""
    return wait_for(pred, timeout=timeout, what=what, interval=0.2, proc=p)


def training_with_a_checkpoint(cloud, *args: str, step: int = 2, text: str = RESUMABLE):
    """A `gpuops run --recover` process whose job trains on its first instance and whose checkpoint-<step> was
    fetched and verified meanwhile: (the process, the instance id)."""
    write_script(text=text)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", *args,
                    "--", str(STEPS), "0.5", "0.5", str(step))  # the first job holds at checkpoint-<step>
    wait_run(lambda: (records() or [{}])[0].get("checkpoint", {}) and
          (records()[0]["checkpoint"] or {}).get("step", 0) >= step, what=f"checkpoint-{step} fetched", p=p)
    (iid,) = [i["id"] for i in live_instances(cloud)]
    return p, iid


def finished_on_a_second_instance(p, first: str, cloud) -> tuple[dict, str]:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["outcome"] == "succeeded" and doc["job"] == "succeeded" and doc["recoveries"] == 1, doc
    assert [i["instance"] for i in doc["instances"]] == [1, 2] and doc["instances"][0]["ids"] == [first]
    assert all(i["duration_s"] > 0 and i["cost"] > 0 for i in doc["instances"])
    assert abs(sum(i["cost"] for i in doc["instances"]) - doc["total_cost"]) < 0.001
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]
    launched = [x.instance_id for x in Ledger().records() if x.profile == doc["profile"]]
    assert sorted(launched) == sorted(i["ids"][0] for i in doc["instances"])  # each one recorded, each one closed
    return doc, err


def done(p) -> tuple[dict, str]:
    """A `gpuops run --json` process's end: (its JSON document, its stderr), with no traceback."""
    out, err = p.communicate(timeout=300)
    assert "Traceback" not in err, err
    return json.loads(out), err


def fetched_log(doc: dict) -> str:
    """The job's log as the run fetched it."""
    return (Path.cwd() / doc["fetched"]["log"]).read_text()
