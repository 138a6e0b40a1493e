"""`gpuops run --prep CMD`'s stage (a mixin of the Runner), first, before the training instance exists: the
preparation on its own instance in the filesystem's region (the cheapest type with capacity there, or --prep-type),
the project synced and set up as the job's, the command run as a job (watched, its log kept), its outputs moved whole
onto the filesystem (pipeline/prepplan.py: the folder, the marker written last), then its instance terminated, always:
when the preparation ends, fails, reaches --max-cost, or is interrupted (Ctrl-C, SIGTERM, SIGHUP). A preparation
found complete (this machine saw it so, or the filesystem's marker says so) is kept, not run again.

The training instance sees the outputs where the job expects them: `_link_prep` (called by the train stage, on every
node) checks the marker and links each path into the project, as checkpoints are linked (pipeline/checkpoints.py)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Optional

from ..errors import GpuopsError
from .stops import BudgetReached
from . import prepplan as pp, stages as pl


class PrepFailed(Exception):
    """The preparation did not complete: why (said, in the record and the summary), its log's last lines, and what
    its command died of when it ran (jobs/endings.py's verdict: cause, title, evidence, fix, source)."""

    def __init__(self, why: str, lines: Optional[list] = None, ending: Optional[dict] = None):
        super().__init__(why)
        self.why, self.lines, self.ending = why, lines or [], ending


class PrepStage:
    """The prep stage of the Runner (pipeline/runner.py): self.rec.prep, self.out, self.project, self.ctx_factory."""

    # -- the record ----------------------------------------------------------------------------------------------
    def _prep_end(self, ok: bool, detail: str, *, interrupted: bool = False) -> None:
        p = self.rec.prep
        p["stage"].update(ended=self.seams.clock(), ok=ok, detail=detail)
        p["interrupted"] = interrupted
        pl.save(self.rec, self.project)

    def _prep_say(self, text: str) -> None:
        self.out.step(f"[prep] {text} (${pl.spend(self.rec, self.seams.clock()):.2f} so far)")

    def _prep_instance(self) -> Optional[dict]:
        insts = self.rec.prep.setdefault("instances", [])
        return insts[-1] if insts and insts[-1].get("ended") is None else None

    # -- the stage -----------------------------------------------------------------------------------------------
    def stage_prep(self) -> None:
        rec, p = self.rec, self.rec.prep
        again = pp.stage(p).get("started") is not None
        p["stage"] = {"started": pp.stage(p).get("started") or self.seams.clock(), "ended": None, "ok": None,
                      "detail": None}
        p.update(pp.plan(p["command"], p["outs"], self.project), filesystem=rec.file_systems[0], interrupted=False)
        for k in ("state", "why", "last_lines", "exit_code", "outputs"):
            p.pop(k, None)
        if rec.ttl_s and rec.ttl_deadline is None:  # the run's TTL: the preparation's instance carries it too
            rec.ttl_deadline = self.seams.clock() + rec.ttl_s
        pl.save(rec, self.project)
        self._prep_say(f"preparation `{p['command']}` -> {', '.join(p['outs'])} (folder {p['folder']} on "
                       f"filesystem {p['filesystem']})")
        ctx = self.ctx_factory()
        try:
            with ctx.client:
                if again:  # resumed: an instance an earlier attempt left is terminated first (counted)
                    self._prep_reclaim(ctx)
                if self._prep_known_complete(ctx):
                    return
                res = self._prep_up(ctx, again)
            if res is None:
                return
            try:
                self._prep_on_instance(res)
            finally:
                if not self._prep_down():
                    self._prep_end(False, "its instance could not be terminated: STILL BILLING (gpuops down "
                                   f"{pp.profile_name(rec.id)} ends it)")
        except KeyboardInterrupt:
            from ..interrupts import received

            how = f" ({received()})" if received() else ""
            billing = [i for i in p.get("instances") or [] if i.get("ended") is None]
            self._prep_end(False, f"interrupted{how}: " + ("its instance is STILL BILLING" if billing else
                                                           "its instance is terminated"), interrupted=True)
            raise

    def prep_interrupted_text(self) -> str:
        """What the run says when it is interrupted during the preparation (the runner detaches after it)."""
        from ..interrupts import received

        rec = self.rec
        billing = [i for i in rec.prep.get("instances") or [] if i.get("ended") is None]
        money = (f"its instance {', '.join(i for b in billing for i in b.get('ids') or [])} is STILL BILLING: gpuops "
                 f"down {pp.profile_name(rec.id)}" if billing else "its instance is terminated: nothing bills")
        return (f"interrupted{f' ({received()})' if received() else ''} while preparing ({money}); no training "
                f"instance was launched. gpuops run --resume --id {rec.id} prepares again (a preparation complete on "
                "the filesystem is kept)")

    def _prep_known_complete(self, ctx) -> bool:
        """This machine saw this preparation complete on this filesystem (the same filesystem: its id): kept. The
        training instance checks its marker again before the job starts (`_link_prep`)."""
        from ..cloud import filesystems as fsd

        p = self.rec.prep
        f = pp.index_file(self.project, p["filesystem"], p["folder"])
        try:
            seen = json.loads(f.read_text())
        except (OSError, ValueError):
            return False
        fs = fsd.find(ctx.client.filesystems(), p["filesystem"])
        if fs is None or fs.id != seen.get("fs_id") or seen.get("key") != p["key"]:
            f.unlink(missing_ok=True)  # another filesystem of that name since: what was seen is not there
            return False
        p.update(state="kept", path=seen.get("path"), kept_since=seen.get("at"), kept_by=seen.get("run"),
                 outputs=seen.get("outputs"), verified=False)
        when = datetime.fromtimestamp(seen.get("at") or 0).strftime("%Y-%m-%d %H:%M")
        detail = (f"kept: `{p['command']}` is complete on filesystem {p['filesystem']} ({seen.get('path')}, since "
                  f"{when}, run {seen.get('run')}); not prepared again")
        self.out.info(f"preparation {detail} (its marker is checked on the training instance)")
        self._prep_end(True, detail)
        return True

    def _prep_reclaim(self, ctx) -> None:
        """An earlier attempt of this preparation whose process died: its instance (a profile written, or a bring-up
        cut off before) terminated and confirmed, its time counted."""
        from ..cloud.down import down
        from ..cloud.launch import reclaim_unwritten
        from ..cloud.managed import managed_profile

        name = pp.profile_name(self.rec.id)
        prof = managed_profile(name)
        ids = list(prof.cloud.instance_ids) if prof is not None and prof.cloud.state != "gone" else []
        if ids:
            self.out.warn(f"an earlier attempt of this preparation left instance {', '.join(ids)}: terminating it")
            down(name, ctx, project_dir=self.project)
        ids += reclaim_unwritten(ctx, name)
        for inst in self.rec.prep.get("instances") or []:
            if inst.get("ended") is None:
                inst.update(ended=self.seams.clock(), how="terminated by --resume (its run's process had died)")
        pl.save(self.rec, self.project)

    def _prep_types(self, ctx) -> tuple[list, Optional[str]]:
        """--prep-type, else the cheapest type with capacity in the filesystem's region (a filesystem still to
        create: the region the training's own types have capacity in). (types to try, region)."""
        from ..cloud import decisions as d
        from ..cloud import filesystems as fsd

        rec, p = self.rec, self.rec.prep
        if p.get("type"):
            return [p["type"]], None
        types = ctx.client.instance_types()
        fs = fsd.find(ctx.client.filesystems(), p["filesystem"])
        region = fs.region if fs is not None else None
        if region is None and rec.regions:
            region = rec.regions[0]
        if region is None:
            ask = pl.launch_ask(rec)
            try:
                want = d.want_from(types=ask["types"], gpu=ask["gpu"], max_price=ask["max_price"], regions=rec.regions,
                                   template=rec.template, project_dir=self.project)
                region = next((r for c in d.choose(types, want).candidates for r in c.regions), None)
            except GpuopsError:
                region = None
        cands = pp.cheapest_types(types, region)
        first = d.find_type(types, cands[0]) if cands else None
        if first is not None and (region is None or region in first.regions):
            cands = cands[:1]  # capacity there now: one type, one price asked
            self.out.info(f"preparation: the cheapest type with capacity in {region or 'any region'}: {first.type.name}"
                          f" (${first.type.price_per_hour:.2f}/h, {first.type.vcpus} vCPUs)")
        return cands, region

    def _prep_up(self, ctx, again: bool) -> Optional[dict]:
        """The preparation's instance launched (recorded in the ledger before the request, the run's TTL, the
        filesystem attached, --max-cost checked from the launch on). None: the stage ended (failed)."""
        from ..cloud.instances import UpSpec
        from ..cloud.up import up
        from .bringup import RUN_PYTHON, _use_env_python

        rec, p = self.rec, self.rec.prep
        name = pp.profile_name(rec.id)
        types, region = self._prep_types(ctx)

        def tick(info: dict) -> None:
            if info["phase"] == "capacity":
                return
            if self._prep_instance() is None:
                p["instances"].append({"started": self.seams.clock(), "price_per_hour": info["price_per_hour"],
                                       "ids": [], "type": None, "region": None, "ended": None})
                pl.save(rec, self.project)
            if pl.over_budget(rec, self.seams.clock()):
                raise BudgetReached(f"--max-cost ${rec.max_cost:.2f} reached while bringing the preparation's "
                                    "instance up")

        spec = UpSpec(name=name, types=types, key=Path(rec.key).expanduser() if rec.key else
                      Path("~/.ssh/id_ed25519").expanduser(), regions=[region] if region else list(rec.regions),
                      wait_for_capacity_s=rec.wait_for_capacity_s, file_systems=list(rec.file_systems),
                      ttl_s=pl.ttl_left(rec, self.seams.clock()), idle_s=rec.idle_s,
                      guard_on_instance=rec.guard == "on-instance", verify=False, confirm=self.confirm,
                      template=pp.template(rec.template), tick=tick, create_fs=self.create_fs)
        self._prep_say("launching the preparation's instance")
        try:
            res = up(spec, ctx)
        except KeyboardInterrupt:  # up terminated what it launched before re-raising
            self._prep_launch_ended("interrupted while bringing it up; terminated by the launch")
            raise
        except BudgetReached as exc:
            rec.stop_reason = exc.reason
            self._prep_launch_ended("terminated by the launch (--max-cost)")
            self.out.warn(f"{exc.reason}: its instance was terminated before anything ran; no training instance is "
                          "launched")
            self._prep_end(False, exc.reason)
            return None
        except GpuopsError as exc:
            launched = self._prep_launch_ended(f"launch failed ({exc.message}); terminated by the launch")
            if not launched and not again and not [r for r in ctx.ledger.records() if r.profile == name]:
                (pl.records_dir(self.project) / f"{rec.id}.json").unlink(missing_ok=True)
                self._env_file().unlink(missing_ok=True)
                self.out.info(f"nothing was launched: run {rec.id}'s record is removed")
                raise
            self.out.error(f"the preparation's instance could not be brought up: {exc.message}", exc.hint)
            self._prep_end(False, f"its instance could not be brought up: {exc.message}")
            return None
        inst = self._prep_instance() or {"started": self.seams.clock(), "ended": None}
        if inst not in p["instances"]:
            p["instances"].append(inst)
        inst.update(ids=[res["instance_id"]], type=res["instance_type"], region=res["region"],
                    price_per_hour=res["price_per_hour"])
        p["type_used"] = res["instance_type"]
        _use_env_python(Path(res["profile_file"]), RUN_PYTHON)
        pl.save(rec, self.project)
        return res

    def _prep_launch_ended(self, how: str) -> bool:
        """A bring-up that failed (up terminated what it launched): the instance's row ends. True if one billed."""
        inst = self._prep_instance()
        if inst is None:
            return False
        inst.update(ended=self.seams.clock(), how=how)
        pl.save(self.rec, self.project)
        return True

    def _prep_down(self) -> bool:
        """The preparation's instance terminated and confirmed, whatever happened on it; a termination that fails is
        said loudly (STILL BILLING, the command that ends it) and keeps the run from launching anything else (False)."""
        from ..cloud.down import down

        inst = self._prep_instance()
        if inst is None:
            return True
        name = pp.profile_name(self.rec.id)
        self._prep_say(f"terminating the preparation's instance {', '.join(inst.get('ids') or [])}")
        ctx = self.ctx_factory()
        try:
            with ctx.client:
                res = down(name, ctx, project_dir=self.project)
        except GpuopsError as exc:
            inst["how"] = f"could not be terminated ({exc.message}): STILL BILLING"
            self.rec.prep["billing"] = True
            pl.save(self.rec, self.project)
            self.out.error(f"could not terminate the preparation's instance {', '.join(inst.get('ids') or [])} "
                           f"({exc.message}): STILL BILLING ${inst.get('price_per_hour') or 0:.2f}/h"
                           f"{self._until()}", f"gpuops down {name} ends it; gpuops ls shows it")
            return False
        inst.update(ended=self.seams.clock(), how="terminated")
        self.rec.prep["billing"] = False
        pl.save(self.rec, self.project)
        return True

    # -- on the preparation's instance ---------------------------------------------------------------------------
    def _prep_on_instance(self, res: dict) -> None:
        """Already complete on the filesystem (another run made it)? Kept. Else sync, setup, the command, the move."""
        from ..profiles import model as profiles
        from ..remote.connection import connect

        rec, p = self.rec, self.rec.prep
        prof = profiles.resolve(pp.profile_name(rec.id), self.project)
        fss = prof.cloud.filesystems if prof.cloud is not None else []
        if not fss:
            raise PrepFailed("the preparation's instance has no filesystem attached")
        p["path"] = pp.folder(fss[0].mount_point, p["folder"])
        try:
            with connect(prof, announce=self.out.info) as remote:
                found = pp.parse_marker(remote.run(pp.status_command(p["path"]), timeout=60).stdout)
            if pp.complete(found, p["key"]):
                self._prep_complete_there(found, fss[0])
                return
            self._prep_sync_setup(prof)
            self._prep_run(prof)
            self._prep_move(prof, fss[0])
        except PrepFailed as exc:
            self._prep_failed(exc)
        except BudgetReached:
            rec.stop_reason = f"--max-cost ${rec.max_cost:.2f} reached"
            self.out.warn(f"{rec.stop_reason} while preparing: stopping the preparation; no training instance is "
                          "launched")
            self._prep_stop(prof)
            self._prep_failed(PrepFailed(f"stopped: {rec.stop_reason}"))
        except GpuopsError as exc:
            self._prep_failed(PrepFailed(exc.message + (f" ({exc.hint})" if exc.hint else "")))

    def _prep_complete_there(self, marker: dict, fs) -> None:
        p = self.rec.prep
        when = datetime.fromtimestamp(marker.get("at") or 0).strftime("%Y-%m-%d %H:%M")
        p.update(state="kept", kept_since=marker.get("at"), kept_by=marker.get("run"), verified=True)
        detail = (f"kept: `{p['command']}` was complete on filesystem {p['filesystem']} ({p['path']}, since {when}, "
                  f"run {marker.get('run')}); not prepared again")
        self.out.info(f"preparation {detail}")
        self._prep_remember(marker, fs)
        self._prep_end(True, detail)

    def _prep_sync_setup(self, prof) -> None:
        from ..remote.connection import connect
        from ..setup.apply import setup
        from ..transfer.sync import sync_project
        from . import checkpoints as ck

        rec, p = self.rec, self.rec.prep
        self._prep_say("sync")
        excludes = ck.sync_excludes(ck.names(rec.fetch, None)) + pp.sync_excludes(p["outs"])
        if rec.data:
            from ..transfer.dataplan import parse, project_exclude

            excludes += [x for x in [project_exclude(parse(rec.data, self.project), self.project)] if x]
        with connect(prof, announce=self.out.info) as remote:
            sync_project(prof, remote, self.out, self.project, excludes=excludes, preview=False)
        if rec.data:  # on the filesystem once: the training instance finds it there
            rec.data_path = self._put_data(prof, self.out, prof)
        self._prep_say("setup (the job's environment)")

        def on_plan(plan) -> None:
            for line in plan.lines():
                self.out.info(line)
            for note in plan.notes:
                self.out.warn(note)

        try:
            setup(prof, self.out, self.project, verify=False, on_plan=on_plan,
                  scripts=tuple((self.rec.plan or {}).get("script_blocks") or ()))
        except GpuopsError as exc:
            raise PrepFailed(f"setup failed: {exc.message}") from None

    def _prep_run(self, prof) -> None:
        """The command as a job (runs/<job id>/, its log followed to its end, printed as the job's is), --max-cost
        checked at each event; exit 0 or PrepFailed with its log's last lines."""
        from ..jobs import actions as lifecycle
        from ..jobs import plan as core
        from ..jobs import watch as w
        from ..jobs.command import run_command
        from .status import StatusLine, status_text

        rec, p = self.rec, self.rec.prep
        self._prep_say(f"running `{p['command']}`")
        env = self._job_env() + ([f"GPUOPS_DATA={rec.data_path}"] if rec.data_path else [])
        got = run_command(prof, self.out, self.project, command=p["command"], name="prep", env=env, seed=rec.seed)
        p["job"] = got["run_id"]
        env_dir = core.registry_dir(self.project) / got["run_id"] / "environment"
        p["environment"] = str(env_dir.relative_to(self.project)) if env_dir.is_dir() else None
        pl.save(rec, self.project)
        meta = lifecycle.resolve(p["job"], prof, self.project)
        dash = w.Dashboard(meta, price_per_hour=prof.price_per_hour, log_lines=15)
        status = StatusLine(self.out, lambda: status_text("preparing", dash.elapsed(),
                                                          pl.spend(rec, self.seams.clock()), dash.progress()))

        def on_event(ev: dict) -> None:
            if ev.get("type") == "log" and not self.out.json_mode:
                self.out.print(ev["line"])
            status.tick()
            if pl.over_budget(rec, self.seams.clock()):
                raise BudgetReached()

        with status:
            res = lifecycle.follow(prof, self.out, self.project, meta, dash, lines=5, samples=False,
                                   interval=self.seams.poll_s, on_event=on_event, give_up_after=rec.unreachable_s)
        if res["interrupted"]:
            raise KeyboardInterrupt
        info = res["info"]
        p["exit_code"] = info.exit_code if info is not None else None
        log = self._prep_log(prof, meta)
        if info is None or info.state != core.SUCCEEDED:
            what = (f"exited {info.exit_code}" if info is not None and info.exit_code is not None else
                    f"ended {info.state}" if info is not None else "was lost")
            lines = pp.last_lines(log)
            ending = res.get("ending") or self._prep_ending(info, log)
            said = ending["title"] if ending and ending["cause"] != "failed" else (lines[-1].strip() if lines else "")
            raise PrepFailed(f"the preparation {what}" + (f": {said}" if said else " (no output)"), lines, ending)

    def _prep_ending(self, info, log: str) -> Optional[dict]:
        """What the command died of, from its exit code and its fetched log, when the stream that saw the death
        judged nothing (it was cut): jobs/endings.py's classifier over those facts."""
        from ..jobs import endings
        from ..jobs.endfacts import TAIL_LINES, EndFacts

        if info is None:
            return None
        f = EndFacts(run_id=info.run_id, exit_code=info.exit_code, alive=info.alive, stopped=info.stopped,
                     started=info.started, ended=info.ended, log_tail=log.splitlines()[-TAIL_LINES:])
        return endings.classify(f, endings.load(self.project), endings.xid_table(self.project))

    def _prep_log(self, prof, meta: dict) -> str:
        """The preparation's whole log into runs/<job id>/log (before its instance goes); its text."""
        import os

        from ..jobs import actions as lifecycle
        from ..jobs import plan as core

        final = core.registry_dir(self.project) / meta["run_id"] / "log"
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(".log.partial")
        try:
            with open(tmp, "wb") as fh:
                lifecycle.tail(prof, self.out, self.project, meta, 10 ** 9, fh.write)
            os.replace(tmp, final)
        except GpuopsError as exc:
            self.out.warn(f"the preparation's log could not be fetched: {exc.message}")
            return ""
        self.rec.prep["log"] = str(final.relative_to(self.project))
        return final.read_text(encoding="utf-8", errors="replace")

    def _prep_move(self, prof, fs) -> None:
        """Exit 0: the outputs moved whole onto the filesystem, the marker written last (one execution)."""
        from ..remote.connection import connect

        rec, p = self.rec, self.rec.prep
        self._prep_say(f"moving {', '.join(p['outs'])} onto filesystem {p['filesystem']} ({p['path']})")
        st = pp.stage(p)
        inst = self._prep_instance() or {}
        marker = pp.make_marker(p, run=rec.id, job=p.get("job"), instance=(inst.get("ids") or [None])[0],
                                itype=inst.get("type"), at=self.seams.clock(),
                                seconds=self.seams.clock() - st["started"])
        stamp = datetime.fromtimestamp(self.seams.clock()).strftime("%Y%m%d-%H%M%S")
        with connect(prof, announce=self.out.info) as remote:
            r = remote.run(pp.move_command(prof.remote_dir_for(self.project), p["path"], p["outs"], marker, stamp),
                           timeout=6 * 3600)
        got = pp.parse_moved(r.stdout)
        if got["missing"]:
            raise PrepFailed(f"the preparation exited 0 but wrote no {got['missing']} (--prep-out): nothing was "
                             "kept", pp.last_lines(self._prep_log_text()))
        if got["already"] is not None:
            return self._prep_complete_there(got["already"], fs)
        if r.rc != 0 or got["moved"] is None:
            detail = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
            raise PrepFailed(f"moving the outputs onto the filesystem failed"
                             + (f" at {got['failed']}" if got["failed"] else "") + f": {detail}; the folder has no "
                             "marker, so it is not complete (the next run prepares again)")
        if got["set_aside"]:
            self.out.warn(f"{p['path']} was there without its marker (a cut-off earlier attempt): set aside as "
                          f"{p['path']}.incomplete-{stamp}")
        size, count = got["moved"]
        p.update(state="ran", verified=True, outputs={"bytes": size, "files": count})
        self._prep_remember(marker, fs)
        detail = (f"ran `{p['command']}` on {inst.get('type')} (exit 0): {', '.join(p['outs'])} ({count} files, "
                  f"{size} bytes) kept in {p['path']}")
        self.out.success(f"preparation {detail}")
        self._prep_end(True, detail)

    def _prep_log_text(self) -> str:
        log = self.rec.prep.get("log")
        try:
            return (self.project / log).read_text(encoding="utf-8", errors="replace") if log else ""
        except OSError:
            return ""

    def _prep_remember(self, marker: dict, fs) -> None:
        """This machine saw the preparation complete on this filesystem (its id): the next run skips it."""
        from ..paths import write_atomic

        p = self.rec.prep
        doc = {**marker, "fs": p["filesystem"], "fs_id": fs.id, "path": p.get("path"),
               "outputs": p.get("outputs"), "seen": self.seams.clock()}
        write_atomic(pp.index_file(self.project, p["filesystem"], p["folder"]), json.dumps(doc, indent=1) + "\n")

    def _prep_stop(self, prof) -> None:
        from ..jobs import actions as lifecycle

        job = self.rec.prep.get("job")
        if not job:
            return
        try:
            lifecycle.stop(prof, self.out, self.project, lifecycle.resolve(job, prof, self.project), grace=10.0)
        except GpuopsError as exc:
            self.out.warn(f"could not stop the preparation {job}: {exc.message} (its instance is terminated next)")

    def _prep_failed(self, exc: PrepFailed) -> None:
        """The run ends here: the cause (jobs/endings.py's verdict, as a training job's), its evidence and fix, and
        the log's last lines said; nothing else is launched."""
        from ..jobs.watchtext import ending_lines

        p = self.rec.prep
        p.update(state="failed", why=exc.why, last_lines=exc.lines or None, ending=exc.ending)
        cause = "".join("\n  " + line for line in ending_lines(exc.ending, fix=False))
        fix = (f"fix: {exc.ending['fix']}\n" if exc.ending and exc.ending.get("fix") else "")
        if exc.lines:
            self.out.error(f"the preparation failed: {exc.why}{cause}\nits log's last lines:\n" +
                           "\n".join("  | " + line for line in exc.lines),
                           f"{fix}then start gpuops run again (its log: {p.get('log') or 'not fetched'}); no "
                           "training instance was launched")
        else:
            self.out.error(f"the preparation failed: {exc.why}{cause}", f"{fix}no training instance was launched")
        self._prep_end(False, f"failed: {exc.why}")

    # -- on the training instance -------------------------------------------------------------------------------
    def _link_prep(self, prof) -> None:
        """Before the job starts, on every node: the preparation's marker checked on the filesystem, each output
        linked where the job expects it. A marker gone (the folder deleted or set aside since) fails the launch, and
        this machine forgets it had seen it complete (the next run prepares again)."""
        from ..remote.connection import connect

        p = self.rec.prep
        if not p or p.get("state") not in ("ran", "kept"):
            return
        mount = self._mount(prof)
        if mount is None:
            raise GpuopsError("the training instance has no filesystem attached: the preparation's outputs are there")
        path = pp.folder(mount, p["folder"])
        for i, node in enumerate(prof.nodes()):
            with connect(node, announce=self.out.info) as remote:
                r = remote.run(pp.link_command(node.remote_dir_for(self.project), path, p["outs"], p["key"]),
                               timeout=120)
            if "@incomplete" in r.stdout:
                pp.index_file(self.project, p["filesystem"], p["folder"]).unlink(missing_ok=True)
                raise GpuopsError(f"the preparation's outputs are not complete on filesystem {p['filesystem']}: "
                                  f"{path} has no marker for key {p['key']} (deleted or set aside since it was "
                                  "prepared)", hint="start gpuops run again: it prepares them (this machine no "
                                                    "longer takes them as kept)")
            if r.rc == 3:
                taken = next((ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("@taken ")), "?")
                raise GpuopsError(f"{taken} on host #{i} is a file or folder of its own: the preparation's output "
                                  "is linked at that path", hint="leave it out of the project (it is not synced), or "
                                                                 "name another --prep-out")
            if r.rc != 0:
                raise GpuopsError(f"could not link the preparation's outputs on host #{i}: "
                                  f"{(r.stderr.strip().splitlines() or ['exit ' + str(r.rc)])[-1]}")
        p["verified"] = True
        pl.save(self.rec, self.project)
        self.out.info(f"the preparation's outputs: {', '.join(p['outs'])} linked to {path} (marker checked)")
