"""`gpuops run --fs NAME --data SOURCE` end to end through the Lambda emulator: the filesystem's region only, the job
sees GPUOPS_FS and GPUOPS_DATA, a local folder put on the filesystem once (a later run sends only what changed), a
download made by the instance from a local HTTP server and checked against its sha256, setup's caches on the
filesystem."""
from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from gpuops.transfer import dataplan as dp
from support.cloud import TYPE


JOB = """\
import os
fs, data = os.environ.get("GPUOPS_FS"), os.environ.get("GPUOPS_DATA")
print("FS", fs, flush=True)
print("DATA", data, flush=True)
print("READ", open(os.path.join(data, "train.txt")).read().strip(), flush=True)
open(os.path.join(fs, "job-was-here"), "w").write("yes")
"""


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.py", *extra)


@pytest.fixture
def http_files(tmp_path):
    """A plain HTTP server on 127.0.0.1 serving a folder (the stand-in for https://host/file)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.root, srv.base = root, f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def test_run_fs_with_a_local_folder_puts_it_once_and_the_job_sees_both(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2", "us-east-1"])
    assert gpuops("fs", "create", "work", "--region", "us-east-1").code == 0
    (Path.cwd() / "job.py").write_text(JOB)
    corpus = Path.cwd().parent / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("hello data\n")
    (corpus / "big.bin").write_bytes(b"\1" * 200_000)
    r = _run(gpuops, cloud, "--fs", "work", "--data", str(corpus))
    assert r.code == 0, r.all
    assert "filesystem work is in us-east-1: trying only us-east-1" in r.err
    doc = json.loads(r.out)
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    mount = next(i for i in cloud.instances())["file_system_mounts"][0]["mount_point"]
    key = dp.source_key(dp.parse(str(corpus), Path.cwd()))  # a folder of its own per source
    assert f"FS {mount}\n" in log and f"DATA {mount}/gpuops/data/corpus-{key}\n" in log and "READ hello data" in log
    fsdir = cloud.fs_dir("work")
    assert (fsdir / "job-was-here").read_text() == "yes"
    assert (fsdir / "gpuops" / "data" / f"corpus-{key}" / "big.bin").stat().st_size == 200_000
    assert "2 files changed" in r.err
    assert (fsdir / "gpuops" / "cache").is_dir()  # setup's uv/pip caches live on the filesystem
    assert not _live(cloud)
    first_id = doc["run"]
    assert "changed since the last put" not in r.err  # the first put: nothing to compare with
    # a second run: the data is there already; only what changed is sent
    (corpus / "train.txt").write_text("hello again\n")
    (corpus / "big.bin").unlink()  # deleted here: the copy keeps it (gpuops deletes nothing there), and says so
    r = _run(gpuops, cloud, "--fs", "work", "--data", str(corpus))
    assert r.code == 0, r.all
    assert "1 files changed" in r.err and "READ hello again" in (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    assert f"1 file in {mount}/gpuops/data/corpus-{key} is not in {corpus}" in r.err and "too: big.bin" in r.err, r.err
    assert (fsdir / "gpuops" / "data" / f"corpus-{key}" / "big.bin").exists()
    # the folder changed since the last put (review of #35): said, naming the file and the put before
    assert (f"data {corpus}: 1 file changed since the last put into {mount}/gpuops/data/corpus-{key} (run "
            f"{first_id}, ") in r.err and "): train.txt;" in r.err, r.err


def test_run_data_url_is_downloaded_by_the_instance_and_checked(cloud, gpuops, http_files):
    cloud.capacity(TYPE, ["us-east-1"])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        payload = b"from the web\n"
        info = tarfile.TarInfo("train.txt")
        info.size = len(payload)
        t.addfile(info, io.BytesIO(payload))
    (http_files.root / "set.tar.gz").write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (Path.cwd() / "job.py").write_text(JOB)
    assert gpuops("fs", "create", "web", "--region", "us-east-1").code == 0
    r = _run(gpuops, cloud, "--fs", "web", "--data", f"{http_files.base}/set.tar.gz#sha256={digest}")
    assert r.code == 0, r.all
    assert "downloaded by the instance" in r.err
    log = (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    assert "READ from the web" in log and f"/gpuops/data/set-{dp.source_key(dp.parse('https://x/set.tar.gz#sha256=' + digest, Path.cwd()))}\n" in log
    r = _run(gpuops, cloud, "--fs", "web", "--data", f"{http_files.base}/set.tar.gz#sha256={digest}")
    assert r.code == 0 and "already there (checksum matches)" in r.err, r.all
    # a wrong checksum: the data is refused, the job never starts, the instance is terminated
    r = _run(gpuops, cloud, "--fs", "web", "--data", f"{http_files.base}/set.tar.gz#sha256={'0' * 64}")
    assert r.code == 1 and "checksum mismatch" in r.err, r.all
    assert not _live(cloud)


def test_run_data_without_fs_is_a_copy_on_the_instance_disk(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    job = JOB.replace('open(os.path.join(fs, "job-was-here"), "w").write("yes")\n', "")
    (Path.cwd() / "job.py").write_text(job)
    (Path.cwd().parent / "plain").mkdir()
    (Path.cwd().parent / "plain" / "train.txt").write_text("on the disk\n")
    r = _run(gpuops, cloud, "--data", str(Path.cwd().parent / "plain"))
    assert r.code == 0, r.all
    log = (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    assert "FS None\n" in log and "READ on the disk" in log and "/gpuops-data/plain-" in log


HUB_FILES = {"config.json": b'{"hidden": 8}\n', "train.txt": b"from the hub\n"}
HUB_SHA = "c0ffee" + "0" * 34
HUB_TOKEN = "hf_e2e" + "Qw7" * 10  # must reach the hub, and appear in no output, log or file here


@pytest.fixture
def hub():
    """A local server speaking enough of the Hugging Face Hub's API for huggingface_hub's snapshot_download (repo
    info, the recursive tree, HEAD and GET of each file under /resolve/), a private repo: the token is required."""
    seen = []

    class Hub(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body=b"", headers=None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            p = self.path.split("?")[0]
            seen.append((self.command, p, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != f"Bearer {HUB_TOKEN}":
                return self._send(401, b'{"error": "Invalid credentials"}', {"X-Error-Code": "RepoNotFound"})
            if p.startswith("/api/datasets/org/set/tree/"):
                return self._send(200, json.dumps([{"type": "file", "path": f, "size": len(d),
                                                    "oid": hashlib.sha1(d).hexdigest()}
                                                   for f, d in HUB_FILES.items()]).encode())
            if p.startswith("/api/datasets/org/set/revision/"):
                return self._send(200, json.dumps({"id": "org/set", "sha": HUB_SHA,
                                                   "siblings": [{"rfilename": f} for f in HUB_FILES]}).encode())
            for f, d in HUB_FILES.items():
                if p == f"/datasets/org/set/resolve/{HUB_SHA}/{f}":
                    return self._send(200, d, {"ETag": f'"{hashlib.sha1(d).hexdigest()}"', "X-Repo-Commit": HUB_SHA})
            self._send(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"})

        do_HEAD = do_GET

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url, srv.seen = f"http://127.0.0.1:{srv.server_address[1]}", seen
    yield srv
    srv.shutdown()
    srv.server_close()


def test_run_data_hf_is_snapshot_downloaded_by_the_instance_with_the_token_as_a_secret(cloud, gpuops, hub, monkeypatch):
    import sysconfig

    cloud.capacity(TYPE, ["us-east-1"])
    # huggingface_hub on the instance's python3: its user site points at this test environment's packages
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    cloud.image(files={f".local/lib/{ver}/site-packages/hub.pth": sysconfig.get_paths()["purelib"] + "\n"})
    (Path.cwd() / ".env").write_text(f"HF_TOKEN={HUB_TOKEN}\n")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    (Path.cwd() / "job.py").write_text(JOB)
    assert gpuops("fs", "create", "models", "--region", "us-east-1").code == 0
    r = _run(gpuops, cloud, "--fs", "models", "--data", "hf://datasets/org/set")
    assert r.code == 0, r.all
    log = (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    key = dp.source_key(dp.parse("hf://datasets/org/set", Path.cwd()))
    assert "READ from the hub" in log and f"/gpuops/data/org--set-{key}\n" in log
    assert (cloud.fs_dir("models") / "gpuops" / "data" / f"org--set-{key}" / "config.json").read_bytes() == \
        HUB_FILES["config.json"]
    assert ("GET", f"/datasets/org/set/resolve/{HUB_SHA}/train.txt", f"Bearer {HUB_TOKEN}") in hub.seen
    assert HUB_TOKEN not in r.all
    for f in Path.cwd().rglob("*"):  # the run's record, log and profile copies: never the token (.env is the user's)
        if f.is_file() and f.name != ".env":
            assert HUB_TOKEN.encode() not in f.read_bytes(), f


def test_run_data_refusals_before_any_launch(cloud, gpuops):
    (Path.cwd() / "job.py").write_text(JOB)
    r = _run(gpuops, cloud, "--data", "https://example.invalid/x.tar")
    assert r.code == 2 and "sha256=HEX" in r.err
    r = _run(gpuops, cloud, "--data", "no-such-folder")
    assert r.code == 2 and "no such folder" in r.err
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--script", "job.py", "--fs", "missing")
    assert r.code == 2 and "gpuops fs create missing --region" in r.err and "--yes" in r.err
    assert cloud.launch_requests() == 0


def test_a_replacement_attaches_the_filesystem_too(cloud, gpuops):
    """--recover with --fs: the replacement is launched in the filesystem's region with it attached, and the job
    there sees the same files (what the first instance's job wrote on the filesystem)."""
    from support.recovery import RESUMABLE, STEPS, finished_on_a_second_instance, training_with_a_checkpoint

    cloud.capacity(TYPE, ["us-west-2", "us-east-1"])
    assert gpuops("fs", "create", "keep", "--region", "us-east-1").code == 0
    marker = RESUMABLE.replace("start = 0\n", "start = 0\nopen(os.path.join(os.environ['GPUOPS_FS'], "
                                              "os.environ['SSH_CONNECTION'].split()[2]), 'w').write('seen')\n"
                                              "print('ON FS', sorted(os.listdir(os.environ['GPUOPS_FS'])), "
                                              "flush=True)\n")
    p, first = training_with_a_checkpoint(cloud, "--recover", "1", "--fs", "keep", text=marker)
    cloud.preempt(first)
    doc, err = finished_on_a_second_instance(p, first, cloud)
    insts = {i["id"]: i for i in cloud.instances()}
    second = doc["instances"][1]["ids"][0]
    assert insts[first]["file_system_names"] == insts[second]["file_system_names"] == ["keep"]
    assert insts[first]["region"]["name"] == insts[second]["region"]["name"] == "us-east-1"
    assert err.count("filesystem keep is in us-east-1: trying only us-east-1") == 2, err
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    marks = sorted(f.name for f in cloud.fs_dir("keep").iterdir() if f.is_file())  # each instance's address
    assert marks == sorted({insts[first]["_address"], insts[second]["_address"]}) and len(marks) == 2
    assert f"ON FS {marks + ['gpuops']}" in log and f"step {STEPS} saved" in log  # the replacement's job saw the first one's


def test_a_data_folder_inside_the_project_is_not_uploaded_with_the_project(cloud, gpuops):
    """--data ./corpus where corpus is in the project: it goes once to its data folder, not again with the project to
    every instance (the sync's upload leaves it out; the job reads it at GPUOPS_DATA)."""
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "inproj", "--region", "us-east-1").code == 0
    (Path.cwd() / "job.py").write_text(JOB + "print('PROJECT HAS CORPUS', os.path.exists('corpus'), flush=True)\n")
    corpus = Path.cwd() / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("hello data\n")
    (corpus / "big.bin").write_bytes(b"\1" * 300_000)
    r = _run(gpuops, cloud, "--fs", "inproj", "--data", "./corpus")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "READ hello data" in log and "PROJECT HAS CORPUS False" in log, log
    sync = next(s for s in doc["stages"] if s["stage"] == "sync")
    sent = int(sync["detail"].split(", ")[1].split()[0])
    assert sent < 100_000, sync  # the project's code, not the 300 KB corpus
    key = dp.source_key(dp.parse("./corpus", Path.cwd()))
    assert (cloud.fs_dir("inproj") / "gpuops" / "data" / f"corpus-{key}" / "big.bin").stat().st_size == 300_000


