"""The dashboard's pure views (instances, runs, a run's feed and its layout up to a 64-host fleet) and its token gate
(the ASGI app in-process, no host). The browser tests are in test_dashboard_e2e.py."""
from __future__ import annotations

import re

import pytest

from gpuops.dashboard import feed as fd
from gpuops.dashboard import views
from gpuops.jobs import watch as w
from gpuops.jobs.plan import RunInfo


def sample(host: int, idx: int, util: float, mem=40000.0, total=80000.0, temp=60.0, power=300.0) -> dict:
    return {"type": "sample", "host": host,
            "gpu": {"index": idx, "name": "NVIDIA H100", "util": util, "mem_used": mem, "mem_total": total,
                    "temp": temp, "power": power}}


# -- layout: a 64-host fleet stays readable ----------------------------------------------------------------------
def test_layout_per_gpu_per_host_then_the_fleet():
    one = fd.layout([(0, i) for i in range(8)])
    assert one["mode"] == "gpu" and one["series"] == [f"GPU {i}" for i in range(8)]
    small = fd.layout([(h, i) for h in range(4) for i in range(8)])
    assert small["mode"] == "host" and len(small["series"]) == 4 and small["series"][0] == "host 0 (mean of 8 GPUs)"
    big = fd.layout([(h, i) for h in range(64) for i in range(8)])
    assert big["mode"] == "fleet" and big["series"] == ["min of 64 hosts", "mean", "max"]


def test_64_host_fleet_feed_charts_three_lines_and_a_grid_of_every_gpu():
    feed = fd.RunFeed("r", hosts=64)
    dash = w.Dashboard({"run_id": "r"}, clock=lambda: 1000.0, signal_spec={})
    for h in range(64):
        for i in range(8):
            ev = sample(h, i, util=0.0 if h == 7 else 50.0 + (h % 10) * 5, temp=40.0 + h % 5)
            dash.apply(ev)
            feed.record(ev, 1000.0 + h * 0.01, dash)
    snap = feed.snapshot()
    assert snap["mode"] == "fleet" and len(snap["series"]) == 3
    t, vals = snap["rows"][-1]
    assert vals["util"] == [0.0, round(sum(0.0 if h == 7 else 50.0 + (h % 10) * 5 for h in range(64)) / 64, 1), 95.0]
    grid = snap["grid"]
    assert [g["host"] for g in grid] == list(range(64))  # rank order, every host
    assert all(len(g["gpus"]) == 8 for g in grid) and [c["gpu"] for c in grid[5]["gpus"]] == list(range(8))
    assert grid[7]["util"] == 0.0 and {c["level"] for c in grid[7]["gpus"]} == {"idle"}  # the idle host stands out
    assert grid[9]["gpus"][0]["level"] == "busy" and grid[9]["gpus"][0]["mem"] == 50.0
    # the layout changed as hosts arrived; the journal says so, and the newest layout wins
    kinds = [e["k"] for e in feed.journal]
    assert kinds.count("layout") >= 2 and [e for e in feed.journal if e["k"] == "layout"][-1]["mode"] == "fleet"


