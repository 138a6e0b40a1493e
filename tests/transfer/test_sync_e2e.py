"""`gpuops sync` end to end: the real sandbox sshd and real rsync."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from pathlib import Path

from support.proxy import Proxy


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def remote_project(sandbox) -> Path:
    return Path(sandbox["dir"]) / "home" / Path.cwd().name


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_sync_copies_project_and_excludes_at_every_depth(sandbox, gpuops):
    here = Path.cwd()
    for rel in ["train.py", "src/pkg/model.py", "data/keep.txt", "src/pkg/__pycache__/model.cpython-311.pyc",
                "deep/a/b/__pycache__/q.pyc", "a/b/stray.pyc", "checkpoints/global_step_1/m.pt",
                "sub/dir/checkpoints/c.pt", ".git/HEAD", "outputs/o.txt", "wandb/run/w", ".venv/bin/python",
                "logs/l.txt", "sub/logs/l2.txt", "nested/wandb/x"]:
        write(here / rel)
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 0, r.all
    assert "files changed" in r.out
    assert tree(remote_project(sandbox)) == {"train.py", "src/pkg/model.py", "data/keep.txt"}


def test_gpuopsignore_exclude_option_and_gitignore(sandbox, gpuops):
    here = Path.cwd()
    write(here / ".gpuopsignore", "# comment\n\ndata/\n*.tmp\n!important.tmp\n/rootonly.txt\ndocs/build\n")
    for rel in ["main.py", "data/big.bin", "sub/data/big2.bin", "a.tmp", "sub/b.tmp", "important.tmp",
                "rootonly.txt", "sub/rootonly.txt", "docs/build/index.html", "x/docs/build/keep.html",
                "scratch/s.txt", "ignored_by_git.txt", "sub/also_git.log"]:
        write(here / rel)
    write(here / ".gitignore", "ignored_by_git.txt\n")
    write(here / "sub" / ".gitignore", "*.log\n")
    r = gpuops("sync", "-p", "sandbox", "--exclude", "scratch")
    assert r.code == 0, r.all
    got = tree(remote_project(sandbox))
    assert got == {".gpuopsignore", ".gitignore", "sub/.gitignore", "main.py", "important.tmp", "sub/rootonly.txt",
                   "x/docs/build/keep.html", "ignored_by_git.txt", "sub/also_git.log"}
    # .gitignore is honoured only on request
    r = gpuops("sync", "-p", "sandbox", "--gitignore", "--delete", "--exclude", "scratch")
    assert r.code == 0, r.all
    got = tree(remote_project(sandbox))
    assert "ignored_by_git.txt" in got  # excluded paths are never deleted, even with --delete
    assert "main.py" in got


def test_gitignore_excludes_new_files(sandbox, gpuops):
    here = Path.cwd()
    write(here / ".gitignore", "secret.txt\n")
    write(here / "sub" / ".gitignore", "*.log\n")
    for rel in ["main.py", "secret.txt", "sub/x.log", "sub/y.py"]:
        write(here / rel)
    r = gpuops("sync", "-p", "sandbox", "--gitignore")
    assert r.code == 0, r.all
    assert tree(remote_project(sandbox)) == {".gitignore", "sub/.gitignore", "main.py", "sub/y.py"}


def test_no_delete_by_default_and_delete_keeps_excluded_remote_folders(sandbox, gpuops):
    here = Path.cwd()
    write(here / "train.py")
    old = write(here / "old.py")
    assert gpuops("sync", "-p", "sandbox").code == 0
    rp = remote_project(sandbox)
    # what training produced on the remote
    for rel in ["checkpoints/global_step_5/model.pt", "outputs/eval.json", "logs/train.log", "wandb/run-1/files",
                "src/__pycache__/m.pyc", "sub/checkpoints/x.pt", ".gpuops/runs/r-1/meta.json", "runs/r-1/meta.json"]:
        write(rp / rel, "precious")
    write(here / "runs" / "r-1" / "meta.json", "local registry")  # gpuops' local run registry is never sent
    old.unlink()
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 0, r.all
    assert (rp / "old.py").exists()  # never deleted without --delete
    r = gpuops("sync", "-p", "sandbox", "--delete", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["deleted"] == 1 and {"change": "deleted", "kind": "file", "path": "old.py", "size": None} in doc["changes"]
    assert not (rp / "old.py").exists()
    for rel in ["checkpoints/global_step_5/model.pt", "outputs/eval.json", "logs/train.log", "wandb/run-1/files",
                "src/__pycache__/m.pyc", "sub/checkpoints/x.pt", ".gpuops/runs/r-1/meta.json", "runs/r-1/meta.json"]:
        assert (rp / rel).read_text() == "precious", rel


def test_dry_run_changes_nothing(sandbox, gpuops):
    here = Path.cwd()
    write(here / "a.py", "one")
    rp = remote_project(sandbox)
    r = gpuops("sync", "-p", "sandbox", "--dry-run")
    assert r.code == 0, r.all
    assert "a.py" in r.out and "nothing changed" in r.out
    assert not rp.exists()  # not even the remote directory
    assert gpuops("sync", "-p", "sandbox").code == 0
    write(here / "a.py", "two, longer")
    write(here / "b.py", "new")
    write(rp / "gone.py", "remote only")
    before = {p: (rp / p).read_text() for p in tree(rp)}
    r = gpuops("sync", "-p", "sandbox", "--dry-run", "--delete", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["dry_run"] is True
    changes = {c["path"]: c["change"] for c in doc["changes"]}
    assert changes == {"a.py": "updated", "b.py": "new", "gone.py": "deleted"}
    assert {p: (rp / p).read_text() for p in tree(rp)} == before


def test_json_summary_and_incremental_resync(sandbox, gpuops):
    here = Path.cwd()
    for i in range(20):
        write(here / f"pkg/m{i}.py", "print('hello')\n" * 200)
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["files"] == 20 and doc["total_bytes"] == 20 * 15 * 200 and doc["dry_run"] is False
    assert set(doc) >= {"files", "bytes_sent", "total_bytes", "duration_s", "changes", "remote_dir"}
    r = gpuops("sync", "-p", "sandbox", "--json")
    doc2 = json.loads(r.out)
    assert doc2["files"] == 0 and doc2["changes"] == []
    assert doc2["bytes_sent"] < doc["bytes_sent"] / 4


def test_sync_project_python_entry_point(sandbox):
    """The function `gpuops train` calls."""
    from gpuops.profiles import model as profiles
    from gpuops.console import Output
    from gpuops.remote.connection import connect
    from gpuops.transfer.sync import sync_project

    write(Path.cwd() / "train.py", "print(1)\n")
    write(Path.cwd() / "checkpoints/x.pt")
    prof = profiles.resolve("sandbox")
    with connect(prof, announce=lambda s: None) as remote:
        s = sync_project(prof, remote, Output(json_mode=True), Path.cwd())
        assert remote.exec_count == 1
    assert s["files"] == 1 and s["dry_run"] is False
    assert tree(remote_project(sandbox)) == {"train.py"}


def _proxy_profile(sandbox, port: int) -> str:
    """A profile `cut` reaching the sandbox through a proxy on `port`, its host key trusted."""
    from gpuops.profiles import model as profiles
    from gpuops.paths import config_dir
    from gpuops.remote.connection import connect

    src = Path(sandbox["profile"]).read_text()
    lines = [ln for ln in src.splitlines() if not ln.startswith("port:")] + [f"port: {port}"]
    write(config_dir() / "profiles" / "cut.yaml", "\n".join(lines) + "\n")
    with connect(profiles.resolve("cut"), announce=lambda s: None):  # trust [127.0.0.1]:port
        pass
    return "cut"


def test_sync_resumes_after_the_connection_is_cut(sandbox, gpuops):
    """Cut every connection once half of a large file has arrived: the retry continues from the partial file
    (rsync's --partial-dir) instead of sending it again, and the remote ends up complete and identical."""
    here, rp = Path.cwd(), remote_project(sandbox)
    size = 8_000_000
    big = write(here / "data/big.bin")
    big.write_bytes(os.urandom(size))
    for i in range(5):
        write(here / f"src/m{i}.py", f"print({i})\n" * 100)
    proxy = Proxy(sandbox["port"], delay=0.002)  # slow enough to cut in the middle of the upload
    cut = threading.Event()

    def cut_at_half() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for tmp in (rp / "data").glob(".big.bin.*"):  # rsync's temporary file while receiving
                try:
                    if tmp.stat().st_size >= size // 2:
                        proxy.cut_all()
                        cut.set()
                        return
                except OSError:
                    pass
            time.sleep(0.005)

    try:
        name = _proxy_profile(sandbox, proxy.port)
        watcher = threading.Thread(target=cut_at_half, daemon=True)
        watcher.start()
        r = gpuops("sync", "-p", name, "--json")
        watcher.join(timeout=1)
    finally:
        proxy.close()
    assert r.code == 0, r.all
    assert cut.is_set(), "the upload was never cut"
    doc = json.loads(r.out)
    assert doc["attempts"] >= 2 and "retrying, continuing from what arrived" in r.err
    assert doc["bytes_sent"] < size * 0.75  # the last attempt sent only the rest, not the whole file again
    assert tree(rp) == tree(here)
    for rel in tree(here):
        assert (rp / rel).read_bytes() == (here / rel).read_bytes(), rel
    assert not list(rp.rglob(".gpuops-rsync-partial")) and not list(rp.rglob(".big.bin.*"))


def _wrong_host_key(sandbox, tmp_path) -> None:
    from gpuops.paths import known_hosts_file

    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, b64 = key.with_suffix(".pub").read_text().split()[:2]
    kh = known_hosts_file()
    kh.parent.mkdir(parents=True, exist_ok=True)
    kh.write_text(f"[127.0.0.1]:{sandbox['port']} {kind} {b64}\n")


def test_changed_host_key_refused(sandbox, gpuops, tmp_path):
    write(Path.cwd() / "a.py")
    _wrong_host_key(sandbox, tmp_path)
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 3, r.all
    assert "host key" in r.err.lower()
    assert "Traceback" not in r.all
    assert not remote_project(sandbox).exists()


def test_dry_run_into_missing_parent_folders(sandbox, gpuops):
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + f"remote_dir: ~/not/yet/{Path.cwd().name}\n")
    here = Path.cwd()
    write(here / "a.py", "one")
    write(here / "pkg/sub/b.py", "two")
    home = Path(sandbox["dir"]) / "home"
    for args in (("--dry-run",), ("--dry-run", "--delete")):
        r = gpuops("sync", "-p", "sandbox", *args, "--json")
        assert r.code == 0, r.all
        doc = json.loads(r.out)
        assert doc["remote_dir"] == f"~/not/yet/{here.name}" and doc["dry_run"] is True
        assert {(c["path"], c["change"]) for c in doc["changes"] if c["kind"] == "file"} == {("a.py", "new"),
                                                                                            ("pkg/sub/b.py", "new")}
        assert not (home / "not").exists()  # not even the parents
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 0, r.all
    assert tree(home / "not/yet" / here.name) == {"a.py", "pkg/sub/b.py"}


