"""Issue #36: a connection cut between the launch checks and the launch says whether anything was launched: "nothing
was launched" when the launch never reached the host (until then it said only "connection lost"); a cut during the
launch says it is not known, and how to find out. Through the sandbox's sshd behind a TCP proxy that cuts."""
from __future__ import annotations

import os
import time
from pathlib import Path

import yaml

from support.proxy import Proxy


def _via(proxy: Proxy, sandbox) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["port"] = proxy.port
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "cut.yaml").write_text(yaml.safe_dump(data))


def test_a_cut_after_the_checks_says_nothing_was_launched(sandbox, gpuops, isolated, monkeypatch):
    from gpuops.jobs import scripts

    proxy = Proxy(sandbox["port"])
    real = scripts.launch_bundle

    def cut_then_bundle(**kw):  # the checks passed; the link drops before the launch goes out
        proxy.cut_all()
        return real(**kw)

    monkeypatch.setattr(scripts, "launch_bundle", cut_then_bundle)
    try:
        _via(proxy, sandbox)
        (isolated / "job.sh").write_text("#!/bin/sh\necho should-not-run\n")
        r = gpuops("train", "-p", "cut", "--script", "job.sh", "--no-snapshot")
    finally:
        proxy.close()
    assert r.code == 3, r.all
    assert "before the launch of job-" in r.err and "nothing was launched" in r.err, r.err
    assert "Traceback" not in r.all
    runs = sandbox["dir"] / "home" / isolated.name / ".gpuops" / "runs"
    assert not runs.is_dir() or not list(runs.iterdir())  # no run folder on the host
    assert not (isolated / "runs").is_dir() or not list((isolated / "runs").iterdir())


def test_a_cut_during_the_launch_says_it_is_not_known(sandbox, gpuops, isolated, monkeypatch):
    import threading

    from gpuops.jobs import scripts

    proxy = Proxy(sandbox["port"])
    real = scripts.launch_bundle

    reached = isolated / "launch-reached-the-host"  # the sandbox host shares this machine's files

    def cut_once_reached() -> None:
        deadline = time.monotonic() + 60
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proxy.cut_all()

    def slow_bundle(**kw):  # the launch reaches the host and is under way (sleeping) when the link drops
        threading.Thread(target=cut_once_reached, daemon=True).start()
        return f"touch {reached}\nsleep 3\n" + real(**kw)

    monkeypatch.setattr(scripts, "launch_bundle", slow_bundle)
    try:
        _via(proxy, sandbox)
        (isolated / "job.sh").write_text("#!/bin/sh\necho hi\n")
        r = gpuops("train", "-p", "cut", "--script", "job.sh", "--no-snapshot")
    finally:
        proxy.close()
    assert r.code == 3, r.all
    assert "during the launch of job-" in r.err and "whether the job started is not known" in r.err, r.err
    assert "gpuops status -p cut" in r.err, r.err
    # the host's side of the launch may go on after the cut (its sleep, then the launch of a job that ends at once):
    # waited for, so that its run never lands in the next test of this worker, which shares the host (CI: "another
    # gpuops run is still running on the host: job-...")
    runs = sandbox["dir"] / "home" / isolated.name / ".gpuops" / "runs"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(runs.glob("job-*/exit_code")):
        time.sleep(0.1)


def test_run_says_the_cut_launch_in_its_own_words():
    """`gpuops run`'s train stage: a launch that never reached the host is "not launched" once; one whose start is
    unknown is never called "not launched" (the run terminates the instance, and with it anything that started)."""
    from gpuops.pipeline import stages as pl

    msg, hint = pl.launch_failure("connection to h was lost before the launch of r1: nothing was launched (the checks "
                                  "had passed)", "run the same command again", kept=False)
    assert msg.count("not launched") + msg.count("nothing was launched") == 1, msg
    msg, hint = pl.launch_failure("connection to h was lost during the launch of r1: whether the job started is not "
                                  "known", "`gpuops status -p run-x` lists the host's runs", kept=False)
    assert "not launched" not in msg and "not known" in msg, msg
    assert "terminate the instance" in hint, hint
    msg, _ = pl.launch_failure("train.py imports x, which py cannot import; not launching", None, kept=False)
    assert msg == "not launched: train.py imports x, which py cannot import", msg