# -- a run's feed --------------------------------------------------------------------------------------------------
def test_feed_records_samples_log_progress_signals_and_state_for_viewers():
    clock = [1000.0]
    dash = w.Dashboard({"run_id": "r1", "started_ts": 990.0}, price_per_hour=2.0, clock=lambda: clock[0])
    feed = fd.RunFeed("r1", redact=lambda s: s.replace("hunter2", "***"))
    events = [{"type": "state", "info": RunInfo(run_id="r1", exists=True, alive=True, started=990.0)},
              sample(0, 0, 95.0), sample(0, 1, 90.0),
              {"type": "log", "line": "step 1/10 | loss 2.5 | 1000 tokens/s"},
              {"type": "log", "line": "NCCL WARN NET/IB : Got async event : port error"},
              {"type": "log", "line": "token=hunter2 \x1b[31mred\x1b[0m"},
              {"type": "log", "line": "\rEpoch 0: 10%| | 1/10 [00:01<00:09, 1.0it/s]\rstep 2/10 | loss 2.0"}]
    seen = 0
    for ev in events:
        clock[0] += 1.0
        dash.apply(ev)
        feed.record(ev, clock[0], dash)
    entries = feed.since(seen)
    kinds = [e["k"] for e in entries]
    assert kinds.count("row") == 1 and "layout" in kinds  # the samples of one 2 s bucket: one chart row and "mark" in kinds and kinds.count("loss") == 2
    assert [e["p"][2] for e in entries if e["k"] == "loss"] == [2.5, 2.0]
    assert [e for e in entries if e["k"] == "rate"][0]["unit"] == "tokens/s"
    mark = next(e for e in entries if e["k"] == "mark")
    assert mark["id"] == "nccl-network" and "NCCL_IB_DISABLE=1" in mark["hint"] and mark["t"] == 1005.0
    logs = [e["text"] for e in entries if e["k"] == "log"]
    assert "token=*** \\x1b[31mred\\x1b[0m" in logs  # redacted, control characters shown, not interpreted
    assert logs[-1] == "step 2/10 | loss 2.0"  # a carriage-return redraw: its last state
    st = [e for e in entries if e["k"] == "state"][-1]
    assert st["state"] == "running" and "cost $" in [e for e in entries if e["k"] == "detail"][-1]["text"]
    snap = feed.snapshot()
    assert snap["series"] == ["GPU 0", "GPU 1"] and snap["rows"][-1][1]["util"] == [95.0, 90.0]
    assert snap["rows"][-1][1]["mem"] == [50.0, 50.0] and snap["progress"]["step"] == 2
    assert feed.since(feed.seq) == [] and feed.summary()["hosts"] == {0: 92.5}


def test_feed_memory_is_bounded_and_a_viewer_far_behind_gets_a_snapshot():
    feed = fd.RunFeed("r", bucket_s=2.0, history_s=60.0)
    for n in range(6000):
        feed.record(sample(0, 0, float(n % 100)), 1000.0 + n * 0.5)
        feed.record({"type": "log", "line": f"line {n}"}, 1000.0 + n * 0.5)
        if n % 3 == 0:
            feed.since(feed.seq)  # a viewer reading now and then
    assert len(feed.rows) <= 31 and len(feed.log) == fd.LOG_LINES and len(feed.journal) == fd.JOURNAL
    assert feed.since(0) is None  # fell behind the journal: the page is sent a fresh snapshot
    assert feed.since(feed.seq - 3) and len(feed.since(feed.seq - 3)) == 3
    rows = [t for t, _ in feed.rows]
    assert rows == sorted(rows) and all(b - a == 2.0 for a, b in zip(rows, rows[1:]))  # one row per 2 s bucket


# -- instances and runs ----------------------------------------------------------------------------------------------
def ls_row(iid, profile, status="active", **kw):
    return {"id": iid, "profile": profile, "status": status, "type": "gpu_1x_h100_pcie", "region": "us-east-1",
            "price_per_hour": 2.49, "uptime_s": 60.0, "cost_so_far": 0.04, "ttl_left_s": 3000.0, "managed": True,
            "flags": [], **kw}


def test_an_instance_no_run_follows_is_billing_unwatched():
    by_profile = views.instances_by_profile({"box": {"instance_id": "i1"}, "fleet": {"nodes": [
        {"instance_id": "i3"}, {"instance_id": "i4"}]}, "old": {"instance_id": "i9", "state": "gone"}})
    assert by_profile == {"box": ["i1"], "fleet": ["i3", "i4"]}
    pipelines = [{"outcome": "running", "instance_ids": ["i5"]}, {"outcome": "succeeded", "instance_ids": ["i6"]}]
    watched = views.watched_instances(by_profile, {"box", "fleet"}, pipelines)
    assert watched == {"i1", "i3", "i4", "i5"}
    rows = views.instance_rows([ls_row("i1", "box"), ls_row("i2", "spare"), ls_row("i3", "fleet"),
                                ls_row("i5", "run-x", status="booting"), ls_row("i6", "done", status="terminated"),
                                ls_row("i7", None)],
                               {"i1": ["datasets"]}, watched)
    unwatched = [r["id"] for r in rows if r["unwatched"]]
    assert sorted(unwatched) == ["i2", "i7"]  # a terminated one is not billing
    assert {rows[0]["id"], rows[1]["id"]} == {"i2", "i7"}  # listed first
    assert next(r for r in rows if r["id"] == "i1")["file_systems"] == ["datasets"]


