"""The local plan's judgement (pure): what setup installs and what the files name elsewhere (`Context`), then each
verdict the plan gives: the project's files (a torch pin the image's torch does not meet, a python the image does
not have, a project setup cannot install), the resolution, every module the job imports, every command it runs and
what a launcher's config file asks for. Knowledge: playbooks/modules.yaml (module -> distribution, console scripts,
what torch brings), playbooks/knowledge.yaml torch_companions (torchvision and torchaudio per torch)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .read import (index_lines, installs_itself, opaque_lines, normalize, python_meets, requires_python,
                   tool_project, tool_refusal, with_setup_py, parse_pyproject, marker_env,
                   parse_requirements)
from .verdict import ModuleVerdict, Plan

if TYPE_CHECKING:
    from .images import Image
    from .needs import JobNeeds

CONDA_SWITCH = re.compile(r"(^|[\s;&|(])(conda|mamba|micromamba)\s+(activate|run)\b", re.M)


# -- knowledge ------------------------------------------------------------------------------------------------------
def _row(module: str, table: list[dict]) -> dict:
    return next((r for r in table or [] if str(r.get("module")) == module), {})


def distributions(module: str, table: list[dict]) -> list[str]:
    """The distributions that provide an import name (modules.yaml), the first the one to add; else the name."""
    row = _row(module, table)
    return [str(row["distribution"]), *[str(a) for a in row.get("also") or []]] if row else [module]


def namespaces(table: list[dict]) -> list[str]:
    return [str(r["module"]) for r in table or [] if "." in str(r.get("module", ""))]


def builds_against_torch(module: str, table: list[dict]) -> bool:
    return _row(module, table).get("setup") == "expect.packages"


def torch_brings(module: str, tables: dict) -> bool:
    return module.split(".")[0] in set((tables.get("torch_brings") or {}).get("modules") or [])


NAME_FORMS = ("{}", "{}-py", "py{}", "py-{}", "python-{}", "{}-python")  # absl-py, pyyaml, python-dotenv, ...


def provider(module: str, dists, table: list[dict]) -> Optional[str]:
    """The distribution of `dists` (normalized names) that provides `module`, as far as modules.yaml and the names
    tell (the module's own name, or the usual forms of a distribution around it: absl-py for absl, beaker-py for
    beaker); None."""
    top = module.split(".")[0]
    for cand in [*distributions(module, table), *(f.format(top) for f in NAME_FORMS)]:
        if normalize(cand) in dists:
            return normalize(cand)
    return None


def console_script(command: str, tables: dict) -> Optional[dict]:
    return next((r for r in tables.get("console_scripts") or [] if str(r.get("command")) == command), None)


# -- what setup installs, and what the files name elsewhere ------------------------------------------------------------
@dataclass
class Context:
    project: Path
    tables: dict
    image: Optional["Image"]
    settings: object
    kind: str = "none"
    requirements: list[str] = field(default_factory=list)  # PEP 508 strings setup installs
    installed: dict[str, str] = field(default_factory=dict)  # normalized name -> the file that names it
    pins: list[tuple[str, str, str]] = field(default_factory=list)  # (name, specifier, file) of what setup installs
    elsewhere: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (where, fix)
    index_lines: list[str] = field(default_factory=list)
    lock: Optional[str] = None
    extras: list[str] = field(default_factory=list)
    add_to: str = "requirements.txt"  # where a missing distribution is added
    opaque: list[tuple[str, str]] = field(default_factory=list)  # (file, line): a path, URL or VCS requirement
    pyproject: dict = field(default_factory=dict)
    locked: set = field(default_factory=set)  # every distribution uv.lock names (any platform, extra or group)
    extra_of: dict[str, list[str]] = field(default_factory=dict)  # name -> the project's extras that list it
    extras_file: str = "pyproject.toml"  # where the extras are declared (setup.py's extras_require, or pyproject)

    @classmethod
    def of(cls, project: Path, lf, proj, jn: "JobNeeds", settings, tables: dict, image) -> "Context":
        c = cls(project, tables, image, settings, kind=proj.kind, extras=list(proj.extras))
        env = marker_env(lf)
        c.pyproject = with_setup_py(parse_pyproject(lf.texts.get("pyproject.toml")), lf.texts.get("setup.py"))
        for rf in proj.requirements:
            c.opaque += opaque_lines(lf.texts, rf)
            c.index_lines += [x for x in index_lines(lf.texts, rf) if x not in c.index_lines]
        c._add(proj.lines)  # what setup installs: read_project decides it for the plan and for setup alike
        if proj.kind in ("pyproject", "uv-lock"):
            c.add_to = "pyproject.toml's [project] dependencies"
            if proj.kind == "uv-lock":
                c.lock = str(project / "uv.lock")
                c.locked = {normalize(n) for n in re.findall(r'(?m)^name\s*=\s*"([^"]+)"', _text(project / "uv.lock")
                                                            or "")}
        elif proj.requirements:
            c.add_to = proj.requirements[0]
        c._elsewhere(lf, proj, env)
        return c

    def _add(self, items) -> None:
        from packaging.requirements import InvalidRequirement, Requirement

        for source, line in items:
            try:
                r = Requirement(line)
            except InvalidRequirement:
                continue
            name = normalize(r.name)
            if line not in self.requirements:
                self.requirements.append(line)
            self.installed.setdefault(name, source)
            self.pins.append((name, str(r.specifier), source))

    def _elsewhere(self, lf, proj, env) -> None:
        from packaging.requirements import InvalidRequirement, Requirement

        pp = self.pyproject

        def put(line: str, where: str, fix: str) -> None:
            try:
                name = normalize(Requirement(line).name)
            except InvalidRequirement:
                return
            if name not in self.installed:
                self.elsewhere.setdefault(name, (where, fix))

        installs_folder = proj.kind in ("pyproject", "uv-lock") or any(
            installs_itself(lf.texts, r) for r in proj.requirements)
        for extra, deps in (pp.get("optional") or {}).items():
            for d in deps:
                where = pp.get("source", {}).get(d) or f"pyproject.toml's extra {extra}"
                try:
                    self.extra_of.setdefault(normalize(Requirement(d).name), []).append(extra)
                    self.extras_file = where.split("'s ", 1)[0] if "'s " in where else self.extras_file
                except InvalidRequirement:
                    pass
                if installs_folder:
                    put(d, where, f"add it to the profile's setup.extras (setup: {{extras: [{extra}]}}), so "
                                  f"setup installs the extra {extra}")
                else:
                    put(d, where, f"write a requirements.txt holding `-e .[{extra}]` (setup then installs the "
                                  f"folder with its extra {extra})")
        if not installs_folder and "setup.py" in lf.texts:
            for d in pp["dependencies"]:
                put(d, "setup.py's install_requires", "setup does not install the folder (it has no pyproject.toml "
                    "[project] table, and no requirements file installs it): write a requirements.txt holding "
                    "`-e .` (setup then installs the folder and setup.py's install_requires)")
        for group, deps in (pp.get("groups") or {}).items():
            if proj.kind == "uv-lock" and group == "dev":
                continue  # `uv sync` installs the dev group
            for d in deps:
                put(d, f"pyproject.toml's dependency group {group}", "move it to [project] dependencies (setup "
                    "installs the [project] table, not dependency groups)")
        for rel in lf.others:
            for r in parse_requirements(lf.texts, rel, env):
                wanted = ", ".join([*self.settings.requirements, rel])
                put(r.name + r.spec, rel, f"name it in the profile's setup.requirements (setup: {{requirements: "
                                          f"[{wanted}]}}): setup installs {', '.join(self.settings.requirements)} "
                                          "only")


def _text(path: Optional[Path]) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace") if path else None
    except OSError:
        return None


def run_file(project: Path, run) -> Optional[Path]:
    script = run.via[0] if run.via else ""
    sh_dir = Path(script).parent.as_posix() if script else ""
    for d in dict.fromkeys([run.cwd, "" if sh_dir == "." else sh_dir, ""]):
        if d is None:
            continue
        f = project / d / run.target if d else project / run.target
        if f.is_file():
            return f
    return None


# -- the project's files ----------------------------------------------------------------------------------------------
def project_problems(plan: "Plan", c: Context, images_doc: dict) -> None:
    from .read import parse_pyproject as pp_of

    if plan.image is None:  # a host already up: its python and tools are setup's and the gate's to judge
        _nothing_installed(plan, c)
        return
    files = set(f for f in (c.project / n for n in ("uv.lock", "pyproject.toml", "poetry.lock", "pdm.lock",
                                                       "environment.yml", "environment.yaml", *c.settings.requirements))
                if f.is_file())
    names = {f.relative_to(c.project).as_posix() for f in files}
    pyproject = _text(c.project / "pyproject.toml") if "pyproject.toml" in names else None
    tp = tool_project(names, pyproject, list(c.settings.requirements), images_doc.get("project_tools") or [])
    if tp is not None and not tp.installable:
        problem, hint = tool_refusal(tp, list(c.settings.requirements))
        plan.certain.append((problem, "fix: " + hint))
    images = {str(i.get("family")): i for i in images_doc.get("images") or [] if isinstance(i, dict)}
    launched = [images[f] for f in images_doc.get("launched") or [] if f in images]
    spec = requires_python(pyproject) if pp_of(pyproject)["project"] else None
    image_python = str(c.settings.base_python or "python3") in ("python3", "python", "/usr/bin/python3")
    if spec and launched and image_python:
        misses = [i for i in launched if python_meets(spec, str(i.get("python"))) is False]
        said = ", ".join(f"{i['family']}: {i['python']}" for i in misses)
        if len(misses) == len(launched):
            plan.certain.append((f"pyproject.toml says requires-python = \"{spec}\", and the python of the image a "
                                 f"launch boots does not meet it ({said})",
                                 "fix: lower requires-python if the code runs on that python (the image's python "
                                 "has the CUDA torch); the images' pythons are in playbooks/images.yaml"))
        elif misses:
            plan.warnings.append(f"pyproject.toml says requires-python = \"{spec}\", which the python of some images "
                                 f"a launch may boot does not meet ({said}): setup refuses such an instance before "
                                 "it installs anything")
    if launched and not any(i.get("conda") for i in launched):
        for s in plan.scripts:
            m = CONDA_SWITCH.search(_text(c.project / s) or "")
            if m:
                plan.certain.append((f"{s} runs `{m.group(2)} {m.group(3)}`, and the images a launch boots have no "
                                     f"{m.group(2)}", "fix: drop that line: the job runs in the run's environment "
                                     "(setup installs the project's requirements into it, and its bin/ is first on "
                                     "the job's PATH)"))
                break
    _torch_pins(plan, c)
    _nothing_installed(plan, c)


def _nothing_installed(plan: "Plan", c: Context) -> None:
    if not c.requirements and not c.lock:
        named = sorted({where for where, _ in c.elsewhere.values()})
        if named:
            fix = next(f for w, f in c.elsewhere.values() if w == named[0])
            plan.warnings.append(f"setup installs nothing from this project, and {', '.join(named)} name(s) its "
                                 f"dependencies (fix: {fix})")


def _torch_pins(plan: "Plan", c: Context) -> None:
    """A direct pin of torch (or a torchvision/torchaudio that belongs to another torch) that the image's torch does
    not meet: setup would install another torch over the image's. Judged with no network."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    have = (c.image.packages.get("torch") if c.image else None) or ""
    if not have:
        return
    try:
        v = Version(have)
    except InvalidVersion:
        return
    mm = f"{v.major}.{v.minor}"
    family = next((r for r in c.tables.get("torch_family") or [] if str(r.get("torch")) == mm), None)
    for name, spec, source in c.pins:
        if not spec:
            continue
        try:
            ss = SpecifierSet(spec)
        except InvalidSpecifier:
            continue
        if name == "torch" and not ss.contains(v, prereleases=True):
            plan.refusals.append((f"{source} pins torch{spec}, which the image's torch {have} does not meet: setup "
                                  f"would install another torch (with its CUDA libraries, gigabytes) over the "
                                  f"image's", f"fix: drop the pin, or pin torch=={v.public} (the image's); to "
                                  "install that torch on purpose, --force"))
        elif name in ("torchvision", "torchaudio") and family and family.get(name):
            want = str(family[name])
            ok = any(ss.contains(f"{want}.{p}", prereleases=True) for p in range(0, 10))
            if not ok:
                plan.refusals.append((f"{source} pins {name}{spec}, which belongs to another torch than the image's "
                                      f"{have}: installing it would replace the image's torch",
                                      f"fix: pin {name}=={want}.* (the one that matches torch {mm}), or drop the "
                                      "pin; to install another torch on purpose, --force"))


