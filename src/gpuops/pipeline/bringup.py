"""`gpuops run`'s up stage (a mixin of the Runner): the one UpSpec built from the record (`up_spec`, for the first
instance and every replacement), the launch through cloud.up, what a cut-off bring-up launched reclaimed; and
`run_template`, which decides a --from template's python before anything is launched."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..errors import GpuopsError, UsageError
from .stops import BudgetReached
from . import stages as pl


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


class UpStage:
    """The up stage of the Runner (pipeline/runner.py): self.rec, self.out, self.project, self.ctx_factory."""

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
        rec.terminate_s = float(getattr(ctx, "poll_s", 5.0)) + 1.0  # the termination after a --max-cost stop

        def tick(info: dict) -> None:  # --max-cost from the launch on: boot, SSH
            if info["phase"] == "capacity":
                return  # nothing bills while no instance exists (--wait-for-capacity)
            if rec.billed_from is None:
                rec.billed_from = self.seams.clock()
                self.out.info(f"run {rec.id}: launched; gpuops run --resume --id {rec.id} continues it if this "
                              "process ends")
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
                self._forget_secrets()
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