WAITS_FOR_ANOTHER_PUT = """\
import os, time
data = os.environ["GPUOPS_DATA"]
deadline = time.time() + 120
while time.time() < deadline:  # until another run has put the folder again (its ledger beside it has 2 lines)
    try:
        if len(open(data + ".puts").read().splitlines()) >= 2:
            break
    except OSError:
        pass
    time.sleep(0.2)
print("READ", open(os.path.join(data, "train.txt")).read().strip(), flush=True)
"""


def test_a_run_whose_data_another_run_changed_under_it_is_warned(cloud, gpuops):
    """review of #35 ("warn every run whose data changed under it"): run A reads ./corpus on the filesystem; run B,
    started while A trains, puts a changed train.txt into the same folder; A's summary warns, naming B's put and
    the file."""
    import subprocess
    import sys

    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "shared", "--region", "us-east-1").code == 0
    (Path.cwd() / "job.py").write_text(WAITS_FOR_ANOTHER_PUT)
    (Path.cwd() / "plain.py").write_text(JOB.replace('open(os.path.join(fs, "job-was-here"), "w").write("yes")', ""))
    corpus = Path.cwd().parent / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("version one\n")
    key = dp.source_key(dp.parse(str(corpus), Path.cwd()))
    ledger = cloud.fs_dir("shared") / "gpuops" / "data" / f"corpus-{key}.puts"
    a = subprocess.Popen([sys.executable, "-m", "gpuops", "run", "--type", TYPE, "--key", str(cloud.key), "--yes",
                          "--json", "--script", "job.py", "--fs", "shared", "--data", str(corpus)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (ledger.is_file() and ledger.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ledger.is_file(), "run A never put its data"
        (corpus / "train.txt").write_text("version two, longer\n")
        r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "plain.py",
                   "--fs", "shared", "--data", str(corpus))
        assert r.code == 0, r.all
        b_id = json.loads(r.out)["run"]
        out, err = a.communicate(timeout=180)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err
    doc = json.loads(out)
    assert "READ version two" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    said = [w for w in doc["warnings"] if w.startswith("the data changed under this run")]
    assert said and f"run {b_id} at " in said[0] and "changed 1 file (train.txt)" in said[0], doc["warnings"]
    assert said[0] in err
