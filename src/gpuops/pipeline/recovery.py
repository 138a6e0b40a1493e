"""`gpuops run --recover N`, the talking half: an instance lost (terminated, preempted), unreachable too long or with a
GPU that stopped being usable is replaced, up to N times, and the job started again from the newest checkpoint
fetched and verified.

While the job trains, each checkpoint is fetched (verified) as soon as it is complete, in the background, so a lost
instance loses only the work since the last one. Then a replacement is, in order and each step recorded (a crash or
Ctrl-C anywhere leaves a record `run --resume` continues): `recover` (fetch what the instance still has, terminate it:
never before that fetch was tried), `up` (a new instance, the run's own UpSpec), sync, setup (verify), `push` (the
checkpoint back), `train` with GPUOPS_RESUME_FROM. The decisions (may it be replaced, the record of each instance)
are pure, in pipeline/stages.py; the Runner (pipeline/runner.py) has these stages through the RecoveryStages mixin.
"""
from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import checkpoints as ck
from . import stages as pl
from .checkpoints import where as ck_where
from ..errors import GpuopsError


def _exit(doc: dict) -> str:
    """ (exit N) of a stop document's exit code, or nothing."""
    return f" (exit {doc['exit_code']})" if doc.get("exit_code") is not None else ""


@dataclass
class _Ended:
    """A job found already ended when it was to be stopped: its exit code (as RunInfo has it)."""
    exit_code: Optional[int]


class GpuFault(Exception):
    """Raised from watch's event callback: a health fact that ends a GPU's usefulness (verify's FAIL rules)."""

    def __init__(self, findings: list[str]):
        super().__init__("; ".join(findings))
        self.findings = findings


def quiet_output():
    """An Output that keeps what it is told (a background fetch must not draw over the job's log)."""
    from ..console import Output

    return Output(json_mode=True, stdout=io.StringIO(), stderr=io.StringIO())


def judge(remote, one, project: Path, name: str, *, since: Optional[float], job: str, quiet: bool = False,
          job_id: Optional[str] = None):
    """ONE remote execution lists fetch entry `name` of profile `one` with what vouches for or rules out each
    checkpoint (the job's open files, found by job_id, its run id; marker files' contents; files cut short), judged
    by pipeline.checkpoints.resumable. Returns (the Verdict, the listing's rows, where it is on the host)."""
    from ..transfer import plan as tr
    from ..transfer.fetch import list_remote

    rules = ck.book(project)
    listing = list_remote(one, remote, project, rows=True,
                          evidence={"names": [name], **ck.evidence_spec(job_id, rules)})[name]
    if not listing["exists"] or not listing["files"]:
        raise GpuopsError(f"nothing at {listing['path']} yet")
    rows = listing.get("rows") or []
    v = ck.resumable(tr.step_dirs(rows), files=rows, since=since, job=job, quiet=quiet,
                     seen=ck.Seen.from_listing(listing.get("evidence")), rules=rules)
    return v, rows, listing["path"]


