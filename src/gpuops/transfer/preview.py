"""What a sync would send, judged on this machine before anything is uploaded (issue #28). Pure: reads the local
project only, never the network.

  Matcher(rules).excluded(rel)   the rule that leaves a path out (rsync's first-match order), or None
  scan(root, rules)              the bytes and files that would go, the biggest top-level folders, links pointing out
  size_warning(...)              the preview said before a large upload (LARGE_BYTES, or far more than the code)
  silent_exclusions(...)         files a script names that the exclusions leave out
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .plan import FETCHED_FILE, ORIGIN_CLI, ORIGIN_FETCHED, ORIGIN_IGNORE, ORIGIN_PROFILE, human_bytes

LARGE_BYTES = 500 * 1000 * 1000  # an upload above this is previewed (and asked at a terminal)
FAR_MORE = 50  # ... or one whose non-code bytes are this many times the code's, above DATA_FLOOR
DATA_FLOOR = 100 * 1000 * 1000
CODE_SUFFIXES = (".py", ".sh", ".bash", ".ipynb", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".json", ".txt", ".md",
                 ".rst", ".lock", ".in", ".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".rs", ".go", ".js", ".ts")
TOP_SHOWN = 5

def _pattern_re(body: str) -> re.Pattern:
    """An rsync wildcard pattern as a regular expression: `*` and `?` stop at '/', `**` crosses it."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if body.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = body.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                out.append("[" + body[i + 1:j].replace("!", "^", 1) + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass
class _Rule:
    sign: str
    text: str
    origin: str
    regex: re.Pattern
    anchored: bool
    dir_only: bool
    name_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return bool(self.regex.match(rel))
        if self.name_only:
            return bool(self.regex.match(rel.rsplit("/", 1)[-1]))
        parts = rel.split("/")  # a pattern with a '/' matches the end of the path
        return any(self.regex.match("/".join(parts[i:])) for i in range(len(parts)))


class Matcher:
    """rsync's judgement of the sync's rules on a local path (relative, '/'-separated): the first matching rule wins,
    and a path under an excluded folder is excluded with it. Merge rules (`:- .gitignore`) are not read here."""

    def __init__(self, rules: Iterable[tuple[str, str]]):
        self.rules: list[_Rule] = []
        for text, origin in rules:
            if len(text) < 3 or text[0] not in "+-" or text[1] != " ":
                continue
            pat = text[2:]
            anchored, dir_only = pat.startswith("/"), pat.endswith("/")
            body = pat.strip("/")
            if not body:
                continue
            self.rules.append(_Rule(text[0], pat, origin, _pattern_re(body), anchored, dir_only,
                                    "/" not in body and "**" not in body))
        # without include rules, whether any rule matches decides: one regular expression per kind of rule (a walk
        # of a large project asks it for every file), the ordered list only to name the rule that matched
        self._fast = all(r.sign == "-" for r in self.rules)
        self._groups = {}
        for key in ((True, False), (True, True), (False, False), (False, True)):  # (name only, folders only)
            pats = [r.regex.pattern for r in self.rules if not r.anchored and r.name_only == key[0] and
                    r.dir_only == key[1]] if key[0] else []
            anch = [r.regex.pattern for r in self.rules if r.anchored and r.dir_only == key[1]] if not key[0] else []
            both = pats or anch
            self._groups[key] = re.compile("|".join(f"(?:{x})" for x in both)) if both else None
        self._paths = [r for r in self.rules if not r.anchored and not r.name_only]

    def _any(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        g = self._groups
        return bool((g[(True, False)] and g[(True, False)].match(name)) or
                    (is_dir and g[(True, True)] and g[(True, True)].match(name)) or
                    (g[(False, False)] and g[(False, False)].match(rel)) or
                    (is_dir and g[(False, True)] and g[(False, True)].match(rel)) or
                    any(r.matches(rel, is_dir) for r in self._paths))

    def rule_for(self, rel: str, is_dir: bool) -> Optional[_Rule]:
        """The rule deciding this path itself (its folders not considered): an exclude, an include, or None."""
        if self._fast and not self._any(rel, is_dir):
            return None
        for r in self.rules:
            if r.matches(rel, is_dir):
                return r
        return None

    def excluded(self, rel: str, is_dir: bool = False) -> Optional[tuple[str, str]]:
        """(pattern, origin) of the rule that leaves rel out (rel itself or one of its folders); None: it is sent."""
        parts = rel.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            r = self.rule_for("/".join(parts[:i]), is_dir or i < len(parts))
            if r is not None and r.sign == "-":
                return r.text, r.origin
        return None


@dataclass
class Scan:
    total: int = 0  # bytes that would be sent (a first sync)
    files: int = 0
    code: int = 0  # bytes of code and configuration files among them
    top: dict[str, int] = field(default_factory=dict)  # top-level entry ("data/", "train.py") -> bytes
    outside_links: list[tuple[str, str]] = field(default_factory=list)  # (link, its target) pointing outside

    @property
    def large(self) -> bool:
        return is_large(self.total, self.code)

    def biggest(self, n: int = TOP_SHOWN) -> list[tuple[str, int]]:
        return sorted(self.top.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def is_large(total: int, code: int) -> bool:
    """The rule (docs/sync.md): above 500 MB, or above 100 MB and more than 50 times the code's bytes."""
    return total > LARGE_BYTES or (total > DATA_FLOOR and total > FAR_MORE * max(code, 1))


def _outside(root: Path, link) -> Optional[str]:
    """The target of a symlink that points outside root (absolute, or climbing out of it), else None."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    real_root = os.path.normpath(str(root))
    if resolved == real_root or resolved.startswith(real_root.rstrip("/") + "/"):
        return None
    return target


def scan(root: Path, rules: Iterable[tuple[str, str]]) -> Scan:
    """One walk of the local project under the sync's rules: what a first sync sends (sizes of regular files as
    rsync -a sends them, symlinks as links) and the symlinks whose target is outside the project."""
    root = Path(root)
    m = Matcher(rules)
    s = Scan()

    def sent(rel: str, is_dir: bool) -> bool:
        r = m.rule_for(rel, is_dir)
        return r is None or r.sign != "-"

    def outside(rel: str, full: str) -> None:
        target = _outside(root, full)
        if target is not None:
            s.outside_links.append((rel, target))

    for cur, dnames, fnames in os.walk(root):
        rel_dir = os.path.relpath(cur, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        keep = []
        for d in dnames:
            if not sent(prefix + d, True):
                continue
            if os.path.islink(os.path.join(cur, d)):  # os.walk does not follow it; rsync -a sends it as a link
                outside(prefix + d, os.path.join(cur, d))
            else:
                keep.append(d)
        dnames[:] = keep
        for f in fnames:
            rel, full = prefix + f, os.path.join(cur, f)
            if not sent(rel, False):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                outside(rel, full)
                continue
            s.total += st.st_size
            s.files += 1
            if f.endswith(CODE_SUFFIXES):
                s.code += st.st_size
            top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
            s.top[top] = s.top.get(top, 0) + st.st_size
    return s


def size_warning(total: int, files: int, biggest: Sequence[tuple[str, int]], *, where: str = "") -> str:
    """The preview: what would go and the biggest folders."""
    big = ", ".join(f"{name} {human_bytes(n)}" for name, n in biggest)
    return (f"this sync uploads {human_bytes(total)} ({files} files){' to ' + where if where else ''}; the biggest: "
            f"{big}")


SIZE_HINT = ("leave large folders out with .gpuopsignore (one pattern a line, e.g. data/) or --exclude, or keep data "
             "on the instance's disk or a filesystem; docs/sync.md")
RUN_SIZE_HINT = ("leave large folders out with .gpuopsignore (one pattern a line, e.g. data/), or give data with "
                 "--data (on the instance's disk, or once on a filesystem with --fs); docs/sync.md")
# how to change a setting of the sync: `gpuops sync` (and train) read the profile; `gpuops run` has no sync options
# and its profile takes its sync: settings from the one given with --from
LINKS_HOW = "gpuops sync --copy-links, or sync: copy_links: true in the profile"
RUN_LINKS_HOW = "sync: copy_links: true in a profile given with --from (gpuops run --from PROFILE)"


def top_of_changes(changes: Iterable) -> tuple[int, int, dict[str, int]]:
    """(bytes, files, bytes per top-level entry) of the files a dry run would send (transfer.plan.Change)."""
    total, files, top = 0, 0, {}
    for c in changes:
        if c.kind != "file" or c.change == "deleted" or c.size is None:
            continue
        total += c.size
        files += 1
        key = c.path.split("/", 1)[0] + ("/" if "/" in c.path else "")
        top[key] = top.get(key, 0) + c.size
    return total, files, top


def links_warning(links: Sequence[tuple[str, str]], *, copying: bool, how: str = LINKS_HOW) -> str:
    """The symlinks pointing outside the project: what arrives on the host (how: how to send their targets)."""
    shown = ", ".join(f"{rel} -> {target}" for rel, target in links[:5]) + (" ..." if len(links) > 5 else "")
    if copying:
        return f"{len(links)} symlink(s) point outside the project; their targets are copied (--copy-links): {shown}"
    return (f"{len(links)} symlink(s) point outside the project and would arrive on the host as links to paths that "
            f"do not exist there: {shown}; to send what they point to: {how}")


# -- files a script names ---------------------------------------------------------------------------------------------
_STRING = re.compile(r"""(?:"([^"\n]{1,300})"|'([^'\n]{1,300})')""")
_SH_WORD = re.compile(r"""(?:^|[\s=])((?:\./)?[A-Za-z0-9_.\-][A-Za-z0-9_.\-/]*/[A-Za-z0-9_.\-/]+)""")


