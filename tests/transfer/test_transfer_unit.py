"""The pure side of sync/fetch: filters, argv, output parsing, checkpoint selection, verification."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.transfer import plan as tr


@pytest.mark.parametrize("line,rules", [
    ("", []),
    ("# comment", []),
    ("data/", ["- data/"]),
    ("*.tmp", ["- *.tmp"]),
    ("!keep.tmp", ["+ keep.tmp"]),
    ("/rootonly.txt", ["- /rootonly.txt"]),
    ("docs/build", ["- /docs/build"]),  # a middle slash anchors in gitignore
    ("**/cache", ["- cache"]),
    ("**/a/b", ["- a/b"]),
    ("a/**/b", ["- /a/**/b", "- /a/b"]),
    ("\\#not-a-comment", ["- #not-a-comment"]),
    ("\\!bang", ["- !bang"]),
    ("trailing   ", ["- trailing"]),
])
def test_gitignore_to_rsync(line, rules):
    assert tr.gitignore_to_rsync(line) == rules


def test_ignore_file_last_match_wins(tmp_path):
    f = tmp_path / ".gpuopsignore"
    f.write_text("*.log\n!important.log\nbuild/\n")
    # reversed: rsync's first match == gitignore's last match
    assert tr.read_ignore_file(f) == ["- build/", "+ important.log", "- *.log"]
    assert tr.read_ignore_file(tmp_path / "missing") == []


def test_ignore_file_rejects_empty_negation(tmp_path):
    f = tmp_path / ".gpuopsignore"
    f.write_text("ok\n!\n")
    with pytest.raises(tr.IgnoreFileError, match="line 2"):
        tr.read_ignore_file(f)


def test_filter_order_protects_profile_excludes():
    rules = tr.sync_filter_rules(["checkpoints", "*.pyc"], ["scratch"], ["+ checkpoints", "- data/"], gitignore=True)
    assert rules.index("- scratch") < rules.index("- checkpoints") < rules.index("+ checkpoints")
    assert rules[-1] == ":- .gitignore"
    assert "- .gpuops-partial/" in rules
    assert ":- .gitignore" not in tr.sync_filter_rules(["x"])


def test_sync_args_are_safe():
    ssh = ["ssh", "-p", "2222", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/k h/known_hosts"]
    args = tr.sync_args(ssh, Path("/p/proj"), "1.2.3.4", "~/proj", ["- .git"], delete=True)
    assert args[0] == "rsync" and "--delete" in args and "--delete-excluded" not in args
    assert args[-2:] == ["/p/proj/", "1.2.3.4:proj/"]
    e = args[args.index("-e") + 1]
    assert "StrictHostKeyChecking=yes" in e and "'UserKnownHostsFile=/k h/known_hosts'" in e
    assert "--filter=- .git" in args and "--partial-dir=.gpuops-rsync-partial" in args
    assert "--delete" not in tr.sync_args(ssh, Path("/p"), "h", "/abs", [])
    assert "--delete-after" in tr.sync_args(ssh, Path("/p"), "h", "/abs", [], delete=True, gitignore=True)
    assert "--dry-run" in tr.sync_args(ssh, Path("/p"), "h", "/abs", [], dry_run=True)


def test_fetch_args(tmp_path):
    args = tr.fetch_args(["ssh"], "::1", "~/proj/checkpoints", tmp_path / "d/.gpuops-partial", dest=tmp_path / "d",
                         files_from=tmp_path / "list.txt")
    assert args[-2:] == ["[::1]:proj/checkpoints/", str(tmp_path / "d/.gpuops-partial") + "/"]
    assert "-r" in args and f"--files-from={tmp_path / 'list.txt'}" in args
    assert not any(a.startswith(("--filter", "--exclude")) for a in args)
    one = tr.fetch_args(["ssh"], "h", "~/proj/outputs/model.safetensors", tmp_path / "d/.gpuops-partial",
                        dest=tmp_path / "d", single_file=True)
    assert one[-2] == "h:proj/outputs/model.safetensors"  # the file itself, not a folder's contents
    assert "--copy-links" in one and "--copy-links" not in args


@pytest.mark.parametrize("path,want", [("~/proj", "proj"), ("~", "."), ("/data/x", "/data/x"), ("rel", "rel")])
def test_rsync_remote_path(path, want):
    assert tr.rsync_remote_path(path) == want


def test_join_remote():
    assert tr.join_remote("~/proj", "checkpoints") == "~/proj/checkpoints"
    assert tr.join_remote("~/proj", "/mnt/ckpt") == "/mnt/ckpt"
    assert tr.join_remote("~/proj", "~/elsewhere") == "~/elsewhere"


def test_parse_progress():
    p = tr.parse_progress("     52,428,800  50%   12.34MB/s    0:00:04 (xfr#3, to-chk=2/7)")
    assert (p.bytes, p.percent, p.rate, p.eta) == (52_428_800, 50, "12.34MB/s", "0:00:04")
    assert p.total_estimate == 104_857_600
    assert tr.parse_progress("sending incremental file list") is None
    assert tr.parse_rate("12.34MB/s") == pytest.approx(12.34e6)
    assert tr.parse_rate("1,234.50kB/s") == pytest.approx(1_234_500)


@pytest.mark.parametrize("line,want", [
    ("::gpuops:: <f+++++++++ 120 src/a.py", ("new", "file", "src/a.py", 120)),
    ("::gpuops:: >f.st...... 99 ck/model.pt", ("updated", "file", "ck/model.pt", 99)),
    ("::gpuops:: cd+++++++++ 4096 src/", ("new", "dir", "src", None)),
    ("::gpuops:: *deleting   old.py", ("deleted", "file", "old.py", None)),
    ("::gpuops:: *deleting   olddir/", ("deleted", "dir", "olddir", None)),
    ("::gpuops:: .d..t...... 4096 src/", None),
    ("::gpuops:: cd+++++++++ 4096 ./", None),
    ("::gpuops:: <f.st...... 5 name with spaces.txt", ("updated", "file", "name with spaces.txt", 5)),
    ("not ours", None),
])
def test_parse_item(line, want):
    ch = tr.parse_item(line)
    assert (None if ch is None else (ch.change, ch.kind, ch.path, ch.size)) == want


def test_parse_stats():
    text = """
