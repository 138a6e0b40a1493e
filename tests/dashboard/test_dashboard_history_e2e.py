"""A run's history through the sandbox host (real sshd, the emulated GPU tools): the follow path that `gpuops watch`,
`gpuops run` and the dashboard share writes runs/metrics.sqlite; a dashboard restarted while a run trains shows the
whole loss history by step in Chromium (what the first one kept, the stretch no one saw read back from the log, and
what comes live); a finished run is never shown a GPU sample taken after it ended."""
from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from support.browser import open_page, start_dashboard, stop, watch_page
from support.runs import put, run_dir, run_id_of, wait_ended

pytestmark = pytest.mark.usefixtures("cleanup_runs")

TRAIN = """\
import os, time
n = int(os.environ.get("N", "150"))
for i in range(1, n + 1):
    print(f"step {i}/{n} | loss {3.0 / i ** 0.5:.4f} | {900 + 7 * i} tokens/s", flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.1")))
"""


def kept(project, rid: str, metric: str = "loss") -> list:
    from gpuops.history import store

    r = store.Reader(store.db_path(project))
    try:
        return r.series(rid, metric, limit=100_000)["points"]
    finally:
        r.close()


def test_watch_of_an_ended_run_keeps_its_metrics_and_shows_no_later_gpu_sample(sandbox, gpuops, isolated):
    put(sandbox, "train.py", TRAIN)
    rid = run_id_of(gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot", "-e", "N=30", "-e",
                           "DELAY=0.01"))
    assert wait_ended(sandbox, rid) == 0
    res = gpuops("watch", rid, "--json", "--interval", "0.2", "--lines", "5")
    assert res.code == 0, res.all
    docs = [json.loads(x) for x in res.out.splitlines()]
    assert not [d for d in docs if d["type"] == "sample"], docs  # the GPU now is another job's, not this run's
    assert [d["line"] for d in docs if d["type"] == "log"][-1] == "step 30/30 | loss 0.5477 | 1110 tokens/s"
    # its whole history kept: the 5 lines replayed, the 25 before read back from the host's log (no time: not seen)
    pts = kept(isolated, rid)
    assert [p[0] for p in pts] == list(range(1, 31)) and all(p[2] is None for p in pts)
    assert [p[1] for p in kept(isolated, rid, "rate")] == [900 + 7 * i for i in range(1, 31)]


def test_a_dashboard_restarted_while_a_run_trains_shows_its_whole_loss_history_by_step(sandbox, gpuops, isolated,
                                                                                          browser, tmp_path):
    put(sandbox, "train.py", TRAIN)
    rid = run_id_of(gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot", "-e", "N=400", "-e",
                           "DELAY=0.08"))
    log = run_dir(sandbox, rid) / "log"

    def remote_step() -> int:
        got = re.findall(r"step (\d+)/", log.read_text()) if log.is_file() else []
        return int(got[-1]) if got else 0

    proc, url = start_dashboard(isolated)  # the first dashboard follows the run and keeps its metrics
    try:
        deadline = time.monotonic() + 60
        while len(kept(isolated, rid)) < 40:
            assert time.monotonic() < deadline, "the first dashboard kept nothing"
            time.sleep(0.2)
    finally:
        stop(proc)
    first = len(kept(isolated, rid))
    at_stop = remote_step()
    deadline = time.monotonic() + 60
    while remote_step() < at_stop + 40:  # the run goes on while no dashboard runs
        assert time.monotonic() < deadline
        time.sleep(0.1)
    restarted = time.time()
    proc, url = start_dashboard(isolated)
    try:
        ctx, page, errors, requests = open_page(browser, url, 1100, 800)
        base = url.split("/?")[0]
        page.goto(f"{base}/run/{rid}")
        expect(page.locator("#run-state")).to_have_text("running")
        expect(page.locator("#link")).to_have_text("live")
        # every step from the first, none missing: before the restart, while it was down, and live since
        page.wait_for_function("""(need) => { const u = window.G && G.charts && G.charts.loss;
            if (!u) return false; const xs = Array.from(u.data[0]);
            return xs.length >= need && xs[0] === 1 && xs.every((x, i) => x === i + 1); }""", arg=at_stop + 60,
                               timeout=30000)
        xs = page.evaluate("() => Array.from(G.charts.loss.data[0])")
        assert xs[0] == 1 and xs == list(range(1, len(xs) + 1)) and len(xs) > first
        # a step's time on hover; a point the first dashboard saw live has its time, not the restart's
        times = {p[0]: p[2] for p in kept(isolated, rid)}
        seen_live = [s for s, t in times.items() if t is not None and s <= at_stop]
        assert seen_live and all(times[s] < restarted for s in seen_live)  # their own time, not the restart's
        assert times[1] is None  # replayed when the first dashboard began: its time is not known, none is made up
        page.screenshot(path=str(tmp_path / "restarted.png"), full_page=True)
        assert not errors, errors
        assert all(u.startswith(base + "/") or u.startswith("data:") for u in requests), requests
        ctx.close()
    finally:
        stop(proc)


FLOOD = """\
import sys, time
i = 0
while True:
    i += 1
    sys.stdout.write(f"step {i} | loss {3.0 / i ** 0.5:.4f} | t={time.time():.3f}\\n")
    if i % 200 == 0:  # about 20,000 lines a second, as benchmarks/bench_dashboard.py's flood
        sys.stdout.flush()
        time.sleep(0.01)
"""