def named_paths(text: str, *, shell: bool) -> list[str]:
    """Relative paths a script names: quoted strings (and, in a shell script, bare words) holding a '/', not a URL,
    not absolute, not under ~. In the order first named."""
    found: list[str] = []
    cands = [a or b for a, b in _STRING.findall(text)]
    if shell:
        cands += _SH_WORD.findall(text)
    for c in cands:
        c = c.strip()
        if "/" not in c or "://" in c or c.startswith(("/", "~", "$", "-")) or any(ch in c for ch in " {}$*?"):
            continue
        c = c[2:] if c.startswith("./") else c
        if c and c not in found:
            found.append(c)
    return found


# A line that writes the path it names (the job makes that file: it needs nothing sent). Python: open(...) in a
# write mode, the usual savers; shell: a redirection, tee, -o/--output.
_PY_WRITE = re.compile(r"""open\([^#]*?(?:mode\s*=\s*)?['"][rb]?[wax]\+?b?['"]|"""
                       r"""\b(?:save|save_pretrained|save_file|save_model|save_checkpoint|write_text|write_bytes|"""
                       r"""savefig|to_csv|to_parquet|to_json|to_pickle|dump|savez|savez_compressed|"""
                       r"""makedirs|mkdir)\s*\(""")
_SH_WRITE = r"""(?:>>?|\btee(?:\s+-a)?|(?:^|\s)(?:-o|--output(?:=|\s+)|--out(?:=|\s+)))\s*['"]?(?:\./)?"""