def test_runs_table_a_row_per_host_of_a_fleet_and_live_state_wins():
    metas = [{"run_id": "f1", "profile": "fleet", "script": "t.py", "started_ts": 100.0,
              "nodes": [{"host": "10.0.0.1"}, {"host": "10.0.0.2"}]},
             {"run_id": "s1", "profile": "box", "script": "t.py", "started_ts": 50.0, "host": "10.0.0.9"}]
    states = {"s1": {"state": "succeeded", "started": 50.0, "ended": 410.0, "exit_code": 0}}
    live = {"f1": {"state": "running", "progress": {"step": 3}, "signals": ["NaN/inf loss"], "hosts": {0: 95.0, 1: 0.0}}}
    rows = views.run_rows(metas, states, 3700.0, {"fleet": 10.0, "box": 2.0}, live)
    assert [(r["run_id"], r["host"]) for r in rows] == [("f1", 0), ("f1", 1), ("s1", None)]
    assert rows[0]["state"] == "running" and rows[0]["cost"] == round(3600 / 3600 * 10.0 * 2, 2)  # both hosts bill
    assert rows[1]["util"] == 0.0 and rows[1]["address"] == "10.0.0.2"
    assert rows[2]["state"] == "succeeded" and rows[2]["elapsed_s"] == 360.0 and rows[2]["cost"] == 0.2


def test_pipeline_rows_stage_cost_checkpoint_outcome():
    from gpuops.pipeline import stages as ps

    rec = ps.Record(id="run-a", profile="run-a", instance_type="gpu_1x_h100_pcie", script="t.py", created=1000.0,
                    price_per_hour=3.6, billed_from=1000.0, run_id="t-1",
                    checkpoint={"name": "ckpt", "dir": "step_40", "step": 40, "local": "ckpt/step_40"},
                    instance={"ids": ["i1"], "type": "gpu_1x_h100_pcie", "region": "us-east-1"})
    for name in ("up", "sync", "setup", "train"):
        rec.stages[name] = ps.Stage(started=1000.0, ended=1100.0, ok=True)
    rec.stages["watch"] = ps.Stage(started=1100.0)
    row = views.pipeline_rows([rec], 4600.0)[0]
    assert row["stage"] == "watch" and row["stage_label"] == "training" and row["cost"] == 3.6
    assert row["checkpoint"] == "ckpt/step_40" and row["checkpoint_step"] == 40 and row["outcome"] == "running"
    assert row["instance_ids"] == ["i1"] and row["elapsed_s"] == 3600.0


# -- the token gate --------------------------------------------------------------------------------------------------
class _Hub:
    lock = __import__("threading").Lock()
    closing = __import__("threading").Event()

    def overview(self):
        return {"project": "p", "now": 0, "runs": [{"run_id": "secret-run"}], "pipelines": [], "instances": [],
                "instances_error": None, "instances_loaded": True}

    def feed(self, run_id):
        return None

    def run_doc(self, run_id):
        f = self.feed(run_id)
        if f is None:
            return None
        with self.lock:
            return f.snapshot()


@pytest.fixture
def client():
    from starlette.testclient import TestClient

    from gpuops.dashboard.app import allowed_hosts, build_app

    app = build_app(_Hub(), "tok-" + "a" * 40, allowed_hosts("127.0.0.1", 8123))
    with TestClient(app, base_url="http://127.0.0.1:8123", follow_redirects=False) as c:
        yield c


