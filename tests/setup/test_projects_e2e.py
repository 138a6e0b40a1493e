"""Issue #20: real projects on real images, end to end. The project shapes of the runbooks (requirements.txt with a
`-r` include and a private index, a tool-only pyproject next to requirements, a pyproject without a lock in a src/
layout, a uv project with its lock and extras run by a `.sh` job through `uv run`), an instance image whose system
python3 already has a CUDA torch (the emulator's lambda-stack image: Lambda Stack), and a host with its own pip
configuration (an extra index over HTTPS signed by a company CA, tests/support/indexes.py)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from support.indexes import TlsIndex, make_wheel
from support.cloud import TYPE
from support.envs import LOCAL_INDEX, SlowIndex, fresh_env, home, set_profile
from support.runs import remote_project


TRAIN_IMAGE = """\
import os, sys
import torch, six, privpkg
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
print("privpkg", privpkg.VALUE, "six", six.__version__, flush=True)
print("python", sys.executable, flush=True)
os.makedirs("checkpoints/step_1", exist_ok=True)
with open("checkpoints/step_1/model.bin", "wb") as fh:
    fh.write(os.urandom(1024))
"""


@pytest.fixture
def private_index(tmp_path):
    """A company index over HTTPS (its own CA) holding `privpkg`, which is on no public index."""
    index = TlsIndex(tmp_path / "private-index")
    index.add(make_wheel(tmp_path / "wheels", "privpkg", "1.0", "VALUE = 'private-1.0'\n"), "privpkg")
    yield index
    index.close()


def pip_conf(index: TlsIndex) -> str:
    """A host's own pip configuration: its mirror as the index, the company index as an extra one, the company CA."""
    return (f"[global]\nindex-url = {LOCAL_INDEX}\nextra-index-url = {index.url}\ncert = {index.ca}\n"
            "timeout = 30\n")


@pytest.fixture
def host_pip_conf(sandbox):
    """The sandbox host's ~/.config/pip/pip.conf, removed after the test (the sandbox host is shared)."""
    conf = home(sandbox) / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    yield conf
    conf.unlink(missing_ok=True)


def requirements_with_include(extra: str = "") -> None:
    Path("reqs").mkdir(exist_ok=True)
    Path("reqs/base.txt").write_text("six==1.17.0\n")
    Path("requirements.txt").write_text(f"{extra}privpkg==1.0\n-r reqs/base.txt\n")


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


# -- the image's torch ------------------------------------------------------------------------------------------------
def test_run_on_an_image_with_a_cuda_torch_trains_with_it_and_the_hosts_pip_config(cloud, gpuops, private_index):
    """Lambda Stack: `run` used to make a venv that could not see the image's torch (ModuleNotFoundError after boot
    and setup were billed). The run's environment sees it, pip keeps it, and the host's pip.conf (a private index
    behind a company CA) installs privpkg."""
    cloud.image("lambda-stack", files={".config/pip/pip.conf": pip_conf(private_index)})
    requirements_with_include("torch>=2.5\n")
    Path("train.py").write_text(TRAIN_IMAGE)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py",
               "--fetch", "checkpoints")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded", r.all
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "torch 2.9.0+cu128 cuda True" in log and "privpkg private-1.0 six 1.17.0" in log
    assert "/.venvs/gpuops/bin/python" in log  # the run's own environment, which sees the image's packages
    assert "torch: torch 2.9.0+cu128 from the image's python" in r.err  # the plan said which torch, and whence
    assert "installer: pip (pip counts the image's torch 2.9.0+cu128 as installed" in r.err
    assert any(p.startswith("/simple/privpkg") for p in private_index.requests)
    assert (Path.cwd() / doc["fetched"]["checkpoints"] / "step_1" / "model.bin").stat().st_size == 1024
    assert not _live(cloud)


