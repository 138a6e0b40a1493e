"""`run --data SOURCE`, the pure part: what a source is, where it goes on the instance, and the instance's own
download script (stdlib python, run remotely in one execution; huggingface_hub only for hf://).

Sources:
- a local folder (`--data ./corpus`): rsync'd once into the data folder; later runs send only what changed;
- `https://host/file.tar.gz#sha256=HEX` (or http://; the checksum is required): downloaded BY THE INSTANCE, checked,
  a tar/zip archive unpacked; a later run whose checksum matches the copy there downloads nothing;
- `hf://ORG/NAME[@REVISION]` (a model repo) or `hf://datasets/ORG/NAME[@REVISION]`: huggingface_hub's
  snapshot_download on the instance (HF_TOKEN, when set here, travels on the command's stdin, never a command line).
Where: with --fs, `<mount point>/gpuops/data/<name>-<key>` (on the filesystem: one copy for every instance attaching
it; the key tells sources of one name apart: `source_key`); without, `~/gpuops-data/<name>-<key>` on each instance's
own disk. The job reads it at GPUOPS_DATA."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UsageError

FS_DATA = "gpuops/data"  # under the filesystem's mount point
LOCAL_DATA = "~/gpuops-data"  # on the instance's own disk (no --fs)
ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
HF = re.compile(r"^hf://(?:(datasets|spaces|models)/)?([A-Za-z0-9][\w.-]*/[\w.-]+)(?:@([\w./-]+))?$")
NAME_OK = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Source:
    kind: str  # local | url | hf
    text: str  # as given (a URL without its #fragment)
    name: str  # the folder under the data folder
    path: Optional[Path] = None  # local
    sha256: Optional[str] = None  # url
    filename: Optional[str] = None  # url
    repo_id: Optional[str] = None  # hf
    repo_type: Optional[str] = None  # hf: model / dataset / space
    revision: Optional[str] = None  # hf
    shown: str = ""  # `text` as it may be shown or stored: a URL's credentials as **** (shown_url)


# A query parameter whose value is a credential: a presigned URL's signature (S3's X-Amz-Signature, GCS's
# X-Goog-Signature, CloudFront's Signature, Azure's sig), its credential and session token, an API key or token.
SECRET_PARAM = re.compile(r"signature|credential|token|secret|password|passwd|^sig$|^key$|^api[-_]?key$|^auth",
                          re.I)


def _query_parts(query: str) -> list[tuple[str, str, bool]]:
    """(key, value, secret?) of each `k=v` of a query, in order, as written."""
    from urllib.parse import unquote_plus

    out = []
    for part in query.split("&") if query else []:
        k, eq, v = part.partition("=")
        out.append((k, v if eq else None, bool(eq) and bool(SECRET_PARAM.search(unquote_plus(k)))))
    return out


def shown_url(url: str) -> str:
    """A URL as it may be shown or stored: its userinfo (`user:pass@`) and the values of its signature-like query
    parameters replaced by ****; the rest as written (issue #36)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
    except ValueError:
        return "****"
    netloc = ("****@" + u.netloc.rpartition("@")[2]) if "@" in u.netloc else u.netloc
    query = "&".join(k if v is None else f"{k}={'****' if secret else v}" for k, v, secret in _query_parts(u.query))
    return urlunsplit((u.scheme, netloc, u.path, query, ""))


def url_secrets(url: str) -> list[str]:
    """The secret pieces of a URL (userinfo, its password, the secret parameters' values), as written and decoded:
    what a message from the download must never hold."""
    from urllib.parse import unquote, unquote_plus, urlsplit

    try:
        u = urlsplit(url)
    except ValueError:
        return [url]
    found = []
    if "@" in u.netloc:
        info = u.netloc.rpartition("@")[0]
        found += [info, info.partition(":")[2], unquote(info), unquote(info.partition(":")[2])]
    for _k, v, secret in _query_parts(u.query):
        if secret and v:
            found += [v, unquote_plus(v)]
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "****")
    return text


