"""A project's dependency files, read (pure: text in, names out; `local_files` reads a folder on this machine).

Which dependency files a project has, what they name, what setup installs from them (a uv lock, requirements files
with their -r includes, a [project] table), and what setup cannot install or run: a lock or environment file of a
tool setup does not drive (poetry, pdm, conda: playbooks/images.yaml project_tools), a requires-python the python
does not meet. Also what the files name that setup does not install: setup.py's install_requires and extras_require
(read with `ast`, never run), pyproject's optional dependencies and dependency groups, PEP 723 `# /// script` blocks,
requirements files setup is not told about; and the index lines (--index-url, --extra-index-url, --find-links) the
requirements files give. Read from the host's files (setup: HostFacts.texts and .files) or from this machine's
(`local_files`: the local plan, project/plan.py), the same functions."""
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
    kind: str  # uv-lock | pyproject | requirements | script (PEP 723 blocks only) | none
    requirements: list[str] = field(default_factory=list)  # files installed with -r (top level)
    reqs: list[Req] = field(default_factory=list)  # every named requirement (includes followed)
    extras: list[str] = field(default_factory=list)  # extras to install (names)
    all_extras: bool = False
    notes: list[str] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)  # (file, PEP 508 string): every requirement installed
    editable: Optional[str] = None  # the folder, installed editable after the requirements files ("." or ".[a,b]")
    blocks: dict[str, list[str]] = field(default_factory=dict)  # script -> its `# /// script` dependencies

    def req(self, name: str) -> Optional[Req]:
        return next((r for r in self.reqs if r.name == name), None)


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
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
                out.append(Req(normalize(r.name), str(r.specifier), rel))

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
            groups = doc.get("dependency-groups") if isinstance(doc.get("dependency-groups"), dict) else {}
            return {"project": True, "dependencies": [str(d) for d in proj.get("dependencies") or []],
                    "optional": {str(k): [str(d) for d in v] for k, v in opt.items() if isinstance(v, list)},
                    "dynamic": [str(d) for d in proj.get("dynamic") or []], "name": str(proj.get("name") or ""),
                    "groups": {str(k): [str(d) for d in v if isinstance(d, str)] for k, v in groups.items()
                               if isinstance(v, list)}}
    has = re.search(r"(?m)^\s*\[project\]\s*$", text) is not None
    optional: dict = {}
    m = re.search(r"(?ms)^\s*\[project\.optional-dependencies\]\s*$(.*?)(?=^\s*\[|\Z)", text)
    if m:
        optional = {k: [] for k in re.findall(r"(?m)^\s*([A-Za-z0-9_.-]+)\s*=", m.group(1))}
    return {"project": has, "dependencies": [], "optional": optional, "dynamic": [], "name": "", "groups": {}}


