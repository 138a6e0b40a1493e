"""Shell completion through the real console script: commands, options, profile names, run ids and fetch names,
from local files only (no connection: paramiko is never imported), and the install/show scripts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("paramiko", "fabric", "wandb", "invoke")


def complete(words: str, shell: str = "bash", **env) -> tuple[list[str], set]:
    """What the shell would offer for `words` (a trailing space: a new word), and the top modules imported."""
    e = {**os.environ, "_GPUOPS_COMPLETE": f"complete_{shell}", **env}
    if shell == "bash":
        parts = words.split()
        e.update(COMP_WORDS=words, COMP_CWORD=str(len(parts) if words.endswith(" ") else len(parts) - 1))
    else:
        e["_TYPER_COMPLETE_ARGS"] = words
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "from gpuops.cli.main import run; run()"],
                       capture_output=True, text=True, env=e, stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    return p.stdout.split(), imported


def write_profile(path: Path, text: str = "host: 203.0.113.7\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_commands_and_options():
    got, _ = complete("gpuops ver")
    assert got == ["verify"]
    got, _ = complete("gpuops profiles ")
    assert {"new", "pin", "show"} <= set(got)
    got, _ = complete("gpuops profiles new box --fr")
    assert got == ["--from-host"]


def test_profile_names_from_every_folder_without_a_connection():
    write_profile(Path("profiles/alpha.yaml"))
    write_profile(Path("profiles/beta.yaml"))
    write_profile(Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "gamma.yaml")
    got, imported = complete("gpuops verify ")
    assert {"alpha", "beta", "gamma", "lambda-h100", "rtx6000ada-workstation"} <= set(got)
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert complete("gpuops verify al")[0] == ["alpha"]
    assert complete("gpuops sync -p b")[0] == ["beta"]
    assert complete("gpuops profiles pin g")[0] == ["gamma"]
    got, _ = complete("gpuops verify al", shell="zsh")
    assert "alpha" in " ".join(got) and "beta" not in " ".join(got)


def test_run_ids_from_the_local_record():
    for rid, prof in (("20261123-101500-train-a1b2", "alpha"), ("20261122-090000-eval-c3d4", "beta")):
        d = Path("runs") / rid
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"run_id": rid, "profile": prof, "started_ts": 1}))
    got, imported = complete("gpuops logs ")
    assert set(got) == {"20261123-101500-train-a1b2", "20261122-090000-eval-c3d4"}
    assert complete("gpuops watch -p alpha ")[0] == ["20261123-101500-train-a1b2"]
    assert complete("gpuops stop 2026112")[0] != []
    assert not imported & set(HEAVY)


def test_fetch_names_from_the_profile():
    write_profile(Path("profiles/alpha.yaml"), "host: 203.0.113.7\nfetch: {checkpoints: ckpt, backups: bk, logs: logs}\n")
    got, imported = complete("gpuops fetch -p alpha ")
    assert set(got) == {"checkpoints", "backups", "logs"}
    assert complete("gpuops fetch -p alpha b")[0] == ["backups"]
    assert complete("gpuops fetch -p nope ")[0] == []  # a bad profile: nothing offered, no error
    assert not imported & set(HEAVY)


@pytest.mark.parametrize("shell,words", [("bash", "complete -o default -F _gpuops_completion gpuops"),
                                         ("zsh", "compdef _gpuops_completion gpuops"),
                                         ("fish", "complete --command gpuops")])
def test_show_and_install_completion(shell, words, tmp_path):
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1", "HOME": str(tmp_path / "home")}
    gp = [sys.executable, "-c", "from gpuops.cli.main import run; run()"]
    p = subprocess.run(gp + ["--show-completion", shell], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and words in p.stdout, p.stdout + p.stderr
    p = subprocess.run(gp + ["--install-completion", shell], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and f"{shell} completion installed in" in p.stdout, p.stdout + p.stderr
    assert any(words in f.read_text() for f in (tmp_path / "home").rglob("*") if f.is_file())
