"""`gpuops run`'s stages on the hosts (a mixin of the Runner): setup (and verify), sync (the project, --data), train;
every node of a fleet in parallel; where the run's checkpoints live on the instance (`_ck_home`, `_mount`, the link
from the job's folder to a filesystem)."""
from __future__ import annotations

from datetime import datetime
from typing import Callable, Optional

from ..errors import GpuopsError
from . import checkpoints as ck, stages as pl
from .prepplan import run_excludes as prep_excludes


def fleet_verify_lines(text: str) -> list[tuple[str, str]]:
    """The fleet verify's JSON document, as the lines a run prints: each host's failing checks and unreachable
    hosts, then the fleet checks that fail or warn (a difference between hosts, named per host)."""
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return [("fail", "the fleet verify gave no report")]
    lines = []
    for h in doc.get("hosts") or []:
        rep = h.get("report")
        if rep is None:
            lines.append(("fail", f"host #{h['rank']} ({h['host']}): {h.get('error') or 'no report'}"))
            continue
        for c in rep.get("checks") or []:
            if c.get("status") == "fail":
                lines.append(("fail", f"host #{h['rank']}: {c['title']}: {c.get('measured') or '-'}"))
    for c in (doc.get("fleet") or {}).get("checks") or []:
        if c.get("status") in ("fail", "warn"):
            lines.append((c["status"], f"fleet: {c['title']}: {c.get('measured') or '-'}"))
    return lines


