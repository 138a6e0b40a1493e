"""Secrets and the user's processes (#21), end to end: the API key as it is loaded (line breaks, non-ASCII, the file it
comes from) and in every text gpuops can print, answers that are not Lambda's (a proxy's HTML page), `sandbox down`
ending only the sandbox host's own processes, warnings kept in --json documents, and `sync NAME`.

Through the Lambda emulator (faults as data: `proxy-page`) and the real sandbox (sshd on 127.0.0.1)."""
from __future__ import annotations

import base64
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from gpuops.cloud.ledger import Ledger
from support.cloud import API_KEY, TYPE
from support.cloud import managed_profile


GPUOPS = [sys.executable, "-m", "gpuops"]


def _every_form(key: str) -> list[str]:
    """The key as a text may carry it: raw, escaped, as bytes, URL-encoded, base64 as in a Basic header, and its
    visible pieces."""
    forms = [key, repr(key)[1:-1], repr(key.encode())[2:-1], quote(key, safe=""),
             base64.b64encode((key + ":").encode()).decode(), base64.b64encode(key.encode()).decode()]
    return forms + [p for p in key.replace("\r", "\n").split("\n") if len(p) >= 8]


def _leaks(key: str, text: str) -> list[str]:
    return [f for f in _every_form(key) if f in text]


# -- 1. the key as it is loaded ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,what", [
    (API_KEY[:20] + "\n" + API_KEY[20:], "a line break (\\n) at character 21"),
    (API_KEY[:20] + "\r" + API_KEY[20:], "a carriage return (\\r) at character 21"),
    (API_KEY[:20] + "é" + API_KEY[20:], "a non-ASCII character (U+00E9) at character 21"),
])
def test_a_key_with_a_line_break_or_non_ascii_is_refused_at_once_naming_its_source(cloud, gpuops, monkeypatch,
                                                                                     bad, what):
    monkeypatch.setenv("LAMBDA_API_KEY", bad)
    started = time.monotonic()
    for args in (["--debug", "ls"], ["cloud", "types", "--json"], ["--debug", "up", "k", "--type", TYPE, "--key",
                                                                   str(cloud.key), "--yes"]):
        r = gpuops(*args)
        assert r.code == 2, r.all
        assert f"the Lambda API key from LAMBDA_API_KEY is not usable: it holds {what}" in r.err, r.err
        assert "retrying" not in r.err and "internal error" not in r.err
        assert ("Traceback" in r.err) == (args[0] == "--debug")
        assert not _leaks(bad, r.all), _leaks(bad, r.all)
    assert time.monotonic() - started < 5  # no backoff: nothing was sent
    assert cloud.launch_requests() == 0 and not cloud.instances()


def test_a_trailing_line_break_of_a_key_file_or_a_crlf_is_dropped(cloud, gpuops, monkeypatch):
    monkeypatch.setenv("LAMBDA_API_KEY", API_KEY + "\r\n")
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all
    monkeypatch.delenv("LAMBDA_API_KEY")
    f = Path.home() / ".lambda_cloud" / "lambda_keys"
    f.parent.mkdir()
    f.write_bytes(f"api_key = {API_KEY}\r\n".encode())
    f.chmod(0o600)
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all


def test_a_non_ascii_key_in_the_key_file_is_refused_naming_the_file(cloud, gpuops, monkeypatch):
    monkeypatch.delenv("LAMBDA_API_KEY")
    f = Path.home() / ".lambda_cloud" / "lambda_keys"
    f.parent.mkdir()
    bad = API_KEY[:10] + "\u00a0" + API_KEY[10:]  # a no-break space pasted from a web page
    f.write_text(f"api_key = {bad}\n")
    f.chmod(0o600)
    r = gpuops("--debug", "cloud", "types")
    assert r.code == 2, r.all
    assert f"the Lambda API key from {f} is not usable: it holds a non-ASCII character (U+00A0) at character 11" in r.err
    assert "internal error" not in r.err and not _leaks(bad, r.all)


