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
"""
from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

from . import checkpoints as ck
from . import stages as pl
from .money import billing_said
from .recovery import GpuFault, RecoveryStages
from ..errors import ExitCode, GpuopsError, UsageError

FETCH_ATTEMPTS = 3
RUN_PYTHON = "~/.venvs/gpuops/bin/python"  # the environment `setup` creates on a fresh instance (the runbooks' venv)


def run_template(template: Optional[dict], name: Optional[str]) -> tuple[Optional[dict], Optional[str]]:
    """A --from template as a run uses it, decided before anything is launched: a python: inside a virtual
    environment is the run's (setup creates it); a system python (`python3`, `/usr/bin/python3`: the image's, with
    its CUDA torch) is what the run's environment is made from, with its packages visible (setup.base_python); anything
    else is refused here (exit 2). Returns (template, a note to show)."""
    import os
    import re
    import shlex

    from ..setup.plan import env_dir_or_none

    py = (template or {}).get("python")
    if py is None or env_dir_or_none(str(py)) is not None:
        return template, None
    first = (shlex.split(str(py)) or [""])[0]
    if not re.fullmatch(r"python[0-9.]*", os.path.basename(first)):
        raise UsageError(f"--from {name}: python: {py!r} is neither a Python interpreter nor one inside a virtual "
                         "environment; nothing was launched",
                         hint=f"give an interpreter (python3, /usr/bin/python3) or an environment's "
                              f"(~/venv/bin/python); the run's own is {RUN_PYTHON}")
    setup = dict((template or {}).get("setup") or {})
    setup.setdefault("base_python", str(py))
    note = (f"--from {name}: python: {py} is the system's; the run trains in {RUN_PYTHON}, which setup makes from {py} "
            "with its packages visible (the image's torch included)")
    return {**template, "python": RUN_PYTHON, "setup": setup}, note


def _use_env_python(profile_file: Path, python: str) -> None:
    """`up` writes no python:, so the instance's system Python would be used; a run trains in its own environment,
    which `setup` creates and fills."""
    import re

    from ..paths import write_atomic

    text = profile_file.read_text()
    if re.search(r"(?m)^python:", text):
        return
    write_atomic(profile_file, text.rstrip("\n") + f"\npython: {python}\n")
SECOND_CTRL_C_S = 10.0


class BudgetReached(Exception):
    """Raised from watch's event callback (or up's wait hook) when --max-cost is reached."""

    def __init__(self, reason: str = "--max-cost reached"):
        super().__init__(reason)
        self.reason = reason


class InstanceLost(Exception):
    """The API says an instance of the run ended (terminated, terminating, preempted) or is unhealthy."""

    def __init__(self, instance_id: str, status: str):
        super().__init__(f"instance {instance_id} is {status}")
        self.instance_id, self.status = instance_id, status


FATE_EVERY_S = 30.0  # while reconnecting, the API is asked again at most this often
FLEET_FATE_EVERY_S = 10.0  # a fleet's watch follows node 0: the API is asked this often whether every node is there


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
               idle_s: Optional[float] = None, guard: Optional[str] = None,
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
                     env_names=list(env_names or []), force=force, idle_s=idle_s, guard=guard)


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


class Runner(RecoveryStages):
    """One `gpuops run`: drives the stages of a record, saving it as it goes."""

    def __init__(self, rec: pl.Record, out, project: Path, ctx_factory, seams: Optional[Seams] = None,
                 confirm: Optional[Callable[[str], bool]] = None,
                 create_fs: Optional[Callable[[str], Optional[bool]]] = None, env: Optional[list] = None):
        self.rec, self.out, self.project = rec, out, project
        self.create_fs = create_fs  # --fs NAME missing: asked before creating it (cli.fs.fs_question)
        self._env_given = list(env or [])  # --env NAME=VALUE of a new run: written to the 0600 file, never the record
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
        pl.end(self.rec, name, self.project, ok=ok, detail=detail, clock=self.seams.clock)

    # -- the loop ------------------------------------------------------------------------------------------------
    def _env_file(self) -> Path:
        return pl.records_dir(self.project) / f"{self.rec.id}.env"

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
        pl.save(self.rec, self.project)
        self.out.info(f"run {self.rec.id}: record {pl.records_dir(self.project) / (self.rec.id + '.json')} "
                      f"(gpuops run --resume --id {self.rec.id} continues it)")
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
        unfetched = [n for n in rec.fetch if n not in self.fetched]
        lost_what = ("the job " + (rec.run_id or "") + " ended with it" if rec.run_id else "nothing was trained yet")
        disk = (f"what was only on its disk is lost ({', '.join(unfetched)} not fetched)" if unfetched else
                "what was only on its disk is lost")
        self.out.error(f"{rec.lost}; {lost_what}; {disk}")
        if rec.run_id and rec.job_state is None:
            rec.job_state = "lost"
        for name in pl.STAGES[:-1]:  # the stage it happened in, and the ones that will not run
            st = rec.stages.get(name)
            if st is not None and st.started is not None and st.ended is None:
                self._end(name, ok=False, detail=rec.lost)
        pl.save(rec, self.project)

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
        self.out.warn(f"{rec.stop_reason} ({self._cost()}) before {pl.LABELS[name]}: not going on; terminating")
        self._begin(name)
        self._end(name, ok=False, detail=rec.stop_reason)

    def _second_press(self, stage: str) -> bool:
        """First Ctrl-C: detach (everything keeps running). A second one within a few seconds: end it now."""
        from ..interrupts import received

        rec = self.rec
        if stage == "recover":
            r = rec.recovering or {}
            ids = ", ".join(r.get("instance_ids") or []) or "the instance"
            bills = (f"{ids} is terminated: nothing bills" if r.get("terminated") else
                     f"{ids} still bills ${(rec.price_per_hour or 0) * max(1, rec.nodes):.2f}/h")
            self.out.warn(f"interrupted{f' ({received()})' if received() else ''} while replacing the instance "
                          f"({bills}). gpuops run --resume --id {rec.id} goes on with the recovery; gpuops down "
                          f"{rec.profile} ends it")
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

    def _detached(self) -> int:
        self.rec.outcome = pl.DETACHED
        pl.save(self.rec, self.project)
        return int(ExitCode.INTERRUPTED)

    def _finish_after_stop(self) -> None:
        """After a stop (budget, second Ctrl-C): the job is over; fetch what exists, then down (unless --keep)."""
        rec = self.rec
        for name in ("train", "watch"):
            st = rec.stage(name)
            if st.ended is None:
                st.started = st.started or self.seams.clock()
                st.ended, st.ok, st.detail = self.seams.clock(), False, rec.stop_reason
        pl.save(rec, self.project)

    def _final(self) -> int:
        rec = self.rec
        fetch = rec.stages.get("fetch")
        down = rec.stages.get("down")
        if rec.recovering:
            rec.outcome = pl.KEPT  # the instance to replace could not be terminated: still billing, said loudly
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
        self._env_file().unlink(missing_ok=True)  # the run is over: no launch needs its --env values again
        if rec.outcome == pl.KEPT and rec.keep and down is None:
            per_hour = (rec.price_per_hour or 0) * max(1, rec.nodes)
            self.out.warn(f"--keep: {rec.profile} is KEPT, billing ${per_hour:.2f}/h{self._until()}; gpuops down "
                          f"{rec.profile} ends it sooner")
        return 0 if rec.outcome in (pl.SUCCEEDED,) or (rec.outcome == pl.KEPT and rec.keep and
                                                       rec.job_state == "succeeded") else 1

    # -- the stages ----------------------------------------------------------------------------------------------
    def up_spec(self, tick: Callable[[dict], None]):
        """What `up` is asked for, from the run's record: the first instance and every replacement alike. A
        replacement is not asked to confirm (--recover N said yes) and gets what is left of the run's --ttl."""
        from ..cloud.instances import UpSpec

        rec = self.rec
        return UpSpec(name=rec.profile, **pl.launch_ask(rec), key=Path(rec.key).expanduser() if rec.key else
                      Path("~/.ssh/id_ed25519").expanduser(), regions=list(rec.regions),
                      ttl_s=pl.ttl_left(rec, self.seams.clock()), idle_s=rec.idle_s,
                      guard_on_instance=rec.guard == "on-instance", verify=False,
                      confirm=None if rec.attempts else self.confirm, nodes=rec.nodes, template=rec.template, tick=tick,
                      create_fs=None if rec.attempts else self.create_fs)

    def stage_up(self) -> None:
        from ..cloud.up import up

        rec = self.rec
        existing = self._managed_profile()
        again = rec.stages.get("up") is not None and rec.stages["up"].started is not None
        self._begin("up")
        if existing is not None:  # resumed after `up` had written the profile
            rec.price_per_hour = existing.price_per_hour
            rec.instance = {"ids": list(existing.cloud.instance_ids), "type": existing.instance_type,
                            "region": existing.region}
            self._end("up", ok=True, detail=f"instance {existing.cloud.instance_id} (resumed)")
            return
        ctx = self.ctx_factory()

        def tick(info: dict) -> None:  # --max-cost from the launch on: boot, SSH
            if info["phase"] == "capacity":
                return  # nothing bills while no instance exists (--wait-for-capacity)
            if rec.billed_from is None:
                rec.billed_from = self.seams.clock()
            rec.price_per_hour = info["price_per_hour"]
            if pl.over_budget(rec, self.seams.clock()):
                raise BudgetReached(f"--max-cost ${rec.max_cost:.2f} reached while bringing the instance up")

        if rec.ttl_s and rec.ttl_deadline is None:  # the run's TTL, for every instance it will launch
            rec.ttl_deadline = self.seams.clock() + rec.ttl_s
        spec = self.up_spec(tick)
        try:
            with ctx.client:
                if again:  # resumed after `up` launched but before it wrote the profile: those instances are ours
                    from ..cloud.launch import reclaim_unwritten

                    self._reclaimed(ctx, reclaim_unwritten(ctx, rec.profile))
                res = up(spec, ctx)
        except BudgetReached as exc:  # up terminated what it had launched
            rec.stop_reason = exc.reason
            self.out.warn(f"{exc.reason} ({self._cost()}): the instance was terminated before anything ran")
            self._end("up", ok=False, detail=exc.reason)
            return
        except GpuopsError as exc:
            self._failed_launch(ctx)
            self._end("up", ok=False, detail=exc.message)
            if rec.attempts:  # a replacement that could not be launched ends the run, saying what bills
                return self._relaunch_failed(exc)
            if not again and not [r for r in ctx.ledger.records() if r.profile == rec.profile]:
                # refused before any launch request (the options, the key, the user's no): no run to resume
                (pl.records_dir(self.project) / f"{rec.id}.json").unlink(missing_ok=True)
                self._env_file().unlink(missing_ok=True)
                self.out.info(f"nothing was launched: run {rec.id}'s record is removed")
            raise
        rec.price_per_hour = res["price_per_hour"]
        rec.instance = {"ids": [n["instance_id"] for n in res.get("nodes") or []] or [res["instance_id"]],
                        "type": res["instance_type"], "region": res["region"]}
        self._seen.update({iid: ("active", self.seams.clock()) for iid in rec.instance["ids"]})
        _use_env_python(Path(res["profile_file"]), RUN_PYTHON)
        if res.get("nodes"):
            self._end("up", ok=True, detail=f"{len(res['nodes'])} instances in {res['region']} ({res['instance_type']}): " +
                      ", ".join(f"#{n['rank']} {n['instance_id']} at {n['ip']}" for n in res["nodes"]))
        else:
            self._end("up", ok=True, detail=f"instance {res['instance_id']} ({res['instance_type']}) at {res['ip']}, "
                                            f"{res['region']}")

    def _failed_launch(self, ctx) -> None:
        """A launch that failed after an instance existed (up terminated it): its ids, from the ledger, for the
        summary (a row that billed shows which instance it was, never `running` with no id)."""
        rec = self.rec
        if rec.billed_from is None:
            return
        got = [lr for lr in ctx.ledger.records() if lr.profile == rec.profile and lr.instance_id
               and lr.created_at >= rec.billed_from - 60 and lr.instance_id not in
               {i for a in rec.attempts + rec.reclaimed for i in (a.get("instance") or {}).get("ids") or []}]
        rec.instance = {"ids": [lr.instance_id for lr in got], "type": got[0].instance_type if got else None,
                        "region": got[0].region if got else None, "failed": True}

    def _reclaimed(self, ctx, ids: list) -> None:
        """Instances a cut-off bring-up of this run launched, just terminated: they billed, so the run counts them
        (its summary, its spend and --max-cost), from the launch request to the confirmed termination, as the ledger
        recorded them; the next launch bills from its own request."""
        rec = self.rec
        if not ids:
            return
        for lr in ctx.ledger.records():
            if lr.profile != rec.profile or lr.instance_id not in ids:
                continue
            rec.reclaimed.append({"instance": {"ids": [lr.instance_id], "type": lr.instance_type,
                                               "region": lr.region},
                                  "price_per_hour": lr.price_cents_per_hour / 100.0, "nodes": 1,
                                  "started": rec.billed_from or lr.created_at,
                                  "ended": lr.ended_at or self.seams.clock(),
                                  "reason": "reclaimed by --resume: its bring-up was cut off before the profile was "
                                            "written; terminated"})
        rec.billed_from = None
        pl.save(rec, self.project)

    def _managed_profile(self):
        from ..profiles import model as profiles

        try:
            prof = profiles.resolve(self.rec.profile, self.project)
        except GpuopsError:
            return None
        return prof if getattr(prof, "cloud", None) is not None and prof.cloud.state != "gone" else None

    def _every_node(self, prof, fn: Callable) -> list:
        """fn(node, node_output) on every host of a fleet in parallel (fleet.for_each, a bounded pool); each host's
        lines replayed as a section in rank order (on stderr, with the stages' progress). Returns the NodeResults."""
        from .. import fleet

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

    def stage_setup(self) -> None:
        from ..setup.apply import setup
        from ..verify.host import exit_code, show

        self._begin("setup")
        prof = self._profile()
        if prof.is_fleet:  # every node set up in parallel, then ONE fleet verify: each host, and the hosts together
            from .. import fleet
            from ..verify.host import run_fleet_verify

            failed = self._failed_hosts(self._every_node(
                prof, lambda node, node_out: setup(node, node_out, self.project, verify=False)))
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
            doc = setup(prof, self.out, self.project, verify=True, on_plan=on_plan)
        except GpuopsError as exc:
            self._end("setup", ok=False, detail=exc.message)
            self._raise_if_lost()  # an instance ended under the run: that is the first line, not the failure it caused
            self.out.error(f"setup failed: {exc.message}", pl.refusal_hint(exc.hint, kept=self.rec.keep))
            return
        code = exit_code(doc["verify"]) if doc.get("verify") else 0
        if code and doc.get("verify_results") is not None and not self.out.json_mode:
            show(self.out, doc["verify"], doc["verify_results"])
        self._end("setup", ok=code == 0, detail="the host matches the profile" if code == 0 else
                  "verify fails after setup: the host does not match the profile")

    def stage_sync(self) -> None:
        from ..remote.connection import connect
        from ..transfer.sync import sync_project

        self._begin("sync")
        prof = self._profile()
        # the run's output folders are never uploaded (a stale step folder, another run's fetch): the job writes
        # them; a replacement gets the checkpoint it resumes from through `push`
        fprof = self._fetch_profile()
        excludes = ck.sync_excludes(ck.names(self.rec.fetch, self._mount(fprof)), fprof.fetch)
        if self.rec.data:  # a data folder inside the project goes to its own place (_put_data), not with the project
            from ..transfer.dataplan import parse, project_exclude

            try:
                excludes += [x for x in [project_exclude(parse(self.rec.data, self.project), self.project)] if x]
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

    def _put_data(self, node, node_out) -> str:
        """--data on this node: on the run's filesystem when it has one (GPUOPS_FS/gpuops/data/NAME), else on the
        instance's disk; a URL or hf:// repo downloaded by the instance. Returns GPUOPS_DATA."""
        from ..profiles.model import environment
        from ..remote.connection import connect
        from ..transfer import data, dataplan

        src = dataplan.parse(self.rec.data, self.project)
        fss = self._profile().cloud.filesystems
        here = environment(self.project) if src.kind == "hf" else {}
        if here.get("HF_TOKEN"):  # a secret: scrubbed from every message from here on, as the API key is
            from ..cloud.api import Secret, redact

            Secret(here["HF_TOKEN"])
        with connect(node, announce=node_out.info) as remote:
            try:
                return data.put(node, remote, node_out, src, fss[0].mount_point if fss else None,
                                token=here.get("HF_TOKEN"), endpoint=here.get("HF_ENDPOINT"))["path"]
            except GpuopsError as exc:
                raise GpuopsError(redact(exc.message) if here.get("HF_TOKEN") else exc.message, hint=exc.hint,
                                  code=exc.code) from None

    def stage_train(self) -> None:
        from ..jobs import actions as lifecycle
        from ..jobs import plan as core

        rec = self.rec
        self._begin("train")
        prof = self._profile()
        if rec.run_id and any(m["run_id"] == rec.run_id for m in core.local_runs(prof.name, self.project)):
            self._end("train", ok=True, detail=f"run {rec.run_id} (resumed)")
            return
        try:
            self._link_checkpoints(prof)  # run --fs: checkpoints/ is the run's folder on the filesystem
        except GpuopsError as exc:
            self.out.error(f"not launched: {exc.message}", exc.hint)
            self._end("train", ok=False, detail=exc.message)
            return
        env = self._job_env() + ([f"GPUOPS_RESUME_FROM={rec.resume_from}"] if rec.resume_from else [])
        env += [f"GPUOPS_DATA={rec.data_path}"] if rec.data_path else []
        opts = dict(script=rec.script, args=rec.args, sync=False, env=env, seed=rec.seed, force=rec.force)
        try:
            if prof.is_fleet or rec.launcher != "none":  # one run id on every node, with its rank and addresses
                res = lifecycle.train_fleet(prof, self.out, self.project, launcher=rec.launcher, nproc=rec.nproc,
                                            **opts)
            else:
                res = lifecycle.train(prof, self.out, self.project, **opts)
        except GpuopsError as exc:  # the launch gate refused a broken stack, or the launch failed
            self._end("train", ok=False, detail=exc.message)
            self._raise_if_lost()
            said = exc.message.removesuffix("; not launching")  # the gate's own ending, said once by the prefix
            self.out.error(f"not launched: {said}", pl.refusal_hint(exc.hint, kept=rec.keep))
            return
        rec.run_id = res["run_id"]
        self._end("train", ok=True, detail=f"run {res['run_id']}")

    def stage_watch(self) -> None:
        from ..jobs import actions as lifecycle
        from ..jobs import plan as core
        from ..jobs import watch as w

        rec = self.rec
        self._begin("watch")
        fleet_prof = self._profile()
        fleet_meta = lifecycle.resolve(rec.run_id, fleet_prof, self.project)
        prof, meta = fleet_prof.node(0), core.node_meta(fleet_meta, 0)  # a fleet: rank 0's log, then every node's end
        dash = w.Dashboard(meta, price_per_hour=(prof.price_per_hour or 0) * max(1, rec.nodes), log_lines=15)
        budget_said = [False]
        asked = [None]  # when the API was last asked about the instance during this outage
        fleet_asked = [self.seams.clock()]  # a fleet: when the API was last asked about every node
        extras, health, fetcher = self._watch_extras(prof)
        others, other_health = self._other_nodes_sampler(fleet_prof), {}
        from .status import StatusLine, status_text

        status = StatusLine(self.out, lambda: status_text(pl.LABELS["watch"], dash.elapsed(),
                                                          pl.spend(rec, self.seams.clock()), dash.progress()))

        def on_event(ev: dict) -> None:
            self._watch_event(ev, health, fetcher)
            if others is not None:
                self._other_nodes_events(others.drain(), other_health)
            if rec.nodes > 1 and self.seams.clock() - fleet_asked[0] >= FLEET_FATE_EVERY_S:
                fleet_asked[0] = self.seams.clock()  # node 0's stream does not see another node end
                lost = self._fate()
                if lost is not None:
                    raise lost
            if ev.get("type") == "log" and not self.out.json_mode:
                self.out.print(ev["line"])
            elif ev.get("type") == "reconnecting":
                self._reconnecting(ev, asked)
            elif ev.get("type") == "connected":
                asked[0] = None
                self.out.info(f"reconnected to {prof.host}; resuming the log")
            status.tick()
            if pl.over_budget(rec, self.seams.clock()) and not budget_said[0]:
                budget_said[0] = True
                raise BudgetReached()

        try:
            with others or contextlib.nullcontext(), status:
                res = lifecycle.follow(prof, self.out, self.project, meta, dash, lines=5, samples=True,
                                       interval=self.seams.poll_s, on_event=on_event, extras=extras,
                                       give_up_after=rec.unreachable_s)
        except BudgetReached:
            return self._budget_stop()
        except GpuFault as exc:
            return self._gpu_fault(exc)
        except GpuopsError as exc:  # gave up reconnecting, a host key that is not the instance's, ...
            return self._gave_up(exc)
        if res["interrupted"]:
            raise KeyboardInterrupt
        self._end_fetcher()
        info = res["info"]
        if info is not None and info.state == core.FAILED and not rec.stop_reason:
            found = self._health_now(prof)  # a GPU that fell off the bus kills the job before the next sample
            if found:
                return self._job_died_with_its_gpu(found, info)
        rec.job_state = info.state if info is not None else "lost"
        ok = info is not None and info.state == core.SUCCEEDED
        self.out.info(f"job {rec.run_id}: {rec.job_state}" + (f" (exit {info.exit_code})" if info and
                                                              info.exit_code is not None else "")
                      + (" on host #0" if len(fleet_meta.get("nodes") or []) > 1 else ""))
        if len(fleet_meta.get("nodes") or []) > 1:  # the run ends when every node's job has, with the worst outcome
            try:
                lifecycle.wait_fleet(fleet_prof, self.out, self.project, fleet_meta, interval=self.seams.poll_s,
                                     sleep=self._budget_sleep)
            except BudgetReached:
                return self._budget_stop()
            infos = lifecycle.fleet_states(fleet_prof, self.out, fleet_meta)
            bad = [(i, x) for i, x in enumerate(infos) if x is None or x.state != core.SUCCEEDED]
            ok = not bad
            rec.job_state = core.SUCCEEDED if ok else (bad[0][1].state if bad[0][1] is not None else "lost")
            detail = rec.job_state if ok else "; ".join(f"host #{i}: {x.state if x else 'unknown'}" for i, x in bad)
            self.out.info(f"job {rec.run_id} on {len(infos)} hosts: {detail}")
            self._end("watch", ok=ok, detail=detail)
            return
        self._end("watch", ok=ok, detail=rec.job_state)

    def _gave_up(self, exc: GpuopsError) -> None:
        """The watch could not reach the instance: the API first (never a stranger's fingerprint for an instance
        that is gone); still running and unreachable past the limit: replaced with --recover, else the run detaches."""
        from ..errors import AuthError, ConnectError, HostKeyError

        lost = self._fate()
        if lost is not None:
            raise lost
        if (isinstance(exc, ConnectError) and not isinstance(exc, (AuthError, HostKeyError))
                and pl.why_not_recover(self.rec, self.seams.clock()) is None):
            return self._start_recovery("watch", "unreachable", f"{self.rec.profile}: {exc.message} ("
                                        + self._api_says() + ")")
        raise _ConnectionGaveUp(exc)

    def _reconnecting(self, ev: dict, asked: list) -> None:
        """The connection dropped: ask the API (at once, then at most every FATE_EVERY_S) before saying anything; an
        instance that ended is said at once (InstanceLost), a running one is reconnected to, saying so."""
        now = self.seams.clock()
        said = ""
        if asked[0] is None or now - asked[0] >= FATE_EVERY_S:
            asked[0] = now
            lost = self._fate()
            if lost is not None:
                raise lost
            said = "; " + self._api_says()
        self.out.info(f"connection to {self.rec.profile} lost ({ev['error']}){said}: reconnecting (attempt "
                      f"{ev['attempt']}, in {ev['delay']:g}s; {self._cost()})")

    def _api_says(self) -> str:
        """What the last question to the API (just asked by _fate) tells of an instance that did not end."""
        if self._api_down is None:
            return "the Lambda API shows the instance running"
        return (f"the Lambda API could not be asked ({self._api_down}): whether the instance still runs is not "
                "known")

    def _billing(self, ids: list) -> tuple[str, Optional[str]]:
        """A terminate that failed: what may be said of the money (billing_said), and what to check when the API
        last showed the instances ended (None: the usual hint)."""
        price = (self.rec.price_per_hour or 0) * max(1, self.rec.nodes)
        text, billing = billing_said(ids, self._seen, price)
        return text + (self._until() if billing else ""), (None if billing else f"check: gpuops ls once the Lambda API answers (a revoked key: set a new "
                                           f"LAMBDA_API_KEY); gpuops down {self.rec.profile} ends it if it still runs")

    def _budget_stop(self) -> None:
        """--max-cost reached while watching: stop the job (every node), then fetch what exists and terminate."""
        rec = self.rec
        rec.stop_reason = f"--max-cost ${rec.max_cost:.2f} reached"
        self.out.warn(f"{rec.stop_reason} ({self._cost()}): stopping the job, then fetching what exists")
        self._stop_job()
        self._end("watch", ok=False, detail=rec.stop_reason)

    def _budget_sleep(self, s: float) -> None:
        """The wait between fleet samples, with --max-cost checked at each."""
        if pl.over_budget(self.rec, self.seams.clock()):
            raise BudgetReached()
        self.seams.sleep(s)

    def _stop_job(self) -> None:
        from ..jobs import actions as lifecycle

        rec = self.rec
        if not rec.run_id:
            return
        try:
            prof = self._profile()
            meta = lifecycle.resolve(rec.run_id, prof, self.project)
            if meta.get("nodes"):
                doc = lifecycle.stop_fleet(prof, self.out, self.project, meta, grace=10.0)
                result = ", ".join(f"#{h['rank']} {h.get('result') or h.get('error')}" for h in doc["hosts"])
            else:
                result = lifecycle.stop(prof, self.out, self.project, meta, grace=10.0)["result"]
            rec.job_state = "stopped"
            self.out.info(f"job {rec.run_id} stopped ({result})")
        except GpuopsError as exc:
            self.out.warn(f"could not stop {rec.run_id}: {exc.message}")

    def stage_fetch(self) -> None:
        from ..remote.connection import connect
        from ..transfer.fetch import NeverCreated, fetch

        rec = self.rec
        self._begin("fetch")
        self._end_fetcher()  # a checkpoint fetched while training: never two fetches into one folder
        prof = self._fetch_profile()
        failed = []
        if rec.run_id:
            from ..jobs import actions as lifecycle

            meta = lifecycle.resolve(rec.run_id, prof, self.project)
            for rank in range(max(1, len(meta.get("nodes") or []))):  # a fleet: every node's log
                key = "log" if rank == 0 else f"log.host{rank}"
                try:
                    self.fetched[key] = self._save_log(prof, meta, rank, key)
                except GpuopsError as exc:
                    failed.append(f"the job's log{f' on host #{rank}' if rank else ''}: {exc.message}")
        absent = []  # names the job never created: nothing on the instance to keep it billing for
        for name in rec.fetch:
            last = None
            for attempt in range(1, FETCH_ATTEMPTS + 1):
                try:
                    with connect(prof, announce=self.out.info) as remote:
                        s = fetch(prof, remote, self.out, name, dest=ck.fetch_dest(rec.id, name, self.project),
                                  project_dir=self.project)
                    self.fetched[name] = _rel(s.get("dest"), self.project) or ck.local_dir(rec.id, name)
                    last = None
                    break
                except NeverCreated as exc:
                    absent.append(name)
                    self.out.warn(f"{name}: {exc.message}: the job never created it, so there is nothing on the "
                                  "instance to keep it billing for" + ("" if rec.keep else "; it is terminated"))
                    break
                except GpuopsError as exc:
                    last = exc
                    self.out.warn(f"fetch {name} failed (attempt {attempt}/{FETCH_ATTEMPTS}): {exc.message}")
                    if attempt < FETCH_ATTEMPTS:
                        self.seams.sleep(min(30.0, 2.0 * attempt))
            if last is not None:
                failed.append(f"{name}: {last.message}")
        if failed:
            self._end("fetch", ok=False, detail="; ".join(failed))
            self.out.error(f"FETCH FAILED, so the instance is KEPT (it bills ${rec.price_per_hour or 0:.2f}/h"
                           f"{self._until()}): " + "; ".join(failed),
                           f"fix and run: gpuops fetch -p {rec.profile} NAME, then gpuops down {rec.profile} "
                           f"(gpuops ls shows it)")
            return
        self.missing = absent
        self._end("fetch", ok=True, detail=", ".join([f"{k} -> {v}" for k, v in self.fetched.items()]
                                                     + [f"{n}: never created" for n in absent]) or "nothing named")

    def _until(self) -> str:
        """The deadline of an instance the run leaves billing: its TTL (a tag on the instance and in the ledger)."""
        from datetime import timezone

        if self.rec.ttl_deadline is None:
            return ", with no TTL"
        when = datetime.fromtimestamp(self.rec.ttl_deadline, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f" until its TTL, {when}, when `gpuops reap` ends it"

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
            steps = tr.step_dirs(rows)
            v = ck.resumable(steps, files=rows, since=None, job="died", quiet=False)
            if v.dir is not None:
                e = ck.entry(home.name, home.remote, v.dir or None, v.step, self.seams.clock(), rec.id,
                             home.filesystem)
                if ck.newer(e, rec.checkpoint):
                    rec.checkpoint = e
                rec.resume_from = rec.checkpoint["path"]
            aside = ck.set_aside(steps, (rec.checkpoint or {}).get("step") if rec.resume_from else None)
            if aside:  # the resumed job writes these steps again: what the lost job left of them is kept aside
                stamp = datetime.fromtimestamp(self.seams.clock()).strftime("%Y%m%d-%H%M%S")
                with connect(prof.node(0), announce=self.out.info) as remote:
                    res = remote.run(ck.set_aside_command(home.filesystem, aside, stamp), timeout=120)
                if res.rc != 0:
                    raise GpuopsError(f"could not set aside {', '.join(aside)} on the filesystem: "
                                      f"{(res.stderr.strip().splitlines() or ['exit ' + str(res.rc)])[-1]}")
                self.out.warn(f"on the filesystem, not known complete when the job died: {', '.join(aside)}; set "
                              f"aside into {home.filesystem}.passed-over/ (the job writes those steps again)")
        pl.save(rec, self.project)

    def _save_log(self, prof, meta: dict, rank: int, name: str) -> str:
        """Host `rank`'s whole log of the job (raw bytes, streamed) as runs/<run id>/<name>, written under a temporary
        name first."""
        import os

        from ..jobs import actions as lifecycle
        from ..jobs import plan as core

        final = core.registry_dir(self.project) / self.rec.run_id / name
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{name}.partial")
        with open(tmp, "wb") as fh:
            lifecycle.tail(prof.node(rank), self.out, self.project, core.node_meta(meta, rank), 10 ** 9, fh.write)
        os.replace(tmp, final)
        return str(final.relative_to(self.project))

    def stage_down(self) -> None:
        from ..cloud.down import down

        rec = self.rec
        self._begin("down")
        ctx = self.ctx_factory()
        try:
            with ctx.client:
                res = down(rec.profile, ctx, project_dir=self.project)
        except GpuopsError as exc:  # e.g. the terminate request refused (5xx) after its retries: still billing
            from ..cloud.managed import managed_profile

            prof = managed_profile(rec.profile)
            ids = prof.cloud.instance_ids if prof is not None else []
            what = (f"instance {ids[0]}" if len(ids) == 1 else f"instances {', '.join(ids)}") if ids else "the instance"
            self._end("down", ok=False, detail=exc.message)
            money, check = self._billing(ids)
            self.out.error(f"could not terminate {what} ({exc.message}): {money}",
                           check or f"gpuops down {rec.profile} ends it (gpuops run --resume --id {rec.id} too, "
                                    "closing the run); gpuops ls shows it")
            return
        if len(res.get("instance_ids") or []) > 1:
            self._end("down", ok=True, detail=", ".join(f"instance {i} {st}" for i, st in
                                                         zip(res["instance_ids"], res["statuses"])))
        else:
            self._end("down", ok=True, detail=f"instance {res['instance_id']} {res['status']}")


def _rel(path: Optional[str], project: Path) -> Optional[str]:
    """A fetched folder as the summary shows it: relative to the project folder where it is inside."""
    if not path:
        return None
    try:
        return str(Path(path).resolve().relative_to(project.resolve()))
    except ValueError:
        return str(path)


class _ConnectionGaveUp(Exception):
    """The instance cannot be reached, and the API does not say it ended: the run is left to resume."""

    def __init__(self, error: GpuopsError):
        super().__init__(error.message)
        self.error = error


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


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def checkpoints_doc(rec: pl.Record) -> Optional[dict]:
    """Where this run's checkpoints are (pipeline.checkpoints.home) and the newest that counts, for the summary;
    on a filesystem and not fetched: how to get them later."""
    home = ck.home(rec.id, rec.fetch, mount=rec.ck_filesystem)
    if home is None:
        return None
    newest = rec.checkpoint or {}
    doc = {**home.to_json(), "newest": ck.where(newest), "step": newest.get("step"), "fetched": home.name in rec.fetch}
    if home.filesystem and home.name not in rec.fetch:
        doc["get_later"] = ck.get_later(home, rec.file_systems[0], (rec.instance or {}).get("type") or
                                        rec.instance_type)
    return doc


def render_summary(out, rec: pl.Record, fetched: dict, now: float) -> dict:
    """The closing table: time and money per stage (and per instance, when one was replaced), where the checkpoints
    are, the environment snapshot."""
    rows = pl.summary(rec, now)
    total = pl.spend(rec, now)
    insts = pl.instances(rec, now)
    env = Path("runs") / rec.run_id / "environment" if rec.run_id else None
    doc = {"run": rec.id, "profile": rec.profile, "outcome": rec.outcome, "job": rec.job_state, "run_id": rec.run_id,
           "stages": rows, "instances": insts, "total_cost": round(total, 4), "fetched": fetched,
           "environment": str(env) if env and env.is_dir() else None, "overhead": pl.overhead(rec),
           "stop_reason": rec.stop_reason, "recoveries": len(rec.attempts), "resumed_from": rec.resume_from,
           "checkpoint": (rec.checkpoint or {}).get("local"), "checkpoints": checkpoints_doc(rec), "ttl_s": rec.ttl_s,
           "ttl_deadline_at": (datetime.fromtimestamp(rec.ttl_deadline).astimezone().isoformat(timespec="seconds")
                               if rec.ttl_deadline else None),
           "warnings": list(dict.fromkeys(out.warnings))}  # every warning said on stderr, once each
    if out.json_mode:
        from .. import jsonvocab

        out.emit_json(jsonvocab.run(doc))  # docs/json.md's names; the caller reads `doc` under the runner's own
        return doc
    out.print(f"gpuops run {rec.id}: {rec.outcome}" + (f" (job {rec.job_state})" if rec.job_state else ""))
    many = len(insts) > 1
    for r in rows:
        mark = "ok" if r["ok"] else ("--" if r["ok"] is None else "FAILED")
        label = (f"#{r['instance']} " if many else "") + r["label"]
        out.print(f"  {label:<32} {r['seconds']:>8.1f} s  ${r['cost']:>8.4f}  {mark}"
                  + (f"  {r['detail']}" if r["detail"] else ""))
    if many:
        for i in insts:
            head = f"instance #{i['instance']} {', '.join(i['ids']) or '?'}"
            when = f"{_hms(i['started'])}-{_hms(i['ended_at']) if i['ended_at'] else 'now'}" if i["started"] else ""
            out.print(f"  {head:<32} {i['seconds']:>8.1f} s  ${i['cost']:>8.4f}  {i['type'] or ''}"
                      f"{', ' + i['region'] if i['region'] else ''} {when}: {i['ended']}")
    out.print(f"  {'total':<32} {sum(r['seconds'] for r in rows):>8.1f} s  ${total:>8.4f}")
    for name, where in fetched.items():
        out.print(f"  {name}: {where} (verified)")
    if doc["checkpoints"]:
        c = doc["checkpoints"]
        if c["filesystem"]:
            out.print(f"  checkpoints of this run: {c['filesystem']} on filesystem {rec.file_systems[0]}"
                      + (f", fetched into {c['local']}" if c["fetched"] else ", not fetched (nothing of them crossed "
                         f"this machine); to get them here later: {c['get_later']}")
                      + (f"; resumable from {c['newest']}" if c.get("newest") else ""))
        else:
            out.print(f"  checkpoints of this run: {c['local']} here (on the instance: {c['remote']})"
                      + (f"; resumable from {c['newest']}" if c.get("newest") else ""))
    if doc["environment"]:
        out.print(f"  environment snapshot: {doc['environment']}")
    return doc
