"""A gpuops run on a Slurm cluster, step by step over the login node's one connection: train (sbatch), status, logs
(-f), stop (scancel). Slurm is the engine: gpuops writes the batch script, submits it and reads what Slurm says; it
never schedules. Each function takes the profile and the Output, talks through slurm/commands.py, decides with the
pure slurm/runstate.py and slurm/batch.py, records locally (runs/<id>/, as a host's runs) and returns what
cli/slurmruns.py renders.

The run folder on the shared filesystem, `<remote_dir>/.gpuops/runs/<run id>/` as a host's: meta.json, job.sbatch,
job_id (Slurm's), secrets.env (0600), the log slurm-<job id>.out (every attempt's, appended), attempts, stop.json.
"""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..errors import RemoteError, UsageError
from ..jobs import plan as core
from . import batch, resume, runstate
from .commands import STOP_FILE, LoginNode
from .states import ENDED

LOG_TAIL = 60  # the log's last lines read for an ended job's verdict (endfacts.TAIL_LINES)
FOLLOW_EVERY = 0.5  # seconds between two looks at the log and the job's state while following


def connect(prof, out):
    from ..remote.connection import connect as open_connection

    return open_connection(prof, announce=out.info)


def settings(prof):
    if prof.slurm is None:
        raise UsageError(f"profile '{prof.name}' has no slurm: section (it is not a Slurm cluster's login node)")
    return prof.slurm


# -- train -----------------------------------------------------------------------------------------------------------
def batch_job(prof, *, run_id: str, run_dir: str, project_dir: str, argv: list, plan, nodes: Optional[int],
              launcher: Optional[str], nproc: Optional[int], master_port: Optional[int], exclude: Iterable[str],
              name: Optional[str], checkpoints: Optional[str] = None, recover: Optional[int] = None) -> batch.BatchJob:
    """The BatchJob of a run: the profile's slurm: settings, the command line's --nodes, --launcher, --exclude,
    --checkpoints (relative to the project folder unless absolute) and --recover."""
    s = settings(prof)
    folder = checkpoints or s.checkpoints
    if folder and not folder.startswith("/"):
        folder = f"{project_dir.rstrip('/')}/{folder.strip('/')}"
    return batch.BatchJob(
        run_id=run_id, run_dir=run_dir, project_dir=project_dir, argv=tuple(argv), launcher=launcher or s.launcher,
        python=prof.python, nodes=nodes or s.nodes, gpus_per_node=s.gpus_per_node, gpu_type=s.gpu_type,
        gpu_option=s.gpu_option, procs_per_node=nproc, name=name, partition=s.partition, account=s.account,
        qos=s.qos, time=s.time, cpus_per_task=s.cpus_per_task, signal_before_s=s.signal_before_s or None,
        exclude=tuple(s.exclude) + tuple(exclude), nodelist=tuple(s.nodelist), extra_sbatch=tuple(s.extra_sbatch),
        env=dict(plan.exported), unset=tuple(plan.unset), rdzv_port=master_port, checkpoints=folder or None,
        max_requeues=recover)


