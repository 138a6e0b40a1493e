"""`gpuops dashboard` in a real browser: Debian's Chromium driven by Playwright for Python, against the Lambda API
emulator (its instances are sandbox hosts) with a job training on one of them.

What a person sees: the instances (one marked "billing, unwatched"), the run, its page's values changing without a
reload (utilisation, step, loss), a training signal on the timeline, the state turning to succeeded. What the page
must not do: a request beyond the dashboard itself, a JavaScript error. The token: 401 without it, traded for an
HttpOnly SameSite=Strict cookie. One stream per run however many tabs.

Screenshots: every test takes its pictures into its own tmp folder (so the suite never rewrites the repository);
`GPUOPS_DOC_SCREENSHOTS=1 uv run pytest tests/dashboard/test_dashboard_e2e.py` writes them to docs/img/ for docs/dashboard.md."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from playwright.sync_api import expect

from support.cloud import API_KEY, TYPE, cloud_up
from support.browser import assert_page_clean, CHROMIUM, IMG, open_page, shot_dir, start_dashboard, stop, watch_page  # noqa: F401
from support.helpers import default_sigint

TRAINER = """\
import sys, time
print("Training: total_training_steps=80", flush=True)
for i in range(1, 81):
    print(f"step {i}/80 | loss {3.0 / i ** 0.5:.4f} | {900 + 7 * i} tokens/s", flush=True)
    if i == 12:
        print("NCCL WARN NET/IB : Got async event : port error", flush=True)
    time.sleep(0.35)
print("done", flush=True)
"""


def get(url: str, headers: dict | None = None, full: bool = False):
    """(status, the body's start) of a GET that follows no redirect; full: (status, body, headers)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            got = r.status, r.read(2000).decode(), r.headers
    except urllib.error.HTTPError as e:
        got = e.code, e.read(2000).decode(), e.headers
    return got if full else got[:2]


def streams_on_host(run_id: str) -> int:
    """The watch streams reading the run's log on its (sandbox) host: its `tail --pid=... -F <run dir>/log`."""
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("tail --pid=") and f"/{run_id}/log" in line)


# every chart fills its box, neither narrower nor spilling out of it (the window's width may have changed)
CHARTS_FIT = """() => [...document.querySelectorAll('figure.chart')].length === 6 &&
  [...document.querySelectorAll('figure.chart')].every((f) => {
    const u = f.querySelector('.uplot'); const room = f.clientWidth - 12;
    return u && u.offsetWidth <= room + 2 && u.offsetWidth >= room - 40; })"""


