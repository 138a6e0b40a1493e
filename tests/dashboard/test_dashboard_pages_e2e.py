"""The dashboard's pages in Chromium (Playwright, Debian's /usr/bin/chromium) over a project's own records and its
metrics database: a finished run's page after a restart (its whole history by step, its record's state, exit code
and cause, what it is), runs side by side, the overview's sorting, filtering and in-place updates, a bad record, and
what a person must see (numbers, percent charts, units, labels not cut) or must not (a key, a talkative page).

Each test serves a real Hub (the dashboard's own data source) over its own project folder on its own port, through
the real ASGI app and its token gate; the browser reaches only 127.0.0.1 and raises no JavaScript error."""
from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from support.browser import shot_dir, watch_page

T0 = 1_760_000_000.0  # when the fabricated runs started (a fixed past time: pages must not say 1970)


def write_run(project: Path, rid: str, *, state: str = "failed", exit_code=1, steps: int = 5000, started=T0,
              minutes: float = 40.0, ending: dict | None = None, gpus: int = 2, busy: tuple = (0,), profile="box",
              loss=lambda s: 4.0 / math.sqrt(s), pipeline: bool = True) -> None:
    """A run as gpuops leaves it: runs/<id>/meta.json and state.json, a `gpuops run` record (with `ending` when
    given), and its metrics database filled by the follow path's writer (every step's loss and throughput, a GPU
    sample per GPU every 2 s)."""
    from gpuops.history import store

    d = project / "runs" / rid
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_text(json.dumps({
        "run_id": rid, "script": "train.py", "args": ["--lr", "3e-4", "--epochs", "2"], "profile": profile,
        "host": "192.0.2.10", "remote_run_dir": f"~/p/.gpuops/runs/{rid}", "started_ts": started,
        "started_at": "2025-10-09T09:06:40+00:00", "price_per_hour": 2.49}))
    end = started + minutes * 60
    if state:
        (d / "state.json").write_text(json.dumps({"run_id": rid, "state": state, "exit_code": exit_code, "pid": 42,
                                                  "started": started, "ended": end, "elapsed": end - started,
                                                  "stopped": None, "log_size": 123}))
    if pipeline:
        rec = {"id": f"run-{rid}", "profile": f"run-{rid}", "instance_type": "gpu_2x_h100_sxm5", "script": "train.py",
               "run_id": rid, "outcome": "failed" if state == "failed" else "succeeded", "created": started - 60,
               "price_per_hour": 2.49, "stages": {}}
        if ending:
            rec["ending"] = ending
        (project / "runs" / "pipelines").mkdir(parents=True, exist_ok=True)
        (project / "runs" / "pipelines" / f"run-{rid}.json").write_text(json.dumps(rec))
    w = store.Writer(store.db_path(project), rid, clock=lambda: end)
    assert w.claim()
    pos = 0
    for s in range(1, steps + 1):
        pos += 60
        t = started + (s / steps) * minutes * 60
        w.point("loss", pos, s, t, loss(s))
        w.point("rate", pos, s, t, 15300.0 + (s % 50))
    w.unit("rate", "tokens/s")
    w.span(0, pos)
    t = started
    while t < end:
        for i in range(gpus):
            u = 95.0 if i in busy else 0.0
            w.sample(t, 0, {"index": i, "name": "NVIDIA H100 80GB HBM3", "util": u, "mem_used": 61000.0 if u else 2.0,
                            "mem_total": 81559.0, "power": 650.0 if u else 70.0, "temp": 60.0})
        t += 2.0
    w.mark("nan-loss", started + 30 * 60, pos - 100, "NaN/inf loss", "lower the learning rate")
    w.close()


class Served:
    """A real Hub over the project, the real app and token gate, uvicorn on its own free port."""

    def __init__(self, project: Path, follow: bool = False, port: int = 0):
        import uvicorn

        from gpuops.dashboard.app import allowed_hosts, bind, build_app, new_token
        from gpuops.dashboard.hub import Hub

        self.hub = Hub(project, follow=follow, api_every=3600)
        self.hub.start()
        sock = bind("127.0.0.1", port)
        self.port, self.token = sock.getsockname()[1], new_token()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/?token={self.token}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.hub, self.token, allowed_hosts("127.0.0.1", self.port),
                                                              self.port), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.hub.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.hub.db.close()


