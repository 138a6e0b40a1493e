"""`gpuops train | watch | logs | status | stop`: the run lifecycle. Parse, call jobs/actions.py, render, exit.

Typer only at module level (`gpuops --help` stays fast)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .completion import run_ids
from .app import HostOpt, JsonOpt, ProfileOpt, app, output, pick_profile, with_warnings

RunArg = typer.Argument(None, help="Run id or a unique prefix (default: the profile's latest run).", show_default=False,
                        autocompletion=run_ids)


# -- train ---------------------------------------------------------------------------------------------
@app.command()
def train(
    script: str = typer.Option(..., "--script", "-s", help="Training script, relative to the project folder "
                                                           "(.py runs with the profile's python, .sh with bash). A "
                                                           ".sh with Windows line endings or a .py with relative "
                                                           "imports is refused before anything is synced."),
    profile: Optional[str] = ProfileOpt,
    name: Optional[str] = typer.Option(None, "--name", help="Run name (default: the script's stem)."),
    env: List[str] = typer.Option([], "--env", "-e", help="NAME=VALUE for the job (repeatable; wins over the "
                                                          "preset and the profile). NAME= unsets NAME. A NAME holding "
                                                          "TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL is a secret: "
                                                          "never printed nor recorded. Put secrets in .env instead: "
                                                          "a value here is seen by ps and kept in your shell's "
                                                          "history."),
    no_sync: bool = typer.Option(False, "--no-sync", help="Do not sync the project first."),
    force: bool = typer.Option(False, "--force", help="Launch even if preflight finds another gpuops run, no "
                                                      "GPU, too little disk, a broken stack (CPU-only torch, CUDA "
                                                      "unavailable, GPUs missing, flash-attn not importing), a "
                                                      "script that does not compile or imports a module the job's "
                                                      "python cannot import, or a GPU the job will see held by "
                                                      "another process; recorded in meta.json. A Slurm "
                                                      "profile: past the local plan's refusals that a resolution or "
                                                      "a pin decides."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Export GPUOPS_SEED and PYTHONHASHSEED; recorded."),
    no_snapshot: bool = typer.Option(False, "--no-snapshot", help="Skip the environment snapshot taken at launch."),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="none|torchrun|ray", show_default=False,
                                           help="torchrun: torch.distributed.run on every host (--nnodes, "
                                                "--node_rank, --master_addr/port); ray: a Ray head on host 0, "
                                                "workers on the others, the script on the head with RAY_ADDRESS once "
                                                "every host has joined (at most GPUOPS_RAY_JOIN_TIMEOUT s, default "
                                                "180). none (the default): the script itself on every host. A Slurm "
                                                "profile: torchrun (c10d on the allocation's first node) or none, "
                                                "the profile's slurm.launcher by default."),
    nproc: str = typer.Option("auto", "--nproc-per-node", metavar="auto|N",
                              help="torchrun processes per host (auto: the GPUs the job is given, "
                                   "all or those its CUDA_VISIBLE_DEVICES names)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", min=1, max=65535,
                                              help="Rendezvous port on host 0 (default 29500).", show_default=False),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", min=1, show_default=False,
                                        help="A Slurm profile: nodes for the job (default: the profile's "
                                             "slurm.nodes)."),
    exclude: List[str] = typer.Option([], "--exclude", help="A Slurm profile: a node to keep the job off "
                                                            "(repeatable; beside the profile's slurm.exclude)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="A Slurm profile: print the batch script; nothing is "
                                                          "synced, written or submitted."),
    recover: Optional[int] = typer.Option(None, "--recover", min=0, metavar="N", show_default=False,
                                          help="A Slurm profile: Slurm requeues the job (a node failed, it was "
                                               "preempted) at most N times; every requeued attempt resumes from the "
                                               "newest complete checkpoint of this run (GPUOPS_RESUME_FROM)."),
    checkpoints: Optional[str] = typer.Option(None, "--checkpoints", metavar="DIR", show_default=False,
                                              help="A Slurm profile: the folder the job writes its checkpoints in, "
                                                   "judged when Slurm requeues it (default: the profile's "
                                                   "slurm.checkpoints, `checkpoints`; the job's "
                                                   "GPUOPS_CHECKPOINT_DIR)."),
    json_: bool = JsonOpt,
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script, after --.", show_default=False),
) -> None:
    """Launch a training script detached on the profile's host (every host of a fleet profile): sync, preflight
    (the launch gate: the stack, the script and what it imports, GPUs held by other processes), environment,
    secrets, run. Every .env variable reaches the job as a secret (LAMBDA_API_KEY and GPUOPS_* excepted); the launch
    lists the names sent. A file the script names that the sync leaves out is said before the sync.
    A Slurm profile (a `slurm:` section, docs/slurm.md): the project synced to the shared folder, a batch script
    written into the run folder and submitted with sbatch; it returns at once with the run id and Slurm's job id."""
    from ..jobs import actions as lifecycle
    from ..jobs import fleetactions
    from ..errors import UsageError
    from ..jobs.launchers import LAUNCHERS

    out = output(json_)
    if launcher is not None and launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if nproc != "auto" and not (nproc.isdigit() and int(nproc) > 0):
        raise UsageError(f"--nproc-per-node {nproc!r}: 'auto' or a whole number above 0")
    prof = pick_profile(None, profile, out=out)
    opts = dict(script=script, name=name, env=env, args=args or [], sync=not no_sync, force=force, seed=seed,
                snapshot=not no_snapshot)
    slurm_only = dict(nodes=nodes, exclude=exclude, dry_run=dry_run, recover=recover, checkpoints=checkpoints)
    if prof.slurm is not None:
        from . import slurmruns

        slurmruns.train(prof, out, json_=json_, launcher=launcher, nproc=nproc, master_port=master_port, **slurm_only,
                        **opts)
    if any(v not in (None, False, []) for v in slurm_only.values()):
        raise UsageError("--nodes, --exclude, --dry-run, --recover and --checkpoints are for a Slurm profile (a "
                         "`slurm:` section)", hint="a fleet's hosts are its profile's `hosts:`; on a rented "
                         "instance `gpuops run --recover N` replaces one that is lost")
    launcher = launcher or "none"
    if prof.is_fleet or launcher != "none":
        res = fleetactions.train_fleet(prof, out, Path.cwd(), launcher=launcher, nproc=nproc, master_port=master_port,
                                    **opts)
    else:
        res = lifecycle.train(prof, out, Path.cwd(), **opts)
    _launched(out, prof, res, json_)


