"""Issue #29: every command that talks to a host says which profile on its first line, and naming another profile
once (`verify OTHER`) no longer moves where the next `train` and `fetch` go: only `gpuops profiles use NAME` does."""
from __future__ import annotations

import os
from pathlib import Path

import yaml


def copy_profile(sandbox, name: str) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(data))


def marked(out: str) -> list[str]:
    return [ln.split()[0] for ln in out.splitlines() if ln.endswith("(default here)")]


def first_line(r) -> str:
    return r.err.splitlines()[0] if r.err else ""


def test_naming_another_profile_once_does_not_move_the_default(sandbox, gpuops):
    copy_profile(sandbox, "other")
    r = gpuops("status", "-p", "sandbox")
    assert r.code == 0, r.all
    assert first_line(r) == "profile: sandbox (given; the default here once this succeeds)", r.err
    r = gpuops("status")
    assert r.code == 0 and first_line(r) == "profile: sandbox (the default here)", r.err
    r = gpuops("verify", "other", "--no-save")
    assert r.code in (0, 1), r.all
    assert first_line(r) == ("profile: other (given; the default here stays 'sandbox', `gpuops profiles use other` "
                             "changes it)"), r.err
    r = gpuops("status")  # where the next train and fetch go: still sandbox
    assert first_line(r) == "profile: sandbox (the default here)", r.err
    assert marked(gpuops("profiles").out) == ["sandbox"]
    # only when asked, and said
    r = gpuops("profiles", "use", "other")
    assert r.code == 0 and "default profile here: 'other' (was 'sandbox')" in r.err, r.all
    r = gpuops("sync")
    assert r.code == 0 and first_line(r) == "profile: other (the default here)", r.err
    assert gpuops("profiles", "use", "nosuch").code == 2
    assert marked(gpuops("profiles").out) == ["other"]


def test_the_profile_line_is_first_on_every_command_that_talks_to_a_host(sandbox, gpuops):
    Path("train.py").write_text("print('step 1 loss 0.5')\n")
    for argv in (["sync"], ["status"], ["fetch", "--list"], ["verify", "--no-save"], ["train", "--script", "train.py"],
                 ["ssh", "--", "true"]):
        r = gpuops(*argv)
        assert first_line(r) .startswith("profile: sandbox ("), (argv, r.err)
    r = gpuops("status", "--json")  # on stderr: stdout stays one document
    assert r.out.lstrip().startswith(("{", "[")) and first_line(r).startswith("profile: sandbox")
    assert gpuops("profiles", "show").err == ""  # a command that only shows the profile says nothing more
