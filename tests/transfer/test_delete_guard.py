"""sync --delete never targets `/`, the remote home, an ancestor of it or a system folder, however remote_dir is
spelled (through the sandbox's real sshd and rsync); an explicitly empty remote_dir is a profile error (#8.3)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpuops.transfer.plan import unsafe_delete_target

HOME = "/home/ubuntu"


@pytest.mark.parametrize("remote_dir, real", [
    ("~", ""), ("~/", ""), (".", ""), ("~/..", ""), ("/", ""), ("$HOME", ""), ("${HOME}/", ""), ("~/proj/../", ""),
    ("//", ""), ("/home", ""), ("/etc/", ""), ("/usr", ""), ("/tmp", ""), ("/lib64", ""), ("/root", ""),
    ("~/link", HOME), ("~/link", "/"), ("~/p", "/etc"),
])
def test_refused(remote_dir, real):
    assert unsafe_delete_target(remote_dir, home=HOME, real=real)


@pytest.mark.parametrize("remote_dir, real", [
    ("~/proj", ""), ("~/proj", f"{HOME}/proj"), ("proj", ""), ("/tmp/x", ""), ("/data/run1", ""),
    ("/opt/work/proj", "/opt/work/proj"), ("~/a/b/..", f"{HOME}/a"),
])
def test_allowed(remote_dir, real):
    assert unsafe_delete_target(remote_dir, home=HOME, real=real) is None


def _profile(sandbox, name: str, remote_dir) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["remote_dir"] = remote_dir
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))


@pytest.fixture
def home_with_secrets(sandbox):
    home = Path(sandbox["dir"]) / "home"
    ssh = home / ".ssh"
    ssh.mkdir(exist_ok=True)
    (ssh / "authorized_keys").write_text("ssh-ed25519 AAAA keep-me\n")
    link = home / "link-to-home"
    if not link.is_symlink():
        link.symlink_to(home)
    yield home
    assert (ssh / "authorized_keys").read_text() == "ssh-ed25519 AAAA keep-me\n"


@pytest.mark.parametrize("remote_dir", ["~/", ".", "~/..", "/", "$HOME", "~/link-to-home", "/tmp", "/etc"])
def test_sync_delete_refused_end_to_end(sandbox, gpuops, home_with_secrets, remote_dir):
    (Path.cwd() / "train.py").write_text("print(1)\n")
    _profile(sandbox, "danger", remote_dir)
    for extra in (["--dry-run"], []):
        r = gpuops("sync", "-p", "danger", "--delete", *extra)
        assert r.code == 2, r.all
        assert "refusing sync --delete" in r.err
    assert not (home_with_secrets / "train.py").exists()  # nothing was sent there either


def test_sync_delete_into_the_project_folder_still_works(sandbox, gpuops, home_with_secrets):
    (Path.cwd() / "train.py").write_text("print(1)\n")
    _profile(sandbox, "fine", f"~/{Path.cwd().name}-proj")
    assert gpuops("sync", "-p", "fine").code == 0
    stale = home_with_secrets / f"{Path.cwd().name}-proj" / "stale.txt"
    stale.write_text("x")
    r = gpuops("sync", "-p", "fine", "--delete")
    assert r.code == 0, r.all
    assert not stale.exists() and (stale.parent / "train.py").exists()


@pytest.mark.parametrize("text", ["remote_dir: ~\n", "remote_dir: ''\n", "remote_dir:\n"])
def test_explicitly_empty_remote_dir_is_a_profile_error(sandbox, gpuops, text):
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.pop("remote_dir", None)
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "empty.yaml"
    path.write_text(yaml.safe_dump(data) + text)
    r = gpuops("sync", "-p", "empty", "--delete")
    assert r.code == 2 and "remote_dir: is empty" in r.err and "empty.yaml" in r.err


def test_gpuops_own_files_are_never_synced_nor_deleted(sandbox, gpuops, home_with_secrets):
    """#8.9: a value typed into a profile never lands on the host in a 0644 file; nor do verify's reports."""
    proj = Path.cwd()
    (proj / "train.py").write_text("print(1)\n")
    (proj / "profiles").mkdir()
    (proj / "profiles" / "lambda.yaml").write_text("host: 1.2.3.4\nenv: {HF_TOKEN: hf_secret_typed_here}\n")
    (proj / "profiles" / "other.yml").write_text("host: 1.2.3.5\n")
    (proj / "profiles" / "notes.txt").write_text("my own file\n")
    (proj / "logs" / "env_checks").mkdir(parents=True)
    (proj / "logs" / "env_checks" / "report.json").write_text("{}")
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["sync"] = {"exclude": []}  # not even the default `logs` exclusion
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "nolog.yaml").write_text(yaml.safe_dump(data))
    remote = home_with_secrets / proj.name
    (remote / "profiles").mkdir(parents=True)
    (remote / "profiles" / "kept.yaml").write_text("remote's own\n")
    r = gpuops("sync", "-p", "nolog", "--delete")
    assert r.code == 0, r.all
    assert (remote / "train.py").exists() and (remote / "profiles" / "notes.txt").exists()
    assert not (remote / "profiles" / "lambda.yaml").exists() and not (remote / "profiles" / "other.yml").exists()
    assert not (remote / "logs" / "env_checks").exists()
    assert (remote / "profiles" / "kept.yaml").read_text() == "remote's own\n"  # not deleted either
    assert "hf_secret_typed_here" not in "".join(p.read_text(errors="replace") for p in remote.rglob("*")
                                                 if p.is_file())


