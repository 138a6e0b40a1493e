"""`gpuops train | watch | logs | status | stop`: the run lifecycle. Typer only at module level."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import JsonOpt, ProfileOpt, app, output, pick_profile

RunArg = typer.Argument(None, help="Run id or a unique prefix (default: the profile's latest run).", show_default=False)


def _connect(prof, out):
    from ..remote.connection import connect

    return connect(prof, announce=out.info)


def _resolve(run: Optional[str], prof) -> dict:
    """The run's local record, or, for an id not recorded here, where it would be on the host."""
    from .. import runs as core
    from ..errors import UsageError
    from ..remote.launch import run_dir_of

    try:
        return core.resolve_run(run, prof.name, Path.cwd())
    except UsageError:
        if not run or any(m["run_id"] == run for m in core.local_runs(None, Path.cwd())):
            raise
        return {"run_id": run, "profile": prof.name, "remote_run_dir": run_dir_of(prof.remote_dir_for(Path.cwd()), run),
                "price_per_hour": prof.price_per_hour}


# -- train ---------------------------------------------------------------------------------------------
@app.command()
def train(
    script: str = typer.Option(..., "--script", "-s", help="Training script, relative to the project folder "
                                                           "(.py runs with the profile's python, .sh with sh)."),
    profile: Optional[str] = ProfileOpt,
    name: Optional[str] = typer.Option(None, "--name", help="Run name (default: the script's stem)."),
    env: List[str] = typer.Option([], "--env", "-e", help="NAME=VALUE for the job (repeatable; wins over the "
                                                          "preset and the profile). NAME= unsets NAME."),
    no_sync: bool = typer.Option(False, "--no-sync", help="Do not sync the project first."),
    force: bool = typer.Option(False, "--force", help="Launch even if preflight finds another gpuops run, no "
                                                      "GPU or too little disk."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Export GPUOPS_SEED and PYTHONHASHSEED; recorded."),
    no_snapshot: bool = typer.Option(False, "--no-snapshot", help="Skip the environment snapshot taken at launch."),
    json_: bool = JsonOpt,
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script, after --.", show_default=False),
) -> None:
    """Launch a training script detached on the profile's host: sync, preflight, environment, secrets, run."""
    from datetime import datetime

    from .. import profiles
    from .. import runs as core
    from ..errors import ChecksFailed, UsageError
    from ..remote import launch as rl

    out = output(json_)
    prof = pick_profile(None, profile)
    project = Path.cwd()
    script_rel = _script_path(script, project, must_exist=not no_sync)
    cli_env = core.parse_env_args(env)
    presets_doc = core.load_presets(project)
    started = datetime.now()
    taken = [m["run_id"] for m in core.local_runs(None, project)]
    rid = core.run_id(name, script_rel, clock=lambda: started, taken=taken)
    dotenv = profiles.read_dotenv(project / ".env")
    import os

    plan = core.plan_env(preset=prof.env_preset, presets_doc=presets_doc, profile_env=prof.env, cli_env=cli_env,
                         secret_names=prof.secrets, local_env=profiles.environment(project), run_id=rid,
                         profile_name=prof.name, seed=seed,
                         dotenv_names=[k for k in dotenv if k not in os.environ])
    for w in plan.warnings:
        out.warn(w)
    remote_dir = prof.remote_dir_for(project)

    remote = _connect(prof, out)
    try:
        if not no_sync:
            sync = _sync_function()
            out.step(f"syncing {project.name}/ to {prof.name}:{remote_dir}")
            import inspect

            # the local run registry and the remote run folders are not project files
            kw = {"excludes": ("/runs/", "/.gpuops/")} if "excludes" in inspect.signature(sync).parameters else {}
            sync(prof, remote, out, project, **kw)
        out.step("preflight: GPUs, free disk, other runs")
        pf, found = rl.preflight(remote, remote_dir, script_rel, prof.python, core.conflict_packages(presets_doc))
        problems = []
        if pf.gpu_error:
            problems.append(f"no GPU visible: {pf.gpu_error}")
        floor = prof.expect.min_disk_gb
        if pf.free_gb is not None and floor is not None and pf.free_gb < floor:
            problems.append(f"only {pf.free_gb:.1f} GB free in {remote_dir} (the profile expects {floor:g} GB)")
        elif pf.free_gb is not None and pf.free_gb < 1:
            out.warn(f"only {pf.free_gb:.2f} GB free on the host; checkpoints may not fit")
        if pf.active:
            problems.append(f"another gpuops run is still running on the host: {', '.join(pf.active)}")
        if not found:
            raise UsageError(f"script not found on the host: {remote_dir}/{script_rel}",
                             hint="sync first (drop --no-sync) or check the path" if no_sync else
                             "check the path; is it excluded from sync?")
        if problems:
            if not force:
                raise ChecksFailed("; ".join(problems) + "; not launching",
                                   hint=("stop it first (gpuops stop " + pf.active[0] + ") or " if pf.active else "")
                                   + "add --force to launch anyway")
            for p in problems:
                out.warn(p + " (--force: launching anyway)")
        for w in core.conflict_warnings(plan.exported, presets_doc, pf.packages):
            out.warn(w)
        out.info(f"environment for {rid}:")
        for line in plan.lines():
            out.info("  " + line)

        argv = core.job_argv(script_rel, args or [], prof.python)
        run_dir = rl.run_dir_of(remote_dir, rid)
        meta = core.build_meta(run_id=rid, script=script_rel, args=list(args or []), argv=argv, profile=prof,
                               plan=plan, remote_dir=remote_dir, remote_run_dir=run_dir,
                               git=core.git_info(project), seed=seed, started=started, name=name)
        launcher = rl.launcher_script(run_id=rid, remote_dir=remote_dir, argv=argv, python=prof.python,
                                      env=plan.exported, unset=plan.unset)
        pid, abs_dir = rl.launch(remote, run_id=rid, remote_dir=remote_dir, meta=meta, launcher=launcher,
                                 secrets=plan.secrets, python=prof.python)
        meta["remote_run_path"] = abs_dir
        meta["pid"] = pid
        core.save_local(meta, project)
        if not no_snapshot:
            _snapshot(remote, prof, rid, run_dir, project, out, seed)
    finally:
        remote.close()
    profiles.remember(prof, project)
    nxt = [f"gpuops watch {rid}", f"gpuops logs -f {rid}", f"gpuops stop {rid}"]
    if json_:
        out.emit_json({"run_id": rid, "profile": prof.name, "pid": pid, "remote_run_dir": abs_dir,
                       "local_record": str(core.registry_dir(project) / rid / "meta.json"), "next": nxt})
    else:
        out.success(f"launched {rid} on {prof.name} (pid {pid}), detached")
        out.print(rid)
        out.info("next: " + "   ".join(nxt))
    raise typer.Exit(0)


def _script_path(script: str, project: Path, *, must_exist: bool) -> str:
    from ..errors import UsageError

    p = Path(script)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(project.resolve())
        except ValueError:
            raise UsageError(f"--script {script}: not inside the project folder {project}",
                             hint="the script must be synced with the project; give a path relative to it") from None
    if must_exist and not (project / p).is_file():
        raise UsageError(f"--script {script}: no such file in {project}")
    text = p.as_posix()
    if text.startswith("../"):
        raise UsageError(f"--script {script}: not inside the project folder")
    return text


def _sync_function():
    from ..errors import UsageError

    for mod in ("transfer", "transfer_ops"):
        try:
            m = __import__(f"gpuops.{mod}", fromlist=["sync_project"])
        except ImportError:
            continue
        if hasattr(m, "sync_project"):
            return m.sync_project
    raise UsageError("sync is not available in this build", hint="run with --no-sync after syncing yourself")


def _snapshot(remote, prof, rid: str, run_dir: str, project: Path, out, seed: Optional[int] = None) -> None:
    """The environment snapshot of issue 5, kept with the run; its failure is a warning, never a failed launch."""
    try:
        from .. import snapshot
    except ImportError:
        return
    if not hasattr(snapshot, "snapshot_for_run"):
        return
    import inspect

    fn = snapshot.snapshot_for_run
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    extra = {k: v for k, v in (("seed", seed), ("project_dir", project)) if k in params}
    try:
        fn(remote, prof, run_id=rid, remote_run_dir=run_dir, local_dir=Path("runs") / rid / "environment", out=out,
           **extra)
    except Exception as exc:  # noqa: BLE001 - the job is running; say what failed and carry on
        msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        out.warn(f"environment snapshot failed (the run is launched): {msg}")


# -- watch ---------------------------------------------------------------------------------------------
@app.command()
def watch(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    json_: bool = typer.Option(False, "--json", help="One JSON object per line: samples, log lines, state changes."),
    once: bool = typer.Option(False, "--once", help="One snapshot, then exit."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between GPU samples.", min=0.1),
    lines: int = typer.Option(15, "--lines", "-n", help="Log lines shown (and replayed at start).", min=0),
) -> None:
    """Live dashboard of a run: GPUs, processes, state, cost, log tail. Exit 0 if it succeeded, 1 if not."""
    from .. import runs as core
    from .. import watch as w

    out = output(json_)
    prof = pick_profile(None, profile)
    meta = _resolve(run, prof)
    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour, log_lines=max(lines, 1))
    remote = _connect(prof, out)
    try:
        if once:
            res = remote.run("sh -s", stdin=w.once_command(rid, run_dir, lines), timeout=60)
            head, _, log = res.stdout.partition("@log\n")
            for line in head.splitlines():
                ev = w.parse_stderr_line(line)
                if ev:
                    dash.apply(ev)
                    _emit(out, ev, dash, json_)
            for line in log.splitlines():
                ev = {"type": "log", "line": line, "offset": None}
                dash.apply(ev)
                _emit(out, ev, dash, json_)
            if out.rich:
                out.render(w.render(dash))
            if not dash.info or not dash.info.exists:
                from ..errors import RemoteError
                raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
            profiles_remember(prof)
            raise typer.Exit(0 if dash.state in ("running", "succeeded") else 1)
        info, start = _start(remote, rid, run_dir, lines)
        fs = w.FollowState(offset=start, info=info)
        code = _follow_loop(out, prof, remote, rid, run_dir, fs, dash, json_=json_, samples=True, interval=interval)
    finally:
        remote.close()
    raise typer.Exit(code)


def profiles_remember(prof) -> None:
    from .. import profiles

    profiles.remember(prof, Path.cwd())


def _start(remote, rid: str, run_dir: str, lines: int):
    from .. import watch as w
    from ..errors import RemoteError
    from ..runs import parse_state_line

    res = remote.run("sh -s", stdin=w.start_offset_command(rid, run_dir, lines), timeout=60)
    info, start = None, 0
    for line in res.stdout.splitlines():
        if line.startswith("RUN "):
            info = parse_state_line(line)
        elif line.startswith("START "):
            start = max(0, int(line.split()[1]))
    if info is None or not info.exists:
        raise RemoteError(f"run {rid} not found on the host ({run_dir})")
    return info, start


def _follow_loop(out, prof, remote, rid, run_dir, fs, dash, *, json_: bool, samples: bool, interval: float,
                 raw_log: bool = False) -> int:
    """Drive watch / logs -f until the run ends; Ctrl-C leaves the job running (130)."""
    from .. import runs as core
    from .. import watch as w

    first = [remote]

    def connect():
        if first:
            return first.pop()
        return _connect(prof, out)

    live = None
    if out.rich and not raw_log:
        from rich.live import Live

        live = Live(w.render(dash), console=out.console, refresh_per_second=4, transient=False)
        live.start()
    try:
        for ev in w.follow(connect, rid, run_dir, fs, interval=interval, samples=samples):
            dash.apply(ev)
            if raw_log:
                if ev["type"] == "log":
                    out.stdout.write(ev["line"] + "\n")
                    out.stdout.flush()
                elif ev["type"] == "reconnecting":
                    out.info(f"connection lost ({ev['error']}); reconnecting in {ev['delay']:g}s")
                elif ev["type"] == "connected":
                    out.info("reconnected; resuming the log")
            elif live is not None:
                live.update(w.render(dash))
            else:
                _emit(out, ev, dash, json_)
    except KeyboardInterrupt:
        if live is not None:
            live.stop()
            live = None
        out.info(f"stopped watching; run {rid} keeps running (gpuops watch {rid})")
        return 130
    finally:
        if live is not None:
            live.update(w.render(dash))
            live.stop()
    info = fs.info
    if info is not None:
        core.save_local_state(rid, info, Path.cwd())
    profiles_remember(prof)
    if info is None:
        return 1
    out.info(dash.state_text())  # stderr: with raw_log the log on stdout stays untouched
    return core.exit_for_state(info)


def _emit(out, ev: dict, dash, json_: bool) -> None:
    """Plain timestamped lines, or one JSON object per line."""
    import time

    from .. import watch as w

    t = ev["type"]
    if t in ("end", "heartbeat"):
        return
    if json_:
        doc = {"type": t, "ts": round(time.time(), 3)}
        if t == "sample":
            doc.update(ev["gpu"])
        elif t == "state":
            doc.update(ev["info"].to_json())
        elif t == "log":
            doc.update(line=ev["line"], offset=ev.get("offset"), kind=w.classify(ev["line"]))
        else:
            doc.update({k: v for k, v in ev.items() if k != "type"})
        out.emit_json_line(doc)
        return
    if out.rich:
        return
    stamp = time.strftime("%H:%M:%S")
    if t == "sample":
        out.print(f"{stamp} {w.gpu_text(ev['gpu'])}")
    elif t == "gpu_error":
        out.print(f"{stamp} nvidia-smi: {ev['message']}")
    elif t == "processes":
        procs = ", ".join(f"{p['pid']} {p['name']}" for p in ev["processes"]) or "none"
        out.print(f"{stamp} gpu processes: {procs}")
    elif t == "state":
        out.print(f"{stamp} state {dash.state_text()}")
    elif t == "log":
        mark = {"error": "!", "warning": "~"}.get(w.classify(ev["line"]) or "", "|")
        out.print(f"{stamp} log {mark} {ev['line']}")
    elif t == "reconnecting":
        out.print(f"{stamp} reconnecting (attempt {ev['attempt']}, in {ev['delay']:g}s): {ev['error']}")
    elif t == "connected":
        out.print(f"{stamp} reconnected; resuming the log")


# -- logs ----------------------------------------------------------------------------------------------
@app.command()
def logs(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow until the run ends; exit 0 if the job succeeded, 1 if not."),
    lines: int = typer.Option(50, "--lines", "-n", help="Lines from the end of the log.", min=0),
) -> None:
    """Print the last N lines of a run's log, or follow it (-f) to the end of the run."""
    from .. import watch as w
    from ..errors import RemoteError
    from ..remote import launch as rl

    out = output(False)
    prof = pick_profile(None, profile)
    meta = _resolve(run, prof)
    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = _connect(prof, out)
    try:
        if not follow:
            info, text = rl.tail(remote, rid, run_dir, lines)
            if not info.exists:
                raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
            if lines:
                out.stdout.write(text)
                out.stdout.flush()
            profiles_remember(prof)
            raise typer.Exit(0)
        info, start = _start(remote, rid, run_dir, lines)
        fs = w.FollowState(offset=start, info=info)
        dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour)
        code = _follow_loop(out, prof, remote, rid, run_dir, fs, dash, json_=False, samples=False, interval=2.0,
                            raw_log=True)
    finally:
        remote.close()
    raise typer.Exit(code)


