"""`gpuops ls` and `gpuops reap`: `listing` judges every instance by the ledger and its tags (records reconciled),
`reap` ends the ones past their TTL or idle limit (idle confirmed on the host first) and closes what is gone."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..errors import GpuopsError
from . import decisions as d
from .api import LambdaError
from .ledger import FAILED, LAUNCHED, LAUNCHING, TERMINATED
from .instances import Context, _note_asked, _terminate_confirmed, owner_alive
from .managed import _profile_of_instance, local_cloud_profiles, mark_profile_gone


def listing(ctx: Context, *, filesystems: bool = False, project_dir: Path | None = None) -> dict:
    """`gpuops ls`: every instance of the account judged by its tags and the ledger (decisions.ls_rows). The ledger is
    brought up to date with what the listing shows (no further request): a launch cut off in flight gets the instance
    that carries its launch id, a record whose instance the API shows terminated is closed. `filesystems`: the
    account's filesystems too (one more request; its failure is said, the instances still shown), with their cost
    per month where a price is known. Nothing here ever deletes a filesystem (reap uses this listing)."""
    instances = ctx.client.instances()
    records = ctx.ledger.records()
    live_owners = {r.launch_id for r in records if r.open and owner_alive(r)}
    rows, alerts = d.ls_rows(instances, records, local_cloud_profiles(), ctx.clock(), live_owners)
    _reconcile(ctx, rows, live_owners)
    doc = {"instances": rows, "alerts": alerts}
    if filesystems:
        from . import filesystems as fsd

        try:
            price = fsd.prices(project_dir)
            doc["filesystems"] = fsd.rows(ctx.client.filesystems(), instances, price)
            doc["filesystems_per_month"] = fsd.total_per_month(doc["filesystems"])
        except LambdaError as exc:
            doc["filesystems"], doc["filesystems_per_month"] = None, None
            alerts.append(f"filesystems not listed: {exc.message}")
    doc["api_calls"] = ctx.client.total_calls
    return doc


def _reconcile(ctx: Context, rows: list[dict], live_owners: set) -> None:
    by_launch = {r["launch_id"]: r for r in rows if r["id"] and r.get("launch_id")}
    for rec in ctx.ledger.records():
        if not rec.open:
            continue
        row = by_launch.get(rec.launch_id)
        if rec.state == LAUNCHING and rec.launch_id in live_owners:
            continue  # its `gpuops up` is still waiting for the answer and records the id itself
        if rec.state == LAUNCHING and row is not None and row["status"] not in d.GONE_STATUSES:
            ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=LAUNCHED,
                              launched_at=rec.launched_at or rec.created_at, note="adopted by its launch tag")
        elif row is not None and row["id"] == rec.instance_id and row["status"] in d.DEAD_STATUSES:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note=f"seen {row['status']}")


def idle_sample_script() -> str:
    """One remote execution: GPU utilisations, then the ids of gpuops runs alive on this host (its registry of active
    runs, as `gpuops train` keeps it)."""
    from ..jobs.scripts import ACTIVE_DIR, STATE_FN

    return (STATE_FN + "\nnvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null\necho ---\n"
            f"for f in {ACTIVE_DIR}/*; do\n"
            '  [ -f "$f" ] || continue\n'
            '  rd=$(cat "$f"); id=$(basename "$f")\n'
            '  if [ ! -f "$rd/exit_code" ] && gpuops_alive "$rd" "$id"; then echo "$id"; fi\n'
            "done\n")


def idle_confirmed(prof) -> bool:
    """Sample the instance once: no gpuops run alive and every GPU under 5 %? (An unreachable host is not judged idle.)"""
    from ..remote.connection import connect

    try:
        with connect(prof, announce=lambda s: None, attempts=1) as remote:
            res = remote.run(idle_sample_script(), timeout=30)
    except GpuopsError:
        return False
    gpu, _, runs = res.stdout.partition("---")
    utils = []
    for x in gpu.split():
        try:
            utils.append(float(x))
        except ValueError:
            pass
    return not d.busy(bool(runs.strip()), utils)


def reap(ctx: Context, *, confirm: Optional[Callable[[str], bool]] = None, project_dir: Path | None = None) -> dict:
    """Terminate managed instances past their TTL or idle limit, judged by the ledger and the instances' gpuops tags
    (an instance launched from another machine or HOME by its TTL tag; one with no profile too). Idle is confirmed by
    one sample on the host, through the profile `gpuops up` wrote for it (the user config folder, never a project's
    profile of the same name): without one, an idle-only instance is kept. `project_dir` is not used to find
    profiles."""
    doc = listing(ctx)
    done, skipped = [], []
    for row in d.reap_candidates(doc["instances"]):
        only_idle = all(r.startswith("idle") for r in row["reasons"])
        prof = _profile_of_instance(row["id"])
        node = _node_of(prof, row)
        if only_idle:
            if node is None or not idle_confirmed(node):
                skipped.append({**row, "why": "idle not confirmed by a sample on the host" if node is not None else
                                "idle, but no profile here to sample it with"})
                if node is not None:
                    ctx.ledger.note_activity(row["id"], ctx.clock())
                continue
        text = (f"terminate {row['id']} (profile {row['profile']}, {row['type']}, ${row['price_per_hour'] or 0:.2f}/h): "
                + "; ".join(row["reasons"]))
        if confirm is not None and not confirm(text + "?"):
            skipped.append({**row, "why": "not confirmed"})
            continue
        _note_asked(ctx, [row["id"]], "reaped")  # before the request, as down does
        _terminate_confirmed(ctx, [row["id"]])
        for rec in ctx.ledger.records():
            if rec.open and (rec.instance_id == row["id"] or (rec.instance_id is None and rec.launch_id == row["launch_id"])):
                ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=TERMINATED, ended_at=ctx.clock(),
                                  note="reaped")
        from ..remote import hostkeys

        if node is not None:
            hostkeys.forget(node.host, node.port)
            ended = {r["id"] for r in done} | {row["id"]} | {r["id"] for r in doc["instances"]
                                                             if r["status"] in d.OVER_STATUSES}
            if prof.source and set(prof.cloud.instance_ids) <= ended:  # a fleet: once its last node is gone
                mark_profile_gone(Path(prof.source))
        elif row["ip"]:
            hostkeys.forget(row["ip"], 22)  # pinned by an `up` cut off before it wrote the profile
        ctx.out.info(f"terminated {row['id']} ({'; '.join(row['reasons'])})")
        done.append(row)
    closed = _close_gone_records(ctx, doc["instances"])
    return {"terminated": done, "skipped": skipped, "records_closed": closed}


def _node_of(prof, row: dict):
    """The host of managed profile `prof` that is instance row["id"] (a fleet's node by its rank), or None."""
    if prof is None or prof.cloud is None or row["id"] not in prof.cloud.instance_ids:
        return None
    nodes = prof.nodes()
    rank = prof.cloud.instance_ids.index(row["id"])
    return nodes[rank] if rank < len(nodes) else None


def _close_gone_records(ctx: Context, rows: list[dict], *, stale_launch_s: float = d.STALE_LAUNCH_S) -> list[str]:
    """Reconcile the ledger with the API: records whose instance the API shows terminated (or no longer knows) are
    closed; a `launching` record whose instance appeared (by tag) gets its id; one that never appeared within
    `stale_launch_s` is closed as failed."""
    closed = []
    listed = {r["id"]: r for r in rows if r["id"] and r["status"] not in ("unseen", "launching?")}
    by_launch = {r["launch_id"]: r for r in listed.values() if r.get("launch_id")}
    for rec in ctx.ledger.records():
        if rec.state == LAUNCHING:
            if owner_alive(rec):
                continue  # its `gpuops up` is still waiting for the launch answer
            row = by_launch.get(rec.launch_id)
            if row is not None:
                ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=LAUNCHED,
                                  launched_at=rec.launched_at or rec.created_at)
            elif ctx.clock() - rec.created_at > stale_launch_s:
                ctx.ledger.update(rec.launch_id, state=FAILED, ended_at=ctx.clock(),
                                  note="no instance carries its launch id")
                closed.append(rec.launch_id)
            continue
        if rec.state != LAUNCHED or not rec.instance_id:
            continue
        seen = listed[rec.instance_id]["status"] if rec.instance_id in listed else None
        if seen is None:  # not listed: ask for it by id; only a definite "does not exist" closes the record
            try:
                seen = ctx.client.instance(rec.instance_id).status
            except LambdaError as exc:
                seen = "terminated" if exc.not_found else None
        if seen in d.DEAD_STATUSES:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note=f"seen {seen}")
            closed.append(rec.launch_id)
    return closed