def read_project(facts, settings, scripts: tuple[str, ...] | list[str] = ()) -> Project:
    """What setup installs, from the project's files (the host's: setup's HostFacts; this machine's: LocalFiles for
    the local plan; the same function, so the plan says what setup does, issue 42): a uv lock with a [project]
    pyproject -> `uv sync --locked`; requirements files -> `-r` each (whenever they exist, unless a lock decides); a
    [project] pyproject without a lock -> the project, editable, after the requirements (with setup.extras, also
    when a requirements file installs the folder by `-e .` without them); the `# /// script` block (PEP 723) of each
    of `scripts` (their texts in facts.texts) -> its dependencies. `Project.lines` is every requirement so installed,
    with the file that names it."""
    from packaging.requirements import InvalidRequirement, Requirement

    pp = with_setup_py(parse_pyproject(facts.texts.get("pyproject.toml")), facts.texts.get("setup.py"))
    env = marker_env(facts)
    reqs_files = [r for r in settings.requirements if r in facts.files]
    want_extras = settings.extras
    p = Project("none")
    folder: list[tuple[str, str]] = []  # what installing the folder brings: (source, requirement)

    def of_folder(extras) -> list[tuple[str, str]]:
        return [(pp.get("source", {}).get(d, "pyproject.toml"), d)
                for d in pp["dependencies"] + [d for e in extras for d in pp["optional"].get(e, [])]]

    def take(items) -> None:
        for source, line in items:
            try:
                r = Requirement(line)
            except InvalidRequirement:
                continue
            if _applies(r, env):
                p.lines.append((source, line))
                p.reqs.append(Req(normalize(r.name), str(r.specifier), source))

    if "pyproject.toml" in facts.files and pp["project"]:
        p.all_extras = want_extras == "all"
        p.extras = sorted(pp["optional"]) if p.all_extras else list(want_extras)
        unknown = [e for e in p.extras if pp["optional"] and e not in pp["optional"]]
        if unknown:
            p.notes.append(f"setup.extras names {', '.join(unknown)}, which pyproject.toml does not define "
                           f"(it defines: {', '.join(pp['optional']) or 'none'})")
        folder = of_folder(p.extras)
        p.kind = "uv-lock" if "uv.lock" in facts.files else "pyproject"
        if p.kind == "uv-lock" and reqs_files:
            p.notes.append(f"{', '.join(reqs_files)} not installed: uv.lock decides the environment")
    elif "pyproject.toml" in facts.files and reqs_files:
        p.notes.append("pyproject.toml has no [project] table (it configures tools): the requirements are installed, "
                       "not the folder")
    elif "uv.lock" in facts.files:
        p.notes.append("uv.lock without a [project] in pyproject.toml: nothing to sync")
    if want_extras and not pp["project"]:
        p.notes.append("setup.extras is set but the project has no [project] table to take extras from")
    if reqs_files and p.kind != "uv-lock":
        p.requirements = reqs_files
        if p.kind == "none":
            p.kind = "requirements"
        for rf in reqs_files:
            p.lines += [(rel, line) for rel, line in requirement_lines(facts.texts, rf, env)]
            p.reqs += parse_requirements(facts.texts, rf, env)
    itself = next((x for x in (installs_itself(facts.texts, r) for r in p.requirements) if x), None)
    if itself:  # `-e .` (or `.[extra]`) in a requirements file installs the folder, with the extras on that line
        on_line = self_extras(facts.texts, itself)
        wanted = [e for e in p.extras if e not in on_line] if p.kind == "pyproject" else []
        if wanted:  # setup.extras the line does not name: setup installs the folder once more, with them
            p.editable = "." + f"[{','.join(p.extras)}]"
        folder = of_folder(list(dict.fromkeys(on_line + (p.extras if p.kind == "pyproject" else []))))
    elif p.kind == "pyproject":
        p.editable = "." + (f"[{','.join(p.extras)}]" if p.extras else "")
    take(folder)
    for script in scripts:  # PEP 723: setup installs a script's own block
        block = script_block(facts.texts.get(script))
        if block and block["dependencies"]:
            p.blocks[script] = list(block["dependencies"])
            take([(f"{script}'s script block", d) for d in block["dependencies"]])
            if p.kind == "none":
                p.kind = "script"
    if p.kind != "uv-lock":
        for miss in facts.missing:
            p.notes.append(f"a requirements file includes {miss}, which is not on the host (sync it, or fix the -r "
                           "line)")
    return p


def self_extras(texts: dict[str, str], rel: str) -> list[str]:
    """The extras of the line of requirements file `rel` that installs the folder itself (`-e .[a,b]` -> [a, b])."""
    for line in texts.get(rel, "").replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if SELF.match(line):
            found = re.findall(r"\[([^\]]*)\]", line)
            return [e.strip() for e in (found[0].split(",") if found else []) if e.strip()]
    return []


# -- what setup cannot install or run (issue #28) --------------------------------------------------------------------
SELF = re.compile(r"^\s*(?:(?:-e|--editable)(?:\s*=\s*|\s+))?(?:file:)?\.(?:/)?(?:\[[^\]]*\])?\s*(?:#.*)?$")


def _lines(texts: dict[str, str], start: str):
    """(file, line) of a requirements file and of the files it includes with -r, depth first, each file once; a
    line without its comment, continuations joined."""
    import posixpath

    seen: set[str] = set()

    def walk(rel: str):
        rel = posixpath.normpath(rel)
        if rel in seen or rel not in texts:
            return
        seen.add(rel)
        for raw in texts[rel].replace("\\\n", " ").splitlines():
            line = raw.split(" #", 1)[0].strip()
            m = _INCLUDE.match(line)
            if m and m.group(1) in ("-r", "--requirement"):
                yield from walk(posixpath.join(posixpath.dirname(rel), m.group(2)))
            else:
                yield rel, line

    yield from walk(start)


def installs_itself(texts: dict[str, str], start: str) -> Optional[str]:
    """The requirements file (start, or one it includes with -r) that installs the project folder itself (`-e .`,
    `.`, `-e .[extra]`), or None."""
    import posixpath

    return next((rel for rel, line in _lines(texts, start)
                 if posixpath.dirname(rel) in ("", ".") and SELF.match(line)), None)


_EXTRA_INDEX = re.compile(r"^--extra-index-url(?:\s*=\s*|\s+)\S")


def names_extra_index(texts: dict[str, str], start: str) -> Optional[str]:
    """The requirements file (start, or one it includes with -r) with an --extra-index-url line, or None: several
    indexes, which pip searches all of for the best version, and uv by default only up to the first that has the
    package."""
    return next((rel for rel, line in _lines(texts, start) if _EXTRA_INDEX.match(line)), None)


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