def test_redaction_catches_every_form_of_a_key_in_any_text():
    from gpuops.cloud import api

    key = "sk_redact_Q7w\nE5r_T9y_é_" + "x" * 20
    api.Secret(key)
    text = " | ".join(_every_form(key) + [quote(key, safe="").lower(), json.dumps(key)])
    scrubbed = api.redact(text)
    assert not _leaks(key, scrubbed) and quote(key, safe="").lower() not in scrubbed, scrubbed
    assert scrubbed.count("***") >= len(_every_form(key))
    assert api.redact("nothing secret here") == "nothing secret here"


def test_a_client_given_a_bad_key_refuses_before_sending_and_a_url_httpx_refuses_is_local(cloud, gpuops, monkeypatch):
    from gpuops.cloud import api
    from gpuops.errors import ExitCode, GpuopsError

    key = API_KEY + "\nX-Injected: 1"
    with pytest.raises(GpuopsError) as e:
        api.Client(api.Secret(key), cloud.url)
    assert e.value.code == ExitCode.USAGE and not _leaks(key, str(e.value) + (e.value.hint or ""))
    # a URL without a scheme: httpx refuses it locally; retried as a network failure, it took 10 s and exit 1
    monkeypatch.setenv("GPUOPS_LAMBDA_API_URL", cloud.url.split("://", 1)[1])
    started = time.monotonic()
    r = gpuops("ls")
    assert r.code == 2, r.all
    assert "request not sent" in r.err and "retrying" not in r.err and time.monotonic() - started < 5


def test_the_error_line_and_debug_traceback_of_any_exception_are_scrubbed(capsys):
    """An exception of any library may carry the key (escaped, as bytes): cli/main's one error line and its --debug
    traceback are scrubbed as a whole, whatever raised."""
    from gpuops.cli import main
    from gpuops.cloud import api

    key = "sk_tb_" + "Hj4" * 10
    api.Secret(key)
    try:
        raise RuntimeError(f"header was {('Bearer ' + key).encode()!r} and {quote(key)}")
    except RuntimeError as exc:
        main.DEBUG = True
        try:
            main._report(f"internal error: RuntimeError: {exc}", f"key {key}", exc)
        finally:
            main.DEBUG = False
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: header was" in err and "***" in err
    assert not _leaks(key, err), _leaks(key, err)


# -- 3. a .env others can read -------------------------------------------------------------------------------------
def test_an_api_key_in_a_dotenv_others_can_read_is_refused_like_the_key_file(cloud, gpuops, monkeypatch, isolated):
    monkeypatch.delenv("LAMBDA_API_KEY")
    dot = isolated / ".env"
    dot.write_text(f"LAMBDA_API_KEY={API_KEY}\n")
    dot.chmod(0o644)
    r = gpuops("ls")
    assert r.code == 3, r.all
    assert f"{dot} is readable by others (mode 0644)" in r.err and f"chmod 600 {dot}" in r.err
    assert not _leaks(API_KEY, r.all)
    dot.chmod(0o640)  # group-readable is readable by others too
    assert gpuops("ls").code == 3
    dot.chmod(0o600)
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all


def test_a_job_secret_from_a_dotenv_others_can_read_is_sent_with_a_warning(sandbox, gpuops, isolated):
    from support.runs import run_id_of, wait_ended

    (isolated / "job.sh").write_text("#!/bin/sh\necho ok\n")
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "secrets: [HF_TOKEN]\n")
    dot = isolated / ".env"
    dot.write_text("HF_TOKEN=hf_loose_0123456789\n")
    dot.chmod(0o644)
    r = gpuops("train", "--script", "job.sh", "--no-snapshot")
    assert r.code == 0, r.all
    assert (f"warning: {dot} is readable by others (mode 0644) and holds the secret(s) HF_TOKEN sent to the job: "
            f"chmod 600 {dot}") in r.err
    assert "hf_loose_0123456789" not in r.all
    assert wait_ended(sandbox, run_id_of(r)) == 0
    dot.chmod(0o600)
    r = gpuops("train", "--script", "job.sh", "--no-snapshot", "--no-sync")
    assert r.code == 0, r.all
    assert "readable by others" not in r.err
    assert wait_ended(sandbox, run_id_of(r)) == 0


