"""train's launch gate (in the preflight's one round trip) and the job's environment, through the sandbox."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from test_runs_e2e import meta, put, remote_project, run_dir, run_id_of, wait_ended


def set_profile(sandbox, **changes) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    for k, v in changes.items():
        if k == "expect":
            data["expect"].update(v)
        else:
            data[k] = v
    sandbox["profile"].write_text(yaml.safe_dump(data))


def test_syntax_error_refused_force_launches_and_is_recorded(sandbox, gpuops):
    put(sandbox, "broken.py", "print('hi'\nx = = 1\n")
    r = gpuops("train", "--script", "broken.py", "--no-sync", "--no-snapshot")
    assert r.code == 1, r.all
    assert "script broken.py does not compile: SyntaxError" in r.err and "not launching" in r.err
    assert "add --force to launch anyway" in r.err
    assert not (remote_project(sandbox) / ".gpuops" / "runs").exists() or \
        not list((remote_project(sandbox) / ".gpuops" / "runs").iterdir())
    assert not list(remote_project(sandbox).glob("__pycache__"))  # the check writes no .pyc into the project
    rid = run_id_of(gpuops("train", "--script", "broken.py", "--no-sync", "--no-snapshot", "--force"))
    assert wait_ended(sandbox, rid) == 1
    m = meta(rid)
    assert any("does not compile" in p for p in m["forced"])
    assert json.loads((run_dir(sandbox, rid) / "meta.json").read_text())["forced"] == m["forced"]
    put(sandbox, "ok.py", "print('fine')\n")
    rid = run_id_of(gpuops("train", "--script", "ok.py", "--no-sync", "--no-snapshot"))
    assert wait_ended(sandbox, rid) == 0 and "forced" not in meta(rid)


def test_cpu_only_torch_refused_with_verifys_cause_and_fix(sandbox, gpuops, dist_python):
    """A real CPU-only torch (2.13.0+cpu) on a host whose nvidia-smi shows a GPU: the run would do nothing."""
    set_profile(sandbox, python=dist_python, expect={"packages": {"torch": "2.13.0"}})
    v = gpuops("verify", "sandbox", "--no-save")
    fix = next(line.split("fix: ", 1)[1] for i, line in enumerate(v.out.splitlines())
               if "fix: " in line and "torch CUDA build" in v.out.splitlines()[i - 1])
    put(sandbox, "t.py", "import torch\nprint(torch.__version__)\n")
    started = time.monotonic()
    r = gpuops("train", "--script", "t.py", "--no-sync", "--no-snapshot")
    assert r.code == 1, r.all
    assert "torch CUDA build: torch 2.13.0+cpu is a CPU-only build" in r.err
    assert "CUDA tensor test: torch.cuda.is_available() is False" in r.err
    assert fix in r.err  # the same fix line verify prints
    assert time.monotonic() - started < 60
    rid = run_id_of(gpuops("train", "--script", "t.py", "--no-sync", "--no-snapshot", "--force"))
    assert wait_ended(sandbox, rid) == 0
    assert any("CPU-only" in p for p in meta(rid)["forced"])
    assert "2.13.0+cpu" in (run_dir(sandbox, rid) / "log").read_text()


def test_expected_flash_attn_missing_and_gpu_count_refused(sandbox, gpuops):
    set_profile(sandbox, expect={"packages": {"flash-attn": "*"}, "gpu_count": 2})
    put(sandbox, "ok.py", "print('fine')\n")
    r = gpuops("train", "--script", "ok.py", "--no-sync", "--no-snapshot")
    assert r.code == 1, r.all
    assert "flash-attn: not installed" in r.err and "GPU count: 1 (expected 2)" in r.err
    assert "python3 -m pip install flash-attn" in r.err


def test_python_in_a_sh_job_is_the_profiles_venv(sandbox, gpuops):
    home = Path(sandbox["dir"]) / "home"
    venv = home / "venv-job"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    set_profile(sandbox, python="~/venv-job/bin/python")
    put(sandbox, "job.sh", "python -c 'import sys; print(\"exe\", sys.executable)'\necho \"venv $VIRTUAL_ENV\"\n")
    rid = run_id_of(gpuops("train", "--script", "job.sh", "--no-sync", "--no-snapshot"))
    assert wait_ended(sandbox, rid) == 0
    log = (run_dir(sandbox, rid) / "log").read_text()
    assert f"exe {venv}/bin/python" in log, log
    assert f"venv {venv}\n" in log