def fetch_checkpoint(prof, project: Path, name: str, out, run_id: str, *, since: Optional[float], job: str,
                     quiet: bool = False, clock: Callable[[], float] = time.time,
                     filesystem: Optional[str] = None, job_id: Optional[str] = None,
                     have: Optional[dict] = None) -> Optional[dict]:
    """The newest checkpoint under fetch entry `name` that counts (`judge`: this job's, and complete by evidence
    gathered in the listing's own remote execution), fetched and verified (transfer.fetch) into the run's own
    folder (checkpoints.local_dir); on a filesystem (filesystem: the run's folder there) only judged, never fetched
    (it outlives the instance). Returns the record's checkpoint entry (with the evidence that vouched for it), or
    None when none counts yet (said on `out`). have: the entry the run holds; the same folder is not fetched again."""
    from ..remote.connection import connect
    from ..transfer.fetch import fetch

    one = prof.model_copy(update={"fetch": {name: prof.fetch[name]}})
    with connect(one, announce=out.info) as remote:
        v, _, path = judge(remote, one, project, name, since=since, job=job, quiet=quiet, job_id=job_id)
        if v.dir is None:
            out.info(f"no checkpoint of this job in {path} counts yet ({v.reasons()})")
            return None
        if v.passed_over:
            out.warn(f"passed over in {path}: {v.reasons()}")
        took = None
        if have and have.get("local") and filesystem is None and (have.get("dir"), have.get("step")) == (
                v.dir or None, v.step) and name == have.get("name"):
            # fetched and verified already (a look as the folder changed, then one as it held still): its evidence
            # now, which may be stronger than then (a marker written since) or weaker (timing only)
            return {**have, "evidence": list(v.evidence or []), "at": clock()}
        if filesystem is None:
            t0 = time.monotonic()
            fetch(one, remote, out, name, step=v.step if v.dir else None,
                  dest=ck.fetch_dest(run_id, name, project), project_dir=project)
            took = time.monotonic() - t0
    e = ck.entry(name, prof.fetch[name], v.dir or None, v.step, clock(), run_id, filesystem, v.evidence, v.warnings)
    if took is not None:  # what the final fetch after a --max-cost stop is expected to take (pipeline/money.py)
        e["fetch_s"] = round(took, 3)
    return e


class CheckpointFetcher:
    """While the job trains: each time the checkpoint folder changed and then held still for a sample
    (jobs.watch.CheckpointWatch), fetch_one() runs in a background thread (its own connection). finished() hands
    the results back to the caller's thread: (entry, None) or (None, GpuopsError)."""

    def __init__(self, fetch_one: Callable[..., dict]):
        from ..jobs.watch import CheckpointWatch

        self.watch = CheckpointWatch(ck.QUIET_SAMPLES, eager=True)
        self.fetch_one = fetch_one
        self.thread: Optional[threading.Thread] = None
        self._done: list = []
        self._lock = threading.Lock()

    def on_event(self, ev: dict) -> list:
        got = self.finished()
        if self.watch.apply(ev):
            self.thread = threading.Thread(target=self._run, args=(self.watch.mode == "quiet",),
                                           name="gpuops-checkpoint-fetch", daemon=True)
            self.thread.start()
        return got

    def _run(self, quiet: bool) -> None:
        try:
            res = (self.fetch_one(quiet=quiet), None)
        except GpuopsError as exc:
            res = (None, exc)
        except Exception as exc:  # noqa: BLE001 - a background thread reports, never dies silently
            res = (None, GpuopsError(f"{type(exc).__name__}: {exc}"))
        with self._lock:
            self._done.append(res)
        self.watch.done()

    def finished(self, wait: bool = False) -> list:
        """The results so far; wait: after the fetch under way has ended (two fetches never share a folder)."""
        if wait and self.thread is not None:
            self.thread.join()
        with self._lock:
            got, self._done = self._done, []
        return got


def node0_alive(r: dict) -> bool:
    """A fleet's recovery where the node that ended is not node 0: node 0 can still be fetched from."""
    ids = r.get("instance_ids") or []
    return r.get("kind") == "lost" and len(ids) > 1 and bool(r.get("lost_id")) and r["lost_id"] != ids[0]


