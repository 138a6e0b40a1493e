"""Issue #36: profiles of terminated instances (`cloud: state: gone`, what `down`, `reap` and finished `gpuops run`s
leave for their history) are not candidates for the default profile: after four runs ended, a plain `gpuops train`
in another project said "which profile? found 5" and exited 2."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuops.errors import ProfileError
from gpuops.profiles import model as profiles


def _write(name: str, gone: bool = False) -> Path:
    d = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    text = f"host: 10.0.0.{len(list(d.iterdir())) + 1}\nuser: ubuntu\n"
    if gone:
        text += f"cloud:\n  provider: lambda\n  instance_id: i-{name}\n  launch_id: L-{name}\n  state: gone\n"
    (d / f"{name}.yaml").write_text(text)
    return d / f"{name}.yaml"


def test_finished_runs_profiles_are_not_candidates(isolated):
    for i in range(4):
        _write(f"run-2026011{i}-h100", gone=True)
    _write("mybox")
    prof = profiles.resolve(None, isolated)
    assert prof.name == "mybox"
    assert profiles.selected_how(None, prof, isolated) == "the only one"


def test_only_terminated_profiles_say_so(isolated):
    for i in range(2):
        _write(f"run-{i}", gone=True)
    with pytest.raises(ProfileError) as e:
        profiles.resolve(None, isolated)
    assert "which profile? found 0: none" in e.value.message
    assert "not counted: 2 of terminated instances (run-0, run-1; `gpuops profiles prune` removes them)" \
        in e.value.message, e.value.message


def test_two_live_ones_still_ask_and_a_gone_one_given_by_name_still_loads(isolated):
    _write("a")
    _write("b")
    _write("old", gone=True)
    with pytest.raises(ProfileError) as e:
        profiles.resolve(None, isolated)
    assert "found 2: a, b" in e.value.message and "old" in e.value.message
    assert profiles.resolve("old", isolated).name == "old"  # its history stays reachable


def test_a_plain_train_in_another_project_picks_the_live_one(gpuops, sandbox, isolated):
    for i in range(4):
        _write(f"run-2026011{i}-h100", gone=True)
    r = gpuops("status")
    assert r.code == 0, r.all
    assert "profile: sandbox (the only one" in r.err, r.err
