"""Figures for fleets: `gpuops verify` of a fleet of N sandbox hosts, for each N given, and where the time goes.

    python benchmarks/bench_fleet.py [N ...] [-- VERIFY OPTIONS]     (default: 1 4 16; BENCH_RUNS=3 runs per count)

Each host is its own sandbox host (gpuops.sandbox.host.start(address=AUTO): its own sshd on its own 127.0.0.N:22,
host key and emulated GPUs, as separate machines are); they all let in one client key. Needs sshd and root (port 22),
as on a lent GPU machine (../shared/gpu-host/): there, run it with that machine's python3 from the project root.

Per count it prints:
- the wall time of the command as a person runs it (`python -m gpuops verify FLEET --no-save --json`, a new process
  each run, so the CLI start is in it), the median of BENCH_RUNS, and its ratio to one host's;
- one more run inside this process, timed by phase: connect and probe (the one remote execution) per host, when the
  last host's result arrived and what came after it (the fleet checks, rendering, printing);
- the CPU time of gpuops' own process, and of the whole machine: the sandbox hosts' sshd and probes run on this
  machine's cores too, so with fewer cores than hosts / 4 the probes themselves set the floor (machine CPU / cores).
Not a pass/fail test. The goal (issue 23) on a machine with at least hosts / 4 cores: 16 hosts <= 1.5x one host,
64 hosts <= 2x.
"""
from __future__ import annotations

import getpass
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
VERIFY_ARGS: list[str] = []  # after `--` on the command line


