"""Which checkpoint of a listing counts (pure, stdlib only): the reading of step folders and the judgement of
pipeline/checkpoints.py's docstring ("Which count"), by the rules of playbooks/checkpoints.yaml passed in.

It imports nothing of gpuops on purpose: a Slurm cluster's requeued attempt runs this very file (slurm/resume.py
ships its text beside the run's batch script) to choose, on the shared folder, the checkpoint it resumes from while
no gpuops process may be looking. So here and there the same code decides.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Optional, Sequence

# step folders: global_step_N (verl), global_stepN (DeepSpeed's default tag), checkpoint-N (HF Trainer), iter_N (Megatron)
STEP_RE = re.compile(r"^(?:global_step_?|checkpoint-|iter_)(\d+)$")


def step_of(name: str) -> int | None:
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


def step_dirs(files: Iterable[Sequence]) -> dict[str, dict]:
    """{relative dir: {step, bytes, files, mtime, names}} for every global_step_N / checkpoint-N directory (any
    depth), from a listing of (relative path, size, mtime) rows; names: its files' paths inside it. Step dirs inside
    step dirs are not separate steps."""
    out: dict[str, dict] = {}
    for row in files:
        rel, size, mtime = row[0], int(row[1]), float(row[2]) if len(row) > 2 else 0.0
        parts = rel.split("/")[:-1]
        for i, part in enumerate(parts):
            n = step_of(part)
            if n is not None:
                key = "/".join(parts[: i + 1])
                d = out.setdefault(key, {"step": n, "bytes": 0, "files": 0, "mtime": 0.0, "names": set()})
                d["names"].add("/".join(rel.split("/")[i + 1:]))
                d["bytes"] += size
                d["files"] += 1
                d["mtime"] = max(d["mtime"], mtime)
                break
    return out


# -- which count: evidence (playbooks/checkpoints.yaml) -----------------------------------------------------------
@dataclass
class Seen:
    """What the listing's one remote execution saw beside the files (transfer.fetch's listing with evidence):
    `open`: paths (relative to the folder) held open for writing by the job's processes; `invalid`: {path: why} for
    files whose format says they are cut short; `contents`: {path: text} of the small marker files (latest, ...);
    `pids`: how many of the job's processes were found (0: none alive, or the job's id unknown)."""
    open: frozenset = frozenset()
    invalid: dict = None
    contents: dict = None
    pids: int = 0

    @classmethod
    def from_listing(cls, doc: Optional[dict]) -> "Seen":
        doc = doc or {}
        return cls(open=frozenset(doc.get("open") or ()), invalid=dict(doc.get("invalid") or {}),
                   contents=dict(doc.get("contents") or {}), pids=int(doc.get("pids") or 0))


@dataclass
class Verdict:
    """The checkpoint a replacement may resume from: `dir` (a step folder, or "" for the whole folder) or None, the
    evidence that vouched for it (`evidence`: ids such as "marker:deepspeed", "successor", "quiet"), and why each
    newer candidate was passed over."""
    dir: Optional[str]
    step: Optional[int] = None
    passed_over: list = None  # [(dir, reason)]
    evidence: list = None

    warnings: list = None  # a framework's marker beside the folders naming one that is not there (dangling)

    def reasons(self) -> str:
        return "; ".join(f"{d or 'the folder'}: {why}" for d, why in (self.passed_over or []))


def evidence_spec(run_id: Optional[str], rules: dict) -> dict:
    """What the listing's remote execution gathers beside the files (transfer.fetch's `evidence` spec): the job's
    processes (by GPUOPS_RUN_ID), the marker files to read, the suffixes whose validity to check."""
    read = sorted({f for m in rules.get("markers") or [] if m.get("names") for f in m.get("files") or []})
    validate = {sfx: v["check"] for v in rules.get("validity") or [] for sfx in v.get("suffixes") or []}
    return {"run_id": run_id, "read": read, "validate": validate}


def said(evidence: Optional[list], rules: Optional[dict] = None) -> str:
    """The evidence as the summary says it: "DeepSpeed's `latest`", "the job moved past it", ..."""
    titles = {f"marker:{m['id']}": m.get("title") or m["id"] for m in (rules or {}).get("markers") or []}
    words = {"successor": "the job moved past it", "succeeded": "the job succeeded",
             "predecessor": "every file of the step before it, none smaller, valid",
             "quiet": "held still while the job ran (timing only)"}
    return ", ".join(titles.get(e) or words.get(e) or e for e in (evidence or [])) or "-"


def dangling(steps: dict, seen: Seen, rules: dict) -> list:
    """A marker beside the step folders (DeepSpeed's `latest`, Megatron's tracker) that names a folder or step that
    is not there: the framework's own loader fails on it, whatever gpuops resumes from. One sentence each, with the
    fix (playbooks/checkpoints.yaml: dangling, dangling_fix; {newest} is the newest step folder there)."""
    out = []
    for m in rules.get("markers") or []:
        if m.get("where", "inside") == "inside" or not m.get("dangling"):
            continue
        for path, text in sorted((seen.contents or {}).items()):
            parent, _, base = path.rpartition("/")
            text = (text or "").strip()
            if base not in (m.get("files") or []) or not text:
                continue
            kin = {k: st for k, st in steps.items() if k.rpartition("/")[0] == parent}
            named = (text in {k.rpartition("/")[2] for k in kin} if m.get("names") == "folder" else
                     text.isdigit() and int(text) in {st["step"] for st in kin.values()})
            if named or not kin:
                continue
            newest = max(kin, key=lambda k: kin[k]["step"])
            fix = m.get("dangling_fix", "").format(newest=newest.rpartition("/")[2], newest_step=kin[newest]["step"],
                                                    parent=parent + "/" if parent else "")
            out.append(f"{path} names {text}, which is not there: {m['dangling']}" + (f"; fix: {fix}" if fix else ""))
    return out


def _temporary(names, rules: dict) -> Optional[str]:
    pats = [t["pattern"] for t in rules.get("temporary") or []]
    for n in sorted(names):
        for part in n.split("/"):
            if any(fnmatchcase(part, p) for p in pats):
                return n
    return None


def _ruled_out(prefix: str, names, seen: Seen, rules: dict, job: str) -> Optional[str]:
    """Why a folder cannot count whatever vouches for it: a temporary name, a file open for writing, a file cut
    short. names: its files, relative to it; prefix: the folder's path in the listing ("" for the whole folder)."""
    full = {(prefix + "/" + n) if prefix else n: n for n in names}
    tmp = _temporary(names, rules)
    if tmp:
        return f"{tmp} has a temporary name (still being written)"
    held = sorted(p for p in full if p in seen.open)
    if held and job == "alive":
        return f"{full[held[0]]} is open for writing by the job" + (f" (and {len(held) - 1} more)" if len(held) > 1
                                                                    else "")
    bad = sorted(p for p in full if p in (seen.invalid or {}))
    if bad:
        return f"{full[bad[0]]}: {seen.invalid[bad[0]]}"
    return None


