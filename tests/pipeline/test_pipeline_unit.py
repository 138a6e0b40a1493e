"""gpuops run, pure half: stage order after every outcome, spend, budget, summary, the record on disk."""
from __future__ import annotations

import pytest

from gpuops.pipeline import stages as pl
from support.stages import done, rec


def test_stages_in_order_and_an_interrupted_stage_runs_again():
    r = rec()
    assert pl.next_stage(r) == "up"
    done(r, "up", "sync")
    assert pl.next_stage(r) == "setup"  # the project is on the host before setup installs from its files
    r.stage("setup").started = 30  # crashed mid-stage
    assert pl.next_stage(r) == "setup"
    done(r, "setup", "train", "watch", "fetch")
    assert pl.next_stage(r) == "down"
    done(r, "down")
    assert pl.next_stage(r) is None


def test_refused_launch_goes_straight_down():
    r = done(rec(), "up", "sync", "setup")
    done(r, "train", ok=False)
    assert pl.next_stage(r) == "down"


def test_failed_job_still_fetches_then_goes_down():
    r = done(rec(), "up", "sync", "setup", "train")
    done(r, "watch", ok=False)
    assert pl.next_stage(r) == "fetch"
    done(r, "fetch")
    assert pl.next_stage(r) == "down"


def test_failed_fetch_keeps_the_instance():
    r = done(rec(), "up", "sync", "setup", "train", "watch")
    done(r, "fetch", ok=False)
    assert pl.next_stage(r) is None


def test_failed_setup_terminates_unless_keep_and_keep_never_goes_down():
    r = done(rec(), "up", "sync")
    done(r, "setup", ok=False)
    assert pl.next_stage(r) == "down"
    done(r, "down")
    assert pl.next_stage(r) is None
    k = done(rec(keep=True), "up", "sync", "setup", "train", "watch", "fetch")
    assert pl.next_stage(k) is None


def test_failed_up_ends_the_run():
    r = done(rec(), "up", ok=False)
    assert pl.next_stage(r) is None


def test_spend_counts_every_node_from_the_launch_until_terminated():
    r = rec(price_per_hour=3.6, nodes=2)
    assert pl.spend(r, 100) == 0.0
    r.stage("up").started = 100
    assert pl.spend(r, 100 + 3600) == pytest.approx(7.2)
    d = r.stage("down")
    d.started, d.ended, d.ok = 1000, 1900, True
    assert pl.spend(r, 99999) == pytest.approx(1800 / 3600 * 3.6 * 2)


def test_over_budget():
    """$1 at $3.6/h is 1000 s; the run stops when what follows the stop still fits (issue 42): the next sample (2 s),
    the job's stop (a round: 2 s before the run measured its sync) and the log's fetch (two rounds), the termination
    (6 s before the run knew its cloud's poll)."""
    r = rec(price_per_hour=3.6, max_cost=1.0)
    r.stage("up").started = 0
    assert not pl.over_budget(r, 985.9)
    assert pl.over_budget(r, 986.1)
    assert not pl.over_budget(rec(price_per_hour=3.6), 10**9)


def test_the_stop_leaves_room_for_what_this_run_measured():
    """The tail from this run's own figures: its sync (a round), the last checkpoint fetch, its cloud's poll."""
    r = rec(price_per_hour=3.6, max_cost=1.0, fetch=["checkpoints"])
    r.stage("up").started = 0
    r.stage("sync").started, r.stages["sync"].ended = 10, 10.5  # a round: 0.5 s
    r.terminate_s = 1.2
    r.checkpoint = {"name": "checkpoints", "fetch_s": 4.0}  # twice that is more than six rounds or the floor
    tail = 2.0 + 0.5 + 1.0 + 8.0 + 1.2
    assert pl.tail_cost(r) == pytest.approx(tail / 1000)
    assert not pl.over_budget(r, 1000 - tail - 0.1) and pl.over_budget(r, 1000 - tail + 0.1)
    r.checkpoint = None  # no fetch measured: six rounds (3 s), and 6 s at least (money.FETCH_FLOOR_S)
    assert pl.tail_cost(r) == pytest.approx((2.0 + 0.5 + 1.0 + 6.0 + 1.2) / 1000)