@pytest.fixture
def served(isolated):
    made = []

    def make(project: Path = isolated, follow: bool = False, port: int = 0) -> Served:
        s = Served(project, follow, port)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


class Page:
    """A browser page that records its errors and requests; `clean()` asserts none went wrong."""

    def __init__(self, browser, served: Served, width=1280, height=900):
        self.ctx = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.ctx.new_page()
        self.errors, self.requests, self.base = [], [], served.base
        watch_page(self.page, self.errors, self.requests)
        self.page.goto(served.url)

    def clean(self) -> None:
        assert not self.errors, self.errors
        outside = [u for u in self.requests if not (u.startswith(self.base + "/") or u.startswith("data:"))]
        assert not outside, outside


def chart_data(page, key: str) -> list:
    """What a chart draws (uPlot's data: x values, then each series), read from the chart on the page."""
    return page.evaluate("""(key) => { const u = window.G.charts && window.G.charts[key];
        return u ? u.data.map((c) => Array.from(c)) : null; }""", key)


# -- 1: a finished run's page after a restart: its whole history, never "connecting" or 1970 -----------------------------
def test_a_finished_run_after_a_restart_shows_its_whole_history_by_step_and_what_it_is(served, browser, isolated, tmp_path):
    ending = {"cause": "cuda-oom", "title": "CUDA out of memory on GPU 0",
              "evidence": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
              "fix": "halve the batch size or enable gradient checkpointing", "source": "playbooks/endings.yaml"}
    write_run(isolated, "t-done", ending=ending)
    s = served()
    p = Page(browser, s)
    page = p.page
    page.goto(f"{s.base}/run/t-done")
    state = page.locator("#run-state")
    expect(state).to_have_text("failed (exit 1): CUDA out of memory on GPU 0")
    info = page.get_by_label("what this run is")
    for text in ("2 × NVIDIA H100 80GB HBM3", "gpu_2x_h100_sxm5", "192.0.2.10", "train.py --lr 3e-4 --epochs 2",
                 "$2.49", "CUDA out of memory on GPU 0"):
        expect(info).to_contain_text(text)
    expect(info.locator("dd[data-k='exit code']")).to_have_text("1")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0))
    expect(info.locator("dd[data-k=started]")).to_have_text(started)
    ending_box = page.locator("details.ending")
    expect(ending_box).to_contain_text("Tried to allocate 2.00 GiB")
    expect(ending_box).to_contain_text("halve the batch size")
    body = page.locator("main").inner_text()
    assert "connecting" not in body and "1970" not in body
    expect(page.locator("#link")).to_contain_text("run ended")
    # the loss by step, from step 1 to the last (5000 steps, thinned for the page: the first and last kept)
    page.wait_for_function("() => window.G.charts && G.charts.loss && G.charts.loss.data[0].length > 100")
    xs, *ys = chart_data(page, "loss")
    assert xs[0] == 1 and xs[-1] == 5000 and xs == sorted(xs) and len(xs) <= 4100
    assert ys[0][0] == 4.0  # the raw line starts at step 1's loss
    # utilisation per GPU and the host's mean; percent charts 0-100; memory in GiB too
    util = page.locator("#latest-util").inner_text()
    assert "GPU 0 95 %" in util and "GPU 1 0 %" in util and "mean of 2 GPUs 48 %" in util
    assert "(59.6 GiB)" in page.locator("#latest-mem").inner_text()
    for key in ("util", "mem"):
        assert page.evaluate(f"() => [G.charts.{key}.scales.y.min, G.charts.{key}.scales.y.max]") == [0, 100]
    # links: back to the overview, and the full log
    assert page.locator("#back").get_attribute("href") == "/"
    assert page.locator("#full-log").get_attribute("href") == "/run/t-done/log"
    page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-run-ended.png"), full_page=True)
    p.clean()