# -- a ~name or a wildcard: rsync hands them to the remote shell unquoted (found after #8.3's first guard) ------------
@pytest.mark.parametrize("path, want", [
    ("~/x", "x"), ("~", "."), ("~/", "."), ("/srv/a*b", "/srv/a\\*b"), ("~root/x", "\\~root/x"), ("x[1]", "x\\[1]"),
    ("~/~a", "\\~a"), ("a\\b", "a\\\\b"), ("/opt/p?", "/opt/p\\?"), ("/data/run1", "/data/run1"),
])
def test_rsync_remote_path_escapes_what_the_remote_shell_would_expand(path, want):
    from gpuops.transfer.plan import rsync_remote_path

    assert rsync_remote_path(path) == want


@pytest.mark.parametrize("path, bad", [
    ("~ubuntu", True), ("~ubuntu/proj", True), ("~+", True), ("~-/x", True), ("/hom?/ubunt*", True),
    ("~/../hom[e]", True), ("~/proj", False), ("~", False), ("/data/run-1", False), ("proj", False),
])
def test_remote_dir_spelling(path, bad):
    from gpuops.remote.shell import remote_dir_spelling_problem

    assert bool(remote_dir_spelling_problem(path)) is bad


@pytest.mark.parametrize("remote_dir", ["~/../hom[e]", "~/../hom?", "~/../h*", "~ubuntu", "~+"])
def test_remote_dir_the_remote_shell_would_expand_is_a_profile_error(sandbox, gpuops, home_with_secrets, remote_dir):
    """`~/../hom[e]` is the home once the remote shell globs it, though no check saw it so: before, a dry run planned
    the home's deletions (authorized_keys included) and the real run made them."""
    (Path.cwd() / "train.py").write_text("print(1)\n")
    _profile(sandbox, "glob", remote_dir)
    for extra in (["--dry-run"], []):
        r = gpuops("sync", "-p", "glob", "--delete", *extra)
        assert r.code == 2, r.all
        assert "remote_dir:" in r.err and "glob.yaml" in r.err and "Traceback" not in r.err
    assert not (home_with_secrets / "train.py").exists()


def test_default_remote_dir_with_a_wildcard_reaches_that_very_folder(sandbox, gpuops, home_with_secrets, monkeypatch):
    """A project folder named `p[A]` syncs into ~/p[A] itself, never into ~/pA, which the remote shell's glob of an
    unescaped `p[A]` is (--delete emptied it before)."""
    proj = Path.cwd() / "p[A]"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(proj)
    other = home_with_secrets / "pA"
    other.mkdir()
    (other / "precious.txt").write_text("keep\n")
    _profile(sandbox, "wild", None)
    data = yaml.safe_load((Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "wild.yaml").read_text())
    data.pop("remote_dir")
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "wild.yaml").write_text(yaml.safe_dump(data))
    r = gpuops("sync", "-p", "wild", "--delete")
    assert r.code == 0, r.all
    assert (other / "precious.txt").read_text() == "keep\n" and not (other / "train.py").exists()
    assert (home_with_secrets / "p[A]" / "train.py").exists()
