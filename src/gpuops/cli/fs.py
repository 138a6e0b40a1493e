"""`gpuops fs ls|create|rm`: Lambda persistent filesystems (docs/fs.md); `fs_question`, the yes/no that `up --fs` and
`run --fs` ask before creating a missing one.

typer only at import: the client is imported inside the commands."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from .app import Group, JsonOpt, app, output

fs_app = typer.Typer(cls=Group, help="Lambda persistent filesystems: region-local storage attached at launch that "
                                     "outlives every instance (data, checkpoints, setup's caches). `gpuops run --fs "
                                     "NAME` and `gpuops up --fs NAME` attach one (docs/fs.md).", no_args_is_help=True)
app.add_typer(fs_app, name="fs")


def fs_question(yes: bool) -> Callable[[str], Optional[bool]]:
    """How a missing filesystem is settled: --yes creates it, a terminal is asked, no terminal answers None (the
    caller refuses with exit 2 and the command to run)."""
    import sys

    def ask(question: str) -> Optional[bool]:
        if yes:
            return True
        if not sys.stdin.isatty():
            return None
        print(question + " [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


def _ask_api(out, json_: bool, fn) -> Optional[dict]:
    """fn(context) with the API client open; its document printed with --json (then None is returned)."""
    from ..cloud.instances import make_context

    ctx = make_context(out, project_dir=Path.cwd())
    with ctx.client:
        doc = fn(ctx)
    if json_:
        out.emit_json(doc)
        return None
    return doc


@fs_app.command("ls")
def ls(json_: bool = JsonOpt) -> None:
    """Every filesystem on the account: name, region, the mount point the API reports, bytes used (Lambda's estimate,
    updated every few hours), the instances that mount it and its cost per month where a price is known
    (playbooks/filesystems.yaml; "-" otherwise, docs/fs.md says why)."""
    from ..cloud import filesystems as fsd
    from ..cloud.fs_actions import listing

    out = output(json_)
    doc = _ask_api(out, json_, lambda ctx: listing(ctx, Path.cwd()))
    if doc is None:
        return
    rows = doc["filesystems"]
    if not rows:
        out.print("no filesystems on the account (gpuops fs create NAME --region REGION makes one)")
        return
    w = max(4, *(len(r["name"]) for r in rows))
    m = max(11, *(len(r["mount_point"]) for r in rows))
    out.print(f"{'NAME':<{w}} {'REGION':<16} {'MOUNT POINT':<{m}} {'USED':>10} {'PER MONTH':>10} MOUNTED BY")
    for r in rows:
        by = ", ".join(i["id"] + (f" ({i['name']})" if i["name"] else "") for i in r["instances"]) or "-"
        cost = "-" if r["cost_per_month"] is None else f"${r['cost_per_month']:,.2f}"
        out.print(f"{r['name']:<{w}} {r['region']:<16} {r['mount_point']:<{m}} {fsd.human_bytes(r['bytes_used']):>10} "
                  f"{cost:>10} {by}")
    if doc["price_note"]:
        out.info(f"cost per month: {doc['price_note']}")
    elif doc["total_per_month"] is not None:
        out.info(f"in all ${doc['total_per_month']:,.2f} per month at the present sizes (price: {doc['price_source']})")


@fs_app.command("create")
def create(
    name: str = typer.Argument(..., help="A letter first, then letters, digits and '-' (at most 60)."),
    region: str = typer.Option(..., "--region", "-r", help="The region it lives in: only instances launched there "
                                                           "can attach it."),
    json_: bool = JsonOpt,
) -> None:
    """Create a filesystem. It bills per GiB used per month for as long as it exists, mounted or not."""
    from ..cloud.fs_actions import create as do_create

    out = output(json_)
    fs = _ask_api(out, json_, lambda ctx: do_create(ctx, name, region))
    if fs is None:
        return
    out.success(f"filesystem {fs['name']} created in {fs['region']} (mounted at {fs['mount_point']} by default)")
    out.info(f"next: gpuops run --fs {fs['name']} ... (or gpuops up NAME --fs {fs['name']} ...)")


@fs_app.command("rm")
def rm(
    name: str = typer.Argument(..., help="The filesystem to delete."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask first."),
    json_: bool = JsonOpt,
) -> None:
    """Delete a filesystem and every file on it. Refused while an instance mounts it (naming the instance). Asks
    first; without a terminal, --yes is needed (exit 2 otherwise)."""
    from ..cloud.fs_actions import remove
    from ..errors import UsageError

    out = output(json_)
    ask = fs_question(yes)

    def confirm(question: str) -> bool:
        answer = ask(question)
        if answer is None:
            raise UsageError(f"not deleted: no terminal to ask whether to delete filesystem {name!r}",
                             hint=f"gpuops fs rm {name} --yes")
        return answer

    res = _ask_api(out, json_, lambda ctx: remove(ctx, name, confirm))
    if res is None:
        return
    out.success(f"filesystem {name} deleted ({res['region']})")
