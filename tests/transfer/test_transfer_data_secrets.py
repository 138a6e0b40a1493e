"""Issue #36: credentials in a `--data` URL (`user:pass@`, a presigned URL's X-Amz-Signature / X-Goog-Signature,
sig=, token=) are secrets: never shown (progress, error, summary), never stored (the instance's .gpuops-source, on a
filesystem every instance that mounts it reads), and they reach the instance as secrets do (on stdin, never a command
line). A `user:pass@` URL works (Basic authentication), where urllib said "Name or service not known"."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpuops.errors import UsageError
from gpuops.transfer import dataplan as dp
from support.transfer import PW, SIG, GuardedServer, run_fetch_script as _fetch

TOK = "tok5ecret42cd"


def test_shown_urls_hide_userinfo_and_signature_like_parameters():
    url = (f"https://alice:{PW}@data.example.com/a/set.tar.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256"
           f"&X-Amz-Credential=AKIAEXAMPLE%2F20260115&X-Amz-Signature={SIG}&X-Amz-Security-Token={TOK}&v=2")
    shown = dp.shown_url(url)
    assert PW not in shown and SIG not in shown and TOK not in shown and "AKIAEXAMPLE" not in shown
    assert shown.startswith("https://****@data.example.com/a/set.tar.gz?") and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in shown
    assert "v=2" in shown and "X-Amz-Signature=****" in shown
    for q in (f"X-Goog-Signature={SIG}", f"sig={SIG}", f"token={SIG}", f"access_token={SIG}", f"Signature={SIG}",
              f"api_key={SIG}"):
        assert SIG not in dp.shown_url(f"https://h/x.tar?{q}"), q
    assert dp.shown_url("https://h/x.tar?page=2") == "https://h/x.tar?page=2"
    assert set(dp.url_secrets(url)) >= {PW, SIG, TOK}


def test_parse_keeps_the_url_and_shows_it_redacted(tmp_path):
    sha = "a" * 64
    src = dp.parse(f"https://bob:{PW}@h.example/set.tar.gz?sig={SIG}#sha256={sha}", tmp_path)
    assert src.text == f"https://bob:{PW}@h.example/set.tar.gz?sig={SIG}"  # what the instance downloads
    assert src.shown == "https://****@h.example/set.tar.gz?sig=****" and src.name == "set"
    with pytest.raises(UsageError) as e:
        dp.parse(f"https://bob:{PW}@h.example/set.tar.gz?sig={SIG}", tmp_path)  # no checksum
    assert PW not in e.value.message and SIG not in e.value.message and "****" in e.value.message


@pytest.fixture
def guarded():
    """A private bucket's stand-in: Basic alice:PW and a signature parameter (support/transfer.py)."""
    srv = GuardedServer()
    yield srv
    srv.close()


def test_the_instance_downloads_a_user_pass_url_and_keeps_no_secret(tmp_path, guarded):
    dest = tmp_path / "data" / "set"
    src = dp.parse(f"http://alice:{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}",
                   tmp_path)
    got = _fetch(dp.fetch_params(src, str(dest)))
    assert got["ok"] and not got["skipped"], got
    assert (dest / "train.txt").read_text() == "private rows\n"
    for f in dest.rglob("*"):  # .gpuops-source included: a filesystem every instance mounting it reads
        if f.is_file():
            assert PW.encode() not in f.read_bytes() and SIG.encode() not in f.read_bytes(), f
    # presigned again (another signature): the same file, nothing downloaded
    again = dp.parse(f"http://alice:{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature=other{SIG}#sha256={guarded.sha}",
                     tmp_path)
    assert _fetch(dp.fetch_params(again, str(dest)))["skipped"]
    # a refused one: the error names no secret
    bad = dp.parse(f"http://alice:wrong{PW}@{guarded.host}/other.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}",
                   tmp_path)
    got = _fetch(dp.fetch_params(bad, str(tmp_path / "d2")))
    assert not got["ok"] and "403" in got["error"] and PW not in got["error"] and SIG not in got["error"], got


def test_put_through_the_sandbox_says_no_secret(sandbox, tmp_path, guarded):
    from gpuops.console import Output
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect
    from gpuops.transfer import data

    prof = profiles.resolve("sandbox")
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    src = dp.parse(f"http://alice:{PW}@{guarded.host}/set.tar.gz?X-Amz-Signature={SIG}#sha256={guarded.sha}",
                   tmp_path)
    with connect(prof, announce=out.info) as remote:
        res = data.put(prof, remote, out, src, None)
        assert Path(res["path"]).joinpath("train.txt").read_text() == "private rows\n"
        bad = dp.parse(f"http://alice:x{PW}@{guarded.host}/other.tar.gz?X-Amz-Signature={SIG}#sha256={'0' * 64}",
                       tmp_path)
        with pytest.raises(Exception) as e:
            data.put(prof, remote, out, bad, None)
    assert "403" in str(e.value)
    said = out.stdout.getvalue() + out.stderr.getvalue() + str(e.value) + str(getattr(e.value, "hint", ""))
    assert "****@" in said
    assert PW not in said and SIG not in said, said
