"""The dashboard's second pass (issue 37), the parts a browser does not need to see: the session cookie and its
reader, the redirect, follow slots, a stream that falls behind, secrets scrubbed before a line is cut, what the runs
table says of a run nothing follows or whose host does not answer, instances gpuops did not launch, and a project
whose records are of the wrong shape. In-process: the real app through Starlette's test client, a real Hub."""
from __future__ import annotations

import json
import time

import pytest

from gpuops.dashboard import feed as fd
from gpuops.dashboard import views

TOKEN = "tok-" + "b" * 40


class _Hub:
    lock = __import__("threading").Lock()
    closing = __import__("threading").Event()

    def overview(self):
        return {"project": "p", "now": 0, "runs": [], "pipelines": [], "instances": [], "instances_error": None,
                "instances_loaded": True}

    def feed(self, run_id):
        return None


def client(port: int):
    from starlette.testclient import TestClient

    from gpuops.dashboard.app import allowed_hosts, build_app

    return TestClient(build_app(_Hub(), TOKEN, allowed_hosts("127.0.0.1", port), port),
                      base_url=f"http://127.0.0.1:{port}", follow_redirects=False)


def test_the_cookie_is_named_for_the_port_and_holds_no_token():
    with client(8123) as c:
        r = c.get("/?token=" + TOKEN)
        name, _, rest = r.headers["set-cookie"].partition("=")
        value = rest.split(";")[0]
        assert name == "gpuops_dashboard_8123" and value and TOKEN not in r.headers["set-cookie"]
        assert c.get("/api/overview").status_code == 200
    with client(8124) as other:  # another dashboard: the first one's cookie opens nothing here
        assert other.get("/api/overview", headers={"cookie": f"gpuops_dashboard_8123={value}"}).status_code == 401
        assert other.get("/api/overview", headers={"cookie": f"gpuops_dashboard_8124={value}"}).status_code == 401


@pytest.mark.parametrize("foreign", ['prefs={"theme": "dark", "a": [1, 2]}', "greeting=hello world",
                                     "name=Jürgen", 'q="unterminated', "=novalue", "justtext", "a=b=c"])
def test_a_foreign_cookie_of_any_shape_never_hides_the_dashboards(foreign):
    with client(8125) as c:
        r = c.get("/?token=" + TOKEN)
        ours = r.headers["set-cookie"].split(";")[0]
        for header in (f"{foreign}; {ours}", f"{ours}; {foreign}"):
            got = c.get("/api/overview", headers={"cookie": header.encode("utf-8")})
            assert got.status_code == 200, (header, got.text)


def test_the_token_redirect_never_leaves_the_dashboard():
    """`http://127.0.0.1:PORT//evil.example/?token=...` redirected to `//evil.example/` would send the browser to
    another site: the redirect is always a path on the dashboard."""
    import asyncio

    from gpuops.dashboard.app import TokenGate, local_location

    gate = TokenGate(None, TOKEN, {"127.0.0.1:8126"}, 8126)
    for path, where in (("//evil.example/", "/evil.example/"), ("/\\evil.example/x", "/evil.example/x"),
                        ("///evil.example", "/evil.example"), ("/run/r1", "/run/r1")):
        sent = []

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "method": "GET", "path": path, "query_string": f"token={TOKEN}&a=1".encode(),
                 "headers": [(b"host", b"127.0.0.1:8126")]}
        asyncio.run(gate(scope, None, send))
        headers = dict(sent[0]["headers"])
        assert sent[0]["status"] == 303 and headers[b"location"] == (where + "?a=1").encode(), (path, headers)
    assert local_location("///a", "") == "/a" and local_location("/", "") == "/"


def test_follow_slots_are_released_when_a_follower_ends(isolated):
    """20 recent runs with no recorded end whose follow ends at once (their profile is gone): every one is tried;
    a slot is held only while a follower follows."""
    from gpuops.dashboard import hub as hb

    now = time.time()
    for n in range(hb.MAX_FOLLOWED + 4):
        d = isolated / "runs" / f"t-{n:02d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"run_id": f"t-{n:02d}", "profile": f"gone-{n}", "script": "t.py",
                                                 "started_ts": now - 60 - n, "remote_run_dir": "~/p/r"}))
    h = hb.Hub(isolated, follow=True, runs_every=0.0)
    deadline = time.monotonic() + 20
    while h.streams_started < hb.MAX_FOLLOWED + 4:
        assert time.monotonic() < deadline, h.streams_started
        h.overview()
        time.sleep(0.05)
    assert sum(1 for f in h.followers.values() if f.active) <= hb.MAX_FOLLOWED