def _markers(key: str, step: Optional[int], names, seen: Seen, rules: dict) -> list:
    """The markers that vouch for folder `key` ("" the whole folder): one inside it, or one beside it naming it."""
    parent, _, base = key.rpartition("/")
    top = {n for n in names if "/" not in n}
    found = []
    for m in rules.get("markers") or []:
        files = m.get("files") or []
        if m.get("where", "inside") == "inside":
            if top & set(files):
                found.append(f"marker:{m['id']}")
            continue
        if not key:
            continue
        for f in files:
            text = ((seen.contents or {}).get(f"{parent}/{f}" if parent else f) or "").strip()
            if not text:
                continue
            if m.get("names") == "folder" and text == base:
                found.append(f"marker:{m['id']}")
            elif m.get("names") == "step" and text.isdigit() and step is not None and int(text) == step:
                found.append(f"marker:{m['id']}")
    return found


def _sizes(steps: dict, key: str, before: str, files: list) -> bool:
    """Has every file of `before` a copy in `key` at least as big (a file cut short is smaller)?"""
    size = {r[0]: int(r[1]) for r in files}
    return all(size.get(f"{key}/{n}", -1) >= size.get(f"{before}/{n}", 0) for n in steps[before].get("names") or ())


def judge(steps: dict, *, files: list, since: Optional[float], job: str, quiet: bool, rules: dict,
          seen: Optional[Seen] = None) -> Verdict:
    """The newest checkpoint that counts, and the evidence that vouched for it (playbooks/checkpoints.yaml says
    each rule and its source). steps: transfer.plan.step_dirs of the listing ({dir: {step, names, mtime, ...}});
    files: the listing's rows (rel, size, mtime); since: the job's start on the instance's clock (None: unknown);
    job: "alive", "succeeded" or "died"; quiet: the folder held still for QUIET_SAMPLES samples while the job ran;
    seen: what the same remote execution saw beside the files (open handles, validity, markers' contents)."""
    seen = seen or Seen()
    if not steps:
        return _whole(files, since=since, job=job, quiet=quiet, seen=seen, rules=rules)
    v = _newest(steps, files=files, since=since, job=job, quiet=quiet, seen=seen, rules=rules)
    v.warnings = dangling(steps, seen, rules)
    return v


