"""The run lifecycle's commands, step by step on one SSH connection: train, watch, logs, status, stop.

Each function takes the profile and the Output (progress and warnings go through it, as in transfer/sync.py), talks to
the host through jobs/scripts.py and jobs/watch.py, decides with the pure functions of jobs/plan.py, records locally, and
returns what cli/jobs.py renders. Nothing here prints a report.
"""
from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional

from . import envplan
from . import gate as launch_gate
from . import plan as core
from ..errors import RemoteError, UsageError


def connect(prof, out):
    from ..remote.connection import connect as open_connection

    return open_connection(prof, announce=out.info)


def resolve(run: Optional[str], prof, project: Path) -> dict:
    """The run's local record, or, for an id not recorded here, where it would be on the host."""
    from .scripts import run_dir_of

    try:
        return core.resolve_run(run, prof.name, project)
    except UsageError:
        if run:  # launched through another profile that names this very host: the same run (issue #36)
            same = [m for m in core.local_runs(None, project) if m["run_id"] == run and same_host(m, prof)]
            if same:
                return same[0]
        if not run or any(m["run_id"] == run for m in core.local_runs(None, project)):
            raise
        return {"run_id": run, "profile": prof.name, "remote_run_dir": run_dir_of(prof.remote_dir_for(project), run),
                "price_per_hour": prof.price_per_hour}


def same_host(meta: dict, prof) -> bool:
    """Does the profile reach the host a run's meta says it was launched on (address, port and user; rank 0's for a
    fleet)?"""
    try:
        port = int(meta.get("port") or 22)
    except (TypeError, ValueError):
        return False
    return (meta.get("host") == prof.host and port == prof.port
            and (meta.get("user") in (None, prof.user)))


class _Gate:
    """What the launch gate reads locally, once per run: the modules the job needs (job_imports, from the project's
    files) and the module -> distribution table (playbooks/modules.yaml)."""

    def __init__(self, project: Path, script_rel: str, plan: envplan.EnvPlan):
        from .. import knowledge as kb
        from ..project.judge import namespaces
        from ..project.needs import job_needs

        self.project, self.script, self.env = project, script_rel, envplan.job_env(plan)
        self.tables = kb.load_playbook("modules", project)
        self.table = self.tables.get("modules") or []
        self.needs = job_needs(project, script_rel, namespaces(self.table))

    def preflight(self, remote, node, remote_dir: str, packages: list[str], *, force: bool, sync: bool,
                  launcher: str = "none"):
        """One remote execution (remote/launch.preflight), then the verdict: the stack (gate.gate_results), the GPUs
        the job will see held by other processes (gate.gpu_holders), the modules its python cannot find. Sets
        pf.job_gpus, the GPUs the job is given."""
        from .. import knowledge as kb
        from ..project import gatefix as ji
        from ..project.needs import probe_groups
        from . import scripts as rl

        script_rel = self.script
        pf, found = rl.preflight(remote, remote_dir, script_rel, node.python, packages,
                                 launch_gate.gate_params(node, remote_dir, env=self.env, modules=probe_groups(self.needs)))
        pf.job_gpus = launch_gate.job_gpu_count(pf.facts, self.env, len(pf.gpus))
        extra = launch_gate.gpu_holders(pf.facts, pf.active_pids, self.env, active_ids=pf.active)
        gone = ji.missing(self.needs, launch_gate.found_modules(pf.facts))
        if gone:
            extra += ji.problems(gone, python=node.python, declared_names=ji.declared(self.project), table=self.table,
                                 project_table=ji.has_project_table(self.project),
                                 extras=ji.extras_only(self.project), wanted_extras=node.setup.extras,
                                 tables=self.tables)
        verdict = launch_gate.judge_preflight(pf, script_found=found, script=script_rel, remote_dir=remote_dir,
                                       min_disk_gb=node.expect.min_disk_gb, force=force, synced=sync,
                                       stack=launch_gate.gate_results(pf.facts, node, kb.knowledge(self.project), self.env),
                                       launcher=launcher, python=node.python, extra=extra)
        return pf, verdict


