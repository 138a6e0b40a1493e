"""`gpuops fetch`, the talking part: one remote execution lists the source, rsync brings it into a staging folder
while both sides hash it, and every file moves to its final name only once the whole selection verified.
  fetch(profile, remote, out, name, *, dest, latest, step, project_dir) -> summary dict
  list_remote(profile, remote, project_dir) -> {name: {...}}
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from . import plan as tr
from ..errors import ConnectError, GpuopsError, RemoteError, UsageError
from ..remote.shell import shell_command
from . import rsync as rs
from ..remote.connection import ssh_command
from .progress import ProgressView

HASH_CHUNK = 1 << 20

# Runs remotely with the profile's python (stdlib only); prints one JSON document.
REMOTE_SCRIPT = r'''
import hashlib, json, os, shutil, stat, sys
spec = json.loads(sys.argv[1])
def walk(root):
    rows = []
    if os.path.isfile(root):
        st = os.stat(root)
        return [[os.path.basename(root), st.st_size, st.st_mtime]]
    for cur, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(cur, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                rows.append([os.path.relpath(p, root).replace(os.sep, "/"), st.st_size, st.st_mtime])
    return rows
def links(root):
    """Symlinks under root: {rel: target} for those pointing inside it, [rel] for those pointing outside."""
    inside, outside = {}, []
    if not os.path.isdir(root):
        return inside, outside
    for cur, dirs, files in os.walk(root):
        for f in sorted(dirs + files):
            p = os.path.join(cur, f)
            if not os.path.islink(p):
                continue
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            target = os.readlink(p)
            where = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            if os.path.isabs(target) or where == ".." or where.startswith("../"):
                outside.append(rel)
            else:
                inside[rel] = target
    return inside, outside
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while True:
            b = fh.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
def held(real, tag):
    """Paths under `real` held open for writing by the processes whose environment carries `tag` (the job's)."""
    found, pids = set(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                if tag not in fh.read().split(b"\0"):
                    continue
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        pids += 1
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                with open("/proc/%s/fdinfo/%s" % (pid, fd)) as fh:
                    flags = [int(l.split()[1], 8) for l in fh if l.startswith("flags:")]
            except (OSError, ValueError, IndexError):
                continue
            if flags and flags[0] & 3 and target.startswith(real + "/"):
                found.add(os.path.relpath(target, real))
    return found, pids
def cut_short(p, size, kind):
    """Why file p (of a format that says its own length) is cut short, or None."""
    with open(p, "rb") as fh:
        if kind == "zip":
            head = fh.read(4)
            if size == 0:
                return "an empty file (torch.save had written nothing yet)"
            if len(head) < 4 and b"PK\x03\x04".startswith(head):
                return "the first %d bytes of a zip (torch.save): cut short or still written" % len(head)
            if head != b"PK\x03\x04":
                return None
            n = min(size, 65557)
            fh.seek(size - n)
            tail = fh.read(n)
            i = tail.rfind(b"PK\x05\x06")  # the end record: 22 bytes and its comment, the last bytes of the file
            while i >= 0 and not (len(tail) - i >= 22 and
                                  i + 22 + int.from_bytes(tail[i + 20:i + 22], "little") == len(tail)):
                i = tail.rfind(b"PK\x05\x06", 0, i)
            if i < 0:
                return "a zip (torch.save) without its end-of-central-directory record: cut short or still written"
            return None
        if kind == "safetensors":
            head = fh.read(8)
            if len(head) < 8:
                return "a safetensors file shorter than its 8-byte header size"
            n = int.from_bytes(head, "little")
            if n > 100 * 2 ** 20 or 8 + n > size:
                return "a safetensors header of %d bytes in a file of %d bytes: cut short" % (n, size)
            try:
                doc = json.loads(fh.read(n).decode("utf-8"))
                end = max([v["data_offsets"][1] for k, v in doc.items() if k != "__metadata__"] or [0])
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
                return "a safetensors header that is not valid JSON: cut short or still written"
            if 8 + n + end > size:
                return "safetensors header + data make %d bytes, the file has %d: cut short" % (8 + n + end, size)
            if 8 + n + end < size:
                return ("the file has more bytes (%d) than its safetensors header says (%d): not one safetensors "
                        "file as written" % (size, 8 + n + end))
    return None
def evidence(full, files, ev):
    """What vouches for or rules out a checkpoint, seen in this same execution as its listing: files held open for
    writing by the job (read before and after the walk), marker files' contents, files cut short."""
    real = os.path.realpath(full)
    res = {"open": [], "invalid": {}, "contents": {}, "pids": 0}
    if ev.get("run_id"):
        tag = ("GPUOPS_RUN_ID=" + ev["run_id"]).encode()
        got, res["pids"] = held(real, tag)
        res["open"] = sorted(got | ev.pop("_before", set()))
    read, validate = set(ev.get("read") or ()), ev.get("validate") or {}
    for rel, size, _ in files[:20000]:
        base = rel.rsplit("/", 1)[-1]
        p = os.path.join(full, rel)
        try:
            if base in read and size <= 4096:
                with open(p, "rb") as fh:
                    res["contents"][rel] = fh.read().decode("utf-8", "replace")
            kind = next((k for sfx, k in validate.items() if base.endswith(sfx)), None)
            why = cut_short(p, size, kind) if kind else None
        except OSError as exc:
            why = "unreadable: %s" % exc
        if why:
            res["invalid"][rel] = why
    return res
out = {"rsync": shutil.which("rsync")}
if "list" in spec:
    roots = {}
    ev = spec.get("evidence") or {}
    for name, path in spec["list"].items():
        full = os.path.expanduser(path)
        r = {"path": full, "exists": os.path.exists(full), "is_dir": os.path.isdir(full)}
        if name in (ev.get("names") or ()) and ev.get("run_id") and r["is_dir"]:
            ev["_before"] = held(os.path.realpath(full), ("GPUOPS_RUN_ID=" + ev["run_id"]).encode())[0]
        if r["exists"]:
            try:
                r["files"] = walk(full)
            except OSError as exc:
                r["error"] = str(exc)
        if name in (ev.get("names") or ()) and r["is_dir"]:
            r["evidence"] = evidence(full, r.get("files") or [], ev)
        roots[name] = r
    out["roots"] = roots
if "hash" in spec:
    base = os.path.expanduser(spec["hash"]["base"])
    hashes, errors = {}, {}
    for sub in spec["hash"]["subs"]:
        top = os.path.join(base, sub) if sub else base
        if not os.path.exists(top):
            continue
        single = os.path.isfile(top)
        for rel, size, _ in walk(top):
            relp = (sub.rstrip("/") + "/" + rel) if sub else rel
            try:
                hashes[relp] = [size, sha(top if single else os.path.join(top, rel))]
            except OSError as exc:
                errors[relp] = str(exc)
    out["hashes"] = hashes
    out["errors"] = errors
    inside, outside = {}, []
    for sub in spec["hash"]["subs"]:
        top = os.path.join(base, sub) if sub else base
        i, o = links(top)
        pre = (sub.rstrip("/") + "/") if sub else ""
        inside.update({pre + k: v for k, v in i.items()})
        outside += [pre + k for k in o]
    out["links"] = inside
    out["outside_links"] = outside
print(json.dumps(out))
'''


# -- progress --------------------------------------------------------------------------------
def _run_script(profile, remote, spec: dict, *, timeout: float) -> dict:
    cmd = f"{shell_command(profile.python)} - {shlex.quote(json.dumps(spec))}"
    res = remote.run(cmd, stdin=REMOTE_SCRIPT, timeout=timeout)
    if res.rc == 127:
        raise RemoteError(f"{profile.python} is not available on {profile.host}; fetch needs it for listing and SHA-256",
                          hint="set 'python:' in the profile to the remote interpreter")
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        detail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise RemoteError(f"remote listing failed (exit {res.rc}): {detail}") from None


def _run_script_reconnecting(profile, remote, out, spec: dict, *, timeout: float) -> dict:
    """As _run_script; if the connection died meanwhile (the network blip rsync retried through usually takes the
    long-lived SSH connection with it), open a fresh one for this execution."""
    try:
        return _run_script(profile, remote, spec, timeout=timeout)
    except ConnectError:
        from ..remote.connection import connect

        out.step("the SSH connection dropped during the transfer; reconnecting to verify")
        with connect(profile, announce=out.info) as fresh:
            return _run_script(profile, fresh, spec, timeout=timeout)


class _RemoteHash:
    """The remote hashing script started in the background on the open connection; result() waits for it.
    result() is None when the connection did not survive (the caller then hashes again on a fresh one)."""

    def __init__(self, profile, remote, spec: dict):
        self.chan = None
        try:
            self.chan = remote.stream(f"{shell_command(profile.python)} - {shlex.quote(json.dumps(spec))}")
            self.chan.sendall(REMOTE_SCRIPT.encode())
            self.chan.shutdown_write()
        except Exception:
            self.chan = None

    def result(self, timeout: float = 3600) -> dict | None:
        if self.chan is None:
            return None
        from ..remote.connection import output_complete

        chan, out_b, deadline, seen = self.chan, bytearray(), time.monotonic() + timeout, {}
        try:
            while time.monotonic() < deadline:
                if chan.recv_ready():
                    out_b += chan.recv(1 << 16)
                    seen.pop("exit_at", None)  # output_complete's silence starts again
                    continue
                while chan.recv_stderr_ready():
                    chan.recv_stderr(1 << 16)
                if output_complete(chan, seen, stderr=False):  # the exit status may come before the last output
                    break
                if chan.closed or not chan.get_transport() or not chan.get_transport().is_active():
                    return None
                time.sleep(0.02)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else None
        except Exception:
            return None
        finally:
            chan.close()
        if rc is None:
            return None
        if rc == 127:
            return None
        try:
            return json.loads(out_b.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None


def fetch_sources(profile, project_dir: Path) -> dict[str, str]:
    base = profile.remote_dir_for(project_dir)
    return {name: tr.join_remote(base, sub) for name, sub in profile.fetch.items()}


def list_remote(profile, remote, project_dir: Path, *, rows: bool = False, evidence: Optional[dict] = None) -> dict:
    """{name: {path, exists, bytes, files, steps: [{dir, step, bytes, files}]}} for every name in profile.fetch;
    rows: each also has "rows", the listing itself ([relative path, size, mtime] per file); evidence ({names,
    run_id, read, validate}: pipeline.checkpoints.evidence_spec): those names also have "evidence", what the same
    execution saw (files open for writing by the job's processes, marker files' contents, files cut short)."""
    srcs = fetch_sources(profile, project_dir)
    spec = {"list": srcs, **({"evidence": evidence} if evidence else {})}
    doc = _run_script(profile, remote, spec, timeout=300)
    result = {}
    for name, path in srcs.items():
        r = doc.get("roots", {}).get(name, {})
        files = r.get("files", [])
        steps = tr.step_dirs(files)
        result[name] = {
            "path": path, "exists": bool(r.get("exists")), "is_dir": bool(r.get("is_dir")),
            "bytes": sum(f[1] for f in files), "files": len(files),
            "steps": [{"dir": k, **{kk: v[kk] for kk in ("step", "bytes", "files")}}
                      for k, v in sorted(steps.items(), key=lambda kv: (kv[1]["step"], kv[0]))],
        }
        if rows:
            result[name]["rows"] = files
        if "evidence" in r:
            result[name]["evidence"] = r["evidence"]
        if r.get("error"):
            result[name]["error"] = r["error"]
    return result


def render_list(out, listing: dict) -> None:
    if out.json_mode:
        out.emit_json(listing)
        return
    for name, r in listing.items():
        if not r["exists"]:
            out.print(f"{name}: {r['path']} (not on the remote)")
            continue
        if not r["is_dir"]:
            out.print(f"{name}: {r['path']}  {tr.human_bytes(r['bytes'])} (a file)")
            continue
        out.print(f"{name}: {r['path']}  {tr.human_bytes(r['bytes'])} in {r['files']} files")
        for s in r["steps"]:
            out.print(f"  step {s['step']:>8}  {tr.human_bytes(s['bytes']):>10}  {s['dir']}")


def _hash_local(root: Path, rels: Sequence[str], into: dict) -> None:
    for rel in rels:
        p = root / rel
        try:
            if p.is_symlink() or not p.is_file():
                continue
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                while True:
                    b = fh.read(HASH_CHUNK)
                    if not b:
                        break
                    h.update(b)
            into[rel] = (p.stat().st_size, h.hexdigest())
        except OSError:
            continue


def _local_files(root: Path) -> list[str]:
    rels = []
    for cur, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != tr.PARTIAL_DIR]
        for f in files:
            rels.append(os.path.relpath(os.path.join(cur, f), root).replace(os.sep, "/"))
    return rels


def _local_links(root: Path) -> dict[str, str]:
    found = {}
    for cur, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != tr.PARTIAL_DIR]
        for f in dirs + files:
            p = os.path.join(cur, f)
            if os.path.islink(p):
                found[os.path.relpath(p, root).replace(os.sep, "/")] = os.readlink(p)
    return found


def _free_bytes(path: Path) -> int:
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def _promote(staging: Path, dest: Path, rels: Sequence[str]) -> None:
    """Move verified files from staging to their final names (rename: atomic per file, same filesystem)."""
    for rel in rels:
        src, dst = staging / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)


class NeverCreated(GpuopsError):
    """What a fetch names does not exist on the host: nothing there to lose (`gpuops run` terminates)."""


def fetch(profile, remote, out, name: str = "checkpoints", *, dest: Path | None = None, latest: bool = False,
          step: int | None = None, project_dir: Path | None = None) -> dict:
    """Fetch profile.fetch[name] into dest (default ./NAME): resumable, verified by size + SHA-256, and each file
    appears under its final name only after the whole selection verified."""
    rs.require_local_rsync()
    project_dir = Path(project_dir or Path.cwd()).resolve()
    if name not in profile.fetch:
        raise UsageError(f"'{name}' is not in the profile's fetch: map ({', '.join(profile.fetch) or 'empty'})",
                         hint=f"add it to the profile:  fetch: {{{name}: path/on/remote}}")
    if latest and step is not None:
        raise UsageError("--latest and --step are mutually exclusive")
    started = time.monotonic()
    src = fetch_sources(profile, project_dir)[name]
    dest = Path(dest) if dest is not None else project_dir / name
    dest = dest if dest.is_absolute() else (Path.cwd() / dest)
    sel = _select(profile, remote, name, src, latest=latest, step=step)
    if sel.partial:
        miss = sel.partial["missing"]
        out.warn(f"{sel.partial['newest']} lacks {len(miss)} file(s) that {sel.partial['instead']} has "
                 f"({', '.join(miss[:3])}{' ...' if len(miss) > 3 else ''}): still being written, or cut short; "
                 f"fetching {sel.partial['instead']} instead (--step N takes a given one)")
    staging = dest / tr.STAGING_DIR
    _check_room(sel.files, dest, staging)
    from .sync import note_fetched

    note_fetched(project_dir, dest)  # before anything lands: the next sync never uploads it back
    staging.mkdir(parents=True, exist_ok=True)
    # files that failed verification last time: a remote file rewritten in place with the same size and mtime looks
    # unchanged to rsync's quick check, which would link the stale local copy again; this run compares checksums
    recheck = dest / (tr.STAGING_DIR + ".recheck")
    spec = {"hash": {"base": src, "subs": sel.subs or [""]}}
    res, remote_job, local = _transfer(profile, remote, out, name, src, sel, staging, dest, recheck, spec)
    out.step("verifying size and SHA-256 of every file")
    hdoc, v, link_ok = _verify(profile, remote, out, staging, dest, recheck, spec, remote_job, local)
    _promote(staging, dest, v.ok + link_ok)
    shutil.rmtree(staging, ignore_errors=True)
    recheck.unlink(missing_ok=True)
    outside = hdoc.get("outside_links", [])
    if outside:
        out.warn(f"{len(outside)} symlink(s) pointing outside {src} not fetched (never followed): "
                 + ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else ""))
    return {
        "profile": profile.name,
        "name": name,
        "source": src,
        "dest": str(dest),
        "steps": sel.steps_chosen,
        "dirs": sel.subs,
        "skipped_partial": sel.partial["newest"] if sel.partial else None,
        "file": sel.files[0][0] if sel.single and sel.files else None,
        "files": res.stats.get("files_transferred", 0),
        "verified": len(v.ok),
        "links": len(link_ok),
        "links_outside_skipped": outside,
        "bytes_received": res.stats.get("bytes_received", 0),
        "total_bytes": sum(s for s, _ in hdoc.get("hashes", {}).values()),
        "duration_s": round(time.monotonic() - started, 3),
        "attempts": res.attempts,
    }


@dataclass
class _Selection:
    """What a fetch takes: the files (rel, size, ...), the step folders chosen, whether the source is one file."""
    files: list
    subs: list[str]
    steps_chosen: list[int]
    single: bool
    partial: Optional[dict] = None  # --latest: the newest step folder, left because it lacks files (plan.partial_newest)


def _select(profile, remote, name: str, src: str, *, latest: bool, step: int | None) -> _Selection:
    """One execution lists the source; --latest / --step pick its checkpoint folders."""
    doc = _run_script(profile, remote, {"list": {name: src}}, timeout=300)
    if not doc.get("rsync"):
        raise rs.missing_remote(profile.host)
    root = doc["roots"][name]
    if not root.get("exists"):
        raise NeverCreated(f"nothing to fetch: {src} does not exist on {profile.host}")
    single = not root.get("is_dir")  # a fetch: entry naming one file: it lands as DEST/<its name>
    if single and (latest or step is not None):
        raise UsageError(f"'{name}' is a single file ({src}); --latest and --step select checkpoint directories")
    files = root.get("files", [])
    subs: list[str] = []
    steps_chosen: list[int] = []
    partial = None
    if latest or step is not None:
        steps = tr.step_dirs(files)
        partial = tr.partial_newest(steps) if latest else None
        try:
            subs = tr.select_steps(steps, latest=latest, step=step)
        except LookupError as exc:
            raise GpuopsError(f"{name} on {profile.host}: {exc}") from None
        steps_chosen = sorted({steps[s]["step"] for s in subs})
        files = [f for f in files if tr.under(f[0], subs)]
    return _Selection(files, subs, steps_chosen, single, partial)


def _check_room(files: list, dest: Path, staging: Path) -> None:
    """The local disk holds what is still to come (files already here or staged at their size are not counted)."""
    need = 0
    for rel, size, *_ in files:
        have = dest / rel
        part = staging / rel
        if not ((have.is_file() and have.stat().st_size == size) or (part.is_file() and part.stat().st_size == size)):
            need += size
    free = _free_bytes(dest)
    if need > free:
        raise GpuopsError(f"not enough local disk: the fetch needs {tr.human_bytes(need)}, {tr.human_bytes(free)} free "
                          f"at {dest}", hint="free space, or fetch one step: --latest / --step N")


def _transfer(profile, remote, out, name: str, src: str, sel: _Selection, staging: Path, dest: Path, recheck: Path,
              spec: dict):
    """rsync into the staging folder. Verification overlaps the transfer: the remote hashes its files (one
    execution) while rsync runs, and this machine hashes each file as soon as rsync reports it complete. Overlapping
    never weakens the check: any change to a remote file between its hash and its transfer is a mismatch (exit 1),
    never a silent success. Returns (rsync's result, the remote hashing, the local hashes so far)."""
    remote_job = _RemoteHash(profile, remote, spec)
    local: dict = {}
    queue_: "queue.Queue[str | None]" = queue.Queue()

    def hash_worker() -> None:
        while (rel := queue_.get()) is not None:
            _hash_local(staging, [rel], local)

    worker = threading.Thread(target=hash_worker, daemon=True)
    worker.start()

    def on_item(ch: tr.Change) -> None:
        if ch.kind == "file" and ch.change != "deleted":
            queue_.put(ch.path)

    list_file = None
    try:
        if sel.subs:
            fd, tmp = tempfile.mkstemp(prefix="gpuops-fetch-", suffix=".txt")
            with os.fdopen(fd, "w") as fh:
                fh.write("".join(s + "\n" for s in sel.subs))
            list_file = Path(tmp)
        argv = tr.fetch_args(ssh_command(profile), profile.host, src, staging, dest=dest, files_from=list_file,
                             single_file=sel.single, checksum=recheck.is_file())
        view = ProgressView(out, f"fetch {name}")
        with view:
            res = rs.run(argv, host=profile.host, on_progress=view.update, on_item=on_item, on_retry=view.retry)
    finally:
        queue_.put(None)
        if list_file is not None:
            list_file.unlink(missing_ok=True)
    worker.join()
    return res, remote_job, local


def _verify(profile, remote, out, staging: Path, dest: Path, recheck: Path, spec: dict, remote_job, local: dict):
    """Every staged file's size and SHA-256 against the remote's (and the symlinks). A mismatch drops the file,
    records it for a checksum comparison next time, and fails the fetch with nothing moved. Returns (the remote's
    hash document, the verdict, the links that match)."""
    rest = [r for r in _local_files(staging) if r not in local]  # kept from earlier runs, or linked from dest
    hasher = threading.Thread(target=_hash_local, args=(staging, rest, local), daemon=True)
    hasher.start()
    try:
        hdoc = remote_job.result()
        if hdoc is None:
            hdoc = _run_script_reconnecting(profile, remote, out, spec, timeout=3600)
    finally:
        hasher.join()
    remote_hashes = hdoc.get("hashes", {})
    v = tr.compare(remote_hashes, local)
    for rel in hdoc.get("errors", {}):
        if rel not in v.mismatched and rel not in v.missing:
            v.missing.append(rel)
    link_ok, link_bad = tr.compare_links(hdoc.get("links", {}), _local_links(staging))
    v.mismatched += link_bad
    if not v.passed:
        for rel in v.mismatched:  # drop them so the next run downloads them again, comparing checksums
            (staging / rel).unlink(missing_ok=True)
        from ..paths import write_atomic

        write_atomic(recheck, "".join(r + "\n" for r in v.mismatched))
        bad = v.problems()
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise GpuopsError(f"verification failed for {len(bad)} of {len(remote_hashes)} files: {shown}",
                          hint=f"nothing was moved into {dest}; run the fetch again (verified files are kept in "
                               f"{staging})")
    return hdoc, v, link_ok


def render_fetch(out, s: dict) -> None:
    if out.json_mode:
        out.emit_json(s)
        return
    what = f" step {', '.join(map(str, s['steps']))}" if s["steps"] else f" ({s['file']})" if s.get("file") else ""
    out.print(f"fetched {s['name']}{what} into {s['dest']}: {s['files']} files transferred, "
              f"{tr.human_bytes(s['bytes_received'])} received, {s['verified']} files verified (SHA-256), "
              f"total {tr.human_bytes(s['total_bytes'])}, {s['duration_s']:.1f}s")