RECORD_LINK = """() => { window.__links = []; const note = () => { const l = document.getElementById('link');
  if (l && window.__links[window.__links.length - 1] !== l.textContent) window.__links.push(l.textContent); };
  document.addEventListener('DOMContentLoaded', () => {
    note(); new MutationObserver(note).observe(document.getElementById('link'),
                                             { childList: true, characterData: true, subtree: true }); }); }"""


def test_a_log_flood_is_never_called_live_from_the_first_second(sandbox, gpuops, isolated, browser):
    """A job printing about 20,000 lines a second, its page opened as it begins (as benchmarks/bench_dashboard.py does): everything the connection line says, from
    the page's first paint, is recorded; it says it is behind and never "live" (no heartbeat says the stream keeps
    up: the first one is only the baseline of the host's clock, the next shows the log outrunning its reader)."""
    put(sandbox, "flood.py", FLOOD)
    rid = run_id_of(gpuops("train", "--script", "flood.py", "--no-sync", "--no-snapshot"))
    proc, url = start_dashboard(isolated)
    try:
        errors, requests = [], []
        ctx = browser.new_context(viewport={"width": 1100, "height": 800})
        ctx.add_init_script(f"({RECORD_LINK})()")
        page = ctx.new_page()
        watch_page(page, errors, requests)
        page.goto(url)
        page.goto(f"{url.split('/?')[0]}/run/{rid}")
        expect(page.locator("#link")).to_contain_text("behind", timeout=60000)
        said = page.evaluate("window.__links")
        assert said and "live" not in said, said
        assert not errors, errors
        ctx.close()
    finally:
        stop(proc)
        gpuops("stop", rid, "--grace", "0.1")


BROKEN = """\
import os, time
for i in range(1, int(os.environ.get("N", "3")) + 1):
    print(f"step {i} | loss {2.0 / i:.4f}", flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.05")))
from json import loads_fast  # a name the installed version does not have
"""


def test_a_real_import_error_is_the_cause_on_the_overview_and_the_run_page(sandbox, gpuops, isolated, browser):
    """Jobs that die of an ImportError on the sandbox host (issue 35's endings, read where the death is seen): one
    that died before any dashboard ran (`gpuops logs -f` saw it end), and one whose page is open when it dies. The overview's row and the run page
    say failed, exit 1, and the cause with its evidence and fix, from what the follower recorded; never a made-up
    record."""
    put(sandbox, "broken.py", BROKEN)
    early = run_id_of(gpuops("train", "--script", "broken.py", "--no-sync", "--no-snapshot"))
    assert wait_ended(sandbox, early) == 1
    assert gpuops("logs", "-f", early).code == 1  # followed to its end here: its record says how it ended
    assert json.loads((isolated / "runs" / early / "state.json").read_text())["state"] == "failed"
    cause = "an import failed: ImportError: cannot import name 'loads_fast' from 'json'"
    proc, url = start_dashboard(isolated)
    try:
        ctx, page, errors, requests = open_page(browser, url, 1280, 800)
        base = url.split("/?")[0]
        row = page.locator("table[aria-label=runs] tbody tr", has_text=early)
        expect(row.locator("td").nth(4)).to_have_text("failed", timeout=30000)
        expect(row.locator("td").nth(5)).to_have_text("1")
        expect(row.locator("td").nth(6)).to_contain_text(re.compile(r"an import failed: .*cannot import name 'loads_fast'"))
        # its page: ended, and no copy of its log here (`gpuops train`): its last lines are read from the host
        page.goto(f"{base}/run/{early}")
        log = page.locator("#log")
        expect(log).to_contain_text("ImportError: cannot import name 'loads_fast' from 'json'")
        expect(log).to_contain_text("Traceback (most recent call last)")
        expect(log).to_contain_text("step 3 | loss 0.6667")
        expect(log).to_contain_text("read from the host")
        page.goto(url)
        late = run_id_of(gpuops("train", "--script", "broken.py", "--no-sync", "--no-snapshot", "-e", "N=40",
                                "-e", "DELAY=0.2"))
        page.goto(f"{base}/run/{late}")
        expect(page.locator("#run-state")).to_have_text("running", timeout=30000)
        expect(page.locator("#run-state")).to_contain_text("failed (exit 1): an import failed", timeout=60000)
        assert cause in page.locator("#run-state").inner_text()
        info = page.get_by_label("what this run is")
        expect(info.locator("dd[data-k='exit code']")).to_have_text("1")
        expect(info.locator("dd[data-k=cause]")).to_contain_text("cannot import name 'loads_fast'")
        box = page.locator("details.ending")
        expect(box).to_contain_text("ImportError: cannot import name 'loads_fast' from 'json'")  # the evidence
        expect(box).to_contain_text("Fix: a version mismatch between packages")
        expect(box).to_contain_text("Source: Python exceptions, ImportError")
        page.reload()  # from the record now, not the live stream
        expect(page.locator("#run-state")).to_contain_text(cause)
        page.goto(base + "/")
        row = page.locator("table[aria-label=runs] tbody tr", has_text=late)
        expect(row.locator("td").nth(6)).to_contain_text("cannot import name 'loads_fast'")
        expect(row.locator("td").nth(5)).to_have_text("1")
        page.locator("#run-filter").fill("loads_fast")  # the cause is what a person filters by
        expect(page.locator("table[aria-label=runs] tbody tr")).to_have_count(2)
        assert not errors, errors
        assert all(u.startswith(base + "/") or u.startswith("data:") for u in requests), requests
        ctx.close()
    finally:
        stop(proc)
