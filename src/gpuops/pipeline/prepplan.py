"""`gpuops run --prep CMD`, the pure half: what a preparation is, where its outputs are kept, when it is complete, and
what it cost (issue 38). The talking half is pipeline/prepstage.py.

A preparation is a command run first, on its own (cheap) instance in the filesystem's region, whose outputs (each
`--prep-out PATH`) are moved whole onto the run's filesystem, then linked where the job expects them on the training
instance. Its outputs live in a folder keyed by what makes them: the command, the content of the files it runs (the
files the command names, a Python script's project-local imports, a shell script's own files), and the outputs named
(`plan`). Change the script and the key changes: a new folder, prepared again.

Where (the same decision that homes checkpoints, pipeline/checkpoints.py: the run's filesystem, under `gpuops/`):
`<mount>/gpuops/prep/<slug>-<key>/`, holding each output at its path relative to the project (`data/train.bin`), an
output under the instance's home (`~/data`) below `_home/`, and the marker `.gpuops-prep.json`, written last.

Complete: the preparation exited 0, every output it names exists, they were moved whole into the folder (built under
`<folder>.partial`, renamed into place), and then the marker was written (`move_command`). A folder without the marker
is not complete, whatever it holds: it is set aside (`<folder>.incomplete-<time>`, never deleted) and the preparation
runs again. A folder with the marker is kept, not prepared again: a second run with the same preparation skips it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import shlex
from pathlib import Path
from typing import Optional

from ..errors import UsageError

PREP_ROOT = "gpuops/prep"  # under the filesystem's mount point
MARKER = ".gpuops-prep.json"  # written last: the folder is complete
HOME_DIR = "_home"  # outputs under the instance's home (~/data) live below this in the folder
KEY_LEN = 12
MAX_HASHED_FILES = 200  # the files a command runs, at most (a script importing half the world is cut there)
LAST_LINES = 20  # a failed preparation's log lines said in the summary


# -- the user's words ----------------------------------------------------------------------------------------------
def check_outs(outs: list) -> list:
    """--prep-out PATH..., as kept: relative to the project folder (`data/train.bin`, `data/`), or under the instance's
    home (`~/data`, `$HOME/data`); never absolute elsewhere, never `..`, never one inside another. Usage errors (exit 2),
    before anything is written."""
    got = []
    for raw in outs:
        text = str(raw).strip()
        home = text.startswith(("~/", "$HOME/", "${HOME}/"))
        rel = re.sub(r"^(~|\$HOME|\$\{HOME\})/", "", text) if home else text
        rel = re.sub(r"/+", "/", rel).strip("/")
        rel = rel[2:] if rel.startswith("./") else rel
        parts = rel.split("/") if rel else []
        if not parts or text.startswith("/") or any(p in ("", ".", "..") for p in parts) or text in ("~", "$HOME"):
            raise UsageError(f"--prep-out {raw!r}: a path inside the project folder (data/train.bin) or under the "
                             "instance's home (~/data)",
                             hint="what the preparation writes there is kept on the filesystem and linked at the same "
                                  "path for the job; absolute paths elsewhere and '..' are not kept")
        got.append(("~/" if home else "") + "/".join(parts))
    got = list(dict.fromkeys(got))
    for a in got:
        for b in got:
            if a != b and b.startswith(a.rstrip("/") + "/"):
                raise UsageError(f"--prep-out {b!r} is inside --prep-out {a!r}: name one of them",
                                 hint=f"{a} is kept whole, with everything under it")
    return got


def refuse_without_fs(prep: Optional[str], fs: Optional[str], prep_type: Optional[str], outs: list) -> None:
    """--prep needs --fs (nowhere else outlives its instance) and at least one --prep-out (what it keeps); --prep-type
    and --prep-out need --prep. Usage errors, before anything is launched or written."""
    if not prep:
        given = [f for f, v in (("--prep-type", prep_type), ("--prep-out", outs)) if v]
        if given:
            raise UsageError(f"{' and '.join(given)} without --prep: give the preparation's command with --prep CMD")
        return
    if not prep.strip():
        raise UsageError("--prep '': the preparation's command is empty")
    if not fs:
        raise UsageError("--prep needs --fs NAME: the preparation runs on its own instance, which is terminated "
                         "before the training starts, so what it writes is kept on a Lambda filesystem, and there is "
                         "nowhere else to keep it; nothing was launched",
                         hint="gpuops run --prep '" + prep.replace("'", "") + "' --prep-out data --fs data ... (a "
                              "missing filesystem is created after asking: docs/fs.md), or run the preparation inside "
                              "your --script on the training instance")
    if not outs:
        raise UsageError("--prep needs at least one --prep-out PATH: what the preparation writes that the job reads "
                         "(kept on the filesystem, linked at that path for the job); nothing was launched",
                         hint="e.g. --prep-out data/train.bin, or --prep-out data for the whole folder")


def refuse_runs_inside_outs(command: str, outs: list, project: Path) -> None:
    """A --prep-out folder that holds a file the command runs (nanoGPT's data/shakespeare_char/ holds prepare.py): the
    outputs are left out of the sync (never a stale copy), so the preparation would not find its own script. Refused
    with the fix: name the files it writes."""
    files = command_files(command, project)
    for out in outs:
        if out.startswith("~/"):
            continue
        inside = [f for f in files if f == out or f.startswith(out.rstrip("/") + "/")]
        if inside:
            raise UsageError(f"--prep-out {out} holds {inside[0]}, which the preparation runs: an output is left out "
                             "of the sync (what it writes is never a stale copy from here), so it would not be there",
                             hint=f"name the files it writes: --prep-out {out}/train.bin --prep-out {out}/val.bin ...")


def profile_name(run_id: str) -> str:
    """The preparation instance's profile (a name up accepts: 63 characters at most)."""
    name = f"prep-{run_id}"
    return name if len(name) <= 63 else f"p-{run_id}"[:63]


# -- the key: what the preparation runs ----------------------------------------------------------------------------
def _tokens(text: str) -> list:
    try:
        toks = shlex.split(text, comments=True)
    except ValueError:
        toks = text.split()
    out = []
    for t in toks:
        out.append(t)
        if t.startswith("-") and "=" in t:
            out.append(t.split("=", 1)[1])
    return out


def _in_project(project: Path, name: str, base: Optional[Path] = None) -> Optional[str]:
    """A token naming a regular file of the project (relative to the project, or to `base`): its POSIX path."""
    if not name or name.startswith("-") or len(name) > 400 or "\0" in name:
        return None
    root = project.resolve()
    for where in ([base] if base is not None else []) + [project]:
        try:
            p = (where / name).resolve()
            rel = p.relative_to(root)
        except (OSError, ValueError):
            continue
        if p.is_file():
            return rel.as_posix()
    return None


def _py_imports(project: Path, rel: str) -> list:
    """A Python file's imports that are files of the project (absolute from the project's root or the file's folder,
    and relative ones), one level."""
    path = project / rel
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    here = Path(rel).parent
    found = []
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            mods = [(base, node.level)] + [(f"{base}.{a.name}" if base else a.name, node.level) for a in node.names]
        for mod, level in mods:
            roots = [here.parents[level - 2] if level > 1 and len(here.parents) >= level - 1 else here] if level \
                else [Path("."), here]
            for root in roots:
                stem = (root / mod.replace(".", "/")) if mod else root
                for cand in (f"{stem.as_posix()}.py", f"{stem.as_posix()}/__init__.py"):
                    got = _in_project(project, cand)
                    if got:
                        found.append(got)
    return found


def command_files(command: str, project: Path) -> list:
    """The files the command runs, found here (pure of the network: the project's own files): each token naming a
    file of the project; a Python file's project-local imports, at any depth; a shell script's own tokens naming
    files of the project. Sorted; at most MAX_HASHED_FILES."""
    todo = [f for f in (_in_project(project, t) for t in _tokens(command)) if f]
    for i, t in enumerate(toks := _tokens(command)):  # python -m pkg.mod
        if t == "-m" and i + 1 < len(toks):
            todo += [f for f in (_in_project(project, toks[i + 1].replace(".", "/") + ext)
                                 for ext in (".py", "/__main__.py")) if f]
    seen: list = []
    while todo and len(seen) < MAX_HASHED_FILES:
        rel = todo.pop(0)
        if rel in seen:
            continue
        seen.append(rel)
        if rel.endswith(".py"):
            todo += _py_imports(project, rel)
        elif rel.endswith((".sh", ".bash")) or _shebang_shell(project / rel):
            try:
                text = (project / rel).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            base = (project / rel).parent
            for line in text.splitlines():
                todo += [f for f in (_in_project(project, t, base) for t in _tokens(line)) if f]
    return sorted(seen)


def _shebang_shell(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and re.search(rb"\b(ba|da|z)?sh\b", first) is not None


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plan(command: str, outs: list, project: Path) -> dict:
    """What identifies a preparation: {command, outs, files {path: sha256}, key, folder}. The key covers the command
    as typed, the content of every file it runs and the outputs named (in order given: they are the same set either
    way), so an edited script, another option or another output is another preparation."""
    files = {rel: _digest(project / rel) for rel in command_files(command, project)}
    doc = {"command": command.strip(), "files": files, "outs": sorted(outs)}
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:KEY_LEN]
    return {"command": command.strip(), "outs": list(outs), "files": files, "key": key,
            "folder": f"{slug(command, files)}-{key}"}


def slug(command: str, files: dict) -> str:
    """A readable start for the folder's name: the first file the command runs, else its first word."""
    toks = _tokens(command)
    first = next((t for t in toks if t in files), None) or next((t for t in toks if not t.startswith("-")), "prep")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(first).stem or first).strip("-._")[:40]
    return name or "prep"