def _remember(prof, project: Path) -> None:
    from ..profiles import model as profiles

    profiles.remember(prof, project)


# -- train ---------------------------------------------------------------------------------------------
def _prepare_run(prof, out, project: Path, *, script: str, name: Optional[str], env: Iterable[str], sync: bool,
                 seed: Optional[int], clock: Callable[[], datetime]):
    """What train and train_fleet decide before connecting: the script, the presets, the run id, the environment
    plan (its warnings shown). Returns (script, presets, started, run id, plan)."""

    script_rel = core.script_path(script, project, must_exist=sync)
    refuse_script(project, script_rel, "nothing was synced or launched", prof=prof, out=out)
    if sync:  # a file the script names that the sync leaves out: said before anything is sent
        from ..transfer.sync import warn_script_exclusions

        warn_script_exclusions(out, project, script_rel, prof.sync.exclude)
    presets_doc, started, rid, plan = new_run(prof, out, project, name=name, key=script_rel, env=env, seed=seed,
                                              clock=clock)
    return script_rel, presets_doc, started, rid, plan


def new_run(prof, out, project: Path, *, name: Optional[str], key: str, env: Iterable[str], seed: Optional[int],
            clock: Callable[[], datetime]):
    """A new run's id (from its name, else `key`: the script or command) and its environment plan, the plan's and
    .env's warnings said. Returns (presets, started, run id, plan)."""
    from ..profiles import model as profiles

    cli_env = envplan.parse_env_args(env)
    presets_doc = envplan.load_presets(project)
    started = clock()
    reg = core.registry_dir(project)  # every folder of runs/ (a job's, or a pipeline run's checkpoints)
    taken = [d.name for d in reg.iterdir()] if reg.is_dir() else []
    rid = core.run_id(name, key, clock=lambda: started, taken=taken)
    dotenv = profiles.read_dotenv(project / ".env")
    plan = envplan.plan_env(preset=prof.env_preset, presets_doc=presets_doc, profile_env=prof.env, cli_env=cli_env,
                            secret_names=prof.secrets, local_env=profiles.environment(project), run_id=rid,
                            profile_name=prof.name, seed=seed, dotenv_names=list(dotenv))
    for w in plan.warnings + dotenv_warnings(project / ".env", plan.secret_origin):
        out.warn(w)
    for w in profiles.dotenv_problems(project / ".env"):  # a line the job would not get: said
        out.warn_once(w)
    return presets_doc, started, rid, plan


def refuse_script(project: Path, script_rel: str, done: str, *, prof=None, out=None) -> None:
    """What the job's own files decide, before anything is done (`done` says what was not): the local plan
    (project/plan.py) for a host whose image is not known here: every script the launch line reaches (Windows line
    endings in any), the import closure at any depth (a name the project's own package does not have), a conda
    switch; its warnings said through `out`. Modules are left to the gate, which asks the host."""
    from ..project.plan import Settings, local_plan
    from ..project.verdict import enforce, report

    settings = Settings.of_profile(prof) if prof is not None else Settings()
    plan = local_plan(project, script_rel, settings, image=None, resolve=False)
    if out is not None:
        report(plan, out, quiet=True)
    enforce(plan, force=False, done=done, out=out)


def dotenv_warnings(dotenv: Path, origins: dict[str, str]) -> list[str]:
    """A .env others may read that holds secrets the job is sent: said, with the chmod (docs/security.md: the Lambda
    API key is refused from such a file, the job's own secrets are sent with this warning)."""
    import shlex

    from ..paths import loose_mode

    names = sorted(n for n, o in origins.items() if o == ".env")
    mode = loose_mode(dotenv) if names else None
    if mode is None:
        return []
    return [f"{dotenv} is readable by others (mode {mode:04o}) and holds the secret(s) {', '.join(names)} sent to "
            f"the job: chmod 600 {shlex.quote(str(dotenv))}"]