class Feeder:
    """A run followed by the dashboard's own Hub, its events coming from a thread instead of a host's stream: through
    the real watch model (jobs.watch.Dashboard) into the hub's feed, as its follower records them (the stream itself
    is tested through the sandbox in test_dashboard_e2e.py)."""

    def __init__(self, served: Served, rid: str, started: float):
        from gpuops.dashboard import feed as fd
        from gpuops.dashboard.hub import _Follower
        from gpuops.jobs import watch as w
        from gpuops.jobs.plan import RunInfo

        self.hub, self.rid = served.hub, rid
        self.feed = fd.RunFeed(rid, profile="box", redact=served.hub.feed.__globals__["redact"])
        with self.hub.lock:
            self.hub.followers[rid] = _Follower(self.feed)
        self.dash = w.Dashboard({"run_id": rid, "started_ts": started}, price_per_hour=2.49)
        self.info = RunInfo(run_id=rid, exists=True, alive=True, started=started)
        self.send({"type": "state", "info": self.info})
        self.step = 0

    def send(self, ev: dict) -> None:
        self.dash.apply(ev)
        self.hub._record(self.feed, ev, self.dash)

    def sample(self, util=(95.0, 0.0), mem=(48950.0, 48960.0)) -> None:
        for i, (u, m) in enumerate(zip(util, mem)):
            self.send({"type": "sample", "host": 0, "gpu": {"index": i, "name": "NVIDIA H100 80GB HBM3", "util": u,
                                                            "mem_used": m, "mem_total": 81559.0, "temp": 61.0,
                                                            "power": 600.0}})

    def line(self, text: str) -> None:
        self.send({"type": "log", "line": text, "offset": None})


def test_a_live_run_page_says_numbers_plainly_keeps_quiet_and_says_when_it_falls_behind(served, browser, isolated):
    write_run(isolated, "t-live", state="", steps=0, minutes=0.0, pipeline=False, started=time.time() - 60)
    s = served()
    f = Feeder(s, "t-live", time.time() - 60)
    for n in range(1, 6):
        f.sample()
        f.line(f"step {n}/100 | loss 0.0006 | 15300 tokens/s")
    p = Page(browser, s)
    page = p.page
    page.goto(f"{s.base}/run/t-live")
    prog = page.locator("#run-progress")
    expect(prog).to_contain_text("step 5/100")
    text = prog.inner_text()
    assert "loss 0.0006" in text and "15,300 tokens/s" in text and "e+" not in text and "0.0006000" not in text
    expect(page.locator("#latest-rate")).to_have_text("15,300 tokens/s")
    # one live region that speaks (the run's state) and the connection line; neither changes while values do
    regions = page.locator("[aria-live], [role=status], [role=alert], [role=log], output")
    assert regions.count() <= 2, [regions.nth(i).evaluate("e => e.outerHTML") for i in range(regions.count())]
    page.evaluate("""() => { window.__said = 0; const o = new MutationObserver((m) => { window.__said += m.length; });
        for (const r of document.querySelectorAll('[aria-live], [role=status]'))
          o.observe(r, { childList: true, characterData: true, subtree: true }); }""")
    for n in range(6, 16):
        f.sample(util=(90.0 + n % 5, 0.0))
        f.line(f"step {n}/100 | loss 0.0006 | 15300 tokens/s")
        time.sleep(0.3)
    expect(prog).to_contain_text("step 15/100")
    assert page.evaluate("window.__said") == 0
    # percent charts stay 0-100 though memory reads 60.0 to 60.1 %; utilisation per GPU and the mean
    page.wait_for_function("() => G.charts.mem.data[0].length > 0")
    for key in ("util", "mem"):
        assert page.evaluate(f"() => [G.charts.{key}.scales.y.min, G.charts.{key}.scales.y.max]") == [0, 100]
    assert "mean of 2 GPUs" in page.locator("#latest-util").inner_text()
    # no axis label is cut at a chart's edge (the last time label, a date)
    for key in ("util", "mem", "power", "temp", "loss", "rate"):
        assert page.evaluate(LABELS_INSIDE, key), key
    # a NaN: the loss header says so, not the last finite value
    f.line("step 16/100 | loss nan | 15300 tokens/s")
    expect(page.locator("#latest-loss")).to_have_text("NaN")
    # the stream's heartbeat arrives 30 s late (a log faster than it is read): the page says how far behind, not "live"
    now = time.time()
    f.send({"type": "heartbeat", "at": now})
    f.send({"type": "heartbeat", "at": now - 30})
    expect(page.locator("#link")).to_contain_text(re.compile(r"behind by 3\d s"))
    f.send({"type": "heartbeat", "at": time.time()})
    f.sample()
    expect(page.locator("#link")).to_have_text("live")
    p.clean()