def machine_cpu() -> float | None:
    """CPU seconds spent by every core since boot (Linux /proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = [int(x) for x in fields[:3] + fields[5:8]]  # user nice system, irq softirq steal (not idle, not iowait)
    return sum(busy) / ticks


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Phases:
    """Wraps gpuops' connect and gather (the probe's one execution) and hostpool.for_each to time them per host."""

    def __init__(self):
        import gpuops.hostpool as hostpool
        import gpuops.remote.connection as connection
        import gpuops.remote.gather as gather

        self.lock = threading.Lock()
        self.connect: list[float] = []
        self.probe: list[float] = []
        self.results_at = 0.0
        self.t0 = 0.0
        self._wrap(connection, "connect", self.connect)
        self._wrap(gather, "gather", self.probe)
        inner = hostpool.for_each

        def for_each(*a, **k):
            try:
                return inner(*a, **k)
            finally:
                self.results_at = time.perf_counter() - self.t0

        hostpool.for_each = for_each

    def _wrap(self, module, name: str, into: list) -> None:
        inner = getattr(module, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                with self.lock:
                    into.append(time.perf_counter() - t)

        setattr(module, name, timed)

    def start(self) -> None:
        self.connect.clear()
        self.probe.clear()
        self.t0 = time.perf_counter()


def session_cost(name: str) -> float:
    """The median of three `ssh HOST true` to the first host of profile `name` (gpuops' own ssh options: its known_hosts,
    StrictHostKeyChecking=yes)."""
    from gpuops.profiles.model import resolve
    from gpuops.remote.connection import ssh_command

    node = resolve(name).nodes()[0]
    times = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(ssh_command(node) + [node.host, "true"], capture_output=True, timeout=120, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def in_process(name: str, phases: Phases) -> dict:
    import contextlib
    import io

    from gpuops.cli import main

    out, err = io.StringIO(), io.StringIO()
    cpu0, mach0 = time.process_time(), machine_cpu()
    phases.start()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.run(["verify", name, "--no-save", "--json", *VERIFY_ARGS])
    wall = time.perf_counter() - phases.t0
    mach1 = machine_cpu()
    doc = json.loads(out.getvalue())
    hosts = doc["hosts"] if "hosts" in doc else [{"report": doc}]  # one host: verify's own report
    return {"code": code, "wall": wall, "cpu": time.process_time() - cpu0, "hosts": hosts,
            "machine": None if mach0 is None else mach1 - mach0}


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s" if values else "-"


def main(counts: list[int]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-fleet-"))
    for var, sub in (("HOME", "home"), ("GPUOPS_STATE_DIR", "state"), ("GPUOPS_CONFIG_DIR", "config")):
        (tmp / sub).mkdir()
        os.environ[var] = str(tmp / sub)
    os.environ["NO_COLOR"] = "1"
    os.environ.pop("GPUOPS_PROFILE", None)
    from gpuops.sandbox import host

    proj = tmp / "proj"
    (proj / "profiles").mkdir(parents=True)
    key = tmp / "client_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    dirs = [tmp / "hosts" / f"h{i}" for i in range(max(counts))]
    cores = os.cpu_count() or 1
    ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    print(f"machine: {cores} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{ssh_version}; {time.strftime('%Y-%m-%d')}; load average {os.getloadavg()[0]:.1f} (other work on this "
          f"machine shares its cores); verify options: {' '.join(VERIFY_ARGS) or '-'}")
    try:
        t = time.perf_counter()
        states = [host.start(d, address=host.AUTO, authorized_keys=[key.with_suffix(".pub").read_text()])
                  for d in dirs]
        print(f"{len(dirs)} sandbox hosts started in {time.perf_counter() - t:.1f} s")
        for n in counts:
            doc = {"user": getpass.getuser(), "key": str(key), "python": "python3", "host_key_policy": "accept-new",
                   "expect": {"gpu_count": 1}, "hosts": [{"host": s["address"]} for s in states[:n]]}
            (proj / "profiles" / f"fleet{n}.yaml").write_text(json.dumps(doc))  # YAML is a superset of JSON
        os.chdir(proj)
        phases = Phases()
        one = None
        for n in counts:
            name = f"fleet{n}"
            first = in_process(name, phases)  # trusts the host keys, warms the page cache
            if n == counts[0]:
                print(f"`ssh HOST true` to one sandbox host: {session_cost(name):.2f} s (the connection, then the "
                      "session: sshd and the login shell's startup files, run on this machine too)")
            ok = sum(1 for h in first["hosts"] if h["report"])
            walls, cpus = [], []
            for _ in range(RUNS):
                c0, t = children_cpu(), time.perf_counter()
                subprocess.run([sys.executable, "-m", "gpuops", "verify", name, "--no-save", "--json", *VERIFY_ARGS],
                               cwd=proj, capture_output=True)
                walls.append(time.perf_counter() - t)
                cpus.append(children_cpu() - c0)
            wall = statistics.median(walls)
            one = one or (wall if n == 1 else None)
            ratio = f", {wall / one:.2f}x one host" if one else ""
            goal = {16: 1.5, 64: 2.0}.get(n)
            aim = f" (goal <= {goal}x with >= {n // 4} cores: this machine has {cores})" if goal else ""
            print(f"{n:3d} hosts: {wall:.2f} s{ratio}{aim}; {ok}/{n} hosts answered; a new process each run, median of "
                  f"{RUNS} ({', '.join(f'{w:.2f}' for w in walls)}); gpuops' CPU {statistics.median(cpus):.2f} s")
            r = in_process(name, phases)
            probe_cpu = sum(h["report"]["facts"].get("probe_seconds") or 0 for h in r["hosts"] if h["report"])
            after = (f"; last result at {phases.results_at:.2f} s, then {r['wall'] - phases.results_at:.2f} s for the "
                     "fleet checks and the output") if n > 1 else ""  # one host: verify's own path, no fleet
            print(f"           in this process {r['wall']:.2f} s: connect {fmt(phases.connect)}; probe "
                  f"{fmt(phases.probe)}{after}")
            mach = r["machine"]
            print(f"           CPU: gpuops {r['cpu']:.2f} s ({1000 * r['cpu'] / n:.0f} ms a host)"
                  + (f"; the machine {mach:.2f} s over {cores} cores, a floor of {mach / cores:.2f} s" if mach else "")
                  + f"; the probes' own time adds up to {probe_cpu:.2f} s")
    finally:
        os.chdir(tmp)
        for d in dirs:
            host.stop(d)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    VERIFY_ARGS[:] = args[cut + 1:]
    main([int(a) for a in args[:cut]] or [1, 4, 16])