def test_dashboard_in_chromium_instances_runs_and_a_live_run(cloud, gpuops, isolated, browser, tmp_path):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.handle("POST", "/api/v1/filesystems", {"name": "datasets", "region": "us-east-1"})
    assert cloud_up(gpuops, cloud, "box", "--no-verify", "--ttl", "2h", "--fs", "datasets").code == 0
    assert cloud_up(gpuops, cloud, "spare", "--no-verify").code == 0  # billing, and no run follows it
    (isolated / "trainer.py").write_text(TRAINER)
    r = gpuops("train", "-p", "box", "--script", "trainer.py", "--no-snapshot")
    assert r.code == 0, r.all
    rid = r.out.strip().splitlines()[-1]

    from gpuops.pipeline import stages as ps

    rec = ps.Record(id="run-sft-20261127-101500-ab12", profile="run-sft-20261127-101500-ab12", script="sft.py",
                    instance_type=TYPE, created=time.time() - 5400, price_per_hour=2.49, billed_from=time.time() - 5300,
                    outcome="succeeded", checkpoint={"name": "ckpt", "step": 400, "local": "ckpt/step_400"})
    for name in ps.STAGES:
        rec.stages[name] = ps.Stage(started=time.time() - 5300, ended=time.time() - 60, ok=True)
    ps.save(rec, isolated)  # a finished `gpuops run` of this project
    proc, url = start_dashboard(isolated)
    try:
        base = url.split("/?")[0]
        token = url.split("token=")[1]
        # no token, a wrong token, another Host: no data
        for u, h in ((base + "/", {}), (base + "/api/overview", {}), (base + "/events/run/" + rid, {}),
                     (base + "/api/overview?token=" + "x" * len(token), {}),
                     (base + "/api/overview", {"Cookie": "gpuops_dashboard=nope"})):
            code, body = get(u, h)
            assert code == 401, (u, code)
            assert rid not in body and "box" not in body and "instances" not in body
        code, _ = get(url, {"Host": "evil.example:80"})
        assert code == 403

        errors, requests = [], []
        ctx = browser.new_context(viewport={"width": 1100, "height": 760})
        page = ctx.new_page()
        watch_page(page, errors, requests)
        t0 = time.monotonic()
        page.goto(url)
        assert page.url == base + "/", page.url  # the token traded for a cookie, out of the address bar
        port = base.rsplit(":", 1)[1]
        cookie = next(c for c in ctx.cookies() if c["name"] == f"gpuops_dashboard_{port}")  # named for its port
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != token  # not the token
        # the instances: both, with type, region, price, cost, TTL, filesystems; the spare one billing unwatched
        page.get_by_role("table", name="instances").wait_for(timeout=20000)
        spare = page.locator("table[aria-label=instances] tr", has_text="spare")
        spare.get_by_text("billing, unwatched").wait_for(timeout=20000)
        box = page.locator("table[aria-label=instances] tr", has_text="box")
        box_text = box.inner_text()
        assert TYPE in box_text and "us-east-1" in box_text and "datasets" in box_text and "$" in box_text
        assert "1h5" in box_text  # TTL left of 2h
        runs = page.locator("table[aria-label=runs] tr", has_text=rid)
        runs.get_by_text("running").wait_for(timeout=20000)
        assert "billing, unwatched" not in box.inner_text()  # its run follows it
        pipe = page.locator("table[aria-label=pipelines] tr", has_text="run-sft-20261127-101500-ab12").inner_text()
        assert "ckpt/step_400 (step 400)" in pipe and "succeeded" in pipe
        print(f"overview loaded and filled in {time.monotonic() - t0:.2f}s")
        page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-overview.png"))

        # the run's page: values change without a reload
        runs.get_by_role("link", name=rid).click()
        page.wait_for_url(re.compile(f"/run/{rid}$"))
        util = page.locator("#latest-util")
        expect(util).to_contain_text("%", timeout=20000)
        expect(page.locator("#run-progress")).to_contain_text(re.compile(r"step \d+/80"), timeout=20000)
        first = page.locator("#run-progress").inner_text()
        expect(page.locator("#run-progress")).not_to_have_text(first, timeout=5000)  # the job went on: no reload
        assert 90 <= float(util.inner_text().split()[0]) <= 100  # the job computes on the emulated GPU
        expect(util).not_to_have_text(util.inner_text(), timeout=15000)  # its utilisation moves, no reload
        assert "latest:" in page.locator("#chart-util").get_attribute("aria-label")
        for key in ("util", "mem", "power", "temp", "loss", "rate"):
            fig = page.locator(f"#chart-{key}")
            assert fig.get_attribute("role") == "img" and fig.locator("canvas").count() >= 1
        expect(page.locator("#latest-loss")).to_have_text(re.compile(r"^\d\.\d+$"), timeout=10000)
        assert "tokens/s" in page.locator("#latest-rate").inner_text()
        page.get_by_label("training signals").get_by_text("NCCL network error").wait_for(timeout=20000)
        assert "step " in page.locator("#log").inner_text()
        assert "running" in page.locator("#run-state").inner_text()

        # a second tab on the same run: still one stream on the host
        page2 = ctx.new_page()
        watch_page(page2, errors, requests)
        page2.goto(f"{base}/run/{rid}")
        expect(page2.locator("#run-progress")).to_contain_text(re.compile(r"step \d+"), timeout=20000)
        assert streams_on_host(rid) == 1, [x for x in subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True,
                                                                        text=True).stdout.splitlines() if "tail" in x]
        page2.close()
        page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-run.png"))

        # the job ends: the page says so, without a reload
        expect(page.locator("#run-state")).to_contain_text("succeeded", timeout=60000)
        assert page.locator("#run-progress").inner_text().startswith("step 80/80")
        page.screenshot(path=str(tmp_path / "run-ended.png"), full_page=True)
        page.set_viewport_size({"width": 800, "height": 900})  # the window made narrow: the charts follow it
        page.wait_for_function(CHARTS_FIT, timeout=5000)
        page.screenshot(path=str(tmp_path / "run-narrow.png"), full_page=True)
        page.set_viewport_size({"width": 1400, "height": 900})  # and wide again
        page.wait_for_function(CHARTS_FIT, timeout=5000)
        page.set_viewport_size({"width": 800, "height": 900})
        page.goto(base + "/")
        page.get_by_role("table", name="instances").wait_for(timeout=20000)
        page.screenshot(path=str(tmp_path / "overview-narrow.png"), full_page=True)
        # in a narrow window "billing, unwatched" stays inside its cell, over no other column's text
        for tag in page.locator("table[aria-label=instances] .tag.unwatched").all():
            t, cell = tag.bounding_box(), tag.locator("xpath=ancestor::td").bounding_box()
            assert t["x"] + t["width"] <= cell["x"] + cell["width"] + 0.5, (t, cell)

        doc = ctx.request.get(f"{base}/api/overview").text()  # with the page's cookie
        assert API_KEY not in doc and rid in doc and API_KEY not in page.content()  # no secret reaches a page
        assert not errors, errors
        outside = [u for u in requests if not (u.startswith(base + "/") or u.startswith("data:"))]
        assert not outside, outside
        ctx.close()
    finally:
        stop(proc)
    assert API_KEY not in (proc.stderr.read() if proc.stderr else "")


