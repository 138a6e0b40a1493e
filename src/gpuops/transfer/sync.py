"""`gpuops sync`, the talking part: the checks (rsync on the host, the remote folder, room on its disk, the guard
against deleting what is not the project's), then rsync itself with the plan's filters. The checks ride in rsync's
own session where they can (see sync_project), else they are one remote execution before it. Also used from Python
by `gpuops train` and `run`:
  sync_project(profile, remote, out, project_dir, *, delete, dry_run, excludes, gitignore) -> summary dict
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import plan as tr
from . import preview as pv
from ..errors import ExitCode, GpuopsError, RemoteError, UsageError
from ..remote.shell import shell_path
from . import rsync as rs
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


def sync_rules(excludes_of_profile: Sequence[str], project_dir: Path, excludes: Sequence[str] = (),
               gitignore: bool = False) -> list[tuple[str, str]]:
    """The sync's filter rules, each with where it comes from (transfer.plan.labelled_rules), .gpuopsignore read."""
    try:
        ignore = tr.read_ignore_file(Path(project_dir) / tr.IGNORE_FILE)
    except tr.IgnoreFileError as exc:
        raise UsageError(str(exc)) from None
    return tr.labelled_rules(excludes_of_profile, excludes, ignore, gitignore, fetched=fetched(project_dir))


def sync_filter(profile, project_dir: Path, excludes: Sequence[str] = (), gitignore: bool = False) -> list[str]:
    return [r for r, _ in sync_rules(profile.sync.exclude, project_dir, excludes, gitignore)]


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
                 excludes: Sequence[str] = (), gitignore: bool = False, copy_links: Optional[bool] = None,
                 confirm: Optional[Callable[[str], bool]] = None, preview: bool = True) -> dict:
    """Copy project_dir to the profile's remote_dir. Returns the summary dict
    {files, bytes_sent, total_bytes, duration_s, dry_run, changes, remote_dir, attempts, deleted, outside_links}.
    Where rsync rides on `remote` itself (remote.shared_with_rsync: `gpuops sync`'s one OpenSSH connection), a plain
    sync runs its checks on rsync's remote side, in rsync's own session (transfer.plan.sync_guard). The checks run
    first, as one remote execution, for --delete (the guard judges where the folder really is before anything can
    be deleted), --dry-run (which creates nothing), on a connection of gpuops' own (train, run), and when the upper
    bound of what is sent does not fit the free disk (the exact amount, from a dry run, then decides).
    Before anything is sent: symlinks pointing outside the project are said (copy_links: None is the profile's
    sync.copy_links), and a large upload (transfer.preview.is_large on the local project, then what a dry run says
    would really go) is said with its biggest folders and, with `confirm`, asked (False: nothing is sent, exit 1).
    preview=False: neither is said (`gpuops run` said them before the launch, local_preview)."""
    rs.require_local_rsync()
    project_dir = Path(project_dir).resolve()
    started = time.monotonic()
    remote_dir = profile.remote_dir_for(project_dir)
    labelled = sync_rules(profile.sync.exclude, project_dir, excludes, gitignore)
    rules = [r for r, _ in labelled]
    copy = profile.sync.copy_links if copy_links is None else copy_links
    scan = pv.scan(project_dir, labelled) if preview else pv.Scan()
    if scan.outside_links:
        out.warn(pv.links_warning(scan.outside_links, copying=copy))

    def argv(dry: bool, guard: str | None = None) -> list[str]:
        return tr.sync_args(remote.ssh_argv(), project_dir, profile.host, remote_dir, rules, delete=delete,
                            dry_run=dry, gitignore=gitignore, rsync_path=guard, copy_links=copy)

    label = "dry run" if dry_run else f"sync → {remote_dir}"
    res, free, asked = None, None, not scan.large or dry_run
    if remote.shared_with_rsync and not (delete or dry_run):
        # the room's upper bound: the scan's (one walk of the project, made for the preview) when it was made
        need = scan.total if preview else tr.estimate_upload_bytes(project_dir, rules)
        guard = tr.sync_guard(shell_path(remote_dir), need=need)
        try:
            reconnect = _master_on_failure(remote)
            if not asked:
                _preview(profile, out, argv(True, guard), remote_dir, confirm, scan.code, reconnect=reconnect)
                asked = True
            res = _send(argv(False, guard), profile, out, label, reconnect=reconnect)
        except rs.GuardStop as stop:
            if stop.kind == "mkdir":
                raise RemoteError(f"cannot create the remote directory {remote_dir}: {stop.said}") from None
            # the room is short for the upper bound: the checks below, and the exact amount, decide
    if res is None:
        free = _checks_first(profile, remote, remote_dir, delete=delete, dry_run=dry_run)
        if free is not None and not dry_run:
            _fits(profile, project_dir, rules, remote_dir, free, argv)
        if not asked:
            _preview(profile, out, argv(True), remote_dir, confirm, scan.code)
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
        "duration_s": round(time.monotonic() - started, 3),
        "attempts": res.attempts,
        "changes": [c.as_dict() for c in changes.values()],
        "outside_links": [{"path": p, "target": t} for p, t in scan.outside_links],
        "copy_links": copy,
    }
    if dry_run and free is not None and res.stats.get("transferred_bytes", 0) > free:
        summary["warning"] = f"would not fit: {tr.human_bytes(free)} free on the remote"
    return summary


