"""`run --data SOURCE`, the talking part: a local folder rsync'd straight to the instance's data folder (on the
filesystem with --fs: once, later runs send only what changed); a URL or a Hugging Face repo downloaded by the
instance itself (never through this machine). Pure rules in `transfer/dataplan.py`."""
from __future__ import annotations

import json
import os
import shlex
from typing import Callable, Optional

from ..errors import GpuopsError, ExitCode
from ..remote.shell import shell_path
from . import rsync as rs
from . import dataplan as dp
from . import plan as tr

STALL_S = 300.0  # a download that receives no byte this long is ended (GPUOPS_DATA_STALL_S changes it)


def stall_s() -> float:
    try:
        return float(os.environ.get("GPUOPS_DATA_STALL_S") or STALL_S)
    except ValueError:
        return STALL_S


def put(profile, remote, out, src: dp.Source, fs_mount: Optional[str], *, token: Optional[str] = None,
        endpoint: Optional[str] = None, tick: Optional[Callable[[dict], None]] = None,
        run: Optional[str] = None) -> dict:
    """The source at its place on the instance. Returns {path (GPUOPS_DATA), bytes_here (crossed this machine),
    bytes_remote (downloaded by the instance), skipped, changed (a local folder: the files this put changed)}.
    tick(progress) is called about once a second while the instance downloads, or rsync sends a local folder
    ({"progress": bytes, "total": bytes or None}); it may raise (a budget reached) to end it. A local folder's
    puts are kept beside its copy (`run`, when and what changed: dataplan.puts_file), so that a put that changes
    files names the earlier put, and a run whose data another run changed is told (puts_since)."""
    if src.kind == "local":
        rs.require_local_rsync()
    target = shell_path(dp.target(src, fs_mount))
    made = remote.run(f"mkdir -p {target} && cd {target} && pwd && tail -n {dp.PUTS_KEPT} "
                      f"{shell_path(dp.puts_file(dp.target(src, fs_mount)))} 2>/dev/null | sed 's/^/@put /'; true",
                      timeout=60)
    if made.rc != 0 or not made.stdout.strip():
        raise GpuopsError(f"cannot create {dp.target(src, fs_mount)} on {profile.host}: {made.stderr.strip()[:300]}",
                          code=ExitCode.FAILED)
    lines = made.stdout.strip().splitlines()
    dest = lines[0]  # absolute: what the job reads in GPUOPS_DATA
    if src.kind == "local":
        previous = (dp.parse_puts([x[5:] for x in lines[1:] if x.startswith("@put ")]) or [None])[-1]
        argv = tr.sync_args(remote.ssh_argv(), src.path, profile.host, dest, [])
        # rsync's progress through tick too: --max-cost and the run's TTL in force while a big folder crosses
        res = rs.run(argv, host=profile.host, on_progress=None if tick is None else lambda pr: tick(
            {"progress": pr.bytes, "total": pr.total_estimate}))
        sent = res.stats.get("bytes_sent", 0)
        changed = sorted(c.path for c in res.items if c.kind != "dir" and c.change != "deleted")
        out.info(f"data {src.text} → {dest}: {res.stats.get('files_transferred', 0)} files changed, "
                 f"{tr.human_bytes(sent)} sent")
        _record_put(remote, dest, run, changed)
        since = dp.changed_since_warning(src, dest, changed, previous, run)
        if since:
            out.warn(since[0] + "; " + since[1])
        # what the copy holds beyond the folder (a dry run with --delete lists it; nothing is deleted)
        dry = tr.sync_args(remote.ssh_argv(), src.path, profile.host, dest, [], delete=True, dry_run=True)
        extra = sorted(c.path for c in rs.run(dry, host=profile.host).items if c.change == "deleted" and c.kind != "dir")
        stale = dp.stale_warning(src, dest, extra)
        if stale:
            out.warn(stale[0] + "; " + stale[1])
        return {"path": dest, "bytes_here": sent, "bytes_remote": 0, "skipped": False, "changed": changed}
    shown = src.shown or src.text  # a URL's credentials are secrets: never said
    out.step(f"the instance downloads {shown} into {dest}")
    doc, lines = _download(remote, dp.fetch_params(src, dest, token, endpoint), tick)
    if not doc.get("ok"):
        why = doc.get("error") or (lines[-1][:300] if lines else "no answer")
        why = dp.scrub(why, dp.url_secrets(src.text)) if src.kind == "url" else why
        raise GpuopsError(f"--data {shown}: the instance could not get it: {why}", code=ExitCode.FAILED,
                          hint=doc.get("hint") or "check the URL and its sha256 (or the repo name and HF_TOKEN) from "
                                                  "the instance")
    out.info(f"data {shown} → {dest}: " + ("already there (checksum matches), nothing downloaded"
                                              if doc.get("skipped") else
                                              f"{tr.human_bytes(doc.get('bytes', 0))} downloaded by the instance"))
    return {"path": dest, "bytes_here": 0, "bytes_remote": doc.get("bytes", 0), "skipped": bool(doc.get("skipped"))}


def _record_put(remote, dest: str, run: Optional[str], changed: list[str]) -> None:
    """One line for this put in the folder's ledger (appended: puts from several machines never lose each other's)."""
    import socket
    import time

    line = json.dumps(dp.put_line(run, time.time(), socket.gethostname(), changed))
    remote.run(f"printf '%s\\n' {shlex.quote(line)} >> {shell_path(dp.puts_file(dest))}", timeout=60)


def puts_since(remote, dest: str, run: str) -> list[dict]:
    """The puts by other runs that changed files of the folder after this run's own last put (dataplan.changed_under);
    [] when the ledger cannot be read."""
    res = remote.run(f"tail -n {dp.PUTS_KEPT} {shell_path(dp.puts_file(dest))} 2>/dev/null; true", timeout=60)
    return dp.changed_under(dp.parse_puts(res.stdout.splitlines()), run)


def _download(remote, params: dict, tick: Optional[Callable[[dict], None]]) -> tuple[dict, list]:
    """The instance's download, in ONE execution whose output is read as it comes: a progress line a second
    ({"progress": bytes, "total": bytes or null}), handed to tick (which may raise: --max-cost, the run's TTL; the
    execution then ends: its next progress line finds no reader), then the result line ({"ok", ...})."""
    stall = stall_s()
    params = dict(params, stall_s=stall)
    chan = remote.stream("python3 -c " + shlex.quote(dp.RUNNER) + " 2>&1")
    other: list = []
    try:
        chan.sendall((json.dumps(params) + "\n" + dp.FETCH_SCRIPT).encode())
        chan.shutdown_write()
        for line in remote.iter_lines(chan, idle_timeout=max(60.0, 3 * stall)):
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if not isinstance(doc, dict):
                if line.strip():
                    other.append(line.strip())
                continue
            if "progress" in doc:
                if tick is not None:
                    tick(doc)
                continue
            return doc, other
    finally:
        chan.close()
    return {}, other