def bin_dir(path: Path, tools: dict[str, str]) -> Path:
    """A directory of symlinks {name: target}: a PATH holding exactly these commands."""
    path.mkdir(parents=True)
    for name, target in tools.items():
        (path / name).symlink_to(target)
    return path


def test_rsync_missing_locally(sandbox, gpuops, tmp_path, monkeypatch):
    write(Path.cwd() / "a.py")
    write(remote_project(sandbox) / "checkpoints/m.pt", "m")
    tools = {t: shutil.which(t) for t in ("ssh", "ssh-keygen", "sh")}
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path / "bin", tools)))
    for args in (["sync"], ["sync", "--dry-run"], ["fetch"]):
        r = gpuops(*args, "-p", "sandbox")
        assert r.code == 1, r.all
        assert r.err.count("error:") == 1 and "Traceback" not in r.all
        assert "error: rsync is not installed on this machine" in r.err
        assert re.search(r"hint: install it: \S.* rsync\n", r.err), r.err
        assert "host key" not in r.err  # stopped before connecting
    assert not (remote_project(sandbox) / "a.py").exists()
    assert not (Path.cwd() / "checkpoints").exists()
    r = gpuops("fetch", "-p", "sandbox", "--list")  # listing needs no rsync
    assert r.code == 0 and "checkpoints:" in r.out, r.all