def folder(mount: str, name: str) -> str:
    """The preparation's folder on the filesystem mounted at `mount`."""
    return f"{mount.rstrip('/')}/{PREP_ROOT}/{name}"


def kept_path(out: str) -> str:
    """Where an output sits inside the preparation's folder."""
    return f"{HOME_DIR}/{out[2:]}" if out.startswith("~/") else out


def job_path(out: str, remote_project: str) -> str:
    """Where the job expects an output on an instance (shell text: `~/...` stays for the shell to expand)."""
    from ..remote.shell import shell_path

    return shell_path(out if out.startswith("~/") else remote_project.rstrip("/") + "/" + out)


def sync_excludes(outs: list) -> list:
    """rsync exclusions for the outputs inside the project: the preparation writes them (a stale copy here is never
    sent to either instance: the job reads the kept ones)."""
    return ["/" + o for o in outs if not o.startswith("~/")]


# -- the remote executions (shell text; every value through shlex.quote) --------------------------------------------
def status_command(path: str) -> str:
    """ONE execution: the marker of the preparation's folder, if there is one (`@marker` then its text)."""
    f = shlex.quote(path.rstrip("/") + "/" + MARKER)
    return f"if [ -f {f} ]; then echo @marker; cat {f}; else echo @none; fi\n"