# -- the resolution ------------------------------------------------------------------------------------------------------
def resolution_verdict(plan: "Plan", c: Context) -> None:
    r = plan.resolution
    if r is None:
        return
    if not r.available:
        if c.requirements or c.lock:
            plan.hints.append(f"no resolution here ({r.why or 'unavailable'}): the modules the job imports are "
                              "judged against the names the project's files declare; the instance is asked the "
                              "rest before the job starts (the launch gate)")
        return
    if r.refusal and not (r.refusal[0].startswith("the requirements pin") and
                          any(" pins torch" in p for p, _ in plan.refusals)):  # said already, naming its file
        plan.refusals.append((r.refusal[0], r.refusal[1] if r.refusal[1].startswith("fix") else
                              "fix: " + r.refusal[1]))
    for name, old, new in r.replaces_image:
        plan.warnings.append(f"unpinned, pip alone would replace the image's {name} {old} with {new}: setup installs "
                             f"with the plan's pins instead, which keep the image's {name}")
    plan.hints += [f"resolved: {f}" for f in r.fixes]
    for b in r.builds:
        plan.hints.append(f"{b.get('name')}: {b.get('how')}" + (f" ({b['why']})" if b.get("why") else ""))


def provided_set(plan: "Plan", c: Context) -> tuple[set[str], bool]:
    """(the distributions the job's environment will have, whether that set is resolved): the resolution's and the
    image's, else the names setup installs (declared) and the image's."""
    image = {normalize(n) for n in (c.image.packages if c.image else {})}
    r = plan.resolution
    if r is not None and r.available and not r.refusal:  # a refused resolution is no set of packages
        got = {normalize(n) for n in (*r.packages, *(getattr(r, "resolved", None) or {}))}
        return got | image | set(c.installed), True
    return set(c.installed) | image, False