FAILING = """\
import sys, time
for i in range(1, 31):
    print(f"step {i} loss {2.0 / i:.4f}", flush=True)
    time.sleep(0.2)
print("step 31 loss nan", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
sys.exit(1)
"""



def _train_on_box(gpuops, cloud, project: Path, trainer: str) -> str:
    """An instance `box` up through the emulator, `trainer` training there: the run's id."""
    cloud.capacity(TYPE, ["us-east-1"])
    assert cloud_up(gpuops, cloud, "box", "--no-verify").code == 0
    (project / "trainer.py").write_text(trainer)
    r = gpuops("train", "-p", "box", "--script", "trainer.py", "--no-snapshot")
    assert r.code == 0, r.all
    return r.out.strip().splitlines()[-1]

def test_a_run_that_fails_in_chromium(cloud, gpuops, isolated, browser, tmp_path):
    """A job that goes wrong (NaN, then out of memory, exit 1): its page says failed, marks what went wrong, and its
    log shows the newest line without scrolling; the runs table says failed; keyboard reaches the run's link."""
    rid = _train_on_box(gpuops, cloud, isolated, FAILING)
    proc, url = start_dashboard(isolated)
    try:
        ctx, page, errors, requests = open_page(browser, url, 800, 700)
        link = page.locator("table[aria-label=runs]").get_by_role("link", name=rid)
        link.wait_for(timeout=20000)
        for _ in range(40):  # the keyboard reaches the run's link (past the filter, the sort buttons, a checkbox)
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.textContent") == rid:
                break
        else:
            raise AssertionError("Tab never reached the run's link")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(f"/run/{rid}$"))
        expect(page.locator("#run-state")).to_contain_text("failed", timeout=60000)
        expect(page.locator("#run-state")).to_have_css("color", "rgb(180, 35, 24)")  # in red, seen at a glance
        expect(page.locator("#run-progress")).to_contain_text("step 31   loss NaN")  # the last loss, as it was
        marks = page.get_by_label("training signals")
        marks.get_by_text("CUDA out of memory").wait_for(timeout=20000)
        marks.get_by_text("NaN", exact=False).first.wait_for(timeout=20000)
        log = page.locator("#log")
        expect(log).to_contain_text("CUDA out of memory")
        page.wait_for_function("() => { const l = document.getElementById('log');"
                               " return l.scrollTop + l.clientHeight >= l.scrollHeight - 4; }", timeout=5000)
        page.screenshot(path=str(tmp_path / "run-failed.png"), full_page=True)
        page.go_back()
        runs = page.locator("table[aria-label=runs] tr", has_text=rid)
        runs.get_by_text("failed").wait_for(timeout=20000)
        page.screenshot(path=str(tmp_path / "overview-failed.png"), full_page=True)
        assert_page_clean(url, errors, requests)
        ctx.close()
    finally:
        stop(proc)


