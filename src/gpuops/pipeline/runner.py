"""`gpuops run`, the talking half: up -> sync -> setup -> train -> watch -> fetch -> down, each stage recorded before
it starts and after it ends (pipeline/stages.py decides what comes next, also after a crash), the running cost on screen.

Money rules: the instance is terminated when the job ends, fails, or its launch is refused, and when the user presses
Ctrl-C twice; never before everything named in --fetch is on the local disk and verified (a fetch that fails after
retries keeps the instance and says so, with its TTL deadline, leaving it to `gpuops ls` and `gpuops reap`; a name the
job never created holds nothing and keeps nothing billing). Every run's instance has a TTL (run_ttl: --ttl,
GPUOPS_RUN_TTL, else 24h). --max-cost is checked from the launch on (boot, between stages, while training): it stops the
job and fetches what exists, or ends a run that has not trained yet. A lost connection is never judged alone: the API
says whether the instance still runs (reconnect), or ended under the run (terminated elsewhere, preempted: said at once,
the run closed as `lost`). The cloud TTL set by `up` stays in force whatever happens to this process. With --recover N,
an instance lost, unreachable or whose GPU fails is replaced instead (pipeline/recovery.py), its time and money counted
with the run's.

This module is the Runner's loop: the order of the stages, the instance's fate asked of the API, Ctrl-C, the end. The
stages are mixins, one module per family: prepstage.py (--prep: the preparation, first, on its own instance),
bringup.py (up), hoststages.py (setup, sync, train), watching.py (watch), ending.py (fetch, down), recovery.py
(recover, push); what stops a stage early is in stops.py, the closing summary in summary.py.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

from ..errors import ExitCode, GpuopsError, UsageError
from .bringup import UpStage
from .ending import EndStages
from .hoststages import HostStages
from .prepstage import PrepStage
from .recovery import RecoveryStages
from .stops import InstanceLost, _ConnectionGaveUp
from .watching import WatchStage
from . import checkpoints as ck, stages as pl


SECOND_CTRL_C_S = 10.0


@dataclass
class Seams:
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    second_press_s: float = SECOND_CTRL_C_S
    poll_s: float = 2.0
    extra: dict = field(default_factory=dict)


def new_record(*, script: str, args: list, regions: list, nodes: int, fetch: list, keep: bool,
               ttl_s: Optional[float], max_cost: Optional[float], key: Optional[Path], name: Optional[str],
               launcher: str = "none", nproc: str = "auto", template: Optional[dict] = None,
               type_name: str = "", types: Optional[list] = None, gpu: Optional[str] = None,
               max_price: Optional[float] = None, wait_for_capacity_s: float = 0.0, recover: int = 0,
               unreachable_s: Optional[float] = None, file_systems: Optional[list] = None, data: Optional[str] = None,
               seed: Optional[int] = None, env_names: Optional[list] = None, force: bool = False,
               idle_s: Optional[float] = None, guard: Optional[str] = None, prep: Optional[dict] = None,
               clock: Callable[[], float] = time.time, project: Optional[Path] = None,
               token: Callable[[], str] = lambda: uuid.uuid4().hex[:4]) -> pl.Record:
    """A new run's record. Its id, `<name>-<YYYYmmdd-HHMMSS>-<4 random hex digits>`, is not one of a record already
    in `project` (two runs started in the same second never share one: their records, profiles and checkpoint
    folders stay apart). token: the random part (a seam)."""
    stamp = datetime.fromtimestamp(clock()).strftime("%Y%m%d-%H%M%S")
    taken = {p.stem for p in pl.records_dir(project).glob("*.json")} if project is not None else set()
    taken |= {p.name for p in pl.records_dir(project).parent.iterdir()} if project is not None and \
        pl.records_dir(project).parent.is_dir() else set()
    for _ in range(1000):
        rid = f"{name or Path(script).stem}-{stamp}-{token()}"
        if rid not in taken:
            break
    else:
        raise UsageError(f"no free run id for {name or Path(script).stem} at {stamp}")
    profile = f"run-{rid}"
    types = list(types or ([type_name] if type_name else []))
    return pl.Record(id=rid, profile=profile, instance_type=types[0] if types else "", types=types, gpu=gpu,
                     max_price=max_price, wait_for_capacity_s=wait_for_capacity_s, script=script, args=list(args),
                     regions=list(regions), nodes=nodes, launcher=launcher, nproc=nproc, template=template,
                     fetch=list(fetch),
                     keep=keep, ttl_s=ttl_s,
                     max_cost=max_cost, key=str(key) if key else None, created=clock(), recover=recover,
                     unreachable_s=unreachable_s, file_systems=list(file_systems or []), data=data, seed=seed,
                     env_names=list(env_names or []), force=force, idle_s=idle_s, guard=guard,
                     prep=dict(prep, stage={}, instances=[]) if prep else None)


def amend_for_resume(rec: pl.Record, *, fetch: list, keep: bool, max_cost: Optional[float],
                     recover: Optional[int] = None, force: bool = False) -> None:
    """`run --resume` with --fetch / --keep / --max-cost / --recover: the run goes on with them. New --fetch names
    are added (the fetch runs again if it had ended: what is already here is not sent again); refused once the
    instance is gone, since its disk went with it."""
    new = [n for n in fetch if n not in rec.fetch]
    if new:
        down = rec.stages.get("down")
        if rec.lost or (down is not None and down.ok):
            raise UsageError(f"--fetch {','.join(new)}: run {rec.id}'s instance is gone, and its disk with it; "
                             "nothing more can be fetched")
        rec.fetch = list(rec.fetch) + new
        st = rec.stages.get("fetch")
        if st is not None and st.ended is not None:
            st.ended, st.ok, st.detail = None, None, None
    if keep:
        rec.keep = True
    if max_cost is not None:
        rec.max_cost = max_cost
    if recover is not None:
        rec.recover = recover
    if force:
        rec.force = True
    down = rec.stages.get("down")
    if rec.hardware and recover and down is not None and down.ok and not rec.recovering:
        # the job died with its GPU, the instance was terminated: --recover N replaces it and resumes
        ids = (rec.instance or {}).get("ids") or []
        rec.recovering = {"kind": "gpu", "reason": f"{rec.profile}: {rec.hardware}", "at": down.ended,
                          "stage": None, "status": None, "instance_ids": ids, "fetch_tried": True,
                          "terminated": True, "ended": down.ended, "lost_id": None}
        rec.hardware, rec.stop_reason, rec.job_state, rec.outcome = None, None, None, pl.RUNNING
        rec.ending = None


class Runner(PrepStage, UpStage, HostStages, WatchStage, EndStages, RecoveryStages):
    """One `gpuops run`: drives the stages of a record, saving it as it goes."""

    def __init__(self, rec: pl.Record, out, project: Path, ctx_factory, seams: Optional[Seams] = None,
                 confirm: Optional[Callable[[str], bool]] = None,
                 create_fs: Optional[Callable[[str], Optional[bool]]] = None, env: Optional[list] = None,
                 data: Optional[str] = None):
        self.rec, self.out, self.project = rec, out, project
        self.create_fs = create_fs  # --fs NAME missing: asked before creating it (cli.fs.fs_question)
        self._env_given = list(env or [])  # --env NAME=VALUE of a new run: written to the 0600 file, never the record
        self._data_given = data if data and data != rec.data else None  # --data with credentials: its 0600 file
        self.ctx_factory = ctx_factory  # () -> cloud lifecycle Context (client, ledger, out)
        self.seams = seams or Seams()
        self.confirm = confirm
        self.fetched: dict[str, str] = {}
        self._fetcher = None  # the background checkpoint fetch while watching (--recover)
        self._api_down: Optional[str] = None  # the API could not be asked (said once until it answers again)
        self._seen: dict = {}  # instance id -> (status, when): what the API last showed (up: active)
        self._asked = False  # the API was asked about the stage that just failed (_raise_if_lost)
        self.missing: list = []  # --fetch names the job never created (the run terminated: nothing to keep)

    # -- helpers -------------------------------------------------------------------------------------------------
    def _cost(self) -> str:
        return f"${pl.spend(self.rec, self.seams.clock()):.2f} so far"

    def _progress(self, name: str) -> None:
        rec = self.rec
        shown = [s for s in pl.STAGES if s != "push" or rec.resume_from]
        where = (f"{shown.index(name) + 1}/{len(shown)}" if name in shown else
                 f"replacement {len(rec.attempts) + 1} of {rec.recover}")
        if rec.attempts or name == "recover":
            where = f"instance {len(rec.attempts) + 1}, {where}"
        self.out.step(f"[{where}] {pl.LABELS[name]} ({self._cost()})")

    def _profile(self):
        from ..profiles import model as profiles

        return profiles.resolve(self.rec.profile, self.project)

    def _begin(self, name: str) -> None:
        pl.begin(self.rec, name, self.project, clock=self.seams.clock)
        self._progress(name)

    def _end(self, name: str, ok: bool, detail: Optional[str] = None) -> None:
        if name == "watch" and not ok:  # the job did not succeed: what only timing vouched for no longer counts
            self._job_gone(detail)
        pl.end(self.rec, name, self.project, ok=ok, detail=detail, clock=self.seams.clock)

    # -- the loop ------------------------------------------------------------------------------------------------
    def _env_file(self) -> Path:
        return pl.records_dir(self.project) / f"{self.rec.id}.env"

    def _data_file(self) -> Path:
        return pl.records_dir(self.project) / f"{self.rec.id}.data"

    def _data_text(self) -> Optional[str]:
        """--data as given: from its 0600 file when the URL holds credentials (the record keeps it redacted)."""
        f = self._data_file()
        return f.read_text() if f.is_file() else self.rec.data

    def _forget_secrets(self) -> None:
        """The run is over (or never launched): no launch needs its --env values or --data URL again."""
        self._env_file().unlink(missing_ok=True)
        self._data_file().unlink(missing_ok=True)

    def _job_env(self) -> list:
        """The run's --env NAME=VALUE (its 0600 file: values may be secrets), for every launch of the job."""
        import json

        f = self._env_file()
        return json.loads(f.read_text()) if f.is_file() else []

    def run(self) -> int:
        if self._env_given:
            import json

            from ..paths import write_private

            write_private(self._env_file(), json.dumps(self._env_given))
        if self._data_given:
            from ..paths import write_private

            write_private(self._data_file(), self._data_given)
        pl.save(self.rec, self.project)
        # a new run is resumable once something was launched (bringup says it then): a run refused before any launch
        # request removes its record, and a --resume line for it was false (issue #36)
        self.out.info(f"run {self.rec.id}: record {pl.records_dir(self.project) / (self.rec.id + '.json')}"
                      + (f" (gpuops run --resume --id {self.rec.id} continues it)" if self.rec.stages else ""))
        home = ck.home(self.rec.id, self.rec.fetch)
        if home is not None and not self.rec.stages:
            self.out.info(f"what --fetch names lands in runs/{self.rec.id}/ (checkpoints: {home.local}), a folder "
                          "no other run shares; sync never uploads these folders")
        try:
            return self._loop()
        except _ConnectionGaveUp as exc:
            return self._connection_lost(exc.error)

    def _loop(self) -> int:
        try:
            if self._instance_known() and not self.rec.lost:  # resumed: is the instance still there at all?
                self._check_fate(pl.next_stage(self.rec))
        except KeyboardInterrupt:
            return self._detached()
        while True:
            name = pl.next_stage(self.rec)
            if name is None:
                break
            try:
                if name in ("setup", "sync", "push", "train") and pl.over_budget(self.rec, self.seams.clock()):
                    self._budget_stop_before(name)
                    continue
                self._asked = False
                getattr(self, f"stage_{name}")()
                st = self.rec.stages.get(name)
                if name in ("down", "recover") and st is not None and st.ok is False:
                    break  # the instance could not be terminated: said loudly; `--resume` or `down` tries again
                if (name not in ("up", "down") and st is not None and st.ok is False and not self.rec.lost
                        and not self.rec.recovering and not self._asked):
                    self._check_fate(name)  # a failed stage: was it the instance ending under us?
            except KeyboardInterrupt:
                if not self._second_press(name):
                    return self._detached()
                self.rec.stop_reason = "interrupted twice"
                self._end(name, ok=False, detail="interrupted")
                self._stop_job()
                self._finish_after_stop()
                continue
            except InstanceLost as exc:
                self._lost(name, exc)
            except GpuopsError:
                if name in ("up", "down", "recover") or not self._check_fate(name):
                    raise
        return self._final()

    # -- the instance's fate, from the API -------------------------------------------------------------------------
    def _fate(self) -> Optional[InstanceLost]:
        """What the API says of the run's instances: InstanceLost for the first one not running (ended, ending,
        preempted, unhealthy), or None (all active or booting, or the API could not be asked: said)."""
        from ..cloud.api import LambdaError
        from ..cloud.managed import managed_profile

        prof = managed_profile(self.rec.profile)
        if prof is None:
            return None
        try:
            ctx = self.ctx_factory()
            with ctx.client:
                ids = list(prof.cloud.instance_ids)
                if len(ids) > 1:  # a fleet: one list call for every node
                    known = {i.id: i.status for i in ctx.client.instances()}
                    statuses = [(iid, known.get(iid, "terminated")) for iid in ids]
                else:
                    statuses = []
                    for iid in ids:
                        try:
                            statuses.append((iid, ctx.client.instance(iid).status))
                        except LambdaError as exc:
                            if not exc.not_found:
                                raise
                            statuses.append((iid, "terminated"))
            now = self.seams.clock()
            self._seen.update({iid: (status, now) for iid, status in statuses})
            if self._api_down is not None:
                self.out.info(f"the Lambda API answers again about {self.rec.profile}'s instance")
                self._api_down = None
            for iid, status in statuses:
                if status not in ("active", "booting"):
                    return InstanceLost(iid, status)
        except GpuopsError as exc:
            if self._api_down is None:  # once per outage: a fleet's watch asks every 10 s
                self.out.warn(f"could not ask the Lambda API about {self.rec.profile}'s instance: {exc.message} "
                              "(asked again as the run goes on)")
            self._api_down = exc.message
        return None

    def _raise_if_lost(self) -> None:
        """A stage failed: ask the API before saying anything (InstanceLost when an instance ended under the run); the
        loop does not ask again for this failure."""
        self._asked = True
        if self.rec.lost or self.rec.recovering:
            return
        lost = self._fate()
        if lost is not None:
            raise lost

    def _check_fate(self, stage: Optional[str]) -> bool:
        """Ask the API; an instance gone under the run closes the run as lost (True)."""
        lost = self._fate()
        if lost is None:
            return False
        self._lost(stage, lost)
        return True

    def _lost(self, stage: Optional[str], exc: InstanceLost) -> None:
        """The instance ended under the run: say so at once, what is lost with it, and end the run (down confirms the
        termination and closes its records; the summary follows). Unhealthy: the instance still bills; the run is
        left to resume or to end."""
        rec = self.rec
        if rec.recovering:
            return
        price = (rec.price_per_hour or 0) * max(1, rec.nodes)
        asked = None
        if exc.status in ("terminated", "terminating"):
            from ..cloud.instances import terminated_here
            from ..cloud.ledger import Ledger

            asked = terminated_here(Ledger(), exc.instance_id)
        why = pl.why_not_recover(rec, self.seams.clock())
        if asked is None and why is None and not (stage == "fetch" and rec.job_state == "succeeded"):
            what = ("unhealthy (Lambda's status): it cannot be reached" if exc.status == "unhealthy" else
                    f"{exc.status} ({'Lambda took it back' if exc.status == 'preempted' else 'not by this run'})")
            self._start_recovery(stage, "unhealthy" if exc.status == "unhealthy" else "lost",
                                 f"instance {exc.instance_id} is {what}", exc.instance_id, exc.status)
            return
        if exc.status == "unhealthy":
            raise _ConnectionGaveUp(GpuopsError(
                f"instance {exc.instance_id} is unhealthy (Lambda's status): it cannot be reached and the job's state "
                f"is unknown; it still bills ${price:.2f}/h",
                hint=f"gpuops run --resume --id {rec.id} once it is active again, or gpuops down {rec.profile} "
                     "(its disk is wiped)"))
        who = ("Lambda took it back" if exc.status == "preempted" else
               "not by this run: another machine's gpuops, or Lambda's console")
        rec.lost = f"instance {exc.instance_id} is {exc.status} ({who})" + (
            f"; not replaced: {why}" if rec.recover > 0 else "")
        if asked is not None:  # the user ended it (the ledger says so): the run ends, no new instance
            rec.terminated_by = asked
            rec.lost = (f"instance {exc.instance_id} was terminated by `{'gpuops reap' if asked == 'reaped' else asked}`"
                        " from this machine, as asked: the run ends here (nothing is replaced or launched)")
        if rec.lost_at is None and asked is None:  # Lambda stops billing it there: billed time ends when it was seen
            rec.lost_at = self._seen.get(exc.instance_id, (None, self.seams.clock()))[1]
        self.out.error(f"{rec.lost}; {self._lost_what()}")
        if rec.run_id and rec.job_state is None:
            rec.job_state = "lost"
        for name in pl.STAGES[:-1]:  # the stage it happened in, and the ones that will not run
            st = rec.stages.get(name)
            if st is not None and st.started is not None and st.ended is None:
                self._end(name, ok=False, detail=rec.lost)
        pl.save(rec, self.project)

    def _lost_what(self) -> str:
        """What went with a lost instance: the job (or nothing: it had ended), what was only on its disk; the
        checkpoints on the run's filesystem are intact there (and how to get them)."""
        rec = self.rec
        home = self._ck_home()
        on_fs = home.name if home is not None and home.filesystem else None
        unfetched = [n for n in rec.fetch if n not in self.fetched and n != on_fs]
        lost_what = ("nothing was trained yet" if not rec.run_id else
                     f"the job {rec.run_id} had {rec.job_state} before" if rec.job_state in ("succeeded", "failed") else
                     f"the job {rec.run_id} ended with it")
        disk = (f"what was only on its disk is lost ({', '.join(unfetched)} not fetched)" if unfetched else
                "what was only on its disk is lost")
        if on_fs:
            disk += (f"; the checkpoints are intact on filesystem {rec.file_systems[0]} ({home.filesystem}); to get "
                     f"them here later: {ck.get_later(home, rec.file_systems[0], (rec.instance or {}).get('type') or rec.instance_type)}")
        return f"{lost_what}; {disk}"

    def _connection_lost(self, err: GpuopsError) -> int:
        """The instance is still there (or the API cannot tell) but unreachable: the run is left to resume, with
        the summary and the ways on."""
        rec = self.rec
        bills = (f"the instance bills ${(rec.price_per_hour or 0):.2f}/h" if self._api_down is None else
                 f"the Lambda API could not be asked ({self._api_down}): whether the instance still runs and bills "
                 f"${(rec.price_per_hour or 0):.2f}/h is not known (gpuops ls checks once the API answers)")
        self.out.error(err.message, err.hint or f"{bills}: gpuops run --resume --id {rec.id} continues the run, "
                       f"gpuops down {rec.profile} ends it")
        rec.outcome = pl.DETACHED  # the stage stays open: --resume takes it up again
        pl.save(rec, self.project)
        return int(err.code) if int(err.code) else 3

    def _budget_stop_before(self, name: str) -> None:
        """--max-cost reached before the job runs (boot, setup, sync took it): nothing more is started; down."""
        rec = self.rec
        rec.stop_reason = f"--max-cost ${rec.max_cost:.2f} reached"
        from .money import covers

        self.out.warn(f"{rec.stop_reason} ({self._cost()}) before {pl.LABELS[name]}: not going on; terminating; "
                      f"{covers(rec.max_cost)}")
        self._begin(name)
        self._end(name, ok=False, detail=rec.stop_reason)

    def _second_press(self, stage: str) -> bool:
        """First Ctrl-C: detach (everything keeps running). A second one within a few seconds: end it now."""
        from ..interrupts import received

        rec = self.rec
        if stage == "prep":  # its instance is already terminated (prepstage): nothing else was launched
            self.out.warn(self.prep_interrupted_text())
            return False
        if stage == "recover":
            r = rec.recovering or {}
            ids = ", ".join(r.get("instance_ids") or []) or "the instance"
            bills = (f"{ids} is terminated: nothing bills" if r.get("terminated") else
                     f"{ids} still bills ${(rec.price_per_hour or 0) * max(1, rec.nodes):.2f}/h")
            self.out.warn(f"interrupted{f' ({received()})' if received() else ''} while replacing the instance "
                          f"({bills}). gpuops run --resume --id {rec.id} goes on with the recovery; gpuops down "
                          f"{rec.profile} ends it")
            return False
        if stage == "up" and self._nothing_launched():
            self.out.warn(f"interrupted{f' ({received()})' if received() else ''} while waiting for capacity: "
                          f"nothing was launched and nothing bills; gpuops run --resume --id {rec.id} waits again")
            return False
        if stage == "up" or not self._instance_known():
            self.out.warn(f"interrupted{f' ({received()})' if received() else ''} while bringing the instance up: "
                          f"what was launched is terminated; gpuops run --resume --id {rec.id} starts again")
            return False
        self.out.warn(f"detached{f' ({received()})' if received() else ''}: the run keeps going on {rec.profile} "
                      f"({self._cost()}). Re-attach: gpuops watch -p {rec.profile}; resume this run: gpuops run "
                      f"--resume --id {rec.id}; end it: gpuops down {rec.profile}")
        if received():  # SIGTERM / SIGHUP: nobody is there to press again
            return False
        self.out.warn(f"press Ctrl-C again within {self.seams.second_press_s:g}s to stop the job, fetch what exists "
                      "and terminate the instance now")
        try:
            self.seams.sleep(self.seams.second_press_s)
        except KeyboardInterrupt:
            return True
        return False

    def _instance_known(self) -> bool:
        st = self.rec.stages.get("up")
        return bool(st and st.ok)

    def _nothing_launched(self) -> bool:
        """No launch request of this run was ever sent (each is recorded before it is: the regions it tried, then
        the instance it got; a record reserved for the wait for capacity has neither): nothing bills."""
        from ..cloud.ledger import Ledger

        rec = self.rec
        return (not rec.attempts and rec.billed_from is None and not rec.instance
                and not [r for r in Ledger().records() if r.profile == rec.profile
                         and (r.instance_id or r.regions_tried)])

    def _detached(self) -> int:
        st = self.rec.stages.get("up")
        if st is not None and st.ended is None and self._nothing_launched():  # not detached: nothing runs
            self.rec.stop_reason = "interrupted while waiting for capacity: nothing was launched"
            self._end("up", ok=False, detail=self.rec.stop_reason)
            self.rec.outcome = pl.FAILED
            pl.save(self.rec, self.project)
            return int(ExitCode.INTERRUPTED)
        self.rec.outcome = pl.DETACHED
        pl.save(self.rec, self.project)
        return int(ExitCode.INTERRUPTED)

    def _finish_after_stop(self) -> None:
        """After a stop (budget, second Ctrl-C): the job is over; fetch what exists, then down (unless --keep)."""
        rec = self.rec
        for name in ("train", "watch"):  # only a stage that had started ends with the stop; one that never started
            st = rec.stages.get(name)   # is no row (until #36: "FAILED interrupted twice" for stages never begun)
            if st is not None and st.started is not None and st.ended is None:
                st.ended, st.ok, st.detail = self.seams.clock(), False, rec.stop_reason
        pl.save(rec, self.project)

    def _final(self) -> int:
        rec = self.rec
        fetch = rec.stages.get("fetch")
        down = rec.stages.get("down")
        if rec.recovering or (rec.prep or {}).get("billing"):
            rec.outcome = pl.KEPT  # the instance to replace (or the preparation's) could not be terminated: said loudly
        elif rec.prep is not None and (rec.prep.get("stage") or {}).get("ok") is False:
            rec.outcome = pl.FAILED  # the preparation failed: no training instance was launched
        elif rec.terminated_by:
            rec.outcome = pl.ENDED
        elif rec.lost:
            rec.outcome = pl.LOST
        elif down is not None and down.ended is not None and not down.ok:
            rec.outcome = pl.KEPT  # the termination failed: still billing, said loudly
        elif fetch is not None and fetch.ended is not None and not fetch.ok:
            rec.outcome = pl.KEPT
        elif rec.keep and (down is None):
            rec.outcome = pl.KEPT
        elif down is not None and down.ok and rec.job_state == "succeeded" and not rec.stop_reason and not self.missing:
            rec.outcome = pl.SUCCEEDED
        else:
            rec.outcome = pl.FAILED
        pl.save(rec, self.project)
        self._forget_secrets()  # the run is over: no launch needs its --env values or --data URL again
        if rec.outcome == pl.KEPT and rec.keep and down is None:
            per_hour = (rec.price_per_hour or 0) * max(1, rec.nodes)
            self.out.warn(f"--keep: {rec.profile} is KEPT, billing ${per_hour:.2f}/h{self._until()}; gpuops down "
                          f"{rec.profile} ends it sooner")
        return 0 if rec.outcome in (pl.SUCCEEDED,) or (rec.outcome == pl.KEPT and rec.keep and
                                                       rec.job_state == "succeeded") else 1