def _newest(steps: dict, *, files: list, since: Optional[float], job: str, quiet: bool, seen: Seen,
            rules: dict) -> Verdict:
    """resumable's step folders: the newest that counts, newest first."""
    passed: list = []
    order = sorted(steps, key=lambda k: (steps[k]["step"], steps[k].get("mtime", 0.0), k))
    for i in range(len(order) - 1, -1, -1):
        key = order[i]
        st = steps[key]
        names = set(st.get("names") or ())
        if since is not None and float(st.get("mtime") or 0.0) < since:
            passed.append((key, "written before the job started (not this job's)"))
            continue
        out = _ruled_out(key, names, seen, rules, job)
        if out:
            passed.append((key, out))
            continue
        kin_before = [k for k in order[:i] if _kind(k) == _kind(key) and steps[k]["step"] < st["step"]]
        before = kin_before[-1] if kin_before else None
        if before is not None and set(steps[before].get("names") or ()) - names:
            passed.append((key, "lacks files its predecessor has (still being written, or cut short)"))
            continue
        kin_after = [k for k in order[i + 1:] if _kind(k) == _kind(key) and steps[k]["step"] > st["step"]]
        ev = _markers(key, st["step"], names, seen, rules)
        if not ev and any(not (set(steps[k].get("names") or ()) - names) for k in kin_after):
            ev = ["successor"]  # the job moved past it, and it has what the next one has
        if not ev and job == "succeeded":
            ev = ["succeeded"]
        if not ev and before is not None and names == set(steps[before].get("names") or ()) and \
                _sizes(steps, key, before, files):
            ev = ["predecessor"]
        if not ev and before is not None and job == "alive" and quiet and not kin_after:
            ev = ["quiet"]
        if ev and job == "died" and before is not None and not _sizes(steps, key, before, files):
            passed.append((key, f"a file smaller than in {before}: cut short when the job died (a marker written "
                                "before the files vouches for nothing)"))
            continue
        if ev:
            return Verdict(key, st["step"], passed, ev)
        passed.append((key, "the first checkpoint of its kind, with no marker: it counts once the job has moved "
                            "past it" if before is None else
                            "not the same files as its predecessor, or one smaller (cut short?)" + (
                                "; the job died" if job == "died" else "")))
    return Verdict(None, passed_over=passed)


def _whole(files: list, *, since: Optional[float], job: str, quiet: bool, seen: Seen, rules: dict) -> Verdict:
    """A folder with no step folders: one checkpoint, the whole folder."""
    if not files:
        return Verdict(None, passed_over=[("", "empty")])
    if since is not None and max(float(f[2]) for f in files) < since:
        return Verdict(None, passed_over=[("", "written before the job started")])
    names = {f[0] for f in files}
    out = _ruled_out("", names, seen, rules, job)
    if out:
        return Verdict(None, passed_over=[("", out)])
    ev = _markers("", None, names, seen, rules) or (["succeeded"] if job == "succeeded" else
                                                    ["quiet"] if job == "alive" and quiet else [])
    if ev:
        return Verdict("", None, [], ev)
    return Verdict(None, passed_over=[("", "not known to be complete (no marker; the job died or was still "
                                           "writing)")])


def _kind(key: str) -> tuple[str, str]:
    parent, _, base = key.rpartition("/")
    return parent, re.sub(r"\d+$", "", base)
