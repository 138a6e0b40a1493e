"""Issue #8's medium and low items, each through the sandbox: variable names never run as commands, remote_dir
never runs inside launch.sh, `train` says launched only when the job started, the unexpected-error fallback, two
trains at once, W&B's warning once, status's script column."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.runs import FOREVER, kill_run_groups, put, remote_project


def _profile(sandbox, name: str, **over) -> Path:
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.update(over)
    p = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.fixture
def kill_runs(sandbox):
    yield
    runs = remote_project(sandbox) / ".gpuops" / "runs"
    kill_run_groups(runs.iterdir() if runs.is_dir() else [])


@pytest.mark.parametrize("key, value", [("env", {"X; touch PWNED #": "1"}), ("env", {"1BAD": "1"}),
                                         ("secrets", ["A$(touch PWNED)"])])
def test_bad_variable_names_in_a_profile_are_exit_2(sandbox, gpuops, key, value):
    f = _profile(sandbox, "badenv", **{key: value})
    put(sandbox, "job.py", "print(1)\n")
    r = gpuops("train", "-p", "badenv", "--script", "job.py", "--no-snapshot")
    assert r.code == 2, r.all
    assert str(f) in r.err and f"{key}" in r.err and "not a variable name" in r.err
    assert not any(Path(sandbox["dir"]).rglob("PWNED"))


def test_bad_variable_name_in_a_preset_is_exit_2(sandbox, gpuops):
    pb = Path.cwd() / "playbooks"
    pb.mkdir()
    (pb / "presets.yaml").write_text("presets:\n  h100:\n    env:\n      'A=1; touch PWNED; B': {value: '1'}\n")
    put(sandbox, "job.py", "print(1)\n")
    r = gpuops("train", "--script", "job.py", "--no-snapshot", "-p", "sandbox")
    assert r.code == 2, r.all
    assert "presets.yaml" in r.err and "presets.h100.env" in r.err and "not a variable name" in r.err
    assert not any(Path(sandbox["dir"]).rglob("PWNED"))


def test_hostile_remote_dir_never_runs_and_train_is_not_launched(sandbox, gpuops, kill_runs):
    _profile(sandbox, "evil", remote_dir='~/no"such$(touch PWNED)`touch PWNED2`')
    (Path.cwd() / "job.py").write_text("print(1)\n")
    r = gpuops("train", "-p", "evil", "--script", "job.py", "--no-sync", "--force", "--no-snapshot")
    assert not any(Path(sandbox["dir"]).rglob("PWNED*"))
    # the script is not there: refused before launching, or (with the folder created) not started; never "launched"
    assert r.code in (1, 2) and "launched" not in r.err.replace("not launched", ""), r.all


def test_train_reports_a_launcher_that_never_reached_the_job(sandbox, gpuops, kill_runs):
    home = Path(sandbox["dir"]) / "home"
    d = home / f"{Path.cwd().name}-gone"
    d.mkdir()
    (d / "job.py").write_text("print(1)\n")
    _profile(sandbox, "gone", remote_dir=f"~/{d.name}")

    orig = None
    import gpuops.jobs.scripts as rl

    def no_cd(**kw):  # the project folder vanishes between the preflight and the job
        text = orig(**kw)
        return text.replace("if cd ", "if false && cd ", 1)

    orig, rl.launcher_script = rl.launcher_script, no_cd
    try:
        r = gpuops("train", "-p", "gone", "--script", "job.py", "--no-sync", "--no-snapshot")
    finally:
        rl.launcher_script = orig
    assert r.code == 1 and "did not start" in r.err and "cannot enter the project folder" in r.err, r.all
    assert "launched" not in r.err.replace("not launched", "")


def test_unexpected_error_is_one_line_and_exit_1(sandbox, gpuops, monkeypatch):
    import gpuops.jobs.actions as lc

    def boom(*a, **k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(lc, "status", boom)
    r = gpuops("status", "-p", "sandbox")
    assert r.code == 1 and "internal error: RuntimeError: boom" in r.err and "Traceback" not in r.all
    assert "--debug" in r.err
    r = gpuops("--debug", "status", "-p", "sandbox")
    assert r.code == 1 and "Traceback" in r.err


def test_non_utf8_profile_is_exit_2_naming_the_file(sandbox, gpuops):
    f = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "latin.yaml"
    f.write_bytes(b"host: 127.0.0.1\n# caf\xe9\n")
    r = gpuops("verify", "latin")
    assert r.code == 2 and str(f) in r.err and "not UTF-8" in r.err and "Traceback" not in r.all


def _train_cli(extra=()):
    return subprocess.Popen([sys.executable, "-m", "gpuops", "train", "-p", "sandbox", "--script", "forever.py",
                             "--no-sync", "--no-snapshot", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "NO_COLOR": "1"})


def test_two_trains_at_the_same_moment_launch_once(sandbox, gpuops, kill_runs):
    put(sandbox, "forever.py", FOREVER)
    for attempt in range(4):
        procs = [_train_cli(["--name", f"a{attempt}"]), _train_cli(["--name", f"b{attempt}"])]
        outs = [p.communicate(timeout=120) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 1], (codes, outs)
        loser = outs[[p.returncode for p in procs].index(1)][1]
        assert "another gpuops run is still running" in loser
        assert gpuops("stop", "-p", "sandbox", "--grace", "0.5").code == 0
        r = gpuops("status", "-p", "sandbox", "--json")
        assert not [x for x in json.loads(r.out)["runs"] if x["state"] == "running"], r.out


def test_status_shows_the_whole_script_path(sandbox, gpuops, kill_runs):
    put(sandbox, "scripts/train/run_h100_multisignal.py", "print(1)\n")
    r = gpuops("train", "-p", "sandbox", "--script", "scripts/train/run_h100_multisignal.py", "--no-sync",
               "--no-snapshot")
    assert r.code == 0, r.all
    r = gpuops("status", "-p", "sandbox")
    assert "scripts/train/run_h100_multisignal.py" in r.out


def test_wandb_failure_is_warned_once(sandbox, gpuops, monkeypatch, kill_runs):
    """The W&B library's failure (here: the error log_to_wandb raises for any exception of wandb's) reaches the
    user as one warning, not 'W&B logging failed: W&B logging failed: ...'."""
    import gpuops.transfer.snapshot as snap
    from gpuops.errors import GpuopsError

    def fails(*a, **k):
        raise GpuopsError("W&B logging failed: CommError: 127.0.0.1 refused the connection")

    monkeypatch.setattr(snap, "log_to_wandb", fails)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    put(sandbox, "job.py", "print(1)\n")
    r = gpuops("train", "-p", "sandbox", "--script", "job.py", "--no-sync")
    assert r.code == 0, r.all
    assert r.err.count("W&B logging failed") == 1 and "CommError" in r.err


def test_a_run_being_launched_is_running_to_another_trains_preflight(sandbox, gpuops, kill_runs):
    """Between a launch registering its run (~/.gpuops/active/<id>) and its launcher writing the pid, the launch lock
    is held: another `train`'s preflight must count that run as running (not unlist it, which let a second launch
    through, nor call its GPU process 'left over from a run which is not running'). A registration with no pid and
    no lock is a crashed launch's: unlisted."""
    put(sandbox, "forever.py", FOREVER)
    home = sandbox["dir"] / "home"
    rd = home / "launching-run"
    rd.mkdir()
    active = home / ".gpuops" / "active"
    active.mkdir(parents=True, exist_ok=True)
    (active / "train-20260101-000000-beef").write_text(f"{rd}\n")
    lock = home / ".gpuops" / "launch.lock"
    lock.mkdir()
    try:
        r = gpuops("train", "-p", "sandbox", "--script", "forever.py", "--no-sync", "--no-snapshot")
        assert r.code == 1 and "another gpuops run is still running on the host: train-20260101-000000-beef" in r.err, \
            r.all
        assert (active / "train-20260101-000000-beef").exists()
    finally:
        lock.rmdir()
    r = gpuops("train", "-p", "sandbox", "--script", "forever.py", "--no-sync", "--no-snapshot")
    assert r.code == 0, r.all  # no lock: the registration was a crashed launch's
    assert not (active / "train-20260101-000000-beef").exists()