def _clean(name: str) -> str:
    return NAME_OK.sub("-", name).strip("-.") or "data"


def parse(text: str, project_dir: Path) -> Source:
    """--data's value as a Source, checked (exit 2 with how to write it)."""
    raw = (text or "").strip()
    if raw.startswith(("https://", "http://")):
        url, _, frag = raw.partition("#")
        shown = shown_url(url)  # every message: the credentials are secrets
        m = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", frag)
        if not m:
            raise UsageError(f"--data {shown}: a download needs its checksum, as URL#sha256=HEX (64 hex digits)",
                             hint="sha256sum FILE gives it; the instance checks it before the job sees the data")
        from urllib.parse import urlsplit

        filename = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]  # never the host (nor a user:pass@ before it)
        if not filename:
            raise UsageError(f"--data {shown}: the URL names no file")
        stem = next((filename[: -len(a)] for a in ARCHIVES if filename.endswith(a)), filename)
        return Source("url", url, _clean(stem), sha256=m.group(1).lower(), filename=filename, shown=shown)
    if raw.startswith("hf://"):
        m = HF.match(raw)
        if not m:
            raise UsageError(f"--data {raw}: write hf://ORG/NAME (a model), hf://datasets/ORG/NAME, with @REVISION "
                             "if needed")
        kind = {"datasets": "dataset", "spaces": "space"}.get(m.group(1) or "", "model")
        return Source("hf", raw, _clean(m.group(2).replace("/", "--")), repo_id=m.group(2), repo_type=kind,
                      revision=m.group(3), shown=raw)
    if "://" in raw:
        raise UsageError(f"--data {shown_url(raw)}: a local folder, https://...#sha256=HEX or hf://ORG/NAME")
    path = (project_dir / raw).resolve() if raw else None
    if path is None or not path.is_dir():
        raise UsageError(f"--data {raw!r}: no such folder", hint="a local folder, https://...#sha256=HEX or "
                                                                  "hf://ORG/NAME")
    return Source("local", raw, _clean(path.name), path=path, shown=raw)


def project_exclude(src: Source, project_dir: Path) -> Optional[str]:
    """A local data folder inside the project: the sync's exclude that keeps it out of the project's upload (it goes
    to its own place, once, through `put`; without this it crossed again with the project to every instance)."""
    if src.kind != "local" or src.path is None:
        return None
    try:
        rel = src.path.relative_to(Path(project_dir).resolve())
    except ValueError:
        return None  # outside the project: the project's sync never sends it
    return f"/{rel.as_posix()}/" if rel.parts else None


def stale_warning(src: Source, dest: str, extra: list[str], shown: int = 5) -> Optional[tuple[str, str]]:
    """Files in the instance's copy of a local folder that the folder no longer has (deleted here, or another folder
    of the same name sent before): the job reads them too, and gpuops deletes nothing there. (message, hint) or
    None."""
    if not extra:
        return None
    names = ", ".join(extra[:shown]) + (f" and {len(extra) - shown} more" if len(extra) > shown else "")
    return (f"data {src.text}: {len(extra)} file{'s' if len(extra) != 1 else ''} in {dest} "
            f"{'are' if len(extra) != 1 else 'is'} not in {src.path} (deleted here, or another folder named "
            f"{src.name!r} sent before); the job sees {'them' if len(extra) != 1 else 'it'} too: {names}",
            "gpuops never deletes data there: remove them on the instance (or from the job), or give the folder "
            "another name")


PUTS_SUFFIX = ".puts"  # beside a local folder's copy: one JSON line per put ({run, at, host, changed, count})
PUTS_KEPT = 200  # the lines read back (the newest)


def puts_file(dest: str) -> str:
    """The put ledger of a data folder: beside it, never in it (the job reads the folder; a `--delete` dry run of the
    folder would list it)."""
    return dest.rstrip("/") + PUTS_SUFFIX


def put_line(run: Optional[str], at: float, host: str, changed: list[str], shown: int = 20) -> dict:
    return {"run": run, "at": round(at, 3), "host": host, "count": len(changed), "changed": changed[:shown]}


