"""train's launch gate (in the preflight's one round trip) and the job's environment, through the sandbox."""
from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuops.sandbox import host
from support.runs import FOREVER, meta, put, remote_project, run_dir, run_id_of, wait_ended


pytestmark = pytest.mark.usefixtures("cleanup_runs")


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


# -- what the script imports (issue #20) ------------------------------------------------------------------------
def gate_python(sandbox, name: str = "venv-gate", **modules: str) -> str:
    """A venv on the sandbox host (no pip, no system site packages) with these modules and nothing else (torch, when
    given, also as installed metadata)."""
    from support.envs import crafted_python

    return crafted_python(sandbox, name, {"torch": "2.9.0+cu128"} if "torch" in modules else {},
                          {"present_mod": "", **modules})


def train(gpuops, script: str, *more: str):
    return gpuops("train", "--script", script, "--no-sync", "--no-snapshot", *more)


def test_a_missing_import_is_refused_with_its_fix_force_launches_a_guarded_one_is_not(sandbox, gpuops):
    py = gate_python(sandbox)
    set_profile(sandbox, python=py)
    put(sandbox, "train.py", "import os\nimport present_mod\nimport wandb\nimport cv2\nprint('started')\n")
    started = time.monotonic()
    r = train(gpuops, "train.py")
    assert r.code == 1, r.all
    assert f"train.py imports wandb and cv2, which {py} cannot import" in r.err and "not launching" in r.err
    assert "fix (wandb): add wandb to the project's requirements, then gpuops setup" in r.err
    assert "fix (cv2): add opencv-python to the project's requirements, then gpuops setup" in r.err
    assert time.monotonic() - started < 30
    assert not (remote_project(sandbox) / ".gpuops" / "runs").exists()
    # the project lists them (through a -r include): the fix is setup
    put(sandbox, "requirements.txt", "-r reqs/base.txt\n")
    put(sandbox, "reqs/base.txt", "opencv-python-headless==4.12.0.88\nwandb>=0.17\n")
    r = train(gpuops, "train.py")
    assert "fix (cv2): gpuops setup (the project lists opencv-python-headless in reqs/base.txt; setup installs it)" \
        in r.err and "fix (wandb): gpuops setup (the project lists wandb in reqs/base.txt" in r.err
    # --force launches; the job dies on its import, as the gate said; the problem is recorded
    rid = run_id_of(train(gpuops, "train.py", "--force"))
    assert wait_ended(sandbox, rid) == 1
    assert "No module named 'wandb'" in (run_dir(sandbox, rid) / "log").read_text()
    assert any("imports wandb and cv2" in p for p in meta(rid)["forced"])
    # optional imports (guarded, under TYPE_CHECKING, inside a function) are no reason to refuse
    put(sandbox, "opt.py", "from typing import TYPE_CHECKING\ntry:\n    import wandb\nexcept ImportError:\n"
                           "    wandb = None\nif TYPE_CHECKING:\n    import cv2\ndef later():\n    import scipy\n"
                           "import present_mod\nprint('ok')\n")
    rid = run_id_of(train(gpuops, "opt.py"))
    assert wait_ended(sandbox, rid) == 0


def test_the_projects_own_modules_and_the_jobs_pythonpath(sandbox, gpuops):
    py = gate_python(sandbox)
    set_profile(sandbox, python=py)
    put(sandbox, "mylib.py", "import present_mod\nimport wandb\n")
    put(sandbox, "train.py", "import mylib\nprint('ok')\n")
    r = train(gpuops, "train.py")
    assert r.code == 1, r.all
    assert f"mylib.py (imported by train.py) imports wandb, which {py} cannot import" in r.err
    # a module on the job's PYTHONPATH (the profile's env:) is found as the job will find it: no false alarm
    put(sandbox, "lib/helper.py", "import present_mod\n")
    put(sandbox, "uses_lib.py", "import helper\nprint('ok')\n")
    assert "uses_lib.py imports helper, which" in train(gpuops, "uses_lib.py").err
    set_profile(sandbox, python=py, env={"PYTHONPATH": "lib"})
    rid = run_id_of(train(gpuops, "uses_lib.py"))
    assert wait_ended(sandbox, rid) == 0


def test_a_shell_job_is_read_for_its_python_lines(sandbox, gpuops):
    py = gate_python(sandbox)
    set_profile(sandbox, python=py)
    put(sandbox, "train.py", "import present_mod\nimport wandb\n")
    put(sandbox, "job.sh", "#!/bin/bash\nset -e\necho starting\nexec python -u train.py --lr 1e-4\n")
    r = train(gpuops, "job.sh")
    assert r.code == 1, r.all
    assert f"train.py (run by job.sh) imports wandb, which {py} cannot import" in r.err
    put(sandbox, "pkg/__init__.py", "")
    put(sandbox, "pkg/mod.py", "import present_mod\nimport wandb\n")
    put(sandbox, "mod.sh", "nohup python -m pkg.mod\n")
    r = train(gpuops, "mod.sh")
    assert r.code == 1 and f"pkg/mod.py (run by mod.sh) imports wandb, which {py} cannot import" in r.err, r.all
    put(sandbox, "tool.sh", "python3 -m some_missing_tool --help\n")
    assert f"tool.sh runs python -m some_missing_tool, which {py} cannot import" in train(gpuops, "tool.sh").err
    # a .sh that runs nothing recognisable launches
    put(sandbox, "plain.sh", 'echo hello\nif [ -n "$PY" ]; then "$PY" x.py; fi\n')
    rid = run_id_of(train(gpuops, "plain.sh"))
    assert wait_ended(sandbox, rid) == 0


