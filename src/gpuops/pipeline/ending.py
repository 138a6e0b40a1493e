"""`gpuops run`'s last stages (a mixin of the Runner): fetch (every --fetch name verified, the job's log kept, a
failed fetch keeps the instance) and down (terminated, billing said)."""
from __future__ import annotations

from datetime import datetime
from typing import Optional

from ..errors import GpuopsError
from .money import billing_said
from .summary import _rel
from . import checkpoints as ck


FETCH_ATTEMPTS = 3


class EndStages:
    """The fetch and down stages of the Runner (pipeline/runner.py)."""

    def stage_fetch(self) -> None:
        from ..remote.connection import connect
        from ..transfer.fetch import NeverCreated, fetch

        rec = self.rec
        self._begin("fetch")
        self._end_fetcher()  # a checkpoint fetched while training: never two fetches into one folder
        prof = self._fetch_profile()
        self._data_changed_under(prof)  # another run put --data again while this one ran: said
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
                    self._raise_if_lost()  # preempted meanwhile: said first (InstanceLost), nothing kept billing
                    self.out.warn(f"fetch {name} failed (attempt {attempt}/{FETCH_ATTEMPTS}): {exc.message}")
                    if attempt < FETCH_ATTEMPTS:
                        self.seams.sleep(min(30.0, 2.0 * attempt))
            if last is not None:
                failed.append(f"{name}: {last.message}")
        if failed:
            self._raise_if_lost()  # the instance gone under the run: that is the first line, not the failed fetch
            self._end("fetch", ok=False, detail="; ".join(failed))
            self.out.error(f"FETCH FAILED, so the instance is KEPT (it bills ${rec.price_per_hour or 0:.2f}/h"
                           f"{self._until()}): " + "; ".join(failed),
                           f"fix and run: gpuops fetch -p {rec.profile} NAME, then gpuops down {rec.profile} "
                           f"(gpuops ls shows it)")
            return
        self.missing = absent
        self._final_checkpoint(prof)
        self._end("fetch", ok=True, detail=", ".join([f"{k} -> {v}" for k, v in self.fetched.items()]
                                                     + [f"{n}: never created" for n in absent]) or "nothing named")

    def _final_checkpoint(self, prof) -> None:
        """The job succeeded: the newest checkpoint that counts now (and by what evidence), for the summary and a
        later --resume: judged on the copy fetched here (verified against the instance's), or, on a filesystem
        not fetched, on the filesystem (one execution)."""
        from .recovery import judge

        rec, home = self.rec, self._ck_home()
        if home is None or rec.job_state != "succeeded":
            return
        try:
            if home.name in self.fetched:
                rows, contents = _local_listing(self.project / self.fetched[home.name], ck.book(self.project))
                from ..transfer import plan as tr

                v = ck.resumable(tr.step_dirs(rows), files=rows, since=None, job="succeeded", quiet=False,
                                 seen=ck.Seen(contents=contents), rules=ck.book(self.project))
            elif home.filesystem:
                from ..remote.connection import connect

                one = prof.model_copy(update={"fetch": {home.name: prof.fetch[home.name]}})
                with connect(one, announce=self.out.info) as remote:
                    v = judge(remote, one, self.project, home.name, since=None, job="succeeded")[0]
            else:
                return
        except (GpuopsError, OSError):
            return  # nothing there (the job wrote no checkpoint): the summary names none
        if v.dir is None:
            return
        e = ck.entry(home.name, prof.fetch[home.name], v.dir or None, v.step, self.seams.clock(), rec.id,
                     home.filesystem if home.name not in self.fetched else None, v.evidence, v.warnings)
        if ck.newer(e, rec.checkpoint):
            rec.checkpoint, rec.vouched = e, (rec.vouched + [e])[-50:]

    def _until(self) -> str:
        """The deadline of an instance the run leaves billing: its TTL (a tag on the instance and in the ledger)."""
        from datetime import timezone

        if self.rec.ttl_deadline is None:
            return ", with no TTL"
        when = datetime.fromtimestamp(self.rec.ttl_deadline, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f" until its TTL, {when}, when `gpuops reap` ends it"

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

    def _billing(self, ids: list) -> tuple[str, Optional[str]]:
        """A terminate that failed: what may be said of the money (billing_said), and what to check when the API
        last showed the instances ended (None: the usual hint)."""
        price = (self.rec.price_per_hour or 0) * max(1, self.rec.nodes)
        text, billing = billing_said(ids, self._seen, price)
        return text + (self._until() if billing else ""), (None if billing else f"check: gpuops ls once the Lambda API answers (a revoked key: set a new "
                                           f"LAMBDA_API_KEY); gpuops down {self.rec.profile} ends it if it still runs")


def _local_listing(root, rules: dict) -> tuple[list, dict]:
    """A fetched folder's rows (relative path, size, mtime) and the contents of its marker files."""
    import os

    read = set(ck.evidence_spec(None, rules)["read"])
    rows, contents = [], {}
    for cur, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".gpuops-"))
        for f in sorted(files):
            p = os.path.join(cur, f)
            st = os.lstat(p)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            rows.append([rel, st.st_size, st.st_mtime])
            if f in read and st.st_size <= 4096:
                with open(p, encoding="utf-8", errors="replace") as fh:
                    contents[rel] = fh.read()
    return rows, contents
