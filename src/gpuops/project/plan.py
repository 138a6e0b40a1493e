"""The local plan (pure but for reading the project's files and the resolver it is handed): what the job's files
decide, judged on this machine before anything is launched (issue 34).

Built from the launch line (launch.py: every script it reaches, the python runs and commands), the import closure
through the project's own modules at any depth (closure.py), the dependency files (read.py: requirements with their
includes and index lines, pyproject, setup.py, PEP 723 blocks, uv.lock) and a resolution of them for the image
(resolution.py, with the image's packages as constraints). The verdict: refusals, each with its fix; warnings; hints.

A module is judged against the RESOLVED set (what the resolution installs, plus the image's packages, plus what
torch brings), not the names the files declare, so a module a dependency brings (tensordict -> orjson) is never
refused. When no resolution is available (this machine cannot reach the index, uv is missing, a timeout), the plan
says so and falls back: a module no file declares is a warning, and the launch gate asks the instance; the plan
never refuses on a guess. What needs no resolution is refused all the same: Windows line endings in any script the
launch line reaches, an import of a name the project's own package does not have, a torch pin the image's torch
does not meet, a requires-python the image's python does not meet, a project setup cannot install."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from . import dataread, judge
from .images import Image
from .needs import JobNeeds, job_needs_full
from .read import LocalFiles, local_files, read_project
from .resolution import Resolution
from .uvcmd import ResolveRequest
from .verdict import Plan

NEVER_REFUSED = {"pkg_resources", "setuptools", "pip", "wheel", "distutils", "_distutils_hack"}  # the environment has


@dataclass
class Settings:
    """What the profile (or the run's --from template) says of setup: the files it installs, the extras, the
    python it builds the environment from, the packages it installs itself (expect.packages: flash-attn)."""
    requirements: list[str] = field(default_factory=lambda: ["requirements.txt"])
    extras: object = field(default_factory=list)  # a list, or "all"
    base_python: Optional[str] = None
    expect_packages: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_profile(cls, prof) -> "Settings":
        """A profile's (profiles.model.Profile) setup: and expect.packages."""
        return cls(requirements=list(prof.setup.requirements), extras=prof.setup.extras,
                   base_python=prof.setup.base_python, expect_packages=dict(prof.expect.packages))

    @classmethod
    def of(cls, setup: Optional[dict] = None, expect: Optional[dict] = None) -> "Settings":
        setup = setup or {}
        reqs = setup.get("requirements") or ["requirements.txt"]
        return cls(requirements=[reqs] if isinstance(reqs, str) else list(reqs), extras=setup.get("extras") or [],
                   base_python=setup.get("base_python"),
                   expect_packages=dict((expect or {}).get("packages") or {}))


@dataclass(frozen=True)
class RunOptions:
    """What the run says beyond --script that the plan reads: the script's arguments (after --), the preparation's
    command line (`--prep CMD`: judged with the job, first), its outputs (`--prep-out`), and `--data` (a folder of
    the project, relative, or given at all)."""
    args: tuple[str, ...] = ()
    prep: Optional[str] = None
    prep_outs: tuple[str, ...] = ()
    data_dir: Optional[str] = None
    data_given: bool = False


def image_of(images_doc: dict, family: Optional[str] = None, arch: str = "x86_64") -> Optional[Image]:
    """The image a launch boots (the first of images.yaml `launched`), or `family`, as the plan judges against
    (project/images.py: its python, platform, preinstalled packages, the ones kept)."""
    from .images import image_for, launched

    if family:
        return image_for(images_doc, family, arch)
    return next(iter(launched(images_doc, arch)), None)


def with_expected(image: Optional[Image], settings: Settings) -> Optional[Image]:
    """The image as the profile makes it: a torch (torchvision, torchaudio) that expect.packages pins to a version is
    installed by setup on purpose, and the plan resolves against it instead of the image's."""
    import re

    if image is None:
        return None
    pinned = {k: str(v).lstrip("=") for k, v in settings.expect_packages.items()
              if str(k).lower() in ("torch", "torchvision", "torchaudio") and
              re.fullmatch(r"=?=?\d+(\.\d+)*([+.][A-Za-z0-9.]+)?", str(v))}
    return image.with_packages(pinned) if pinned else image


def image_known(images_doc: dict, family: str) -> bool:
    """Does images.yaml list the image's preinstalled packages (then a project that installs nothing is judged
    against them alone)?"""
    row = next((i for i in images_doc.get("images") or [] if isinstance(i, dict) and i.get("family") == family), {})
    return isinstance(row.get("packages"), (dict, list)) and bool(row.get("packages"))


def _runs_json(jn: JobNeeds) -> list[dict]:
    return [{"kind": r.kind, "target": r.target, "launcher": r.launcher, "by": " <- ".join(r.via) or None,
             "line": r.line or None}
            for r in jn.launch.runs]


def build(project: Path, script: str, *, image: Optional[Image], settings: Settings, tables: dict,
          images_doc: Optional[dict] = None, resolver: Optional[Callable[..., Resolution]] = None,
          timeout_s: float = 20.0, run: Optional[RunOptions] = None) -> Plan:
    """The plan for `--script` (relative to the project) on `image` (None: a host whose image is not known here:
    no resolution, the static judgement only). tables: playbooks/modules.yaml. resolver: resolution.resolve (tests
    may hand another real one); None: no resolution. run: the run's arguments, --prep, --prep-out, --data."""
    t0 = time.monotonic()
    run = run or RunOptions()
    image = with_expected(image, settings)
    plan = Plan(script, image=image.name if image else None, python=image.python if image else None, prep=run.prep)
    arch = (image.platform.split("-", 1)[0] if image else None) or None
    lf: LocalFiles = local_files(project, settings.requirements, image.python if image else None, arch)
    jn = job_needs_full(project, script, judge.namespaces(tables.get("modules") or []), prep=run.prep,
                        args=run.args)
    plan.script_blocks = block_scripts(project, jn, lf)
    proj = read_project(lf, settings, plan.script_blocks)  # what setup installs, as setup reads it (issue 42)
    plan.runs, plan.scripts = _runs_json(jn), list(jn.launch.scripts)
    plan.files, plan.depth = len(jn.files), jn.depth
    plan.certain += jn.problems
    plan.warnings += jn.launch.unread
    ctx = judge.Context.of(project, lf, proj, jn, settings, tables, image)
    plan.installs = list(proj.lines)
    plan.declared = list(ctx.requirements)
    plan.index_lines = list(ctx.index_lines)
    judge.project_problems(plan, ctx, images_doc or {})
    if image is not None and ctx.opaque:  # what a path, URL or checkout installs is known once installed
        f, line = ctx.opaque[0]
        plan.resolution = Resolution(available=False, why=f"{f} installs {line}, which names no distribution the plan "
                                                          "can resolve here")
    elif image is not None and resolver is not None and (ctx.requirements or ctx.lock):
        request = ResolveRequest(tuple(ctx.requirements), tuple(ctx.index_lines), lock=ctx.lock,
                                 extras=tuple(ctx.extras))
        try:
            plan.resolution = resolver(request, image, timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - the plan never blocks on its own resolver
            plan.resolution = Resolution(available=False, why=f"the resolver failed: {e}")
    elif image is not None and not (ctx.requirements or ctx.lock) and image_known(images_doc or {}, image.name):
        plan.resolution = Resolution(available=True, install_bytes=0)  # nothing to install: the image's packages
    elif image is not None:
        plan.resolution = Resolution(available=False, why="no resolver" if ctx.requirements else
                                     "nothing to resolve, and images.yaml does not list the image's packages")
    judge.resolution_verdict(plan, ctx)
    stdlib = stdlib_names(image.python if image else None)
    judge.modules_verdict(plan, ctx, jn, stdlib=stdlib)
    judge.commands_verdict(plan, ctx, jn)
    judge.launcher_configs(plan, ctx, jn, project)
    judge.bare_files(plan, jn, project)
    provided, resolved = judge.provided_set(plan, ctx)
    if image is not None or resolved:
        judge.lazy_hints(plan, ctx, jn, provided, stdlib)
    if image is not None:  # a fresh instance has the project's files only; a host already up has its own
        plan.warnings += dataread.warnings(project, jn, prep=run.prep, prep_outs=run.prep_outs,
                                           data_dir=run.data_dir, data_given=run.data_given)
    plan.seconds = time.monotonic() - t0
    return plan


def block_scripts(project: Path, jn: JobNeeds, lf: LocalFiles) -> list[str]:
    """The python scripts the launch line runs that hold a `# /// script` block (relative to the project), their
    texts put in `lf.texts`: setup reads the same files on the host (setup/scripts.py) and installs their blocks."""
    from .read import script_block

    out: list[str] = []
    root = project.resolve()
    for run in jn.launch.runs:
        f = judge.run_file(project, run) if run.kind == "script" else None
        if f is None or not f.resolve().is_relative_to(root):
            continue
        rel = f.resolve().relative_to(root).as_posix()
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if rel not in out and script_block(text):
            lf.texts[rel] = text
            out.append(rel)
    return out


def stdlib_names(python: Optional[str]) -> set[str]:
    """The standard library's top-level modules as this python knows them (a module the image's older or newer
    python lacks is counted in: never a refusal), with tomllib only from 3.11."""
    names = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    if python and tuple(int(x) for x in python.split(".")[:2] if x.isdigit()) < (3, 11):
        names.discard("tomllib")
    return names | NEVER_REFUSED


def tables(project: Optional[Path] = None) -> dict:
    """The knowledge the plan judges with: playbooks/modules.yaml, and knowledge.yaml's torch_companions."""
    from .. import knowledge as kb

    doc = dict(kb.load_playbook("modules", project))
    doc["torch_family"] = kb.knowledge(project).get("torch_companions") or []
    return doc


def local_plan(project: Path, script: str, settings: Settings, *, image: Optional[str] = "launched",
               resolve: bool = True, timeout_s: float = 20.0, run: Optional[RunOptions] = None) -> Plan:
    """The plan as `gpuops run`, `train`, `setup` and `plan` build it: the playbooks loaded, the image a launch boots
    (image="launched"), a named one, or None (a host whose image is not known: no resolution)."""
    from .. import knowledge as kb
    from .resolution import resolve as resolver

    images_doc = kb.load_playbook("images", project)
    img = image_of(images_doc, None if image == "launched" else image) if image else None
    return build(project, script, image=img, settings=settings, tables=tables(project), images_doc=images_doc,
                 resolver=resolver if resolve else None, timeout_s=timeout_s, run=run)
