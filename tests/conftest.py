"""Test fixtures: an isolated environment per test and ONE real sandbox host (sshd on 127.0.0.1) per session.

The sandbox is required: if sshd or rsync is missing, tests that need it FAIL (never skip).
"""
from __future__ import annotations

import io
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import distenv  # noqa: E402 - reads the real HOME now, before tests isolate it

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def all(self) -> str:
        return self.out + self.err


@pytest.fixture(scope="session")
def sandbox_base(tmp_path_factory):
    """Start the sandbox host once: its state lives in a session temp dir, never in the user's home."""
    from gpuops.sandbox import host

    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")):
        pytest.fail("sshd is not installed: the sandbox tests need openssh-server (.ci/run installs it)")
    base = tmp_path_factory.mktemp("gpuops-session")
    old = {k: os.environ.get(k) for k in ("GPUOPS_STATE_DIR", "GPUOPS_CONFIG_DIR")}
    os.environ["GPUOPS_STATE_DIR"] = str(base / "state")
    os.environ["GPUOPS_CONFIG_DIR"] = str(base / "config")
    st = host.up()
    yield {"base": base, "state_dir": base / "state", "dir": Path(st["dir"]), "port": st["port"], "user": st["user"]}
    host.down()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def dist_python():
    """A Python with CPU torch and Ray (tests/distenv.py: built once per machine, cached)."""
    return str(distenv.python())


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test: its own HOME, config dir (profiles, known_hosts) and project directory; plain output."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPUOPS_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("GPUOPS_PROFILE", "GPUOPS_DEBUG", "WANDB_API_KEY", "GPUOPS_FORCE_RICH"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / tmp_path.name  # unique name: the sandbox's remote dir defaults to ~/<this name>
    project.mkdir()
    monkeypatch.chdir(project)
    return project


@pytest.fixture
def sandbox(sandbox_base, monkeypatch, tmp_path):
    """The running sandbox host, with a fresh `sandbox` profile in this test's config dir (GPU state reset)."""
    from gpuops.sandbox import host

    monkeypatch.setenv("GPUOPS_STATE_DIR", str(sandbox_base["state_dir"]))
    st = host.up()  # already running: rewrites gpu.json to defaults and writes this test's profile
    assert st["port"] == sandbox_base["port"]
    return {**sandbox_base, "profile": host.profile_path()}


@pytest.fixture
def gpuops(capsys):
    """Run the CLI in-process: gpuops("verify", "sandbox") -> CliResult(code, out, err)."""
    from gpuops.cli import main

    def call(*args: str) -> CliResult:
        main.DEBUG = False
        capsys.readouterr()
        code = main.run(list(args))
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return call