def train(prof, out, project: Path, *, script: str, name: Optional[str] = None, env: Iterable[str] = (),
          args: Iterable[str] = (), sync: bool = True, seed: Optional[int] = None, nodes: Optional[int] = None,
          launcher: Optional[str] = None, nproc: Optional[int] = None, master_port: Optional[int] = None,
          exclude: Iterable[str] = (), dry_run: bool = False, checkpoints: Optional[str] = None,
          recover: Optional[int] = None, force: bool = False, clock: Callable[[], datetime] = datetime.now) -> dict:
    """The local plan (the script, what it imports judged against the nodes as `gpuops verify` found them, the
    environment), the sync to the shared folder, the batch script written into the run's folder and submitted with
    sbatch; returns at once with the run id and Slurm's job id (both recorded: runs/<id>/meta.json here, meta.json
    and job_id in the run folder). dry_run: the plan and the batch script, nothing synced, written or submitted.
    force: the plan's refusals that a --force passes are said as warnings instead."""
    from ..jobs import actions

    settings(prof)
    args = list(args)
    script_rel = core.script_path(script, project, must_exist=sync or dry_run)
    judged = refuse_plan(prof, out, project, script_rel, force=force, done="nothing was synced, written or submitted")
    if sync and not dry_run:
        from ..transfer.sync import warn_script_exclusions

        warn_script_exclusions(out, project, script_rel, prof.sync.exclude)
    _, started, rid, plan = actions.new_run(prof, out, project, name=name, key=script_rel, env=env, seed=seed,
                                            clock=clock)
    argv = core.job_argv(script_rel, args, prof.python, shebang=core.read_shebang(project / script_rel))
    remote_dir = prof.remote_dir_for(project)
    remote = None
    if not dry_run or remote_dir.startswith("~"):
        remote = connect(prof, out)
    try:
        node = LoginNode(remote) if remote is not None else None
        project_dir = node.absolute(remote_dir) if node else remote_dir.rstrip("/")
        run_dir = f"{project_dir}/{core_runs_subdir()}/{rid}"
        job = batch_job(prof, run_id=rid, run_dir=run_dir, project_dir=project_dir, argv=argv, plan=plan,
                        nodes=nodes, launcher=launcher, nproc=nproc, master_port=master_port, exclude=exclude,
                        name=None, checkpoints=checkpoints, recover=recover)
        text = batch.batch_script(job)
        sbatch = batch.sbatch_argv(job.script_path, extra=("--open-mode=append",))
        if dry_run:
            return {"run_id": rid, "profile": prof.name, "dry_run": True, "batch_script": text, "sbatch": sbatch,
                    "remote_run_dir": run_dir}
        if sync:
            from ..transfer.sync import sync_project

            out.step(f"syncing {project.name}/ to {prof.name}:{remote_dir} (the shared folder)")
            sync_project(prof, remote, out, project)
        out.info(f"environment for {rid}:")
        for line in plan.lines():
            out.info("  " + line)
        meta = core.build_meta(run_id=rid, script=script_rel, args=args, argv=argv, profile=prof, plan=plan,
                               remote_dir=project_dir, remote_run_dir=run_dir, git=core.git_info(project), seed=seed,
                               started=started, name=name)
        meta["slurm"] = {"nodes": job.nodes, "gpus_per_node": job.gpus_per_node, "launcher": job.launcher,
                         "partition": job.partition, "time": job.time, "log": job.log_path,
                         "price_per_gpu_hour": prof.slurm.price_per_gpu_hour, "checkpoints": job.checkpoints,
                         "recover": recover}
        if force and judged.refusals:  # what --force went past, recorded as a host's run records it
            meta["forced"] = [p for p, _ in judged.refusals]
        out.step(f"submitting {rid} to Slurm: {job.nodes} node(s), {job.launcher}")
        files = {batch.SCRIPT_NAME: text, "meta.json": json.dumps(meta)}
        if job.checkpoints:  # what a requeued attempt runs to choose its checkpoint (slurm/resume.py)
            from ..knowledge import load_playbook

            files[resume.JUDGE_NAME] = resume.judge_script(load_playbook("checkpoints", project))
        job_id = node.submit(run_dir=run_dir, files=files,
                             secrets=plan.secrets, sbatch=sbatch, project_dir=project_dir, script_rel=script_rel)
    finally:
        if remote is not None:
            remote.close()
    meta["slurm"]["job_id"] = job_id
    meta["slurm"]["log"] = job.log_path.replace("%j", job_id)
    meta["remote_run_path"] = run_dir
    record = core.save_local(meta, project)
    return {"run_id": rid, "profile": prof.name, "job_id": job_id, "remote_run_dir": run_dir,
            "log": meta["slurm"]["log"], "local_record": str(record), "secrets": sorted(plan.secrets),
            "next": [f"gpuops status {rid}", f"gpuops logs -f {rid}", f"gpuops stop {rid}"]}


def core_runs_subdir() -> str:
    from ..jobs.scripts import RUNS_SUBDIR

    return RUNS_SUBDIR


# -- status ----------------------------------------------------------------------------------------------------------
def job_id_of(meta: dict) -> Optional[str]:
    return str((meta.get("slurm") or {}).get("job_id") or "") or None


