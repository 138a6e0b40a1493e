"""gpuops setup end to end through the sandbox: from no environment to a passing verify, idempotence, re-attach."""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import yaml

from proxy import Proxy

LOCAL_INDEX = "file:///opt/pypi/simple"  # this machine kind's local package index (pip config: extra-index-url)


def home(sandbox) -> Path:
    return Path(sandbox["dir"]) / "home"


def remote_project(sandbox) -> Path:
    return home(sandbox) / Path.cwd().name


def set_profile(sandbox, **changes) -> dict:
    data = yaml.safe_load(sandbox["profile"].read_text())
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    sandbox["profile"].write_text(yaml.safe_dump(data))
    return data


def fresh_env(sandbox, name: str) -> str:
    shutil.rmtree(home(sandbox) / name, ignore_errors=True)
    return f"~/{name}/bin/python"


def test_setup_from_nothing_to_verify_then_nothing_to_do(sandbox, gpuops):
    py = fresh_env(sandbox, "senv-req")
    set_profile(sandbox, python=py, expect={"packages": {"six": "1.17.0"}},
                setup={"index_url": LOCAL_INDEX, "install_uv": False})
    Path("requirements.txt").write_text("six==1.17.0\n")
    Path("train.py").write_text("import six\nprint('six', six.__version__)\n")
    assert gpuops("sync", "-p", "sandbox").code == 0

    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 0, r.all
    assert "1. create the environment ~/senv-req" in r.out and "2. install requirements.txt" in r.out
    assert ("does not exist (uv venv)" in r.out) or ("does not exist (python3 -m venv)" in r.out)
    assert "project index: file:///opt/pypi/simple" in r.out and "disk: about" in r.out
    assert not (home(sandbox) / "senv-req").exists()  # a dry run changes nothing

    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "create the environment" in r.err and "every step done" in r.err
    assert "PASS  six: 1.17.0" in r.out  # verify ran after the steps
    assert (home(sandbox) / "senv-req" / "bin" / "python").exists()
    assert (remote_project(sandbox) / ".gpuops" / "setup" / "done.json").is_file()

    r = gpuops("setup", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["plan"]["nothing_to_do"] and doc["executions"] == 1 and not doc["ran"]
    r = gpuops("setup", "sandbox")
    assert "already matches the profile: nothing installed (1 remote execution)" in r.err

    # the project's requirements change: only that step runs again
    Path("requirements.txt").write_text("six==1.17.0\nidna\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--dry-run", "--json")
    steps = [s["id"] for s in json.loads(r.out)["plan"]["steps"]]
    assert steps == ["deps"], steps

    # the job's python is the environment's
    r = gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot")
    assert r.code == 0, r.all


def test_python_outside_a_venv_is_a_profile_error(sandbox, gpuops):
    set_profile(sandbox, python="python3")
    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 2 and "inside a virtual environment" in r.err, r.all
