"""Figures for `gpuops dashboard` with a job training on the sandbox host (real sshd, emulated nvidia-smi), seen in
Debian's Chromium through Playwright:

- first page: the time to answer `/` and `/api/overview` (median of 20, with the cookie), and the run page in the
  browser until its first chart row and log line are drawn;
- update latency: the job prints `t=<its clock>` on each line; the time until that line shows on the page (the same
  machine's clock), median and worst over the run;
- memory: the dashboard process' RSS at the start and every 10 s while 3 tabs stream the run;
- a flood: a second job printing as fast as it can (about 20,000 lines/s on this machine) for 15 s: how far behind
  the page falls, and whether it then says "behind by N s" rather than "live"; how long it takes to catch up;
- the metrics database (runs/metrics.sqlite) the follow path wrote meanwhile: its size and the rows kept.
Not a pass/fail test. Run: uv run python benchmarks/bench_dashboard.py [seconds, default 180]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

TRAINER = """\
import sys, time
end = time.time() + float(sys.argv[1])
i = 0
while time.time() < end:
    i += 1
    print(f"step {i} | loss {3.0 / i ** 0.5:.4f} | 950 tokens/s t={time.time():.3f}", flush=True)
    time.sleep(0.5)
"""
FLOOD = """\
import sys, time
end = time.time() + float(sys.argv[1])
i = 0
while time.time() < end:
    i += 1
    sys.stdout.write(f"step {i} | loss {3.0 / i ** 0.5:.4f} | 20000 lines/s t={time.time():.3f}\\n")
    if i % 200 == 0:
        sys.stdout.flush()
        time.sleep(0.01)
