"""`run --data SOURCE`, the talking part: a local folder rsync'd straight to the instance's data folder (on the
filesystem with --fs: once, later runs send only what changed); a URL or a Hugging Face repo downloaded by the
instance itself (never through this machine). Pure rules in `transfer/dataplan.py`."""
from __future__ import annotations

import json
import shlex
from typing import Optional

from ..errors import GpuopsError, ExitCode
from ..remote.shell import shell_path
from . import rsync as rs
from . import dataplan as dp
from . import plan as tr

FETCH_TIMEOUT_S = 6 * 3600.0  # a large dataset over the instance's own link


def put(profile, remote, out, src: dp.Source, fs_mount: Optional[str], *, token: Optional[str] = None,
        endpoint: Optional[str] = None) -> dict:
    """The source at its place on the instance. Returns {path (GPUOPS_DATA), bytes_here (crossed this machine),
    bytes_remote (downloaded by the instance), skipped}."""
    if src.kind == "local":
        rs.require_local_rsync()
    made = remote.run(f"mkdir -p {shell_path(dp.target(src, fs_mount))} && cd {shell_path(dp.target(src, fs_mount))} "
                      "&& pwd", timeout=60)
    if made.rc != 0:
        raise GpuopsError(f"cannot create {dp.target(src, fs_mount)} on {profile.host}: {made.stderr.strip()[:300]}",
                          code=ExitCode.FAILED)
    dest = made.stdout.strip().splitlines()[-1]  # absolute: what the job reads in GPUOPS_DATA
    if src.kind == "local":
        argv = tr.sync_args(remote.ssh_argv(), src.path, profile.host, dest, [])
        res = rs.run(argv, host=profile.host)
        sent = res.stats.get("bytes_sent", 0)
        out.info(f"data {src.text} → {dest}: {res.stats.get('files_transferred', 0)} files changed, "
                 f"{tr.human_bytes(sent)} sent")
        # what the copy holds beyond the folder (a dry run with --delete lists it; nothing is deleted)
        dry = tr.sync_args(remote.ssh_argv(), src.path, profile.host, dest, [], delete=True, dry_run=True)
        extra = sorted(c.path for c in rs.run(dry, host=profile.host).items if c.change == "deleted" and c.kind != "dir")
        stale = dp.stale_warning(src, dest, extra)
        if stale:
            out.warn(stale[0] + "; " + stale[1])
        return {"path": dest, "bytes_here": sent, "bytes_remote": 0, "skipped": False}
    shown = src.shown or src.text  # a URL's credentials are secrets: never said
    out.step(f"the instance downloads {shown} into {dest}")
    stdin = json.dumps(dp.fetch_params(src, dest, token, endpoint)) + "\n"
    r = remote.run("python3 -c " + shlex.quote(dp.RUNNER), stdin=stdin + dp.FETCH_SCRIPT, timeout=FETCH_TIMEOUT_S)
    try:
        doc = json.loads((r.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        doc = {}
    if r.rc != 0 or not doc.get("ok"):
        why = doc.get("error") or (r.stderr.strip().splitlines() or ["no answer"])[-1][:300]
        why = dp.scrub(why, dp.url_secrets(src.text)) if src.kind == "url" else why
        raise GpuopsError(f"--data {shown}: the instance could not get it: {why}", code=ExitCode.FAILED,
                          hint="check the URL and its sha256 (or the repo name and HF_TOKEN) from the instance")
    out.info(f"data {shown} → {dest}: " + ("already there (checksum matches), nothing downloaded"
                                              if doc.get("skipped") else
                                              f"{tr.human_bytes(doc.get('bytes', 0))} downloaded by the instance"))
    return {"path": dest, "bytes_here": 0, "bytes_remote": doc.get("bytes", 0), "skipped": bool(doc.get("skipped"))}