def test_rsync_too_old_locally(sandbox, gpuops, tmp_path, monkeypatch):
    """macOS ships rsync 2.6.9 (or openrsync), which lacks --info=progress2: one clear message, not an rsync error."""
    write(Path.cwd() / "a.py")
    fake = tmp_path / "old" / "rsync"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'rsync  version 2.6.9  protocol version 29'\n")
    fake.chmod(0o755)
    tools = {t: shutil.which(t) for t in ("ssh", "ssh-keygen", "sh")}
    tools["rsync"] = str(fake)
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path / "bin", tools)))
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 1 and "is 2.6.9; gpuops needs rsync >= 3.1.0" in r.err and "hint: install a current rsync" in r.err
    assert not (remote_project(sandbox) / "a.py").exists()


def test_rsync_missing_on_the_remote(sandbox, gpuops, tmp_path, monkeypatch):
    """The sandbox session's PATH is the one `host.up()` sees: restart it with what gpuops' remote commands use
    (sh, mkdir, df, tail, python3) but no rsync, then restore the normal one."""
    from gpuops.sandbox import host

    write(Path.cwd() / "a.py")
    write(remote_project(sandbox) / "checkpoints/m.pt", "m")
    tools = {t: shutil.which(t) for t in ("sh", "mkdir", "df", "tail")}
    tools["python3"] = os.path.realpath(sys.executable)
    normal = os.environ["PATH"]
    try:
        monkeypatch.setenv("PATH", str(bin_dir(tmp_path / "remote-bin", tools)))
        host.up()
        monkeypatch.setenv("PATH", normal)
        for args in (["sync"], ["sync", "--dry-run"], ["sync", "--delete"], ["fetch"], ["fetch", "--latest"]):
            r = gpuops(*args, "-p", "sandbox")
            assert r.code == 1, r.all
            assert r.err.count("error:") == 1 and "Traceback" not in r.all
            assert "error: rsync is not installed on 127.0.0.1" in r.err
            assert "hint: install it on 127.0.0.1: sudo apt-get install -y rsync" in r.err
        assert tree(remote_project(sandbox)) == {"checkpoints/m.pt"}
        assert not (Path.cwd() / "checkpoints").exists()
    finally:
        monkeypatch.setenv("PATH", normal)
        host.up()
    r = gpuops("sync", "-p", "sandbox")  # the normal sandbox is back
    assert r.code == 0, r.all