def test_a_stream_falling_behind_says_so_instead_of_live():
    from gpuops.jobs import watch as w

    model = w.StreamModel(w.FollowState(offset=0))
    assert model.tag_bytes(b"H 1700000000\n") == [{"type": "heartbeat", "at": 1700000000.0}]
    assert model.tag_bytes(b"H 1700000005 9000000\n") == [{"type": "heartbeat", "at": 1700000005.0, "size": 9000000}]
    feed = fd.RunFeed("r")
    feed.record({"type": "sample", "gpu": {"index": 0, "util": 90.0}}, 1000.0)
    assert feed.link == "connecting"  # samples arrive, but no heartbeat has said the stream is in time
    feed.record({"type": "heartbeat", "at": 900.0}, 1000.5)  # the host's clock: 100.5 s off, not late
    assert feed.link == fd.CHECKING  # the first heartbeat: the clock's baseline, nothing to judge its lateness by
    assert feed.summary()["reachable"]
    feed.record({"type": "heartbeat", "at": 905.0}, 1030.5)  # this one waited 25 s behind the log
    assert feed.link.startswith("behind by 25 s") and not feed.summary()["link"] == "live"
    feed.record({"type": "sample", "gpu": {"index": 0, "util": 90.0}}, 1031.0)
    assert feed.link.startswith("behind")  # a sample does not make it live while the log is late
    feed.record({"type": "heartbeat", "at": 935.0}, 1035.6)
    assert feed.link == "live"
    # a log written faster than it is read: its size runs ahead of what was read, though the heartbeat is on time
    feed.record({"type": "log", "line": "step 1", "offset": 1_000}, 1036.0)
    feed.record({"type": "heartbeat", "at": 940.0, "size": 9_001_000}, 1040.6)
    assert feed.link.startswith("behind: 9.0 MB of the log not read yet")
    feed.record({"type": "log", "line": "step 2", "offset": 9_000_000}, 1050.0)
    feed.record({"type": "heartbeat", "at": 950.0, "size": 9_001_000}, 1050.6)
    assert feed.link == "live"


def test_secrets_are_scrubbed_before_a_long_line_is_cut():
    key = "sk_live_" + "Q7x" * 10
    feed = fd.RunFeed("r", redact=lambda s: s.replace(key, "***"))
    for pad in range(1985, 2001):
        feed.record({"type": "log", "line": "x" * pad + key + " tail"}, 1.0)
    shown = " ".join(t for t, _ in feed.log)
    assert key[:6] not in shown.replace("***", "")
    assert all(len(t) <= fd.LINE_MAX for t, _ in feed.log)


def test_a_run_nothing_follows_costs_nothing_more_and_an_unreachable_host_shows_no_stale_figure():
    now = 1_000_000.0
    metas = [{"run_id": "old", "profile": "box", "started_ts": now - 5 * 86400},
             {"run_id": "lost", "profile": "box", "started_ts": now - 3600},
             {"run_id": "seen", "profile": "box", "started_ts": now - 7200}]
    live = {"lost": {"state": "running", "reachable": False, "unreachable": True, "seen_at": now - 600,
                     "hosts": {0: 99.0}, "link": "reconnecting (attempt 3): timed out"}}
    rows = {r["run_id"]: r for r in views.run_rows(metas, {"old": {"state": "running"}}, now, {"box": 2.49}, live,
                                                   seen={"seen": now - 3600})}
    assert rows["old"]["state"] == "unknown" and rows["old"]["elapsed_s"] is None and rows["old"]["cost"] is None
    assert rows["lost"]["state"] == "unreachable" and rows["lost"]["util"] is None
    assert rows["lost"]["elapsed_s"] == 3000.0  # up to when its host last answered
    assert rows["seen"]["state"] == "unknown" and rows["seen"]["elapsed_s"] == 3600.0 and rows["seen"]["cost"] == 2.49