def _launched(out, prof, res: dict, json_: bool) -> None:
    if json_:
        out.emit_json(with_warnings(res, out))  # what was said before the launch (left out by sync, links...)
    elif res.get("nodes"):
        out.success(f"launched {res['run_id']} on {len(res['nodes'])} host(s) of {prof.name} "
                    f"({res['launcher']}), detached")
        for n in res["nodes"]:
            out.info(f"  host #{n['rank']} {n['host']}: pid {n['pid']}")
    else:
        out.success(f"launched {res['run_id']} on {prof.name} (pid {res['pid']}), detached")
    if not json_:
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
    lines: Optional[int] = typer.Option(None, "--lines", "-n", show_default=False,
                                        help="Log lines replayed at start (default: enough to fill the screen at a "
                                             "terminal, else 15; the screen shows as many of the newest as fit, the "
                                             "newest last).", min=0),
    host: Optional[int] = HostOpt,
    notify: bool = typer.Option(False, "--notify", help="When the run ends: a desktop notification (a terminal bell "
                                                        "where there is none) and GPUOPS_NOTIFY_URL or the profile's "
                                                        "notify_url webhook (Slack, Discord)."),
) -> None:
    """Live dashboard of a run: GPUs, processes, state, cost, progress (loss sparkline, steps/min, time left, cost at
    the end), training signals (OOM, NCCL, GPU idle, RL learning nothing; playbooks/signals.yaml), log tail. A job
    that failed or was killed: what it died of, with the evidence and a fix (playbooks/endings.yaml).
    Exit 0 if it succeeded, 1 if not.
    A fleet run: every host's GPUs and host 0's log (--host N for another), until every host's job has ended."""
    from ..jobs import actions as lifecycle
    from ..jobs import watch as w

    out = output(json_)
    fleet_prof = pick_profile(None, profile)
    project = Path.cwd()
    fleet_meta = lifecycle.resolve(run, fleet_prof, project)
    if fleet_prof.slurm is not None:
        from . import slurmruns

        if once:
            slurmruns.watch_once(fleet_prof, out, fleet_meta, lines=15 if lines is None else lines,
                                 write=_raw_stdout(out), json_=json_)
        slurmruns.watch(fleet_prof, out, fleet_meta, lines=15 if lines is None else lines, write=_raw_stdout(out),
                        interval=interval, json_=json_)
    prof, meta = _node(fleet_prof, fleet_meta, host)
    n_nodes = len(fleet_meta.get("nodes") or [])
    price = prof.price_per_hour * max(1, n_nodes) if prof.price_per_hour is not None else None  # every node bills
    dash = w.Dashboard(meta, price_per_hour=price, log_lines=w.DASH_LINES_MAX, host=prof.rank)
    cloud = _cloud_summary(prof, True, [])  # watching a run: the instance is in use
    if cloud and not json_:
        from ..cloud.meter import line

        out.info(line(cloud))
    if lines is None:  # at a terminal the log panel starts full: never blank rows above a log that has more
        lines = max(15, out.console.size.height) if out.rich else 15
    if once:
        res = lifecycle.watch_once(prof, out, project, meta, dash, lines)
        for ev in res["events"]:
            _emit(out, ev, dash, json_)
        if out.rich:
            out.render(w.render(dash))
        if res["error"]:
            raise res["error"]
        _say_ending(out, dash.ending)
        raise typer.Exit(res["code"])
    live = _Live(out, dash) if out.rich else None
    show = live.update if live else lambda ev: _emit(out, ev, dash, json_)
    # a fleet run: every other host's GPUs too (one sample stream each, read by a background thread, shown here
    # between the followed host's own events, which come at least every --interval)
    others = [n for n in fleet_prof.nodes()[:n_nodes] if n.rank != prof.rank] if n_nodes > 1 else []
    sampler = lifecycle.FleetSampler(others, interval)
    from ..cloud.meter import ActivityNoter

    activity = ActivityNoter(prof)  # a managed instance: the idle clock restarts while the job runs

    def handler(ev: dict) -> None:
        if ev.get("type") == "sample":
            activity.seen(dash.state == "running", [ev["gpu"].get("util") or 0])
        for other in sampler.drain():
            dash.apply(other)
            show(other)
        if others and ev.get("type") in ("sample", "gpu_error") and "host" not in ev:
            ev["host"] = prof.rank
        show(ev)
    try:
        with sampler:
            res = lifecycle.follow(prof, out, project, meta, dash, lines=lines, samples=True, interval=interval,
                                   on_event=handler,  # the GPUs' health and the disk, from the same stream (#35)
                                   extras=w.Extras(health=True, disk=meta.get("remote_dir")))
    finally:
        if live:
            live.close()
    res = _fleet_end(out, fleet_prof, project, fleet_meta, prof, dash, res)
    if notify and not res["interrupted"] and res["info"] is not None:
        from ..notify import notify as say

        say(out, name=meta.get("name") or meta["run_id"], outcome=dash.state, seconds=dash.elapsed(),
            cost=dash.cost(), profile=fleet_prof)
    _ended(out, meta, dash, res)