def status(prof, out, project: Path, run: Optional[str] = None, *, now: Optional[float] = None) -> dict:
    """The profile's runs (or RUN alone) with Slurm's word on each; what `status --json` prints (a `slurm` object per
    run). A run whose end was judged is read from runs/<id>/state.json (Slurm forgets a job MinJobAge after its end
    when the cluster keeps no accounting)."""
    from ..jobs import actions

    metas = [actions.resolve(run, prof, project)] if run else core.local_runs(prof.name, project)
    metas = [m for m in metas if job_id_of(m)]
    saved = {m["run_id"]: core.local_state(m["run_id"], project) or {} for m in metas}
    live = [m for m in metas if not saved[m["run_id"]].get("final")]
    g, elsewhere = None, []
    if live or not run:  # without RUN: the runs folder on the shared filesystem too (runs submitted elsewhere)
        remote = connect(prof, out)
        try:
            node = LoginNode(remote)
            listing = None if run else f"{prof.remote_dir_for(project).rstrip('/')}/{core_runs_subdir()}"
            g = node.gather([job_id_of(m) for m in live], runs=[m["remote_run_dir"] for m in live],
                            files=(batch.ATTEMPTS_FILE, STOP_FILE, resume.RESUMES_FILE), tail=LOG_TAIL, sinfo=True,
                            listing=listing)
            elsewhere = _elsewhere(node, listing, g.found, {m["run_id"] for m in metas})
        finally:
            remote.close()
    rows = [judge(prof, project, m, g, saved[m["run_id"]], now=now) for m in metas]
    rows += [judge(prof, project, m, g2, {}, now=now) for m, g2 in elsewhere]
    keep = [(r, off) for r, m in zip(rows, metas) for off in [runstate.to_keep_off(r, m, g)] if off]
    if keep:  # --recover: a requeued job waiting to start again is kept off the nodes that failed it
        _keep_off(prof, out, keep)
    rows.sort(key=lambda r: (r["started"] or 0, r["run_id"]), reverse=True)
    from ..profiles import model as profiles

    profiles.remember(prof, project)
    return {"profile": prof.name, "runs": rows, "gpus": None, "gpu_error": None, "host_signals": []}


def _elsewhere(node: LoginNode, listing: Optional[str], found: list, known: set) -> list:
    """The runs of the shared runs folder not recorded here (submitted from another machine or project copy): their
    meta.json read and their jobs asked, in a second execution; [(meta, Gathered)]."""
    others = [(rid, jid) for rid, jid in found if rid not in known]
    if not listing or not others:
        return []
    dirs = [f"{listing}/{rid}" for rid, _ in others]
    g = node.gather([jid for _, jid in others], runs=dirs, files=("meta.json", batch.ATTEMPTS_FILE, STOP_FILE,
                                                                 resume.RESUMES_FILE),
                    tail=LOG_TAIL, sinfo=True)
    out = []
    for (rid, jid), d in zip(others, dirs):
        m = runstate.read_json(g.files.get((d, "meta.json"))) or {}
        out.append(({**m, "run_id": rid, "remote_run_dir": d, "slurm": {**(m.get("slurm") or {}), "job_id": jid}},
                    g))
    return out


def judge(prof, project: Path, meta: dict, g, saved: dict, *, now: Optional[float] = None) -> dict:
    """One run's status row (and its state.json once ended)."""
    from ..jobs import endings as en

    rid, job_id = meta["run_id"], job_id_of(meta)
    if saved.get("final") or g is None:
        return _row(meta, saved.get("state", core.LOST), saved.get("slurm"), saved.get("ending"))
    d = meta["remote_run_dir"]
    sc = g.scontrol.get(job_id, "")
    q = runstate.queue_job(job_id, g.squeue, g.squeue_json, sc)
    ending = runstate.ending_of(job_id, sc, g.sacct)
    stopped = runstate.read_json(g.files.get((d, STOP_FILE)))
    s = meta.get("slurm") or {}
    doc = runstate.slurm_doc(job_id=job_id, q=q, ending=ending, attempts=runstate.attempts_of(
        g.files.get((d, batch.ATTEMPTS_FILE))), gpus=runstate.job_gpus(sc, q, int(s.get("gpus_per_node") or 0)),
        price=prof.slurm.price_per_gpu_hour, reasons=_reasons(project), now=now, accounting=g.accounting)
    doc["failed_nodes"] = runstate.failed_nodes(doc, ending, g.sinfo)
    doc["resumes"] = resume.parse_resumes(g.files.get((d, resume.RESUMES_FILE)))
    doc["checkpoints"] = s.get("checkpoints")
    slurm_state = ending.state if ending else (q.state if q else None)
    if slurm_state is None and saved.get("slurm"):  # forgotten since the last look: what was seen then
        return _row(meta, saved.get("state", core.LOST), saved.get("slurm"), saved.get("ending"))
    state = runstate.gpuops_state(slurm_state, ending, bool(stopped))
    verdict = None
    if ending is not None:
        verdict = runstate.classify(rid, ending, g.tails.get(d) or [], stopped, en.load(project), en.xid_table(project))
        _save(project, rid, state, doc, verdict)
    return _row(meta, state, doc, verdict)