class RecoveryStages:
    """The Runner's recovery: spotting what ends an instance's usefulness while watching, and the stages `recover`
    and `push`. Uses the Runner's rec, out, project, seams, ctx_factory and its stage helpers."""

    # -- while watching ----------------------------------------------------------------------------------------------
    def _watch_extras(self, prof):
        """What the run's watch stream samples beyond the GPU line (no extra execution): the GPUs' health always,
        the checkpoint folder with --recover. Returns (watch.Extras, HealthWatch, CheckpointFetcher or None)."""
        from .. import knowledge as kb
        from ..jobs import watch as w
        from ..transfer.fetch import fetch_sources

        rec = self.rec
        health = w.HealthWatch(kb.load_playbook("xid", self.project),
                               kb.knowledge(self.project).get("nvidia_smi_failures", []))
        home = self._ck_home()
        disk = prof.remote_dir_for(self.project)  # the disk the job writes, sampled with the heartbeat (#35)
        if rec.recover <= 0 or home is None:
            return w.Extras(health=True, disk=disk), health, None
        name = home.name
        fprof = self._fetch_profile()
        folder = fetch_sources(fprof, self.project)[name]
        self._fetcher = CheckpointFetcher(lambda quiet: fetch_checkpoint(
            fprof, self.project, name, quiet_output(), rec.id, since=ck.since(rec.job_started, home), job="alive",
            quiet=quiet, filesystem=home.filesystem, job_id=rec.run_id, have=rec.checkpoint))
        return w.Extras(health=True, checkpoints=folder, disk=disk), health, self._fetcher

    def _watch_event(self, ev: dict, health, fetcher) -> None:
        """One stream event: a health fact that ends a GPU's usefulness (GpuFault with --recover, else said once),
        a checkpoint to fetch or fetched."""
        if ev.get("type") == "state" and getattr(ev.get("info"), "started", None) and not self.rec.job_started:
            self.rec.job_started = float(ev["info"].started)  # the instance's clock: its checkpoints are newer
            pl.save(self.rec, self.project)
        found = health.apply(ev)
        if found:
            if self.rec.recover > 0:
                raise GpuFault(found)
            for f in found:
                self.out.warn(f"{self.rec.profile}: {f}: the GPU is no longer usable (the job goes on as it can; "
                              "gpuops run --recover N replaces such an instance)")
        if fetcher is not None:
            self._checkpoints_fetched(fetcher.on_event(ev))

    def _other_nodes_sampler(self, fleet_prof):
        """A fleet run with --recover: the other hosts' health, each through one long-lived stream beside node 0's
        (jobs.actions.FleetSampler); None otherwise."""
        from ..jobs import actions as lifecycle

        if not fleet_prof.is_fleet or self.rec.recover <= 0:
            return None
        return lifecycle.FleetSampler(fleet_prof.nodes()[1:], self.seams.poll_s, health=True)

    def _other_nodes_events(self, events: list, watches: dict) -> None:
        """The other hosts' health events: a GPU that stopped being usable raises GpuFault (the fleet is replaced);
        a host whose stream could not start or ended has the API asked at once (InstanceLost if it ended)."""
        from .. import knowledge as kb
        from ..jobs import watch as w

        found = []
        for ev in events:
            rank = ev.get("host")
            if ev.get("type") == "unwatched":
                lost = self._fate()
                if lost is not None:
                    raise lost
                self.out.warn(f"host #{rank}: {ev['message']} (the Lambda API shows it running; the run goes on "
                              "with node 0)")
                continue
            if rank not in watches:
                watches[rank] = w.HealthWatch(kb.load_playbook("xid", self.project),
                                              kb.knowledge(self.project).get("nvidia_smi_failures", []))
            found += [f"host #{rank}: {f}" for f in watches[rank].apply(ev)]
        if found:
            raise GpuFault(found)

    def _checkpoints_fetched(self, results: list) -> None:
        for entry, err in results:
            if err is not None:
                self.out.warn(f"fetching the newest checkpoint failed: {err.message} (tried again at the next one)")
                continue
            if entry is None or not ck.newer(entry, self.rec.checkpoint):
                continue  # none counts yet, or not later than the one kept
            said = ck.where(self.rec.checkpoint) == ck.where(entry)  # e.g. the one pushed back
            self.rec.checkpoint = entry
            self.rec.vouched = (self.rec.vouched + [entry])[-50:]
            pl.save(self.rec, self.project)
            if not said:
                self.out.info(f"checkpoint {ck.where(entry)} " + ("is complete on the filesystem" if entry.get(
                    "filesystem") else "fetched and verified") + " (a replacement instance resumes from it)")

    def _job_gone(self, why: Optional[str]) -> None:
        """The job died, was stopped, or its instance or GPU is gone: a checkpoint only timing vouched for (its
        folder held still while the job ran) no longer counts; the newest one other evidence vouched for does
        (pipeline.checkpoints.after_death). Said when it changes what counts."""
        rec = self.rec
        vouched = list(rec.vouched) or ([rec.checkpoint] if rec.checkpoint else [])
        keep, gone = ck.after_death(vouched, ck.book(self.project))
        if not gone:
            return
        rec.vouched = [e for e in vouched if e not in gone]
        old, rec.checkpoint = rec.checkpoint, keep
        if old is not None and old in gone:
            self.out.warn(f"checkpoint {ck.where(old)} counted only because its folder held still while the job ran "
                          f"(timing, no marker or other evidence); the job is gone ({why or 'it ended'}): it no "
                          "longer counts" + (f"; the newest that does: {ck.where(keep)}" if keep else
                                             "; no checkpoint of this run counts"))
        pl.save(rec, self.project)

    def _end_fetcher(self) -> None:
        """A checkpoint fetch under way ends (its result kept) before the instance is fetched from or terminated."""
        if self._fetcher is not None:
            self._checkpoints_fetched(self._fetcher.finished(wait=True))
            r = self.rec.recovering
            if r or self.rec.job_state not in (None, "succeeded"):  # what timing vouched for while it ran: revoked
                self._job_gone(r["reason"] if r else f"the job {self.rec.job_state}")

    def _health_now(self, prof) -> list[str]:
        """The job failed: the GPUs' health read once more (one execution) before the run decides, since the job
        of a GPU that fell off the bus dies at once, before the stream's next health sample. Returns the facts that
        end a GPU's usefulness (verify's FAIL rules), [] when healthy or when the host cannot be asked (said)."""
        from .. import knowledge as kb
        from ..jobs import watch as w
        from ..remote.connection import connect

        health = w.HealthWatch(kb.load_playbook("xid", self.project),
                               kb.knowledge(self.project).get("nvidia_smi_failures", []))
        try:
            with connect(prof, announce=self.out.info) as remote:
                res = remote.run(w.health_once_command(), timeout=60)
        except GpuopsError as exc:
            self.out.warn(f"the job failed and the GPUs' health could not be read once more: {exc.message}")
            return []
        found = []
        for line in res.stdout.splitlines():
            ev = w.parse_stderr_line(line)
            if ev is not None:
                found += health.apply(ev)
        return found

    def _job_died_with_its_gpu(self, found: list, info) -> None:
        """The job failed and a GPU has failed too: the hardware's failure, not the job's. Replaced under --recover
        (the job goes on from the newest complete checkpoint); else the run ends naming the hardware, with the
        newest complete checkpoint kept, and `run --resume --id RUN --recover 1` replaces the instance and resumes."""
        rec = self.rec
        what = "; ".join(found)
        code = f" (exit {info.exit_code})" if info is not None and info.exit_code is not None else ""
        self._job_gone(f"it died with its GPU: {what}")
        if pl.why_not_recover(rec, self.seams.clock()) is None:
            self._start_recovery("watch", "gpu", f"{rec.profile}: {what}: the job died with its GPU{code}")
            return
        rec.job_state = "failed"
        rec.hardware = what
        rec.stop_reason = f"the GPU failed ({what}); the job died with it{code}: a hardware failure, not the job's"
        if not rec.ending or rec.ending.get("cause") != "gpu-failed":  # its stream's facts did not show it: said
            self._ending_said("gpu-failed", found + ([code.strip(" ()")] if code else []), detail=found[0])
        home = self._ck_home()
        if home is not None:  # the newest checkpoint known complete, for the resume that replaces the instance
            try:
                self._checkpoints_fetched([(fetch_checkpoint(self._fetch_profile(), self.project, home.name, self.out,
                                                             rec.id, since=ck.since(rec.job_started, home),
                                                             job="died", clock=self.seams.clock,
                                                             filesystem=home.filesystem, job_id=rec.run_id), None)])
            except GpuopsError as exc:
                self.out.warn(f"the newest checkpoint could not be fetched: {exc.message}")
        self.out.error(f"job {rec.run_id} died with its GPU: {what}{code}. A hardware failure, not the job's; the "
                       "instance is terminated after the fetch",
                       f"gpuops run --resume --id {rec.id} --recover 1 replaces the instance and resumes"
                       + (f" from {ck.where(rec.checkpoint)}" if rec.checkpoint else " (from the beginning: no "
                          "complete checkpoint)"))
        self._end("watch", ok=False, detail=rec.stop_reason)

    def _gpu_fault(self, exc: GpuFault) -> None:
        """A GPU of the instance stopped being usable: replace the instance, or (no replacement left) stop the job,
        fetch what exists and terminate."""
        rec = self.rec
        what = "; ".join(exc.findings)
        why = pl.why_not_recover(rec, self.seams.clock())
        if why is None:
            self._start_recovery("watch", "gpu", f"{rec.profile}: {what}")
            return
        rec.stop_reason = f"{what}; not replaced: {why}"
        self.out.error(f"{rec.profile}: {what}: the GPU is no longer usable and the instance is not replaced ({why}): "
                       "stopping the job, then fetching what exists")
        died = self._stop_job(gpu=True)
        if died is not None:  # its GPU killed it a moment after the health sample saw the failure: as if seen first
            return self._job_died_with_its_gpu(list(exc.findings), _Ended(died.get("exit_code")))
        self._ending_said("gpu-failed", list(exc.findings) + [f"the job was stopped by gpuops run: not replaced "
                                                             f"({why})"], detail=exc.findings[0])
        self._end("watch", ok=False, detail=rec.stop_reason)

    def _start_recovery(self, stage: Optional[str], kind: str, reason: str, instance_id: Optional[str] = None,
                        status: Optional[str] = None) -> None:
        """Record that the instance is being replaced (before anything is done about it), say so, and close the
        stages it cut short. kind: lost (ended under the run), unhealthy (Lambda's status), unreachable, gpu."""
        rec = self.rec
        if rec.recovering:
            return
        self._job_gone(reason)
        now = self.seams.clock()
        ids = (rec.instance or {}).get("ids") or ([instance_id] if instance_id else [])
        rec.recovering = {"kind": kind, "reason": reason, "at": now, "stage": stage, "status": status,
                          "instance_ids": ids, "fetch_tried": False, "terminated": False, "ended": None,
                          "lost_id": instance_id}
        if rec.run_id and rec.job_state is None and kind != "gpu":
            rec.job_state = "lost"
        ck = rec.checkpoint
        resume = (f"the job starts again from checkpoint {ck_where(ck)}" + ("" if ck.get("filesystem") else
                  " (fetched and verified)") if ck else
                  "no complete checkpoint yet: the job starts again from the newest complete one the replacement "
                  "finds on the filesystem, else from the beginning" if self._ck_home() and
                  self._ck_home().filesystem else
                  "no checkpoint was fetched: the job starts again from the beginning")
        what = (f"the whole fleet, its {len(ids)} instances (a job across nodes ends with any of them)"
                if len(ids) > 1 else "the instance")
        self.out.error(f"{reason}: replacing {what} (recovery {len(rec.attempts) + 1} of {rec.recover}); {resume}")
        for name in pl.STAGES[:-1]:
            st = rec.stages.get(name)
            if st is not None and st.started is not None and st.ended is None:
                self._end(name, ok=False, detail=reason)
        pl.save(rec, self.project)

    # -- the stages ----------------------------------------------------------------------------------------------
    def stage_recover(self) -> None:
        """Fetch what the instance still has (only if it can be reached), terminate it (after that fetch was
        tried), then archive it: the run starts again at `up`."""
        rec = self.rec
        r = rec.recovering
        self._begin("recover")
        self._end_fetcher()
        ids = ", ".join(r.get("instance_ids") or []) or "?"
        if not r.get("fetch_tried"):
            if r["kind"] == "gpu":
                died = self._stop_job(gpu=True)
                if died is not None:  # its GPU killed it a moment after the health sample saw the failure
                    self.out.info(f"job {rec.run_id} had already ended: the job died with its GPU{_exit(died)}")
                self._fetch_reachable()
            elif node0_alive(r):  # a fleet that lost another node: node 0 (its checkpoints, its log) still answers
                self.out.info(f"instance {r['lost_id']} is {r.get('status') or 'gone'}; node 0 "
                              f"({(r.get('instance_ids') or ['?'])[0]}) still runs: stopping the job on every node "
                              "and fetching from node 0 before the whole fleet is replaced")
                self._stop_job()
                self._fetch_reachable()
            else:
                self.out.info(f"nothing to fetch from instance {ids}: it is "
                              + ({"lost": r.get("status") or "gone", "unhealthy": "unhealthy (unreachable)",
                                  "unreachable": "unreachable"}.get(r["kind"], r["kind"])))
            r["fetch_tried"] = True
            pl.save(rec, self.project)
        if not r.get("terminated") and not self._terminate_for_recovery(ids):
            return
        cost = pl.spend(rec, self.seams.clock())
        self._end("recover", ok=True, detail=f"instance {ids} terminated")
        rec.resume_from = rec.checkpoint["path"] if rec.checkpoint else None
        pl.archive(rec, r["ended"])
        pl.save(rec, self.project)
        self.out.info(f"instance {ids} terminated (${cost:.2f} so far); launching its replacement"
                      + (f", which resumes from {rec.resume_from}" if rec.resume_from else ""))

    def _fetch_reachable(self) -> None:
        """The instance answers (its GPU failed): its job's log and each --fetch name (the checkpoints: the newest),
        one try each, verified; what fails is said and left."""
        from ..jobs import actions as lifecycle
        from ..remote.connection import connect
        from ..transfer.fetch import fetch

        rec = self.rec
        prof = self._fetch_profile()
        n = len(rec.attempts) + 1
        if rec.run_id:
            try:
                meta = lifecycle.resolve(rec.run_id, prof, self.project)
                self.fetched[f"log.instance{n}"] = self._save_log(prof, meta, 0, "log")
            except GpuopsError as exc:
                self.out.warn(f"the job's log could not be fetched from the failing instance: {exc.message}")
        home = self._ck_home()
        for name in ck.names(rec.fetch, home.filesystem if home else None):
            try:
                if home is not None and name == home.name:  # the job died: only a checkpoint known complete counts
                    self._checkpoints_fetched([(fetch_checkpoint(prof, self.project, name, self.out, rec.id,
                                                                 since=ck.since(rec.job_started, home), job="died",
                                                                 clock=self.seams.clock, filesystem=home.filesystem,
                                                                 job_id=rec.run_id), None)])
                    continue
                with connect(prof, announce=self.out.info) as remote:
                    s = fetch(prof, remote, self.out, name, dest=ck.fetch_dest(rec.id, name, self.project),
                              project_dir=self.project)
                self.fetched[f"{name}.instance{n}"] = str(s.get("dest") or name)
            except GpuopsError as exc:
                self.out.warn(f"fetch {name} from the failing instance failed: {exc.message}")

    def _terminate_for_recovery(self, ids: str) -> bool:
        """Terminate the instance being replaced (confirmed, its records closed). False: refused (said loudly: it
        still bills; the run stops here and `--resume` tries again)."""
        from ..cloud.down import down

        rec, r = self.rec, self.rec.recovering
        ctx = self.ctx_factory()
        try:
            with ctx.client:
                down(rec.profile, ctx, project_dir=self.project)
        except GpuopsError as exc:
            self._end("recover", ok=False, detail=exc.message)
            money, check = self._billing(list((rec.instance or {}).get("ids") or []))
            self.out.error(f"could not terminate instance {ids} to replace it ({exc.message}): {money}; no "
                           "replacement is launched", check or f"gpuops run --resume --id {rec.id} tries again (and "
                           f"goes on with the recovery); gpuops down {rec.profile} ends it; gpuops ls shows it")
            return False
        r["terminated"], r["ended"] = True, self.seams.clock()
        pl.save(rec, self.project)
        return True

    def _relaunch_failed(self, exc: GpuopsError) -> None:
        """The replacement could not be launched (no capacity, budget, a refused launch): the run ends, saying
        whether anything still bills (up terminated what it launched; the replaced instance was terminated)."""
        from ..cloud.ledger import Ledger

        rec = self.rec
        left = [r for r in Ledger().records() if r.open and r.profile == rec.profile]
        rec.stop_reason = f"recovery failed: no replacement instance ({exc.message})"
        if left:
            self.out.error(f"{rec.stop_reason}; STILL BILLING: launch {', '.join(r.launch_id for r in left)} of "
                           f"{rec.profile} is open", f"gpuops ls shows it; gpuops down {rec.profile} ends it")
        else:
            self.out.error(f"{rec.stop_reason}; nothing is left billing: every instance of this run is terminated "
                           f"(gpuops ls shows no open launch of {rec.profile})", exc.hint)

    def stage_push(self) -> None:
        """The checkpoint the replaced instance left (fetched and verified here) back onto the new instance, at the
        path the job gets in GPUOPS_RESUME_FROM: onto every node of a fleet (each rank may load it)."""
        rec = self.rec
        self._begin("push")
        ck = rec.checkpoint
        if ck.get("filesystem") or not ck.get("local"):  # on the run's filesystem: the replacement mounts it
            self._end("push", ok=True, detail=f"{ck_where(ck)} is on the filesystem: nothing to push")
            return
        local = self.project / ck["local"]
        if not local.exists():
            self._end("push", ok=False, detail=f"{ck['local']} is not here any more")
            self.out.error(f"the checkpoint to resume from, {local}, is not here any more; nothing to push")
            return
        prof = self._profile()
        nodes = prof.nodes()
        sent = 0
        for i, node in enumerate(nodes):
            where = f" to host #{i}" if len(nodes) > 1 else ""
            try:
                dest, res = self._push_one(node, local, ck["path"], f"push {ck['local']}{where}")
            except GpuopsError as exc:
                self._end("push", ok=False, detail=f"{where.strip() + ': ' if where else ''}{exc.message}")
                self.out.error(f"push of {ck['local']}{where} failed: {exc.message}", exc.hint)
                return
            sent += res.stats.get("total_bytes", 0)
        hosts = f" on {len(nodes)} hosts" if len(nodes) > 1 else ""
        self._end("push", ok=True, detail=f"{ck['local']} -> {dest}{hosts} ({sent} bytes)")

    def _push_one(self, prof, local: Path, path: str, label: str):
        """rsync `local` to `path` under the host's project folder; (the remote path, rsync's result)."""
        from ..remote.shell import shell_path
        from ..transfer import rsync as rs
        from ..remote.connection import connect, ssh_command
        from ..transfer import plan as tr
        from ..transfer.progress import ProgressView

        dest = tr.join_remote(prof.remote_dir_for(self.project), path)
        where = dest if local.is_dir() else dest.rsplit("/", 1)[0] or "/"
        argv = tr.base_args(ssh_command(prof)) + [str(local) + ("/" if local.is_dir() else ""),
                                                  tr.remote_arg(prof.host, dest, contents=local.is_dir())]
        with connect(prof, announce=self.out.info) as remote:
            remote.run(f"mkdir -p -- {shell_path(where)}", timeout=60, check=True)
        view = ProgressView(self.out, label)
        with view:
            res = rs.run(argv, host=prof.host, on_progress=view.update, on_retry=view.retry)
        return dest, res
