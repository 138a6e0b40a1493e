"""watch end to end through the sandbox: plain and JSON modes, --once, the emulated GPU under load, reconnecting
through tests/proxy.Proxy without repeating or losing log lines, Ctrl-C leaving the job running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.helpers import python_sigint
from support.proxy import Proxy
from support.runs import FOREVER, put, run_dir, run_id_of, wait_ended


pytestmark = pytest.mark.usefixtures("cleanup_runs")

COUNT = """\
import os, sys, time
n = int(os.environ.get("N", "20"))
delay = float(os.environ.get("DELAY", "0.1"))
for i in range(n):
    print(f"line {i:04d} loss={1.0 / (i + 1):.4f}", flush=True)
    time.sleep(delay)
sys.exit(int(os.environ.get("RC", "0")))
"""


def test_watch_plain_shows_gpu_load_log_and_final_state(sandbox, gpuops):
    put(sandbox, "count.py", COUNT)
    rid = run_id_of(gpuops("train", "--script", "count.py", "--no-sync", "--no-snapshot", "-e", "N=30", "-e", "DELAY=0.1"))
    res = gpuops("watch", rid, "--interval", "0.5", "--lines", "100")
    assert res.code == 0, res.all
    lines = res.out.splitlines()
    # the emulated GPU shows the job: utilisation ~95% and the job as a GPU process
    samples = [ln for ln in lines if " gpu0 util=" in ln]
    assert any(int(ln.split("util=")[1].split("%")[0]) >= 90 for ln in samples), samples
    assert any("gpu processes:" in ln and "python" in ln for ln in lines)
    logged = [ln.split(" log | ", 1)[1] for ln in lines if " log | " in ln]
    assert logged == [f"line {i:04d} loss={1.0 / (i + 1):.4f}" for i in range(30)]
    assert all(ln[:8].count(":") == 2 for ln in lines)  # timestamped
    assert "succeeded" in lines[-1] or "succeeded" in res.err


def test_watch_json_lines_and_failed_exit(sandbox, gpuops):
    put(sandbox, "count.py", COUNT)
    rid = run_id_of(gpuops("train", "--script", "count.py", "--no-sync", "--no-snapshot", "-e", "N=10", "-e", "RC=2"))
    res = gpuops("watch", rid, "--json", "--interval", "0.5", "--lines", "100")
    assert res.code == 1, res.all
    docs = [json.loads(x) for x in res.out.splitlines()]
    types = {d["type"] for d in docs}
    assert {"log", "state"} <= types
    assert [d["line"] for d in docs if d["type"] == "log"] == [f"line {i:04d} loss={1.0 / (i + 1):.4f}" for i in range(10)]
    final = [d for d in docs if d["type"] == "state"][-1]
    assert final["state"] == "failed" and final["exit_code"] == 2
    assert all(d["at"].endswith("+00:00") for d in docs)  # ISO 8601 with its zone (docs/json.md)
    procs = [d for d in docs if d["type"] == "processes"]
    assert procs and procs[-1]["processes"] == []  # the ended job no longer shows as a GPU process


def test_watch_once_snapshot(sandbox, gpuops):
    put(sandbox, "forever.py", FOREVER)
    rid = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot"))
    time.sleep(0.5)
    res = gpuops("watch", "--once", "--json")
    assert res.code == 0, res.all
    docs = [json.loads(x) for x in res.out.splitlines()]
    state = [d for d in docs if d["type"] == "state"][0]
    assert state["run_id"] == rid and state["state"] == "running"
    sample = [d for d in docs if d["type"] == "sample"][0]
    assert sample["util"] >= 90 and sample["mem_used_mib"] > 1000
    assert [d for d in docs if d["type"] == "processes"][0]["processes"]
    assert gpuops("stop", rid, "--grace", "2").code == 0


def _proxy_profile(sandbox, proxy: Proxy) -> str:
    text = Path(sandbox["profile"]).read_text()
    text = text.replace(f"port: {sandbox['port']}", f"port: {proxy.port}")
    assert f"port: {proxy.port}" in text
    path = Path(sandbox["profile"]).with_name("viaproxy.yaml")
    path.write_text(text)
    return "viaproxy"


def _follow_with_cuts(argv: list, proxy: Proxy, cuts: int, release: Path, streams, rearms) -> SimpleNamespace:
    """`gpuops ARGV` as a process of its own, read as it prints, while the proxy cuts every connection `cuts` times:
    each cut once the command streams (`streams(line)`; again only after `rearms(line)`, its reconnect); then
    `release` lets the job (`_held`) print its last lines. The cuts land while the job runs and the command follows,
    whatever the load (fixed timers cut before it connected, or after the job ended, under xdist). Returns what a
    CliResult has (code, out, err, all)."""
    p = subprocess.Popen([sys.executable, "-m", "gpuops", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ})
    out, done, armed = [], 0, True
    try:
        for line in p.stdout:
            out.append(line)
            if rearms(line):
                armed = True
            elif armed and done < cuts and streams(line):
                proxy.cut_all()
                done, armed = done + 1, False
                if done == cuts:
                    release.touch()
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        release.touch()
        if p.poll() is None:
            p.kill()
    return SimpleNamespace(code=p.returncode, out="".join(out), err=err, all="".join(out) + err)


def _train_and_watch_json_with_cuts(sandbox, gpuops, proxy: Proxy, script: str, text: str, cuts: int, *,
                                    train: tuple = (), watch: tuple = ()):
    """Launch SCRIPT (`_held`) through the proxy, then `watch --json --lines 1000` it while the proxy cuts every
    connection `cuts` times, each once the watch streams (a log line or a sample, after it started or after its last
    reconnect). Returns (run id, the watch's result)."""
    name = _proxy_profile(sandbox, proxy)
    put(sandbox, script, text)
    rid = run_id_of(gpuops("train", "-p", name, "--script", script, "--no-sync", "--no-snapshot", *train))
    res = _follow_with_cuts(["watch", rid, "-p", name, "--json", "--lines", "1000", *watch], proxy, cuts,
                            run_dir(sandbox, rid) / "release",
                            streams=lambda line: json.loads(line).get("type") in ("log", "sample"),
                            rearms=lambda line: json.loads(line).get("type") == "reconnecting")
    return rid, res


# what the jobs of these tests do before their last lines: wait until the test has cut the watch's connections
HOLD = """\
def hold():
    import os, time
    while not os.path.exists(os.path.join(os.environ["GPUOPS_RUN_DIR"], "release")):
        time.sleep(0.05)
"""


def _held(script: str) -> str:
    """The script, waiting for the test's cuts before its line 20 (`HOLD`)."""
    lines = script.splitlines(keepends=True)
    (at,) = [k for k, x in enumerate(lines) if x.startswith("for i in range(")]
    return HOLD + "".join(lines[:at + 1]) + "    if i == 20:\n        hold()\n" + "".join(lines[at + 1:])


def test_watch_reconnects_and_resumes_log_without_repeats_or_losses(sandbox, gpuops):
    proxy = Proxy(sandbox["port"])
    try:
        rid, res = _train_and_watch_json_with_cuts(sandbox, gpuops, proxy, "count.py", _held(COUNT), 2,
                                                   train=("-e", "N=60", "-e", "DELAY=0.1"), watch=("--interval", "0.5"))
        assert res.code == 0, res.all
        docs = [json.loads(x) for x in res.out.splitlines()]
        assert len([d for d in docs if d["type"] == "reconnecting"]) == 2, res.all  # both cuts noticed
        assert [d for d in docs if d["type"] == "connected"]
        logged = [d["line"] for d in docs if d["type"] == "log"]
        assert logged == [f"line {i:04d} loss={1.0 / (i + 1):.4f}" for i in range(60)]
        assert proxy.connections >= 3  # train, watch, and at least one reconnect
    finally:
        proxy.close()


def test_logs_follow_reconnects(sandbox, gpuops):
    proxy = Proxy(sandbox["port"])
    try:
        name = _proxy_profile(sandbox, proxy)
        put(sandbox, "count.py", _held(COUNT))
        rid = run_id_of(gpuops("train", "-p", name, "--script", "count.py", "--no-sync", "--no-snapshot", "-e", "N=30",
                               "-e", "RC=4"))
        res = _follow_with_cuts(["logs", rid, "-p", name, "-f", "-n", "1000"], proxy, 1,
                                run_dir(sandbox, rid) / "release", streams=lambda line: True,
                                rearms=lambda line: False)  # cut once its first line came
        assert res.code == 1 and "exit 4" in res.err, res.all
        assert res.out.splitlines() == [f"line {i:04d} loss={1.0 / (i + 1):.4f}" for i in range(30)]
        assert "reconnecting" in res.err
    finally:
        proxy.close()


def test_ctrl_c_leaves_the_job_running(sandbox, gpuops):
    put(sandbox, "forever.py", FOREVER)
    rid = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot"))
    main = threading.main_thread().ident
    timer = threading.Timer(1.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    with python_sigint():  # Ctrl-C works even in a suite run with it ignored
        timer.start()
        res = gpuops("watch", rid, "--interval", "0.5")
        timer.join()
    assert res.code == 130, res.all
    assert "keeps running" in res.err
    assert not (run_dir(sandbox, rid) / "exit_code").exists()
    assert gpuops("stop", rid, "--grace", "2").code == 0
    assert wait_ended(sandbox, rid) == 130


RAW = """\
import os, sys, time
out = sys.stdout.buffer
for i in range(int(os.environ.get("N", "40"))):
    out.write(b"line %04d bad \\xff\\xfe\\xc3 utf-8\\n" % i if i % 3 == 0 else b"line %04d fine\\n" % i)
    if i == 7:
        out.write(b"L" * 300000 + b" \\xe2\\x82 long\\n")
    out.flush()
    time.sleep(float(os.environ.get("DELAY", "0.1")))
out.write(b"last \\xff without newline")
out.flush()
"""


def raw_lines(log: bytes) -> list[tuple[str, int]]:
    """(line as watch shows it, byte offset after it) for every line of a log, the last one without newline too."""
    got, pos = [], 0
    for piece in log.split(b"\n"):
        if not piece and pos == len(log):
            break
        pos = min(len(log), pos + len(piece) + 1)
        got.append((piece.decode("utf-8", "replace"), pos))
    return got


def test_watch_offsets_count_raw_bytes_through_invalid_utf8_long_lines_and_reconnects(sandbox, gpuops):
    """Invalid UTF-8 and a 300 kB line in the log, the connection cut twice: every line exactly once, whole, with the
    byte offset where it ends in the log file (the resume point), up to a last line without newline."""
    proxy = Proxy(sandbox["port"])
    try:
        rid, res = _train_and_watch_json_with_cuts(sandbox, gpuops, proxy, "raw.py", _held(RAW), 2,
                                                   watch=("--interval", "0.2"))
        assert res.code == 0, res.all
        docs = [json.loads(x) for x in res.out.splitlines()]
        assert len([d for d in docs if d["type"] == "reconnecting"]) == 2, res.all  # both cuts noticed
        logged = [(d["line"], d["offset"]) for d in docs if d["type"] == "log"]
        log = (run_dir(sandbox, rid) / "log").read_bytes()
        assert logged == raw_lines(log)
        assert logged[-1] == ("last \ufffd without newline", len(log))
        assert len(logged) == 42 and logged[8][0] == "L" * 300000 + " \ufffd long"
        assert all(d["util"] is not None for d in docs if d["type"] == "sample")
    finally:
        proxy.close()
    # logs and logs -f print the log's bytes exactly (invalid UTF-8 and all), and nothing else on stdout
    import yaml

    from gpuops.paths import config_dir

    name = _proxy_profile(sandbox, proxy)
    pf = config_dir() / "profiles" / f"{name}.yaml"
    pf.write_text(yaml.safe_dump({**yaml.safe_load(pf.read_text()), "port": sandbox["port"]}))  # the proxy is gone
    for args in (["-f"], []):
        p = subprocess.run([sys.executable, "-m", "gpuops", "logs", rid, "-p", name, "-n", "1000", *args],
                           capture_output=True,
                           timeout=60, env={**os.environ, "NO_COLOR": "1"})
        assert p.returncode == 0, p.stderr
        assert p.stdout == log


ESCAPES = """\
import sys
out = sys.stdout.buffer
out.write(b"before \\x1b]0;pwned title\\x07 \\x1b[2J\\x1b[H\\x1b[10;10Hmoved \\xc2\\x9b31m after\\n")
out.write(b"plain line\\n")
out.flush()
"""


def test_watch_neutralises_escape_sequences_and_logs_stays_byte_exact(sandbox, gpuops):
    """A job's output cannot retitle the terminal, clear the screen or move the cursor in watch's plain mode (the
    dashboard keeps the same safe text); raw `logs` keeps the bytes as the job wrote them, as tail does."""
    put(sandbox, "esc.py", ESCAPES)
    rid = run_id_of(gpuops("train", "--script", "esc.py", "--no-sync", "--no-snapshot"))
    res = gpuops("watch", rid, "--interval", "0.5")
    assert res.code == 0, res.all
    assert "\x1b" not in res.out and "\x07" not in res.out and "\x9b" not in res.out, repr(res.out)
    logged = [ln.split(" log | ", 1)[1] for ln in res.out.splitlines() if " log | " in ln]
    assert logged == ["before \\x1b]0;pwned title\\x07 \\x1b[2J\\x1b[H\\x1b[10;10Hmoved \\x9b31m after", "plain line"]
    log = (run_dir(sandbox, rid) / "log").read_bytes()
    assert b"\x1b]0;pwned title\x07" in log
    import subprocess
    import sys
    import os
    r = subprocess.run([sys.executable, "-m", "gpuops", "logs", rid, "-p", "sandbox"], capture_output=True,
                       env={**os.environ, "NO_COLOR": "1"}, timeout=60)
    assert r.returncode == 0 and r.stdout == log, (r.stdout[:200], r.stderr)
