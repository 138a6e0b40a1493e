"""`gpuops sync`, the talking part: the checks (rsync on the host, the remote folder, room on its disk, the guard
against deleting what is not the project's), then rsync itself with the plan's filters. The checks ride in rsync's
own session where they can (see sync_project), else they are one remote execution before it. Also used from Python
by `gpuops train` and `run`:
  sync_project(profile, remote, out, project_dir, *, delete, dry_run, excludes, gitignore) -> summary dict
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from . import plan as tr
from ..errors import GpuopsError, RemoteError, UsageError
from ..profiles.model import shell_path
from ..remote import rsync as rs
from .progress import ProgressView


def _sync_precheck(remote, remote_dir: str, *, create: bool) -> dict:
    """One remote execution: is rsync there (nothing else happens when it is not), create the directory (not for a
    dry run), and the free disk of the directory, or of its nearest existing parent when it does not exist yet."""
    d = shell_path(remote_dir)
    cmd = ('unset CDPATH; '  # a relative remote_dir is under the login folder, as for rsync, never a CDPATH entry
           'r=$(command -v rsync) || { echo rsync=; exit 0; }; echo "rsync=$r"; '
           f"d={d}; " + ('mkdir -p -- "$d" || exit 3; ' if create else "") +
           'p="$d"; while [ ! -d "$p" ]; do case "$p" in */*) p="${p%/*}"; p="${p:-/}";; *) p=.;; esac; done; '
           'df -Pk -- "$p" | tail -n 1')
    # where it really is on the host (symlinks resolved), and the remote home: for the --delete guard
    cmd += ('; echo "home=$(cd "$HOME" && pwd -P)"; echo "real=$(cd -- "$d" 2>/dev/null && pwd -P)"; '
            'echo "parent=$(cd -- "$p" && pwd -P)"')
    res = remote.run(cmd, timeout=60)
    if res.rc == 3:
        raise RemoteError(f"cannot create the remote directory {remote_dir}: {res.stderr.strip()}")
    info = {"rsync": "", "free": None, "home": "", "real": "", "parent": ""}
    for line in res.stdout.splitlines():
        key, sep, val = line.partition("=")
        if sep and key in ("rsync", "home", "real", "parent"):
            info[key] = val.strip()
        else:
            parts = line.split()
            if len(parts) >= 4 and parts[3].isdigit():
                info["free"] = int(parts[3]) * 1024
    return info


def sync_filter(profile, project_dir: Path, excludes: Sequence[str] = (), gitignore: bool = False) -> list[str]:
    try:
        ignore = tr.read_ignore_file(project_dir / tr.IGNORE_FILE)
    except tr.IgnoreFileError as exc:
        raise UsageError(str(exc)) from None
    return tr.sync_filter_rules(profile.sync.exclude, excludes, ignore, gitignore, fetched=fetched(project_dir))


def fetched(project_dir: Path) -> list[str]:
    """The project folders fetch wrote into (transfer.plan.FETCHED_FILE): a broken file is no folder."""
    import json

    try:
        data = json.loads((Path(project_dir) / tr.FETCHED_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in data if isinstance(r, str)] if isinstance(data, list) else []


def note_fetched(project_dir: Path, dest: Path) -> None:
    """Record a fetch destination inside the project before anything lands there, so no later sync uploads it."""
    import json

    from ..paths import write_atomic

    rel = tr.fetched_rel(dest, project_dir)
    have = fetched(project_dir)
    if rel is None or rel in have:
        return
    f = Path(project_dir) / tr.FETCHED_FILE
    f.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(f, json.dumps(sorted(have + [rel]), indent=1) + "\n")


def sync_project(profile, remote, out, project_dir: Path, *, delete: bool = False, dry_run: bool = False,
                 excludes: Sequence[str] = (), gitignore: bool = False) -> dict:
    """Copy project_dir to the profile's remote_dir. Returns the summary dict
    {files, bytes_sent, total_bytes, seconds, dry_run, changes, remote_dir, attempts, deleted}.
    Where rsync rides on `remote` itself (remote.shared_with_rsync: `gpuops sync`'s one OpenSSH connection), a plain
    sync runs its checks on rsync's remote side, in rsync's own session (transfer.plan.sync_guard). The checks run
    first, as one remote execution, for --delete (the guard judges where the folder really is before anything can
    be deleted), --dry-run (which creates nothing), on a connection of gpuops' own (train, run), and when the upper
    bound of what is sent does not fit the free disk (the exact amount, from a dry run, then decides)."""
    rs.require_local_rsync()
    project_dir = Path(project_dir).resolve()
    started = time.monotonic()
    remote_dir = profile.remote_dir_for(project_dir)
    rules = sync_filter(profile, project_dir, excludes, gitignore)

    def argv(dry: bool, guard: str | None = None) -> list[str]:
        return tr.sync_args(remote.ssh_argv(), project_dir, profile.host, remote_dir, rules, delete=delete,
                            dry_run=dry, gitignore=gitignore, rsync_path=guard)

    label = "dry run" if dry_run else f"sync → {remote_dir}"
    res, free = None, None
    if remote.shared_with_rsync and not (delete or dry_run):
        guard = tr.sync_guard(shell_path(remote_dir), need=tr.estimate_upload_bytes(project_dir, rules))
        try:
            res = _send(argv(False, guard), profile, out, label)
        except rs.GuardStop as stop:
            if stop.kind == "mkdir":
                raise RemoteError(f"cannot create the remote directory {remote_dir}: {stop.said}") from None
            # the room is short for the upper bound: the checks below, and the exact amount, decide
    if res is None:
        free = _checks_first(profile, remote, remote_dir, delete=delete, dry_run=dry_run)
        if free is not None and not dry_run:
            _fits(profile, project_dir, rules, remote_dir, free, argv)
        res = _send(argv(dry_run), profile, out, label)
    changes: dict[str, tr.Change] = {}
    for ch in res.items:
        changes[ch.path] = ch
    summary = {
        "profile": profile.name,
        "remote_dir": remote_dir,
        "dry_run": dry_run,
        "files": res.stats.get("files_transferred", sum(1 for c in changes.values() if c.kind == "file" and c.change != "deleted")),
        "deleted": sum(1 for c in changes.values() if c.change == "deleted"),
        "bytes_sent": res.stats.get("bytes_sent", 0),
        "total_bytes": res.stats.get("total_bytes", 0),
        "seconds": round(time.monotonic() - started, 3),
        "attempts": res.attempts,
        "changes": [c.as_dict() for c in changes.values()],
    }
    if dry_run and free is not None and res.stats.get("transferred_bytes", 0) > free:
        summary["warning"] = f"would not fit: {tr.human_bytes(free)} free on the remote"
    return summary


def _checks_first(profile, remote, remote_dir: str, *, delete: bool, dry_run: bool) -> int | None:
    """The checks as one remote execution before rsync: rsync there, the folder (not for a dry run), the --delete
    guard. Returns the free bytes of the folder's disk (None: unknown)."""
    info = _sync_precheck(remote, remote_dir, create=not dry_run)
    if not info["rsync"]:
        raise rs.missing_remote(profile.host)
    if delete:
        why = tr.unsafe_delete_target(remote_dir, home=info["home"], real=info["real"])
        if why:
            raise UsageError(f"refusing sync --delete into {remote_dir} on {profile.host}: {why}",
                             hint="set remote_dir: in the profile to the project's own folder (e.g. ~/my-project); "
                                  "--delete removes whatever there is not in your local project")
    return info["free"]


def _fits(profile, project_dir: Path, rules, remote_dir: str, free: int, argv) -> None:
    """Refuse a sync the free disk cannot hold: the upper bound first, then (only when that is too big) the exact
    amount from a dry run."""
    bound = tr.estimate_upload_bytes(project_dir, rules)
    if bound > free:
        exact = rs.run(argv(True), host=profile.host).stats.get("transferred_bytes", bound)
        if exact > free:
            raise GpuopsError(f"not enough disk on {profile.host}: the sync needs {tr.human_bytes(exact)}, "
                              f"{tr.human_bytes(free)} free under {remote_dir}",
                              hint="free space on the instance, or add large folders to .gpuopsignore")


def _send(argv: list[str], profile, out, label: str) -> rs.RsyncResult:
    view = ProgressView(out, label)
    with view:
        return rs.run(argv, host=profile.host, on_progress=view.update, on_retry=view.retry)


def render_sync(out, s: dict) -> None:
    if out.json_mode:
        out.emit_json(s)
        return
    if s["dry_run"]:
        for c in s["changes"]:
            size = f" ({tr.human_bytes(c['size'])})" if c.get("size") is not None else ""
            out.print(f"{'would ' + ('delete' if c['change'] == 'deleted' else 'send'):13} {c['change']:8} {c['path']}{size}")
        out.print(f"dry run: {s['files']} files would be sent, {s['deleted']} deleted; nothing changed "
                  f"(total {tr.human_bytes(s['total_bytes'])})")
        if s.get("warning"):
            out.warn(s["warning"])
        return
    deleted = f", {s['deleted']} deleted" if s["deleted"] else ""
    out.print(f"synced to {s['remote_dir']}: {s['files']} files changed{deleted}, {tr.human_bytes(s['bytes_sent'])} sent, "
              f"total {tr.human_bytes(s['total_bytes'])}, {s['seconds']:.1f}s")


# -- fetch -----------------------------------------------------------------------------------------
