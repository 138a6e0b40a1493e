"""`gpuops run`'s watch stage (a mixin of the Runner): the job followed to its end with the status line, the API
asked whether the instance still runs while the connection is lost, --max-cost checked while training (the job
stopped), GPU health and checkpoints through the RecoveryStages' watch extras."""
from __future__ import annotations

import contextlib

from ..errors import GpuopsError
from .recovery import GpuFault
from .stops import BudgetReached, _ConnectionGaveUp
from . import stages as pl


FATE_EVERY_S = 30.0  # while reconnecting, the API is asked again at most this often
FLEET_FATE_EVERY_S = 10.0  # a fleet's watch follows node 0: the API is asked this often whether every node is there


class WatchStage:
    """The watch stage of the Runner (pipeline/runner.py) and how it stops a job."""

    def stage_watch(self) -> None:
        from ..jobs import actions as lifecycle
        from ..jobs import fleetactions
        from ..jobs import plan as core
        from ..jobs import watch as w

        rec = self.rec
        # the job's lines from the first (a traceback printed while the launch stage ran, longer than 5 lines, never
        # reached the terminal: issue #36); a watch taken up again (--resume) replays the last 5, as `watch` does
        resumed = bool(rec.stages.get("watch") and rec.stages["watch"].started)
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
                res = lifecycle.follow(prof, self.out, self.project, meta, dash, lines=5 if resumed else None,
                                       samples=True, interval=self.seams.poll_s, on_event=on_event, extras=extras,
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
        rec.ending = res.get("ending")  # what the job died of, judged from the facts its stream gathered at the death
        if info is not None and info.state == core.FAILED and not rec.stop_reason:
            found = self._health_now(prof)  # a GPU that fell off the bus kills the job before the next sample
            if found:
                return self._job_died_with_its_gpu(found, info)
        rec.job_state = info.state if info is not None else "lost"
        ok = info is not None and info.state == core.SUCCEEDED
        self.out.info(f"job {rec.run_id}: {rec.job_state}" + (f" (exit {info.exit_code})" if info and
                                                              info.exit_code is not None else "")
                      + (" on host #0" if len(fleet_meta.get("nodes") or []) > 1 else "")
                      + (f": {rec.ending['title']}" if rec.ending else ""))
        if len(fleet_meta.get("nodes") or []) > 1:  # the run ends when every node's job has, with the worst outcome
            try:
                _, by_rank, infos = fleetactions.wait_fleet(fleet_prof, self.out, self.project, fleet_meta,
                                                            interval=self.seams.poll_s, sleep=self._budget_sleep)
            except BudgetReached:
                return self._budget_stop()
            return self._fleet_ended(infos, by_rank)
        self._end("watch", ok=ok, detail=rec.job_state + (f": {rec.ending['title']}" if rec.ending else ""))

    def _fleet_ended(self, infos: list, by_rank: dict) -> None:
        """Every node's job has ended: the worst outcome is the run's, and its ending the first host's that is not
        a consequence of another's death (jobs/endings.root: node 1's ImportError, not node 0's NCCL timeout)."""
        from ..jobs import endings
        from ..jobs import plan as core

        rec = self.rec
        bad = [(i, x) for i, x in enumerate(infos) if x is None or x.state != core.SUCCEEDED]
        ok = not bad
        rec.job_state = core.SUCCEEDED if ok else (bad[0][1].state if bad[0][1] is not None else "lost")
        if rec.ending:
            by_rank[0] = rec.ending  # host 0's, judged from its stream's facts (its GPU samples too)
        if not ok:
            rec.ending = endings.root(by_rank, endings.load(self.project)) or rec.ending
        detail = rec.job_state if ok else "; ".join(
            f"host #{i}: {x.state if x else 'unknown'}" + (f" ({by_rank[i]['title']})" if by_rank.get(i) else "")
            for i, x in bad)
        self.out.info(f"job {rec.run_id} on {len(infos)} hosts: {detail}")
        self._end("watch", ok=ok, detail=detail)

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

    def _budget_stop(self) -> None:
        """--max-cost reached while watching: stop the job (every node), then fetch what exists and terminate."""
        rec = self.rec
        rec.stop_reason = f"--max-cost ${rec.max_cost:.2f} reached"
        from .money import covers

        self.out.warn(f"{rec.stop_reason} ({self._cost()}, and about ${pl.tail_cost(rec):.4f} for what follows the "
                      f"stop): stopping the job, then fetching what exists; {covers(rec.max_cost)}")
        self._stop_job()
        self._ending_said("stopped", f"gpuops run: {rec.stop_reason} ({self._cost()})",
                          stopped_by=f"gpuops run: {rec.stop_reason}")
        self._end("watch", ok=False, detail=rec.stop_reason)

    def _ending_said(self, cause: str, evidence, **values) -> None:
        """The job's ending when gpuops itself ended it or knows why without its facts (its GPU failed, the budget):
        the playbook's row for `cause` with that evidence (jobs/endings.verdict)."""
        from ..jobs import endings

        ev = [evidence] if isinstance(evidence, str) else list(evidence)
        self.rec.ending = endings.verdict(cause, endings.load(self.project), ev, values) or self.rec.ending

    def _budget_sleep(self, s: float) -> None:
        """The wait between fleet samples, with --max-cost checked at each."""
        if pl.over_budget(self.rec, self.seams.clock()):
            raise BudgetReached()
        self.seams.sleep(s)

    def _stop_job(self, *, gpu: bool = False) -> dict | None:
        """Stop the job (every node). gpu: its GPU failed, which is why: a one-host job found already ended (its GPU
        killed it before the stop, a race with the health sample that saw the failure) is not stopped; its stop
        document is returned (exit_code) for the caller to say the job died with its GPU. Else None."""
        from ..jobs import actions as lifecycle
        from ..jobs import fleetactions

        rec = self.rec
        if not rec.run_id:
            return None
        try:
            prof = self._profile()
            meta = lifecycle.resolve(rec.run_id, prof, self.project)
            if meta.get("nodes"):
                doc = fleetactions.stop_fleet(prof, self.out, self.project, meta, grace=10.0)
                result = ", ".join(f"#{h['rank']} {h.get('result') or h.get('error')}" for h in doc["hosts"])
            else:
                doc = lifecycle.stop(prof, self.out, self.project, meta, grace=10.0)
                result = doc["result"]
                if gpu and result == "notrunning" and doc.get("exit_code") != 0:  # it ended, and not by success
                    rec.job_state = "failed"
                    return doc
            rec.job_state = "stopped"
            self.out.info(f"job {rec.run_id} stopped ({result})")
        except GpuopsError as exc:
            self.out.warn(f"could not stop {rec.run_id}: {exc.message}")
        return None