class HostStages:
    """The setup, sync and train stages of the Runner (pipeline/runner.py), and where its checkpoints live."""

    def _every_node(self, prof, fn: Callable) -> list:
        """fn(node, node_output) on every host of a fleet in parallel (fleet.for_each, a bounded pool); each host's
        lines replayed as a section in rank order (on stderr, with the stages' progress). Returns the NodeResults."""
        from .. import hostpool as fleet

        nodes = prof.nodes()
        bufs = {n.rank: fleet.Buffered(json_mode=self.out.json_mode, debug=self.out.debug) for n in nodes}
        got = fleet.for_each(nodes, lambda node: fn(node, bufs[node.rank].output))
        for node, r in zip(nodes, got):
            self.out.info(f"=== host {fleet.label(node)} ===")
            bufs[node.rank].replay(self.out)
            if not r.ok:
                self.out.error(f"host #{r.rank} ({r.host}): {r.message}", getattr(r.error, "hint", None))
        return got

    def _failed_hosts(self, got) -> Optional[str]:
        bad = [r for r in got if not r.ok]
        return "; ".join(f"host #{r.rank}: {r.message}" for r in bad) if bad else None

    def resolution(self) -> Optional[dict]:
        """The local plan's resolution (made before the launch, carried by the record): setup installs its pins."""
        res = (self.rec.plan or {}).get("resolution")
        return res if isinstance(res, dict) and res.get("available") else None

    def script_blocks(self) -> tuple[str, ...]:
        """The job's scripts whose `# /// script` block the local plan read: setup installs them too (issue 42)."""
        return tuple((self.rec.plan or {}).get("script_blocks") or ())

    def stage_setup(self) -> None:
        from ..setup.apply import setup
        from ..verify.host import exit_code, show

        self._begin("setup")
        prof = self._profile()
        if prof.is_fleet:  # every node set up in parallel, then ONE fleet verify: each host, and the hosts together
            from .. import hostpool as fleet
            from ..verify.host import run_fleet_verify

            failed = self._failed_hosts(self._every_node(
                prof, lambda node, node_out: setup(node, node_out, self.project, verify=False,
                                                   resolution=self.resolution(), scripts=self.script_blocks())))
            if failed:
                self._end("setup", ok=False, detail=failed)
                return
            buf = fleet.Buffered(json_mode=True, debug=self.out.debug)
            code = run_fleet_verify(prof, buf.output, save=True, project_dir=self.project, retry_802_s=300.0)
            for level, line in fleet_verify_lines(buf.out_buf.getvalue()):  # what fails or differs, a line each
                (self.out.error if level == "fail" else self.out.warn)(line)
            self._end("setup", ok=code == 0, detail=f"all {len(prof.hosts)} hosts match the profile and each other"
                      if code == 0 else "the fleet verify fails after setup (the lines above name the hosts; the "
                                        "reports are in logs/env_checks/)")
            return
        def on_plan(plan) -> None:  # on stderr with the progress: the summary is what stdout carries
            for line in plan.lines():
                self.out.info(line)
            for note in plan.notes:
                self.out.warn(note)

        try:
            doc = setup(prof, self.out, self.project, verify=True, on_plan=on_plan, resolution=self.resolution(),
                        scripts=self.script_blocks())
        except GpuopsError as exc:
            self._end("setup", ok=False, detail=exc.message)
            self._raise_if_lost()  # an instance ended under the run: that is the first line, not the failure it caused
            self.out.error(f"setup failed: {exc.message}", pl.refusal_hint(exc.hint, kept=self.rec.keep))
            return
        code = exit_code(doc["verify"]) if doc.get("verify") else 0
        if code and doc.get("verify_results") is not None and not self.out.json_mode:
            show(self.out, doc["verify"], doc["verify_results"])
        self._end("setup", ok=code == 0, detail=pl.setup_detail(doc, verified=code == 0))

    def stage_sync(self) -> None:
        from ..remote.connection import connect
        from ..transfer.sync import sync_project

        self._begin("sync")
        prof = self._profile()
        # the run's output folders are never uploaded (a stale step folder, another run's fetch): the job writes
        # them; a replacement gets the checkpoint it resumes from through `push`
        fprof = self._fetch_profile()
        excludes = ck.sync_excludes(ck.names(self.rec.fetch, self._mount(fprof)), fprof.fetch)
        excludes += prep_excludes(self.rec.prep)  # --prep-out: linked from the filesystem, never a stale copy
        if self.rec.data:  # a data folder inside the project goes to its own place (_put_data), not with the project
            from ..transfer.dataplan import parse, project_exclude

            try:
                excludes += [x for x in [project_exclude(parse(self._data_text(), self.project), self.project)] if x]
            except GpuopsError:
                pass  # gone since the launch (a --resume): _put_data says so, and the stage fails there

        def one(node, node_out):
            with connect(node, announce=node_out.info) as remote:
                # symlinks and the upload's size were said before the launch (local_preview)
                return sync_project(node, remote, node_out, self.project, excludes=excludes, preview=False)

        def with_data(node, node_out):
            res = one(node, node_out)
            if self.rec.data and (node.rank == 0 or not prof.cloud.filesystems):  # on a filesystem: put once
                self.rec.data_path = self._put_data(node, node_out)
            return res

        if prof.is_fleet:
            got = self._every_node(prof, with_data)
            failed = self._failed_hosts(got)
            self._end("sync", ok=failed is None, detail=failed or
                      f"{len(got)} hosts, {sum(r.value['bytes_sent'] for r in got)} bytes sent")
            return
        try:
            s = with_data(prof, self.out)
        except GpuopsError as exc:
            self._end("sync", ok=False, detail=exc.message)
            self._raise_if_lost()  # an instance ended under the run: that is the first line, not the failure it caused
            self.out.error(f"sync failed: {exc.message}", exc.hint)
            return
        self._end("sync", ok=True, detail=f"{s['files']} files, {s['bytes_sent']} bytes sent")

    def _put_data(self, node, node_out, prof=None) -> str:
        """--data on this node: on the run's filesystem when it has one (GPUOPS_FS/gpuops/data/NAME), else on the
        instance's disk; a URL or hf:// repo downloaded by the instance. Returns GPUOPS_DATA. prof: the instance's
        profile (the run's by default; the preparation's puts it there first)."""
        from ..profiles.model import environment
        from ..remote.connection import connect
        from ..transfer import data, dataplan

        src = dataplan.parse(self._data_text(), self.project)
        fss = (prof or self._profile()).cloud.filesystems
        here = environment(self.project) if src.kind == "hf" else {}
        if here.get("HF_TOKEN"):  # a secret: scrubbed from every message from here on, as the API key is
            from ..cloud.api import Secret, redact

            Secret(here["HF_TOKEN"])
        with connect(node, announce=node_out.info) as remote:
            try:
                return data.put(node, remote, node_out, src, fss[0].mount_point if fss else None,
                                token=here.get("HF_TOKEN"), endpoint=here.get("HF_ENDPOINT"),
                                tick=self._download_tick(src.shown or src.text, node_out, sent=src.kind == "local"),
                                run=self.rec.id)["path"]
            except GpuopsError as exc:
                raise GpuopsError(redact(exc.message) if here.get("HF_TOKEN") else exc.message, hint=exc.hint,
                                  code=exc.code) from None

    def _data_changed_under(self, prof) -> None:
        """The job has ended: a local --data folder that another run put again while this one ran (on a filesystem,
        from any machine) is warned, naming the puts and what they changed (the summary keeps the warning)."""
        from ..remote.connection import connect
        from ..transfer import data

        rec = self.rec
        if not rec.data or not rec.data_path or "://" in rec.data or not rec.file_systems:
            return  # on the instance's own disk only this run puts it: no round trip to ask
        try:
            with connect(prof, announce=self.out.info) as remote:
                later = data.puts_since(remote, rec.data_path, rec.id)
        except GpuopsError:
            return  # the instance is gone: the fetch says so
        from ..transfer.dataplan import changed_under_warning

        said = changed_under_warning(rec.data, rec.data_path, later)
        if said:
            self.out.warn(said)

    def _download_tick(self, what: str, out, sent: bool = False) -> Callable[[dict], None]:
        """While the instance downloads --data (`sent`: while rsync sends a local folder): its progress said (bytes,
        rate) every few seconds, and --max-cost and the run's TTL in force (a GpuopsError ends the transfer; the sync
        stage fails and the instance is terminated)."""
        from ..transfer.plan import human_bytes

        rec, started, said = self.rec, self.seams.clock(), [0.0]
        doing = f"--data {what} was sent to the instance" if sent else f"the instance downloaded --data {what}"
        done, ended = ("sent", "transfer ended") if sent else ("received", "download ended")

        def tick(p: dict) -> None:
            now = self.seams.clock()
            n, total = int(p.get("progress") or 0), p.get("total")
            got = human_bytes(n) + (f" of {human_bytes(total)} ({100 * n / total:.0f}%)" if total else "")
            rate = f"{human_bytes(n / max(0.001, now - started))}/s"
            if pl.over_budget(rec, now):
                rec.stop_reason = f"--max-cost ${rec.max_cost:.2f} reached"
                raise GpuopsError(f"{rec.stop_reason} while {doing} ({got} {done}, "
                                  f"{rate}; {self._cost()}): {ended}")
            if rec.ttl_deadline is not None and now >= rec.ttl_deadline:
                rec.stop_reason = "the run's --ttl reached"
                raise GpuopsError(f"{rec.stop_reason} while {doing} ({got} {done}): {ended}")
            if now - said[0] >= 5.0:
                said[0] = now
                out.info(f"data {what}: {got} {'sent' if sent else 'downloaded'}, {rate} ({self._cost()})")

        return tick

    def stage_train(self) -> None:
        from ..jobs import actions as lifecycle
        from ..jobs import fleetactions
        from ..jobs import plan as core

        rec = self.rec
        self._begin("train")
        prof = self._profile()
        if rec.run_id and any(m["run_id"] == rec.run_id for m in core.local_runs(prof.name, self.project)):
            self._end("train", ok=True, detail=f"run {rec.run_id} (resumed)")
            return
        try:
            self._link_checkpoints(prof)  # run --fs: checkpoints/ is the run's folder on the filesystem
            self._link_prep(prof)  # run --prep: its outputs, where the job expects them (pipeline/prepstage.py)
        except GpuopsError as exc:
            self.out.error(f"not launched: {exc.message}", exc.hint)
            self._end("train", ok=False, detail=exc.message)
            return
        env = self._job_env() + ([f"GPUOPS_RESUME_FROM={rec.resume_from}"] if rec.resume_from else [])
        env += [f"GPUOPS_DATA={rec.data_path}"] if rec.data_path else []
        opts = dict(script=rec.script, args=rec.args, sync=False, env=env, seed=rec.seed, force=rec.force)
        try:
            if prof.is_fleet or rec.launcher != "none":  # one run id on every node, with its rank and addresses
                res = fleetactions.train_fleet(prof, self.out, self.project, launcher=rec.launcher, nproc=rec.nproc,
                                            **opts)
            else:
                res = lifecycle.train(prof, self.out, self.project, **opts)
        except GpuopsError as exc:  # the launch gate refused a broken stack, or the launch failed
            self._end("train", ok=False, detail=exc.message)
            self._raise_if_lost()
            self.out.error(*pl.launch_failure(exc.message, exc.hint, kept=rec.keep))
            return
        rec.run_id = res["run_id"]
        self._end("train", ok=True, detail=f"run {res['run_id']}")

    def _fetch_profile(self):
        """The profile, with each output folder of the run (the --fetch names, the checkpoint folder on a filesystem)
        that its fetch: map lacks meaning the folder of that name under the remote project (checkpoints, outputs)."""
        prof = self._profile()
        extra = {n: n for n in ck.names(self.rec.fetch, self._mount(prof)) if n not in prof.fetch}
        return prof.model_copy(update={"fetch": {**prof.fetch, **extra}}) if extra else prof

    def _mount(self, prof=None) -> Optional[str]:
        """The mount point of the run's filesystem (run --fs) on its instance, None without one."""
        if not self.rec.file_systems:
            return None
        try:
            prof = prof or self._profile()
        except GpuopsError:
            return None
        fss = prof.cloud.filesystems if getattr(prof, "cloud", None) is not None else []
        return fss[0].mount_point if fss else None

    def _ck_home(self):
        """Where this run's checkpoints live (pipeline.checkpoints.home): asked, never recomputed."""
        if self.rec.ck_filesystem:
            return ck.home(self.rec.id, self.rec.fetch, mount=self.rec.ck_filesystem)
        try:
            prof = self._profile()
        except GpuopsError:
            return ck.home(self.rec.id, self.rec.fetch)
        return ck.home(self.rec.id, self.rec.fetch, prof.fetch, self._mount(prof))

    def _link_checkpoints(self, prof) -> None:
        """run --fs: the checkpoint folder on the filesystem, the run's own, linked into the remote project on every
        node (one execution each); on a replacement, the newest complete checkpoint there is what the job resumes
        from (no push: it never left the filesystem)."""
        from ..remote.connection import connect
        from ..transfer import plan as tr

        home = self._ck_home()
        if home is None or home.filesystem is None:
            return
        rec = self.rec
        rows = []
        for i, node in enumerate(prof.nodes()):
            with connect(node, announce=self.out.info) as remote:
                res = remote.run(ck.link_command(node.remote_dir_for(self.project), home.remote, home.filesystem),
                                 timeout=120)
            if res.rc == 3:
                raise GpuopsError(f"{home.remote} in the project folder on host #{i} is a folder of its own, not "
                                  "empty: the run's checkpoints go to the filesystem through a link of that name",
                                  hint=f"move it away on the instance, or name another folder: --fetch NAME")
            if res.rc != 0:
                raise GpuopsError(f"could not link {home.remote} to {home.filesystem} on host #{i}: "
                                  f"{(res.stderr.strip().splitlines() or ['exit ' + str(res.rc)])[-1]}")
            if i == 0:
                rows = ck.parse_listing(res.stdout)
        rec.ck_filesystem = self._mount(prof)
        self.out.info(f"checkpoints of this run: {home.remote}/ is {home.filesystem} on the filesystem (it "
                      "outlives the instance; nothing of it crosses this machine unless --fetch names it)")
        if rec.attempts and rows:
            self._resume_on_filesystem(prof, home)
        elif rec.attempts and (rec.checkpoint or rec.resume_from):
            self.out.warn(f"nothing in {home.filesystem}: the job starts from the beginning")
            rec.checkpoint, rec.resume_from = None, None
        pl.save(rec, self.project)

    def _resume_on_filesystem(self, prof, home) -> None:
        """A replacement on the run's filesystem: the run's folder there judged once more (the lost job is dead: only
        evidence that outlives it counts), and that verdict, not an earlier one, is what the job resumes from; the
        step folders newer than it set aside."""
        from ..remote.connection import connect
        from ..transfer import plan as tr
        from .recovery import judge

        rec = self.rec
        said = rec.resume_from
        node = self._fetch_profile().node(0)
        one = node.model_copy(update={"fetch": {home.name: node.fetch[home.name]}})
        with connect(one, announce=self.out.info) as remote:
            v, rows, path = judge(remote, one, self.project, home.name, since=None, job="died")
        steps = tr.step_dirs(rows)
        if v.dir is not None:
            rec.checkpoint = ck.entry(home.name, home.remote, v.dir or None, v.step, self.seams.clock(), rec.id,
                                      home.filesystem, v.evidence, v.warnings)
            rec.vouched = (rec.vouched + [rec.checkpoint])[-50:]
            rec.resume_from = rec.checkpoint["path"]
            if said and said != rec.resume_from:  # the words before the replacement named another: say which holds
                self.out.warn(f"judged again on the filesystem, the job resumes from {rec.resume_from} "
                              f"({ck.said(v.evidence, ck.book(self.project))}), not {said} as said before the replacement")
        else:
            if rec.resume_from or rec.checkpoint:
                self.out.warn(f"no checkpoint in {path} counts now ({v.reasons()}): the job starts from the "
                              "beginning")
            rec.checkpoint, rec.resume_from = None, None
        if v.passed_over and v.dir is not None:
            self.out.warn(f"passed over in {path}: {v.reasons()}")
        aside = ck.set_aside(steps, v.step if v.dir is not None else None)
        if aside:  # the resumed job writes these steps again: what the lost job left of them is kept aside
            stamp = datetime.fromtimestamp(self.seams.clock()).strftime("%Y%m%d-%H%M%S")
            with connect(prof.node(0), announce=self.out.info) as remote:
                res = remote.run(ck.set_aside_command(home.filesystem, aside, stamp), timeout=120)
            if res.rc != 0:
                raise GpuopsError(f"could not set aside {', '.join(aside)} on the filesystem: "
                                  f"{(res.stderr.strip().splitlines() or ['exit ' + str(res.rc)])[-1]}")
            self.out.warn(f"on the filesystem, not known complete when the job died: {', '.join(aside)}; set "
                          f"aside into {home.filesystem}.passed-over/ (the job writes those steps again)")
