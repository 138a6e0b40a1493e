"""`gpuops setup`'s reading of a project (pure): which dependency files it has, what they name, what setup installs
from them (a uv lock, requirements files with their -r includes, a [project] table), and what setup cannot install
or run: a lock or environment file of a tool setup does not drive (poetry, pdm, conda: playbooks/images.yaml
project_tools), a requires-python the python does not meet. Read from the host's files (setup, HostFacts.texts and
.files) or from this machine's (`gpuops run` before it launches: pipeline/prelaunch.py), the same functions."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Req:
    name: str  # normalised (PEP 503)
    spec: str  # "" = any version
    source: str  # the file it came from


@dataclass
class Project:
    kind: str  # uv-lock | pyproject | requirements | none
    requirements: list[str] = field(default_factory=list)  # files installed with -r (top level)
    reqs: list[Req] = field(default_factory=list)  # every named requirement (includes followed)
    extras: list[str] = field(default_factory=list)  # extras to install (names)
    all_extras: bool = False
    notes: list[str] = field(default_factory=list)

    def req(self, name: str) -> Optional[Req]:
        return next((r for r in self.reqs if r.name == name), None)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_INCLUDE = re.compile(r"^\s*(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+)(\S+)")


def marker_env(facts) -> dict:
    """The environment markers (`; sys_platform == "linux"`) of the host's python, as far as the facts tell: Linux,
    the host's machine, the version of the environment's python (else the base one)."""
    ver = facts.env_python_version or facts.base_python_version
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "extra": "",
           "platform_machine": facts.arch or "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython"}
    if ver:
        env.update(python_full_version=ver, python_version=".".join(ver.split(".")[:2]))
    return env


def _applies(req, env: Optional[dict]) -> bool:
    """A requirement's marker holds on the host (one that cannot be judged counts as holding)."""
    if req.marker is None or env is None:
        return True
    from packaging.markers import default_environment

    try:
        return bool(req.marker.evaluate({**default_environment(), **env}))
    except Exception:
        return True


def parse_requirements(texts: dict[str, str], start: str, env: Optional[dict] = None) -> list[Req]:
    """The named requirements of a requirements file and every file it includes with -r (constraints files -c are
    read for the no-op check on the host, not installed), those whose marker does not hold in `env` (marker_env)
    left out. Lines that are options, URLs or paths are skipped."""
    import posixpath

    from packaging.requirements import InvalidRequirement, Requirement

    out: list[Req] = []
    seen: set[str] = set()

    def walk(rel: str) -> None:
        rel = posixpath.normpath(rel)
        if rel in seen or rel not in texts:
            return
        seen.add(rel)
        for raw in texts[rel].replace("\\\n", " ").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            m = _INCLUDE.match(line)
            if m:
                if m.group(1) in ("-r", "--requirement"):
                    walk(posixpath.join(posixpath.dirname(rel), m.group(2)))
                continue
            if line.startswith("-"):
                continue
            try:
                r = Requirement(line)
            except InvalidRequirement:
                continue
            if _applies(r, env):
                out.append(Req(_norm(r.name), str(r.specifier), rel))

    walk(start)
    return out


def parse_pyproject(text: Optional[str]) -> dict:
    """{"project": bool, "dependencies": [...], "optional": {extra: [...]}} of a pyproject.toml (tomllib when this
    Python has it, else the few lines that matter read by pattern)."""
    if not text:
        return {"project": False, "dependencies": [], "optional": {}}
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        tomllib = None
    if tomllib is not None:
        try:
            doc = tomllib.loads(text)
        except ValueError:
            doc = None
        if doc is not None:
            proj = doc.get("project")
            if not isinstance(proj, dict):
                return {"project": False, "dependencies": [], "optional": {}}
            opt = proj.get("optional-dependencies") or {}
            return {"project": True, "dependencies": [str(d) for d in proj.get("dependencies") or []],
                    "optional": {str(k): [str(d) for d in v] for k, v in opt.items() if isinstance(v, list)}}
    has = re.search(r"(?m)^\s*\[project\]\s*$", text) is not None
    optional: dict = {}
    m = re.search(r"(?ms)^\s*\[project\.optional-dependencies\]\s*$(.*?)(?=^\s*\[|\Z)", text)
    if m:
        optional = {k: [] for k in re.findall(r"(?m)^\s*([A-Za-z0-9_.-]+)\s*=", m.group(1))}
    return {"project": has, "dependencies": [], "optional": optional}