def train(prof, out, project: Path, *, script: str, name: Optional[str] = None, env: Iterable[str] = (),
          args: Iterable[str] = (), sync: bool = True, force: bool = False, seed: Optional[int] = None,
          snapshot: bool = True, clock: Callable[[], datetime] = datetime.now) -> dict:
    """Sync, preflight, environment, launch (detached), local record, snapshot. Returns what `train --json` prints."""
    from . import scripts as rl

    args = list(args)
    script_rel, presets_doc, started, rid, plan = _prepare_run(prof, out, project, script=script, name=name, env=env,
                                                               sync=sync, seed=seed, clock=clock)
    remote_dir = prof.remote_dir_for(project)
    gate = _Gate(project, script_rel, plan)

    remote = connect(prof, out)
    try:
        if sync:
            from ..transfer.sync import sync_project  # never sends ./runs/ nor touches the remote .gpuops/

            out.step(f"syncing {project.name}/ to {prof.name}:{remote_dir}")
            sync_project(prof, remote, out, project)
        out.step("preflight: GPUs and their other processes, free disk, other runs, the stack (torch, CUDA, "
                 "flash-attn), the script and what it imports")
        pf, verdict = gate.preflight(remote, prof, remote_dir, envplan.conflict_packages(presets_doc), force=force,
                                     sync=sync)
        for w in verdict.warnings:
            out.warn(w)
        if verdict.error:
            raise verdict.error
        for w in envplan.conflict_warnings(plan.exported, presets_doc, pf.packages):
            out.warn(w)
        out.info(f"environment for {rid}:")
        for line in plan.lines():
            out.info("  " + line)

        argv = core.job_argv(script_rel, args, prof.python, shebang=core.read_shebang(project / script_rel))
        run_dir = rl.run_dir_of(remote_dir, rid)
        meta = core.build_meta(run_id=rid, script=script_rel, args=args, argv=argv, profile=prof, plan=plan,
                               remote_dir=remote_dir, remote_run_dir=run_dir, git=core.git_info(project), seed=seed,
                               started=started, name=name)
        if verdict.forced:
            meta["forced"] = verdict.forced
        launcher = rl.launcher_script(run_id=rid, remote_dir=remote_dir, argv=argv, python=prof.python,
                                      env=plan.exported, unset=plan.unset)
        pid, abs_dir = rl.launch(remote, run_id=rid, remote_dir=remote_dir, meta=meta, launcher=launcher,
                                 secrets=plan.secrets, python=prof.python, force=force)
        meta["remote_run_path"] = abs_dir
        meta["pid"] = pid
        record = core.save_local(meta, project)
        if snapshot:
            _snapshot(remote, prof, out, project, rid, run_dir, seed)
    finally:
        remote.close()
    _remember(prof, project)
    return {"run_id": rid, "profile": prof.name, "pid": pid, "remote_run_dir": abs_dir, "local_record": str(record),
            "secrets": sorted(plan.secrets),
            "next": [f"gpuops watch {rid}", f"gpuops logs -f {rid}", f"gpuops stop {rid}"]}


def _snapshot(remote, prof, out, project: Path, rid: str, run_dir: str, seed: Optional[int]) -> None:
    """The environment snapshot kept with the run (runs/<id>/environment/ and <run dir>/environment/)."""
    from ..transfer.snapshot import snapshot_for_run

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
    if dash.ending:
        core.save_local_state(rid, dash.info, project, ending=dash.ending, rank=meta.get("node_rank"))
    _remember(prof, project)
    return {"events": events, "code": 0 if dash.state in (core.RUNNING, core.SUCCEEDED) else 1, "error": None}