# -- setup.py, read with ast (never run) ------------------------------------------------------------------------------
def _literal(node, names: dict):
    """A literal value of setup.py: a constant, list, tuple, dict, a module-level name bound to one, or a sum of
    lists; None when it is computed."""
    import ast

    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left, names), _literal(node.right, names)
        return a + b if isinstance(a, list) and isinstance(b, list) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e, names) for e in node.elts]
        return None if any(i is None for i in items) else [x for i in items for x in (i if isinstance(i, list)
                                                                                       else [i])]
    if isinstance(node, ast.Dict):
        keys = [_literal(k, names) if k is not None else None for k in node.keys]
        vals = [_literal(v, names) for v in node.values]
        if any(not isinstance(k, str) for k in keys) or any(v is None for v in vals):
            return None
        return {k: (v if isinstance(v, list) else [v]) for k, v in zip(keys, vals)}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Starred):
        return _literal(node.value, names)
    return None


def setup_py(text: Optional[str]) -> Optional[dict]:
    """{"install_requires": [...], "extras_require": {extra: [...]}, "reads": [files], "computed": [keywords]} of a
    setup.py, read with `ast` (never run): the `setup(...)` call's keywords as literals, through module-level names
    bound to literals (`VLLM = ["vllm"]; extras_require={"vllm": VLLM}`). A value built at run time (read from a
    file, computed) is named in "computed", and the requirements files the script names in "reads". None: no setup.py
    or one that does not parse."""
    import ast

    if not text:
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    names: dict = {}
    out: dict = {"install_requires": [], "extras_require": {}, "reads": [], "computed": []}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            value = _literal(node.value, names)
            if value is not None:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        names[t.id] = value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"[\w./-]*requirements[\w./-]*\.(txt|in)", node.value):
            out["reads"].append(node.value)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "setup"
                                                or getattr(node.func, "attr", None) == "setup")):
            continue
        for kw in node.keywords:
            if kw.arg not in ("install_requires", "extras_require"):
                continue
            value = _literal(kw.value, names)
            if kw.arg == "install_requires" and isinstance(value, list):
                out["install_requires"] = [str(v) for v in value]
            elif kw.arg == "extras_require" and isinstance(value, dict):
                out["extras_require"] = {str(k): [str(x) for x in v] for k, v in value.items()}
            else:
                out["computed"].append(kw.arg)
    out["reads"] = list(dict.fromkeys(out["reads"]))
    return out


def with_setup_py(pp: dict, setup_text: Optional[str]) -> dict:
    """parse_pyproject's answer with what setup.py gives where pyproject.toml says it is `dynamic` (or, for a
    project with no [project] table, what setup.py declares): "source" maps each such requirement to "setup.py"."""
    sp = setup_py(setup_text)
    if not sp:
        return pp
    pp = dict(pp)
    dynamic = set(pp.get("dynamic") or []) if pp["project"] else {"dependencies", "optional-dependencies"}
    source = dict(pp.get("source") or {})
    if "dependencies" in dynamic:
        pp["dependencies"] = list(pp["dependencies"]) + sp["install_requires"]
        source.update({d: "setup.py" for d in sp["install_requires"]})
    if "optional-dependencies" in dynamic:
        pp["optional"] = {**sp["extras_require"], **pp["optional"]}
        source.update({d: f"setup.py's extra {e}" for e, ds in sp["extras_require"].items() for d in ds})
    pp["source"] = source
    return pp