def parse_puts(lines: list[str]) -> list[dict]:
    """The ledger's lines, oldest first (a line that is not a JSON object: skipped)."""
    from ..jsonvocab import json_objects

    return json_objects(lines)


def _when(at) -> str:
    from datetime import datetime

    try:
        return datetime.fromtimestamp(float(at)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _names(entry: dict) -> str:
    names = list(entry.get("changed") or [])
    more = int(entry.get("count") or len(names)) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def changed_since_warning(src: Source, dest: str, changed: list[str], previous: Optional[dict],
                          run: Optional[str]) -> Optional[tuple[str, str]]:
    """This put changed files of a folder an earlier put filled (the local folder changed since): (message, hint),
    naming the files and the earlier put, or None (nothing changed, or the first put)."""
    if not changed or previous is None:
        return None
    who = "this run" if previous.get("run") and previous.get("run") == run else f"run {previous.get('run') or '?'}"
    n = len(changed)
    return (f"data {src.text}: {n} file{'s' if n != 1 else ''} changed since the last put into {dest} ({who}, "
            f"{_when(previous.get('at'))}, from {previous.get('host') or '?'}): "
            f"{_names(put_line(run, 0, '', changed))}",
            "a run still reading that folder (on the filesystem: any instance attaching it) sees these files change "
            "under it, and a run resumed from a checkpoint trains on other data than its predecessor")


def changed_under(entries: list[dict], run: str) -> list[dict]:
    """The puts that changed files after this run's own last put, by other runs: its data changed under it."""
    mine = max((i for i, e in enumerate(entries) if e.get("run") == run), default=None)
    if mine is None:
        return []
    return [e for e in entries[mine + 1:] if e.get("run") != run and int(e.get("count") or 0) > 0]


def changed_under_warning(src_text: str, dest: str, later: list[dict]) -> Optional[str]:
    """The warning for a run whose data changed under it, naming each later put and what it changed."""
    if not later:
        return None
    said = "; ".join(f"run {e.get('run') or '?'} at {_when(e.get('at'))} changed {e.get('count')} file"
                     f"{'s' if int(e.get('count') or 0) != 1 else ''} ({_names(e)})" for e in later[-3:])
    return (f"the data changed under this run: {dest} (--data {src_text}) was put again while it ran: {said}; "
            "the job may have read either version")


def data_root(fs_mount: Optional[str]) -> str:
    return f"{fs_mount.rstrip('/')}/{FS_DATA}" if fs_mount else LOCAL_DATA


def source_key(src: Source) -> str:
    """What tells two sources of the same name apart (issue 35: ./corpus of project A and ./corpus of project B met
    in one folder, and B trained on A's files kept by rsync's quick check): a local folder by this machine and its
    absolute path; a download by its content's sha256 (the same content shares a folder whatever the URL); a Hub
    repo by its type, id and revision."""
    import hashlib
    import socket

    ident = {"local": f"local:{socket.gethostname()}:{src.path}", "url": f"sha256:{src.sha256}",
             "hf": f"hf:{src.repo_type}/{src.repo_id}@{src.revision or ''}"}.get(src.kind, src.text)
    return hashlib.sha256(ident.encode()).hexdigest()[:10]


def target(src: Source, fs_mount: Optional[str]) -> str:
    """Where the source lands on the instance: GPUOPS_DATA, a folder of its own per source (`<name>-<key>`)."""
    return f"{data_root(fs_mount)}/{src.name}-{source_key(src)}"


def fetch_params(src: Source, dest: str, token: Optional[str] = None, endpoint: Optional[str] = None) -> dict:
    """The download script's parameters (sent on stdin: the token never on a command line). `endpoint`: this
    machine's HF_ENDPOINT (a Hub mirror), given to huggingface_hub on the instance."""
    return {"kind": src.kind, "url": src.text, "shown": src.shown or src.text, "sha256": src.sha256,
            "filename": src.filename, "dest": dest, "repo_id": src.repo_id, "repo_type": src.repo_type,
            "revision": src.revision, "token": token, "endpoint": endpoint,
            "secrets": url_secrets(src.text) if src.kind == "url" else []}


# Runs on the instance (python3, stdlib; huggingface_hub for hf://): stdin is the JSON parameters' line, then this
# script (RUNNER reads both); the parameters arrive as PARAMS.
# Prints one JSON line: {"ok", "skipped", "bytes", "error"}. Writes under a temporary name, renamed once checked.
RUNNER = "import sys; PARAMS, _, BODY = sys.stdin.read().partition(chr(10)); exec(BODY)"
FETCH_SCRIPT = r'''
import hashlib, json, os, shutil, socket, stat, sys, tarfile, tempfile, threading, time, urllib.request, zipfile
p = json.loads(PARAMS)
dest = os.path.expanduser(p["dest"])
os.makedirs(dest, exist_ok=True)
mark = os.path.join(dest, ".gpuops-source")
lock = threading.Lock()
state = {"n": 0, "total": None, "last": time.time()}
def say(doc):
    with lock:
        sys.stdout.write(json.dumps(doc) + "\n"); sys.stdout.flush()
def done(**kw):
    say(dict({"ok": True, "skipped": False, "bytes": 0, "error": ""}, **kw)); os._exit(0)
def fail(msg, hint=None):
    for s in p.get("secrets") or []:  # a URL's credentials never leave in a message
        msg = msg.replace(s, "****")
    say({"ok": False, "skipped": False, "bytes": state["n"], "error": msg, "hint": hint}); os._exit(0)
def beat():  # progress a second; a download that receives nothing for stall_s is ended; no reader: it ends
    stall = float(p.get("stall_s") or 300)
    while True:
        time.sleep(1.0)
        try:
            say({"progress": state["n"], "total": state["total"]})
        except Exception:
            os._exit(3)
        if time.time() - state["last"] > stall:
            stalled()
def stalled():
    fail("the download stalled: no byte received for %ds (%d bytes so far)" % (float(p.get("stall_s") or 300),
                                                                             state["n"]),
         "the server stopped sending; run again (GPUOPS_DATA_STALL_S changes the limit)")
def escapes(name, link=None):
    """Why an archive member would land outside dest (absolute, .., a link out), or None."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "a '..' in its path"
    if link is not None:
        where = os.path.normpath(os.path.join(os.path.dirname(name), link)) if not link.startswith("/") else link
        if link.startswith("/") or where == ".." or where.startswith("../"):
            return "a link pointing outside the data folder (%s)" % link
    return None
def check_tar(t):
    for m in t.getmembers():
        why = escapes(m.name, m.linkname if (m.issym() or m.islnk()) else None)
        if why is None and not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            why = "a device, fifo or other special file"
        if why:
            fail("refused to unpack %s: member %r is %s" % (p["filename"], m.name, why),
                 "an archive whose members stay inside the data folder (gpuops checks every member)")
def check_zip(z):
    for i in z.infolist():
        link = None
        if stat.S_ISLNK(i.external_attr >> 16):
            link = z.read(i).decode("utf-8", "replace")
        why = escapes(i.filename, link)
        if why:
            fail("refused to unpack %s: member %r is %s" % (p["filename"], i.filename, why),
                 "an archive whose members stay inside the data folder (gpuops checks every member)")
def request(url):
    # user:pass@ as HTTP Basic authentication (urllib would take "user:pass@host" for the host name)
    import base64, urllib.parse
    u = urllib.parse.urlsplit(url)
    if "@" not in u.netloc:
        return url
    info, _, host = u.netloc.rpartition("@")
    user, _, pw = info.partition(":")
    auth = base64.b64encode(("%s:%s" % (urllib.parse.unquote(user), urllib.parse.unquote(pw))).encode()).decode()
    return urllib.request.Request(urllib.parse.urlunsplit((u.scheme, host, u.path, u.query, "")),
                                  headers={"Authorization": "Basic " + auth})
if p["kind"] == "url":
    want = p["sha256"] + " " + p.get("shown", p["url"])  # the mark on the folder (a shared filesystem) holds no secret
    try:
        if open(mark).read().strip() == want:
            done(skipped=True)
    except OSError:
        pass
    threading.Thread(target=beat, daemon=True).start()
    fd, tmp = tempfile.mkstemp(prefix=".gpuops-download-", dir=dest)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request(p["url"]), timeout=float(p.get("stall_s") or 300)) as r:
            length = r.headers.get("Content-Length")
            state["total"] = int(length) if length and length.isdigit() else None
            read = getattr(r, "read1", None) or r.read
            while True:
                try:
                    b = read(1 << 16)
                except socket.timeout:
                    stalled()
                except Exception as e:  # IncompleteRead: the connection closed before the announced length
                    if state["total"] is not None and state["n"] < state["total"]:
                        break
                    raise
                if not b:
                    break
                h.update(b); out.write(b); state["n"] += len(b); state["last"] = time.time()
    except Exception as e:
        os.unlink(tmp); fail("download failed: %s" % e)
    n = state["n"]
    if state["total"] is not None and n < state["total"]:
        os.unlink(tmp)
        fail("the download was cut short: %d of the %d bytes the server announced were received" % (n, state["total"]),
             "the connection ended early: run again (nothing of it was kept)")
    if h.hexdigest() != p["sha256"]:
        os.unlink(tmp); fail("checksum mismatch: got sha256 %s, expected %s (%d bytes)" % (h.hexdigest(), p["sha256"], n))
    name = p["filename"]
    if os.path.exists(mark):  # the folder changes from here: no earlier source's mark may vouch for it meanwhile
        os.unlink(mark)
    try:
        if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
            with tarfile.open(tmp) as t:
                check_tar(t)
                kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                t.extractall(dest, **kw)
            os.unlink(tmp)
        elif name.endswith(".zip"):
            with zipfile.ZipFile(tmp) as z:
                check_zip(z)
                z.extractall(dest)
            os.unlink(tmp)
        else:
            os.replace(tmp, os.path.join(dest, name))
    except Exception as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        fail("could not unpack %s: %s" % (name, e))
    with open(mark + ".tmp", "w") as f:
        f.write(want + "\n")
    os.replace(mark + ".tmp", mark)
    done(bytes=n)
if p["kind"] == "hf":
    if p.get("token"):
        os.environ["HF_TOKEN"] = p["token"]
    if p.get("endpoint"):
        os.environ["HF_ENDPOINT"] = p["endpoint"]
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        fail("huggingface_hub is not installed in the instance's python3 (pip install huggingface_hub)")
    try:  # the client writes what it receives in chunks of this size: 1 MB, so that progress (and a stall) shows
        import huggingface_hub.constants as hc
        hc.DOWNLOAD_CHUNK_SIZE = min(int(getattr(hc, "DOWNLOAD_CHUNK_SIZE", 1 << 20)), 1 << 20)
    except Exception:
        pass
    def tree_bytes():  # what the folder holds, the client's partial files (.cache/huggingface/download) included
        total = 0
        for a, _, fs in os.walk(dest):
            for f in fs:
                try:
                    total += os.lstat(os.path.join(a, f)).st_size
                except OSError:
                    pass
        return total
    def grow():  # progress: the folder's growth, read every second (longer when the walk itself takes long)
        base = tree_bytes()
        while True:
            t0 = time.time()
            n = tree_bytes() - base
            if n > state["n"]:
                state["n"], state["last"] = n, time.time()
            time.sleep(max(1.0, 5 * (time.time() - t0)))
    threading.Thread(target=grow, daemon=True).start()
    threading.Thread(target=beat, daemon=True).start()
    try:
        snapshot_download(repo_id=p["repo_id"], repo_type=p["repo_type"], revision=p["revision"], local_dir=dest)
    except Exception as e:
        fail("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
    n = sum(os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(dest)
            if "/.cache" not in a + "/" for f in fs)
    done(bytes=n)
fail("unknown kind %r" % p["kind"])
'''
