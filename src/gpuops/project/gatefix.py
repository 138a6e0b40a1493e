"""The launch gate's judgement of the modules the host's python cannot find (pure): which needs are missing from the
probe's answer, and the fix for each, worded from what the project's files declare (the second line behind the
local plan: it asks the instance what this machine could not resolve). jobs/actions.py's gate calls it."""
from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Optional

from .closure import Need, read_bytes
from .judge import builds_against_torch, distributions, torch_brings
from .launch import normal_dir
from .read import normalize, parse_pyproject, setup_py, with_setup_py

_REQ_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(text: str) -> Optional[str]:
    egg = re.search(r"#egg=([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    if egg:
        return egg.group(1)
    if "://" in text.split("@", 1)[0] or text.startswith((".", "/")):
        return None
    m = _REQ_NAME.match(text)
    return m.group(1) if m else None


def requirements_names(project: Path, rel: str, seen: Optional[set[str]] = None) -> dict[str, str]:
    """Distribution names a requirements file lists (with its -r/--requirement includes): name -> file."""
    seen = set() if seen is None else seen
    if rel in seen:
        return {}
    seen.add(rel)
    raw = read_bytes(project / rel)
    if raw is None:
        return {}
    out: dict[str, str] = {}
    base = PurePosixPath(rel).parent
    for line in raw.decode("utf-8", "replace").replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line:
            continue
        inc = re.match(r"(-r|--requirement)(\s+|=)(\S+)", line)
        if inc:
            target = (base / inc.group(3)).as_posix()
            for k, v in requirements_names(project, normal_dir(target), seen).items():
                out.setdefault(k, v)
            continue
        if line.startswith("-e ") or line.startswith("--editable"):
            name = requirement_name(line.split(None, 1)[1] if " " in line else "")
        elif line.startswith("-"):
            continue
        else:
            name = requirement_name(line)
        if name:
            out.setdefault(normalize(name), rel)
    return out


def _text(path: Path) -> Optional[str]:
    raw = read_bytes(path)
    return raw.decode("utf-8", "replace") if raw is not None else None


def _pyproject(project: Path) -> dict:
    return with_setup_py(parse_pyproject(_text(project / "pyproject.toml")), _text(project / "setup.py"))


def declared(project: Path) -> dict[str, str]:
    """The distributions the project's dependency files name (normalized name -> the file that names it):
    requirements*.txt and requirements/*.txt (with -r includes), pyproject.toml's dependencies, optional-dependencies
    and dependency groups (setup.py's where pyproject says they are dynamic, or where there is no pyproject), and
    uv.lock's packages."""
    out: dict[str, str] = {}
    for f in sorted([*project.glob("requirements*.txt"), *project.glob("requirements/*.txt")]):
        for k, v in requirements_names(project, f.relative_to(project).as_posix()).items():
            out.setdefault(k, v)
    pp = _pyproject(project)
    lists = [pp["dependencies"], *pp["optional"].values(), *(pp.get("groups") or {}).values()]
    for items in lists:
        for item in items:
            name = requirement_name(item)
            if name:
                out.setdefault(normalize(name), (pp.get("source") or {}).get(item, "pyproject.toml"))
    if pp.get("name"):
        out.setdefault(normalize(pp["name"]), "pyproject.toml")
    lock = _text(project / "uv.lock") or ""
    for name in re.findall(r'(?m)^name\s*=\s*"([^"]+)"', lock):
        out.setdefault(normalize(name), "uv.lock")
    return out


def extras_only(project: Path) -> dict[str, list[str]]:
    """Distributions the project names only under an extra (pyproject's [project.optional-dependencies], or
    setup.py's extras_require): normalized name -> the extras that name it. setup installs them only for the extras
    the profile's setup.extras names."""
    pp = _pyproject(project)
    main = {normalize(n) for n in (requirement_name(i) for i in pp["dependencies"]) if n}
    main |= set(requirements_names(project, "requirements.txt"))
    out: dict[str, list[str]] = {}
    for extra, items in pp["optional"].items():
        for item in items:
            name = requirement_name(item)
            if name and normalize(name) not in main:
                out.setdefault(normalize(name), []).append(str(extra))
    return out


def has_project_table(project: Path) -> bool:
    return parse_pyproject(_text(project / "pyproject.toml"))["project"]


def setup_py_only(project: Path) -> bool:
    return not has_project_table(project) and bool(setup_py(_text(project / "setup.py")))


def missing(needs: list[Need], found: Optional[dict]) -> list[Need]:
    """The needs the host's python cannot find: `found` is the probe's answer {path0: {module: true | false |
    "error text"}}; only a plain false counts (an error, or a name not asked, is no refusal)."""
    if not isinstance(found, dict):
        return []
    return [n for n in needs if isinstance(found.get(n.path0), dict) and found[n.path0].get(n.module) is False]


def problems(gone: list[Need], *, python: str, declared_names: dict[str, str], table: list[dict],
             project_table: bool, extras: Optional[dict[str, list[str]]] = None, wanted_extras=(),
             tables: Optional[dict] = None) -> list[tuple[str, list[str]]]:
    """One (problem, fix lines) per file that needs missing modules, worded like the gate's other problems:
    `train.py imports wandb, which ~/.venvs/gpuops/bin/python cannot import`. extras: extras_only(project);
    wanted_extras: the profile's setup.extras (a list, or "all"); tables: modules.yaml (what torch brings)."""
    groups: dict[tuple[str, str], list[Need]] = {}
    for n in gone:
        groups.setdefault((n.source, n.how), []).append(n)
    out = []
    for (source, how), ns in groups.items():
        names = [n.shown for n in ns]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        out.append((f"{source} {how} {listed}, which {python} cannot import",
                    [fix(n, declared_names, table, project_table, extras or {}, wanted_extras, tables or {})
                     for n in ns]))
    return out


def fix(n: Need, declared_names: dict[str, str], table: list[dict], project_table: bool,
        extras: dict[str, list[str]], wanted_extras, tables: dict) -> str:
    head = f"fix ({n.shown}): "
    if n.local:
        if n.local_root == n.path0:  # python finds it there once it is on the host
            return head + (f"it is the project's own module ({n.local}) and is not on the host: sync the project "
                           "(drop --no-sync; is it excluded by sync.exclude or an ignore file?)")
        if project_table:
            return head + (f"it is the project's own module ({n.local}): gpuops setup installs the project "
                           "(pyproject.toml), so it imports from any folder")
        return head + (f"it is the project's own module ({n.local}), not on the job's path: set PYTHONPATH "
                       f"(--env PYTHONPATH={n.local_root or '.'} or the profile's env:)")
    dists = distributions(n.module, table)
    if torch_brings(n.module, tables):
        return head + (f"{n.module} comes with torch (a CUDA torch requires it): do not add it to the requirements "
                       "(a separate one may not match torch); the job's python has a torch without it, a CPU or "
                       "partial build: reinstall torch with its dependencies, or use the image's (gpuops verify "
                       "shows which torch the job's python has)")
    if builds_against_torch(n.module, table):  # built against torch: setup's own step installs it (modules.yaml)
        return head + (f"{dists[0]} is built for the exact torch, CUDA and Python: name it in the profile's "
                       f"expect.packages ({dists[0]}: \"*\" or a version), and gpuops setup installs a prebuilt "
                       "wheel that matches them, else builds it (MAX_JOBS, --no-build-isolation); a requirements "
                       "line builds it against whatever torch the installer picks, or fails")
    hit = next((normalize(d) for d in dists if normalize(d) in declared_names), None)
    wanted = [] if wanted_extras == "all" else list(wanted_extras or [])
    if hit and hit in extras and wanted_extras != "all" and not set(extras[hit]) & set(wanted):
        names = extras[hit]
        where = declared_names.get(hit, "pyproject.toml")
        where = "setup.py" if where.startswith("setup.py") else "pyproject.toml"
        return head + (f"the project lists {hit} only in {where}'s extra {' or '.join(names)}, which setup "
                       f"does not install: add it to the profile's setup.extras (setup: {{extras: [{names[0]}]}}), "
                       "then gpuops setup")
    if hit and "/" in declared_names[hit] and declared_names[hit].startswith("requirements"):
        return head + (f"the project lists {hit} in {declared_names[hit]}, which setup does not install unless the "
                       f"profile names it: setup: {{requirements: [{declared_names[hit]}]}}, then gpuops setup")
    if hit:
        return head + f"gpuops setup (the project lists {hit} in {declared_names[hit]}; setup installs it)"
    return head + f"add {dists[0]} to the project's requirements, then gpuops setup"