# -- modules, commands, launcher configs ---------------------------------------------------------------------------------
def _fix_add(c: Context, dist: str, source: str) -> str:
    where = c.add_to
    if not c.requirements and not c.lock and (c.project / "setup.py").is_file() and c.kind == "none":
        return (f"fix: setup does not install this folder (a setup.py, and no pyproject.toml [project] table nor "
                f"requirements file): write a requirements.txt holding `-e .` (setup then installs the folder with "
                f"setup.py's install_requires), and add {dist} there if setup.py does not name it")
    if "script block" in source or (c.kind == "none" and c.requirements and
                                    all("script block" in s for s in c.installed.values())):
        where = "the script's `# /// script` block"
    return f"fix: add {dist} to {where}"


def judge_module(plan: "Plan", c: Context, module: str, who: str, provided: set[str], resolved: bool,
                 stdlib: set[str], shown: Optional[str] = None, verb: str = "imports"):
    """One module's verdict (a ModuleVerdict) and, when it is missing, the refusal or warning it makes."""
    table = c.tables.get("modules") or []
    top = module.split(".")[0]
    shown = shown or module
    said = f"{who} {verb} {shown}"
    if top in stdlib:
        return ModuleVerdict(module, who, "stdlib")
    if c.image is None and not resolved:  # a host whose packages are not known here: the gate asks it
        return ModuleVerdict(module, who, "unknown")
    image = {normalize(n) for n in (c.image.packages if c.image else {})}
    p = provider(module, image, table)
    if p:
        return ModuleVerdict(module, who, "image", p)
    if torch_brings(module, c.tables) and ("torch" in provided):
        return ModuleVerdict(module, who, "torch", "torch")
    system = set((c.tables.get("system_python") or {}).get("modules") or [])
    p = provider(module, provided, table)
    if p and not (builds_against_torch(module, table) and p in c.installed and not resolved):
        return ModuleVerdict(module, who, "installed", p)
    dists = distributions(module, table)
    if builds_against_torch(module, table):
        if any(normalize(d) in {normalize(k) for k in c.settings.expect_packages} for d in dists):
            return ModuleVerdict(module, who, "setup", dists[0])
        if p:  # a requirements line: setup's installer builds it, in isolation, against whatever torch it picks
            plan.warnings.append(f"{c.installed.get(p, 'a requirements file')} names {p}, which builds against "
                                 f"torch: name it in the profile's expect.packages instead ({p}: \"*\" or a version), "
                                 "and setup installs a prebuilt wheel that matches the image's torch, CUDA and "
                                 "python, else builds it with --no-build-isolation")
            return ModuleVerdict(module, who, "installed", p)
        problem = f"{said}, which nothing setup installs provides"
        fix = (f"fix: {dists[0]} is built for the exact torch, CUDA and python: name it in the profile's "
               f"expect.packages ({dists[0]}: \"*\" or a version), and gpuops setup installs a prebuilt wheel that "
               "matches them, else builds it with --no-build-isolation")
        (plan.refusals.append((problem, fix)) if resolved else plan.warnings.append(f"{problem} ({fix})"))
        return ModuleVerdict(module, who, "missing", dists[0])
    hit = next((normalize(d) for d in dists if normalize(d) in c.elsewhere), None)
    if hit:
        where, fix = c.elsewhere[hit]
        problem = f"{said}, which the project lists only in {where}, which setup does not install"
        if resolved:
            plan.refusals.append((problem, "fix: " + fix))
        else:
            plan.warnings.append(f"{problem} (fix: {fix})")
        return ModuleVerdict(module, who, "elsewhere", hit)
    p = provider(module, c.locked, table)
    if p:  # the lock decides (a git source, a group, a platform the export left out): the instance is asked
        return ModuleVerdict(module, who, "installed", p)
    near = sorted(d for d in provided | c.locked if normalize(top) in d and d != normalize(top))
    if near:  # ai2-olmo-core provides olmo_core: a name that holds the module's may be its distribution
        plan.warnings.append(f"{said}; no distribution is known to provide it, and {', '.join(near[:3])} may (if not, "
                             f"the job stops at import; the instance is asked before the job starts)")
        return ModuleVerdict(module, who, "unknown", near[0])
    if top in system:  # the image's system python may have it (a Debian package): never refused
        plan.warnings.append(f"{said}, which no dependency file names: the image's system python may have it (a "
                             f"Debian package); {_fix_add(c, dists[0], who)[5:]} to be sure")
        return ModuleVerdict(module, who, "system", dists[0])
    if resolved:
        plan.refusals.append((f"{said}, which nothing setup installs provides (the plan resolved "
                              f"{len(plan.resolution.packages)} package(s) for {c.image.name if c.image else 'the image'}"
                              "; none of them, nor the image, provides it)",
                              _fix_add(c, dists[0], who) + " (if a dependency provides it under another name, or "
                              "the image's python has it, a row in playbooks/modules.yaml or images.yaml says so; "
                              "--force launches anyway)"))
        return ModuleVerdict(module, who, "missing", dists[0])
    plan.warnings.append(f"{said}, which no dependency file names: unless a dependency brings it, "
                         f"the job stops at import ({_fix_add(c, dists[0], who)}); the instance is asked before the "
                         "job starts")
    return ModuleVerdict(module, who, "unknown", dists[0])


