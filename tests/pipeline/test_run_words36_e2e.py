"""Issue #36's first hour, `gpuops run` through the Lambda emulator: the job's lines from the first (not the last 5),
the run's profile with its GPU's env preset, a setup row that says what it installed, and Ctrl-C twice during setup
naming neither a checkpoints folder nothing was fetched into nor unstarted stages as failed."""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from support.cloud import TYPE
from support.helpers import default_sigint


def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", *extra)


def test_the_job_lines_come_from_the_first(cloud, gpuops):
    """A traceback longer than 5 lines printed while the launch stage ran reaches the terminal whole."""
    lines = "".join(f"print('early line {i}', flush=True)\n" for i in range(1, 13))
    (Path.cwd() / "train.py").write_text(lines + "import time\ntime.sleep(1.5)\nprint('late line', flush=True)\n")
    r = _run(gpuops, cloud, "--script", "train.py")
    assert r.code == 0, r.all
    for i in range(1, 13):
        assert f"early line {i}\n" in r.out, (i, r.out)
    assert r.out.count("early line 1\n") == 1 and "late line" in r.out


def test_the_runs_profile_has_its_gpus_env_preset(cloud, gpuops):
    from gpuops.paths import config_dir

    (Path.cwd() / "train.py").write_text("import os\nprint('preset var', os.environ.get('NCCL_P2P_LEVEL'), flush=True)\n")
    r = _run(gpuops, cloud, "--script", "train.py", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    prof = yaml.safe_load((config_dir() / "profiles" / f"{doc['profile']}.yaml").read_text())
    assert prof["env_preset"] == "h100", prof  # as `sandbox up --gpu h100-pcie` writes it
    r = gpuops("up", "box", "--type", TYPE, "--key", str(cloud.key), "--yes", "--no-verify")
    assert r.code == 0, r.all
    assert yaml.safe_load((config_dir() / "profiles" / "box.yaml").read_text())["env_preset"] == "h100"
    assert gpuops("down", "box", "--yes").code == 0


def test_the_setup_row_says_what_it_installed(cloud, gpuops):
    (Path.cwd() / "requirements.txt").write_text("six==1.17.0\n")
    (Path.cwd() / "train.py").write_text("import six\nprint('six', six.__version__, flush=True)\n")
    r = _run(gpuops, cloud, "--script", "train.py", "--json")
    assert r.code == 0, r.all
    setup = next(s for s in json.loads(r.out)["stages"] if s["stage"] == "setup")
    assert "matches the profile" not in setup["detail"], setup
    assert "install -r requirements.txt" in setup["detail"] and "verify passes" in setup["detail"], setup


@pytest.fixture
def slow_index(tmp_path):
    """A package index that answers after 60 s: setup's install waits on it (the time to press Ctrl-C twice)."""
    class Slow(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            time.sleep(60)
            self.send_response(404)
            self.end_headers()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/simple/"
    srv.shutdown()
    srv.server_close()


def test_ctrl_c_twice_during_setup_names_nothing_false(cloud, slow_index, tmp_path):
    (Path.cwd() / "requirements.txt").write_text("six==1.17.0\n")
    (Path.cwd() / "train.py").write_text("print('never')\n")
    Path("profiles").mkdir()
    Path("profiles/slow.yaml").write_text(f"host: 203.0.113.9\nsetup:\n  index_url: {slow_index}\n  install_uv: false\n")
    p = subprocess.Popen([sys.executable, "-m", "gpuops", "run", "--type", TYPE, "--key", str(cloud.key), "--yes",
                          "--from", "slow", "--script", "train.py", "--fetch", "checkpoints"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "NO_COLOR": "1"}, preexec_fn=default_sigint)
    d = Path.cwd() / "runs" / "pipelines"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        docs = [json.loads(f.read_text()) for f in d.glob("*.json")] if d.is_dir() else []
        if docs and (docs[0]["stages"].get("setup") or {}).get("started"):
            break
        time.sleep(0.2)
    time.sleep(2.0)  # setup's install is waiting on the index
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert "checkpoints" not in out or "not fetched" in out, out
    assert "runs/" + docs[0]["id"] + "/checkpoints" not in out, out
    failed = [ln for ln in out.splitlines() if "FAILED" in ln]
    assert len(failed) == 1 and failed[0].strip().startswith("setup") and "interrupted" in failed[0], out
    for label in ("launch", "training"):  # the stages that never started are no rows
        assert not [ln for ln in out.splitlines() if ln.strip().startswith(label)], out
    assert not [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]
