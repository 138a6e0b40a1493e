"""The sandbox's emulated nvidia-smi counts a job's descendants as the job (docs/sandbox.md): a job started from a
bash script shows its python child as the GPU process, at ~95 % utilisation, even when the script starts it with a
cleared environment (`env -i`, as wrappers, sudo and clean shells do)."""
from __future__ import annotations

import json
import time

import pytest

from support.runs import put, run_id_of


pytestmark = pytest.mark.usefixtures("cleanup_runs")

SCRIPT = """\
#!/usr/bin/env bash
# a job as many are started: a shell script that runs the trainer, here with a clean environment
set -e
env -i PATH="$PATH" python3 -c 'import time
for i in range(600):
    print(f"step {i}", flush=True); time.sleep(0.2)'
"""


def test_a_bash_jobs_python_child_is_the_gpu_process(sandbox, gpuops):
    put(sandbox, "train.sh", SCRIPT)
    rid = run_id_of(gpuops("train", "--script", "train.sh", "--no-sync", "--no-snapshot"))
    time.sleep(1.0)
    res = gpuops("watch", rid, "--once", "--json")
    assert res.code == 0, res.all
    docs = [json.loads(x) for x in res.out.splitlines()]
    sample = [d for d in docs if d["type"] == "sample"][0]
    assert sample["util"] >= 90, sample
    procs = [d for d in docs if d["type"] == "processes"][0]["processes"]
    assert [p["name"] for p in procs] == ["python3"], procs
    assert gpuops("stop", rid, "--grace", "2").code == 0