def move_command(remote_project: str, path: str, outs: list, marker: dict, stamp: str) -> str:
    """ONE execution on the preparation's instance, after the command exited 0: every output present (exit 5 and
    `@missing PATH` otherwise, nothing moved); a folder already complete (another run finished the same preparation
    meanwhile) kept as it is (`@already`); a folder without the marker set aside (`<folder>.incomplete-<stamp>`,
    never deleted); the outputs moved into `<folder>.partial` (removed first: gpuops' own scratch), that renamed to
    `<folder>`, then the marker written (under a temporary name, renamed): last. `@moved BYTES FILES` at the end."""
    f = shlex.quote(path.rstrip("/"))
    part = shlex.quote(path.rstrip("/") + ".partial")
    mark = shlex.quote(path.rstrip("/") + "/" + MARKER)
    lines = ["set -u"]
    for out in outs:
        src = job_path(out, remote_project)
        lines.append(f"[ -e {src} ] || [ -L {src} ] || {{ echo @missing {shlex.quote(out)}; exit 5; }}")
    lines += [f"if [ -f {mark} ]; then echo @already; cat {mark}; exit 0; fi",
              f"mkdir -p \"$(dirname {f})\" || exit 4",
              f"if [ -e {f} ]; then mv -- {f} {shlex.quote(path.rstrip('/') + '.incomplete-' + stamp)} || exit 4; "
              "echo @setaside; fi",
              f"rm -rf -- {part} && mkdir -p {part} || exit 4"]
    for out in outs:
        dest = shlex.quote(path.rstrip("/") + ".partial/" + kept_path(out))
        lines.append(f"mkdir -p \"$(dirname {dest})\" && mv -- {job_path(out, remote_project)} {dest} || "
                     f"{{ echo @failed {shlex.quote(out)}; exit 6; }}")
    lines += [f"gpuops_n=$(find {part} -type f | wc -l); "
              f"gpuops_b=$(find {part} -type f -printf '%s\\n' | awk '{{s+=$1}} END {{print s+0}}')",
              "sync 2>/dev/null || true",
              f"mv -- {part} {f} || exit 6",
              f"cat > {mark}.tmp <<'GPUOPS_MARKER'",
              json.dumps(marker, sort_keys=True),
              "GPUOPS_MARKER",
              f"mv -- {mark}.tmp {mark} || exit 6",
              'echo "@moved $gpuops_b $gpuops_n"']
    return "\n".join(lines) + "\n"