def _keep_off(prof, out, keep: list) -> None:
    """`scontrol update JobId=X ExcNodeList=...` for each (row, nodes): Slurm accepts it while the job is pending
    (a running job's allocation is fixed), so it is done when status sees the requeued job waiting. Said, and in
    the row's `slurm.kept_off`."""
    remote = connect(prof, out)
    try:
        node = LoginNode(remote)
        for row, nodes in keep:
            s = row["slurm"]
            res = node.run(runstate.keep_off_argv(s["job_id"], nodes))
            if res.ok:
                s["kept_off"] = nodes
                out.info(f"{row['run_id']}: Slurm job {s['job_id']} kept off {','.join(nodes)} for its next attempt "
                         "(a node that failed it; --recover)")
            else:
                out.warn(f"{row['run_id']}: could not keep Slurm job {s['job_id']} off {','.join(nodes)}: "
                         f"{(res.stderr or res.stdout).strip()[:200]}")
    finally:
        remote.close()


def _reasons(project: Path) -> dict:
    from .reasons import load_reasons

    return load_reasons(project)


def _row(meta: dict, state: str, slurm: Optional[dict], ending: Optional[dict]) -> dict:
    s = slurm or {}
    exit_code = s.get("exit_code")
    if state == core.SUCCEEDED:
        exit_code = 0
    started = meta.get("started_ts")
    return {"run_id": meta["run_id"], "script": meta.get("script"), "state": state, "exit_code": exit_code,
            "started": started, "elapsed": s.get("elapsed_s"), "pid": None, "stopped": None, "cost": s.get("cost"),
            "ending": ending, "slurm": slurm}


def _save(project: Path, rid: str, state: str, slurm: dict, ending: Optional[dict]) -> None:
    """runs/<id>/state.json of an ended job: final, so a later status does not ask Slurm (which forgets it)."""
    from ..paths import write_atomic

    d = core.registry_dir(project) / rid
    if d.is_dir():
        doc = {"run_id": rid, "state": state, "exit_code": slurm.get("exit_code"), "slurm": slurm, "ending": ending,
               "final": True, "elapsed": slurm.get("elapsed_s")}
        write_atomic(d / "state.json", json.dumps(doc, indent=1) + "\n")


# -- logs ------------------------------------------------------------------------------------------------------------
def log_path(meta: dict) -> str:
    s = meta.get("slurm") or {}
    if s.get("log"):
        return s["log"]
    job_id = job_id_of(meta)
    if not job_id:
        raise UsageError(f"run {meta['run_id']} has no Slurm job recorded")
    return f"{meta['remote_run_dir'].rstrip('/')}/{batch.LOG_NAME.replace('%j', job_id)}"