Number of files: 7 (reg: 5, dir: 2)
Number of regular files transferred: 3
Number of deleted files: 1
Total file size: 1,234,567 bytes
Total transferred file size: 12,345 bytes
Literal data: 345 bytes
Matched data: 12,000 bytes
Total bytes sent: 1,535
Total bytes received: 95
"""
    s = tr.parse_stats(text)
    assert s == {"entries": 7, "files_transferred": 3, "deleted": 1, "total_bytes": 1_234_567,
                 "transferred_bytes": 12_345, "literal_bytes": 345, "matched_bytes": 12_000, "bytes_sent": 1535,
                 "bytes_received": 95}


@pytest.mark.parametrize("rc,err,kind", [
    (255, "Host key verification failed.\r\nrsync: connection unexpectedly closed", "hostkey"),
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "hostkey"),
    (255, "ubuntu@1.2.3.4: Permission denied (publickey).", "auth"),
    (12, "bash: line 1: rsync: command not found\nrsync: connection unexpectedly closed", "missing-remote"),
    (12, "rsync: connection unexpectedly closed (0 bytes received so far)", "transient"),
    (10, "rsync error: error in socket IO (code 10)", "transient"),
    (30, "rsync error: timeout in data send/receive (code 30)", "transient"),
    (35, "", "transient"),
    (255, "ssh: connect to host 1.2.3.4 port 22: Connection refused", "transient"),
    (23, "rsync: [sender] link_stat failed: No such file", "failed"),
])
def test_classify_failure(rc, err, kind):
    assert tr.classify_failure(rc, err) == kind


def test_step_dirs_and_selection():
    rows = [["run/global_step_2/model.pt", 10, 1.0], ["run/global_step_10/model.pt", 20, 2.0],
            ["run/global_step_10/optim/o.pt", 5, 3.0], ["hf/checkpoint-7/w.bin", 1, 9.0], ["other/x", 1, 1.0],
            ["global_step_10/model.pt", 20, 0.5]]
    steps = tr.step_dirs(rows)
    assert steps["run/global_step_10"] == {"step": 10, "bytes": 25, "files": 2, "mtime": 3.0,
                                           "names": {"model.pt", "optim/o.pt"}}
    assert set(steps) == {"run/global_step_2", "run/global_step_10", "hf/checkpoint-7", "global_step_10"}
    assert tr.select_steps(steps, latest=True) == ["run/global_step_10"]  # same number: the newest written
    assert tr.select_steps(steps, step=10) == ["global_step_10", "run/global_step_10"]
    assert tr.select_steps(steps, step=7) == ["hf/checkpoint-7"]
    with pytest.raises(LookupError, match="2, 7, 10"):
        tr.select_steps(steps, step=3)
    with pytest.raises(LookupError):
        tr.select_steps({}, latest=True)
    assert tr.step_of("global_step_0012") == 12 and tr.step_of("global_step_x") is None
    assert tr.under("run/global_step_10/a", ["run/global_step_10"])
    assert not tr.under("run/global_step_100/a", ["run/global_step_10"])


def test_latest_passes_over_a_newest_step_folder_that_lacks_files_its_predecessor_has():
    """A checkpoint being written (or cut short) has some of its files: --latest (and the checkpoints run --recover
    fetches while training) takes the newest complete one, comparing a folder only with its kin."""
    hf = ["model.safetensors", "optimizer.pt", "trainer_state.json"]
    rows = [[f"out/checkpoint-{n}/{f}", 10, float(n)] for n in (100, 200) for f in hf]
    rows += [["out/checkpoint-300/model.safetensors", 10, 300.0]]  # optimizer.pt, trainer_state.json: not yet
    rows += [["other/global_step_7/model.pt", 1, 1.0]]  # another family: never compared with out/checkpoint-N
    steps = tr.step_dirs(rows)
    partial = tr.partial_newest(steps)
    assert partial == {"newest": "out/checkpoint-300", "missing": ["optimizer.pt", "trainer_state.json"],
                       "instead": "out/checkpoint-200"}
    assert tr.select_steps(steps, latest=True) == ["out/checkpoint-200"]
    assert tr.select_steps(steps, step=300) == ["out/checkpoint-300"]  # asked for by number: taken as it is
    rows += [[f"out/checkpoint-300/{f}", 10, 301.0] for f in hf[1:]]  # now complete (and a new file is fine)
    rows += [["out/checkpoint-300/extra.json", 1, 301.0]]
    assert tr.select_steps(tr.step_dirs(rows), latest=True) == ["out/checkpoint-300"]
    first = tr.step_dirs([["ck/checkpoint-1/model.safetensors", 1, 1.0], ["x/global_step_9/a", 1, 0.0],
                          ["x/global_step_9/b", 1, 0.0]])
    assert tr.partial_newest(first) is None  # its folder's first checkpoint: nothing to compare with


def test_compare():
    remote = {"a": (1, "h1"), "b": (2, "h2"), "c": (3, "h3")}
    local = {"a": (1, "h1"), "b": (2, "XX"), "d": (4, "h4")}
    v = tr.compare(remote, local)
    assert (v.ok, v.mismatched, v.missing, v.extra) == (["a"], ["b"], ["c"], ["d"])
    assert not v.passed and v.problems() == ["b (content differs)", "c (missing)"]
    assert tr.compare({"a": (1, "h")}, {"a": (1, "h")}).passed


def test_estimate_upload_is_an_upper_bound(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_bytes(b"x" * 10)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/m.pt").write_bytes(b"x" * 1000)
    (tmp_path / "src/b.pyc").write_bytes(b"x" * 100)
    rules = tr.sync_filter_rules(["checkpoints", "*.pyc"])
    assert tr.estimate_upload_bytes(tmp_path, rules) == 10


def test_human_bytes():
    assert tr.human_bytes(5) == "5 B" and tr.human_bytes(1_500_000) == "1.5 MB"


@pytest.mark.parametrize("platform,managers,want", [
    ("linux", ["apt-get"], "sudo apt-get install -y rsync"),
    ("linux", ["dnf", "yum"], "sudo dnf install -y rsync"),
    ("linux", ["apk"], "sudo apk add rsync"),
    ("linux", [], "sudo apt-get install -y rsync"),
    ("darwin", [], "brew install rsync"),
])
def test_install_command(platform, managers, want):
    assert tr.install_command(platform, managers) == want
    assert tr.REMOTE_INSTALL == "sudo apt-get install -y rsync"


def test_rsync_version_parsing():
    assert tr.parse_rsync_version("rsync  version 3.2.7  protocol version 31\nCopyright") == (3, 2, 7)
    assert tr.parse_rsync_version("rsync  version v3.5.0  protocol version 32") == (3, 5, 0)
    assert tr.parse_rsync_version("rsync  version 2.6.9  protocol version 29") < tr.MIN_RSYNC
    v = tr.parse_rsync_version("openrsync: protocol version 29\nrsync version 2.6.9 compatible")
    assert v is None or v < tr.MIN_RSYNC  # macOS 15's openrsync is refused either way
    assert tr.parse_rsync_version("something else entirely") is None


def _as_remote(rsync_path: str, cwd: Path, path: str | None = None):
    """What the host's shell does with rsync's remote command `<rsync-path> <rsync's arguments>` (here: --version)."""
    import os
    import subprocess

    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(["/bin/sh", "-c", rsync_path + " --version"], cwd=cwd, env=env, capture_output=True, text=True)


def test_sync_guard_makes_the_folder_then_becomes_rsync_with_rsyncs_own_arguments(tmp_path):
    from gpuops.remote.shell import shell_path

    odd = "proj $(touch pwned) 'x'"
    r = _as_remote(tr.sync_guard(shell_path(odd + "/deep"), need=1), tmp_path)
    assert r.returncode == 0 and "rsync  version" in r.stdout, r.stderr
    assert (tmp_path / odd / "deep").is_dir() and not (tmp_path / "pwned").exists()
    assert tr.guard_stop(r.stderr) is None


def test_sync_guard_stops_rsync_when_the_disk_is_short_or_the_folder_cannot_be_made(tmp_path):
    import shutil

    free_kib = shutil.disk_usage(tmp_path).free // 1024
    r = _as_remote(tr.sync_guard("d", need=(free_kib + (1 << 30)) * 1024), tmp_path)
    kind, value, said = tr.guard_stop(r.stderr)
    assert r.returncode == 1 and "rsync  version" not in r.stdout
    assert kind == "room" and abs(int(value) - free_kib) < (1 << 20) and said == ""
    (tmp_path / "file").write_text("x")
    r = _as_remote(tr.sync_guard("file/sub", need=0), tmp_path)
    kind, value, said = tr.guard_stop(r.stderr)
    assert r.returncode == 1 and kind == "mkdir" and said.startswith("mkdir:") and "rsync  version" not in r.stdout


def test_sync_guard_without_rsync_on_the_host_is_rsyncs_remote_command_not_found(tmp_path):
    import os
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "mkdir", "df", "tail"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    r = _as_remote(tr.sync_guard("d", need=0), tmp_path, path=str(bin_dir))
    assert r.returncode == 127 and not (tmp_path / "d").exists()  # nothing else happens
    assert tr.classify_failure(127, r.stderr) == "missing-remote"


def test_sync_args_pass_the_guard_as_rsync_path():
    argv = tr.sync_args(["ssh"], Path("/p"), "h", "~/p", [], rsync_path="sh -c 'x' g")
    assert "--rsync-path=sh -c 'x' g" in argv and argv[-2:] == ["/p/", "h:p/"]
    assert not any(a.startswith("--rsync-path") for a in tr.sync_args(["ssh"], Path("/p"), "h", "~/p", []))
