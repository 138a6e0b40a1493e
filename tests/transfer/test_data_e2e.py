"""`run --data URL` on the instance (issue 35), through the real sandbox sshd with the instance's own python3 and a
local HTTP server that misbehaves as servers do: progress said while it downloads, a stalled download ended, a cut
download said as cut (never "checksum mismatch"), archive members that would land outside the data folder refused
by gpuops itself (whatever the python's tarfile filters), and --max-cost in force during a download (a real run
through the Lambda emulator)."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from gpuops.console import Output
from gpuops.errors import GpuopsError
from gpuops.profiles import model as profiles
from gpuops.remote.connection import connect
from gpuops.transfer import data, dataplan as dp


class Misbehaving(http.server.BaseHTTPRequestHandler):
    files: dict = {}

    def log_message(self, *a):
        pass

    def do_GET(self):
        name = self.path.lstrip("/")
        if name in self.files:
            body = self.files[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        if name == "cut.bin":  # 400 bytes of the 100000 announced, then the connection ends
            self.wfile.write(b"x" * 400)
            return
        sent = 0
        while sent < 100000:  # stall: 10 bytes, then nothing; slow: a byte every 0.3 s
            try:
                if name == "stall.bin" and sent >= 10:
                    time.sleep(0.5)
                    continue
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            sent += 1
            time.sleep(0.3 if name == "slow.bin" else 0)


@pytest.fixture
def web():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _put(sandbox, url: str, tmp_path, tick=None) -> dict:
    prof = profiles.resolve("sandbox", Path.cwd())
    out = Output(json_mode=True, stdout=io.StringIO(), stderr=io.StringIO())
    src = dp.parse(url, Path.cwd())
    with connect(prof) as remote:
        return data.put(prof, remote, out, src, str(tmp_path / "fs"), tick=tick)


def _url(web, name: str, body: bytes = b"") -> str:
    return f"{web.base}/{name}#sha256={hashlib.sha256(body).hexdigest()}"


def test_a_download_cut_short_is_said_as_cut_not_as_a_checksum_mismatch(sandbox, web, tmp_path):
    with pytest.raises(GpuopsError) as e:
        _put(sandbox, _url(web, "cut.bin"), tmp_path)
    assert "cut short: 400 of the 100000 bytes the server announced" in e.value.message, e.value.message
    assert "checksum" not in e.value.message and "sha256" not in (e.value.hint or ""), e.value


def test_a_stalled_download_is_ended_and_progress_is_told_meanwhile(sandbox, web, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_DATA_STALL_S", "3")
    seen = []
    started = time.monotonic()
    with pytest.raises(GpuopsError) as e:
        _put(sandbox, _url(web, "stall.bin"), tmp_path, tick=seen.append)
    assert "stalled: no byte received for 3s (10 bytes so far)" in e.value.message, e.value.message
    assert time.monotonic() - started < 30
    assert seen and seen[-1] == {"progress": 10, "total": 100000}, seen


def test_a_tick_that_raises_ends_the_download_on_the_instance(sandbox, web, tmp_path):
    """What --max-cost does: the tick raises, the download's execution ends with it (no process left behind)."""
    home = Path(sandbox["dir"]) / "home"

    def left():  # this sandbox host's download executions (other xdist workers' hosts run theirs meanwhile)
        found = []
        for proc in Path("/proc").iterdir():
            try:
                args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:  # not a process, or gone
                continue
            if "PARAMS, _, BODY" in args and f"HOME={home}".encode() in env:
                found.append(args)
        return found

    running = []

    def budget(p):
        if p["progress"] >= 3:
            running.append(left())  # the execution the tick is about to end is found (the filter finds ours)
            raise GpuopsError("--max-cost reached")

    with pytest.raises(GpuopsError, match="max-cost"):
        _put(sandbox, _url(web, "slow.bin"), tmp_path, tick=budget)
    assert running and running[-1], running
    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), left()
    assert home.is_dir()


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, target
                t.addfile(info)
            else:
                info.size = len(b"planted")
                t.addfile(info, io.BytesIO(b"planted"))
    return buf.getvalue()