# -- 7. a key file that is not a file ----------------------------------------------------------------------------
def test_a_key_file_that_is_a_folder_says_so(cloud, gpuops, monkeypatch):
    monkeypatch.delenv("LAMBDA_API_KEY")
    f = Path.home() / ".lambda_cloud" / "lambda_keys"
    f.mkdir(parents=True)
    r = gpuops("ls")
    assert r.code == 2, r.all
    assert f"{f} is a folder" in r.err and "no Lambda API key" not in r.err


# -- 6. answers that are not Lambda's ----------------------------------------------------------------------------
def test_a_proxys_401_page_is_an_authentication_error(cloud, gpuops):
    cloud.fault("proxy-page", times=None, status=401)
    for args in (["ls"], ["cloud", "types"], ["--debug", "cloud", "keys"]):
        r = gpuops(*args)
        assert r.code == 3, r.all
        assert 'not an answer of Lambda\'s API: Unauthorized, text/html "401 Authorization Required"' in r.err
        assert "HTTP 401" in r.err and "proxy" in r.err and not _leaks(API_KEY, r.all)
    cloud.clear_faults()
    cloud.fault("proxy-page", times=None, status=403)
    assert gpuops("ls").code == 3


def test_a_proxys_502_page_is_retried_then_exits_1_naming_it(cloud, gpuops):
    cloud.fault("proxy-page", times=None, status=502)
    r = gpuops("ls")
    assert r.code == 1, r.all
    assert "retrying" in r.err and 'Bad Gateway, text/html "502 Bad Gateway"' in r.err
    cloud.clear_faults()
    cloud.fault("proxy-page", times=1, status=502)  # once: the retry gets the API's answer
    assert gpuops("ls", "--json").code == 0