def tail(prof, out, meta: dict, lines: int, write: Callable[[bytes], None]) -> None:
    """The last N lines of the job's log on the shared folder, read through the login node (raw bytes)."""
    import shlex

    from ..remote.shell import shell_path

    remote = connect(prof, out)
    try:
        P = shell_path(log_path(meta))
        res = remote.run(f"[ -f {P} ] || exit 3; tail -n {int(lines)} {P}", timeout=60)
        state = LoginNode(remote).queue_state(job_id_of(meta)) if res.rc == 3 else None
    finally:
        remote.close()
    if res.rc == 3:
        if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"):  # not started: nothing written yet
            out.info(f"run {meta['run_id']}: no log yet: Slurm job {job_id_of(meta)} is {state.lower()} "
                     f"(gpuops status {shlex.quote(meta['run_id'])} says why)")
            return
        raise RemoteError(f"run {meta['run_id']}: no log at {log_path(meta)} (Slurm job {job_id_of(meta)}: "
                          f"{state or 'no longer known to Slurm'})")
    write(res.stdout.encode("utf-8", "surrogateescape"))


def follow(prof, out, meta: dict, lines: int, write: Callable[[bytes], None], *,
           on_state: Callable[[str, Optional[str]], None] = lambda s, r: None, every: float = FOLLOW_EVERY,
           sleep: Callable[[float], None] = time.sleep, gpus_every: Optional[float] = None,
           on_gpus: Callable[[dict], None] = lambda g: None) -> dict:
    """`logs -f`: the last N lines, then the log as it grows, until Slurm says the job has ended and the log has been
    read to its end. on_state(state, reason) at each change of Slurm's state; while it runs, every `gpus_every`
    seconds (None: never), on_gpus({node: [GPU dicts or {"error"}]}) from a step in the job's own allocation
    (LoginNode.job_gpus). Returns {"state", "exit_code", "code"}: code 0 when the job completed with exit 0, else 1."""
    from . import states

    path, job_id = log_path(meta), job_id_of(meta)
    remote = connect(prof, out)
    try:
        node = LoginNode(remote)
        size, _ = node.read_from(path, 0, 0)
        offset = 0
        if size is not None and lines is not None:
            offset = _tail_offset(node, path, lines, size)
        seen, rec, sampled = None, None, 0.0
        while True:
            res = node.run(states.scontrol_job_argv(job_id))
            recs = states.parse_scontrol(res.stdout) if res.ok else []
            rec = recs[0] if recs else None
            state = (rec.get("JobState") or "").upper() if rec else None
            if state != seen:
                on_state(state or "UNKNOWN", rec.get("Reason") if rec else None)
                seen = state
            ended = state is None or state in states.ENDED
            while True:
                size, data = node.read_from(path, offset)
                if data:
                    write(data)
                    offset += len(data)
                if not data or size is None or offset >= size:
                    break
            if ended:
                break
            if gpus_every is not None and state == "RUNNING" and time.monotonic() - sampled >= gpus_every:
                sampled = time.monotonic()
                on_gpus(_gpus(node.job_gpus(job_id, int((rec or {}).get("NumNodes", "1").split("-")[0] or 1))))
            sleep(every)
    finally:
        remote.close()
    ending = states.ending_from_scontrol(rec, job_id) if rec else None
    ok = ending is not None and ending.state == "COMPLETED" and not ending.exit_code
    return {"state": ending.state if ending else None, "exit_code": ending.exit_code if ending else None,
            "code": 0 if ok else 1}


def _gpus(lines: dict) -> dict:
    """{node: [nvidia-smi lines]} -> {node: [GPU dicts (jobs.watch.parse_gpu), or {"error": text}]}."""
    from ..jobs.watch import parse_gpu

    return {n: [parse_gpu(x) or {"error": x.strip()} for x in xs if x.strip()] for n, xs in sorted(lines.items())}


def _tail_offset(node: LoginNode, path: str, lines: int, size: int) -> int:
    """Where the last `lines` lines of the file start."""
    import shlex

    from ..remote.shell import shell_path

    res = node.remote.run(f"tail -n {int(lines)} {shell_path(path)} | wc -c", timeout=60)
    try:
        return max(0, size - int(res.stdout.strip()))
    except ValueError:
        raise RemoteError(f"could not read {shlex.quote(path)}") from None