# -- PEP 723: a script's own dependencies ---------------------------------------------------------------------------
SCRIPT_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)[ \t]*\r?$\n(?P<content>(?:^#(?:| .*)\r?$\n)*?)^# ///[ \t]*\r?$")


def script_block(text: Optional[str]) -> Optional[dict]:
    """A Python script's `# /// script` block (PEP 723: packaging.python.org/en/latest/specifications/
    inline-script-metadata): {"dependencies": [...], "requires-python": str | None}, or None without one (or with
    one that is not valid TOML)."""
    if not text:
        return None
    for m in SCRIPT_BLOCK.finditer(text):
        if m.group("type") != "script":
            continue
        body = "".join(line[2:] if line.startswith("# ") else line[1:]
                       for line in m.group("content").splitlines(keepends=True))
        try:
            import tomllib
        except ImportError:  # Python 3.10: the dependency array's quoted strings
            deps = re.findall(r'"([^"]+)"', "".join(re.findall(r"(?s)dependencies\s*=\s*\[(.*?)\]", body)))
            rp = re.search(r'requires-python\s*=\s*"([^"]+)"', body)
            return {"dependencies": deps, "requires-python": rp.group(1) if rp else None}
        try:
            doc = tomllib.loads(body)
        except ValueError:
            return None
        deps = doc.get("dependencies") if isinstance(doc.get("dependencies"), list) else []
        return {"dependencies": [str(d) for d in deps], "requires-python": doc.get("requires-python")}
    return None


# -- index lines ----------------------------------------------------------------------------------------------------
INDEX_OPTION = re.compile(r"^(--index-url|-i|--extra-index-url|--find-links|-f|--no-index)(?:(?:\s*=\s*|\s+)(\S+))?\s*$")


def index_lines(texts: dict[str, str], start: str) -> list[str]:
    """The index options of a requirements file and the files it includes with -r, as `--option value` lines, each
    once: what pip (and uv, given them) searches besides or instead of PyPI."""
    out: list[str] = []
    for _, line in _lines(texts, start):
        m = INDEX_OPTION.match(line)
        if m:
            opt = {"-i": "--index-url", "-f": "--find-links"}.get(m.group(1), m.group(1))
            text = f"{opt} {m.group(2)}" if m.group(2) else opt
            if text not in out:
                out.append(text)
    return out


def opaque_lines(texts: dict[str, str], start: str) -> list[tuple[str, str]]:
    """(file, line) of what a requirements file installs that names no distribution here: a path, a URL, a VCS
    checkout, `-e` of another folder (what they install is known only once installed)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for rel, line in _lines(texts, start):
        if not line or line.startswith("#") or INDEX_OPTION.match(line) or _INCLUDE.match(line) or SELF.match(line):
            continue
        if line.startswith("-") and not line.startswith(("-e", "--editable")):
            continue
        try:
            r = Requirement(line)
            if r.url is None:
                continue
        except InvalidRequirement:
            pass
        out.append((rel, line))
    return out


def requirement_lines(texts: dict[str, str], start: str, env: Optional[dict] = None) -> list[tuple[str, str]]:
    """(file, PEP 508 string) of every requirement a requirements file installs (its -r includes followed; options,
    paths and URLs without a name left out; markers that do not hold in `env` left out)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for rel, line in _lines(texts, start):
        if not line or line.startswith(("#", "-")):
            continue
        try:
            r = Requirement(line)
        except InvalidRequirement:
            continue
        if r.url is not None:
            continue
        if _applies(r, env):
            out.append((rel, line))
    return out


# -- a project folder on this machine ---------------------------------------------------------------------------------
DEPENDENCY_FILES = ("uv.lock", "pyproject.toml", "setup.py", "setup.cfg", "poetry.lock", "pdm.lock", "environment.yml",
                    "environment.yaml")
OTHER_REQUIREMENTS = ("requirements*.txt", "requirements/*.txt", "*/requirements*.txt", "requirements*.in")


@dataclass
class LocalFiles:
    """A project's dependency files read on this machine, in the shape setup's HostFacts has them (files, texts,
    missing), with the python and machine the markers are judged for."""
    files: dict[str, str] = field(default_factory=dict)  # name -> "" (present)
    texts: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    env_python_version: Optional[str] = None
    base_python_version: Optional[str] = None
    arch: Optional[str] = None
    others: list[str] = field(default_factory=list)  # requirements files setup is not told to install


def local_files(project, requirements: list[str], python: Optional[str] = None,
                arch: Optional[str] = None) -> LocalFiles:
    """The dependency files of a project folder: the known ones, the requirements files setup installs and every
    file they include (-r, -c), and the other requirements files it has (requirements/*.txt, ...)."""
    import posixpath
    from pathlib import Path

    root = Path(project)
    lf = LocalFiles(env_python_version=python, base_python_version=python, arch=arch)

    def take(rel: str) -> bool:
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        lf.files[rel] = ""
        lf.texts[rel] = text
        return True

    for name in DEPENDENCY_FILES:
        if name in ("uv.lock", "poetry.lock", "pdm.lock"):
            if (root / name).is_file():
                lf.files[name] = ""
        else:
            take(name)
    todo = [r for r in requirements]
    others = sorted({p.relative_to(root).as_posix() for pat in OTHER_REQUIREMENTS for p in root.glob(pat)
                     if p.is_file()} - set(requirements))
    seen: set[str] = set()
    while todo:
        rel = posixpath.normpath(todo.pop(0))
        if rel in seen:
            continue
        seen.add(rel)
        if not take(rel):
            if rel not in requirements:
                lf.missing.append(rel)
            continue
        for raw in lf.texts[rel].replace("\\\n", " ").splitlines():
            m = _INCLUDE.match(raw.split(" #", 1)[0].strip())
            if m:
                todo.append(posixpath.join(posixpath.dirname(rel), m.group(2)))
    for rel in others:
        if rel not in seen and take(rel):
            lf.others.append(rel)
    return lf