def test_run_from_a_profile_whose_python_is_the_system_one(cloud, gpuops):
    """--from a profile with `python: python3` used to be refused by setup after the instance was launched. It is
    accepted before launching: the run's environment is made from that python, seeing its packages."""
    cloud.image("lambda-stack")
    Path("profiles").mkdir()
    Path("profiles/lstack.yaml").write_text("host: 203.0.113.7\npython: python3\nenv:\n  MY_FLAG: '1'\n")
    Path("train.py").write_text("import os, sys, torch\nprint('torch', torch.__version__, 'cuda', "
                                "torch.cuda.is_available(), 'flag', os.environ['MY_FLAG'], 'python', sys.executable)\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py",
               "--from", "lstack")
    assert r.code == 0, r.all
    assert "--from lstack: python: python3 is the system's; the run trains in ~/.venvs/gpuops/bin/python" in r.err
    log = (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    assert "torch 2.9.0+cu128 cuda True flag 1 python" in log and "/.venvs/gpuops/bin/python" in log
    # a python that is no interpreter at all is refused before anything is launched
    Path("profiles/conda.yaml").write_text("host: 203.0.113.7\npython: conda run -n train python\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py", "--from", "conda")
    assert r.code == 2 and "nothing was launched" in r.err, r.all
    assert cloud.launch_requests() == 1


# -- the host's pip configuration, through uv -------------------------------------------------------------------------
def test_setup_gives_the_hosts_pip_configuration_to_uv(sandbox, gpuops, private_index, host_pip_conf):
    """uv does not read pip.conf: it used to fail with `invalid peer certificate: UnknownIssuer`, then `privpkg was
    not found`, where pip on the same host installs both."""
    host_pip_conf.write_text(pip_conf(private_index))
    set_profile(sandbox, python=fresh_env(sandbox, "senv-pipconf"), expect={"packages": {"privpkg": "1.0"}})
    requirements_with_include()
    Path("train.py").write_text("import privpkg, six\nprint('privpkg', privpkg.VALUE)\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--dry-run", "--json")
    plan = json.loads(r.out)["plan"]
    assert plan["installer"] == "uv" and plan["pip_config"]["extra-index-url"] == [private_index.url]
    assert plan["pip_config"]["cert"] == str(private_index.ca) and str(host_pip_conf) in plan["pip_config"]["sources"]
    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "PASS  privpkg: 1.0" in r.out
    r = gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot")
    assert r.code == 0, r.all
    # an included file changes: that is not "nothing to do"
    Path("reqs/base.txt").write_text("six==1.17.0\nidna\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    steps = [s["id"] for s in json.loads(gpuops("setup", "sandbox", "--dry-run", "--json").out)["plan"]["steps"]]
    assert steps == ["deps"]


# -- project shapes ---------------------------------------------------------------------------------------------------
def test_a_tool_only_pyproject_next_to_requirements_installs_the_requirements(sandbox, gpuops):
    """setuptools used to package the synced profiles/ folder as `profiles==0.0.0` and never install the
    requirements."""
    py = fresh_env(sandbox, "senv-tools")
    set_profile(sandbox, python=py, setup={"index_url": LOCAL_INDEX}, expect={"packages": {"six": "1.17.0"}})
    Path("pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n\n[tool.black]\nline-length = 100\n")
    Path("requirements.txt").write_text("six==1.17.0\n")
    Path("profiles").mkdir()
    Path("profiles/other.yaml").write_text("host: 203.0.113.7\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "install -r requirements.txt" in r.err and "PASS  six: 1.17.0" in r.out
    site = next((home(sandbox) / "senv-tools" / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("profiles*")) and list(site.glob("six-1.17.0.dist-info"))


def test_a_pyproject_without_a_lock_runs_the_synced_source(sandbox, gpuops):
    """A src/ layout installed non-editable kept running the old code after a fix was synced."""
    set_profile(sandbox, python=fresh_env(sandbox, "senv-edit"), setup={"index_url": LOCAL_INDEX})
    Path("pyproject.toml").write_text(
        '[project]\nname = "lrproj"\nversion = "0.1.0"\ndependencies = ["six"]\n\n'
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\n')
    Path("src/lrproj").mkdir(parents=True)
    Path("src/lrproj/__init__.py").write_text("LR = 0.1\n")
    Path("train.py").write_text("import lrproj\nprint('LR =', lrproj.LR, flush=True)\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--no-verify")
    assert r.code == 0, r.all
    assert "-e . (editable: the job runs the synced source)" in r.err
    assert _train_log(gpuops, "train.py").count("LR = 0.1") == 1
    Path("src/lrproj/__init__.py").write_text("LR = 0.001\n")  # the fix
    assert gpuops("sync", "-p", "sandbox").code == 0
    assert "LR = 0.001" in _train_log(gpuops, "train.py")


def test_a_uv_project_with_lock_and_all_extras_and_a_uv_run_job(sandbox, gpuops):
    """Runbook 000: `uv sync --all-extras`, then `uv run ...`. The job used to make its own .venv and sync again
    while billed, without the extras; it runs in the environment setup built, as it is."""
    Path("pyproject.toml").write_text('[project]\nname = "uvproj"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
                                      'dependencies = ["six"]\n\n[project.optional-dependencies]\nnet = ["idna"]\n')
    env = {**os.environ, "UV_INDEX_URL": LOCAL_INDEX, "UV_NO_CONFIG": "1"}
    subprocess.run(["uv", "lock", "-q"], check=True, env=env)
    py = fresh_env(sandbox, "senv-uvproj")
    set_profile(sandbox, python=py, setup={"index_url": LOCAL_INDEX, "extras": "all"})
    Path("train.py").write_text("import sys, six, idna\nprint('prefix', sys.prefix, 'idna', idna.__version__)\n")
    Path("run.sh").write_text("#!/bin/sh\nset -e\nuv run python train.py\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--no-verify")
    assert r.code == 0, r.all
    assert "uv sync --locked --all-extras" in r.err
    log = _train_log(gpuops, "run.sh")
    assert f"prefix {home(sandbox) / 'senv-uvproj'} idna" in log, log
    assert not (remote_project(sandbox) / ".venv").exists()  # uv did not make an environment of its own


def _train_log(gpuops, script: str) -> str:
    r = gpuops("train", "--script", script, "--no-sync", "--no-snapshot", "--json")
    assert r.code == 0, r.all
    rid = json.loads(r.out)["run_id"]
    r = gpuops("logs", rid, "-f")
    assert r.code == 0, r.all
    return r.out


# -- refusals and failures --------------------------------------------------------------------------------------------
def test_a_plan_that_cannot_fit_the_disk_is_refused_before_it_starts(sandbox, gpuops):
    from gpuops.paths import data_dir

    know = yaml.safe_load((data_dir("playbooks") / "knowledge.yaml").read_text())
    know["setup_package_mb"] = {"six": 10 ** 9}  # a package of a petabyte: no host has the room
    Path("playbooks").mkdir()
    Path("playbooks/knowledge.yaml").write_text(yaml.safe_dump(know))
    set_profile(sandbox, python=fresh_env(sandbox, "senv-disk"), setup={"index_url": LOCAL_INDEX})
    Path("requirements.txt").write_text("six\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox")
    assert r.code == 1, r.all
    assert "setup would not fit on sandbox: needs about" in r.err and "nothing was installed" in r.err
    assert "DOES NOT FIT" in r.out
    assert not (home(sandbox) / "senv-disk").exists()
    assert not (remote_project(sandbox) / ".gpuops" / "setup" / "log").exists()


def test_a_setup_killed_on_the_host_says_so(sandbox, gpuops, tmp_path):
    index = SlowIndex(tmp_path / "index", delay=8)
    try:
        index.add(make_wheel(tmp_path, "gpuops-slowpkg", "1.0", "VALUE = 1\n"), "gpuops-slowpkg")
        set_profile(sandbox, python=fresh_env(sandbox, "senv-killed"), setup={"index_url": index.url})
        Path("requirements.txt").write_text("gpuops-slowpkg==1.0\n")
        assert gpuops("sync", "-p", "sandbox").code == 0
        sdir = remote_project(sandbox) / ".gpuops" / "setup"

        def kill_when_installing():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if (sdir / "log").exists() and "@@step 2/2 deps" in (sdir / "log").read_text():
                    time.sleep(1.0)
                    os.kill(int((sdir / "pid").read_text()), signal.SIGKILL)  # the OOM killer, say
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_when_installing)
        killer.start()
        r = gpuops("setup", "sandbox")
        killer.join()
        assert r.code == 1, r.all
        assert "was killed before it finished at step deps (its script left no exit code" in r.err
        assert "exit -1" not in r.err
    finally:
        index.close()
        shutil.rmtree(home(sandbox) / "senv-killed", ignore_errors=True)


def test_requirements_that_name_their_own_index(sandbox, gpuops, private_index, host_pip_conf):
    """A requirements file with its own `--extra-index-url` line (pip-tools writes them), the host's pip.conf only
    naming the company CA: the install reaches the private index through the file's own line."""
    host_pip_conf.write_text(f"[global]\ncert = {private_index.ca}\n")
    set_profile(sandbox, python=fresh_env(sandbox, "senv-reqindex"), setup={"index_url": LOCAL_INDEX},
                expect={"packages": {"privpkg": "1.0"}})
    Path("requirements.txt").write_text(f"--extra-index-url {private_index.url}\nprivpkg==1.0  # the private one\n"
                                        "six==1.17.0 ; python_version >= '3.8'\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "PASS  privpkg: 1.0" in r.out
    assert any(p.startswith("/simple/privpkg") for p in private_index.requests)