def _raw_stdout(out):
    """A writer of raw bytes to stdout (byte-exact logs); text streams without a buffer get UTF-8 with escapes."""
    buf = getattr(out.stdout, "buffer", None)

    def write(data: bytes) -> None:
        if buf is not None:
            out.stdout.flush()
            buf.write(data)
            buf.flush()
        else:
            out.stdout.write(data.decode("utf-8", "surrogateescape"))
            out.stdout.flush()

    return write


def _node(prof, meta: dict, host: Optional[int]):
    """The profile and run meta of host N of a fleet (rank 0 by default)."""
    from ..jobs.plan import node_meta

    return prof.node(host), node_meta(meta, host)


def _fleet_end(out, fleet_prof, project: Path, fleet_meta: dict, prof, dash, res: dict) -> dict:
    """A fleet run whose followed host's job ended: that host's end said first, then every other host's (each that
    did not succeed with what it died of); the whole run's outcome is then the last word (`_ended`)."""
    if len(fleet_meta.get("nodes") or []) < 2 or res["interrupted"] or res["info"] is None:
        return res
    out.info(f"{dash.state_text()} (host #{prof.rank})")
    _say_ending(out, res.get("ending"))
    return {**_whole_fleet(fleet_prof, out, project, {**fleet_meta, "node_rank": prof.rank}, res), "said": True}


