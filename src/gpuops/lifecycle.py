"""The run lifecycle's commands, step by step on one SSH connection: train, watch, logs, status, stop.

Each function takes the profile and the Output (progress and warnings go through it, as in transfer_ops), talks to
the host through remote/launch.py and watch.py, decides with the pure functions of runs.py, records locally, and
returns what cli/runs.py renders. Nothing here prints a report.
"""
from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional

from . import runs as core
from .errors import RemoteError, UsageError


def connect(prof, out):
    from .remote.connection import connect as open_connection

    return open_connection(prof, announce=out.info)


def resolve(run: Optional[str], prof, project: Path) -> dict:
    """The run's local record, or, for an id not recorded here, where it would be on the host."""
    from .remote.launch import run_dir_of

    try:
        return core.resolve_run(run, prof.name, project)
    except UsageError:
        if not run or any(m["run_id"] == run for m in core.local_runs(None, project)):
            raise
        return {"run_id": run, "profile": prof.name, "remote_run_dir": run_dir_of(prof.remote_dir_for(project), run),
                "price_per_hour": prof.price_per_hour}


def _remember(prof, project: Path) -> None:
    from . import profiles

    profiles.remember(prof, project)


# -- train ---------------------------------------------------------------------------------------------
def train(prof, out, project: Path, *, script: str, name: Optional[str] = None, env: Iterable[str] = (),
          args: Iterable[str] = (), sync: bool = True, force: bool = False, seed: Optional[int] = None,
          snapshot: bool = True, clock: Callable[[], datetime] = datetime.now) -> dict:
    """Sync, preflight, environment, launch (detached), local record, snapshot. Returns what `train --json` prints."""
    from . import profiles
    from .remote import launch as rl

    args = list(args)
    script_rel = core.script_path(script, project, must_exist=sync)
    cli_env = core.parse_env_args(env)
    presets_doc = core.load_presets(project)
    started = clock()
    taken = [m["run_id"] for m in core.local_runs(None, project)]
    rid = core.run_id(name, script_rel, clock=lambda: started, taken=taken)
    dotenv = profiles.read_dotenv(project / ".env")
    plan = core.plan_env(preset=prof.env_preset, presets_doc=presets_doc, profile_env=prof.env, cli_env=cli_env,
                         secret_names=prof.secrets, local_env=profiles.environment(project), run_id=rid,
                         profile_name=prof.name, seed=seed, dotenv_names=[k for k in dotenv if k not in os.environ])
    for w in plan.warnings:
        out.warn(w)
    remote_dir = prof.remote_dir_for(project)

    remote = connect(prof, out)
    try:
        if sync:
            from .transfer_ops import sync_project  # never sends ./runs/ nor touches the remote .gpuops/

            out.step(f"syncing {project.name}/ to {prof.name}:{remote_dir}")
            sync_project(prof, remote, out, project)
        out.step("preflight: GPUs, free disk, other runs")
        pf, found = rl.preflight(remote, remote_dir, script_rel, prof.python, core.conflict_packages(presets_doc))
        verdict = core.judge_preflight(pf, script_found=found, script=script_rel, remote_dir=remote_dir,
                                       min_disk_gb=prof.expect.min_disk_gb, force=force, synced=sync)
        for w in verdict.warnings:
            out.warn(w)
        if verdict.error:
            raise verdict.error
        for w in core.conflict_warnings(plan.exported, presets_doc, pf.packages):
            out.warn(w)
        out.info(f"environment for {rid}:")
        for line in plan.lines():
            out.info("  " + line)

        argv = core.job_argv(script_rel, args, prof.python, shebang=core.read_shebang(project / script_rel))
        run_dir = rl.run_dir_of(remote_dir, rid)
        meta = core.build_meta(run_id=rid, script=script_rel, args=args, argv=argv, profile=prof, plan=plan,
                               remote_dir=remote_dir, remote_run_dir=run_dir, git=core.git_info(project), seed=seed,
                               started=started, name=name)
        launcher = rl.launcher_script(run_id=rid, remote_dir=remote_dir, argv=argv, python=prof.python,
                                      env=plan.exported, unset=plan.unset)
        pid, abs_dir = rl.launch(remote, run_id=rid, remote_dir=remote_dir, meta=meta, launcher=launcher,
                                 secrets=plan.secrets, python=prof.python)
        meta["remote_run_path"] = abs_dir
        meta["pid"] = pid
        record = core.save_local(meta, project)
        if snapshot:
            _snapshot(remote, prof, out, project, rid, run_dir, seed)
    finally:
        remote.close()
    _remember(prof, project)
    return {"run_id": rid, "profile": prof.name, "pid": pid, "remote_run_dir": abs_dir, "local_record": str(record),
            "next": [f"gpuops watch {rid}", f"gpuops logs -f {rid}", f"gpuops stop {rid}"]}


