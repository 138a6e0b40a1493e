"""Figures for `gpuops sync` / `gpuops fetch` against the local sandbox host (real sshd, real rsync).

    uv run python benchmarks/bench_transfer.py [--fetch-mb 1024] [--project-mb 200] [--rounds 7] [--sync-only]

Prints: no-change re-sync time against plain `rsync -a` over a hand-written ssh (goal <= 1.2x), the median of
--rounds interleaved rounds: `gpuops sync` in this process (as the goal was measured), as a new process (what a
person runs: the CLI start included), and the same sync through a connection of gpuops' own (the flow `gpuops sync`
had before its one shared connection, and `train` still has); bytes sent for a one-line change in a 200 MB project
(goal < 1 % of the tree);
fetch throughput of a 1 GB checkpoint relative to a plain `rsync -a` over the same ssh (goal >= 0.9); bytes
re-sent after a resume (connection cut half-way through by a TCP proxy). Not a pass/fail test.
Everything lives in a temporary directory: its own sandbox, config, state and HOME.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what a person runs: the installed console script beside this python (else `python -m gpuops`)
_SCRIPT = Path(sys.executable).with_name("gpuops")
GPUOPS = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "gpuops"]


def cli(*args: str) -> tuple[int, dict | None, str]:
    from gpuops.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.run(list(args))
    try:
        doc = json.loads(out.getvalue())
    except ValueError:
        doc = None
    return code, doc, err.getvalue()


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def write_random(path: Path, size: int, chunk: int = 1 << 24) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(chunk, left)
            fh.write(os.urandom(n))
            left -= n


def runbook_ssh(p) -> str:
    """The ssh a user writes by hand (key, port, host-key checking), without gpuops' cipher preference."""
    from gpuops.remote.connection import ssh_command

    argv = ssh_command(p)
    i = next(i for i, a in enumerate(argv) if a.startswith("Ciphers="))
    return shlex.join(argv[:i - 1] + argv[i + 1:])


