"""`gpuops sync` and `gpuops fetch`: rsync over the profile's SSH settings (see docs/sync.md, docs/fetch.md)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .completion import fetch_names, profile_names
from .app import HostOpt, JsonOpt, ProfileOpt, app, output, pick_profile, with_warnings


@app.command()
def sync(
    name: Optional[str] = typer.Argument(None, help="Profile name (or -p NAME).", show_default=False,
                                         autocompletion=profile_names),
    profile: Optional[str] = ProfileOpt,
    delete: bool = typer.Option(False, "--delete", help="Also remove remote files that no longer exist locally. "
                                                        "Excluded paths (checkpoints, outputs, logs, ...) are never "
                                                        "touched."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="List what would change; change nothing."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", "-x", metavar="PATTERN",
                                                help="Exclude PATTERN too (rsync pattern; repeatable). A name "
                                                     "without '/' matches at any depth."),
    gitignore: bool = typer.Option(False, "--gitignore", help="Also honour .gitignore files (off by default: data "
                                                              "folders are often git-ignored)."),
    copy_links: Optional[bool] = typer.Option(None, "--copy-links/--no-copy-links",
                                              help="Send what a symlink pointing outside the project points to, "
                                                   "not the link (default: the profile's sync.copy_links, off).",
                                              show_default=False),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before a large upload (over 500 MB, or far "
                                                        "more than the code)."),
    json_: bool = JsonOpt,
    host: Optional[int] = HostOpt,
) -> None:
    """Copy the current project to the profile's remote_dir (created if missing), skipping the profile's
    sync.exclude, .gpuopsignore and --exclude patterns. Never deletes remote files unless --delete.
    One SSH connection for the whole command; the checks (rsync there, the folder, room on its disk) run in rsync's
    own session (with --delete or --dry-run: one execution before it). A fleet profile is synced to every host in parallel (or --host N). `gpuops sync NAME` = `gpuops sync -p NAME`.
    Before anything is sent: a large upload (over 500 MB, or above 100 MB and 50 times the code) is said with its
    biggest folders and asked at a terminal (--yes: not asked; without a terminal: the warning, and the sync goes
    on); symlinks pointing outside the project are said (--copy-links sends their targets).
    --json: the summary with a `warnings` list.
    A re-sync on a profile unchanged since it was last validated starts without typer and pydantic (docs/sync.md)."""
    from .quick import sync as body  # the body `gpuops sync` runs without typer too (quick.py)

    code = body(lambda out: pick_profile(name, profile, out), delete=delete, dry_run=dry_run, exclude=exclude,
                gitignore=gitignore, copy_links=copy_links, yes=yes, json_=json_, host=host)
    if code:
        raise typer.Exit(code)


@app.command()
def fetch(
    name: str = typer.Argument("checkpoints", help="A name from the profile's fetch: map (default: checkpoints); "
                                "not a profile: that is -p PROFILE.", autocompletion=fetch_names),
    profile: Optional[str] = ProfileOpt,
    dest: Optional[Path] = typer.Option(None, "--dest", "-d",
                                        help="Local directory to fetch into (default: ./NAME); a single-file entry "
                                             "lands as DEST/<its name>.",
                                        show_default=False),
    list_: bool = typer.Option(False, "--list", "-l", help="Show what the remote has under each fetch name, with "
                                                           "sizes and checkpoint steps; fetch nothing."),
    latest: bool = typer.Option(False, "--latest", help="Fetch only the newest complete global_step_N / checkpoint-N directory "
                                                      "(one lacking a file its predecessor has is passed over, "
                                                      "said)."),
    step: Optional[int] = typer.Option(None, "--step", help="Fetch only step N (global_step_N / checkpoint-N).",
                                       show_default=False),
    json_: bool = JsonOpt,
    host: Optional[int] = HostOpt,
) -> None:
    """Pull remote checkpoints or outputs: resumable, verified by size and SHA-256 against the remote, and each
    file appears under its final name only once everything fetched has verified. A fleet: from host 0 (--host N).
    --json: the summary with a `warnings` list (--list: the map of fetch names as before)."""
    from ..profiles import model as profiles
    from ..errors import UsageError
    from ..remote.connection import connect
    from ..transfer.rsync import require_local_rsync
    from ..transfer.fetch import fetch as do_fetch
    from ..transfer.fetch import list_remote, render_fetch, render_list

    out = output(json_)
    if latest and step is not None:
        raise UsageError("--latest and --step are mutually exclusive")
    if list_ and (latest or step is not None or dest is not None):
        raise UsageError("--list only lists; drop --latest/--step/--dest")
    try:
        fleet_prof = pick_profile(None, profile, out)
    except UsageError as exc:
        raise (_fetch_name_is_a_profile(name, profile) or exc) from None
    prof = fleet_prof.node(host)
    if not list_:
        err = _fetch_name_is_a_profile(name, profile, prof)
        if err:
            raise err
        require_local_rsync()  # before connecting: nothing to do without it
    with connect(prof, announce=out.info) as remote:
        if list_:
            render_list(out, list_remote(prof, remote, Path.cwd()))  # keyed by fetch names: no `warnings` key
        else:
            summary = do_fetch(prof, remote, out, name, dest=dest, latest=latest, step=step, project_dir=Path.cwd())
            render_fetch(out, with_warnings(summary, out))
    profiles.remember(fleet_prof)


def _fetch_name_is_a_profile(name: str, option: Optional[str], prof=None):
    """`gpuops fetch PROFILE`, typed as `gpuops verify PROFILE` is: fetch's positional NAME is what to fetch, so when
    NAME is a profile and no fetch: name of the profile in use (none given with -p), the error that says so, with the
    command meant; else None. Nothing is guessed: the command still fetches only what it was told."""
    from ..profiles import model as profiles
    from ..errors import UsageError

    if option is not None or name == "checkpoints" or (prof is not None and name in prof.fetch):
        return None
    if name not in profiles.available(Path.cwd()):
        return None
    where = f" of profile '{prof.name}'" if prof is not None else ""
    return UsageError(f"'{name}' is a profile, not a name in the fetch: map{where}; fetch's argument is what to "
                      "fetch, the profile is -p", hint=f"gpuops fetch -p {name}   (or: gpuops fetch NAME -p {name})")