def link_command(remote_project: str, path: str, outs: list, key: str) -> str:
    """ONE execution on a training instance: the preparation's marker checked (exit 5, `@incomplete`, when it is
    missing or names another key: nothing linked), then each output linked at the path the job expects it (a link of
    that name replaced; an empty folder replaced; a file or a non-empty folder of its own: exit 3, `@taken PATH`,
    nothing changed for it)."""
    mark = shlex.quote(path.rstrip("/") + "/" + MARKER)
    want = shlex.quote(f'"key": "{key}"')
    lines = [f"grep -qF {want} {mark} 2>/dev/null || {{ echo @incomplete; exit 5; }}"]
    for out in outs:
        link = job_path(out, remote_project)
        target = shlex.quote(path.rstrip("/") + "/" + kept_path(out))
        lines.append(f"if [ -d {link} ] && [ ! -L {link} ]; then rmdir {link} 2>/dev/null || "
                     f"{{ echo @taken {shlex.quote(out)}; exit 3; }}; "
                     f"elif [ -e {link} ] && [ ! -L {link} ]; then echo @taken {shlex.quote(out)}; exit 3; fi")
        lines.append(f"mkdir -p \"$(dirname {link})\" && ln -sfn {target} {link} || exit 4")
    lines.append(f"echo @linked; cat {mark}")
    return "\n".join(lines) + "\n"