def read_project(facts, settings) -> Project:
    """What to install, from the files on the host: a uv lock with a [project] pyproject -> `uv sync --locked`;
    requirements files -> `-r` each (whenever they exist, unless a lock decides); a [project] pyproject without a
    lock -> the project, editable, after the requirements."""
    from packaging.requirements import InvalidRequirement, Requirement

    pp = parse_pyproject(facts.texts.get("pyproject.toml"))
    env = marker_env(facts)
    reqs_files = [r for r in settings.requirements if r in facts.files]
    want_extras = settings.extras
    p = Project("none")
    if "pyproject.toml" in facts.files and pp["project"]:
        p.all_extras = want_extras == "all"
        p.extras = sorted(pp["optional"]) if p.all_extras else list(want_extras)
        unknown = [e for e in p.extras if pp["optional"] and e not in pp["optional"]]
        if unknown:
            p.notes.append(f"setup.extras names {', '.join(unknown)}, which pyproject.toml does not define "
                           f"(it defines: {', '.join(pp['optional']) or 'none'})")
        deps = pp["dependencies"] + [d for e in p.extras for d in pp["optional"].get(e, [])]
        for d in deps:
            try:
                r = Requirement(d)
            except InvalidRequirement:
                continue
            if _applies(r, env):
                p.reqs.append(Req(_norm(r.name), str(r.specifier), "pyproject.toml"))
        if "uv.lock" in facts.files:
            p.kind = "uv-lock"
            if reqs_files:
                p.notes.append(f"{', '.join(reqs_files)} not installed: uv.lock decides the environment")
            return p
        p.kind = "pyproject"
    elif "pyproject.toml" in facts.files and reqs_files:
        p.notes.append("pyproject.toml has no [project] table (it configures tools): the requirements are installed, "
                       "not the folder")
    elif "uv.lock" in facts.files:
        p.notes.append("uv.lock without a [project] in pyproject.toml: nothing to sync")
    if want_extras and not pp["project"]:
        p.notes.append("setup.extras is set but the project has no [project] table to take extras from")
    if reqs_files:
        p.requirements = reqs_files
        if p.kind == "none":
            p.kind = "requirements"
        for rf in reqs_files:
            p.reqs = parse_requirements(facts.texts, rf, env) + p.reqs
    for miss in facts.missing:
        p.notes.append(f"a requirements file includes {miss}, which is not on the host (sync it, or fix the -r line)")
    return p


# -- what setup cannot install or run (issue #28) --------------------------------------------------------------------
SELF = re.compile(r"^\s*(?:(?:-e|--editable)(?:\s*=\s*|\s+))?(?:file:)?\.(?:/)?(?:\[[^\]]*\])?\s*(?:#.*)?$")


def installs_itself(texts: dict[str, str], start: str) -> Optional[str]:
    """The requirements file (start, or one it includes with -r) that installs the project folder itself (`-e .`,
    `.`, `-e .[extra]`), or None."""
    import posixpath

    seen: set[str] = set()

    def walk(rel: str) -> Optional[str]:
        rel = posixpath.normpath(rel)
        if rel in seen or rel not in texts:
            return None
        seen.add(rel)
        for raw in texts[rel].replace("\\\n", " ").splitlines():
            line = raw.split(" #", 1)[0].strip()
            m = _INCLUDE.match(line)
            if m and m.group(1) in ("-r", "--requirement"):
                hit = walk(posixpath.join(posixpath.dirname(rel), m.group(2)))
                if hit:
                    return hit
            elif posixpath.dirname(rel) in ("", ".") and SELF.match(line):
                return rel
        return None

    return walk(start)


def requires_python(pyproject_text: Optional[str]) -> Optional[str]:
    """[project] requires-python of a pyproject.toml (">=3.13"), or None."""
    if not pyproject_text:
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10: the one line, by pattern
        m = re.search(r'(?m)^\s*requires-python\s*=\s*["\']([^"\']+)["\']', pyproject_text)
        return m.group(1).strip() if m else None
    try:
        proj = tomllib.loads(pyproject_text).get("project")
    except ValueError:
        return None
    spec = proj.get("requires-python") if isinstance(proj, dict) else None
    return str(spec).strip() if spec else None


def python_meets(spec: str, version: str) -> Optional[bool]:
    """Does python `version` (3.10.12) meet requires-python `spec`? None when the spec cannot be read."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return None


@dataclass
class ToolProject:
    """A project whose dependencies a tool setup does not drive decides (poetry.lock, pdm.lock, environment.yml)."""
    tool: str
    marker: str  # the file (or pyproject table) that says so
    export: str  # the command that writes a requirements file setup installs
    installable: bool  # setup installs something all the same (a [project] table, a requirements file)


def _has_table(doc: Optional[dict], dotted: str) -> bool:
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def tool_project(files: set[str], pyproject_text: Optional[str], requirements: list[str],
                 tools: list[dict]) -> Optional[ToolProject]:
    """The first tool of `tools` (images.yaml project_tools) the project uses, by its files or its pyproject table,
    and whether setup installs the project anyway: requirements files, or a [project] table that names dependencies
    (setup installs it editable; the tool's lock is then not what decides the versions)."""
    doc = None
    if pyproject_text:
        try:
            import tomllib

            doc = tomllib.loads(pyproject_text)
        except (ImportError, ValueError):
            doc = None
    pp = parse_pyproject(pyproject_text)
    installable = bool([r for r in requirements if r in files]) or (pp["project"] and bool(pp["dependencies"]))
    for t in tools or []:
        marker = next((f for f in t.get("files") or [] if f in files), None)
        if marker is None and t.get("pyproject") and "pyproject.toml" in files and _has_table(doc, t["pyproject"]):
            marker = f"pyproject.toml [{t['pyproject']}]"
        if marker:
            return ToolProject(str(t["tool"]), marker, str(t.get("export") or ""), installable)
    return None


def tool_refusal(tp: ToolProject, requirements: list[str]) -> tuple[str, str]:
    """(problem, hint) for a tool's project setup cannot install."""
    first = requirements[0] if requirements else "requirements.txt"
    return (f"this is a {tp.tool} project ({tp.marker}), and setup installs no {tp.tool} lock or environment: "
            f"it installs uv.lock, {first} or a [project] table, and the project has none of them",
            f"write {first} from it on this machine: {tp.export}; then setup installs it (gpuops sync sends it)")