def test_an_instance_gpuops_did_not_launch_has_its_api_name_uptime_and_cost():
    row = {"id": "i-x", "profile": None, "status": "active", "type": "gpu_1x_a10", "region": "us-east-1",
           "price_per_hour": 0.75, "uptime_s": None, "cost_so_far": None, "managed": False, "flags": []}
    got = views.instance_rows([row], {}, set(), names={"i-x": "notebook-box"}, first_seen={"i-x": 1000.0},
                              now=1000.0 + 7200)[0]
    assert got["name"] == "notebook-box" and got["unwatched"] and got["since_seen"]
    assert got["uptime_s"] == 7200.0 and got["cost_so_far"] == 1.5


def test_a_project_with_records_of_the_wrong_shape_still_has_an_overview(isolated):
    from starlette.testclient import TestClient

    from gpuops.dashboard.app import allowed_hosts, build_app
    from gpuops.dashboard.hub import Hub

    for rid, meta, state in (("t-1", {"profile": ["x"], "started_ts": "yesterday", "nodes": "two", "host": 7},
                              {"state": 3, "started": "noon", "ended": [], "exit_code": "one"}),
                             ("t-2", {"profile": "box", "started_ts": 5.0, "nodes": [1, "a", None]},
                              {"state": "failed", "exit_code": 1, "started": 5.0, "ended": "late"}),
                             ("t-3", {"profile": "box", "started_ts": 6.0}, ["not", "a", "dict"])):
        d = isolated / "runs" / rid
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"run_id": rid, **meta}))
        (d / "state.json").write_text(json.dumps(state))
    (isolated / "runs" / "pipelines").mkdir()
    (isolated / "runs" / "pipelines" / "p.json").write_text(json.dumps({"id": "p", "profile": "p", "instance_type": "x",
                                                                       "script": "s", "created": "then", "stages": {}}))
    hub = Hub(isolated, follow=False)
    app = build_app(hub, TOKEN, allowed_hosts("127.0.0.1", 8127), 8127)
    with TestClient(app, base_url="http://127.0.0.1:8127") as c:
        for _ in range(3):
            r = c.get("/api/overview?token=" + TOKEN)
            assert r.status_code == 200, r.text
        doc = r.json()
        assert sorted(x["run_id"] for x in doc["runs"]) == ["t-1", "t-2", "t-3"]
        assert next(x for x in doc["runs"] if x["run_id"] == "t-2")["state"] == "failed"
        for rid in ("t-1", "t-2", "t-3"):
            assert c.get(f"/api/run/{rid}").status_code == 200


def test_ending_of_reads_issue_35s_record_field_by_field():
    e = views.ending_of({}, {"ending": "nope"}, {"ending": {"cause": "oom", "title": "CUDA out of memory",
                                                           "evidence": ["line", 3], "fix": 7}})
    assert e == {"cause": "oom", "title": "CUDA out of memory", "evidence": ["line"], "fix": None, "source": None}
    assert views.ending_of({}, None, {"x": 1}) is None


def test_an_ended_run_is_shown_from_its_record_and_its_fetched_log_never_followed(isolated):
    from gpuops.dashboard.hub import Hub

    d = isolated / "runs" / "t-f"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"run_id": "t-f", "profile": "gone", "script": "t.py",
                                             "started_ts": time.time() - 600, "remote_run_dir": "~/p/r"}))
    (d / "state.json").write_text(json.dumps({"run_id": "t-f", "state": "failed", "exit_code": 1,
                                              "started": time.time() - 600, "ended": time.time() - 60}))
    (d / "log").write_text("".join(f"step {i}/50 | loss {1.0 / i:.4f}\n" for i in range(1, 51)) + "Killed\n")
    hub = Hub(isolated, follow=True)
    feed = hub.feed("t-f")
    assert (feed.state, feed.exit_code, feed.link, feed.ended) == ("failed", 1, "ended", True)
    assert hub.streams_started == 0  # nothing asked of a host: the record says it ended
    deadline = time.monotonic() + 10
    while len((doc := hub.run_doc("t-f"))["loss"]) < 50:
        assert time.monotonic() < deadline, doc["loss"]
        time.sleep(0.05)
    assert [p[0] for p in doc["loss"]] == list(range(1, 51)) and doc["log"][-1][0] == "Killed"
    assert doc["info"]["exit_code"] == 1 and doc["state"] == "failed" and doc["info"]["started"] is not None