def test_summary_and_overhead():
    r = done(rec(price_per_hour=36.0), "up", "sync", "setup", "train", "watch", "fetch", "down", dur=10)
    rows = pl.summary(r, 1000)
    assert [x["stage"] for x in rows] == [s for s in pl.STAGES if s != "push"]  # push: only on a replacement
    assert rows[0]["label"] == "waiting for capacity, booting" and rows[0]["cost"] == pytest.approx(0.1)
    ov = pl.overhead(r)
    assert ov == {"before_job_s": 30.0, "after_job_s": 10.0}


def test_record_round_trips_and_find(tmp_path):
    r = done(rec(fetch=["checkpoints"], args=["--quick"]), "up")
    pl.save(r, tmp_path)
    back = pl.find(tmp_path, None)
    assert back.to_json() == r.to_json()
    assert pl.find(tmp_path, "r") .id == "r1"
    back.outcome = pl.SUCCEEDED
    pl.save(back, tmp_path)
    assert pl.find(tmp_path, None) is None  # nothing left to resume
    assert pl.find(tmp_path, "nope") is None


def test_fleet_verify_lines_name_failing_hosts_and_differences():
    import json

    from gpuops.pipeline.hoststages import fleet_verify_lines

    doc = {"hosts": [{"rank": 0, "host": "10.0.0.1", "code": 1, "error": None, "report": {"checks": [
                         {"status": "pass", "title": "GPU visible", "measured": "1"},
                         {"status": "fail", "title": "torch sees the GPUs", "measured": "CPU-only build"}]}},
                     {"rank": 1, "host": "10.0.0.2", "code": 3, "error": "connection refused", "report": None}],
           "fleet": {"checks": [{"status": "warn", "title": "same NVIDIA driver on every host",
                                 "measured": "535 on #0; 570 on #1"},
                                {"status": "pass", "title": "same GPU model on every host", "measured": "H100"}]}}
    assert fleet_verify_lines(json.dumps(doc)) == [
        ("fail", "host #0: torch sees the GPUs: CPU-only build"),
        ("fail", "host #1 (10.0.0.2): connection refused"),
        ("warn", "fleet: same NVIDIA driver on every host: 535 on #0; 570 on #1")]
    assert fleet_verify_lines("") == [("fail", "the fleet verify gave no report")]


def test_a_run_whose_instance_ended_under_it_only_goes_down():
    r = done(rec(), "up", "setup", "sync", "train")
    r.stage("watch").started = 40
    r.lost = "instance i-1 is preempted"
    assert pl.next_stage(r) == "down"
    done(r, "down", t0=50)
    assert pl.next_stage(r) is None
    k = done(rec(keep=True, lost="instance i-1 is terminated"), "up")
    assert pl.next_stage(k) == "down"  # with --keep too: down only confirms and closes the records


def test_a_resumed_stage_keeps_its_first_start(tmp_path):
    r = rec()
    pl.begin(r, "watch", tmp_path, clock=lambda: 100.0)
    pl.begin(r, "watch", tmp_path, clock=lambda: 500.0)  # resumed after the process was gone 400 s
    pl.end(r, "watch", tmp_path, ok=True, clock=lambda: 600.0)
    assert r.stages["watch"].started == 100.0
    assert pl.summary(r, 600.0)[0]["seconds"] == 500.0


def test_run_names_are_checked_and_script_stems_made_usable():
    assert pl.run_name("exp-1.b_2", "train.py") == "exp-1.b_2"
    for bad in ("../../x", "a/b", ".hidden", "-x", "", "x" * 39, "a b"):
        with pytest.raises(pl.UsageError):
            pl.run_name(bad, "train.py")
    assert pl.run_name(None, "scripts/my train (v2).py") == "my-train-v2"
    assert pl.run_name(None, "___.py") == "run"