LABELS_INSIDE = """(key) => {
  const u = G.charts[key]; const ctx = u.ctx; const width = ctx.canvas.width;
  for (const ax of [u.axes[0]]) {
    ctx.save(); ctx.font = Array.isArray(ax.font) ? ax.font[0] : ax.font;
    const vals = ax._values || [], splits = ax._splits || [];
    for (let i = 0; i < splits.length; i++) {
      if (vals[i] === null || vals[i] === undefined) continue;
      const x = u.valToPos(splits[i], 'x', true);
      const w = Math.max(...String(vals[i]).split('\\n').map((l) => ctx.measureText(l).width));
      if (x - w / 2 < 0 || x + w / 2 > width) { ctx.restore(); return false; }
    }
    ctx.restore();
  }
  return true; }"""


def test_two_runs_side_by_side_by_step_with_smoothing_log_scale_zoom_and_hover(served, browser, isolated, tmp_path):
    write_run(isolated, "t-a", state="succeeded", exit_code=0, steps=6000, loss=lambda s: 3.0 / math.sqrt(s))
    write_run(isolated, "t-b", state="succeeded", exit_code=0, steps=2000, started=T0 + 3600,
              loss=lambda s: 2.0 / math.sqrt(s) + 0.05 * ((s * 7919) % 13) / 13)
    write_run(isolated, "t-c", state="succeeded", exit_code=0, steps=10, started=T0 + 7200, pipeline=False)
    s = served()
    p = Page(browser, s)
    page = p.page
    runs = page.get_by_role("table", name="runs")
    expect(runs.locator("tbody tr")).to_have_count(3)
    compare = page.locator("#compare")
    expect(compare).to_be_disabled()
    runs.get_by_label("compare t-a").check()
    runs.get_by_label("compare t-b").check()
    expect(compare).to_have_text("compare 2 runs")
    compare.click()
    page.wait_for_url(re.compile(r"/compare\?run=t-a&run=t-b$"))
    page.wait_for_function("() => G.charts && G.charts.compare && G.charts.compare.data[0].length > 100")
    data = chart_data(page, "compare")
    assert len(data) == 3 and data[0][0] == 1 and data[0][-1] == 6000  # both runs on one step axis (a's thinned)
    assert len(data[0]) < 6000
    b_steps = [x for x, v in zip(data[0], data[2]) if v is not None]
    assert b_steps[-1] == 2000
    raw = page.evaluate("() => Array.from(G.charts.compare.data[2]).filter((v) => v !== null && v !== undefined)")
    page.locator("#smoothing").fill("0")  # no smoothing: the raw values
    page.wait_for_function("(old) => JSON.stringify(Array.from(G.charts.compare.data[2]).filter((v) => v != null).slice(0, 50))"
                           " !== JSON.stringify(old.slice(0, 50))", arg=raw)
    # log scale
    page.locator("#log-scale").check()
    page.wait_for_function("() => G.charts.compare.scales.y.distr === 3")
    # drag to zoom: the chart zooms to the dragged steps, the step range says them
    over = page.locator("#chart-compare .u-over")
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    lo, hi = page.evaluate("() => [G.charts.compare.scales.x.min, G.charts.compare.scales.x.max]")
    assert 800 < lo < 1600 and 2000 < hi < 2800, (lo, hi)
    expect(page.locator("#step-from")).to_have_value(str(math.floor(lo)))
    # the dragged steps at full resolution: every step of run a's in the range, as the run page does
    a, b = math.ceil(lo), math.floor(hi)
    page.wait_for_function("""([a, b]) => Array.from(G.charts.compare.data[0]).filter((x) => x >= a && x <= b).length
        === b - a + 1""", arg=[a, b])
    assert page.evaluate("() => [G.charts.compare.scales.x.min, G.charts.compare.scales.x.max]") == [lo, hi]
    # values on hover: each run's value at the step under the pointer, with the time it was logged
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] / 2)
    legend = page.locator("#chart-compare .u-legend")
    expect(legend).to_contain_text(re.compile(r"step \d"))
    expect(legend.locator(".u-series").nth(1)).to_contain_text(re.compile(r"\d\.\d+ · \d\d:\d\d:\d\d"))
    page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-compare.png"))
    # a step range typed in
    page.locator("#step-from").fill("100")
    page.locator("#step-to").fill("200")
    page.locator("#step-apply").click()
    page.wait_for_function("() => Math.round(G.charts.compare.scales.x.min) === 100 && Math.round(G.charts.compare.scales.x.max) === 200")
    # the page's refresh every 5 s reads the range shown again, never the whole runs thinned in its place
    with page.expect_request(lambda r: "/series?" in r.url, timeout=10000) as got:
        pass
    assert "lo=100&hi=200" in got.value.url, got.value.url
    page.wait_for_timeout(300)
    assert page.evaluate("() => Array.from(G.charts.compare.data[0]).filter((x) => x >= 100 && x <= 200).length") == 101
    assert page.evaluate("() => [Math.round(G.charts.compare.scales.x.min), Math.round(G.charts.compare.scales.x.max)]") \
        == [100, 200]
    p.clean()


