"""The pure parts of filesystems (cloud/filesystems.py, the API's Filesystem record) and of `run --data`
(transfer/dataplan.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.cloud import filesystems as fsd
from gpuops.cloud.api import Filesystem, Instance
from gpuops.errors import UsageError
from gpuops.transfer import dataplan as dp

RECORD = {"id": "398578a2336b49079e74043f0bd2cfe8", "name": "my-filesystem", "mount_point": "/lambda/nfs/my-filesystem",
          "created": "2024-11-01T00:00:00.000Z", "created_by": {"id": "u1", "email": "a@b.c", "status": "active"},
          "is_in_use": True, "region": {"name": "us-west-1", "description": "California, USA"},
          "bytes_used": 2 * 1024 ** 3}


def test_filesystem_record_parsed_leniently():
    fs = Filesystem.parse(RECORD)
    assert (fs.name, fs.region, fs.mount_point, fs.bytes_used, fs.is_in_use) == (
        "my-filesystem", "us-west-1", "/lambda/nfs/my-filesystem", 2 * 1024 ** 3, True)
    assert Filesystem.parse({**RECORD, "bytes_used": None}).bytes_used is None  # optional in the spec
    assert Filesystem.parse({"name": "x"}) is None


def _inst(iid, status="active", names=(), mounts=()):
    return Instance.parse({"id": iid, "status": status, "file_system_names": list(names),
                           "file_system_mounts": [{"file_system_id": f, "mount_point": m} for f, m in mounts]})


def test_users_mount_point_and_rows():
    fs = Filesystem.parse(RECORD)
    a = _inst("a", names=["my-filesystem"])
    b = _inst("b", mounts=[(fs.id, "/data/x")])
    gone = _inst("c", status="terminated", names=["my-filesystem"])
    assert [i.id for i in fsd.users(fs, [a, b, gone])] == ["a", "b"]
    assert fsd.mount_point(fs, b) == "/data/x" and fsd.mount_point(fs, a) == "/lambda/nfs/my-filesystem"
    [row] = fsd.rows([fs], [a, b, gone], {"usd_per_gib_month": None})
    assert row["cost_per_month"] is None and [i["id"] for i in row["instances"]] == ["a", "b"]
    [row] = fsd.rows([fs], [], {"usd_per_gib_month": 0.3, "regions": {"us-west-1": 0.25}})
    assert row["cost_per_month"] == pytest.approx(0.5) and fsd.total_per_month([row]) == pytest.approx(0.5)


def test_the_shipped_playbook_has_no_price_and_cites_its_source():
    from gpuops.knowledge import load_playbook

    doc = load_playbook("filesystems", Path("/nonexistent"))
    assert doc["price"]["usd_per_gib_month"] is None and "docs.lambda.ai/public-cloud/billing" in doc["source"]
    assert fsd.monthly_cost(10 * fsd.GIB, "us-east-1", doc["price"]) is None


def test_launch_region_and_names():
    east = Filesystem.parse({**RECORD, "name": "e", "region": {"name": "us-east-1"}})
    west = Filesystem.parse({**RECORD, "id": "w", "name": "w", "region": {"name": "us-west-1"}})
    assert fsd.launch_region(["e"], [east, west], []) == "us-east-1"
    assert fsd.launch_region(["missing"], [east], []) is None
    with pytest.raises(UsageError, match="different regions"):
        fsd.launch_region(["e", "w"], [east, west], [])
    with pytest.raises(UsageError, match="is in us-east-1, not in us-west-2"):
        fsd.launch_region(["e"], [east], ["us-west-2"])
    for bad in ("1x", "a_b", "a" * 61, ""):
        with pytest.raises(UsageError):
            fsd.check_name(bad)
    assert fsd.check_name("Data-1") == "Data-1"


def test_data_sources(tmp_path):
    (tmp_path / "corpus").mkdir()
    s = dp.parse("corpus", tmp_path)
    key = dp.source_key(s)
    assert s.kind == "local" and s.name == "corpus" and dp.target(s, "/lambda/nfs/x") == f"/lambda/nfs/x/gpuops/data/corpus-{key}"
    assert dp.target(s, None) == f"~/gpuops-data/corpus-{key}"
    (tmp_path / "b" / "corpus").mkdir(parents=True)  # another folder of the same name: its own folder there
    assert dp.source_key(dp.parse(str(tmp_path / "b" / "corpus"), tmp_path)) != key
    h = "ab" * 32
    u = dp.parse(f"https://h.example/sets/wiki.tar.gz#sha256={h}", tmp_path)
    assert (u.kind, u.name, u.filename, u.sha256, u.text) == ("url", "wiki", "wiki.tar.gz", h,
                                                              "https://h.example/sets/wiki.tar.gz")
    m = dp.parse("hf://datasets/org/set@v1", tmp_path)
    assert (m.kind, m.repo_id, m.repo_type, m.revision, m.name) == ("hf", "org/set", "dataset", "v1", "org--set")
    assert dp.parse("hf://org/model", tmp_path).repo_type == "model"
    for bad in ("https://h/x.tar", "https://h/x.tar#sha256=12", "hf://only", "s3://b/k", "missing"):
        with pytest.raises(UsageError):
            dp.parse(bad, tmp_path)
    assert dp.fetch_params(m, "/d", "tok")["token"] == "tok"


def test_lambda_filesystem_errors_become_one_clear_message_and_exit_code():
    from gpuops.cloud.api import error_from_response

    def err(code, status=400, message="m"):
        return error_from_response(status, {"error": {"code": code, "message": message}}, {}, "POST", "/filesystems")

    assert fsd.fs_error(err("global/duplicate"), "d").code == 2
    in_use = fsd.fs_error(err("filesystems/filesystem-in-use", message="in use by i-1"), "d")
    assert in_use.code == 1 and "in use by i-1" in in_use.message and "gpuops down" in in_use.hint
    assert fsd.fs_error(err("global/object-does-not-exist", 404), "d").code == 2
    wrong = fsd.fs_error(err("instance-operations/launch/file-system-in-wrong-region", message="in us-east-1"))
    assert wrong.code == 2 and "in us-east-1" in wrong.message
    assert fsd.fs_error(err("global/quota-exceeded")).code == 1
    other = err("provider/internal-unavailable", 503)
    assert fsd.fs_error(other) is other


def _fetch(params: dict) -> dict:
    """The instance's download script, run here as the instance runs it (python3, parameters then script on stdin)."""
    import subprocess
    import sys

    from gpuops.transfer import dataplan as dp

    r = subprocess.run([sys.executable, "-c", dp.RUNNER], input=json.dumps(params) + "\n" + dp.FETCH_SCRIPT,
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_failed_unpack_never_leaves_the_earlier_archives_mark_on_mixed_files(tmp_path):
    """Archive A put, then archive B (its checksum right, its unpacking failing half way: B's first file written over
    A's): the folder no longer holds A, so a later run asking for A must download it again, not say 'already there'."""
    import functools
    import hashlib
    import http.server
    import io
    import tarfile
    import threading

    from gpuops.transfer import dataplan as dp

    www = tmp_path / "www"
    www.mkdir()

    def tar(files, cut=0):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()[: len(buf.getvalue()) - cut] if cut else buf.getvalue()

    (www / "a.tar").write_bytes(tar({"train.txt": b"version A\n"}))
    (www / "b.tar").write_bytes(tar({"train.txt": b"version B\n", "more.bin": b"x" * 20000}, cut=15000))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base, dest = f"http://127.0.0.1:{srv.server_address[1]}", tmp_path / "data" / "set"

        def src(name):
            sha = hashlib.sha256((www / name).read_bytes()).hexdigest()
            return dp.parse(f"{base}/{name}#sha256={sha}", tmp_path)

        a, b = src("a.tar"), src("b.tar")
        assert _fetch(dp.fetch_params(a, str(dest)))["ok"]
        got = _fetch(dp.fetch_params(b, str(dest)))
        assert not got["ok"] and "could not unpack" in got["error"], got
        # every member is read (and checked) before any is unpacked: nothing of the cut B written over A
        assert (dest / "train.txt").read_text() == "version A\n"
        again = _fetch(dp.fetch_params(a, str(dest)))
        assert again["ok"] and not again["skipped"], again
        assert (dest / "train.txt").read_text() == "version A\n"
    finally:
        srv.shutdown()
        srv.server_close()
