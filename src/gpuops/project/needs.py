"""What a job needs (pure): its launch line (launch.py) put through the import closure (closure.py), for every python
run it makes: the modules its python must import, with who needs each; the commands it runs; the certain ImportErrors
found here. The launch gate (jobs/actions.py) asks the host for `job_needs`; the local plan (plan.py) judges them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .closure import NEVER, Closure, Need, Start, check_name, closure, find_module, project_module_names, rel
from .launch import Launch, Run, normal_dir, read_command, read_launch, script_problems

PREP = "--prep"  # how the plan names the preparation's command line (`prepare.py (run by --prep)`)


@dataclass(frozen=True)
class RunFiles:
    """One python run (or command) of the launch line, in order, with the project's files its python reads and the
    one it runs as __main__ (what dataread.py reads for the data a job expects)."""
    run: Run
    files: tuple[str, ...] = ()
    main: Optional[str] = None


@dataclass
class JobNeeds:
    launch: Launch
    needs: list[Need] = field(default_factory=list)  # every module, first reason kept per (module, path0)
    commands: list[Run] = field(default_factory=list)  # console scripts and other commands the scripts run
    problems: list[tuple[str, str]] = field(default_factory=list)  # certain failures: CRLF, ImportError here
    files: list[str] = field(default_factory=list)  # the project's python files the job reads
    depth: int = 0  # the deepest import chain through the project's own modules
    lazy: list[Need] = field(default_factory=list)  # modules imported only in a function or a branch
    order: list[RunFiles] = field(default_factory=list)  # every run, in the order the launch line makes them


def _run_closure(project: Path, run: Run, namespaces: list[str]) -> tuple[list[Need], Optional[Closure]]:
    """A python run's needs: the launcher's package, then its script's or module's closure."""
    script = run.via[0] if run.via else ""
    sh_dir = Path(script).parent.as_posix() if script else ""
    sh_dir = "" if sh_dir == "." else sh_dir
    dirs = [d for d in dict.fromkeys([normal_dir(run.cwd) if run.cwd is not None else None, "", sh_dir])
            if d is not None and d != "\0"]
    who = run.source
    needs: list[Need] = []
    if run.launcher:
        needs.append(Need(run.package or "", run.package or "", who, f"runs {run.launcher}, which imports", dirs[0],
                          loose=run.loose))
    if run.kind == "script":
        for d in dirs if run.via else [""]:
            f = project / d / run.target if d else project / run.target
            if f.is_file():
                if not f.resolve().is_relative_to(project.resolve()):
                    return needs, None
                r = f.resolve().relative_to(project.resolve()).as_posix()
                path0 = Path(r).parent.as_posix()
                path0 = "" if path0 == "." else path0
                shown = f"{r} (run by {who.replace(' (run by ', ' <- ').rstrip(')')})" if who else r
                c = closure(project, [Start(project / r, shown, True, None)], path0=path0, namespaces=namespaces,
                            extra_roots=run.pythonpath, loose=run.loose)
                if run.via:  # a .py a shell line runs: relative imports fail there as for --script
                    c.problems += [(p.replace(f"{r} uses", f"{shown} uses", 1), fix)
                                   for p, fix in script_problems(project, r) if "relative imports" in p]
                return needs + c.needs, c
        return needs, None
    if run.target.split(".")[0] in NEVER:
        return needs, None
    # sys.path[0] is the folder it runs in: the one that has the module when the script's cd is not literal
    path0 = dirs[0] if run.cwd is not None else \
        next((d for d in dirs if find_module(project, [d], run.target)), dirs[0])
    roots = [r for r in dict.fromkeys([path0, *run.pythonpath, "", "src"]) if (project / r).is_dir()]
    found = find_module(project, roots, run.target)
    files = list(found[1]) if found else []
    needs.append(Need(check_name(run.target, namespaces), run.target, who, "runs python -m", path0,
                      rel(project, files[0]) if files else None, found[0] if found else "", run.loose, run.target))
    if not files:
        return needs, None
    last = files[-1]
    if last.name == "__init__.py" and (last.parent / "__main__.py").is_file():
        files.append(last.parent / "__main__.py")
    base = project / found[0] if found[0] else project
    starts = [Start(f, f"{rel(project, f)} (run by {who})" if who else rel(project, f), f == files[-1],
                    ".".join(f.relative_to(base).with_suffix("").parts[:-1]), found[0]) for f in files]
    c = closure(project, starts, path0=path0, namespaces=namespaces, extra_roots=run.pythonpath, loose=run.loose)
    return needs + c.needs, c


def job_needs_full(project: Path, script: str, namespaces: Iterable[str] = (), *,
                   prep: Optional[str] = None, args: tuple[str, ...] = ()) -> JobNeeds:
    """Everything the job started with --script (and the run's `args`) needs, read here; with `prep` (`gpuops run
    --prep CMD`), what that command line needs too, first (it runs first, in the same environment: its runs are
    `(run by --prep)`)."""
    namespaces = list(namespaces)
    launch = read_launch(project, script, tuple(args))
    if prep:
        first = read_command(project, prep, PREP)
        launch = Launch(runs=first.runs + launch.runs, scripts=first.scripts + [s for s in launch.scripts
                                                                                 if s not in first.scripts],
                        problems=first.problems + launch.problems, unread=first.unread + launch.unread)
    out = JobNeeds(launch, problems=list(launch.problems))
    raw: list[Need] = []
    for run in launch.runs:
        if run.kind == "command":
            out.commands.append(run)
            out.order.append(RunFiles(run))
            continue
        needs, c = _run_closure(project, run, namespaces)
        raw += needs
        out.order.append(RunFiles(run, tuple(c.files) if c else (), c.main if c else None))
        if c is not None:
            out.problems += [p for p in c.problems if p not in out.problems]
            out.files += [f for f in c.files if f not in out.files]
            out.depth = max(out.depth, c.depth)
            out.lazy += [n for n in c.lazy if n.module not in {x.module for x in out.lazy}]
    if any(n.loose for n in raw):
        names = project_module_names(project)
        raw = [n for n in raw if not n.loose or (names is not None and n.module.split(".")[0] not in names)]
    seen: set[tuple[str, str]] = set()
    for n in raw:
        if n.module and (n.module, n.path0) not in seen:
            seen.add((n.module, n.path0))
            out.needs.append(n)
    return out


def job_needs(project: Path, script: str, namespaces: Iterable[str] = ()) -> list[Need]:
    """The modules the job started with --script (relative to the project) must import, each once (first reason
    kept). [] for a script that is neither .py nor .sh/bash, or that cannot be read locally."""
    return job_needs_full(project, script, namespaces).needs


def probe_groups(needs: Iterable[Need]) -> dict[str, list[str]]:
    """The probe's `find_modules` groups: sys.path[0] (relative to the project) -> module names."""
    groups: dict[str, list[str]] = {}
    for n in needs:
        names = groups.setdefault(n.path0, [])
        if n.module not in names:
            names.append(n.module)
    return groups


