"""Issue #36 through `gpuops run`: a `--data` URL with `user:pass@` and a presigned signature downloads (Basic
authentication), and its credentials appear nowhere: not on stderr or stdout (progress, error, summary), not in
runs/pipelines/<id>.json, not in the filesystem's .gpuops-source that every instance mounting it reads; the secret
URL waits in a 0600 file beside the record while the run goes on, removed when it ends. Through the emulator."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from support.cloud import TYPE
from support.transfer import PW, SIG, GuardedServer


@pytest.fixture
def guarded():
    srv = GuardedServer()
    yield srv
    srv.close()

JOB = ("import os\nd = os.environ['GPUOPS_DATA']\n"
       "print('READ', open(os.path.join(d, 'train.txt')).read().strip(), flush=True)\n")


def _leaks(text: str) -> bool:
    return PW in text or SIG in text


def test_run_data_credentials_stay_secret(cloud, gpuops, guarded):
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "priv", "--region", "us-east-1").code == 0
    (Path.cwd() / "job.py").write_text(JOB)
    url = f"http://alice:{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}"
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.py", "--fs",
               "priv", "--data", url)
    assert r.code == 0, r.all
    assert not _leaks(r.all), r.all
    assert "****@" in r.err  # the progress line names the URL, redacted
    doc = json.loads(r.out)
    assert "READ private rows" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    records = Path.cwd() / "runs" / "pipelines"
    for f in records.iterdir():  # the record, and no secret file left once the run ended
        assert not _leaks(f.read_text()), f
    for f in cloud.fs_dir("priv").rglob("*"):
        if f.is_file():
            assert not _leaks(f.read_bytes().decode("utf-8", "replace")), f

    # a refused download: the error and the summary name no secret either
    bad = f"http://alice:x{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}"
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "job.py", "--data", bad)
    assert r.code == 1 and "403" in r.err, r.all
    assert not _leaks(r.all), r.all
    for f in records.iterdir():
        assert not _leaks(f.read_text()), f


def test_the_secret_url_waits_in_a_private_file_while_the_run_is_kept(cloud, gpuops, guarded):
    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "job.py").write_text(JOB)
    url = f"http://alice:{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}"
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.py", "--data", url,
               "--keep")
    assert r.code == 0, r.all
    records = Path.cwd() / "runs" / "pipelines"
    secret = [f for f in records.iterdir() if _leaks(f.read_text())]
    assert not secret or all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in secret), secret
    (rec,) = [json.loads(f.read_text()) for f in records.glob("*.json")]
    assert rec["data"].startswith("http://****@") and "X-Amz-Signature=****" in rec["data"], rec["data"]
    assert gpuops("down", json.loads(r.out)["profile"], "--yes").code == 0