def _zip(names) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n in names:
            z.writestr(n, b"planted")
    return buf.getvalue()


EVIL = {
    "dotdot.tar.gz": (_tar([("ok.txt", "file", None), ("../../planted.txt", "file", None)]), "'..' in its path"),
    "abs.tar.gz": (_tar([("/tmp/gpuops-planted-abs.txt", "file", None)]), "an absolute path"),
    "link.tar.gz": (_tar([("out", "sym", "/etc"), ("ok.txt", "file", None)]), "a link pointing outside"),
    "relink.tar.gz": (_tar([("sub/out", "sym", "../../.."), ("ok.txt", "file", None)]), "a link pointing outside"),
    "dotdot.zip": (_zip(["ok.txt", "../../planted.txt"]), "'..' in its path"),
}


@pytest.mark.parametrize("name", list(EVIL))
def test_archive_members_that_would_land_outside_the_data_folder_are_refused(sandbox, web, tmp_path, name):
    body, why = EVIL[name]
    Misbehaving.files[name] = body
    with pytest.raises(GpuopsError) as e:
        _put(sandbox, _url(web, name, body), tmp_path)
    assert f"refused to unpack {name}" in e.value.message and why in e.value.message, e.value.message
    fsdir = tmp_path / "fs" / "gpuops" / "data"
    assert not list(tmp_path.rglob("planted.txt")) and not Path("/tmp/gpuops-planted-abs.txt").exists()
    assert not [p for p in fsdir.rglob("*") if p.is_file() and not p.name.startswith(".gpuops")]  # nothing unpacked


def test_a_sound_archive_is_unpacked(sandbox, web, tmp_path):
    body = _tar([("set/train.txt", "file", None), ("set/link", "sym", "train.txt")])
    Misbehaving.files["good.tar.gz"] = body
    res = _put(sandbox, _url(web, "good.tar.gz", body), tmp_path)
    assert (Path(res["path"]) / "set" / "train.txt").read_bytes() == b"planted"


def test_max_cost_is_in_force_while_the_instance_downloads(cloud, gpuops, web):
    """Before: a server sending a byte now and then ran a $0.01 budget far past it, with no progress shown."""
    from support.cloud import TYPE, live_instances

    (Path.cwd() / "job.py").write_text("print('never runs')\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.py",
               "--max-cost", "0.02", "--data", _url(web, "slow.bin"))
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert "--max-cost $0.02 reached while the instance downloaded --data" in r.err, r.err
    assert "downloaded, " in r.err and "/s" in r.err, r.err  # progress: bytes and rate
    assert doc["total_cost"] < 0.03 and doc["outcome"] == "failed" and not doc.get("run_id"), doc
    assert not live_instances(cloud)


HF_SHA = "beef" + "0" * 36
HF_SIZE = 3 << 20  # 3 MB: the client writes 1 MB at a time (gpuops sets its chunk size), so progress shows