def modules_verdict(plan: "Plan", c: Context, jn: "JobNeeds", stdlib: set[str]) -> None:
    provided, resolved = provided_set(plan, c)
    for n in jn.needs:
        if n.local:
            plan.modules.append(ModuleVerdict(n.shown, n.source, "project", n.local))
            continue
        plan.modules.append(judge_module(plan, c, n.module, n.source, provided, resolved, stdlib, n.shown, n.how))


def commands_verdict(plan: "Plan", c: Context, jn: "JobNeeds") -> None:
    provided, resolved = provided_set(plan, c)
    if c.image is None and not resolved:
        return
    said: set[tuple[str, str]] = set()
    for run in jn.commands:
        if (run.target, run.source) in said:
            continue
        said.add((run.target, run.source))
        row = console_script(run.target, c.tables)
        if row is None:
            continue  # a command gpuops does not know as a console script: a system tool, never judged
        dist = normalize(str(row["distribution"]))
        if dist in provided:
            continue
        problem = f"{run.source or plan.script} runs {run.target}, {row['distribution']}'s console script, which " \
                  "nothing setup installs provides"
        fix = _fix_add(c, str(row["distribution"]), run.source)
        if dist in c.elsewhere:
            fix = "fix: " + c.elsewhere[dist][1]
            problem += f" (the project lists {dist} only in {c.elsewhere[dist][0]})"
        if resolved:
            plan.refusals.append((problem, fix))
        else:
            plan.warnings.append(f"{problem} ({fix})")