def _whole_fleet(prof, out, project: Path, meta: dict, res: dict) -> dict:
    """After the followed host's job ended: a fleet run ends when every host's job has, with the worst outcome."""
    from ..jobs import fleetactions

    if res["interrupted"] or len(meta.get("nodes") or []) < 2:
        return res
    code, _, _ = fleetactions.wait_fleet(prof, out, project, meta, followed=meta.get("node_rank") or 0,
                                      json_lines=out.json_mode)
    return {**res, "code": max(res["code"], code)}


def _cloud_summary(prof, run_running: bool, utils: list) -> Optional[dict]:
    """A gpuops-managed instance (gpuops up): cost so far and time left; the sample counts as activity for --idle."""
    if prof.cloud is None:
        return None
    from ..cloud import meter

    meter.note_sample(prof, run_running, [u for u in utils if u is not None])
    return meter.summary(prof)


class _Live:
    """The rich dashboard, drawn from the first event on and redrawn on every event."""

    def __init__(self, out, dash):
        self.out, self.dash, self.live = out, dash, None

    def update(self, ev: dict) -> None:
        from ..jobs import watch as w

        if self.live is None:
            from rich.live import Live

            self.live = Live(w.render(self.dash), console=self.out.console, refresh_per_second=4, transient=False)
            self.live.start()
        self.live.update(w.render(self.dash))

    def close(self) -> None:
        if self.live is not None:
            self.update({})
            self.live.stop()


def _ended(out, meta: dict, dash, res: dict, *, what: str = "watching") -> None:
    """watch's and logs -f's last word (stderr: logs -f keeps stdout for the log) and exit code."""
    if res["interrupted"]:
        rid = meta["run_id"]
        again = f" (gpuops watch {rid})" if what == "watching" else ""
        out.info(f"stopped {what}; run {rid} keeps running{again}")
    elif res.get("said"):  # a fleet: each host said; the whole run's outcome is the last word
        out.info(f"run {meta['run_id']}: " + ("every host's job succeeded" if res["code"] == 0 else
                                             "failed (the hosts above say which, and why)"))
    elif res["info"] is not None:
        out.info(dash.state_text())
        _say_ending(out, res.get("ending"))
    raise typer.Exit(res["code"])


def _say_ending(out, ending) -> None:
    """What the job died of (jobs/endings.py): `watch --json` its last object, else lines on stderr."""
    import time

    from ..jobs import watchtext

    if not ending:
        return
    if out.json_mode:
        out.emit_json_line(watchtext.ending_doc(ending, time.time()))
        return
    for line in watchtext.ending_lines(ending):
        out.info(line)


def _emit(out, ev: dict, dash, json_: bool) -> None:
    """Plain timestamped lines, or one JSON object per line."""
    import time

    from ..jobs import watch as w

    if json_:
        doc = w.event_doc(ev, time.time())
        if doc is not None:
            out.emit_json_line(doc)
        for doc in w.signal_docs(ev, time.time()):
            out.emit_json_line(doc)
    elif not out.rich:
        line = w.event_text(ev, dash, time.strftime("%H:%M:%S"))
        if line is not None:
            out.print(line)
        for line in w.signal_lines(ev, time.strftime("%H:%M:%S")):
            out.print(line)