def warn_script_exclusions(out, project_dir: Path, script_rel: Optional[str], excludes_of_profile: Sequence[str],
                           excludes: Sequence[str] = (), *, run: bool = False,
                           said_elsewhere: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Each local file the script names that the sync leaves out, said with the rule and how to send it (run: in
    `gpuops run`'s words), but for the rules `said_elsewhere` (a --data folder of the project: the local plan says
    where the job finds it). Returns the sync's labelled rules."""
    labelled = sync_rules(excludes_of_profile, Path(project_dir), excludes)
    if script_rel:
        for path, pattern, origin in pv.silent_exclusions(Path(project_dir), script_rel, labelled):
            if pattern not in said_elsewhere:
                out.warn(pv.exclusion_warning(script_rel, path, pattern, origin, run=run))
    return labelled


def local_preview(out, project_dir: Path, script_rel: Optional[str], excludes_of_profile: Sequence[str], *,
                  copy_links: bool = False, confirm: Optional[Callable[[str], bool]] = None,
                  data_exclude: Optional[str] = None) -> pv.Scan:
    """What `gpuops run` says on this machine before anything bills (train says the first through
    warn_script_exclusions, the others in sync_project): the files the script names that the sync leaves out,
    symlinks pointing outside the project, and a large upload of the whole project (a new instance has nothing yet;
    asked with `confirm`: False raises, exit 1). `data_exclude`: a --data folder of the project, left out of the
    upload (it goes to $GPUOPS_DATA), never said as a rule of the profile's. Returns the scan."""
    project_dir = Path(project_dir).resolve()
    rules = list(excludes_of_profile) + ([data_exclude] if data_exclude else [])
    labelled = warn_script_exclusions(out, project_dir, script_rel, rules, run=True,
                                      said_elsewhere=[data_exclude] if data_exclude else [])
    scan = pv.scan(project_dir, labelled)
    if scan.outside_links:  # in run's words: it has no --copy-links nor --exclude, its profile comes from --from
        out.warn(pv.links_warning(scan.outside_links, copying=copy_links, how=pv.RUN_LINKS_HOW))
    if confirm is not None and scan.large:
        out.warn(pv.size_warning(scan.total, scan.files, scan.biggest()) + "; " + pv.RUN_SIZE_HINT)
        if not confirm(f"upload {tr.human_bytes(scan.total)} once the instance is up?"):
            raise GpuopsError(f"not launched: the project would upload {tr.human_bytes(scan.total)}",
                              hint=pv.RUN_SIZE_HINT, code=ExitCode.FAILED)
    return scan


def _master_on_failure(remote):
    """A lazy connection (remote.lazy: no master yet) lets rsync connect with its own ssh, as plain rsync does; should
    that fail to connect (a host key never seen, a refusal, a passing failure), rsync.run calls this first: the master
    opens, its connect() judging as for every command (the policy's trust, the one message and exit code of a
    refusal), and rsync's next attempt goes through it."""
    if not getattr(remote, "lazy", False):
        return None

    def reconnect() -> None:
        if remote.lazy:
            remote.open_master()
    return reconnect


def _preview(profile, out, dry_argv: list[str], remote_dir: str, confirm, code: int, reconnect=None) -> None:
    """A large project: what a dry run says would really go (an unchanged re-sync sends nothing), said with the
    biggest folders when it is large itself (code: the project's code bytes), and asked when confirm is given."""
    total, files, top = pv.top_of_changes(rs.run(dry_argv, host=profile.host, reconnect=reconnect).items)
    if not pv.is_large(total, code):
        return
    biggest = sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:pv.TOP_SHOWN]
    out.warn(pv.size_warning(total, files, biggest, where=f"{profile.name}:{remote_dir}") + "; " + pv.SIZE_HINT)
    if confirm is not None and not confirm(f"upload {tr.human_bytes(total)} to {profile.name}?"):
        raise GpuopsError(f"not synced: {tr.human_bytes(total)} would have been uploaded", hint=pv.SIZE_HINT,
                          code=ExitCode.FAILED)


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


def _send(argv: list[str], profile, out, label: str, reconnect=None) -> rs.RsyncResult:
    view = ProgressView(out, label)
    with view:
        return rs.run(argv, host=profile.host, on_progress=view.update, on_retry=view.retry, reconnect=reconnect)


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
              f"total {tr.human_bytes(s['total_bytes'])}, {s['duration_s']:.1f}s")


# -- fetch -----------------------------------------------------------------------------------------