def bare_files(plan: "Plan", jn: "JobNeeds", project: Path) -> None:
    """A line that names a file of the project as a command (`prepare.py`, `train.sh`, without `./` or an
    interpreter): the shell looks it up on PATH, which holds no project folder, and stops there (`not found`, exit
    127) on any host. Refused with the line that works (--force passes: a PATH of the host's own may have it)."""
    said = set()
    for run in jn.commands:
        if not run.target.endswith((".py", ".sh", ".bash")) or run.target in said:
            continue
        if not any((project / d / run.target).is_file() for d in dict.fromkeys([run.cwd or "", ""])):
            continue
        said.add(run.target)
        how = "python" if run.target.endswith(".py") else "bash"
        who = run.source or plan.script
        plan.refusals.append((f"{who} runs `{run.line or run.target}`: the shell looks {run.target} up on PATH, "
                              "which holds no folder of the project, and stops there (`not found`, exit 127)",
                              f"fix: run it with its interpreter, `{how} {run.target}`" + (
                                  " (--prep '" + f"{how} {run.target}'" + ")" if who.startswith("--prep") else "")))


def launcher_configs(plan: "Plan", c: Context, jn: "JobNeeds", project: Path) -> None:
    """What a launcher's config asks for: `accelerate launch --config_file X.yaml` with distributed_type DEEPSPEED
    (or --use_deepspeed) needs deepspeed in the job's environment."""
    provided, resolved = provided_set(plan, c)
    if c.image is None and not resolved:
        return
    for run in jn.launch.runs:
        if run.launcher != "accelerate launch":
            continue
        opts = list(run.options)
        why = None
        if "--use_deepspeed" in opts:
            why = "--use_deepspeed"
        for i, o in enumerate(opts):
            name, _, val = o.partition("=")
            if name in ("--config_file", "--config-file") and (val or i + 1 < len(opts)):
                path = val or opts[i + 1]
                f = next((p for p in (project / (run.cwd or "") / path, project / path) if p.is_file()), None)
                text = _text(f) or ""
                if re.search(r"(?m)^\s*distributed_type:\s*['\"]?DEEPSPEED", text):
                    why = f"{path} says distributed_type: DEEPSPEED"
        if why and "deepspeed" not in provided:
            problem = f"{run.source or plan.script} runs accelerate launch, and {why}: nothing setup installs " \
                      "provides deepspeed"
            if resolved or "deepspeed" not in c.elsewhere:
                fix = _fix_add(c, "deepspeed", run.source)
                if any("script block" in s for s in c.installed.values()):
                    fix = "fix: add deepspeed to the script's `# /// script` block"
                (plan.refusals.append((problem, fix)) if resolved else
                 plan.warnings.append(f"{problem} ({fix})"))