# -- logs ----------------------------------------------------------------------------------------------
@app.command()
def logs(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow until the run ends; exit 0 if the job succeeded, 1 if not."),
    lines: int = typer.Option(50, "--lines", "-n", help="Lines from the end of the log.", min=0),
    host: Optional[int] = HostOpt,
    all_: bool = typer.Option(False, "--all", help="A fleet run: every host's log, each line prefixed with its host."),
) -> None:
    """Print the last N lines of a run's log, or follow it (-f) to the end of the run (a fleet run: host 0's log,
    until every host's job has ended; a Slurm profile: the job's log on the shared folder, through the login node,
    until Slurm says the job has ended)."""
    from ..jobs import actions as lifecycle
    from ..jobs import fleetactions
    from ..jobs import watch as w
    from ..errors import UsageError

    out = output(False)
    fleet_prof = pick_profile(None, profile)
    project = Path.cwd()
    fleet_meta = lifecycle.resolve(run, fleet_prof, project)
    if fleet_prof.slurm is not None:  # the job's log on the shared folder, read through the login node
        from . import slurmruns

        slurmruns.logs(fleet_prof, out, fleet_meta, follow=follow, lines=lines, write=_raw_stdout(out))
    if all_:
        if follow or host is not None:
            raise UsageError("--all shows every host's last lines; drop -f / --host")
        for rank, addr, text in fleetactions.tail_all(fleet_prof, out, project, fleet_meta, lines):
            for line in text.splitlines():
                out.stdout.write(f"[#{rank} {addr}] {line}\n")
        out.stdout.flush()
        raise typer.Exit(0)
    prof, meta = _node(fleet_prof, fleet_meta, host)
    raw = _raw_stdout(out)
    if not follow:
        lifecycle.tail(prof, out, project, meta, lines, raw)
        raise typer.Exit(0)

    def show(ev: dict) -> None:  # the log's bytes as they are on stdout; connection news on stderr
        if ev["type"] == "log":
            raw(ev["raw"] + (b"\n" if ev.get("nl", True) else b""))
        elif ev["type"] == "reconnecting":
            out.info(f"connection lost ({ev['error']}); reconnecting in {ev['delay']:g}s")
        elif ev["type"] == "connected":
            out.info("reconnected; resuming the log")

    dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour)
    res = lifecycle.follow(prof, out, project, meta, dash, lines=lines, samples=False, interval=2.0, on_event=show)
    _ended(out, meta, dash, _fleet_end(out, fleet_prof, project, fleet_meta, prof, dash, res), what="following the log")


# -- status --------------------------------------------------------------------------------------------
@app.command()
def status(
    run: Optional[str] = typer.Argument(None, help="A Slurm profile: this run alone (an id or a unique prefix).",
                                        show_default=False, autocompletion=run_ids),
    profile: Optional[str] = ProfileOpt,
    json_: bool = JsonOpt,
    host: Optional[int] = HostOpt,
) -> None:
    """The profile's runs (id, script, state, started, elapsed, exit code) and the current GPU utilisation
    (every host of a fleet profile, in parallel, or --host N); each running run's progress and training signals;
    what each run that failed or was killed died of, with the evidence and a fix.
    A Slurm profile: each run's Slurm job (a pending job's reason in words with its fix and estimated start, a
    running job's nodes and time, an ended job's state, exit code and reason), its attempts, GPU-hours and cost."""
    from .. import jsonvocab
    from ..errors import UsageError
    from ..jobs import actions as lifecycle
    from ..jobs import fleetactions

    out = output(json_)
    prof = pick_profile(None, profile)
    if prof.slurm is not None:
        from . import slurmruns

        slurmruns.status(prof, out, run, json_)
    if run is not None:
        raise UsageError("status RUN is for a Slurm profile; a host's status lists every run",
                         hint="gpuops watch RUN --once shows one run")
    if prof.is_fleet and host is None:
        doc = fleetactions.status_fleet(prof, out, Path.cwd())
        hosts = [h for h in doc["hosts"] if not h["error"]]
        cloud = _cloud_summary(prof, any(r["state"] == "running" for h in hosts for r in h.get("runs") or []),
                               [g.get("util") for h in hosts for g in h.get("gpus") or []])
        if json_:
            out.emit_json(with_warnings(jsonvocab.status({**doc, "cloud": cloud} if cloud else doc), out))
        elif cloud:
            from ..cloud.meter import line

            out.print(line(cloud))
        for h in doc["hosts"]:
            if not json_:
                out.print(f"=== host #{h['rank']}: {h['host']} ===")
            if h["error"]:
                out.error(f"host #{h['rank']} ({h['host']}): {h['error']}")
            elif not json_:
                _status_lines(out, prof, h)
        raise typer.Exit(doc["code"])
    doc = lifecycle.status(prof.node(host), out, Path.cwd())
    cloud = _cloud_summary(prof, any(r["state"] == "running" for r in doc["runs"]),
                           [g.get("util") for g in doc["gpus"] or []])
    if json_:
        out.emit_json(with_warnings(jsonvocab.status({**doc, "cloud": cloud} if cloud else doc), out))
        raise typer.Exit(0)
    if cloud:
        from ..cloud.meter import line

        out.print(line(cloud))
    _status_lines(out, prof, doc)
    raise typer.Exit(0)