def follow(prof, out, project: Path, meta: dict, dash, *, lines: Optional[int], samples: bool, interval: float,
           on_event: Callable[[dict], None], extras=None, give_up_after: Optional[float] = None) -> dict:
    """watch / logs -f: replay the last N log lines (None: every line from the first), then follow the run to its end, reconnecting when the connection
    drops (for give_up_after seconds at most). extras: what the stream samples beyond the GPU line (watch.Extras).
    Returns {"interrupted" (Ctrl-C: the job keeps running), "info" (the final state or None), "code"}."""
    from . import watch as w

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    rec = None
    try:
        info, start = w.start_position(remote, rid, run_dir, lines)
        fs = w.FollowState(offset=start, info=info)
        first = [remote]
        rec = _recorder(project, meta, info, start, remote, out)

        def reconnect():
            return first.pop() if first else connect(prof, out)

        def recorded(ev: dict) -> None:
            if ev.get("type") == "log" and (ev.get("offset") or 0) <= info.log_size:
                ev["replay"] = True  # written before following began: read back now, its time unknown
            rec.event(ev)
            on_event(ev)

        ended = w.follow_to_end(reconnect, rid, run_dir, fs, dash, interval=interval, samples=samples,
                                on_event=recorded, extras=extras,
                                give_up_after=w.GIVE_UP_S if give_up_after is None else give_up_after)
    finally:
        if rec is not None:
            rec.close(wait=10.0)
        remote.close()
    if not ended:
        return {"interrupted": True, "info": None, "code": 130, "ending": None}
    if fs.info is not None:
        core.save_local_state(rid, fs.info, project, ending=dash.ending, rank=meta.get("node_rank"))
    _remember(prof, project)
    return {"interrupted": False, "info": fs.info, "code": 1 if fs.info is None else core.exit_for_state(fs.info),
            "ending": dash.ending}


def _recorder(project: Path, meta: dict, info, start: int, remote, out):
    """The run's history (jobs.history) kept while it is followed, the log before `start` read back in the
    background on the same connection where no follower saw it."""
    from . import history
    from .scripts import stream_from

    rec = history.Recorder(project, meta["run_id"], live_from=info.log_size, warn=out.warn)
    rec.fill(lambda lo, hi: stream_from(remote, meta["remote_run_dir"], lo, hi), start, background=True)
    return rec


