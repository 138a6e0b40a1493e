"""Issue #36: `gpuops setup -p sandbox` works on the default sandbox, as quickstart-lambda.md says every step does
with `-p sandbox`: `sandbox up` writes no `python:` (as `gpuops up` and `sandbox up --image` write none), so setup
makes its own environment and records it, instead of exit 2 with a hint to edit a profile `sandbox up` rewrites.
A profile `sandbox up --python python3` wrote still refuses, with a hint about `sandbox up`, not the file."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from support.envs import LOCAL_INDEX, home


def test_setup_on_the_default_sandbox(sandbox, gpuops, isolated):
    from gpuops.sandbox import host

    assert gpuops("sandbox", "up").code == 0  # as a user starts it: the default profile
    data = yaml.safe_load(sandbox["profile"].read_text())
    assert "python" not in data, data  # python3 by default everywhere; setup's own environment for setup
    data["setup"] = {"index_url": LOCAL_INDEX}  # this machine's local index (no network)
    sandbox["profile"].write_text(yaml.safe_dump(data))
    shutil.rmtree(home(sandbox) / ".venvs" / "gpuops", ignore_errors=True)
    Path("requirements.txt").write_text("six==1.17.0\n")
    Path("train.py").write_text("import six, sys\nprint('six', six.__version__, sys.executable)\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "-p", "sandbox", "--no-verify")
    assert r.code == 0, r.all
    assert yaml.safe_load(sandbox["profile"].read_text())["python"] == "~/.venvs/gpuops/bin/python"
    from support.runs import run_dir, run_id_of, wait_ended

    r = gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot")
    rid = run_id_of(r)
    assert wait_ended(sandbox, rid) == 0
    assert "six 1.17.0" in (run_dir(sandbox, rid) / "log").read_text()
    host.up()  # the fixture's state again for the next test


def test_a_sandbox_profile_naming_python3_says_how_to_change_it(sandbox, gpuops):
    assert gpuops("sandbox", "up", "--python", "python3").code == 0
    assert yaml.safe_load(sandbox["profile"].read_text())["python"] == "python3"
    r = gpuops("setup", "-p", "sandbox", "--dry-run")
    assert r.code == 2 and "installs nothing into a system Python" in r.err, r.all
    assert "gpuops sandbox up" in r.err and "rewrites" in r.err and "without --python" in r.err, r.err
    from gpuops.sandbox import host

    host.up()