def _status_lines(out, prof, doc: dict) -> None:
    from datetime import datetime

    from ..jobs import watch as w
    from ..jobs.plan import fmt_duration

    rows, gpus, gpu_error = doc["runs"], doc["gpus"], doc["gpu_error"]

    def when(ts):
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"

    if gpus:
        out.print("GPU: " + "; ".join(w.gpu_text(g) for g in gpus))
    elif gpu_error:
        out.print(f"GPU: nvidia-smi failed: {gpu_error}")
    from ..jobs.signals import signal_text

    for sig in doc.get("host_signals") or []:  # a GPU failing or throttled, the disk running low (#35)
        out.print(f"host: {signal_text(sig)}")
    if not rows:
        out.print(f"no runs of profile '{prof.name}' (gpuops train --script train.py)")
        return
    priced = any(r.get("cost") is not None for r in rows)  # the profile states price_per_hour: cost so far

    def money(r) -> str:
        return "-" if r.get("cost") is None else f"${r['cost']:.2f}"

    cols = _status_columns(rows, priced, out.console.width) if out.rich else None
    if cols:
        from rich.table import Table

        t = Table(title=f"runs on {prof.name}")
        for col in cols:  # the id whole on one line (it is pasted into watch and stop), the script path gives way
            t.add_column(col, no_wrap=col != "script", overflow="fold",
                         min_width=max(len(r["run_id"]) for r in rows) if col == "run" else None)
        colour = {"running": "cyan", "succeeded": "green", "failed": "red", "stopped": "yellow", "lost": "red"}
        for r in rows:
            cell = {"run": r["run_id"], "script": str(r["script"] or "-"), "started": when(r["started"]),
                    "state": f"[{colour.get(r['state'], 'white')}]{r['state']}[/]", "elapsed": fmt_duration(r["elapsed"]),
                    "exit": "-" if r["exit_code"] is None else str(r["exit_code"]), "cost": money(r)}
            t.add_row(*(cell[c] for c in cols))
        out.render(t)
        _signal_lines(out, rows)
        return
    width = max([6] + [len(str(r["script"] or "-")) for r in rows])  # the columns grow: ids and paths stay whole
    ids = max([36] + [len(r["run_id"]) for r in rows])  # (until #36 a longer id pushed its row out of line)
    out.print(f"{'RUN':<{ids}} {'SCRIPT':<{width}} {'STATE':<10} {'STARTED':<19} {'ELAPSED':>9} EXIT"
              + ("  COST" if priced else ""))
    for r in rows:
        out.print(f"{r['run_id']:<{ids}} {str(r['script'] or '-'):<{width}} {r['state']:<10} "
                  f"{when(r['started']):<19} {fmt_duration(r['elapsed']):>9} "
                  + (f"{'-' if r['exit_code'] is None else r['exit_code']:<4}  {money(r)}" if priced else
                     f"{'-' if r['exit_code'] is None else r['exit_code']}"))
    _signal_lines(out, rows)