def lazy_hints(plan: "Plan", c: Context, jn: "JobNeeds", provided: set[str], stdlib: set[str]) -> None:
    """Modules the job imports only inside a function or a branch (optional by rule: never refused) that nothing
    setup installs provides and only an extra the project declares does (verl's `import vllm` in a function, vllm in
    setup.py's extra vllm): the extras to install, as one hint; a warning for a module the launch line names
    (`rollout.name=vllm`). Imports under `if TYPE_CHECKING:` or with an ImportError fallback are never said."""
    table = c.tables.get("modules") or []
    required = {n.module for n in jn.needs}
    chosen = set(c.extras) | ({"*"} if c.settings.extras == "all" else set())
    found: dict[str, tuple] = {}  # module -> (need, distribution, extra)
    for n in jn.lazy:
        top = n.module.split(".")[0]
        if n.module in required or top in stdlib or top in found or provider(n.module, provided, table):
            continue
        if torch_brings(n.module, c.tables) and "torch" in provided:
            continue
        dist = next((normalize(d) for d in distributions(n.module, table) if normalize(d) in c.extra_of), None)
        if dist is None or "*" in chosen or set(c.extra_of[dist]) & chosen:
            continue
        found[top] = (n, dist, c.extra_of[dist][0])
    quiet = []
    for top, (n, dist, extra) in found.items():
        where = f"{n.source.split(' (', 1)[0]} line {n.line}"
        fix = (f"name {dist} in the profile's expect.packages (it builds against torch)" if
               builds_against_torch(n.module, table) else f"setup.extras [{extra}]")
        named = next((f"{w}` ({r.source or plan.script})" for r in jn.launch.runs for w in r.args
                      if re.search(rf"(^|[^\w]){re.escape(top)}([^\w]|$)", w)), None)
        if named:
            plan.warnings.append(f"the launch line says `{named[:160]}, and {where} imports "
                                 f"{n.dotted or n.module} only when it takes that path; only the project's extra "
                                 f"{extra} ({c.extras_file}) provides {dist}, which setup does not install: the job "
                                 f"would stop at import (ModuleNotFoundError); fix: {fix} (in the profile given with "
                                 "--from)")
        else:
            quiet.append((top, extra, where, fix))
    if quiet:
        plan.hints.append("imported only inside a function or a branch (optional, not refused), provided only by an "
                          f"extra of {c.extras_file} that setup does not install: "
                          + "; ".join(f"{t} ({w}): {f}" for t, _, w, f in quiet)
                          + ". If the job takes that path, it stops at import (ModuleNotFoundError)")
