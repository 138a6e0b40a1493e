"""`gpuops fetch` end to end: the real sandbox sshd, real rsync, and a TCP proxy that cuts connections."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.proxy import Proxy


def write(path: Path, data: bytes | str = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def remote_project(sandbox) -> Path:
    return Path(sandbox["dir"]) / "home" / Path.cwd().name


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def make_checkpoints(sandbox) -> Path:
    ck = remote_project(sandbox) / "checkpoints"
    for step in (1, 2, 10):
        write(ck / f"run/global_step_{step}/actor/model.pt", os.urandom(20_000 + step))
        write(ck / f"run/global_step_{step}/meta.json", json.dumps({"step": step}))
    write(ck / "hf/checkpoint-7/weights.bin", os.urandom(5000))
    write(ck / "latest_checkpointed_iteration.txt", "10")
    write(ck / "run/__pycache__/x.pyc", "fetch never applies sync exclusions")
    return ck


def test_fetch_everything_verified_without_exclusions(sandbox, gpuops):
    ck = make_checkpoints(sandbox)
    r = gpuops("fetch", "-p", "sandbox")
    assert r.code == 0, r.all
    local = Path.cwd() / "checkpoints"
    assert tree(local) == tree(ck)
    for rel in tree(ck):
        assert (local / rel).read_bytes() == (ck / rel).read_bytes()
    assert not (local / ".gpuops-partial").exists()
    assert "verified" in r.out
    # again: nothing to transfer, still verified
    r = gpuops("fetch", "checkpoints", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["files"] == 0 and doc["verified"] == len(tree(ck))


def test_fetch_latest_and_step(sandbox, gpuops):
    make_checkpoints(sandbox)
    r = gpuops("fetch", "-p", "sandbox", "--latest", "--dest", "ckpt", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["steps"] == [10]  # by number: 10 > 2 > 1 (and > checkpoint-7)
    assert tree(Path("ckpt")) == {"run/global_step_10/actor/model.pt", "run/global_step_10/meta.json"}
    r = gpuops("fetch", "-p", "sandbox", "--step", "2", "--dest", "ckpt")
    assert r.code == 0, r.all
    assert tree(Path("ckpt")) == {"run/global_step_10/actor/model.pt", "run/global_step_10/meta.json",
                                  "run/global_step_2/actor/model.pt", "run/global_step_2/meta.json"}
    r = gpuops("fetch", "-p", "sandbox", "--step", "7", "--dest", "hf_only")
    assert r.code == 0, r.all
    assert tree(Path("hf_only")) == {"hf/checkpoint-7/weights.bin"}
    r = gpuops("fetch", "-p", "sandbox", "--step", "99")
    assert r.code == 1
    assert "no step 99" in r.err and "1, 2, 7, 10" in r.err
    r = gpuops("fetch", "-p", "sandbox", "--step", "2", "--latest")
    assert r.code == 2


def test_fetch_latest_passes_over_a_checkpoint_still_being_written(sandbox, gpuops):
    """global_step_12 has its model but not yet its meta.json (global_step_10 has both): --latest says so and takes
    global_step_10, verified; once 12 is complete, --latest takes it."""
    ck = make_checkpoints(sandbox)
    write(ck / "run/global_step_12/actor/model.pt", os.urandom(20_012))
    r = gpuops("fetch", "-p", "sandbox", "--latest", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["steps"] == [10] and doc["skipped_partial"] == "run/global_step_12", doc
    assert "run/global_step_12 lacks 1 file(s) that run/global_step_10 has (meta.json)" in r.err, r.err
    assert tree(Path("checkpoints")) == {"run/global_step_10/actor/model.pt", "run/global_step_10/meta.json"}
    write(ck / "run/global_step_12/meta.json", json.dumps({"step": 12}))
    r = gpuops("fetch", "-p", "sandbox", "--latest", "--json")
    assert r.code == 0 and json.loads(r.out)["steps"] == [12] and "lacks" not in r.err, r.all


def test_fetch_list_and_other_names(sandbox, gpuops):
    make_checkpoints(sandbox)
    write(remote_project(sandbox) / "outputs/eval/results.json", "{}")
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "fetch:\n  checkpoints: checkpoints\n  outputs: outputs\n  missing: nowhere\n")
    r = gpuops("fetch", "-p", "sandbox", "--list")
    assert r.code == 0, r.all
    assert "step       10" in r.out and "run/global_step_10" in r.out and "outputs:" in r.out
    assert "not on the remote" in r.out
    r = gpuops("fetch", "-p", "sandbox", "--list", "--json")
    doc = json.loads(r.out)
    assert [s["step"] for s in doc["checkpoints"]["steps"]] == [1, 2, 7, 10]
    assert doc["outputs"]["files"] == 1 and doc["missing"]["exists"] is False
    r = gpuops("fetch", "outputs", "-p", "sandbox")
    assert r.code == 0, r.all
    assert (Path.cwd() / "outputs/eval/results.json").read_text() == "{}"
    r = gpuops("fetch", "nosuch", "-p", "sandbox")
    assert r.code == 2 and "not in the profile's fetch" in r.err
    r = gpuops("fetch", "missing", "-p", "sandbox")
    assert r.code == 1 and "does not exist" in r.err


def test_corrupted_remote_file_is_detected(sandbox, gpuops):
    ck = make_checkpoints(sandbox)
    assert gpuops("fetch", "-p", "sandbox", "--latest").code == 0
    local = Path.cwd() / "checkpoints/run/global_step_10/actor/model.pt"
    good = local.read_bytes()
    # silent corruption on the remote: same size and mtime, so rsync's quick check sees nothing
    bad = ck / "run/global_step_10/actor/model.pt"
    st = bad.stat()
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = gpuops("fetch", "-p", "sandbox", "--latest")
    assert r.code == 1, r.all
    assert "verification failed" in r.err and "run/global_step_10/actor/model.pt" in r.err
    assert local.read_bytes() == good  # the verified copy was not replaced
    # the hint says "run the fetch again": and it works (that run compares checksums, so the stale copy is not reused)
    r = gpuops("fetch", "-p", "sandbox", "--latest")
    assert r.code == 0, r.all
    assert local.read_bytes() == bytes(data)
    assert not (Path.cwd() / "checkpoints" / ".gpuops-partial.recheck").exists()


def test_symlinks_inside_are_copied_as_symlinks_outside_never_followed(sandbox, gpuops):
    ck = make_checkpoints(sandbox)
    secret = write(remote_project(sandbox) / "secret.txt", "not for you")
    os.symlink("run/global_step_10", ck / "latest")
    os.symlink("global_step_10/actor/model.pt", ck / "run" / "final.pt")
    os.symlink(str(secret), ck / "abs-out")
    os.symlink("../secret.txt", ck / "rel-out")
    r = gpuops("fetch", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["links"] == 2 and sorted(doc["links_outside_skipped"]) == ["abs-out", "rel-out"]
    local = Path.cwd() / "checkpoints"
    assert os.readlink(local / "latest") == "run/global_step_10"
    assert os.readlink(local / "run" / "final.pt") == "global_step_10/actor/model.pt"
    assert (local / "run" / "final.pt").read_bytes() == (ck / "run/global_step_10/actor/model.pt").read_bytes()
    assert not os.path.lexists(local / "abs-out") and not os.path.lexists(local / "rel-out")
    assert "2 symlink(s) pointing outside" in r.err


def _cut_profile(sandbox, port: int) -> str:
    from gpuops.paths import config_dir

    src = Path(sandbox["profile"]).read_text()
    lines = [ln for ln in src.splitlines() if not ln.startswith("port:")] + [f"port: {port}"]
    write(config_dir() / "profiles" / "cut.yaml", "\n".join(lines) + "\n")
    return "cut"


def test_fetch_resumes_after_the_connection_is_cut(sandbox, gpuops):
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect

    size = 3_000_000
    payload = os.urandom(size)
    write(remote_project(sandbox) / "checkpoints/global_step_3/model.pt", payload)
    proxy = Proxy(sandbox["port"], cut_after=1_200_000)
    try:
        name = _cut_profile(sandbox, proxy.port)
        with connect(profiles.resolve(name), announce=lambda s: None):  # trust [127.0.0.1]:proxy-port
            pass
        r = gpuops("fetch", "-p", name, "--json")
        assert r.code == 0, r.all
        doc = json.loads(r.out)
        assert doc["attempts"] >= 2  # every connection is cut after 1.2 MB: only resuming can finish
        assert "retrying" in r.err
        assert (Path.cwd() / "checkpoints/global_step_3/model.pt").read_bytes() == payload
        assert proxy.bytes_down < 2 * size
        assert not (Path.cwd() / "checkpoints/.gpuops-partial").exists()
    finally:
        proxy.close()


def test_interrupted_fetch_leaves_no_file_under_its_final_name(sandbox, gpuops, monkeypatch):
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect

    monkeypatch.setattr("gpuops.transfer.rsync.ATTEMPTS", 1)
    write(remote_project(sandbox) / "checkpoints/global_step_1/model.pt", os.urandom(2_000_000))
    proxy = Proxy(sandbox["port"], cut_after=700_000)
    try:
        name = _cut_profile(sandbox, proxy.port)
        with connect(profiles.resolve(name), announce=lambda s: None):
            pass
        r = gpuops("fetch", "-p", name)
        assert r.code == 3, r.all
        assert "run the command again" in r.err
        local = Path.cwd() / "checkpoints"
        assert not (local / "global_step_1/model.pt").exists()
        assert (local / ".gpuops-partial").is_dir()  # what arrived is kept for the next run
    finally:
        proxy.close()


def test_changed_host_key_refused(sandbox, gpuops, tmp_path):
    from gpuops.paths import known_hosts_file

    make_checkpoints(sandbox)
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, b64 = key.with_suffix(".pub").read_text().split()[:2]
    known_hosts_file().parent.mkdir(parents=True, exist_ok=True)
    known_hosts_file().write_text(f"[127.0.0.1]:{sandbox['port']} {kind} {b64}\n")
    r = gpuops("fetch", "-p", "sandbox")
    assert r.code == 3, r.all
    assert "host key" in r.err.lower()
    assert not (Path.cwd() / "checkpoints").exists()


def _add_fetch_entries(sandbox, entries: str) -> None:
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "fetch:\n  checkpoints: checkpoints\n" + entries)


def test_fetch_a_single_file(sandbox, gpuops):
    rp = remote_project(sandbox)
    payload, step9 = os.urandom(300_000), os.urandom(40_000)
    write(rp / "outputs/model.safetensors", payload)
    write(rp / "outputs/other.bin", "not fetched")
    write(rp / "checkpoints/global_step_9/model.pt", step9)
    (rp / "final.pt").symlink_to("checkpoints/global_step_9/model.pt")
    _add_fetch_entries(sandbox, "  final: outputs/model.safetensors\n  best: final.pt\n")
    r = gpuops("fetch", "final", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["file"] == "model.safetensors" and doc["verified"] == 1 and doc["files"] == 1
    local = Path.cwd() / "final"
    assert tree(local) == {"model.safetensors"}  # DEST/<the file's name>; no staging left
    assert (local / "model.safetensors").read_bytes() == payload
    r = gpuops("fetch", "final", "-p", "sandbox")  # again: nothing to transfer, still verified
    assert r.code == 0, r.all
    assert "fetched final (model.safetensors)" in r.out and "0 files transferred" in r.out and "1 files verified" in r.out
    # a symlink entry is fetched as the file it points to, here into the project directory itself
    r = gpuops("fetch", "best", "-p", "sandbox", "--dest", ".")
    assert r.code == 0, r.all
    assert not Path("final.pt").is_symlink() and Path("final.pt").read_bytes() == step9
    assert not Path(".gpuops-partial").exists()
    r = gpuops("fetch", "--list", "-p", "sandbox", "--json")
    doc = json.loads(r.out)
    assert doc["final"]["is_dir"] is False and doc["final"]["files"] == 1 and doc["final"]["bytes"] == 300_000
    assert doc["checkpoints"]["is_dir"] is True
    assert "(a file)" in gpuops("fetch", "--list", "-p", "sandbox").out
    r = gpuops("fetch", "final", "-p", "sandbox", "--latest")
    assert r.code == 2 and "single file" in r.err
    # silent corruption on the remote (same size and time stamp) is caught; the verified copy stays
    bad = rp / "outputs/model.safetensors"
    st = bad.stat()
    bad.write_bytes(payload[:1000] + bytes([payload[1000] ^ 0xFF]) + payload[1001:])
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = gpuops("fetch", "final", "-p", "sandbox")
    assert r.code == 1, r.all
    assert "verification failed for 1 of 1 files: model.safetensors (content differs)" in r.err
    assert (local / "model.safetensors").read_bytes() == payload


def test_single_file_fetch_resumes_and_appears_only_when_verified(sandbox, gpuops, monkeypatch):
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect

    size = 3_000_000
    payload = os.urandom(size)
    write(remote_project(sandbox) / "outputs/model.safetensors", payload)
    _add_fetch_entries(sandbox, "  final: outputs/model.safetensors\n")
    final = Path.cwd() / "final/model.safetensors"
    proxy = Proxy(sandbox["port"], cut_after=1_200_000)  # every connection: cut after 1.2 MB
    try:
        name = _cut_profile(sandbox, proxy.port)
        with connect(profiles.resolve(name), announce=lambda s: None):
            pass
        monkeypatch.setattr("gpuops.transfer.rsync.ATTEMPTS", 1)
        r = gpuops("fetch", "final", "-p", name)
        assert r.code == 3, r.all
        assert not final.exists()  # never under its final name before it is complete and verified
        assert (final.parent / ".gpuops-partial").is_dir()
        monkeypatch.setattr("gpuops.transfer.rsync.ATTEMPTS", 6)
        r = gpuops("fetch", "final", "-p", name, "--json")
        assert r.code == 0, r.all
        doc = json.loads(r.out)
        assert doc["attempts"] >= 2 and doc["verified"] == 1  # only resuming can finish at 1.2 MB per connection
        assert final.read_bytes() == payload
        assert proxy.bytes_down < 2 * size
        assert not (final.parent / ".gpuops-partial").exists()
    finally:
        proxy.close()


def test_fetched_folders_are_never_uploaded_by_the_next_sync(sandbox, gpuops, tmp_path):
    """Issue #29: `fetch backups` wrote ./backups, which sync.exclude did not cover: the next sync uploaded it back
    into the remote project (a 200 MB folder). A fetch inside the project records its folder (runs/fetched.json);
    every sync leaves it out, and --delete never touches what it left out."""
    import yaml

    data = yaml.safe_load(sandbox["profile"].read_text())
    backups = Path(sandbox["dir"]) / "home" / f"backups-{Path.cwd().name}"
    data["fetch"] = {"checkpoints": "checkpoints", **(data.get("fetch") or {}), "backups": str(backups)}
    sandbox["profile"].write_text(yaml.safe_dump(data))
    write(backups / "db.dump", os.urandom(50_000))
    make_checkpoints(sandbox)
    write(Path("train.py"), "print('hi')\n")
    assert gpuops("fetch", "backups", "-p", "sandbox").code == 0
    assert gpuops("fetch", "-p", "sandbox", "--latest", "--dest", "out/ckpt").code == 0
    outside = tmp_path / "elsewhere"
    assert gpuops("fetch", "-p", "sandbox", "--latest", "--dest", str(outside)).code == 0
    assert json.loads(Path("runs/fetched.json").read_text()) == ["backups", "out/ckpt"]  # outside: nothing to leave out
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    rp = remote_project(sandbox)
    assert (rp / "train.py").is_file()
    assert not (rp / "backups").exists() and not (rp / "out" / "ckpt").exists(), tree(rp)
    # a remote folder of that name is the host's own: a --delete sync keeps it
    write(rp / "backups" / "remote-only.txt", "keep")
    assert gpuops("sync", "-p", "sandbox", "--delete").code == 0
    assert (rp / "backups" / "remote-only.txt").is_file()