def _status_columns(rows: list, priced: bool, width: int) -> Optional[list]:
    """The rich table's columns at a terminal this wide: all of them when they fit with the script path folded to
    12 characters, else without `started` (elapsed says it), then without the script; None when even that does not
    fit: plain lines then, whose ids the terminal keeps whole. Until #36 rich cut long ids with '…'."""
    need = {"run": max(len(r["run_id"]) for r in rows),
            "script": min(12, max(len(str(r["script"] or "-")) for r in rows)),
            "state": 9, "started": 19, "elapsed": 9, "exit": 4, "cost": 8}
    cols = ["run", "script", "state", "started", "elapsed", "exit"] + (["cost"] if priced else [])
    for drop in ((), ("started",), ("started", "script")):
        kept = [c for c in cols if c not in drop]
        if sum(need[c] + 3 for c in kept) + 1 <= width:
            return kept
    return None


STATUS_ENDINGS_SHOWN = 3  # the newest runs that ended badly get their evidence and fix; older ones their cause


def _signal_lines(out, rows: list) -> None:
    """Under the table: each running run's progress and training signals (playbooks/signals.yaml); what each run
    that failed or was killed died of (jobs/endings.py), with the evidence and fix for the newest."""
    from ..jobs.signals import progress_text, signal_text
    from ..jobs.watchtext import ending_lines

    shown = 0
    for r in rows:
        prog = progress_text(r.get("progress"))
        if prog:
            out.print(f"{r['run_id']}: {prog}")
        for sig in r.get("signals") or []:
            out.print(f"{r['run_id']}: {signal_text(sig)}")
        if r.get("ending"):
            lines = ending_lines(r["ending"], indent="    ")
            shown += 1
            for line in lines if shown <= STATUS_ENDINGS_SHOWN else lines[:1]:
                out.print(f"{r['run_id']}: {line}" if line.startswith("why") else line)


# -- stop ----------------------------------------------------------------------------------------------
@app.command()
def stop(
    run: Optional[str] = RunArg,
    profile: Optional[str] = ProfileOpt,
    grace: float = typer.Option(10.0, "--grace", help="Seconds after SIGINT before SIGTERM, and after SIGTERM "
                                                      "before SIGKILL.", min=0.1),
    json_: bool = JsonOpt,
    host: Optional[int] = HostOpt,
) -> None:
    """Stop a run: SIGINT to every process of the run (its process group, and every process carrying the run's
    marker in its environment: a child that started its own session too), then SIGTERM, then SIGKILL; records how it
    ended. A fleet run is stopped on every host (or --host N). A Slurm profile: `scancel --signal=TERM` (the job's
    steps), then `scancel` after the grace."""
    from ..jobs import actions as lifecycle
    from ..jobs import fleetactions

    out = output(json_)
    fleet_prof = pick_profile(None, profile)
    fleet_meta = lifecycle.resolve(run, fleet_prof, Path.cwd())
    if fleet_prof.slurm is not None:  # scancel: SIGTERM to the job's steps first, then scancel
        from . import slurmruns

        slurmruns.stop(fleet_prof, out, fleet_meta, grace, json_)
    if len(fleet_meta.get("nodes") or []) > 1 and host is None:
        doc = fleetactions.stop_fleet(fleet_prof, out, Path.cwd(), fleet_meta, grace)
        if json_:
            out.emit_json(with_warnings(doc, out))
        for h in doc["hosts"]:
            if h["error"]:
                out.error(f"host #{h['rank']} ({h['host']}): {h['error']}")
            elif not json_:
                out.success(f"host #{h['rank']} ({h['host']}): {h['result']} ({h['state']}, exit {h['exit_code']})")
        raise typer.Exit(doc["code"])
    prof, meta = _node(fleet_prof, fleet_meta, host)
    doc = lifecycle.stop(prof, out, Path.cwd(), meta, grace)
    rid, how = doc["run_id"], doc["result"]
    if json_:
        out.emit_json(with_warnings(doc, out))
    elif how in ("nopid", "notrunning"):
        out.info(f"{rid} is not running ({doc['state']}" + (f", exit {doc['exit_code']})"
                                                             if doc["exit_code"] is not None else ")"))
    else:
        out.success(f"stopped {rid} with SIG{how} (exit code {doc['exit_code']}); recorded in "
                    f"{meta['remote_run_dir']}/stop.json")
    raise typer.Exit(0)