class FleetSampler:
    """A fleet watch's other hosts: each host's GPUs through one long-lived `nvidia-smi -lms` stream (no command per
    refresh), connected and read by one background thread. Its events, {"type": "sample", "gpu", "host"} and
    {"type": "gpu_error", "host", "message"}, wait in a queue that the watching thread drains (`drain()`) between
    its own events, so the dashboard is only ever touched by one thread. Best effort: a host that cannot be reached,
    or whose stream ends, is reported once and left out; the watch goes on.
    health=True: each host's health lines (watch.health_command) instead of its GPU samples, as events of the
    stream parser ({"type": "health"|"xid"|"heartbeat", "host"}): a run's fleet watch judges them (--recover); a
    host not reached, or whose stream ended, is {"type": "unwatched", "host", "message"}."""

    def __init__(self, nodes: list, interval: float, health: bool = False):
        import queue
        import threading

        self.nodes, self.interval, self.health = list(nodes), interval, health
        self._lost_type = "unwatched" if health else "gpu_error"  # a host not reached, or whose stream ended
        self._queue: "queue.SimpleQueue[dict]" = queue.SimpleQueue()
        self.on_event = self._queue.put
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuops-fleet-samples", daemon=True)
        self._streams: list = []  # (rank, remote, channel)

    def drain(self) -> list[dict]:
        """The events gathered since the last call."""
        import queue

        got = []
        while True:
            try:
                got.append(self._queue.get_nowait())
            except queue.Empty:
                return got

    def __enter__(self) -> "FleetSampler":
        if self.nodes:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for _, remote, chan in self._streams:
            for c in (chan, remote):
                try:
                    c.close()
                except Exception:
                    pass

    def _open(self, node):
        from ..remote.connection import connect as open_connection
        from . import watch as w

        remote = open_connection(node, announce=lambda s: None, attempts=1)
        try:
            return remote, remote.stream(w.health_command() if self.health else w.sample_command(self.interval))
        except BaseException:
            remote.close()
            raise

    def _run(self) -> None:
        import select

        from .. import hostpool
        from . import watch as w

        for node, r in zip(self.nodes, hostpool.for_each(self.nodes, self._open)):
            if r.ok:
                self._streams.append((node.rank, *r.value))
            else:
                self.on_event({"type": self._lost_type, "host": node.rank,
                               "message": f"{'not watched' if self.health else 'not sampled'}: {r.message}"})
        if self._stop.is_set():
            return
        pending = {rank: b"" for rank, _, _ in self._streams}
        live = {id(chan): (rank, chan) for rank, _, chan in self._streams}
        while live and not self._stop.is_set():
            ready, _, _ = select.select([c for _, c in live.values()], [], [], 0.3)
            for chan in ready:
                rank, _ = live[id(chan)]
                # its end read before its buffer (remote.connection.output_complete): lines that came with it are kept
                ended = chan.exit_status_ready() or chan.closed or chan.eof_received
                data = chan.recv(1 << 16) if chan.recv_ready() or ended else b""
                if not data and ended:
                    del live[id(chan)]
                    if not self._stop.is_set():
                        self.on_event({"type": self._lost_type, "host": rank, "message":
                                       "its health stream ended" if self.health else "the GPU sample stream ended"})
                    continue
                *lines, pending[rank] = (pending[rank] + data).split(b"\n")
                for raw in lines:
                    text = raw.decode("utf-8", "replace").strip()
                    if not text:
                        continue
                    if self.health:
                        ev = w.parse_stderr_line(text)
                        if ev:
                            self.on_event({**ev, "host": rank})
                        continue
                    g = w.parse_gpu(text)
                    self.on_event({"type": "sample", "gpu": g, "host": rank} if g else
                                  {"type": "gpu_error", "host": rank, "message": text})


def tail(prof, out, project: Path, meta: dict, lines: int, write: Callable[[bytes], None]) -> None:
    """The last N lines of the run's log, as the host has them (raw bytes, streamed to `write`)."""
    from . import scripts as rl

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        info = rl.tail_stream(remote, rid, run_dir, lines, write)
    finally:
        remote.close()
    if not info.exists:
        raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
    _remember(prof, project)


# -- status, stop ---------------------------------------------------------------------------------------
def status(prof, out, project: Path) -> dict:
    """The profile's runs (recorded here or found on the host) and the GPUs; what `status --json` prints."""
    from . import watch as w
    from . import scripts as rl

    metas = {m["run_id"]: m for m in core.local_runs(prof.name, project)}
    saved = {rid: core.local_state(rid, project, prof.rank) or {} for rid in metas}  # this host's (a fleet's node)
    known = {rid: st.get("ending") for rid, st in saved.items()}
    judged = [rid for rid, st in saved.items() if st.get("ending") or st.get("state") == core.SUCCEEDED]
    remote = connect(prof, out)
    try:  # a run that ended badly and was never judged here: the facts of its death, in the same execution
        got = rl.query_states(remote, [(rid, core.run_dir_on(m, prof.rank)) for rid, m in metas.items()], gpu=True,
                              list_dir=prof.remote_dir_for(project), log_tail=STATUS_LOG_TAIL,
                              endings=[rid for rid in metas if rid not in judged][:STATUS_ENDINGS])
    finally:
        remote.close()
    for rid, m in got["metas"].items():
        metas.setdefault(rid, m)
    gpus = [g for g in (w.parse_gpu(x) for x in got["gpu_lines"]) if g]
    gpu_error = None if gpus else " ".join(got["gpu_lines"]).strip() or None
    endings = _endings(got, known, gpu_error, project)
    for rid, info in got["infos"].items():
        if rid in metas and info.exists and info.state in core.ENDED:
            core.save_local_state(rid, info, project, ending=endings.get(rid), rank=prof.rank)
    rows = core.status_rows(metas, got["infos"], time.time())
    for r in rows:
        if r["state"] in core.ENDED and endings.get(r["run_id"]):
            r["ending"] = endings[r["run_id"]]
    _add_signals(rows, got.get("logs") or {}, prof, project, gpus)
    _remember(prof, project)
    return {"profile": prof.name, "runs": rows, "gpus": gpus, "gpu_error": gpu_error,
            "host_signals": _host_signals(got.get("health_lines") or [], project)}


