"""Issue #36: setup over an existing environment whose python no longer runs (made by another python: a pyenv
python since removed or changed) made it again on top and failed in Python's own `ensurepip` (or uv's "A virtual
environment already exists"). Setup now says it and makes that environment anew; a folder there that is not a
virtual environment is refused before anything runs."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gpuops.setup import plan as sp
from support.setup_facts import KNOW, facts, profile


def test_a_venv_whose_python_does_not_run_is_made_anew():
    f = facts({"requirements.txt": "six\n"}, env="env_python=0\nenv_stale=venv")
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    env = next(s for s in plan.steps if s.id == "environment")
    assert env.title == "make the environment ~/venv anew"
    assert "its python does not run (another python made it, since removed or changed)" in env.reason
    assert env.command.startswith("rm -rf \"$HOME\"/venv && ") or env.command.startswith("rm -rf ~/venv && ") \
        or "rm -rf" in env.command.split("&&")[0], env.command
    assert plan.cannot is None


def test_a_folder_that_is_no_venv_is_refused():
    f = facts({"requirements.txt": "six\n"}, env="env_python=0\nenv_stale=other")
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert plan.cannot and "~/venv exists on the host and is not a virtual environment" in plan.cannot
    assert not any("rm -rf" in s.command for s in plan.steps)


def test_setup_over_an_environment_another_python_made(sandbox, gpuops, tmp_path):
    from gpuops.sandbox import image
    from support.envs import LOCAL_INDEX, home, set_profile

    other = image.build(tmp_path / "pyenv-3.x")  # another python installation, removed afterwards
    env = home(sandbox) / "senv-stale"
    shutil.rmtree(env, ignore_errors=True)
    import subprocess

    subprocess.run([str(other), "-m", "venv", "--without-pip", str(env)], check=True)
    shutil.rmtree(tmp_path / "pyenv-3.x")  # `pyenv uninstall`: the environment's python is gone
    set_profile(sandbox, python="~/senv-stale/bin/python", setup={"index_url": LOCAL_INDEX, "install_uv": False})
    Path("requirements.txt").write_text("six==1.17.0\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 0, r.all
    assert "make the environment ~/senv-stale anew" in r.out, r.out
    r = gpuops("setup", "sandbox", "--no-verify")
    assert r.code == 0, r.all
    assert "ensurepip" not in r.all and "already exists" not in r.all
    assert subprocess.run([str(env / "bin" / "python"), "-c", "import six"]).returncode == 0
    (env / "pyvenv.cfg").unlink()  # a folder that is no environment: never removed
    (env / "bin" / "python").unlink()
    (env / "mine.txt").write_text("keep\n")
    r = gpuops("setup", "sandbox", "--dry-run")
    assert "CANNOT START: ~/senv-stale exists on the host and is not a virtual environment" in r.out, r.all
    r = gpuops("setup", "sandbox", "--no-verify")
    assert r.code == 1 and "is not a virtual environment" in r.err and "move it away" in r.err, r.all
    assert (env / "mine.txt").is_file()