def test_screenshots_leave_the_repository_alone_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUOPS_DOC_SCREENSHOTS", raising=False)
    assert shot_dir(tmp_path) == tmp_path
    monkeypatch.setenv("GPUOPS_DOC_SCREENSHOTS", "1")
    assert shot_dir(tmp_path) == IMG


def test_port_in_use_is_a_usage_error(gpuops):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        r = gpuops("dashboard", "--no-browser", "--port", str(s.getsockname()[1]))
    finally:
        s.close()
    assert r.code == 2, r.all
    assert "cannot listen on 127.0.0.1:" in r.err and "--port" in r.err and "Traceback" not in r.all


class FleetHub:
    """The dashboard's data source with one fleet run of 64 emulated hosts (8 GPUs each), fed live by a thread."""

    def __init__(self):
        import threading

        from gpuops.dashboard import feed
        from gpuops.jobs import watch as w

        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.feed_ = feed.RunFeed("fleet-64", profile="fleet", hosts=64)
        self.dash = w.Dashboard({"run_id": "fleet-64"}, price_per_hour=64 * 23.92, signal_spec={})
        self.stop = threading.Event()
        self.t = time.time() - 120
        for _ in range(60):  # two minutes of history
            self.tick(step=2.0)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def tick(self, step: float) -> None:
        from gpuops.jobs.watch import parse_gpu

        self.t += step
        for h in range(64):
            for i in range(8):
                busy = h not in (13, 42)  # two hosts idle: they stand out in the grid
                util = (55 + (int(self.t) * 5 + h + i) % 40) if busy else 0
                g = parse_gpu(f"{i}, NVIDIA H100 80GB HBM3, {util}, {61000 if busy else 1}, 81559, "
                              f"{60 + h % 9 if busy else 33}, {650 - (h % 5) * 10 if busy else 70}.00")
                ev = {"type": "sample", "gpu": g, "host": h}
                self.dash.apply(ev)
                with self.lock:
                    self.feed_.record(ev, self.t, self.dash)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.tick(step=1.0)

    def overview(self):
        return {"project": "p", "now": time.time(), "runs": [], "pipelines": [], "instances": [],
                "instances_error": None, "instances_loaded": True}

    def feed(self, run_id):
        return self.feed_ if run_id == "fleet-64" else None

    def run_doc(self, run_id):
        f = self.feed(run_id)
        if f is None:
            return None
        with self.lock:
            return {**f.snapshot(), "info": {"run_id": run_id, "gpus": ["512 × NVIDIA H100 80GB HBM3"], "hosts": []}}

    def series(self, run_id, metric, lo, hi, limit=2000):
        """The fleet run has no metrics database: its loss and throughput are what the feed holds."""
        with self.lock:
            pts = list(self.feed_.loss if metric == "loss" else self.feed_.rate) if metric in ("loss", "rate") else []
        return {"run_id": run_id, "metric": metric, "unit": "", "points": pts, "total": len(pts), "thinned": False}

    def gpu_range(self, run_id, lo, hi):
        from gpuops.dashboard import feed

        with self.lock:
            lay = self.feed_.lay
        return {"series": lay["series"], "rows": feed.history_rows([], lay)}