def parse_marker(text: str) -> Optional[dict]:
    """The marker after a `@marker`, `@already` or `@linked` line of the executions above (None: none, or not ours)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() in ("@marker", "@already", "@linked"):
            try:
                doc = json.loads("\n".join(lines[i + 1:]))
            except ValueError:
                return None
            return doc if isinstance(doc, dict) and doc.get("gpuops_prep") == 1 else None
    return None


def complete(marker: Optional[dict], key: str) -> bool:
    """Is the folder a complete preparation of this key (its marker, ours, with the same key and exit 0)?"""
    return bool(marker) and marker.get("key") == key and marker.get("exit_code") == 0


def make_marker(p: dict, *, run: str, job: Optional[str], instance: Optional[str], itype: Optional[str],
                at: float, seconds: Optional[float]) -> dict:
    return {"gpuops_prep": 1, "key": p["key"], "command": p["command"], "outs": p["outs"], "files": p["files"],
            "exit_code": 0, "run": run, "job": job, "instance": instance, "type": itype, "at": round(at, 3),
            "seconds": None if seconds is None else round(seconds, 1)}


def parse_moved(text: str) -> dict:
    """move_command's answer: {moved: (bytes, files) | None, already: marker | None, missing, failed, set_aside}."""
    got = {"moved": None, "already": None, "missing": None, "failed": None, "set_aside": False}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "@moved":
            nums = rest.split()
            got["moved"] = (int(nums[0]), int(nums[1])) if len(nums) == 2 and all(n.isdigit() for n in nums) else (0, 0)
        elif word in ("@missing", "@failed"):
            got[word[1:]] = rest.strip()
        elif word == "@setaside":
            got["set_aside"] = True
    if "@already" in text.split():
        got["already"] = parse_marker(text)
    return got


# -- which type --------------------------------------------------------------------------------------------------
def cheapest_types(types: dict, region: Optional[str]) -> list:
    """The preparation's candidates, from the API's map (name -> TypeAvailability): the types with capacity in the
    filesystem's region, cheapest first (the first is launched; the others are tried if its capacity goes meanwhile);
    none with capacity there: every priced type, cheapest first (the launch says there is none, or waits with
    --wait-for-capacity)."""
    priced = sorted((a for a in types.values() if a.type.price_cents_per_hour > 0),
                    key=lambda a: (a.type.price_cents_per_hour, a.type.name))
    there = [a.type.name for a in priced if region is None and a.regions or region in a.regions]
    return there or [a.type.name for a in priced]


def template(run_template: Optional[dict]) -> Optional[dict]:
    """The run's --from template as the preparation's instance takes it: its environment (python, setup, env, presets,
    secrets, sync), not the training GPU it expects (the preparation runs on another type)."""
    if not run_template:
        return run_template
    t = dict(run_template)
    expect = {k: v for k, v in (t.get("expect") or {}).items() if k not in ("gpu", "gpu_count", "gpu_memory_mib")}
    t["expect"] = expect
    return t


# -- money and the record ----------------------------------------------------------------------------------------
def instance_cost(inst: dict, now: float) -> float:
    start = inst.get("started")
    if start is None or not inst.get("price_per_hour"):
        return 0.0
    end = inst.get("ended") if inst.get("ended") is not None else now
    return max(0.0, end - start) / 3600.0 * inst["price_per_hour"]


def spend(prep: Optional[dict], now: float) -> float:
    """Dollars the preparation's instances billed (each from its launch to its confirmed termination; one still
    running, until now)."""
    return sum(instance_cost(i, now) for i in (prep or {}).get("instances") or [])


def stage(prep: Optional[dict]) -> dict:
    return ((prep or {}).get("stage") or {})


def pending(prep: Optional[dict]) -> bool:
    """Is the preparation still to run (never started, started and cut off, or interrupted)?"""
    st = stage(prep)
    return prep is not None and (st.get("ended") is None or bool(prep.get("interrupted")))


def failed(prep: Optional[dict]) -> bool:
    st = stage(prep)
    return prep is not None and st.get("ended") is not None and st.get("ok") is False and not prep.get("interrupted")


def row(prep: dict, now: float) -> Optional[dict]:
    """The preparation's row among the run's stages (instance 0: its own instance)."""
    st = stage(prep)
    if st.get("started") is None:
        return None
    end = st["ended"] if st.get("ended") is not None else now
    return {"stage": "prep", "label": "preparation", "seconds": round(max(0.0, end - st["started"]), 1),
            "cost": round(spend(prep, now), 4), "ok": st.get("ok"), "detail": st.get("detail"), "instance": 0}


