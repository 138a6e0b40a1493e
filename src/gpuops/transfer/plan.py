"""Pure helpers for `gpuops sync` and `gpuops fetch`: rsync arguments, filter rules, output parsing,
checkpoint selection and fetch verification. Nothing here touches the network or starts a process.

The talking side lives in transfer/rsync.py (runs rsync) and transfer/sync.py and transfer/fetch.py (the command flows).
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Iterable, Sequence

IGNORE_FILE = ".gpuopsignore"
STAGING_DIR = ".gpuops-partial"  # fetch: files land here, are verified, then moved into place
# Never sent, never deleted: gpuops' own files. Run records (remote <remote_dir>/.gpuops/runs, local ./runs/<id>);
# .env files, whose secrets reach a job only through `gpuops train`'s 0600 file, never as plain files in the remote
# project; the project's profiles (./profiles/*.yaml: hosts, key paths, values typed into env:); verify's reports
# (./logs/env_checks/).
ALWAYS_EXCLUDED = ("/.gpuops/", "/runs/", ".env", "/profiles/*.yaml", "/profiles/*.yml", "/logs/env_checks/")
FETCHED_FILE = "runs/fetched.json"  # the project folders `gpuops fetch` wrote into: never uploaded again by a sync
PARTIAL_DIR = ".gpuops-rsync-partial"  # rsync --partial-dir (relative: rsync also protects it from --delete)
OUT_PREFIX = "::gpuops:: "
OUT_FORMAT = OUT_PREFIX + "%i %l %n"
RSYNC_TIMEOUT_S = 60
RETRY_EXIT_CODES = frozenset({10, 12, 30, 35, 255})
from .ckptjudge import STEP_RE, step_dirs, step_of  # noqa: F401 (step folders: the judge's reading)

# rsync must be installed on both ends. Cloud GPU images are Debian/Ubuntu, so the remote command is apt-get's.
REMOTE_INSTALL = "sudo apt-get install -y rsync"
INSTALL_COMMANDS = (  # (package manager, the command that installs rsync with it), in order of preference
    ("apt-get", "sudo apt-get install -y rsync"), ("dnf", "sudo dnf install -y rsync"),
    ("yum", "sudo yum install -y rsync"), ("zypper", "sudo zypper install -y rsync"),
    ("pacman", "sudo pacman -S --noconfirm rsync"), ("apk", "sudo apk add rsync"), ("brew", "brew install rsync"),
)


def install_command(platform: str, managers: Iterable[str]) -> str:
    """The command that installs rsync on this machine: platform is sys.platform, managers the package managers found
    on it (apt-get, dnf, ...). macOS: Homebrew's rsync, named even when brew is missing; an unknown system gets the
    Debian/Ubuntu command."""
    if platform == "darwin":
        return "brew install rsync"
    have = set(managers)
    return next((cmd for name, cmd in INSTALL_COMMANDS if name in have), REMOTE_INSTALL)


MIN_RSYNC = (3, 1, 0)  # --info=progress2 and --partial-dir semantics gpuops relies on


def parse_rsync_version(text: str) -> tuple[int, ...] | None:
    """(3, 2, 7) from `rsync --version` ("rsync  version 3.2.7  protocol version 31"); None for openrsync and
    other implementations that do not print an rsync version."""
    m = re.search(r"^rsync\s+version\s+v?(\d+)\.(\d+)(?:\.(\d+))?", text, re.MULTILINE)
    return tuple(int(x or 0) for x in m.groups()) if m else None


# -- filters -----------------------------------------------------------------------------
class IgnoreFileError(ValueError):
    """A .gpuopsignore line that cannot be expressed as an rsync filter rule."""


def gitignore_to_rsync(line: str) -> list[str]:
    """Translate one gitignore-style line into rsync filter rules ("- pat" / "+ pat"); [] for blanks/comments.

    gitignore and rsync agree on: `*`, `?`, `[...]`, `**`, a trailing `/` (directories only), a leading `/`
    (anchored at the project root) and a name without `/` matching at any depth. They differ on a `/` in the
    middle (gitignore anchors it; rsync would match it at any depth), so such patterns are anchored here.
    `!pattern` becomes an include rule; the caller reverses the order because gitignore's last match wins and
    rsync's first match wins.
    """
    text = line.rstrip("\n").rstrip("\r")
    # trailing spaces are ignored unless escaped
    while text.endswith(" ") and not text.endswith("\\ "):
        text = text[:-1]
    if not text or text.startswith("#"):
        return []
    sign = "-"
    if text.startswith("!"):
        sign, text = "+", text[1:]
    elif text.startswith("\\!") or text.startswith("\\#"):
        text = text[1:]
    if not text or text in ("/",):
        raise IgnoreFileError(f"empty pattern in {line!r}")
    if "\n" in text or text.startswith((" ", "\t")) and not text.strip():
        raise IgnoreFileError(f"unusable pattern {line!r}")
    dir_only = text.endswith("/")
    body = text.rstrip("/")
    anchored = body.startswith("/")
    body = body.lstrip("/")
    if body.startswith("**/"):
        body = body[3:]
        anchored = False
    elif "/" in body:
        anchored = True
    suffix = "/" if dir_only else ""
    pats = [("/" if anchored else "") + body + suffix]
    if "/**/" in body:  # gitignore's a/**/b also matches a/b; rsync's ** needs at least the separators
        pats.append(("/" if anchored else "") + body.replace("/**/", "/", 1) + suffix)
    return [f"{sign} {p}" for p in pats]


def read_ignore_file(path: Path) -> list[str]:
    """rsync rules from a .gpuopsignore (root of the project), in rsync's first-match order."""
    if not path.is_file():
        return []
    rules: list[list[str]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            r = gitignore_to_rsync(line)
        except IgnoreFileError as exc:
            raise IgnoreFileError(f"{path.name} line {n}: {exc}") from None
        if r:
            rules.append(r)
    return [rule for group in reversed(rules) for rule in group]


ORIGIN_OWN = "gpuops' own exclusions (never sent)"
ORIGIN_CLI = "--exclude"
ORIGIN_PROFILE = "the profile's sync.exclude"
ORIGIN_IGNORE = ".gpuopsignore"
ORIGIN_FETCHED = "a folder gpuops fetch wrote into (runs/fetched.json)"


def labelled_rules(profile_excludes: Sequence[str], cli_excludes: Sequence[str] = (),
                   ignore_rules: Sequence[str] = (), gitignore: bool = False,
                   fetched: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The ordered rsync filter rules of a sync (first match wins), each with its origin: gpuops' own folders and the
    folders `gpuops fetch` wrote into, then --exclude, then the profile's sync.exclude, then .gpuopsignore, then
    `.gitignore` files (with --gitignore)."""
    rules = [(f"- /{STAGING_DIR}/", ORIGIN_OWN), (f"- {STAGING_DIR}/", ORIGIN_OWN)]
    rules += [(f"- {p}", ORIGIN_OWN) for p in ALWAYS_EXCLUDED]
    rules += [(r, ORIGIN_FETCHED) for r in fetched_rules(fetched)]
    rules += [(f"- {p}", ORIGIN_CLI) for p in cli_excludes if p.strip()]
    rules += [(f"- {p}", ORIGIN_PROFILE) for p in profile_excludes if p.strip()]
    rules += [(r, ORIGIN_IGNORE) for r in ignore_rules]
    if gitignore:
        rules.append((":- .gitignore", ".gitignore files (--gitignore)"))
    return rules


def sync_filter_rules(profile_excludes: Sequence[str], cli_excludes: Sequence[str] = (),
                      ignore_rules: Sequence[str] = (), gitignore: bool = False,
                      fetched: Sequence[str] = ()) -> list[str]:
    """Ordered rsync filter rules for sync (labelled_rules without their origins). First match wins, so the order is
    the priority: 1. gpuops' own folders: staging, the remote run records (/.gpuops/) and the local run registry
    (/runs/), which a sync never sends and --delete never touches, and the folders `gpuops fetch` wrote into
    (FETCHED_FILE), 2. --exclude, 3. the profile's sync.exclude (so a `!` line in .gpuopsignore can never re-include,
    nor expose to --delete, a folder the profile protects), 4. .gpuopsignore, 5. `.gitignore` files at every depth
    (only with --gitignore)."""
    return [r for r, _ in labelled_rules(profile_excludes, cli_excludes, ignore_rules, gitignore, fetched)]


def fetched_rel(dest: Path, project_dir: Path) -> str | None:
    """A fetch destination as the project-relative folder a sync must leave out, or None when it lies outside the
    project (nothing to leave out) or is the project itself (never left out: the sync would send nothing)."""
    try:
        rel = Path(dest).resolve().relative_to(Path(project_dir).resolve())
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def fetched_rules(rels: Iterable[str]) -> list[str]:
    """rsync rules that keep fetched folders out of a sync (anchored: `backups` here, not every folder so named)."""
    return [f"- /{r.strip('/')}/" for r in rels if r and r.strip("/")]


def simple_excluded_names(patterns: Iterable[str]) -> tuple[list[str], list[str]]:
    """(patterns for any entry, patterns for directories only) among name-only patterns: a safe subset of what
    rsync excludes, used to estimate the upload size without running rsync."""
    anyk, dirs = [], []
    for p in patterns:
        p = p.strip()
        if not p or p.startswith(("+", "!", ":")):
            continue
        if p.startswith("- "):
            p = p[2:]
        if p.endswith("/"):
            if "/" not in p[:-1]:
                dirs.append(p[:-1])
        elif "/" not in p:
            anyk.append(p)
    return anyk, dirs


def estimate_upload_bytes(root: Path, patterns: Iterable[str]) -> int:
    """An upper bound of the bytes a sync sends: every file not under a name-only excluded pattern."""
    anyk, dirs = simple_excluded_names(patterns)
    # one regular expression per kind (fnmatch's own translation) instead of a match per pattern and name
    never = re.compile(r"(?!)")
    files = re.compile("|".join(map(fnmatch.translate, anyk))) if anyk else never
    folders = re.compile("|".join(map(fnmatch.translate, anyk + dirs))) if anyk or dirs else never

    total = 0
    for cur, dnames, fnames in os.walk(root):
        dnames[:] = [d for d in dnames if not folders.match(d)]
        for f in fnames:
            if files.match(f):
                continue
            try:
                st = os.lstat(os.path.join(cur, f))
            except OSError:
                continue
            total += st.st_size
    return total


# -- remote paths -------------------------------------------------------------------------------
def rsync_remote_path(path: str) -> str:
    """A remote path as rsync's `host:PATH` wants it: `~/x` becomes `x` (relative to the login directory). rsync
    (3.2.4+) quotes the rest for the remote shell but a leading ~ and the wildcards * ? [ (and a backslash), which
    the remote shell would expand: those are escaped here, so rsync reaches the very folder every other gpuops step
    (quoted with shlex) and the --delete guard checked, never `~name`'s home or a wildcard's match."""
    if path in ("~", "~/"):
        return "."
    if path.startswith("~/"):
        path = path[2:] or "."
    path = re.sub(r"([\\*?\[])", r"\\\1", path)
    return "\\" + path if path.startswith("~") else path


def join_remote(base: str, sub: str) -> str:
    """sub under base, unless sub is absolute or starts with ~."""
    if sub.startswith(("/", "~")):
        return sub
    return base.rstrip("/") + "/" + sub.strip("/") if sub.strip("/") else base


def host_spec(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def remote_arg(host: str, path: str, *, contents: bool = True) -> str:
    p = rsync_remote_path(path).rstrip("/") or "/"
    if contents and not p.endswith("/"):
        p += "/"
    return f"{host_spec(host)}:{p}"


# -- argv ------------------------------------------------------------------------------------
def base_args(ssh_argv: Sequence[str], *, dry_run: bool = False) -> list[str]:
    args = [
        "rsync", "-a",
        # the remote path never passes through the host's shell (rsync < 3.2.4 and RSYNC_OLD_ARGS=1 let it)
        "--protect-args",
        f"--partial-dir={PARTIAL_DIR}",
        "--info=progress2", "--stats", "--no-inc-recursive",
        f"--out-format={OUT_FORMAT}",
        f"--timeout={RSYNC_TIMEOUT_S}",
        "-e", shlex.join(ssh_argv),
    ]
    if dry_run:
        args.append("--dry-run")
    return args


def sync_args(ssh_argv: Sequence[str], local_dir: Path, host: str, remote_dir: str, rules: Sequence[str], *,
              delete: bool = False, dry_run: bool = False, gitignore: bool = False,
              rsync_path: str | None = None, copy_links: bool = False) -> list[str]:
    """rsync argv for sync. Never --delete-excluded: excluded remote paths are never touched. rsync_path: what the
    remote side runs instead of `rsync` (sync_guard). copy_links: a symlink pointing outside the project is sent
    as what it points to (--copy-unsafe-links); links inside it stay links."""
    args = base_args(ssh_argv, dry_run=dry_run)
    if rsync_path:
        args.append(f"--rsync-path={rsync_path}")
    if copy_links:
        args.append("--copy-unsafe-links")
    if delete:
        # with --gitignore the new .gitignore files must arrive before their rules protect the delete phase
        args.append("--delete-after" if gitignore else "--delete")
    args += [f"--filter={r}" for r in rules]
    args += [str(local_dir).rstrip("/") + "/", remote_arg(host, remote_dir)]
    return args


def fetch_args(ssh_argv: Sequence[str], host: str, remote_base: str, staging: Path, *, dest: Path,
               files_from: Path | None = None, single_file: bool = False, checksum: bool = False) -> list[str]:
    """rsync argv for fetch: no exclusions at all; into the staging dir, reusing what dest already holds.
    single_file: remote_base is one file, copied as staging/<its name>; a symlink (`final.pt -> global_step_9/...`)
    is copied as the file it points to, which is what the remote hashes. In a folder, symlinks are copied as
    symlinks, and those pointing outside it are skipped (--safe-links), never followed. checksum: compare contents,
    not size and time (after a verification failure)."""
    args = base_args(ssh_argv)
    args.append(f"--link-dest={dest.resolve()}")
    if checksum:
        args.append("--checksum")
    if not single_file:
        args.append("--safe-links")
    if files_from is not None:
        args += ["-r", f"--files-from={files_from}"]
    if single_file:
        args.append("--copy-links")
    args += [remote_arg(host, remote_base, contents=not single_file), str(staging).rstrip("/") + "/"]
    return args


GUARD_MARK = "@@gpuops-guard"


def sync_guard(quoted_dir: str, *, need: int) -> str:
    """rsync's --rsync-path for a sync whose checks run on the remote side of rsync, in rsync's own session (no
    remote execution of their own): rsync must be there (else exit 127, rsync's "remote command not found"); the
    folder (quoted_dir: already quoted for sh) is created; its disk must have room for `need` bytes (an upper bound
    made here). When the folder cannot be made or the room is short, a line `@@gpuops-guard mkdir|room [free KiB]`
    on stderr and rsync never starts (guard_stop reads it). Then `exec rsync` with rsync's own arguments."""
    need_kib = -(-max(0, need) // 1024)
    # a re-sync's folder exists (no mkdir), and df's header is cut by the shell (no tail): the only process the
    # checks start is df (issue 42: the guard cost a no-change re-sync two more)
    script = (f'command -v rsync >/dev/null 2>&1 || exit 127; d={quoted_dir}; '
              f'[ -d "$d" ] || mkdir -p -- "$d" || {{ echo "{GUARD_MARK} mkdir" >&2; exit 1; }}; '
              'a=$(df -Pk -- "$d" 2>/dev/null); a=${a#*"\n"}; f() { a=$4; }; f $a; '
              f'case "$a" in ""|*[!0-9]*) ;; *) [ "$a" -ge {need_kib} ] || '
              f'{{ echo "{GUARD_MARK} room $a" >&2; exit 1; }};; esac; '
              'exec rsync "$@"')
    return f"sh -c {shlex.quote(script)} gpuops-sync-guard"


def guard_stop(stderr: str) -> tuple[str, str, str] | None:
    """(what stopped it: mkdir | room, the value it gave, what the host said before) when sync_guard stopped rsync
    before it started; else None."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(GUARD_MARK + " "):
            kind, _, value = line[len(GUARD_MARK) + 1:].strip().partition(" ")
            return kind, value.strip(), "\n".join(ln.strip() for ln in lines[:i] if ln.strip())
    return None


# -- output parsing ---------------------------------------------------------------------------------
_PROGRESS = re.compile(r"^\s*([\d,.]+)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d\d:\d\d)")


@dataclass
class Progress:
    bytes: int
    percent: int
    rate: str
    eta: str

    @property
    def total_estimate(self) -> int | None:
        if self.percent <= 0:
            return None
        return int(self.bytes * 100 / self.percent)


def parse_progress(line: str) -> Progress | None:
    m = _PROGRESS.match(line)
    if not m:
        return None
    try:
        n = int(m.group(1).replace(",", "").replace(".", ""))
    except ValueError:
        return None
    return Progress(n, int(m.group(2)), m.group(3), m.group(4))


def parse_rate(rate: str) -> float:
    """'12.34MB/s' -> bytes per second."""
    m = re.match(r"([\d.,]+)([kMGT]?)B/s", rate)
    if not m:
        return 0.0
    mult = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
    return float(m.group(1).replace(",", "")) * mult


@dataclass
class Change:
    change: str  # new, updated, deleted, link
    kind: str  # file, dir, symlink, other
    path: str
    size: int | None = None

    def as_dict(self) -> dict:
        return {"change": self.change, "kind": self.kind, "path": self.path, "size": self.size}


_KIND = {"f": "file", "d": "dir", "L": "symlink", "D": "device", "S": "special"}


def parse_item(line: str) -> Change | None:
    """One `--out-format='::gpuops:: %i %l %n'` line -> a Change; None for attribute-only updates."""
    if not line.startswith(OUT_PREFIX):
        return None
    rest = line[len(OUT_PREFIX):]
    if rest.startswith("*deleting"):
        parts = rest.split(None, 2)
        path = parts[2] if len(parts) > 2 else parts[-1]
        path = path.rstrip("/")
        return Change("deleted", "dir" if rest.rstrip().endswith("/") else "file", path)
    try:
        item, size, path = rest.split(" ", 2)
    except ValueError:
        return None
    if len(item) < 2:
        return None
    y, x = item[0], item[1]
    kind = _KIND.get(x, "other")
    path = path.rstrip("/")
    if path in (".", ""):
        return None
    flags = item[2:]
    if y == "." or (y == "c" and kind == "dir" and not flags.startswith("+")):
        return None  # attributes only
    if y == "h":
        change = "link"
    elif flags and set(flags) == {"+"}:
        change = "new"
    else:
        change = "updated"
    try:
        n = int(size)
    except ValueError:
        n = None
    return Change(change, kind, path, n if kind == "file" else None)


_STATS = {
    "Number of files": "entries",
    "Number of regular files transferred": "files_transferred",
    "Number of deleted files": "deleted",
    "Total file size": "total_bytes",
    "Total transferred file size": "transferred_bytes",
    "Literal data": "literal_bytes",
    "Matched data": "matched_bytes",
    "Total bytes sent": "bytes_sent",
    "Total bytes received": "bytes_received",
}


def parse_stats(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if not sep or key.strip() not in _STATS:
            continue
        m = re.match(r"\s*([\d,.]+)", val)
        if m:
            found[_STATS[key.strip()]] = int(m.group(1).replace(",", "").replace(".", ""))
    return found


# -- errors ------------------------------------------------------------------------------------------
def classify_failure(rc: int, stderr: str) -> str:
    """hostkey, auth, missing-remote, transient, or failed."""
    low = stderr.lower()
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return "hostkey"
    if "permission denied (publickey" in low or "too many authentication failures" in low:
        return "auth"
    if ("rsync: command not found" in low or "rsync: not found" in low or
            re.search(r"sh: \d*:? ?rsync: not found", low) or rc == 127):
        return "missing-remote"
    if rc in RETRY_EXIT_CODES or "connection reset" in low or "broken pipe" in low:
        return "transient"
    return "failed"


def last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith(OUT_PREFIX)]
    for ln in lines:
        if ln.startswith("rsync:") or ln.startswith("rsync error") or "ssh:" in ln:
            return ln
    return lines[-1] if lines else ""


# -- checkpoints ------------------------------------------------------------------------------------
def select_steps(steps: dict[str, dict], *, latest: bool = False, step: int | None = None) -> list[str]:
    """The step directories to fetch: the newest by number (ties: the most recently written), or step N (every
    directory with that number). Raises LookupError with a readable message when nothing matches."""
    if not steps:
        raise LookupError("no global_step_N or checkpoint-N directories found")
    if step is not None:
        hit = sorted(k for k, v in steps.items() if v["step"] == step)
        if not hit:
            have = sorted({v["step"] for v in steps.values()})
            raise LookupError(f"no step {step}; steps available: {', '.join(map(str, have))}")
        return hit
    if latest:
        partial = partial_newest(steps)
        return [partial["instead"] if partial else _by_age(steps)[-1]]
    return sorted(steps)


def _by_age(steps: dict[str, dict]) -> list[str]:
    return [k for k, _ in sorted(steps.items(), key=lambda kv: (kv[1]["step"], kv[1]["mtime"], kv[0]))]


def partial_newest(steps: dict[str, dict]) -> Optional[dict]:
    """The newest step folder lacks a file the one before it has (model.safetensors written, optimizer.pt and
    trainer_state.json not yet): it is still being written, or was cut short. {newest, missing, instead}: the folder
    to take instead, the newest step below it; None when the newest looks complete (or has no step before it)."""
    order = _by_age(steps)
    top = order[-1]
    kin = [k for k in order if _family(k) == _family(top) and steps[k]["step"] < steps[top]["step"]]
    if not kin:  # the first checkpoint of its folder: nothing to compare it with
        return None
    before = kin[-1]
    missing = sorted(set(steps[before].get("names") or ()) - set(steps[top].get("names") or ()))
    return {"newest": top, "missing": missing, "instead": before} if missing else None


def _family(key: str) -> tuple[str, str]:
    """A step folder's parent and kind (run/global_step_N, hf/checkpoint-N): only kin are compared."""
    parent, _, base = key.rpartition("/")
    return parent, re.sub(r"\d+$", "", base)


def under(rel: str, roots: Sequence[str]) -> bool:
    return any(rel == r or rel.startswith(r.rstrip("/") + "/") for r in roots)


# -- verification -------------------------------------------------------------------------------------
@dataclass
class Verification:
    ok: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # size or sha256 differs
    missing: list[str] = field(default_factory=list)  # on the remote, not here
    extra: list[str] = field(default_factory=list)  # here, not on the remote (vanished there)

    @property
    def passed(self) -> bool:
        return not (self.mismatched or self.missing)

    def problems(self) -> list[str]:
        return ([f"{p} (content differs)" for p in self.mismatched] + [f"{p} (missing)" for p in self.missing])


def compare(remote: dict[str, Sequence], local: dict[str, Sequence]) -> Verification:
    """remote/local: {relative path: (size, sha256)}."""
    v = Verification()
    for rel in sorted(remote):
        if rel not in local:
            v.missing.append(rel)
        elif int(local[rel][0]) != int(remote[rel][0]) or local[rel][1] != remote[rel][1]:
            v.mismatched.append(rel)
        else:
            v.ok.append(rel)
    v.extra = sorted(set(local) - set(remote))
    return v


def compare_links(remote: dict[str, str], local: dict[str, str]) -> tuple[list[str], list[str]]:
    """(verified, wrong or missing) symlinks: each remote link inside the fetched folder must be a local symlink with
    the same target."""
    ok, bad = [], []
    for rel, target in sorted(remote.items()):
        (ok if local.get(rel) == target else bad).append(rel)
    return ok, bad


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- the --delete guard (pure) -----------------------------------------------------------------------------------
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
               "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/var",
               "/usr/local", "/usr/bin", "/usr/lib", "/var/lib", "/var/log", "/lambda", "/lambda/nfs", "/data")


def _lexical(remote_dir: str, home: str) -> str:
    """remote_dir as the remote shell means it: ~ and $HOME are the home, a relative path is under the home (an SSH
    session starts there), `.`/`..` and repeated or trailing slashes folded."""
    import posixpath

    p = remote_dir.strip()
    for token in ("${HOME}", "$HOME"):
        if p == token or p.startswith(token + "/"):
            p = home + p[len(token):]
    if p == "~" or p.startswith("~/"):
        p = home + p[1:]
    if not p.startswith("/"):
        p = posixpath.join(home, p)
    return posixpath.normpath(p).replace("//", "/")


def unsafe_delete_target(remote_dir: str, *, home: str, real: str = "") -> str | None:
    """Why `sync --delete` must not target remote_dir, or None. Judged on both the path as written (normalised) and
    where it really is on the host (symlinks resolved): `/`, the remote home or one of its ancestors, or a system
    folder itself (/etc, /usr, /var, /tmp, /home, ...) is refused, however it is spelled."""
    # a leading ~name and wildcards are literal here: rsync_remote_path escapes them, so rsync reaches this very folder
    home = home.rstrip("/") or "/"
    for label, path in (("as written", _lexical(remote_dir, home)), ("on the host", real.rstrip("/") or ("/" if real
                                                                                                        else ""))):
        if not path:
            continue
        if path == "/":
            return f"it is the root folder / ({label})"
        if path == home:
            return f"it is your remote home folder {home} ({label}): --delete would remove everything in it that is " \
                   "not in your project, ~/.ssh/authorized_keys included"
        if home.startswith(path + "/"):
            return f"{path} holds your remote home folder ({label})"
        if path in SYSTEM_DIRS or (path.startswith("/lib") and "/" not in path[1:]):
            return f"{path} is a system folder ({label})"
    return None
