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

from test_dashboard_e2e import browser, shot_dir, watch_page  # noqa: F401  (the Chromium fixture)

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

    def __init__(self, project: Path, follow: bool = False):
        import uvicorn

        from gpuops.dashboard.app import allowed_hosts, bind, build_app, new_token
        from gpuops.dashboard.hub import Hub

        self.hub = Hub(project, follow=follow, api_every=3600)
        self.hub.start()
        sock = bind("127.0.0.1", 0)
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

    def make(project: Path = isolated, follow: bool = False) -> Served:
        s = Served(project, follow)
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
