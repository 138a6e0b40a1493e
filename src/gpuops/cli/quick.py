"""`gpuops sync` without typer and pydantic: the command run again and again between edits, whose start was most of its
time (typer's and pydantic's imports: 0.3 s of a 0.4 s no-change re-sync, issue 42).

main.run() asks take() first. It answers only a plain call: `sync` with the options of its synopsis spelled as
docs/sync.md gives them, and a one-host profile that model.py validated before from the very same text (memo.py).
Anything else (--help, an option it does not know, a value missing or not a number, two names, a profile not kept
yet or changed since, a fleet) gets None, and typer parses the call as always: every usage error and its message is
typer's. The command's body (sync()) is one function, run by both: transfer.py's typer command calls it too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

# option -> (the parameter, takes a value)
_FLAGS = {"--delete": ("delete", False), "--dry-run": ("dry_run", False), "-n": ("dry_run", False),
          "--gitignore": ("gitignore", False), "--copy-links": ("copy_links", False),
          "--no-copy-links": ("no_copy_links", False), "--yes": ("yes", False), "-y": ("yes", False),
          "--json": ("json_", False), "--exclude": ("exclude", True), "-x": ("exclude", True),
          "--profile": ("profile", True), "-p": ("profile", True), "--host": ("host", True)}


def parse(args: list[str]) -> Optional[dict]:
    """The parameters of `gpuops sync ...` as typer would give them, or None for anything but a plain call."""
    if not args or args[0] != "sync":
        return None
    got: dict = {"name": None, "profile": None, "delete": False, "dry_run": False, "exclude": [], "gitignore": False,
                 "copy_links": None, "yes": False, "json_": False, "host": None}
    rest = args[1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        opt, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if not word.startswith("-"):
            if got["name"] is not None or not word:
                return None
            got["name"] = word
            i += 1
            continue
        if opt not in _FLAGS:
            return None  # --help, -h, a combined -ny, --, anything else: typer's
        param, takes = _FLAGS[opt]
        if not takes:
            if eq:
                return None
            if param in ("copy_links", "no_copy_links"):
                got["copy_links"] = param == "copy_links"
            else:
                got[param] = True
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(rest):
            value, i = rest[i + 1], i + 2
        else:
            return None
        if param == "exclude":
            got["exclude"].append(value)
        elif param == "host":
            if not value.isdigit() or not value.isascii():
                return None
            got["host"] = int(value)
        else:
            got[param] = value
    return got


def take(args: list[str]) -> Optional[int]:
    """Run `gpuops sync` here when the call is a plain one about a kept profile (its exit code), else None."""
    p = parse(args)
    if p is None or (p["name"] and p["profile"] and p["name"] != p["profile"]):
        return None
    from ..errors import ProfileError
    from ..profiles.locate import locate
    from ..profiles.memo import recall

    given = p["name"] or p["profile"]
    try:
        prof = recall(locate(given, Path.cwd()), Path.cwd())
    except ProfileError:
        return None  # said by the usual path, in its words
    if prof is None:
        return None
    from .basics import introduce

    return sync(lambda out: introduce(prof, given, out), delete=p["delete"], dry_run=p["dry_run"],
                exclude=p["exclude"], gitignore=p["gitignore"], copy_links=p["copy_links"], yes=p["yes"],
                json_=p["json_"], host=p["host"])


def sync(pick: Callable, *, delete: bool, dry_run: bool, exclude, gitignore: bool, copy_links: Optional[bool],
         yes: bool, json_: bool, host: Optional[int]) -> int:
    """The sync command's body; pick(out): the profile (said on `out`). Returns the exit code."""
    from ..profiles.locate import remember
    from ..remote.connection import shared
    from ..transfer.rsync import require_local_rsync
    from ..transfer.sync import render_sync, sync_project
    from .basics import confirmer, output, with_warnings

    out = output(json_)
    prof = pick(out)
    require_local_rsync()  # before connecting: nothing to do without it
    # a fleet's hosts are synced in parallel: said, not asked (the same upload goes to each)
    confirm = None if (prof.is_fleet and host is None) or json_ else confirmer(yes)

    def one(node, node_out):
        # one OpenSSH connection, rsync's too; a plain sync is rsync's own ssh alone (the checks in its session), a
        # master only should that fail to connect (its connect() judges) or an execution of gpuops' own be needed
        with shared(node, announce=node_out.info, lazy=not (delete or dry_run)) as remote:
            summary = sync_project(node, remote, node_out, Path.cwd(), delete=delete, dry_run=dry_run,
                                   excludes=exclude or (), gitignore=gitignore, copy_links=copy_links,
                                   confirm=confirm)
        return with_warnings(summary, out, node_out)

    if prof.is_fleet and host is None:
        from ..hostpool import for_each_buffered

        code = for_each_buffered(prof, out, one, render_sync, title="sync")
        if code == 0:
            remember(prof)
        return code
    summary = one(prof.node(host), out)
    render_sync(out, summary)
    remember(prof)
    return 0
