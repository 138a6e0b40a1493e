"""Issue 42: `--max-cost 0.03` ended at $0.0313: the fetch and the termination after the stop bill too. The run stops
early enough that what follows the stop (the job's stop, the fetch of the log and the checkpoints, the termination)
fits under the cap, its time estimated from what this run measured (the checkpoint's size and the rate of the last
fetch, the stages' round trips), and the summary says what the cap covered. Through the Lambda emulator."""
from __future__ import annotations

import json

from support.pipeline import run_json, write_script

# a checkpoint every step, fetched while training (--fetch): the end's fetch has a measured rate and a known size
JOB = ("import os, time\nstep = 0\nwhile True:\n    step += 1\n    d = f'checkpoints/step-{step}'\n"
       "    os.makedirs(d, exist_ok=True)\n    with open(f'{d}/model.bin', 'wb') as fh:\n"
       "        fh.write(os.urandom(2_000_000))\n    print('step', step, flush=True)\n    time.sleep(0.5)\n")


def test_max_cost_keeps_the_cap_with_the_fetch_and_termination(cloud, gpuops):
    write_script(text=JOB)
    r = run_json(gpuops, cloud, "--script", "train.py", "--fetch", "checkpoints", "--max-cost", "0.03")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert "--max-cost $0.03 reached" in doc["stop_reason"] and doc["job"] == "stopped", doc
    assert doc["fetched"].get("checkpoints"), doc  # the stop still fetches what exists
    rows = {s["stage"]: s for s in doc["stages"]}
    assert rows["down"]["ok"] and rows["fetch"]["ok"], doc["stages"]
    assert doc["total_cost"] <= 0.03, (doc["total_cost"], [(s["stage"], s["duration_s"], s["cost"])
                                                         for s in doc["stages"]])
    said = " ".join(doc["warnings"]) + r.err
    assert "the cap covers" in said, r.err  # what the cap counts, said where the stop is said
