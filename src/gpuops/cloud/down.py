"""`gpuops down`: `down_target` resolves what the user named (a managed profile, a name without one, an instance
id), `down` terminates it (fetching first when asked), closes the records, forgets the host keys, marks the profile
gone."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GpuopsError, UsageError
from . import decisions as d
from .ledger import FAILED
from .instances import Context, DOWN_NOTE, _close_records, _note_asked, _statuses, _terminate_confirmed, owner_alive
from .managed import _profile_of_instance, managed_profile, mark_profile_gone


# -- down ----------------------------------------------------------------------------------------------------------
@dataclass
class DownTarget:
    """What `gpuops down X` ends: the managed profile X (every instance it names, and any other open launch of that
    name), or, without a profile, the open launches and gpuops-tagged instances of name X, or the gpuops-launched
    instance whose id is X (one node of a fleet: that node only)."""

    name: str
    profile: object = None  # the managed profile, when there is one
    ids: list = field(default_factory=list)  # instances to end, rank order first
    launches: list = field(default_factory=list)  # open launch records no listed instance carries (cut off in flight)
    ips: dict = field(default_factory=dict)  # instance id -> IP, for instances without a profile (pins to forget)
    price_per_hour: float = 0.0  # all of them together
    whole_profile: bool = True  # False: one node of the profile, by its id

    def describe(self) -> str:
        what = (f"instance {self.ids[0]}" if len(self.ids) == 1 else
                f"{len(self.ids)} instances ({', '.join(self.ids)})" if self.ids else "no instance")
        return what + (f" and {len(self.launches)} launch record(s) cut off in flight" if self.launches else "")


def down_target(target: str, ctx: Context, project_dir: Path | None = None) -> DownTarget:
    """Resolve `gpuops down TARGET` (a profile name, a profile path, or an instance id) to what it ends."""
    from ..profiles.model import resolve

    prof = managed_profile(target)
    plain = None
    if prof is None:
        try:
            found = resolve(target, project_dir)
        except GpuopsError:
            found = None
        if found is not None and found.cloud is not None:
            prof = found
        elif found is not None:
            plain = found
    name = prof.name if prof is not None else target
    recs = [r for r in ctx.ledger.records() if r.open and (r.profile == name or r.instance_id == target)]
    tgt = DownTarget(name=name, profile=prof)
    if prof is not None:
        tgt.ids = list(prof.cloud.instance_ids)
        tgt.price_per_hour = (prof.price_per_hour or 0.0) * len(tgt.ids)
    if prof is not None and all(r.instance_id in tgt.ids for r in recs):
        return tgt  # the usual case: the profile and its own records, no listing needed
    if plain is not None and not recs:
        raise UsageError(f"profile '{plain.name}' was not created by `gpuops up`; gpuops will not terminate what it "
                         "did not launch", hint="gpuops ls shows the instances it manages")
    listed = ctx.client.instances()
    by_id = {i.id: i for i in listed}
    if prof is None and target in by_id:  # an instance id
        inst = by_id[target]
        rec = next((r for r in ctx.ledger.records() if r.instance_id == target), None)
        if rec is None and d.TAG_LAUNCH not in inst.tags:
            raise UsageError(f"instance {target} was not launched by gpuops (no launch record here, no gpuops tag); "
                             "gpuops does not terminate what it did not launch",
                             hint="terminate it in Lambda's console if it is yours")
        owner = _profile_of_instance(target)
        tgt = DownTarget(name=(owner.name if owner else d.tag_profile(inst.tags) or (rec.profile if rec else target)),
                         profile=owner, ids=[target], whole_profile=owner is None or owner.cloud.instance_ids == [target],
                         price_per_hour=inst.type.price_per_hour if inst.type else 0.0)
        if owner is None and inst.ip:
            tgt.ips[target] = inst.ip
        return tgt
    tagged = [i for i in listed if i.tags.get(d.TAG_PROFILE) == name and i.status not in d.OVER_STATUSES
              and i.id not in tgt.ids]
    for rec in recs:  # open launches of the name: their instance by id, or by the launch tag
        iid = rec.instance_id or next((i.id for i in listed if i.tags.get(d.TAG_LAUNCH) == rec.launch_id
                                       and i.status not in d.GONE_STATUSES), None)
        if iid is None:
            tgt.launches.append(rec)
        elif iid not in tgt.ids:
            tgt.ids.append(iid)
    for inst in tagged:
        if inst.id not in tgt.ids:
            tgt.ids.append(inst.id)
    for iid in tgt.ids:
        inst = by_id.get(iid)
        if inst is not None and prof is None:
            tgt.price_per_hour += inst.type.price_per_hour if inst.type else 0.0
            if inst.ip:
                tgt.ips[iid] = inst.ip
    if not tgt.ids and not tgt.launches:
        from ..errors import ProfileError

        raise ProfileError(f"nothing named '{target}': no profile written by `gpuops up`, no open launch and no "
                           "gpuops instance of that name, and no instance with that id",
                           hint="gpuops ls shows every instance and launch gpuops knows")
    return tgt


def down(target, ctx: Context, *, fetch_first: bool = False, project_dir: Path | None = None) -> dict:
    """Terminate what `gpuops down TARGET` names (`down_target`: a managed profile's instances, every one of a fleet
    in one request; or, without a profile, the open launches and tagged instances of that name, or one instance by
    id), confirm by reading them back, close their ledger records, forget their host keys, mark the profile gone.
    `fetch_first` pulls every fetch: entry (verified, from rank 0) before, since termination wipes the disk."""
    from ..remote import hostkeys

    tgt = target if isinstance(target, DownTarget) else down_target(target, ctx, project_dir)
    prof, ids = tgt.profile, tgt.ids
    base = {"profile": tgt.name, "instance_id": ids[0] if ids else None, "instance_ids": ids, "fetched": []}
    if prof is not None and prof.cloud.state == "gone" and tgt.whole_profile and not tgt.launches:
        statuses = _statuses(ctx, ids)
        if all(st in d.OVER_STATUSES for st in statuses):
            return {**base, "status": statuses[0], "statuses": statuses, "host_keys_forgotten": 0, "already": True,
                    "records_closed": _close_records(ctx, ids, note="seen ended")}
    fetched = []
    if fetch_first and prof is not None and prof.cloud.state == "active" and tgt.whole_profile:
        fetched = _fetch_all(prof, ctx.out, project_dir or Path.cwd())
    _note_asked(ctx, ids, DOWN_NOTE)  # before the request: a run watching it reads the termination as asked for
    insts = _terminate_confirmed(ctx, ids) if ids else []
    statuses = [i.status if i else "terminated" for i in insts]
    closed = _close_records(ctx, ids, note=DOWN_NOTE)
    for rec in tgt.launches:  # cut off in flight and nothing carries its launch id
        if owner_alive(rec):
            ctx.out.warn(f"launch {rec.launch_id} of '{rec.profile}' is still in flight (gpuops process {rec.pid}): "
                         f"run `gpuops down {rec.profile}` again once it has landed")
            continue
        ctx.ledger.update(rec.launch_id, state=FAILED, ended_at=ctx.clock(),
                          note="closed by down: no instance carries its launch id")
        closed.append(rec.launch_id)
    removed = 0
    if prof is not None:
        nodes = prof.nodes()
        removed += sum(hostkeys.forget(n.host, n.port) for n, iid in zip(nodes, prof.cloud.instance_ids) if iid in ids)
        if prof.source and Path(prof.source).is_file() and (tgt.whole_profile or all(
                (r := ctx.ledger.by_instance(i)) is not None and not r.open for i in prof.cloud.instance_ids)):
            mark_profile_gone(Path(prof.source))
    removed += sum(hostkeys.forget(ip, 22) for ip in tgt.ips.values())
    return {**base, "status": statuses[0] if statuses else None, "statuses": statuses, "host_keys_forgotten": removed,
            "fetched": fetched, "records_closed": closed}


def _fetch_all(prof, out, project_dir: Path) -> list[str]:
    from ..remote.connection import connect
    from ..transfer.fetch import fetch, list_remote

    done = []
    with connect(prof, announce=out.info) as remote:
        listing = list_remote(prof, remote, project_dir)
        for fname in prof.fetch:
            if not listing.get(fname, {}).get("exists"):
                out.info(f"--fetch-first: nothing at {fname} on the instance")
                continue
            fetch(prof, remote, out, fname, project_dir=project_dir)
            done.append(fname)
    return done