def test_the_overview_sorts_filters_says_how_runs_ended_and_updates_in_place(served, browser, isolated, tmp_path):
    now = time.time()
    write_run(isolated, "t-oom", ending={"cause": "cuda-oom", "title": "CUDA out of memory on GPU 0"}, steps=10,
              started=now - 7200)
    write_run(isolated, "t-ok", state="succeeded", exit_code=0, steps=10, started=now - 3600, minutes=90)
    write_run(isolated, "t-old", state="", steps=10, started=now - 5 * 86400, pipeline=False)  # no recorded end
    d = isolated / "runs" / "t-bad"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"run_id": "t-bad", "profile": ["x"], "started_ts": "yesterday",
                                             "nodes": "two", "host": 7, "script": None}))
    (d / "state.json").write_text(json.dumps({"state": 3, "started": "noon", "ended": [], "exit_code": "one"}))
    (isolated / "runs" / "pipelines" / "run-t-prep.json").write_text(json.dumps({  # `gpuops run --prep` (issue 38)
        "id": "run-t-prep", "profile": "run-t-prep", "instance_type": "gpu_8x_h100_sxm5", "script": "train.py",
        "outcome": "running", "created": now - 3600, "stages": {},
        "prep": {"command": "python prepare.py", "outs": ["data"], "state": None, "type_used": "gpu_1x_a10",
                 "stage": {"started": now - 3600}, "instances": [{"ids": ["p1"], "price_per_hour": 0.75,
                                                                  "started": now - 3600, "ended": None}]}}))
    s = served()
    p = Page(browser, s, width=800, height=700)
    page = p.page
    runs = page.get_by_role("table", name="runs")
    expect(runs.locator("tbody tr")).to_have_count(4)
    prep = page.get_by_role("table", name="pipelines").locator("tr", has_text="run-t-prep")
    expect(prep).to_contain_text("preparation")  # the stage while it prepares, and what it costs on which type
    expect(prep).to_contain_text("preparing on gpu_1x_a10 · $0.75")
    assert page.request.get(f"{s.base}/api/overview").status == 200  # a bad record: its row, never a 500
    oom = runs.locator("tr", has_text="t-oom")
    expect(oom).to_contain_text("CUDA out of memory on GPU 0")
    cells = oom.locator("td")
    assert cells.nth(5).inner_text() == "1"  # the exit code
    ok = runs.locator("tr", has_text="t-ok")
    assert ok.locator("td").nth(5).inner_text() == "0" and "$3.74" in ok.inner_text()  # 1.5 h at $2.49
    old = runs.locator("tr", has_text="t-old").inner_text()
    assert "unknown" in old and "$298" not in old and "5d" not in old  # not 5 days of cost: nothing follows it
    # sorted by cost, then filtered
    runs.get_by_role("button", name="cost").click()
    expect(runs.locator("th[data-key=cost]")).to_have_attribute("aria-sort", "descending")
    first = runs.locator("tbody tr").first.inner_text()
    assert "t-ok" in first, first
    page.locator("#run-filter").fill("oom")
    expect(runs.locator("tbody tr")).to_have_count(1)
    page.locator("#run-filter").fill("")
    page.locator("#run-state-filter").select_option("failed")
    expect(runs.locator("tbody tr")).to_have_count(1)
    page.locator("#run-state-filter").select_option("all")
    expect(runs.locator("tbody tr")).to_have_count(4)
    # in place: keyboard focus, a text selection and a scrolled table survive an update of the overview
    link = runs.get_by_role("link", name="t-ok")
    link.focus()
    scroller = page.locator("#runs-scroll")
    scroller.evaluate("(e) => { e.scrollLeft = 200; }")
    assert scroller.evaluate("(e) => e.scrollLeft") > 50  # 800 px: the table is wider than the window
    page.evaluate("""() => { const td = [...document.querySelectorAll('table[aria-label=runs] td')].find((t) => t.textContent === 'CUDA out of memory on GPU 0');
        const r = document.createRange(); r.selectNodeContents(td); getSelection().removeAllRanges(); getSelection().addRange(r); }""")
    before = scroller.evaluate("(e) => e.scrollLeft")
    (isolated / "runs" / "t-ok" / "state.json").write_text(json.dumps({  # the record changes: the page updates
        "run_id": "t-ok", "state": "succeeded", "exit_code": 0, "started": now - 3600, "ended": now - 3600 + 7200}))
    expect(ok).to_contain_text("$4.98")
    assert page.evaluate("document.activeElement.textContent") == "t-ok"
    assert page.evaluate("getSelection().toString()") == "CUDA out of memory on GPU 0"
    assert scroller.evaluate("(e) => e.scrollLeft") == before
    bad = runs.locator("tr", has_text="t-bad").inner_text()
    assert "unknown" in bad or "unreadable" in bad
    page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-overview-runs.png"), full_page=True)
    p.clean()


