"""How fast the dashboard's follower reads a flooding job: a job on the sandbox host prints as fast as it can
(bench_dashboard's FLOOD, about 18,000 lines/s here) for N seconds; the dashboard's own follower (Hub._follow: the
watch stream, the signal model, the run's feed and its history in runs/metrics.sqlite) reads it from before its first
line to its end, in this process. Prints the lines, the time and the lines per second it kept up with, and, with
--profile, where that time went. Not a pass/fail test. Run: uv run python benchmarks/bench_follow_flood.py [seconds]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_dashboard import FLOOD  # noqa: E402


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--profile"]
    seconds = args[0] if args else "10"
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-flood-"))
    from benchenv import isolated

    os.environ.update(isolated(tmp))
    project = tmp / "proj"
    project.mkdir()
    (project / "flood.py").write_text("import time\ntime.sleep(4)\n" + FLOOD)  # 4 s: the follower is there first
    from gpuops.sandbox import host

    host.up()
    try:
        r = subprocess.run([sys.executable, "-m", "gpuops", "train", "-p", "sandbox", "--script", "flood.py",
                            "--no-snapshot", "--force", "--", seconds], cwd=project, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rid = r.stdout.strip().splitlines()[-1]
        os.chdir(project)
        from gpuops.dashboard import hub as hb

        h = hb.Hub(project)
        meta = h.meta(rid)
        f = hb._Follower(h._new_feed(meta))
        prof = None
        if "--profile" in sys.argv:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.monotonic()
        h._follow(meta, f)
        took = time.monotonic() - t0
        if prof is not None:
            prof.disable()
        last = f.feed.log[-1][0] if f.feed.log else ""
        lines = int(last.split()[1]) if last.startswith("done") else None
        print(f"flood of {seconds} s: {lines} lines; followed from 4 s before its first line to its end in {took:.1f} s")
        if lines:
            print(f"the follower kept up with {lines / max(took - 4, 1e-9):,.0f} lines/s "
                  f"(the job printed {lines / float(seconds):,.0f} lines/s)")
        if prof is not None:
            import pstats

            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    finally:
        host.down()


if __name__ == "__main__":
    main()