def test_token_is_traded_for_a_strict_httponly_cookie_and_nothing_without_it(client):
    r = client.get("/api/overview")
    assert r.status_code == 401 and "secret-run" not in r.text and "token" in r.text
    assert client.get("/api/overview?token=wrong").status_code == 401
    r = client.get("/?token=tok-" + "a" * 40)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert re.search(r"HttpOnly", cookie) and "SameSite=Strict" in cookie and "Path=/" in cookie
    r = client.get("/api/overview")  # the client keeps the cookie
    assert r.status_code == 200 and r.json()["runs"][0]["run_id"] == "secret-run"
    assert "default-src 'none'" in r.headers["content-security-policy"] and r.headers["cache-control"] == "no-store"
    assert client.get("/run/x").status_code == 200 and client.get("/static/uPlot.iife.min.js").status_code == 200
    assert client.get("/api/run/nope").status_code == 404


def test_another_host_header_is_refused(client):
    r = client.get("/?token=tok-" + "a" * 40, headers={"host": "attacker.example:8123"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_a_post_with_the_token_gets_no_cookie(client):
    assert client.post("/?token=tok-" + "a" * 40).status_code == 401


def test_hosts_allowed_loopback_an_address_or_any_when_listening_everywhere():
    from gpuops.dashboard.app import allowed_hosts

    assert allowed_hosts("127.0.0.1", 80) == {"127.0.0.1:80", "localhost:80", "[127.0.0.1]:80"}
    assert allowed_hosts("10.1.2.3", 9000) == {"10.1.2.3:9000", "[10.1.2.3]:9000"}
    assert allowed_hosts("0.0.0.0", 9000) is None  # reached by any of the machine's names: the token guards it


def test_a_run_that_cannot_be_followed_says_why_on_its_page(isolated):
    """A run whose profile is gone: its feed says it is not followed (and why), the dashboard goes on."""
    import json
    import time

    from gpuops.dashboard.hub import Hub

    d = isolated / "runs" / "t-1"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"run_id": "t-1", "profile": "gone-box", "script": "t.py",
                                             "started_ts": time.time() - 60, "remote_run_dir": "~/p/.gpuops/runs/t-1"}))
    hub = Hub(isolated, follow=False)
    feed = hub.feed("t-1")
    assert feed is not None and hub.feed("nope") is None
    deadline = time.monotonic() + 10
    while not feed.link.startswith("not followed"):
        assert time.monotonic() < deadline, feed.link
        time.sleep(0.05)
    assert "gone-box" in feed.link
    assert hub.feed("t-1") is feed and hub.streams_started == 1  # not restarted at once by the next viewer
    rows = hub.overview()["runs"]
    assert [(r["run_id"], r["state"]) for r in rows] == [("t-1", "unknown")]


def test_a_nan_loss_reaches_the_page_as_strict_json():
    """`loss nan` (a training gone wrong) must not break the run's page: JSON has no NaN and a browser's JSON.parse
    refuses it, so the run's document and its events carry null there, and the progress says the loss as JavaScript
    spells it (`Number("Infinity")`)."""
    import json

    from starlette.testclient import TestClient

    from gpuops.dashboard.app import _sse, allowed_hosts, build_app

    dash = w.Dashboard({"run_id": "r1", "started_ts": 990.0}, price_per_hour=2.0, clock=lambda: 1000.0)
    feed = fd.RunFeed("r1")
    for i, line in enumerate(["step 1 loss 2.5", "step 2 loss nan", "step 3 loss inf"]):
        ev = {"type": "log", "line": line}
        dash.apply(ev)
        feed.record(ev, 1000.0 + i, dash)

    class Hub(_Hub):
        def feed(self, run_id):
            return feed if run_id == "r1" else None

    strict = dict(parse_constant=lambda c: pytest.fail(f"{c} is not JSON a browser reads"))
    for entry in feed.since(0):
        json.loads(_sse({"entries": [entry]}).split("data: ", 1)[1], **strict)
    app = build_app(Hub(), "tok-" + "a" * 40, allowed_hosts("127.0.0.1", 8123))
    with TestClient(app, base_url="http://127.0.0.1:8123", raise_server_exceptions=False) as c:
        r = c.get("/api/run/r1?token=tok-" + "a" * 40)
    assert r.status_code == 200, r.text
    doc = json.loads(r.text, **strict)
    assert doc["progress"]["loss"] == "Infinity" and doc["progress"]["step"] == 3 and [p[2] for p in doc["loss"]] == [2.5, None, None]  # a NaN: a gap in the line