# -- status --------------------------------------------------------------------------------------------
@app.command()
def status(
    profile: Optional[str] = ProfileOpt,
    json_: bool = JsonOpt,
) -> None:
    """The profile's runs (id, script, state, started, elapsed, exit code) and the current GPU utilisation."""
    import time
    from datetime import datetime

    from .. import runs as core
    from .. import watch as w
    from ..remote import launch as rl

    out = output(json_)
    prof = pick_profile(None, profile)
    project = Path.cwd()
    metas = {m["run_id"]: m for m in core.local_runs(prof.name, project)}
    remote = _connect(prof, out)
    try:
        got = rl.query_states(remote, [(rid, m["remote_run_dir"]) for rid, m in metas.items()], gpu=True,
                              list_dir=prof.remote_dir_for(project))
    finally:
        remote.close()
    for rid, m in got["metas"].items():
        metas.setdefault(rid, m)
    now = time.time()
    rows = []
    for rid, m in metas.items():
        info = got["infos"].get(rid) or core.RunInfo(run_id=rid, exists=False)
        if info.state in core.ENDED and info.exists:
            core.save_local_state(rid, info, project)
        started = info.started or m.get("started_ts")
        rows.append({"run_id": rid, "script": m.get("script"), "state": info.state, "exit_code": info.exit_code,
                     "started": started, "elapsed": info.elapsed(now) if info.started else None,
                     "pid": info.pid, "stopped": info.stopped})
    rows.sort(key=lambda r: (r["started"] or 0, r["run_id"]), reverse=True)
    gpus = [g for g in (w.parse_gpu(x) for x in got["gpu_lines"]) if g]
    gpu_error = None if gpus else " ".join(got["gpu_lines"]).strip() or None
    profiles_remember(prof)
    if json_:
        out.emit_json({"profile": prof.name, "runs": rows, "gpus": gpus, "gpu_error": gpu_error})
        raise typer.Exit(0)

    def when(ts):
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"

    if gpus:
        out.print("GPU: " + "; ".join(w.gpu_text(g) for g in gpus))
    elif gpu_error:
        out.print(f"GPU: nvidia-smi failed: {gpu_error}")
    if not rows:
        out.print(f"no runs of profile '{prof.name}' (gpuops train --script train.py)")
        raise typer.Exit(0)
    if out.rich:
        from rich.table import Table

        t = Table(title=f"runs on {prof.name}")
        for col in ("run", "script", "state", "started", "elapsed", "exit"):
            t.add_column(col)
        colour = {"running": "cyan", "succeeded": "green", "failed": "red", "stopped": "yellow", "lost": "red"}
        for r in rows:
            t.add_row(r["run_id"], str(r["script"] or "-"), f"[{colour.get(r['state'], 'white')}]{r['state']}[/]",
                      when(r["started"]), core.fmt_duration(r["elapsed"]),
                      "-" if r["exit_code"] is None else str(r["exit_code"]))
        out.render(t)
    else:
        out.print(f"{'RUN':<36} {'SCRIPT':<20} {'STATE':<10} {'STARTED':<19} {'ELAPSED':>9} EXIT")
        for r in rows:
            out.print(f"{r['run_id']:<36} {str(r['script'] or '-')[:20]:<20} {r['state']:<10} {when(r['started']):<19} "
                      f"{core.fmt_duration(r['elapsed']):>9} {'-' if r['exit_code'] is None else r['exit_code']}")
    raise typer.Exit(0)