def _host_signals(lines: list[str], project: Path) -> list[dict]:
    """The host's side while it trains, from the status execution's health and disk lines (jobs/trainhealth.py):
    a GPU failing or throttled, the project's disk running low."""
    from . import signals as sg
    from . import watch as w
    from .. import knowledge as kb
    from .trainhealth import TrainingHealth

    th = TrainingHealth(sg.load_spec(project), kb.load_playbook("xid", project),
                        kb.knowledge(project).get("nvidia_smi_failures", []))
    found = []
    for line in lines:
        ev = w.parse_stderr_line(line)
        if ev is not None:
            found += th.apply(ev)
    return found


STATUS_LOG_TAIL = 300  # log lines of each running run that status scans for training signals
STATUS_ENDINGS = 20  # runs whose death status judges in one execution (the newest; the rest at the next status)


def _endings(got: dict, known: dict, gpu_error: Optional[str], project: Path) -> dict:
    """What each ended run died of: judged once (jobs/endings.py over the facts query_states gathered), then read
    from runs/<id>/state.json."""
    from . import endfacts, endings as en

    out = {rid: e for rid, e in known.items() if e}
    if not got.get("end_lines"):
        return out
    parsed = endfacts.parse(got["end_lines"])
    spec, xids = en.load(project), en.xid_table(project)
    for rid in parsed["runs"]:
        info = got["infos"].get(rid)
        if info is not None and info.exists and info.state in core.ENDED:
            out[rid] = en.classify(endfacts.facts_for(parsed, info, gpu_error=gpu_error), spec, xids)
    return out


def _add_signals(rows: list[dict], logs: dict, prof, project: Path, gpus: list) -> None:
    """Each running run's training signals and progress (jobs/signals.py over its log's tail) into its status row; with
    one GPU sample, the GPU-idle signal when every GPU is at 0 % and the run is past the signal's first minutes."""
    from . import signals as sg

    spec = sg.load_spec(project)
    now = time.time()
    for r in rows:
        if r["state"] != core.RUNNING:
            continue
        r["signals"], r["progress"] = sg.scan(logs.get(r["run_id"], []), spec, started=r.get("started"),
                                               price_per_hour=prof.price_per_hour, now=now)
        r["signals"] += sg.idle_now(spec, gpus, r.get("elapsed"))


def stop(prof, out, project: Path, meta: dict, grace: float) -> dict:
    """SIGINT, SIGTERM, SIGKILL to the run's process group. Returns what `stop --json` prints."""
    from . import scripts as rl

    rid, run_dir = meta["run_id"], meta["remote_run_dir"]
    remote = connect(prof, out)
    try:
        how, info = rl.stop(remote, rid, run_dir, grace, on_stopping=lambda: out.step(
            f"stopping {rid}: SIGINT, then SIGTERM and SIGKILL after {grace:g}s each"))
    finally:
        remote.close()
    if not info.exists:
        raise RemoteError(f"run {rid} not found on {prof.name} ({run_dir})")
    if info.exists:
        core.save_local_state(rid, info, project, rank=meta.get("node_rank"))
    _remember(prof, project)
    return {"run_id": rid, "result": how, "state": info.state, "exit_code": info.exit_code}