def no_change(proj: Path, rounds: int) -> dict:
    """A no-change re-sync, `rounds` interleaved rounds, four ways: the medians."""
    from gpuops.console import Output
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect
    from gpuops.transfer.sync import sync_project

    prof = profiles.resolve("sandbox")
    ssh = runbook_ssh(prof)

    def in_process() -> None:
        code, doc, err = cli("sync", "-p", "sandbox", "--json")
        assert code == 0 and doc["files"] == 0, err

    def new_process(env=None) -> None:
        subprocess.run([*GPUOPS, "sync", "-p", "sandbox", "--json"], check=True, capture_output=True, env=env)

    cached = cached_env()
    new_process(cached)  # the bytecode cache written once, as an installed CLI has it after its first start

    def own_connection() -> None:  # what `gpuops sync` did before: a connection and an execution, then rsync's own
        with connect(prof, announce=lambda s: None) as remote:
            assert sync_project(prof, remote, Output(json_mode=True), proj)["files"] == 0

    def plain() -> None:
        subprocess.run(["rsync", "-a", "--exclude", ".git", "-e", ssh, str(proj) + "/", f"127.0.0.1:{proj.name}/"],
                       check=True)

    ways = {"no_change_resync_s": in_process, "no_change_new_process_s": lambda: new_process(cached),
            "no_change_own_connection_s": own_connection, "no_change_plain_rsync_s": plain}
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # this machine's own way: every start compiles every module
        ways["no_change_new_process_uncached_s"] = new_process
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for key, fn in ways.items():
            times[key].append(timed(fn)[0])
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def cached_env() -> dict:
    """The environment of a new process with Python's bytecode cache (in a folder of the benchmark's own), whatever
    PYTHONDONTWRITEBYTECODE this shell sets: what an installed gpuops starts with (pip and uv write the cache at
    install time or on the first start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(os.environ["HOME"]) / "pycache")
    return env


def breakdown(proj: Path, rounds: int) -> dict:
    """Where a no-change re-sync's time goes (medians of `rounds`): the phases `gpuops sync` runs, each timed on its
    own as sync_project runs them (transfer/sync.py), and what a new process adds (python and the CLI's imports)."""
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import shared
    from gpuops.remote.shell import shell_path
    from gpuops.transfer import plan as tr
    from gpuops.transfer import preview as pv
    from gpuops.transfer import rsync as rs
    from gpuops.transfer.sync import sync_rules

    parts: dict[str, list[float]] = {}

    def lap(key: str, fn):
        t, r = timed(fn)
        parts.setdefault(key, []).append(t)
        return r

    from gpuops.profiles.locate import locate
    from gpuops.profiles.memo import recall

    profiles.resolve("sandbox")  # validated once (and kept): each start after reads it back without pydantic
    for _ in range(rounds):
        prof = lap("profile (the file, then as kept: memo.py)", lambda: recall(locate("sandbox"), proj))
        labelled = lap("rules (.gpuopsignore, excludes)", lambda: sync_rules(prof.sync.exclude, proj))
        rules = [r for r, _ in labelled]
        scan = lap("local walk (links, size: the preview and the disk's bound)", lambda: pv.scan(proj, labelled))
        # a plain sync's connection is lazy: rsync's own ssh alone, no master (it opens only on a failure to connect)
        remote = lap("the connection (lazy: no master started)", lambda: shared(prof, announce=lambda s: None,
                                                                                lazy=True))
        remote_dir = prof.remote_dir_for(proj)
        guard = tr.sync_guard(shell_path(remote_dir), need=scan.total)
        argv = tr.sync_args(remote.ssh_argv(), proj, prof.host, remote_dir, rules, rsync_path=guard,
                            copy_links=prof.sync.copy_links)
        lap("rsync over its own ssh (one handshake, the checks in its session)", lambda: rs.run(argv, host=prof.host))
        lap("the connection's close (no master to end)", remote.close)
    env = cached_env()

    def started(code: str, e=None) -> float:
        return statistics.median([timed(lambda: subprocess.run([sys.executable, "-c", code], check=True,
                                                                env=e))[0] for _ in range(rounds)])

    # what a new process adds: python, the imports a sync makes (cli/quick.py: no typer, no pydantic, no yaml), and,
    # without a bytecode cache, compiling them; beside them, what a start through typer and the profile's model costs
    imports = ("import gpuops.cli.main, gpuops.cli.quick, gpuops.profiles.locate, gpuops.profiles.memo, "
               "gpuops.remote.connection, gpuops.transfer.sync, gpuops.transfer.rsync")
    typer_start = imports + ", gpuops.cli.commands, gpuops.profiles.model, tenacity"
    py, imp = started("pass", env), started(imports, env)
    out = {k: round(statistics.median(v), 4) for k, v in parts.items()}
    out["new process: python itself"] = round(py, 4)
    out["new process: the imports of a sync (bytecode cached)"] = round(imp - py, 4)
    out["(not run: a start through typer and pydantic would import)"] = round(started(typer_start, env) - py, 4)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        out["new process: compiling them (PYTHONDONTWRITEBYTECODE is set here)"] = round(started(imports) - imp, 4)
    return out


def report(figures: dict) -> int:
    plain = figures["no_change_plain_rsync_s"]
    rsync = subprocess.run(["rsync", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    print(f"cores: {os.cpu_count()} (load average {os.getloadavg()[0]:.1f})  rsync: {rsync}  {ssh}  "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"project: {figures['project_bytes'] / 1e6:.0f} MB")
    print(f"first sync:                         {figures['first_sync_s']} s")
    print(f"no-change re-sync: plain rsync -a over a hand-written ssh {plain} s (medians of {figures['rounds']} rounds)")
    for key, what in (("no_change_resync_s", "gpuops sync (in this process, as the goal is measured)"),
                      ("no_change_new_process_s", "gpuops sync as a new process (the CLI start included, bytecode cached)"),
                      ("no_change_new_process_uncached_s", "the same, no bytecode cache (PYTHONDONTWRITEBYTECODE "
                                                           "is set in this shell: each start compiles the sources)"),
                      ("no_change_own_connection_s", "the same sync through a connection of gpuops' own (before)")):
        if key not in figures:
            continue
        goal = {"no_change_resync_s": " (goal <= 1.1x)", "no_change_new_process_s": " (goal <= 1.5x)"}.get(key, "")
        print(f"  {what}: {figures[key]} s = {figures[key] / plain:.2f}x{goal}")
    if figures.get("breakdown"):
        print("where a no-change re-sync's time goes (medians; each phase as sync_project runs it):")
        for k, v in figures["breakdown"].items():
            print(f"  {k:<62} {v * 1000:7.1f} ms")
    print(f"one-line change: bytes sent         {figures['one_line_change_bytes_sent']} "
          f"= {figures['one_line_change_percent_of_tree']} % of the tree (goal < 1 %), "
          f"{figures['one_line_change_resync_s']} s")
    if "fetch_bytes" in figures:
        print(f"fetch {figures['fetch_bytes'] / 1e9:.2f} GB checkpoint: gpuops {figures['fetch_gpuops_s']} s "
              f"({figures['fetch_gpuops_MBps']} MB/s, verified), plain rsync -a {figures['fetch_plain_rsync_s']} s "
              f"({figures['fetch_plain_MBps']} MB/s) over the ssh a user writes: ratio "
              f"{figures['fetch_throughput_ratio']} (goal >= 0.9)")
        print(f"  same, plain rsync given gpuops' own ssh options (AES-GCM first): "
              f"{figures['fetch_plain_rsync_gpuops_ssh_s']} s: ratio {figures['fetch_ratio_same_ssh_options']} (the "
              f"cost of SHA-256 on both ends, which here share 2 cores)")
        print(f"fetch {figures['slow_link_fetch_bytes'] / 1e6:.0f} MB through a link slower than the CPU (proxy, +1 ms "
              f"per 16 KB): gpuops {figures['slow_link_gpuops_s']} s, plain rsync -a {figures['slow_link_plain_rsync_s']} "
              f"s: ratio {figures['slow_link_throughput_ratio']}")
        print(f"resume: {figures['resume_file_bytes'] / 1e6:.0f} MB file, connection cut every "
              f"{figures['resume_file_bytes'] / 2e6:.0f} MB: {figures['resume_attempts']} attempts, "
              f"{figures['resume_bytes_down_total']} bytes down, re-sent {figures['resume_bytes_resent']} bytes "
              f"({figures['resume_resent_percent']} % of the file)")
    print(json.dumps(figures))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project-mb", type=int, default=200)
    ap.add_argument("--fetch-mb", type=int, default=1024)
    ap.add_argument("--resume-mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7, help="rounds of the no-change re-sync (medians)")
    ap.add_argument("--sync-only", action="store_true", help="only the sync figures (no fetch, slow link, resume)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    for k, sub in (("GPUOPS_STATE_DIR", "state"), ("GPUOPS_CONFIG_DIR", "config"), ("HOME", "home")):
        (tmp / sub).mkdir()
        os.environ[k] = str(tmp / sub)
    os.environ["NO_COLOR"] = "1"
    os.environ.pop("GPUOPS_PROFILE", None)
    sys.path.insert(0, str(ROOT / "tests"))
    from gpuops.sandbox import host

    st = host.up()
    remote_home = Path(st["dir"]) / "home"
    figures: dict[str, object] = {}
    try:
        # -- sync ------------------------------------------------------------------------
        proj = tmp / "project"
        (proj / "src").mkdir(parents=True)
        n_src = 1000
        for i in range(n_src):  # 1000 source files of ~10 KB
            (proj / "src" / f"mod_{i:04d}.py").write_text("".join(f"x_{i}_{j} = {j * 7}  # line {j}\n" for j in range(400)))
        src_bytes = sum(p.stat().st_size for p in (proj / "src").iterdir())
        data_left = a.project_mb * 1_000_000 - src_bytes
        k = 0
        while data_left > 0:
            n = min(10_000_000, data_left)
            write_random(proj / "data" / f"shard_{k:03d}.bin", n)
            data_left -= n
            k += 1
        tree_bytes = sum(p.stat().st_size for p in proj.rglob("*") if p.is_file())
        os.chdir(proj)
        t_first, (code, first, err) = timed(lambda: cli("sync", "-p", "sandbox", "--json"))
        assert code == 0, err
        figures.update(no_change(proj, a.rounds), rounds=a.rounds)
        figures["breakdown"] = breakdown(proj, a.rounds)
        target = proj / "src" / "mod_0500.py"
        lines = target.read_text().splitlines(keepends=True)
        lines[200] = "x_500_200 = 'changed'\n"
        target.write_text("".join(lines))
        t_change, (code, change, err) = timed(lambda: cli("sync", "-p", "sandbox", "--json"))
        assert code == 0 and change["files"] == 1, err

        from gpuops.profiles import model as profiles
        from gpuops.remote.connection import ssh_command

        prof = profiles.resolve("sandbox")
        ssh = runbook_ssh(prof)
        tuned_ssh = shlex.join(ssh_command(prof))
        figures["project_bytes"] = tree_bytes
        figures["first_sync_s"] = round(t_first, 2)
        figures["one_line_change_bytes_sent"] = change["bytes_sent"]
        figures["one_line_change_percent_of_tree"] = round(100 * change["bytes_sent"] / tree_bytes, 4)
        figures["one_line_change_resync_s"] = round(t_change, 3)
        if a.sync_only:
            return report(figures)

        # -- fetch throughput ------------------------------------------------------------------
        ck = remote_home / proj.name / "checkpoints" / "global_step_100"
        size = a.fetch_mb * 1_000_000
        per = size // 4
        for i in range(4):
            write_random(ck / f"model-{i:05d}-of-00004.safetensors", per)
        total = per * 4

        def plain_fetch(dest: Path, via: str = ssh) -> float:
            dt, _ = timed(lambda: subprocess.run(["rsync", "-a", "-e", via, f"127.0.0.1:{proj.name}/checkpoints/",
                                                  str(dest) + "/"], check=True))
            shutil.rmtree(dest)
            return dt

        def gpuops_fetch(dest: Path) -> float:
            dt, (code, doc, err) = timed(lambda: cli("fetch", "-p", "sandbox", "--dest", str(dest), "--json"))
            assert code == 0 and doc["verified"] == 4, err
            shutil.rmtree(dest)
            return dt

        plain_fetch(tmp / "warm")  # page cache
        plain = min(plain_fetch(tmp / f"plain{i}") for i in range(2))
        ours = min(gpuops_fetch(tmp / f"ours{i}") for i in range(2))
        plain_tuned = min(plain_fetch(tmp / f"tuned{i}", tuned_ssh) for i in range(2))
        figures["fetch_bytes"] = total
        figures["fetch_plain_rsync_gpuops_ssh_s"] = round(plain_tuned, 2)
        figures["fetch_ratio_same_ssh_options"] = round(plain_tuned / ours, 3)
        figures["fetch_plain_rsync_s"] = round(plain, 2)
        figures["fetch_gpuops_s"] = round(ours, 2)
        figures["fetch_plain_MBps"] = round(total / plain / 1e6, 1)
        figures["fetch_gpuops_MBps"] = round(total / ours / 1e6, 1)
        figures["fetch_throughput_ratio"] = round(plain / ours, 3)
        shutil.rmtree(ck)

        # -- the same through a link slower than the CPU (a TCP proxy adding 1 ms per 16 KB chunk) --------------
        from support.proxy import Proxy

        from gpuops.remote.connection import connect

        def proxy_profile(port: int) -> str:
            text = (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "sandbox.yaml").read_text()
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("port:")) + f"\nport: {port}\n"
            (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"via{port}.yaml").write_text(text)
            with connect(profiles.resolve(f"via{port}"), announce=lambda s: None):
                pass
            return f"via{port}"

        slow_mb = max(16, a.fetch_mb // 8)
        ck2 = remote_home / proj.name / "checkpoints" / "global_step_200"
        for i in range(2):
            write_random(ck2 / f"part-{i}.bin", slow_mb * 500_000)
        slow = Proxy(st["port"], delay=0.001)
        try:
            name = proxy_profile(slow.port)
            sprof = profiles.resolve(name)
            sssh = runbook_ssh(sprof)
            splain, _ = timed(lambda: subprocess.run(["rsync", "-a", "-e", sssh, f"127.0.0.1:{proj.name}/checkpoints/",
                                                      str(tmp / "splain") + "/"], check=True))
            sours, (code, doc, err) = timed(lambda: cli("fetch", "-p", name, "--dest", str(tmp / "sours"), "--json"))
            assert code == 0, err
        finally:
            slow.close()
        figures["slow_link_fetch_bytes"] = slow_mb * 1_000_000
        figures["slow_link_plain_rsync_s"] = round(splain, 2)
        figures["slow_link_gpuops_s"] = round(sours, 2)
        figures["slow_link_throughput_ratio"] = round(splain / sours, 3)
        shutil.rmtree(ck2)

        # -- resume ------------------------------------------------------------------------
        rsize = a.resume_mb * 1_000_000
        write_random(remote_home / proj.name / "checkpoints" / "global_step_7" / "model.pt", rsize)
        proxy = Proxy(st["port"], cut_after=rsize // 2)
        try:
            text = (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "sandbox.yaml").read_text()
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("port:")) + f"\nport: {proxy.port}\n"
            (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "cut.yaml").write_text(text)
            with connect(profiles.resolve("cut"), announce=lambda s: None):
                pass
            base = proxy.bytes_down
            code, doc, err = cli("fetch", "-p", "cut", "--dest", str(tmp / "resumed"), "--json")
            assert code == 0, err
            down = proxy.bytes_down - base
        finally:
            proxy.close()
        figures["resume_file_bytes"] = rsize
        figures["resume_attempts"] = doc["attempts"]
        figures["resume_bytes_down_total"] = down
        figures["resume_bytes_resent"] = max(0, down - rsize)
        figures["resume_resent_percent"] = round(100 * max(0, down - rsize) / rsize, 2)
    finally:
        host.down()
        os.chdir(ROOT)
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    return report(figures)


if __name__ == "__main__":
    raise SystemExit(main())