def test_unknown_profile_is_usage_error(sandbox, gpuops):
    r = gpuops("sync", "-p", "nope")
    assert r.code == 2


def test_remote_dir_with_shell_characters_reaches_rsync_literally(sandbox, gpuops, monkeypatch):
    """rsync's remote path passes through the host's shell unless rsync protects it: with an rsync older than 3.2.4
    (or RSYNC_OLD_ARGS=1, which newer ones honour) a `$(...)` in remote_dir ran on the host and a space split the
    path. gpuops passes --protect-args, so the folder is created literally and nothing runs."""
    import yaml

    monkeypatch.setenv("RSYNC_OLD_ARGS", "1")
    home = Path(sandbox["dir"]) / "home"
    marker = home / "pwned"
    marker.unlink(missing_ok=True)
    odd = "proj $(touch ~/pwned) x"
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["remote_dir"] = f"~/{odd}"
    sandbox["profile"].write_text(yaml.safe_dump(data))
    write(Path.cwd() / "train.py", "print(1)\n")
    try:
        r = gpuops("sync", "-p", "sandbox")
        assert r.code == 0, r.all
        assert not marker.exists(), "a $(...) in remote_dir ran on the host"
        assert (home / odd / "train.py").read_text() == "print(1)\n"
    finally:
        marker.unlink(missing_ok=True)
        shutil.rmtree(home / odd, ignore_errors=True)