class SlowHub(http.server.BaseHTTPRequestHandler):
    """Enough of the Hugging Face Hub for snapshot_download of model repos org/slow (3 MB sent over ~4 s) and
    org/stuck (1.5 MB, then nothing)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _head(self, code, length, headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_GET(self):
        p = self.path.split("?")[0]
        repo = p.split("/")[4] if p.startswith("/api/models/org/") else p.split("/")[2] if p.count("/") > 2 else ""
        if p.startswith("/api/models/org/") and "/revision/" in p:
            body = json.dumps({"id": f"org/{repo}", "sha": HF_SHA, "siblings": [{"rfilename": "w.bin"}]}).encode()
            self._head(200, len(body))
            return self.wfile.write(body)
        if p.startswith("/api/models/org/") and "/tree/" in p:
            body = json.dumps([{"type": "file", "path": "w.bin", "size": HF_SIZE, "oid": "1" * 40}]).encode()
            self._head(200, len(body))
            return self.wfile.write(body)
        if p == f"/org/{repo}/resolve/{HF_SHA}/w.bin" or p == f"/org/{repo}/resolve/main/w.bin":
            self._head(200, HF_SIZE, {"ETag": '"' + "1" * 40 + '"', "X-Repo-Commit": HF_SHA})
            if self.command == "HEAD":
                return
            piece, sent = 1 << 18, 0
            try:
                while sent < HF_SIZE:
                    if repo == "stuck" and sent >= (3 << 19):
                        time.sleep(0.5)
                        continue
                    self.wfile.write(b"w" * piece)
                    self.wfile.flush()
                    sent += piece
                    time.sleep(0.3)
            except OSError:
                return
            return
        body = b'{"error": "not found"}'
        self._head(404, len(body), {"X-Error-Code": "EntryNotFound"})
        self.wfile.write(body)

    do_HEAD = do_GET


@pytest.fixture
def slow_hub(sandbox, monkeypatch):
    """The hub above, and huggingface_hub for the sandbox host's python3 (its user site points at this test
    environment's packages, as an image with huggingface_hub installed)."""
    import sys
    import sysconfig

    site = Path(sandbox["dir"]) / "home" / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
        / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "hub.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowHub)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    (site / "hub.pth").unlink()


def _put_hf(sandbox, repo: str, endpoint: str, tmp_path, tick) -> dict:
    prof = profiles.resolve("sandbox", Path.cwd())
    out = Output(json_mode=True, stdout=io.StringIO(), stderr=io.StringIO())
    with connect(prof) as remote:
        return data.put(prof, remote, out, dp.parse(repo, Path.cwd()), str(tmp_path / "fs"), tick=tick,
                        endpoint=endpoint)


def test_a_hub_download_shows_its_progress(sandbox, slow_hub, tmp_path):
    """review of #35: an hf:// download said 0 bytes until it ended."""
    seen = []
    res = _put_hf(sandbox, "hf://org/slow", slow_hub, tmp_path, seen.append)
    assert (Path(res["path"]) / "w.bin").stat().st_size == HF_SIZE and res["bytes_remote"] == HF_SIZE
    between = [s["progress"] for s in seen if 0 < s["progress"] < HF_SIZE]
    assert between, seen  # bytes were told while it downloaded


def test_a_stalled_hub_download_is_ended(sandbox, slow_hub, tmp_path, monkeypatch):
    """review of #35: an hf:// download had no stall limit (only the client's own timeouts)."""
    monkeypatch.setenv("GPUOPS_DATA_STALL_S", "3")
    started = time.monotonic()
    seen = []
    with pytest.raises(GpuopsError) as e:
        _put_hf(sandbox, "hf://org/stuck", slow_hub, tmp_path, seen.append)
    assert "the download stalled: no byte received for 3s" in e.value.message, e.value.message
    assert time.monotonic() - started < 9  # before the client's own read timeout (10 s) would have said anything
    assert seen and seen[-1]["progress"] >= 1 << 20, seen


def test_a_local_folder_sent_by_rsync_is_under_the_budget_too(sandbox, tmp_path):
    """review of #35: rsync's progress goes through the same tick (--max-cost, the TTL) as a download's; before, a
    big local --data folder crossed with no budget checked."""
    import os

    corpus = Path.cwd() / "corpus"
    corpus.mkdir()
    (corpus / "big.bin").write_bytes(os.urandom(4 << 20))
    seen = []

    def budget(p):
        seen.append(p)
        raise GpuopsError("--max-cost reached")

    prof = profiles.resolve("sandbox", Path.cwd())
    out = Output(json_mode=True, stdout=io.StringIO(), stderr=io.StringIO())
    with connect(prof) as remote, pytest.raises(GpuopsError, match="max-cost"):
        data.put(prof, remote, out, dp.parse("corpus", Path.cwd()), str(tmp_path / "fs"), tick=budget)
    assert seen and seen[0]["progress"] >= 0 and set(seen[0]) == {"progress", "total"}, seen
