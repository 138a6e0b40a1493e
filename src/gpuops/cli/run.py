"""`gpuops run`: one command from nothing to fetched checkpoints, paying only for the minutes that train.
Typer only at module level (`gpuops --help` stays fast)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import app, output
from .cloud import GpuOpt, MaxPriceOpt, TypeOpt, WaitForCapacityOpt
from .fs import fs_question


# the options of `gpuops run` whose help takes more than a line (the signature stays readable)
SCRIPT_OPT = typer.Option(None, "--script", "-s", help="Training script, relative to the project. "
                          "Refused before anything is launched when the launched image cannot run "
                          "it: requires-python its python misses, a poetry/pdm/conda project setup "
                          "cannot install, conda activate, Windows line endings, relative imports "
                          "(docs/run.md).")
REGION_OPT = typer.Option([], "--region", "-r", help="Region to try, in order (repeatable; default: "
                                                     "every region with capacity).")
FETCH_OPT = typer.Option(None, "--fetch", metavar="NAME[,NAME...]",
                         help="What to pull back, verified, before terminating: names of the "
                              "profile's fetch: map, or folders under the project (checkpoints,"
                              "outputs). Each lands in runs/<run id>/<name>, the run's own folder; "
                              "sync never uploads them. The job's log is always kept in "
                              "runs/<job id>/log. With --resume: added to what the run fetches.")
TTL_OPT = typer.Option(None, "--ttl", metavar="DURATION", help="Time to live of the instance "
                       "(`gpuops reap` ends it after; a tag on the instance), e.g. 8h (above 0, at "
                       "most 365d). Default: GPUOPS_RUN_TTL (the environment or ./.env), else 24h: "
                       "every run's instance has one, kept ones too.", show_default=False)
MAX_COST_OPT = typer.Option(None, "--max-cost", metavar="DOLLARS", min=0.01,
                            help="A budget, checked from the launch on: reached while booting or "
                                 "before the job starts, the run ends there; while training, the "
                                 "job is stopped and what exists fetched. Then terminated.",
                            show_default=False)
KEY_OPT = typer.Option(None, "--key", help="Private SSH key (default: ~/.ssh/id_ed25519).",
                       show_default=False)
NAME_OPT = typer.Option(None, "--name", help="Run name: letters, digits, '-', '_', '.' (default: the "
                                             "script's stem).")
NODES_OPT = typer.Option(1, "--nodes", min=1, max=64, help="Instances, all in one region: N > 1 launches a "
                                                            "fleet (gpuops up --nodes) and runs the job on every "
                                                            "node, fetching from node 0.")
LAUNCHER_OPT = typer.Option("auto", "--launcher", metavar="auto|none|torchrun|ray",
                            help="How the job starts across the nodes (gpuops train --launcher). auto: torchrun "
                                 "with --nodes above 1, the script itself on one node.")
NPROC_OPT = typer.Option("auto", "--nproc-per-node", metavar="auto|N",
                         help="torchrun processes per node (auto: the GPUs the preflight saw).")
RECOVER_OPT = typer.Option(None, "--recover", metavar="N", min=0, max=100,
                           help="Replace the instance up to N times (default 0: never) when it is "
                                "terminated or preempted, stays unreachable (--unreachable), or a GPU "
                                "fails (a hardware Xid, uncorrectable ECC errors): fetch what it "
                                "still has, terminate it, launch a new one, setup, verify, sync, push "
                                "the newest checkpoint fetched and verified, and start the job again "
                                "with its path in GPUOPS_RESUME_FROM. Each checkpoint is fetched as "
                                "it appears (the first --fetch name, or `checkpoints`). A fleet "
                                "(--nodes) is replaced whole when any node ends, the checkpoint "
                                "pushed to every node. With --resume: the run's new N.",
                           show_default=False)
UNREACHABLE_OPT = typer.Option(None, "--unreachable", metavar="DURATION",
                               help="How long the instance may stay unreachable while the API shows "
                                    "it running (default 5m): then it is replaced (--recover), else "
                                    "the run detaches.", show_default=False)
FROM_OPT = typer.Option(None, "--from", metavar="PROFILE",
                        help="Train with PROFILE's settings (python, expect, setup, env_preset, env, "
                             "secrets, fetch, sync) on the launched instances (gpuops up --from).",
                        show_default=False)
RESUME_OPT = typer.Option(False, "--resume", help="Continue a run whose local process ended (crash, laptop "
                                                  "closed, Ctrl-C): the newest unfinished one, or --id RUN. "
                                                  "--fetch, --keep, --max-cost, --recover and --force apply "
                                                  "to it; the options that describe a new run are refused. A "
                                                  "run whose process is still alive is refused (exit 2), "
                                                  "naming the process; a dead one's run is taken over.")
RUN_ID_OPT = typer.Option(None, "--id", metavar="RUN", help="With --resume: which run.",
                          show_default=False)
FS_OPT = typer.Option(None, "--fs", metavar="NAME", help="Attach Lambda filesystem NAME to every "
                      "instance (replacements too): only its region is tried; missing, it is created "
                      "after asking (--yes: at once). The job sees GPUOPS_FS; setup's caches live on "
                      "it (docs/fs.md).", show_default=False)
DATA_OPT = typer.Option(None, "--data", metavar="SOURCE", help="Data the job reads at GPUOPS_DATA: a "
                        "local folder (rsync'd; with --fs once onto the filesystem, later runs send "
                        "only what changed), https://...#sha256=HEX or hf://ORG/NAME "
                        "(hf://datasets/ORG/NAME; HF_TOKEN a secret): downloaded by the instance, "
                        "never through this machine (docs/fs.md).", show_default=False)
PREP_OPT = typer.Option(None, "--prep", metavar="CMD", help="A preparation run first, on its own "
                        "instance in the --fs filesystem's region (the cheapest type with capacity there, "
                        "or --prep-type): the project synced and set up as the job's, CMD run in it "
                        "(`python prepare.py`), what it writes under each --prep-out moved whole onto "
                        "the filesystem, its instance terminated; then the training instance, with "
                        "those paths linked where the job expects them. Kept: a later run with the "
                        "same command, files and outputs skips it; an edited script prepares again. "
                        "Needs --fs (docs/run.md).", show_default=False)
PREP_TYPE_OPT = typer.Option(None, "--prep-type", metavar="TYPE", help="The preparation's instance type "
                             "(default: the cheapest with capacity in the filesystem's region).",
                             show_default=False)
PREP_OUT_OPT = typer.Option([], "--prep-out", metavar="PATH", help="What the preparation writes that the job "
                            "reads (repeatable): a path in the project (data/train.bin, data) or under the "
                            "instance's home ('~/data'); kept on the filesystem, linked at that path on the "
                            "training instance.", show_default=False)
ENV_OPT = typer.Option([], "--env", "-e", metavar="NAME=VALUE",
                       help="For the job, as `gpuops train --env` takes it (repeatable; wins over the "
                            "preset and the profile; NAME= unsets NAME). Kept in a 0600 file beside the "
                            "run's record, never in the record itself. Put secrets in .env instead: a value "
                            "here is seen by ps and kept in your shell's history.", show_default=False)
SEED_OPT = typer.Option(None, "--seed", help="Export GPUOPS_SEED and PYTHONHASHSEED (gpuops train "
                                             "--seed); recorded.", show_default=False)
FORCE_OPT = typer.Option(False, "--force", help="Launch past what the launch gate refuses (gpuops train "
                                                "--force: a broken stack, a missing module, a GPU held by "
                                                "another process); recorded in the job's meta.json. With "
                                                "--resume: applies to a launch still to come.")
IDLE_OPT = typer.Option(None, "--idle", metavar="DURATION", help="Idle limit of each instance "
                        "(gpuops up --idle): no gpuops run and GPU utilisation under 5 % for this "
                        "long, then `gpuops reap` (or --guard) ends it.", show_default=False)
GUARD_OPT = typer.Option(None, "--guard", metavar="on-instance", help="on-instance: a watchdog on each "
                         "instance terminates it at its TTL/idle limit even with your laptop closed "
                         "(gpuops up --guard: puts your account-wide API key on the instance).",
                         show_default=False)
YES_OPT = typer.Option(False, "--yes", "-y", help="Do not ask before launching (the price), before a "
                                                  "large upload (over 500 MB, or far more than the code), nor "
                                                  "before creating --fs.")
NOTIFY_OPT = typer.Option(False, "--notify", help="When the run ends: a desktop notification (a terminal bell "
                                                  "where there is none) and the GPUOPS_NOTIFY_URL or notify_url "
                                                  "webhook (Slack, Discord): name, outcome, duration, cost.")


@app.command()
def run(
    type_: List[str] = TypeOpt,
    gpu: Optional[str] = GpuOpt,
    max_price: Optional[float] = MaxPriceOpt,
    wait_for_capacity: Optional[str] = WaitForCapacityOpt,
    script: Optional[str] = SCRIPT_OPT,
    region: List[str] = REGION_OPT,
    fetch: Optional[str] = FETCH_OPT,
    keep: bool = typer.Option(False, "--keep", help="Do not terminate at the end (gpuops down NAME later)."),
    ttl: Optional[str] = TTL_OPT,
    max_cost: Optional[float] = MAX_COST_OPT,
    key: Optional[Path] = KEY_OPT,
    name: Optional[str] = NAME_OPT,
    nodes: int = NODES_OPT,
    launcher: str = LAUNCHER_OPT,
    nproc: str = NPROC_OPT,
    recover: Optional[int] = RECOVER_OPT,
    unreachable: Optional[str] = UNREACHABLE_OPT,
    from_: Optional[str] = FROM_OPT,
    resume: bool = RESUME_OPT,
    run_id: Optional[str] = RUN_ID_OPT,
    fs: Optional[str] = FS_OPT,
    data: Optional[str] = DATA_OPT,
    prep: Optional[str] = PREP_OPT,
    prep_type: Optional[str] = PREP_TYPE_OPT,
    prep_out: List[str] = PREP_OUT_OPT,
    env: List[str] = ENV_OPT,
    seed: Optional[int] = SEED_OPT,
    force: bool = FORCE_OPT,
    idle: Optional[str] = IDLE_OPT,
    guard: Optional[str] = GUARD_OPT,
    yes: bool = YES_OPT,
    json_: bool = typer.Option(False, "--json", help="Print the closing summary as one JSON document."),
    notify: bool = NOTIFY_OPT,
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script, after --.", show_default=False),
) -> None:
    """up -> sync -> setup -> train -> watch -> fetch (verified) -> down, with the running cost on screen. The type:
    --type (several: tried in order) or --gpu NAME[:COUNT] (any type with that GPU, cheapest first), none above
    --max-price, as `gpuops up` takes them; the run's profile records the type it got. The instance is terminated when the job ends, fails or its launch is refused, and on a second Ctrl-C (the first one
    detaches); never before everything named in --fetch is here and verified. --nodes N: a fleet in one region,
    the job started on every node (torchrun by default), every node terminated at the end. SIGTERM and SIGHUP
    count as one Ctrl-C (the run detaches at once; during `up`, what was launched is terminated). --recover N: an
    instance that ends under the run, stays unreachable or whose GPU fails is replaced and the job resumed from the
    newest checkpoint fetched (GPUOPS_RESUME_FROM; docs/run.md shows a script that resumes). --prep CMD --prep-out
    PATH --fs NAME: the data preparation first, on the cheapest instance in the filesystem's region, its outputs kept
    on the filesystem and linked for the job (a later run with the same preparation skips it)."""
    import time

    from ..pipeline import runner as run_ops
    from ..pipeline import stages as pl
    from ..pipeline.summary import render_summary
    from ..cloud.instances import make_context
    from ..interrupts import as_interrupt

    out = output(json_)
    project = Path.cwd()
    fetch_names = [f.strip() for f in (fetch or "").split(",") if f.strip()]
    if resume:
        new_run = {"--type": type_, "--gpu": gpu, "--max-price": max_price is not None,
                   "--wait-for-capacity": wait_for_capacity, "--script": script, "--region": region, "--ttl": ttl, "--key": key,
                   "--name": name, "--nodes": nodes != 1, "--launcher": launcher != "auto",
                   "--nproc-per-node": nproc != "auto", "--from": from_, "--unreachable": unreachable, "ARGS": args,
                   "--env": env, "--seed": seed is not None, "--idle": idle, "--guard": guard, "--fs": fs, "--data": data,
                   "--prep": prep, "--prep-type": prep_type, "--prep-out": prep_out}
        rec, lock = _resumed(out, project, run_id, new_run, fetch=fetch_names, keep=keep, max_cost=max_cost,
                             recover=recover, force=force)
    else:
        rec = _new_run(out, project, types=type_, gpu=gpu, max_price=max_price, wait_for_capacity=wait_for_capacity,
                       script=script, region=region, fetch=fetch_names, keep=keep, ttl=ttl, max_cost=max_cost, key=key,
                       name=name, nodes=nodes, launcher=launcher, nproc=nproc, from_=from_, args=args,
                       recover=recover or 0, unreachable=unreachable, fs=fs, data=data, env=env, seed=seed,
                       force=force, idle=idle, guard=guard, confirm=_confirmer(yes),
                       prep={"command": prep, "type": prep_type, "outs": prep_out} if prep or prep_type or prep_out
                       else None)
        lock = pl.RunLock(rec.id, project).acquire()  # held while this process runs it: one process per run

    runner = run_ops.Runner(rec, out, project, lambda: make_context(out, project_dir=project,
                                                                    with_key=rec.guard == "on-instance"),
                            confirm=_confirmer(yes), create_fs=fs_question(yes), env=None if resume else env,
                            data=None if resume else data)
    with lock, as_interrupt():
        code = runner.run()
        doc = render_summary(out, runner.rec, runner.fetched, time.time())
    if notify:
        _notify(out, runner.rec, doc, project)
    raise typer.Exit(code)


def _notify(out, rec, doc: dict, project: Path) -> None:
    """--notify: the summary's outcome, time and cost; the webhook from GPUOPS_NOTIFY_URL or the run's profile."""
    from ..notify import notify as say
    from ..profiles import model as profiles

    try:
        prof = profiles.resolve(rec.profile, project)
    except Exception:  # noqa: BLE001 - no profile (never launched, pruned): the environment's URL only
        prof = None
    say(out, name=rec.id, outcome=rec.outcome, cost=doc.get("total_cost"), profile=prof,
        seconds=sum(r.get("seconds") or 0 for r in doc.get("stages") or []) or None)


def _resumed(out, project: Path, run_id: Optional[str], new_run: dict, *, fetch: list, keep: bool,
             max_cost: Optional[float], recover: Optional[int], force: bool = False):
    """--resume: the recorded run (the newest unfinished one, or --id), amended by the options a resume takes."""
    from ..errors import UsageError
    from ..pipeline import runner as run_ops
    from ..pipeline import stages as pl

    given = [k for k, v in new_run.items() if v]
    if given:
        raise UsageError(f"--resume continues the run as it was recorded; {', '.join(given)} describe a new run",
                         hint="with --resume only --id, --fetch, --keep, --max-cost, --recover, --force, --yes and "
                              "--json apply")
    rec = pl.find(project, run_id)
    if rec is None:
        raise UsageError("no unfinished run to resume here" + (f" named {run_id!r}" if run_id else ""),
                         hint=f"records are in {pl.records_dir(project)}")
    lock = pl.RunLock(rec.id, project).acquire(rec.profile)  # a live process of this run: refused (exit 2)
    rec = pl.find(project, rec.id) or rec  # as that process last left it
    run_ops.amend_for_resume(rec, fetch=fetch, keep=keep, max_cost=max_cost, recover=recover, force=force)
    out.info(f"resuming run {rec.id} at stage '{pl.next_stage(rec) or 'summary'}'")
    rec.outcome = pl.RUNNING
    return rec, lock


def _new_run(out, project: Path, *, types: list, gpu: Optional[str], max_price: Optional[float],
             wait_for_capacity: Optional[str], script: Optional[str], region: list, fetch: list, keep: bool,
             ttl: Optional[str], max_cost: Optional[float], key: Optional[Path], name: Optional[str], nodes: int,
             launcher: str, nproc: str, from_: Optional[str], args: Optional[list], recover: int = 0,
             unreachable: Optional[str] = None, fs: Optional[str] = None, data: Optional[str] = None,
             env: Optional[list] = None, seed: Optional[int] = None, force: bool = False, idle: Optional[str] = None,
             guard: Optional[str] = None, confirm=None, prep: Optional[dict] = None):
    """A new run's record, every option checked (and a --from template read) before anything is launched; what the
    sync will send said (and a large upload asked with `confirm`) before the record is written."""
    from ..cloud import decisions as d
    from ..cloud.managed import template_for
    from ..errors import UsageError
    from ..jobs.launchers import LAUNCHERS
    from ..jobs.envplan import parse_env_args
    from ..jobs.plan import script_path
    from ..pipeline import prelaunch
    from ..pipeline import runner as run_ops
    from ..pipeline import stages as pl
    from ..pipeline.bringup import run_template

    if prep is not None:  # --prep without --fs: nowhere to keep what it writes (said before anything else)
        from ..pipeline.prepplan import check_outs, refuse_runs_inside_outs, refuse_without_fs

        refuse_without_fs(prep["command"], fs, prep["type"], prep["outs"])
        prep = {**prep, "outs": check_outs(prep["outs"])}
        refuse_runs_inside_outs(prep["command"], prep["outs"], project)
    if not script:
        raise UsageError("--script is needed, with --type or --gpu (or --resume)")
    d.want_from(types=types, gpu=gpu, max_price=max_price, regions=region, project_dir=project)  # checked up front
    wait_s = d.parse_duration(wait_for_capacity) if wait_for_capacity else 0.0
    if launcher == "auto":
        launcher = "torchrun" if nodes > 1 else "none"
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r}: choose one of auto, {', '.join(LAUNCHERS)}")
    if nproc != "auto" and not (nproc.isdigit() and int(nproc) > 0):
        raise UsageError(f"--nproc-per-node {nproc!r}: 'auto' or a whole number above 0")
    if guard not in (None, "on-instance"):
        raise UsageError(f"--guard {guard!r}: the only guard is 'on-instance'")
    env_names = list(parse_env_args(env))  # NAME=VALUE checked as train checks it, before anything is written
    idle_s = d.parse_limit(idle, "--idle") if idle is not None else None
    script = script_path(script, project, must_exist=True)
    if fs:
        from ..cloud.filesystems import check_name

        check_name(fs)
    if data:
        from ..transfer.dataplan import parse

        parse(data, project)  # checked before anything is launched
    from ..cloud.keys import require_key

    require_key((key or Path("~/.ssh/id_ed25519")).expanduser(), given=key is not None)
    from ..pipeline.money import run_ttl
    from ..profiles.model import environment

    ttl_s, ttl_said = run_ttl(ttl, environment(project))
    template, note = run_template(template_for(from_, project), from_)
    if note:
        out.info(note)
    plan = prelaunch.check(project, script, out, template, force=force,  # refused before anything bills
                           run=prelaunch.run_options(project, args, prep, data))
    _before_launch(out, project, script, template, confirm, data)
    out.info(ttl_said)
    rec = run_ops.new_record(types=types, gpu=gpu, max_price=max_price, wait_for_capacity_s=wait_s, script=script,
                              args=args or [], regions=region, nodes=nodes, fetch=fetch, keep=keep,
                              ttl_s=ttl_s, max_cost=max_cost,
                              key=(key or Path("~/.ssh/id_ed25519")).expanduser(), name=pl.run_name(name, script),
                              launcher=launcher, nproc=nproc, template=template, recover=recover,
                              unreachable_s=d.parse_limit(unreachable, "--unreachable") if unreachable else None,
                              file_systems=[fs] if fs else [], data=_shown_data(data, project), seed=seed,
                              env_names=env_names,
                              force=force, idle_s=idle_s, guard=guard, project=project, prep=prep)
    rec.plan = plan  # the local plan travels with the run (what setup installs; the summary's --json)
    return rec


def _shown_data(data: Optional[str], project: Path) -> Optional[str]:
    """--data as the run's record keeps it: a URL's credentials as **** (the URL itself waits in a 0600 file beside
    the record: Runner, issue #36)."""
    if not data:
        return data
    from ..transfer.dataplan import parse

    src = parse(data, project)
    return f"{src.shown}#sha256={src.sha256}" if src.kind == "url" else data


def _before_launch(out, project: Path, script: str, template: Optional[dict], confirm,
                   data: Optional[str] = None) -> None:
    """Said before anything bills: the files the script names that the sync leaves out, symlinks pointing outside
    the project, a large upload (asked unless --yes). The run's profile takes its sync: settings from --from; a
    --data folder inside the project is not part of the project's upload."""
    from ..profiles.model import SyncSettings
    from ..transfer.sync import local_preview

    sync = SyncSettings.model_validate((template or {}).get("sync") or {})
    data_exclude = None
    if data:
        from ..transfer.dataplan import parse, project_exclude

        data_exclude = project_exclude(parse(data, project), project)
    local_preview(out, project, script, list(sync.exclude), copy_links=sync.copy_links, confirm=confirm,
                  data_exclude=data_exclude)  # a file in it the script names: the plan says where the job finds it


def _confirmer(yes: bool):
    """The questions before a launch (the price, a large upload): asked at a terminal, answered yes with --yes or
    without one."""
    from .app import confirmer

    return confirmer(yes)