# -- one OpenSSH connection for the whole command (issue 23) ----------------------------------------------------------
def _ssh_masters(folder: Path) -> list[int]:
    """Live ssh processes whose command line names a control socket under `folder`."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            zombie = (p / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and f"ControlPath={folder}" in cmd:
            found.append(int(p.name))
    return found


def test_sync_makes_one_ssh_connection_rsync_and_its_checks_share(sandbox, gpuops):
    """`gpuops sync` used to open a connection of its own for the checks, then rsync opened another. Now one OpenSSH
    connection carries the whole command, with --delete too (its guard runs before rsync, on the same connection)."""
    here = Path.cwd()
    write(here / "train.py", "print(1)\n")
    proxy = Proxy(sandbox["port"])
    try:
        name = _proxy_profile(sandbox, proxy.port)  # trusts the host key through the proxy (one connection)
        for args in ((), ("--delete",)):
            before = proxy.connections
            r = gpuops("sync", "-p", name, *args)
            assert r.code == 0, r.all
            assert proxy.connections - before == 1, args
    finally:
        proxy.close()
    assert (remote_project(sandbox) / "train.py").read_text() == "print(1)\n"


def test_the_shared_connection_lives_in_a_private_folder_and_is_gone_after(sandbox, short_tmp, monkeypatch):
    """The master's control socket is in a folder of its own (0700); close() ends the master and removes the folder.
    A plain sync runs its checks on rsync's remote side: no remote execution of gpuops' own; --delete runs them (the
    guard) as one execution before rsync."""
    import tempfile

    from gpuops.console import Output
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect, shared
    from gpuops.transfer.sync import sync_project

    tmp = short_tmp  # the control socket's path must fit a Unix socket's 104 bytes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    prof = profiles.resolve("sandbox")
    connect(prof, announce=lambda s: None).close()  # trust the host key
    write(Path.cwd() / "train.py", "print(1)\n")
    with shared(prof, announce=lambda s: None) as remote:
        folder = remote.folder
        assert folder.parent == tmp and (folder.stat().st_mode & 0o777) == 0o700
        assert (folder / "m").is_socket() and _ssh_masters(folder)
        s = sync_project(prof, remote, Output(json_mode=True), Path.cwd())
        assert s["files"] == 1 and remote.exec_count == 0
        s = sync_project(prof, remote, Output(json_mode=True), Path.cwd(), delete=True)
        assert s["files"] == 0 and remote.exec_count == 1
        res = remote.run(f"cat {Path.cwd().name}/train.py; echo err >&2; exit 7", timeout=30)
        assert (res.rc, res.stdout, res.stderr) == (7, "print(1)\n", "err\n")
    assert not folder.exists() and list(tmp.iterdir()) == []
    deadline = time.monotonic() + 10
    while _ssh_masters(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _ssh_masters(folder)


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)  # no blocks written: its size is what the disk check reads
    os.utime(path, (1_700_000_000, 1_700_000_000))
    return path


def test_a_sync_the_remote_disk_cannot_hold_is_refused_before_anything_is_sent(sandbox, gpuops):
    """The checks on rsync's remote side stop it when the free disk is short of the upper bound; the exact amount
    (a dry run) then decides, as before: here it does not fit either."""
    here = Path.cwd()
    write(here / "train.py")
    free = shutil.disk_usage(Path(sandbox["dir"]) / "home").free
    _sparse(here / "data" / "huge.bin", free + (1 << 40))
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 1, r.all
    assert r.err.count("error:") == 1 and "error: not enough disk on 127.0.0.1: the sync needs" in r.err
    assert "free space on the instance, or add large folders to .gpuopsignore" in r.err
    assert tree(remote_project(sandbox)) == set()  # the folder was made, nothing was sent


def test_a_sync_whose_upper_bound_does_not_fit_but_whose_changes_do_goes_ahead(sandbox, gpuops):
    """The remote already holds the huge file (same size and time): only the small change is sent."""
    here = Path.cwd()
    write(here / "train.py", "print(1)\n")
    size = shutil.disk_usage(Path(sandbox["dir"]) / "home").free + (1 << 40)
    _sparse(here / "data" / "huge.bin", size)
    _sparse(remote_project(sandbox) / "data" / "huge.bin", size)
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert [c["path"] for c in doc["changes"] if c["kind"] == "file"] == ["train.py"]
    assert (remote_project(sandbox) / "train.py").read_text() == "print(1)\n"


def test_a_remote_folder_that_cannot_be_made_is_one_clear_error(sandbox, gpuops):
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "remote_dir: /proc/gpuops-cannot-be-here\n")
    write(Path.cwd() / "a.py")
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 1, r.all
    assert r.err.count("error:") == 1 and "Traceback" not in r.all
    assert "error: cannot create the remote directory /proc/gpuops-cannot-be-here: mkdir:" in r.err


def test_strict_host_key_policy_and_a_wrong_key_are_refused_as_by_every_command(sandbox, gpuops, tmp_path):
    """The shared connection's refusals are the ones every command gives (connect() judges them), with exit 3."""
    import yaml

    write(Path.cwd() / "a.py")
    data = yaml.safe_load(sandbox["profile"].read_text())
    (Path(sandbox["profile"]).parent / "strict.yaml").write_text(yaml.safe_dump({**data, "host_key_policy": "strict"}))
    r = gpuops("sync", "-p", "strict")
    assert r.code == 3 and "is not known and profile 'strict' uses host_key_policy: strict" in r.err, r.all
    assert "hint: check the fingerprint with your provider, then run: gpuops trust strict --fingerprint SHA256:" in r.err
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (Path(sandbox["profile"]).parent / "wrongkey.yaml").write_text(yaml.safe_dump({**data, "key": str(key)}))
    r = gpuops("sync", "-p", "wrongkey")
    assert r.code == 3 and f"refused authentication with {key}" in r.err and "Traceback" not in r.all, r.all
    assert not remote_project(sandbox).exists()


