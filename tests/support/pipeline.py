"""`gpuops run` in a test: a training script, the command in-process (--json) or as a real process, its stages."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support.cloud import TYPE
from support.helpers import default_sigint


TRAIN = """\
import os, sys, time
steps = int(os.environ.get("STEPS", "3"))
for s in range(1, steps + 1):
    os.makedirs(f"checkpoints/step_{s}", exist_ok=True)
    with open(f"checkpoints/step_{s}/model.bin", "wb") as fh:
        fh.write(os.urandom(4096))
    print(f"step {s} loss {1.0 / s:.4f}", flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.2")))
print("python", sys.executable, flush=True)
"""


def run_json(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", *extra)


def write_script(script="train.py", text=TRAIN):
    (Path.cwd() / script).write_text(text)


def run_process(cloud, *args, **kw):
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "gpuops", "run", "--type", TYPE, "--key", str(cloud.key), "--yes",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_sigint, **kw)  # Ctrl-C works even in a suite run with it ignored


def wait_stage(stage: str, timeout: float = 120) -> dict:
    d = Path.cwd() / "runs" / "pipelines"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in d.glob("*.json") if d.is_dir() else []:
            doc = json.loads(f.read_text())
            st = doc["stages"].get(stage)
            if st and st.get("started"):
                return doc
        time.sleep(0.2)
    raise AssertionError(f"stage {stage} never started")


FOREVER = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n"


SLOW = "import time, os\nfor i in range(40):\n    print('step', i, flush=True)\n    time.sleep(0.5)\nos.makedirs('checkpoints', exist_ok=True)\nopen('checkpoints/final.bin', 'wb').write(b'x' * 100)\n"
