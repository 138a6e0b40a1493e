"""The cost guard as every command sees it, through the sandbox's real sshd: a profile with a `cloud:` block (as
`gpuops up` writes it) warns when past its TTL, and `status` shows the instance's cost so far and time left, and
restarts the idle clock when it sees work."""
from __future__ import annotations

import json
import time

from gpuops.cloud.ledger import Ledger
from support.cloud import managed_profile


def test_command_on_a_profile_past_its_ttl_warns(sandbox, gpuops):
    managed_profile(sandbox, "old", ttl_in=-600)
    r = gpuops("status", "-p", "old")
    assert r.code == 0, r.all
    assert "warning: profile 'old': instance inst-old is past its limit (TTL passed 10m" in r.err
    assert "gpuops down old" in r.err
    assert "cost so far $2.49" in r.out and "TTL left -10m" in r.out


def test_status_shows_cost_and_time_left_without_warning_inside_the_ttl(sandbox, gpuops):
    managed_profile(sandbox, "fresh", ttl_in=7200, launched_ago=1800)
    r = gpuops("status", "-p", "fresh", "--json")
    assert r.code == 0, r.all
    assert "warning" not in r.err
    cloud = json.loads(r.out)["cloud"]
    assert cloud["instance_id"] == "inst-fresh" and cloud["cost_so_far"] == 1.25  # half an hour at $2.49
    assert 7100 < cloud["ttl_left_s"] <= 7200 and not cloud["expired"]


def test_a_busy_sample_restarts_the_idle_clock(sandbox, gpuops, isolated):
    managed_profile(sandbox, "idler", ttl_in=None, idle=600, launched_ago=1200)
    r = gpuops("status", "-p", "idler")
    assert r.code == 0, r.all
    assert "idle limit passed" in r.err  # no run, GPUs idle for 20 min against a 10 min limit
    assert Ledger().get("launch-idler").last_active is None
    (isolated / "job.sh").write_text("#!/bin/sh\nsleep 30\n")
    r = gpuops("train", "-p", "idler", "--script", "job.sh")
    assert r.code == 0, r.all
    try:
        before = time.time()
        r = gpuops("status", "-p", "idler")
        assert r.code == 0, r.all
        assert Ledger().get("launch-idler").last_active >= before  # the running run counted as work
        r = gpuops("status", "-p", "idler")
        assert "idle limit passed" not in r.err and "idle limit in 9m" in r.out
        r = gpuops("watch", "-p", "idler", "--once")
        assert "instance inst-idler, cost so far $0.8" in r.err  # 20 min at $2.49/h
    finally:
        gpuops("stop", "-p", "idler", "--grace", "0.1")


def test_gone_profile_says_so(sandbox, gpuops):
    managed_profile(sandbox, "ended", ttl_in=None, state="gone")
    r = gpuops("status", "-p", "ended")
    assert "profile 'ended' is marked gone" in r.err