def test_the_fleet_path_reads_the_script_too(sandbox, gpuops):
    """train --launcher torchrun goes through train_fleet's preflight on each host."""
    py = gate_python(sandbox, "venv-gate-torch", torch=FAKE_TORCH)
    set_profile(sandbox, python=py)
    put(sandbox, "train.py", "import torch\nimport wandb\n")
    r = train(gpuops, "train.py", "--launcher", "torchrun")
    assert r.code == 1, r.all
    assert f"host #0 ({sandbox_host(sandbox)}): train.py imports wandb, which {py} cannot import" in r.err


# -- a GPU held by another process (issue #20) --------------------------------------------------------------------
# torch as the job's python would see the sandbox's emulated GPUs: the host's count (gpu.json), cut by
# CUDA_VISIBLE_DEVICES as CUDA does (up to the first index that names no GPU)
FAKE_TORCH = '''
import json, os
__version__ = "2.9.0+cu128"
class version:
    cuda = "12.8"
def _count():
    with open(os.path.join(os.environ["GPUOPS_SANDBOX_DIR"], "gpu.json")) as fh:
        n = json.load(fh)["count"]
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return n
    k = 0
    for item in v.split(","):
        if not item.strip().isdigit() or int(item) >= n:
            break
        k += 1
    return k
class _T:
    def __matmul__(self, other):
        return self
    def sum(self):
        return self
    def item(self):
        return 1.0
def randn(*a, **k):
    return _T()
class _Cudnn:
    @staticmethod
    def version():
        return 91002
class backends:
    cudnn = _Cudnn
class cuda:
    is_available = staticmethod(lambda: _count() > 0)
    device_count = staticmethod(_count)
    get_arch_list = staticmethod(lambda: ["sm_80", "sm_90"])
    get_device_name = staticmethod(lambda i: "NVIDIA H100 PCIe")
    get_device_capability = staticmethod(lambda i: (9, 0))
    synchronize = staticmethod(lambda i=None: None)
    is_bf16_supported = staticmethod(lambda: True)
'''


def sandbox_host(sandbox) -> str:
    return yaml.safe_load(sandbox["profile"].read_text())["host"]


def hold_gpu(spec: str) -> int:
    """A real process started on the sandbox host over SSH, holding emulated GPU memory (GPUOPS_SANDBOX_HOLD)."""
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect

    remote = connect(profiles.resolve("sandbox"), announce=lambda m: None)
    try:
        r = remote.run(f"GPUOPS_SANDBOX_HOLD={spec} nohup sleep 300 </dev/null >/dev/null 2>&1 & echo $!", timeout=30)
        smi = remote.run("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader",
                         timeout=30).stdout
    finally:
        remote.close()
    pid = int(r.stdout.split()[-1])
    assert f"{pid}, sleep, " in smi, smi  # as nvidia-smi lists a compute process
    return pid


def test_a_gpu_held_by_another_process_is_refused_force_launches(sandbox, gpuops):
    put(sandbox, "ok.py", "print('fine')\n")
    pid = hold_gpu("0:61440")
    try:
        r = train(gpuops, "ok.py")
        assert r.code == 1, r.all
        assert f"GPU 0 holds 61440 MiB of process {pid} (sleep, user {getpass.getuser()}), which is not a gpuops " \
               "run; not launching" in r.err
        assert f"see it with `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` and " \
               f"`ps -o pid,user,etime,cmd -p {pid}`" in r.err
        rid = run_id_of(train(gpuops, "ok.py", "--force"))
        assert wait_ended(sandbox, rid) == 0
        assert any(f"process {pid}" in p for p in meta(rid)["forced"])
    finally:
        os.kill(pid, signal.SIGTERM)
    # a gpuops run's own process on the GPU is that run, not a foreign process
    put(sandbox, "forever.py", FOREVER)
    first = run_id_of(train(gpuops, "forever.py"))
    try:
        r = train(gpuops, "ok.py")
        assert r.code == 1 and f"another gpuops run is still running on the host: {first}" in r.err
        assert "not a gpuops run" not in r.err, r.err
    finally:
        assert gpuops("stop", first, "--grace", "2").code == 0


def test_a_job_pinned_to_gpu_1_ignores_gpu_0_and_torch_counts_its_gpus(sandbox, gpuops):
    """Runbook 000's workstation: 2 GPUs, the profile pins jobs to GPU 1, something else holds GPU 0."""
    host.up(gpus=2)
    py = gate_python(sandbox, "venv-gate-torch", torch=FAKE_TORCH)
    set_profile(sandbox, python=py, env={"CUDA_VISIBLE_DEVICES": "1"}, expect={"gpu_count": 2})
    put(sandbox, "t.py", "import torch\nprint('torch sees', torch.cuda.device_count())\n")
    pid = hold_gpu("0:61440")
    try:
        rid = run_id_of(train(gpuops, "t.py"))
        assert wait_ended(sandbox, rid) == 0
        assert "torch sees 1\n" in (run_dir(sandbox, rid) / "log").read_text()
        # --env wins over the profile: the job given both GPUs meets the holder on GPU 0
        r = train(gpuops, "t.py", "-e", "CUDA_VISIBLE_DEVICES=0,1")
        assert r.code == 1 and f"GPU 0 holds 61440 MiB of process {pid}" in r.err, r.all
        assert "GPUs visible to torch" not in r.err
        # the CUDA test runs with the job's CUDA_VISIBLE_DEVICES: a job given no GPU of this host is refused
        r = train(gpuops, "t.py", "-e", "CUDA_VISIBLE_DEVICES=5")
        assert r.code == 1 and "CUDA tensor test: torch.cuda.is_available() is False" in r.err, r.all
    finally:
        os.kill(pid, signal.SIGTERM)