def test_two_dashboards_at_once_a_foreign_cookie_and_a_restart_that_signs_the_page_out(served, browser, isolated,
                                                                                      tmp_path):
    """Two projects' dashboards open in one browser: each keeps its own session (the cookie is named for its port);
    other localhost cookies of any shape (JSON, a space, non-ASCII) hide nothing; a dashboard restarted while a tab is
    open: the tab says it is signed out and how to sign in again, instead of retrying forever."""
    other = tmp_path / "other-project"
    (other / "runs").mkdir(parents=True)
    write_run(isolated, "t-one", state="succeeded", exit_code=0, steps=20)
    write_run(other, "t-two", state="succeeded", exit_code=0, steps=20)
    a, b = served(isolated), served(other)
    ctx = browser.new_context(viewport={"width": 1100, "height": 700})
    ctx.add_cookies([{"name": "prefs", "value": '{"theme": "dark", "cols": [1, 2]}', "url": "http://127.0.0.1/"},
                     {"name": "greeting", "value": "hello world", "url": "http://127.0.0.1/"},
                     {"name": "who", "value": "J\u00fcrgen", "url": "http://127.0.0.1/"}])
    errors, requests = [], []
    pa, pb = ctx.new_page(), ctx.new_page()
    for pg in (pa, pb):
        watch_page(pg, errors, requests)
    pa.goto(a.url)
    expect(pa.get_by_role("table", name="runs")).to_contain_text("t-one")
    pb.goto(b.url)
    expect(pb.get_by_role("table", name="runs")).to_contain_text("t-two")
    names = {c["name"] for c in ctx.cookies()}
    assert {f"gpuops_dashboard_{a.port}", f"gpuops_dashboard_{b.port}"} <= names
    for pg, s, rid in ((pa, a, "t-one"), (pb, b, "t-two")):  # both still signed in after the other's sign-in
        pg.reload()
        expect(pg.get_by_role("table", name="runs")).to_contain_text(rid)
        assert pg.request.get(f"{s.base}/api/overview").status == 200
    assert all(c["value"] not in (a.token, b.token) for c in ctx.cookies())
    # the first dashboard restarts on its port: its open tab is told, once, what to do
    port = a.port
    a.close()
    a2 = served(isolated, port=port)
    expect(pa.locator("#link")).to_contain_text("signed out", timeout=30000)
    assert "open the URL" in pa.locator("#link").inner_text()
    pa.goto(a2.url)  # the new URL signs it in again
    expect(pa.get_by_role("table", name="runs")).to_contain_text("t-one")
    # the only console lines: the browser's own notes of the refused connection and the 401s the page then read
    assert not [e for e in errors if not ("401 (Unauthorized)" in e or "ERR_CONNECTION_REFUSED" in e)], errors
    assert all(u.startswith("http://127.0.0.1:") or u.startswith("data:") for u in requests), requests
    ctx.close()