def test_never_live_before_a_heartbeat_says_so():
    """The first seconds of a flood (issue 37's review): samples and a (re)connection never say "live"; the first
    heartbeat sets the host clock's baseline (not "live" either: its lateness cannot be told), the next one on time
    does; another host's heartbeat (a fleet's sample streams) is no measure of this stream."""
    feed = fd.RunFeed("r")
    links = []
    for ev, now in (({"type": "state"}, 10.0), ({"type": "sample", "gpu": {"index": 0, "util": 90.0}}, 10.1),
                    ({"type": "log", "line": "step 1", "offset": 100}, 10.2),
                    ({"type": "heartbeat", "at": 5.0, "host": 1}, 10.3),
                    ({"type": "sample", "gpu": {"index": 0, "util": 91.0}}, 12.0)):
        feed.record(ev, now)
        links.append(feed.link)
    assert "live" not in links and feed.link == "connecting"
    feed.record({"type": "heartbeat", "at": 8.0, "size": 100}, 12.5)
    assert feed.link == fd.CHECKING
    feed.record({"type": "heartbeat", "at": 13.0, "size": 150}, 17.6)
    assert feed.link == "live"
    feed.record({"type": "reconnecting", "attempt": 1, "error": "connection lost"}, 30.0)
    feed.record({"type": "connected", "attempts": 1}, 32.0)
    feed.record({"type": "sample", "gpu": {"index": 0, "util": 91.0}}, 32.1)
    assert feed.link == fd.CHECKING and feed.summary()["reachable"]
    feed.record({"type": "heartbeat", "at": 27.5, "size": 200}, 32.2)  # on time against the baseline
    assert feed.link == "live"


def test_a_host_that_stops_answering_is_said_on_the_page_not_its_last_state():
    feed = fd.RunFeed("r")
    feed.record({"type": "heartbeat", "at": 1.0}, 1.0)
    feed.record({"type": "reconnecting", "attempt": 1, "error": "connection refused"}, 5.0)
    seq = feed.seq
    assert feed.snapshot()["unreachable"] and feed.snapshot()["seen_at"] == 1.0
    assert [e for e in feed.journal if e["k"] == "reach"] == [{"k": "reach", "unreachable": True, "seen_at": 1.0,
                                                               "seq": seq - 1}]
    feed.record({"type": "connected", "attempts": 1}, 9.0)
    assert feed.journal[-2] == {"k": "reach", "unreachable": False, "seen_at": 1.0, "seq": feed.seq - 1}


def test_an_ended_run_with_no_copy_of_its_log_says_why_its_lines_are_missing(isolated):
    """`gpuops train`'s runs have no local log: the page's log reads the last lines from the host; where the host
    cannot be asked (here its profile is gone) the log section says so, never an empty box or an error."""
    from gpuops.dashboard.hub import Hub

    d = isolated / "runs" / "t-g"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"run_id": "t-g", "profile": "gone", "script": "t.py",
                                             "started_ts": time.time() - 600, "remote_run_dir": "~/p/r"}))
    (d / "state.json").write_text(json.dumps({"run_id": "t-g", "state": "failed", "exit_code": 1,
                                              "started": time.time() - 600, "ended": time.time() - 60}))
    hub = Hub(isolated, follow=True)
    feed = hub.feed("t-g")  # as the compare page or a series asks: the host is not asked yet
    assert list(feed.log) == [["(no copy of the log here: reading its last lines from the host...)", "note"]]
    time.sleep(0.3)
    assert len(feed.log) == 1
    hub.run_doc("t-g")  # the run's page: now it is
    deadline = time.monotonic() + 10
    while len(feed.log) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    text, kind = feed.log[-1]
    assert kind == "note" and text.startswith("(the log could not be read from the host: ") and "gone" in text
    assert hub.streams_started == 0
