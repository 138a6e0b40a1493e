"""What a followed run's page holds in the dashboard's memory over time: a simulated stream (a training line every
0.5 s, a GPU sample every 2 s, on a simulated clock) through watch's Dashboard into the run's feed (RunFeed), the
memory the feed's objects take measured with tracemalloc every 10 simulated minutes. Its buffers are bounded (the
GPU rows of the last hour, 3,000 loss and rate points, a journal of 4,000 entries, 200 log lines), so what it holds
should grow through the first hour and stay flat after it. Not a pass/fail test; runs in seconds.
Run: uv run python benchmarks/bench_feed_memory.py [hours, default 2]
"""
from __future__ import annotations

import math
import sys
import tracemalloc


def main() -> None:
    hours = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    from gpuops.dashboard import feed as fd
    from gpuops.jobs import watch as w

    clock = {"now": 0.0}
    tracemalloc.start()
    dash = w.Dashboard({"run_id": "r1", "started_ts": 0.0}, price_per_hour=2.0, log_lines=fd.LOG_LINES,
                       clock=lambda: clock["now"])
    feed = fd.RunFeed("r1", hosts=1)
    base = tracemalloc.get_traced_memory()[0]
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": 95, "mem_used": 60000, "mem_total": 81559,
           "temp": 60, "power": 500}
    marks = []
    for half in range(int(hours * 3600 * 2) + 1):
        now = clock["now"] = half / 2
        step = half + 1
        for ev in ([{"type": "log", "line": f"step {step} | loss {3.0 / math.sqrt(step):.4f} | 950 tokens/s",
                     "offset": step * 40}]
                   + ([{"type": "sample", "gpu": dict(gpu)}] if half % 4 == 0 else [])):
            dash.apply(ev)
            feed.record(ev, now, dash)
        if half % 1200 == 0:  # every 10 simulated minutes
            feed.flush()
            marks.append((int(now // 60), (tracemalloc.get_traced_memory()[0] - base) / 1e6))
    print(f"a feed followed for {hours:g} simulated hours (a line every 0.5 s, a GPU sample every 2 s):")
    print("  " + "  ".join(f"{m} min {mb:.1f} MB" for m, mb in marks))
    last_hour = [mb for m, mb in marks if m >= 60]
    if len(last_hour) > 1:
        print(f"  after the first hour: {min(last_hour):.1f} to {max(last_hour):.1f} MB")


if __name__ == "__main__":
    main()
