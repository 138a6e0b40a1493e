"""Figures for `gpuops dashboard` with a job training on the sandbox host (real sshd, emulated nvidia-smi), seen in
Debian's Chromium through Playwright:

- first page: the time to answer `/` and `/api/overview` (median of 20, with the cookie), and the run page in the
  browser until its first chart row and log line are drawn;
- update latency: the job prints `t=<its clock>` on each line; the time until that line shows on the page (the same
  machine's clock), median and worst over the run;
- memory: the dashboard process' RSS at the start and every 10 s while 3 tabs stream the run.
Not a pass/fail test. Run: uv run python benchmarks/bench_dashboard.py [seconds, default 180]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
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


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 180.0
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-dash-"))
    os.environ.update(GPUOPS_STATE_DIR=str(tmp / "state"), GPUOPS_CONFIG_DIR=str(tmp / "config"), NO_COLOR="1",
                      HOME=str(tmp / "home"))
    (tmp / "home").mkdir()
    project = tmp / "benchproj"
    project.mkdir()
    (project / "train.py").write_text(TRAINER)
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
        base, token = url.split("/?")[0], url.split("token=")[1]
        cookie = {"Cookie": f"gpuops_dashboard={token}"}
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
            b.close()
        lat = lat[2:]  # the replayed backlog is not an update
        print(f"update latency (job prints -> shown in the page), {len(lat)} lines: median {statistics.median(lat):.2f} s, "
              f"95th {sorted(lat)[int(len(lat) * 0.95)]:.2f} s, worst {max(lat):.2f} s")
        print(f"dashboard RSS: {rss0:.1f} MB at start; over {seconds:.0f} s with 3 tabs: "
              + " ".join(f"{x:.0f}" for x in rss) + f" MB (max {max(rss):.1f} MB)")
        print(f"watch streams on the host for the run while 3 tabs showed it: {streams}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        subprocess.run(gp + ["stop", "-p", "sandbox", "--grace", "0.1"], cwd=project, capture_output=True)
        host.down()


if __name__ == "__main__":
    main()
