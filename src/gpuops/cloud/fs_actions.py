"""Lambda persistent filesystems, the talking part: `gpuops fs ls|create|rm` and what `up`/`run --fs` ask of the API
before a launch (which region, a missing filesystem created after asking). Decisions are in `cloud/filesystems.py`."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..errors import ExitCode, GpuopsError, UsageError
from . import filesystems as fsd
from .api import LambdaError


def listing(ctx, project_dir: Optional[Path] = None) -> dict:
    """`gpuops fs ls`: every filesystem with its region, mount point, bytes used, the instances mounting it and its
    cost per month where a price is known (two requests: the filesystems and the instances)."""
    fss = ctx.client.filesystems()
    insts = ctx.client.instances() if fss else []
    price = fsd.prices(project_dir)
    rows = fsd.rows(fss, insts, price)
    return {"filesystems": rows, "total_per_month": fsd.total_per_month(rows),
            "price_source": price.get("source") if any(r["usd_per_gib_month"] is not None for r in rows) else None,
            "price_note": None if any(r["usd_per_gib_month"] is not None for r in rows) else fsd.NO_PRICE,
            "api_calls": ctx.client.total_calls}


def create(ctx, name: str, region: str) -> dict:
    """POST /filesystems (the name checked first). A lost answer is settled by listing: the filesystem either exists
    now (created) or not (the error stands)."""
    fsd.check_name(name)
    if not region:
        raise UsageError("--region: the region the filesystem lives in (instances attach it only there)",
                         hint="gpuops cloud types --available lists the regions with capacity now")
    try:
        fs = ctx.client.create_filesystem(name, region)
    except LambdaError as exc:
        if exc.ambiguous:
            found = fsd.find(ctx.client.filesystems(), name)
            if found is not None and found.region == region:
                return found.to_dict()
        if exc.api_code == "global/invalid-parameters":  # the name passed Lambda's rule above: the region is left
            raise UsageError(f"Lambda refused to create filesystem {name!r} in region {region!r}: {exc.api_message} "
                             "(the name follows Lambda's rule, so the region is not one Lambda knows)",
                             hint="give a region as Lambda spells it (us-east-1, us-west-1, ...); `gpuops cloud "
                                  "types --available` lists the regions with capacity now") from None
        raise fsd.fs_error(exc, name) from None
    return fs.to_dict()


def remove(ctx, name: str, confirm: Optional[Callable[[str], bool]]) -> dict:
    """Delete filesystem NAME (its data with it): refused while an instance mounts it, naming the instance (read
    from the instances before asking, so nothing is asked in vain); `confirm` asked first (None: no question)."""
    fss = ctx.client.filesystems()
    fs = fsd.find(fss, name)
    if fs is None:
        known = ", ".join(f.name for f in fss) or "none"
        raise UsageError(f"no filesystem named {name!r} (the account has: {known})",
                         hint="`gpuops fs ls` lists them")
    users = _after_terminating(ctx, fs, fsd.users(fs, ctx.client.instances()))
    if users:
        who = ", ".join(f"{i.id}" + (f" ({i.name})" if i.name else "") for i in users)
        raise GpuopsError(f"filesystem {name!r} is mounted by instance {who}: Lambda deletes a filesystem only when "
                          "no instance mounts it", hint="end it first: " + " and ".join(
                              f"`gpuops down {i.id}`" for i in users) + " (gpuops down takes an instance id or the "
                          "profile `gpuops ls` shows), then remove the filesystem", code=ExitCode.FAILED)
    size = fsd.human_bytes(fs.bytes_used)
    if confirm is not None and not confirm(f"delete filesystem {name!r} ({fs.region}, {size} used) and every file "
                                           "on it? This cannot be undone"):
        raise GpuopsError("not deleted", code=ExitCode.FAILED)
    try:
        ids = ctx.client.delete_filesystem(fs.id)
    except LambdaError as exc:
        raise fsd.fs_error(exc, name) from None
    return {"name": name, "id": fs.id, "region": fs.region, "deleted_ids": ids}


TERMINATING_WAIT_S = 300.0  # `fs rm` right after `down`: how long it waits for an instance still terminating


def _after_terminating(ctx, fs, users: list) -> list:
    """The instances mounting the filesystem, once those only terminating have ended (Lambda deletes a filesystem
    only when none mounts it): waited for, said, at most TERMINATING_WAIT_S; the ones still there are returned
    (an instance still terminating past the limit said as such)."""
    if not users or any(i.status != "terminating" for i in users):
        return users
    ids = ", ".join(i.id for i in users)
    ctx.out.info(f"instance {ids} mounting {fs.name!r} is terminating: waiting for it to end (at most "
                 f"{TERMINATING_WAIT_S / 60:.0f} min) before removing the filesystem")
    deadline = ctx.clock() + TERMINATING_WAIT_S
    while users and all(i.status == "terminating" for i in users) and ctx.clock() < deadline:
        ctx.sleep(2.0)
        users = fsd.users(fs, ctx.client.instances())
    if users and all(i.status == "terminating" for i in users):
        raise GpuopsError(f"filesystem {fs.name!r} is mounted by instance {ids}, still terminating after "
                          f"{TERMINATING_WAIT_S / 60:.0f} min: Lambda deletes a filesystem only once no instance "
                          "mounts it", hint=f"run `gpuops fs rm {fs.name}` again in a few minutes (`gpuops ls` shows "
                          "when it has ended)", code=ExitCode.FAILED)
    return users


def attach(spec, ctx, types: dict, want) -> tuple:
    """Before a launch with `spec.file_systems`: the filesystems read (one request), the one region they allow
    (said), a missing one created after `spec.create_fs` says yes (in --region, else the first region where a type
    asked has capacity now). Returns (region, {name: Filesystem})."""
    from . import decisions as d

    names = [fsd.check_name(n) for n in spec.file_systems]
    fss = ctx.client.filesystems()
    region = fsd.launch_region(names, fss, spec.regions)
    for name in names:
        if fsd.find(fss, name) is not None:
            continue
        where = region or next(iter(spec.regions), None) or next(
            (r for c in d.choose(types, want).candidates for r in c.regions), None)
        if where is None:
            raise GpuopsError(f"filesystem {name!r} does not exist, and no type asked has capacity in any region to "
                              "create it beside", hint=f"`gpuops fs create {name} --region REGION`, then launch "
                              "again (--wait-for-capacity waits for capacity there)", code=ExitCode.FAILED)
        question = f"filesystem {name!r} does not exist: create it in {where} (billed per GiB used per month)"
        answer = spec.create_fs(question + "?") if spec.create_fs is not None else None
        if answer is None:  # no terminal to ask, and no --yes
            raise UsageError(f"filesystem {name!r} does not exist, and there is no terminal to ask whether to create "
                             "it; nothing was launched",
                             hint=f"`gpuops fs create {name} --region {where}` creates it, or give --yes")
        if not answer:
            raise GpuopsError(f"filesystem {name!r} not created; nothing was launched", code=ExitCode.FAILED)
        created = create(ctx, name, where)
        ctx.out.info(f"created filesystem {name!r} in {where}")
        fss = ctx.client.filesystems()
        region = created["region"]
    by_name = {n: fsd.find(fss, n) for n in names}
    ctx.out.info(f"filesystem{'s' if len(names) > 1 else ''} {', '.join(names)} "
                 f"{'are' if len(names) > 1 else 'is'} in {region}: trying only {region}")
    return region, by_name