def test_a_proxys_404_page_on_terminate_never_reads_as_already_gone(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = gpuops("up", "px", "--type", TYPE, "--key", str(cloud.key), "--yes", "--no-verify")
    assert r.code == 0, r.all
    # a proxy answers 404 pages for the terminate request and the instance's record: Lambda's 404 carries
    # global/object-does-not-exist; this one says nothing about the instance, which still bills
    cloud.fault("proxy-page", times=None, status=404, path="/instance")
    r = gpuops("down", "px", "--yes")
    assert r.code == 1, r.all
    assert 'not an answer of Lambda\'s API: Not Found, text/html "404 Not Found"' in r.err
    live = [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]
    assert len(live) == 1
    assert [x.state for x in Ledger().records() if x.open]  # the ledger and the profile still say it may bill
    assert yaml.safe_load((Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "px.yaml").read_text()
                          )["cloud"]["state"] == "active"
    cloud.clear_faults()
    r = gpuops("down", "px", "--yes")
    assert r.code == 0, r.all


# -- 2. sandbox down ends the host's processes, not the caller's ---------------------------------------------------
def _wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_sandbox_down_ends_the_hosts_jobs_and_spares_the_callers_shell_and_its_siblings(starts_hosts, tmp_path):
    from gpuops.sandbox import host
    from gpuops.sandbox.host import _alive  # running and not a zombie

    sb = tmp_path / "sb"
    env = dict(os.environ, GPUOPS_SANDBOX_DIR=str(sb))  # exported in the user's shell, as the issue found it
    pids: list[int] = []
    shell = None
    try:
        r = subprocess.run(GPUOPS + ["sandbox", "up", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        port = json.loads(r.stdout)["port"]
        ssh = ["ssh", "-F", "none", "-i", str(sb / "client_ed25519"), "-p", str(port), "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}",
               f"{getpass.getuser()}@127.0.0.1"]
        # a job a session left running, detached from it (setsid, as train's launcher does), and one still attached
        r = subprocess.run(ssh + ["setsid sh -c 'echo $$ > detached.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &"
                                  " sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert _wait_for(lambda: (sb / "home" / "detached.pid").exists())
        detached = int((sb / "home" / "detached.pid").read_text())
        pids.append(detached)
        assert _alive(detached)
        # the user's shell: a sibling (an editor, another tool) and `gpuops sandbox down` as its child
        editor = subprocess.Popen(["sleep", "300"], env=env)
        pids.append(editor.pid)
        script = (f"sleep 300 & echo $! > sibling.pid; {' '.join(GPUOPS)} sandbox down --json > down.json; "
                  "echo $? > down.rc; wait")
        shell = subprocess.Popen(["sh", "-c", script], cwd=tmp_path, env=env, start_new_session=True)
        assert _wait_for(lambda: (tmp_path / "down.rc").exists() or shell.poll() is not None, 60)
        assert shell.poll() is None, f"sandbox down killed its caller (exit {shell.returncode})"
        assert (tmp_path / "down.rc").read_text().strip() == "0"
        assert json.loads((tmp_path / "down.json").read_text())["stopped"] is True
        sibling = int((tmp_path / "sibling.pid").read_text())
        pids.append(sibling)
        assert _alive(sibling) and _alive(editor.pid)
        assert _wait_for(lambda: not _alive(detached), 10), "the job the session left running still runs"
        assert not host._listening(port)
    finally:
        if shell is not None and shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        host.stop(sb)


# -- 4. --json keeps warnings --------------------------------------------------------------------------------------
def test_sandbox_up_json_says_when_it_moved_to_another_port(starts_hosts, gpuops, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_SANDBOX_DIR", str(tmp_path / "sb"))
    try:
        r = gpuops("sandbox", "up", "--json")
        assert r.code == 0, r.all
        doc = json.loads(r.out)
        port = doc["port"]
        assert doc["warnings"] == []
        assert gpuops("sandbox", "down").code == 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            r = gpuops("sandbox", "up", "--json")
            assert r.code == 0, r.all
            doc = json.loads(r.out)
        assert doc["port"] != port
        assert doc["warnings"] == [f"port {port} is taken by another program; the sandbox now listens on "
                                   f"{doc['port']} (profile 'sandbox' updated)"]
        r = gpuops("sandbox", "down", "--json")
        assert json.loads(r.out) == {"stopped": True, "slurm_stopped": False, "warnings": []}
    finally:
        gpuops("sandbox", "down")


def test_sync_and_fetch_json_carry_the_profiles_warnings(sandbox, gpuops, isolated):
    from support.runs import remote_project

    managed_profile(sandbox, "late", ttl_in=-600)
    (isolated / "a.txt").write_text("a")
    r = gpuops("sync", "-p", "late", "--json")
    assert r.code == 0, r.all
    warnings = json.loads(r.out)["warnings"]
    assert len(warnings) == 1 and "instance inst-late is past its limit (TTL passed" in warnings[0]
    assert f"warning: {warnings[0]}" in r.err  # and still said to the person
    (remote_project(sandbox) / "checkpoints").mkdir(parents=True)
    (remote_project(sandbox) / "checkpoints" / "m.pt").write_text("m")
    r = gpuops("fetch", "-p", "late", "--json")
    assert r.code == 0, r.all
    fetched = json.loads(r.out)["warnings"]  # the seconds in "TTL passed 10m01s ago" move on
    assert len(fetched) == 1 and "instance inst-late is past its limit (TTL passed" in fetched[0]
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0 and json.loads(r.out)["warnings"] == []


# -- 5. sync NAME --------------------------------------------------------------------------------------------------
def test_sync_takes_the_profile_as_its_argument_as_setup_and_verify_do(sandbox, gpuops, isolated):
    (isolated / "b.txt").write_text("b")
    r = gpuops("sync", "sandbox", "--json")
    assert r.code == 0, r.all
    assert json.loads(r.out)["profile"] == "sandbox"
    r = gpuops("sync", "sandbox", "-p", "other")
    assert r.code == 2 and "two profiles given" in r.err


def test_fetch_given_a_profile_as_its_argument_says_what_it_means(sandbox, gpuops):
    r = gpuops("fetch", "sandbox")
    assert r.code == 2, r.all
    assert "'sandbox' is a profile, not a name in the fetch: map" in r.err and "gpuops fetch -p sandbox" in r.err
    r = gpuops("fetch", "nonesuch")  # not a profile: fetch's own message, as before
    assert r.code == 2 and "'nonesuch' is not in the profile's fetch: map" in r.err