def instance_rows(prep: Optional[dict], now: float) -> list:
    """The preparation's instances as rows of the run's instances (`instance` 0, `role` prep)."""
    rows = []
    for i in (prep or {}).get("instances") or []:
        if i.get("started") is None:
            continue
        end = i.get("ended")
        rows.append({"instance": 0, "role": "prep", "ids": list(i.get("ids") or []), "type": i.get("type"),
                     "region": i.get("region"), "started": i["started"], "ended_at": end,
                     "seconds": round(max(0.0, (end if end is not None else now) - i["started"]), 1),
                     "cost": round(instance_cost(i, now), 4), "ended": i.get("how") or "running"})
    return rows


def last_lines(text: str, n: int = LAST_LINES) -> list:
    return [line.rstrip("\r") for line in text.splitlines() if line.strip()][-n:]


def summary_doc(prep: Optional[dict], now: float) -> Optional[dict]:
    """The preparation in the run's --json summary."""
    if not prep:
        return None
    st = stage(prep)
    from ..jsonvocab import iso

    keys = ("command", "outs", "key", "folder", "path", "filesystem", "state", "exit_code", "job", "log",
            "environment", "type", "type_used", "outputs", "why", "last_lines", "kept_by", "files", "verified",
            "ending")
    doc = {k: prep.get(k) for k in keys}
    doc.update({"ok": st.get("ok"), "detail": st.get("detail"),
                "duration_s": row(prep, now)["seconds"] if st.get("started") is not None else None,
                "cost": round(spend(prep, now), 4), "kept_since_at": iso(prep.get("kept_since"))})
    return doc


# -- the local index: what this machine saw complete -----------------------------------------------------------------
def index_dir(project: Path) -> Path:
    return project / "runs" / "pipelines" / "preps"


def index_file(project: Path, fs_name: str, name: str) -> Path:
    return index_dir(project) / f"{fs_name}--{name}.json"


def run_excludes(prep: Optional[dict]) -> list:
    """The training instance's sync leaves the preparation's outputs out (they are linked from the filesystem)."""
    return sync_excludes((prep or {}).get("outs") or [])


def summary_lines(doc: Optional[dict]) -> list:
    """The preparation as the closing summary says it (plain lines)."""
    if not doc:
        return []
    state, outs = doc.get("state"), ", ".join(doc.get("outs") or [])
    where = doc.get("path") or f"{PREP_ROOT}/{doc.get('folder')} on filesystem {doc.get('filesystem')}"
    lines = []
    if state == "ran":
        o = doc.get("outputs") or {}
        lines.append(f"preparation: ran `{doc['command']}` on {doc.get('type_used') or doc.get('type') or '?'} in "
                     f"{doc.get('duration_s') or 0:.1f} s, ${doc.get('cost') or 0:.4f}: {outs} ({o.get('files')} files, "
                     f"{o.get('bytes')} bytes) kept in {where}; a run with the same preparation skips it")
    elif state == "kept":
        lines.append(f"preparation: `{doc['command']}` kept (complete on the filesystem, run {doc.get('kept_by')}): "
                     f"{outs} in {where}; not prepared again" + (f" (${doc['cost']:.4f} to look)" if doc.get("cost")
                                                                  else ""))
    elif state == "failed":
        from ..jobs.watchtext import ending_lines

        lines.append(f"preparation FAILED: {doc.get('why')}; no training instance was launched")
        lines += ["  " + ln for ln in ending_lines(doc.get("ending"), indent="    ")]  # the cause, as a job's
        lines += ["  | " + ln for ln in doc.get("last_lines") or []]
    else:
        lines.append(f"preparation: not complete ({(doc.get('ok') is False and 'interrupted') or 'not run'})")
    if doc.get("log"):
        lines.append(f"preparation's log: {doc['log']}" + (f"; its environment: {doc['environment']}"
                                                             if doc.get("environment") else ""))
    return lines