def _snapshot(remote, prof, out, project: Path, rid: str, run_dir: str, seed: Optional[int]) -> None:
    """The environment snapshot kept with the run (runs/<id>/environment/ and <run dir>/environment/)."""
    from .snapshot import snapshot_for_run

    local_dir = Path(os.path.relpath(core.registry_dir(project) / rid / "environment"))
    try:
        snapshot_for_run(remote, prof, run_id=rid, remote_run_dir=run_dir, local_dir=local_dir, out=out, seed=seed,
                         project_dir=project)
    except Exception as exc:  # noqa: BLE001 - it warns rather than raise; whatever slips through, the job is running
        msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        out.warn(f"environment snapshot failed (the run is launched): {msg}")


# -- watch, logs ---------------------------------------------------------------------------------------
def watch_once(prof, out, project: Path, meta: dict, dash, lines: int) -> dict:
    """One snapshot into dash. Returns {"events", "code" (0 running or succeeded, else 1), "error" (run not found)}."""
    from . import watch as w

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        events = w.once_events(remote, rid, run_dir, lines)
    finally:
        remote.close()
    for ev in events:
        dash.apply(ev)
    if not dash.info or not dash.info.exists:
        return {"events": events, "code": 1, "error": RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")}
    _remember(prof, project)
    return {"events": events, "code": 0 if dash.state in (core.RUNNING, core.SUCCEEDED) else 1, "error": None}


def follow(prof, out, project: Path, meta: dict, dash, *, lines: int, samples: bool, interval: float,
           on_event: Callable[[dict], None]) -> dict:
    """watch / logs -f: replay the last N log lines, then follow the run to its end, reconnecting when the connection
    drops. Returns {"interrupted" (Ctrl-C: the job keeps running), "info" (the final state or None), "code"}."""
    from . import watch as w

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        info, start = w.start_position(remote, rid, run_dir, lines)
        fs = w.FollowState(offset=start, info=info)
        first = [remote]

        def reconnect():
            return first.pop() if first else connect(prof, out)

        ended = w.follow_to_end(reconnect, rid, run_dir, fs, dash, interval=interval, samples=samples,
                                on_event=on_event)
    finally:
        remote.close()
    if not ended:
        return {"interrupted": True, "info": None, "code": 130}
    if fs.info is not None:
        core.save_local_state(rid, fs.info, project)
    _remember(prof, project)
    return {"interrupted": False, "info": fs.info, "code": 1 if fs.info is None else core.exit_for_state(fs.info)}


def tail(prof, out, project: Path, meta: dict, lines: int) -> str:
    """The last N lines of the run's log, as the host has them."""
    from .remote import launch as rl

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        info, text = rl.tail(remote, rid, run_dir, lines)
    finally:
        remote.close()
    if not info.exists:
        raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
    _remember(prof, project)
    return text


# -- status, stop ---------------------------------------------------------------------------------------
def status(prof, out, project: Path) -> dict:
    """The profile's runs (recorded here or found on the host) and the GPUs; what `status --json` prints."""
    from . import watch as w
    from .remote import launch as rl

    metas = {m["run_id"]: m for m in core.local_runs(prof.name, project)}
    remote = connect(prof, out)
    try:
        got = rl.query_states(remote, [(rid, m["remote_run_dir"]) for rid, m in metas.items()], gpu=True,
                              list_dir=prof.remote_dir_for(project))
    finally:
        remote.close()
    for rid, m in got["metas"].items():
        metas.setdefault(rid, m)
    for rid, info in got["infos"].items():
        if rid in metas and info.exists and info.state in core.ENDED:
            core.save_local_state(rid, info, project)
    rows = core.status_rows(metas, got["infos"], time.time())
    gpus = [g for g in (w.parse_gpu(x) for x in got["gpu_lines"]) if g]
    gpu_error = None if gpus else " ".join(got["gpu_lines"]).strip() or None
    _remember(prof, project)
    return {"profile": prof.name, "runs": rows, "gpus": gpus, "gpu_error": gpu_error}


def stop(prof, out, project: Path, meta: dict, grace: float) -> dict:
    """SIGINT, SIGTERM, SIGKILL to the run's process group. Returns what `stop --json` prints."""
    from .remote import launch as rl

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        out.step(f"stopping {rid}: SIGINT, then SIGTERM and SIGKILL after {grace:g}s each")
        how, info = rl.stop(remote, rid, run_dir, grace)
    finally:
        remote.close()
    if not info.exists:
        raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
    if info.exists:
        core.save_local_state(rid, info, project)
    _remember(prof, project)
    return {"run_id": rid, "result": how, "state": info.state, "exit_code": info.exit_code}