def test_a_64_host_fleet_page_is_readable_in_chromium(browser, tmp_path):
    """The run page of a 64-host fleet: three lines per chart (min, mean, max across hosts) and a grid of every host's
    GPUs in rank order, the idle ones marked; updated live."""
    import threading

    import uvicorn

    from gpuops.dashboard.app import allowed_hosts, bind, build_app, new_token

    hub = FleetHub()
    sock = bind("127.0.0.1", 0)
    port, token = sock.getsockname()[1], new_token()
    server = uvicorn.Server(uvicorn.Config(build_app(hub, token, allowed_hosts("127.0.0.1", port)),
                                           log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    hub.thread.start()
    errors, requests = [], []
    try:
        ctx = browser.new_context(viewport={"width": 1100, "height": 640})
        page = ctx.new_page()
        watch_page(page, errors, requests)
        page.goto(f"http://127.0.0.1:{port}/run/fleet-64?token={token}")
        grid = page.get_by_role("list", name="GPUs of every host")
        expect(grid.get_by_role("listitem")).to_have_count(64)
        assert grid.get_by_role("listitem").nth(0).get_attribute("aria-label").startswith("host 0: mean utilisation")
        expect(grid.get_by_role("listitem").nth(13)).to_have_attribute("aria-label", "host 13: mean utilisation 0 %")
        assert page.locator("#chart-util .cell, .host").count() >= 64
        assert page.locator(".host").nth(5).locator(".cell").count() == 8
        assert page.locator(".host").nth(42).locator(".cell.idle").count() == 8
        latest = page.locator("#latest-util")
        expect(latest).to_contain_text("min of 64 hosts 0 %")
        first = latest.inner_text()
        expect(latest).not_to_have_text(first, timeout=10000)  # live
        assert page.locator("#chart-util .u-legend .u-series").count() == 4  # time + min, mean, max
        page.screenshot(path=str(shot_dir(tmp_path) / "dashboard-fleet.png"))
        assert not errors, errors
        assert all(u.startswith(f"http://127.0.0.1:{port}/") or u.startswith("data:") for u in requests), requests
        ctx.close()
    finally:
        hub.stop.set()
        server.should_exit = True
        th.join(timeout=10)


def test_browser_opened_on_a_private_redirect_file_and_ctrl_c_exits_130(isolated, tmp_path):
    """Without --no-browser: $BROWSER (webbrowser's own knob) is started on a 0600 local file that redirects to the
    URL, so the token is never on a command line; SIGINT ends the dashboard with 130."""
    import signal
    import stat

    seen = tmp_path / "browser-args"
    fake = tmp_path / "browser.sh"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    fake.chmod(0o755)
    env = {**os.environ, "BROWSER": f"{fake} %s", "GPUOPS_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "dashboard"], cwd=isolated, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)
    try:
        url = proc.stdout.readline().strip()
        token = url.split("token=")[1]
        deadline = time.monotonic() + 20
        while not (seen.is_file() and seen.read_text().strip()):
            assert time.monotonic() < deadline, "the browser was not started"
            time.sleep(0.1)
        arg = seen.read_text().strip()
        assert arg.startswith("file://") and token not in arg
        page = Path(arg[len("file://"):])
        assert stat.S_IMODE(page.stat().st_mode) == 0o600 and url in page.read_text()
        port = url.split("/?")[0].rsplit(":", 1)[1]
        assert f"-{port}-" in page.name and page.name != "open.html"  # this dashboard's own file
        code, _, headers = get(url, full=True)
        assert code == 303  # the URL answers: the token traded for a cookie
        cookie = headers["set-cookie"].split(";")[0]
        events = urllib.request.urlopen(urllib.request.Request(  # a page's event stream, open while it stops
            url.split("/?")[0] + "/events/overview", headers={"Cookie": cookie}), timeout=10)
        assert events.readline().startswith(b"data: ")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = proc.stderr.read()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not page.exists()  # the file holding the token is gone with the dashboard


def test_an_instance_launched_elsewhere_and_an_api_that_fails(cloud, isolated, browser, tmp_path):
    """An instance launched outside gpuops (the Lambda console): the overview shows the name the API gives it, and
    its uptime and cost from when this project's dashboard first saw it (marked as lower bounds) on exactly the
    "billing, unwatched" row; when the API then fails, the last list stays with its age."""
    import json as _json

    cloud.capacity(TYPE, ["us-east-1"])

    def api(method: str, path: str, body: dict) -> dict:
        req = urllib.request.Request(cloud.url + path, data=_json.dumps(body).encode(), method=method,
                                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return _json.loads(r.read())

    api("POST", "/ssh-keys", {"name": "console-key", "public_key": Path(str(cloud.key) + ".pub").read_text().strip()})
    api("POST", "/instance-operations/launch", {"region_name": "us-east-1", "instance_type_name": TYPE,
                                                "ssh_key_names": ["console-key"], "name": "notebook-box"})
    proc, url = start_dashboard(isolated)
    try:
        ctx, page, errors, requests = open_page(browser, url, 1100, 700)
        row = page.locator("table[aria-label=instances] tr", has_text="notebook-box")
        row.get_by_text("billing, unwatched").wait_for(timeout=20000)
        cells = row.locator("td")
        expect(cells.nth(4)).to_have_text(re.compile(r"^≥ \d+s$"))  # uptime: at least since first seen
        expect(cells.nth(6)).to_have_text(re.compile(r"^≥ \$\d+\.\d\d$"))  # cost so far: at least
        expect(page.locator("#instances-note")).to_contain_text("first saw it")
        cloud.fault("5xx", times=None, path="/instances")  # the API fails from now on
        expect(page.locator("#instances-note")).to_contain_text(re.compile(r"the list below is from \d+s ago"),
                                                                timeout=30000)
        expect(row).to_contain_text("notebook-box")  # the last list stays
        page.screenshot(path=str(tmp_path / "instances-api-failing.png"), full_page=True)
        assert not errors, errors
        assert API_KEY not in page.content()
        base = url.split("/?")[0]
        assert all(u.startswith(base + "/") or u.startswith("data:") for u in requests), requests
        ctx.close()
    finally:
        cloud.clear_faults()
        stop(proc)


LONG = """\
import time
for i in range(1, 100000):
    print(f"step {i}/100000 | loss {3.0 / i ** 0.5:.4f}", flush=True)
    time.sleep(0.3)
"""


def test_a_run_whose_host_stops_answering_is_unreachable_in_chromium(cloud, gpuops, isolated, browser, tmp_path):
    """A run training on an instance that then stops answering (its sshd gone, the job still running, the API still
    saying active): the overview says "unreachable" and when it was last heard from, with no GPU figure and no
    progress from before (not "running" at a stale 99 %), and the run's page says it cannot reach the host."""
    from support.cloud import live_instances

    rid = _train_on_box(gpuops, cloud, isolated, LONG)
    proc, url = start_dashboard(isolated)
    try:
        ctx, page, errors, requests = open_page(browser, url, 1280, 700)
        row = page.locator("table[aria-label=runs] tbody tr", has_text=rid)
        expect(row).to_contain_text("running", timeout=30000)
        expect(row.locator("td").nth(10)).to_have_text(re.compile(r"\d+ %"), timeout=30000)  # GPU util, live
        expect(row).to_contain_text(re.compile(r"step \d+/100,000"), timeout=30000)
        run_page = ctx.new_page()
        watch_page(run_page, errors, requests)
        run_page.goto(f"{url.split('/?')[0]}/run/{rid}")
        expect(run_page.locator("#run-progress")).to_contain_text("step ", timeout=30000)
        [inst] = live_instances(cloud)
        cloud.unreachable(inst["id"])
        state = row.locator("td").nth(4)
        expect(state).to_have_text(re.compile(r"^unreachable, last seen \d+s ago$"), timeout=60000)
        cells = row.locator("td")
        assert cells.nth(10).inner_text() == "-"  # no GPU figure from before it stopped answering
        assert "running" not in row.inner_text() and "step " not in row.inner_text()
        expect(run_page.locator("#link")).to_contain_text("reconnecting", timeout=30000)
        assert run_page.locator("#link").get_attribute("class") == "bad"
        expect(run_page.locator("#run-state")).to_contain_text("unreachable: its host does not answer, last heard from")
        expect(run_page.locator("#latest-util")).to_contain_text("no answer since")
        page.screenshot(path=str(tmp_path / "overview-unreachable.png"), full_page=True)
        assert_page_clean(url, errors, requests)
        ctx.close()
    finally:
        stop(proc)