# -- stop ------------------------------------------------------------------------------------------------------------
def stop(prof, out, project: Path, meta: dict, grace: float) -> dict:
    """scancel, polite first (LoginNode.cancel); stop.json in the run folder says gpuops stopped it (its ending is
    then `stopped`, not someone else's cancel). Returns what `stop --json` prints."""
    rid, job_id = meta["run_id"], job_id_of(meta)
    if not job_id:
        raise UsageError(f"run {rid} has no Slurm job recorded")
    remote = connect(prof, out)
    try:
        node = LoginNode(remote)
        stop_doc = {"by": "gpuops stop", "signal": "TERM", "at": time.time(), "scheduler": "slurm", "job_id": job_id}
        path = f"{meta['remote_run_dir'].rstrip('/')}/{STOP_FILE}"
        state = node.queue_state(job_id)
        if state is not None and state not in ENDED:
            node.write_file(path, json.dumps(stop_doc))
        how, last = node.cancel(job_id, grace, on_stopping=lambda: out.step(
            f"stopping {rid} (Slurm job {job_id}): scancel --signal=TERM, then scancel after {grace:g}s"))
        if how == "KILL":
            node.write_file(path, json.dumps({**stop_doc, "signal": "KILL"}))
    finally:
        remote.close()
    state = core.STOPPED if how in ("TERM", "KILL", "pending") else (runstate.gpuops_state(last, None, False)
                                                                     if last else core.LOST)
    return {"run_id": rid, "result": how, "state": state, "exit_code": None, "job_id": job_id, "slurm_state": last}


# -- the local plan on a cluster -----------------------------------------------------------------------------------
def cluster_plan(prof, project: Path, script: str, settings=None, *, image: Optional[str] = None,
                 resolve: bool = True, timeout_s: float = 20.0, run=None):
    """The local plan (project/plan.py) of a job on the profile's cluster, as `plan --from` and `train` build it:
    judged against the nodes as the newest `gpuops verify` of the profile saved here found them (node_image.py),
    their differences said as warnings; with no such verify, against the image a launch boots, said as a warning
    (never a refusal). image: an images.yaml family to judge against instead (`plan --image`)."""
    from .. import knowledge as kb
    from ..project import plan as pp
    from .node_image import images_doc, no_verify_warning, node_image

    settings = settings if settings is not None else pp.Settings.of_profile(prof)
    nodes = None if image else node_image(project, prof.name)
    if nodes is None:
        plan = pp.local_plan(project, script, settings, image=image or "launched", resolve=resolve,
                             timeout_s=timeout_s, run=run)
        if not image:  # the nodes are not that image: what its packages decide is said, never refused on
            plan.warnings[:0] = [no_verify_warning(prof.name, plan.image)] + [
                f"{p} (judged against {plan.image}, not the nodes: not refused; {f})" for p, f in plan.refusals]
            plan.refusals = []
        return plan
    from ..project.resolution import resolve as resolver

    plan = pp.build(project, script, image=nodes.image, settings=settings, tables=pp.tables(project),
                    images_doc=images_doc(kb.load_playbook("images", project), nodes.image),
                    resolver=resolver if resolve else None, timeout_s=timeout_s, run=run)
    plan.warnings[:0] = nodes.warnings
    if not nodes.complete and any(m.status == "missing" for m in plan.modules) and plan.refusals:
        plan.hints.append(f"the nodes' packages are those an older `gpuops verify` measured on "
                          f"{', '.join(nodes.nodes)} ({', '.join(sorted(nodes.image.packages)) or 'none installed'}): "
                          f"run gpuops verify -p {prof.name} again, which lists every package the nodes' python has")
    return plan


def refuse_plan(prof, out, project: Path, script_rel: str, *, force: bool, done: str):
    """train's gate on a cluster, before anything is synced, written or submitted: the cluster's local plan said
    (its summary, warnings and hints) and its refusals enforced (project/verdict.py: one ChecksFailed, exit 1, each
    problem with its fix; --force passes what a resolution or a pin decides, never what no node can run)."""
    from ..project.verdict import enforce, report

    plan = cluster_plan(prof, project, script_rel)
    report(plan, out)
    enforce(plan, force=force, done=done, out=out)
    return plan


def snapshot_gpus(prof, out, meta: dict, nodes: int) -> dict:
    """`watch --once`: every node's GPUs of a running job, once ({node: [GPU dicts or {"error"}]})."""
    remote = connect(prof, out)
    try:
        return _gpus(LoginNode(remote).job_gpus(job_id_of(meta), nodes))
    finally:
        remote.close()