print(f"done {i} lines t={time.time():.3f}", flush=True)
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def flood_phase(gp, project: Path, page, base: str) -> str:
    """A job printing as fast as it can for 15 s, its page open: the lag of the newest line shown, and what the
    page said meanwhile."""
    r = subprocess.run(gp + ["train", "-p", "sandbox", "--script", "flood.py", "--no-snapshot", "--force", "--", "15"],
                       cwd=project, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rid = r.stdout.strip().splitlines()[-1]
    page.goto(f"{base}/run/{rid}")
    samples, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 90:
        text = page.locator("#log span").last.inner_text() if page.locator("#log span").count() else ""
        link = page.locator("#link").inner_text()
        if "t=" in text:
            samples.append((time.monotonic() - t0, time.time() - float(text.rsplit("t=", 1)[1]), link))
            if text.startswith("done"):
                break
        time.sleep(0.5)
    last = page.locator("#log span").last.inner_text()
    lines = last.split()[1] if last.startswith("done") else "?"
    worst = max(samples, key=lambda x: x[1]) if samples else (0, 0, "")
    said_live_behind = [s for s in samples if s[1] > 3 and s[2] == "live"]
    caught = next((s[0] for s in samples if s[0] > 15 and s[1] < 1), None)
    return (f"flood ({lines} lines in 15 s): worst lag {worst[1]:.1f} s (page said {worst[2]!r}); samples more "
            f"than 3 s behind while the page said 'live': {len(said_live_behind)} of {len(samples)}; "
            f"caught up {'%.0f s after the job began' % caught if caught else 'not within 90 s'}")


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 180.0
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-dash-"))
    from benchenv import isolated

    os.environ.update(isolated(tmp))
    project = tmp / "benchproj"
    project.mkdir()
    (project / "train.py").write_text(TRAINER)
    (project / "flood.py").write_text(FLOOD)
    from gpuops.sandbox import host

    host.up()
    gp = [sys.executable, "-m", "gpuops"]
    proc = None
    try:
        r = subprocess.run(gp + ["train", "-p", "sandbox", "--script", "train.py", "--no-snapshot", "--",
                                 str(seconds + 60)], cwd=project, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rid = r.stdout.strip().splitlines()[-1]
        t_start = time.perf_counter()
        proc = subprocess.Popen(gp + ["dashboard", "--no-browser"], cwd=project, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        url = proc.stdout.readline().strip()
        print(f"dashboard up, URL printed after {time.perf_counter() - t_start:.2f} s")
        base = url.split("/?")[0]

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None

        try:
            urllib.request.build_opener(NoRedirect).open(url, timeout=10)
        except urllib.error.HTTPError as e:  # 303: the token traded for the session cookie
            cookie = {"Cookie": e.headers["set-cookie"].split(";")[0]}
        rss0 = rss_mb(proc.pid)

        def timed(path: str) -> float:
            t = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=cookie), timeout=10) as resp:
                resp.read()
            return (time.perf_counter() - t) * 1000

        print(f"first requests right after the URL was printed: GET / {timed('/'):.1f} ms, "
              f"GET /api/overview {timed('/api/overview'):.1f} ms")
        for path in ("/", "/api/overview", f"/api/run/{rid}", "/static/uPlot.iife.min.js"):
            ts = [timed(path) for _ in range(20)]
            print(f"GET {path:<28} median {statistics.median(ts):6.1f} ms, worst {max(ts):6.1f} ms (20 requests)")

        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-quic", "--no-first-run", "--disable-sync"])
            ctx = b.new_context()
            page = ctx.new_page()
            page.goto(url)
            t = time.perf_counter()
            page.goto(f"{base}/run/{rid}", wait_until="domcontentloaded")
            dcl = (time.perf_counter() - t) * 1000
            expect(page.locator("#log span").first).to_be_visible(timeout=30000)
            expect(page.locator("#latest-util")).to_contain_text("%", timeout=30000)
            print(f"run page in Chromium: DOMContentLoaded {dcl:.0f} ms, charts and log drawn "
                  f"{(time.perf_counter() - t) * 1000:.0f} ms after the request")
            tabs = [page] + [ctx.new_page() for _ in range(2)]
            for p in tabs[1:]:
                p.goto(f"{base}/run/{rid}")
            lat, seen, end = [], set(), time.monotonic() + seconds
            next_rss, rss = time.monotonic(), []
            while time.monotonic() < end:
                text = page.locator("#log span").last.inner_text()
                now = time.time()
                if "t=" in text and text not in seen:
                    seen.add(text)
                    lat.append(now - float(text.rsplit("t=", 1)[1]))
                if time.monotonic() >= next_rss:
                    rss.append(rss_mb(proc.pid))
                    next_rss += 10
                time.sleep(0.05)
            streams = sum(1 for line in subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True,
                                                       text=True).stdout.splitlines()
                          if line.startswith("tail --pid=") and f"/{rid}/log" in line)
            for p in tabs[1:]:
                p.close()
            lat = lat[2:]  # the replayed backlog is not an update
            print(f"update latency (job prints -> shown in the page), {len(lat)} lines: median "
                  f"{statistics.median(lat):.2f} s, 95th {sorted(lat)[int(len(lat) * 0.95)]:.2f} s, worst {max(lat):.2f} s")
            print(f"dashboard RSS: {rss0:.1f} MB at start; over {seconds:.0f} s with 3 tabs: "
                  + " ".join(f"{x:.0f}" for x in rss) + f" MB (max {max(rss):.1f} MB)")
            print(f"watch streams on the host for the run while 3 tabs showed it: {streams}", flush=True)
            print(flood_phase(gp, project, page, base))
            b.close()
        db = project / "runs" / "metrics.sqlite"
        import sqlite3

        con = sqlite3.connect(db)
        counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("points", "gpu", "marks")}
        print(f"metrics database {db.name}: {db.stat().st_size / 1e6:.1f} MB (+ WAL "
              f"{(db.with_name(db.name + '-wal').stat().st_size if db.with_name(db.name + '-wal').exists() else 0) / 1e6:.1f}"
              f" MB), rows: {counts}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        subprocess.run(gp + ["stop", "-p", "sandbox", "--grace", "0.1"], cwd=project, capture_output=True)
        host.down()


if __name__ == "__main__":
    main()