def drag(page, selector: str, a: float, b: float) -> None:
    """A person's drag across a chart, from a to b of its plot's width (0..1)."""
    box = page.locator(selector).bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * a, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * b, y, steps=8)
    page.mouse.up()


def test_a_run_page_zooms_where_a_person_drags_narrows_to_a_typed_range_and_says_values_on_hover(served, browser,
                                                                                              isolated):
    """The run page's own loss chart (not the compare page's): a drag zooms it (and the throughput chart with it) to
    the dragged steps and then shows every point of that range (the whole run is thinned for the page, the range is
    not); the step inputs narrow it; hovering names the step, the loss and the time it was logged."""
    write_run(isolated, "t-zoom", state="succeeded", exit_code=0, steps=20000, minutes=40.0)
    s = served()
    p = Page(browser, s)
    page = p.page
    page.goto(f"{s.base}/run/t-zoom")
    page.wait_for_function("() => window.G.charts && G.charts.loss && G.charts.loss.data[0].length > 1000")
    xs = chart_data(page, "loss")[0]
    assert xs[0] == 1 and xs[-1] == 20000 and len(xs) < 20000  # the whole run, thinned
    drag(page, "#chart-loss .u-over", 0.3, 0.4)
    lo, hi = page.evaluate("() => [G.charts.loss.scales.x.min, G.charts.loss.scales.x.max]")
    assert 4000 < lo < 8000 and 6000 < hi < 10000 and hi - lo < 4000, (lo, hi)
    assert page.evaluate("() => [G.charts.rate.scales.x.min, G.charts.rate.scales.x.max]") == [lo, hi]
    expect(page.locator("#step-from")).to_have_value(str(math.floor(lo)))
    expect(page.locator("#step-to")).to_have_value(str(math.ceil(hi)))
    # the points shown are the range's: every step of it, read from the database for the range
    a, b = math.ceil(lo), math.floor(hi)
    page.wait_for_function("""([a, b]) => { const xs = Array.from(G.charts.loss.data[0]).filter((x) => x >= a && x <= b);
        return xs.length === b - a + 1; }""", arg=[a, b])
    assert page.evaluate("() => [G.charts.loss.scales.x.min, G.charts.loss.scales.x.max]") == [lo, hi]  # still zoomed
    # the page's own refresh of the whole history (3 s after loading, then every minute) keeps the range's points
    with page.expect_response(lambda r: "/series?metric=loss&limit=" in r.url and "lo=" not in r.url, timeout=70000):
        pass
    page.wait_for_timeout(300)  # past the merge and a frame: what the refresh left on the chart
    page.wait_for_function("""([a, b]) => Array.from(G.charts.loss.data[0]).filter((x) => x >= a && x <= b).length
        === b - a + 1""", arg=[a, b], timeout=5000)
    # hover: the step, its loss and when it was logged
    box = page.locator("#chart-loss .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
    legend = page.locator("#chart-loss .u-legend")
    expect(legend).to_contain_text(re.compile(r"step \d{1,2},?\d{3} · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
    step = int(re.search(r"step (\d{1,2},?\d{3})", legend.inner_text()).group(1).replace(",", ""))
    assert a <= step <= b, (step, a, b)
    raw = legend.locator(".u-series").nth(1).inner_text()
    assert f"{4.0 / math.sqrt(step):.4g}".rstrip("0") in raw, (raw, step)
    # smoothing off and a log scale (the charts are drawn anew): still the same range
    page.locator("#smoothing").fill("0")
    page.locator("#log-scale").check()
    page.wait_for_function("() => G.charts.loss.scales.y.distr === 3")
    assert page.evaluate("() => [G.charts.loss.scales.x.min, G.charts.loss.scales.x.max]") == [lo, hi]
    # a double-click: every step again, on both charts
    page.locator("#chart-loss .u-over").dblclick()
    page.wait_for_function("""() => [G.charts.loss, G.charts.rate].every((u) => u.scales.x.min <= 1
        && u.scales.x.max >= 20000)""")
    expect(page.locator("#step-from")).to_have_value("")
    # a range typed in narrows it, on both charts, with every point of the range
    page.locator("#step-from").fill("100")
    page.locator("#step-to").fill("200")
    page.locator("#step-apply").click()
    page.wait_for_function("""() => [G.charts.loss, G.charts.rate].every((u) => Math.round(u.scales.x.min) === 100
        && Math.round(u.scales.x.max) === 200)""")
    page.wait_for_function("""() => Array.from(G.charts.loss.data[0]).filter((x) => x >= 100 && x <= 200).length === 101""")
    # and "all steps" brings the whole run back
    page.locator("#step-all").click()
    page.wait_for_function("() => G.charts.loss.scales.x.min <= 1 && G.charts.loss.scales.x.max >= 20000")
    expect(page.locator("#step-from")).to_have_value("")
    p.clean()


DRAWN_AT = """([key, si]) => { const u = G.charts[key]; const xs = u.data[0], ys = u.data[si];
  const i = ys.findIndex((v) => v !== null && v !== undefined); if (i < 0) return null;
  const x = Math.round(u.valToPos(xs[i], 'x', true)), y = Math.round(u.valToPos(ys[i], 'y', true));
  const px = u.ctx.getImageData(x - 4, y - 4, 9, 9).data;
  for (let k = 0; k < px.length; k += 4) if (px[k + 3] > 0 && px[k + 2] > px[k] + 60) return true;  // a blue mark
  return false; }"""


def test_a_run_with_one_logged_step_shows_that_point_not_an_empty_chart(served, browser, isolated):
    """A job that logged one step and died (the usual first failure): its loss header says 1, and its chart draws
    that one point (a line of one point is nothing, and points are otherwise hidden so raw lines stay readable)."""
    write_run(isolated, "t-one", steps=1, loss=lambda s: 1.0)
    s = served()
    p = Page(browser, s)
    page = p.page
    page.goto(f"{s.base}/run/t-one")
    expect(page.locator("#latest-loss")).to_have_text("1")
    page.wait_for_function("() => G.charts.loss.data[0].length === 1")
    page.locator("#smoothing").fill("0")  # the raw series alone
    page.wait_for_function("() => G.charts.loss.series.length === 2")
    page.wait_for_function(f"() => ({DRAWN_AT})(['loss', 1]) === true", timeout=5000)
    assert page.evaluate(DRAWN_AT, ["rate", 1]) is True
    p.clean()