def writes_only(text: str, rel: str, *, shell: bool) -> bool:
    """Does the script name `rel` only where it writes it (every line naming it is a write)? Then the job makes the
    file and the sync leaving a local copy out is right (issue #36: the docs' rehearsal, trained again after `gpuops
    fetch` brought checkpoints/step_1/model.bin back)."""
    names = re.compile(r"(?<![\w./-])(?:\./)?" + re.escape(rel) + r"(?![\w./-])")
    lines = [ln for ln in text.splitlines() if names.search(ln)]
    if not lines:
        return False
    if shell:
        return all(re.search(_SH_WRITE + re.escape(rel), ln) for ln in lines)
    return all(_PY_WRITE.search(ln) for ln in lines)


def silent_exclusions(project: Path, script_rel: str, rules: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(path, pattern, origin) of each local file the script names that the sync's rules leave out: the job would
    not find it on the host. Files only (a folder the job writes into, like checkpoints/, is rightly left out), and
    never one the script only writes (writes_only)."""
    project = Path(project)
    script = project / script_rel
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    m = Matcher(rules)
    out = []
    shell = not script_rel.endswith(".py")
    for rel in named_paths(text, shell=shell):
        if writes_only(text, rel, shell=shell):
            continue
        for base in (project, script.parent):  # relative to the project (the job's folder) or to the script
            p = base / rel
            if p.is_file():
                relp = os.path.relpath(p, project).replace(os.sep, "/")
                if relp.startswith("../"):
                    continue
                hit = m.excluded(relp)
                if hit:
                    out.append((relp, hit[0], hit[1]))
                break
    return out


def exclusion_warning(script_rel: str, path: str, pattern: str, origin: str, *, run: bool = False) -> str:
    """What is said before the launch for one file a script names that the sync leaves out, with how to send it
    (run: said by `gpuops run`, whose profile takes its sync: settings from --from)."""
    if origin == ORIGIN_PROFILE:
        where = "a profile given with --from (gpuops run --from PROFILE)" if run else "the profile"
        how = (f"set sync: exclude: in {where} to a list without '{pattern}' (the default list is in "
               "docs/sync.md), or move the file to a folder that is sent")
    elif origin == ORIGIN_IGNORE:
        how = (f"remove '{pattern}' from .gpuopsignore (a file inside a folder it leaves out cannot be "
               "brought back with a ! line)")
    elif origin == ORIGIN_CLI:
        how = f"drop --exclude {pattern}"
    elif origin == ORIGIN_FETCHED:
        how = (f"copy the file to a folder that is sent (gpuops fetch wrote it here, and a folder fetch writes into "
               f"is never sent back, so a sync cannot overwrite the job's newer files; {FETCHED_FILE} lists them)")
    else:
        how = "move the file to a folder that is sent (gpuops never sends its own folders)"
    return (f"{script_rel} names {path}, which sync leaves out (rule '{pattern}' of {origin}): the job will not "
            f"find it on the host; to send it: {how}")