# -- stop ----------------------------------------------------------------------------------------------
@app.command()
def stop(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    grace: float = typer.Option(10.0, "--grace", help="Seconds after SIGINT before SIGTERM, and after SIGTERM "
                                                      "before SIGKILL.", min=0.1),
    json_: bool = JsonOpt,
) -> None:
    """Stop a run: SIGINT to its process group, then SIGTERM, then SIGKILL; records how it ended."""
    from .. import runs as core
    from ..remote import launch as rl

    out = output(json_)
    prof = pick_profile(None, profile)
    meta = _resolve(run, prof)
    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = _connect(prof, out)
    try:
        if not json_:
            out.step(f"stopping {rid}: SIGINT, then SIGTERM and SIGKILL after {grace:g}s each")
        how, info = rl.stop(remote, rid, run_dir, grace)
    finally:
        remote.close()
    if info.exists:
        core.save_local_state(rid, info, Path.cwd())
    profiles_remember(prof)
    doc = {"run_id": rid, "result": how, "state": info.state, "exit_code": info.exit_code}
    if json_:
        out.emit_json(doc)
    elif how in ("nopid", "notrunning"):
        out.info(f"{rid} is not running ({info.state}" + (f", exit {info.exit_code})" if info.exit_code is not None
                                                            else ")"))
    else:
        out.success(f"stopped {rid} with SIG{how} (exit code {info.exit_code}); recorded in {run_dir}/stop.json")
    raise typer.Exit(0)