def test_pipeline_rows_show_the_preparation_and_watch_its_instance():
    """`gpuops run --prep` (issue 38): while it prepares, the stage is the preparation and its instance is watched; once
    done, what it did, on which type, for how much; the run page says it too."""
    from gpuops.pipeline import stages as ps

    rec = ps.Record(id="run-p", profile="run-p", instance_type="gpu_8x_h100_sxm5", script="t.py", created=1000.0,
                    prep={"command": "python prepare.py", "outs": ["data"], "stage": {"started": 1000.0},
                          "instances": [{"ids": ["p1"], "price_per_hour": 0.75, "started": 1000.0, "ended": None}]})
    row = views.pipeline_rows([rec], 4600.0)[0]
    assert row["stage"] == "prep" and row["stage_label"] == "preparation" and row["cost"] == 0.75
    assert row["instance_ids"] == ["p1"] and row["prep"]["state"] == "preparing"
    assert views.watched_instances({}, set(), [row]) == {"p1"}
    rec.prep["stage"].update(ended=4600.0, ok=True, detail="ran `python prepare.py` on gpu_1x_a10 (exit 0)")
    rec.prep["instances"][0]["ended"] = 4600.0
    rec.prep.update(state="ran", type_used="gpu_1x_a10")
    row = views.pipeline_rows([rec], 9000.0)[0]
    assert row["stage"] == "up" and row["prep"] == {"state": "ran", "cost": 0.75, "type": "gpu_1x_a10",
                                                    "detail": "ran `python prepare.py` on gpu_1x_a10 (exit 0)",
                                                    "instance_ids": []}
    info = views.run_info({"run_id": "t-1"}, {}, pipeline=rec.to_json())
    assert info["preparation"] == "ran `python prepare.py` on gpu_1x_a10 (exit 0)"
    rec.prep = None
    assert views.pipeline_rows([rec], 9000.0)[0]["prep"] is None


def test_an_address_this_machine_does_not_have_is_said_as_such_not_as_a_port_to_change():
    """`gpuops dashboard --host 10.255.255.1` (an address not on this machine) or a name that does not resolve: the
    hint names --host, never "choose another --port"; a port in use still names --port."""
    import socket

    from gpuops.dashboard.app import bind
    from gpuops.errors import UsageError

    for host in ("10.255.255.1", "no-such-host.invalid"):
        with pytest.raises(UsageError) as e:
            bind(host, 0)
        assert "--host" in e.value.hint and "--port" not in e.value.hint, e.value.hint
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(UsageError) as e:
            bind("127.0.0.1", taken.getsockname()[1])
        assert "choose another --port" in e.value.hint
    finally:
        taken.close()


def test_a_page_is_told_to_read_the_record_when_the_follower_wrote_it_not_when_the_state_changed():
    """The page read the run's record 1.5 s after the state said it ended; under load the follower (the rest of the
    log, the end facts) had not written the cause by then, and the page said "failed (exit 1)" without it for good
    (a fresh-clone CI run under eight workers). `recorded` comes with the follower's end, after the record, last."""
    clock = [1000.0]
    dash = w.Dashboard({"run_id": "r1", "started_ts": 990.0}, clock=lambda: clock[0])
    feed = fd.RunFeed("r1")
    alive = {"type": "state", "info": RunInfo(run_id="r1", exists=True, alive=True, started=990.0)}
    died = {"type": "state", "info": RunInfo(run_id="r1", exists=True, alive=False, exit_code=1, started=990.0)}
    for ev in (alive, {"type": "log", "line": "ImportError: cannot import name 'x'"}, died):
        clock[0] += 1.0
        dash.apply(ev)
        feed.record(ev, clock[0], dash)
    kinds = [e["k"] for e in feed.since(0)]
    assert "recorded" not in kinds and [e["state"] for e in feed.since(0) if e["k"] == "state"][-1] == "failed"
    seen = feed.seq
    feed.record({"type": "end"}, clock[0] + 5.0, dash)
    assert [e["k"] for e in feed.since(seen)][-1] == "recorded"
