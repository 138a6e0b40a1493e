"""`gpuops train | watch | logs | status | stop`: the run lifecycle. Parse, call lifecycle.py, render, exit.

Typer only at module level (`gpuops --help` stays fast)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import JsonOpt, ProfileOpt, app, output, pick_profile

RunArg = typer.Argument(None, help="Run id or a unique prefix (default: the profile's latest run).", show_default=False)


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
    from .. import lifecycle

    out = output(json_)
    prof = pick_profile(None, profile)
    res = lifecycle.train(prof, out, Path.cwd(), script=script, name=name, env=env, args=args or [], sync=not no_sync,
                          force=force, seed=seed, snapshot=not no_snapshot)
    if json_:
        out.emit_json(res)
    else:
        out.success(f"launched {res['run_id']} on {prof.name} (pid {res['pid']}), detached")
        out.print(res["run_id"])
        out.info("next: " + "   ".join(res["next"]))
    raise typer.Exit(0)


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
    from .. import lifecycle
    from .. import watch as w

    out = output(json_)
    prof = pick_profile(None, profile)
    project = Path.cwd()
    meta = lifecycle.resolve(run, prof, project)
    dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour, log_lines=max(lines, 1))
    if once:
        res = lifecycle.watch_once(prof, out, project, meta, dash, lines)
        for ev in res["events"]:
            _emit(out, ev, dash, json_)
        if out.rich:
            out.render(w.render(dash))
        if res["error"]:
            raise res["error"]
        raise typer.Exit(res["code"])
    live = _Live(out, dash) if out.rich else None
    try:
        res = lifecycle.follow(prof, out, project, meta, dash, lines=lines, samples=True, interval=interval,
                               on_event=live.update if live else lambda ev: _emit(out, ev, dash, json_))
    finally:
        if live:
            live.close()
    _ended(out, meta, dash, res)


class _Live:
    """The rich dashboard, drawn from the first event on and redrawn on every event."""

    def __init__(self, out, dash):
        self.out, self.dash, self.live = out, dash, None

    def update(self, ev: dict) -> None:
        from .. import watch as w

        if self.live is None:
            from rich.live import Live

            self.live = Live(w.render(self.dash), console=self.out.console, refresh_per_second=4, transient=False)
            self.live.start()
        self.live.update(w.render(self.dash))

    def close(self) -> None:
        if self.live is not None:
            self.update({})
            self.live.stop()


def _ended(out, meta: dict, dash, res: dict) -> None:
    """watch's and logs -f's last word (stderr: logs -f keeps stdout for the log) and exit code."""
    if res["interrupted"]:
        rid = meta["run_id"]
        out.info(f"stopped watching; run {rid} keeps running (gpuops watch {rid})")
    elif res["info"] is not None:
        out.info(dash.state_text())
    raise typer.Exit(res["code"])


def _emit(out, ev: dict, dash, json_: bool) -> None:
    """Plain timestamped lines, or one JSON object per line."""
    import time

    from .. import watch as w

    if json_:
        doc = w.event_doc(ev, time.time())
        if doc is not None:
            out.emit_json_line(doc)
    elif not out.rich:
        line = w.event_text(ev, dash, time.strftime("%H:%M:%S"))
        if line is not None:
            out.print(line)


# -- logs ----------------------------------------------------------------------------------------------
@app.command()
def logs(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow until the run ends; exit 0 if the job succeeded, 1 if not."),
    lines: int = typer.Option(50, "--lines", "-n", help="Lines from the end of the log.", min=0),
) -> None:
    """Print the last N lines of a run's log, or follow it (-f) to the end of the run."""
    from .. import lifecycle
    from .. import watch as w

    out = output(False)
    prof = pick_profile(None, profile)
    project = Path.cwd()
    meta = lifecycle.resolve(run, prof, project)
    if not follow:
        text = lifecycle.tail(prof, out, project, meta, lines)
        if lines:
            out.stdout.write(text)
            out.stdout.flush()
        raise typer.Exit(0)

    def show(ev: dict) -> None:  # the log as it is on stdout; connection news on stderr
        if ev["type"] == "log":
            out.stdout.write(ev["line"] + "\n")
            out.stdout.flush()
        elif ev["type"] == "reconnecting":
            out.info(f"connection lost ({ev['error']}); reconnecting in {ev['delay']:g}s")
        elif ev["type"] == "connected":
            out.info("reconnected; resuming the log")

    dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour)
    res = lifecycle.follow(prof, out, project, meta, dash, lines=lines, samples=False, interval=2.0, on_event=show)
    _ended(out, meta, dash, res)


# -- status --------------------------------------------------------------------------------------------
@app.command()
def status(
    profile: Optional[str] = ProfileOpt,
    json_: bool = JsonOpt,
) -> None:
    """The profile's runs (id, script, state, started, elapsed, exit code) and the current GPU utilisation."""
    from datetime import datetime

    from .. import lifecycle
    from .. import watch as w
    from ..runs import fmt_duration

    out = output(json_)
    prof = pick_profile(None, profile)
    doc = lifecycle.status(prof, out, Path.cwd())
    rows, gpus, gpu_error = doc["runs"], doc["gpus"], doc["gpu_error"]
    if json_:
        out.emit_json(doc)
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
                      when(r["started"]), fmt_duration(r["elapsed"]),
                      "-" if r["exit_code"] is None else str(r["exit_code"]))
        out.render(t)
    else:
        out.print(f"{'RUN':<36} {'SCRIPT':<20} {'STATE':<10} {'STARTED':<19} {'ELAPSED':>9} EXIT")
        for r in rows:
            out.print(f"{r['run_id']:<36} {str(r['script'] or '-')[:20]:<20} {r['state']:<10} {when(r['started']):<19} "
                      f"{fmt_duration(r['elapsed']):>9} {'-' if r['exit_code'] is None else r['exit_code']}")
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
    from .. import lifecycle

    out = output(json_)
    prof = pick_profile(None, profile)
    meta = lifecycle.resolve(run, prof, Path.cwd())
    doc = lifecycle.stop(prof, out, Path.cwd(), meta, grace)
    rid, how = doc["run_id"], doc["result"]
    if json_:
        out.emit_json(doc)
    elif how in ("nopid", "notrunning"):
        out.info(f"{rid} is not running ({doc['state']}" + (f", exit {doc['exit_code']})"
                                                             if doc["exit_code"] is not None else ")"))
    else:
        out.success(f"stopped {rid} with SIG{how} (exit code {doc['exit_code']}); recorded in "
                    f"{meta['remote_run_dir']}/stop.json")
    raise typer.Exit(0)