def test_the_local_rsync_is_asked_its_version_once(sandbox, gpuops, tmp_path, monkeypatch):
    """A sync asked `rsync --version` before connecting and again before each rsync it ran (a process each): now once
    per process and rsync binary; another rsync found on PATH is asked again (test_rsync_too_old_locally)."""
    log = tmp_path / "asked"
    wrapper = tmp_path / "bin" / "rsync"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo asked >> {log}\nexec {shutil.which("rsync")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    write(Path.cwd() / "a.py")
    for args in ((), ("--delete",), ()):
        r = gpuops("sync", "-p", "sandbox", *args)
        assert r.code == 0, r.all
    assert log.read_text() == "asked\n"


def test_a_plain_sync_is_rsyncs_own_ssh_and_a_master_opens_only_to_judge_a_failure(sandbox, short_tmp, monkeypatch,
                                                                                   tmp_path):
    """A plain sync pays one ssh, as plain rsync does: no master is started (issue 42: the master's start and exit
    were a tenth of a no-change re-sync). A key never seen makes rsync's own ssh fail: the master opens, connect()
    trusts it as the policy says, and the sync goes on through it; a changed key is refused in connect()'s words."""
    import tempfile

    from gpuops.console import Output
    from gpuops.errors import HostKeyError
    from gpuops.paths import known_hosts_file
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import shared
    from gpuops.transfer.sync import sync_project

    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    prof = profiles.resolve("sandbox")
    known = known_hosts_file()
    assert not known.exists() or f":{sandbox['port']} " not in known.read_text()  # never seen: the first contact
    write(Path.cwd() / "train.py", "print(1)\n")
    with shared(prof, announce=lambda s: None, lazy=True) as remote:
        s = sync_project(prof, remote, Output(json_mode=True), Path.cwd())
        assert s["files"] == 1 and remote.has_master and not remote.lazy  # opened to trust the new key
    with shared(prof, announce=lambda s: None, lazy=True) as remote:
        write(Path.cwd() / "b.py", "print(2)\n")
        s = sync_project(prof, remote, Output(json_mode=True), Path.cwd())
        assert s["files"] == 1 and s["attempts"] == 1 and not remote.has_master and remote.lazy
        assert not _ssh_masters(remote.folder)
    _wrong_host_key(sandbox, tmp_path)
    with shared(prof, announce=lambda s: None, lazy=True) as remote:
        write(Path.cwd() / "c.py", "print(3)\n")
        with pytest.raises(HostKeyError, match="CHANGED|changed"):
            sync_project(prof, remote, Output(json_mode=True), Path.cwd())
    assert not (remote_project(sandbox) / "c.py").exists()
