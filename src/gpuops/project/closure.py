"""The import closure of a job (pure: it reads the project's files, nothing else): every module the job's python must
import before the script can run, through the project's own modules at any depth.

What counts as needed, so that a refusal is never a false alarm:
- a file's module-level imports (`import a.b`, `from x.y import z`, relative ones resolved against the file's
  package), also in class bodies, `with` blocks and (for the file run as `__main__`) `if __name__ == "__main__":`;
  not imports inside functions, under `if TYPE_CHECKING:` or any other `if`, in a `try` that catches ImportError,
  ModuleNotFoundError, Exception or everything (unless that handler raises again: then the import is no more
  optional than without the try), or under `contextlib.suppress(ImportError)`;
- the project's own modules are found as Python would, from sys.path[0] (the script's folder, or the folder a
  `python -m` runs in), then the project folder and `src/` (a project setup installs, or PYTHONPATH): regular
  packages, modules, and namespace packages (a folder without `__init__.py` that leads to a `.py` file);
- `from pkg import name`: pkg/name.py runs when it exists; a package of the project that has neither a submodule
  nor a top-level name `name` is a certain ImportError (said as a problem, with the file and line);
- every project file reached is read in turn, each once; what it needs keeps the chain that reached it
  (`pkg/models/llama.py (imported by pkg/trainer.py <- train.py)`).

A file that changes sys.path (or a shell line that sets PYTHONPATH to something unknown here) may import the project's
modules from any of its folders: its imports whose name is a folder or a .py file anywhere in the project are not
required (`loose`). Dotted names that are their own distribution's root (`google.protobuf`) come from
playbooks/modules.yaml (`namespaces`)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
PATH_CHANGE = re.compile(rb"\bsys\.path\b|\baddsitedir\b")  # a file that may import from a folder of its choosing
SKIP_DIRS = {"__pycache__", "node_modules", "runs", "site-packages", "dist-packages"}
WALK_LIMIT = 20000  # files: a project bigger than this is not searched (its loose needs are not required)
FILE_LIMIT = 5000  # project files one closure reads at most
NEVER = {"__future__", "__main__"}


@dataclass(frozen=True)
class Need:
    """One module the job's python must find."""
    module: str  # the name the host's python is asked about (top-level, or a dotted name of modules.yaml)
    shown: str  # how the problem names it (`pkg.mod` for `python -m pkg.mod`)
    source: str  # who needs it: "train.py", "pkg/llama.py (imported by pkg/trainer.py <- train.py)", "job.sh"
    how: str  # "imports", "runs python -m", "runs torchrun, which imports"
    path0: str  # sys.path[0] of that python, relative to the project folder ("" = the project folder)
    local: Optional[str] = None  # the project's own file that provides it (then: a module of the project)
    local_root: str = ""  # the folder (relative to the project) where that file's top-level module was found
    loose: bool = False  # its file changes sys.path (or its shell line PYTHONPATH): needed only if no folder or
    #                      .py file of the project has its name, which the changed path might reach
    dotted: str = ""  # the full name imported (`flash_attn.ops.triton`), for what the plan says
    line: int = 0  # the line of the import in the file that needs it


# -- a Python file's required imports --------------------------------------------------------------------------
def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _names(node: Optional[ast.expr]) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _raises(body: list) -> bool:
    """A handler whose own statements raise (at its top level, or in an if/else of it): the import is required."""
    for st in body:
        if isinstance(st, ast.Raise):
            return True
        if isinstance(st, ast.If) and (_raises(st.body) or _raises(st.orelse)):
            return True
    return False


def _guarding(handlers: list) -> bool:
    """A try whose handlers catch an ImportError (by name, a parent class, or a bare except) without raising again."""
    return any((h.type is None or _names(h.type) & GUARDS) and not _raises(h.body) for h in handlers)


def _suppresses_import_error(item: ast.withitem) -> bool:
    call = item.context_expr
    return isinstance(call, ast.Call) and "suppress" in _names(call.func) and \
        any(_names(a) & GUARDS for a in call.args)


@dataclass(frozen=True)
class Import:
    module: str  # as written (`.models.llama` is module "models.llama" with level 1)
    names: tuple[str, ...]  # names imported from it (`from x import a, b`); () for `import x`
    level: int = 0  # the dots of a relative import
    line: int = 0


def _type_checking(test: ast.expr) -> bool:
    return bool(_names(test) & {"TYPE_CHECKING"})


def _optional_imports(body: Iterable[ast.stmt], found: list[Import]) -> None:
    """The imports a body makes when it runs at all (a function's, an `if`'s): into `found`, except those under
    `if TYPE_CHECKING:` (never run) or in a try that catches ImportError (the code has its own way without them)."""
    for st in body:
        if isinstance(st, ast.Import):
            found.extend(Import(a.name, (), 0, st.lineno) for a in st.names)
        elif isinstance(st, ast.ImportFrom):
            found.append(Import(st.module or "", tuple(a.name for a in st.names if a.name != "*"), st.level,
                                st.lineno))
        elif isinstance(st, ast.If):
            if not _type_checking(st.test):
                _optional_imports(st.body, found)
            _optional_imports(st.orelse, found)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            if not _guarding(st.handlers):
                _optional_imports(st.body, found)
                _optional_imports(st.orelse, found)
            _optional_imports(st.finalbody, found)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            if not any(_suppresses_import_error(i) for i in st.items):
                _optional_imports(st.body, found)
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _optional_imports(st.body, found)
            _optional_imports(getattr(st, "orelse", []), found)


def file_imports(source: str | bytes, *, as_main: bool = True,
                 optional: Optional[list[Import]] = None) -> list[Import]:
    """The imports that run when the file runs (as `__main__` or imported), relative ones included, in order.
    Conditional ones (see the module's docstring) are left out; given a list `optional`, the conditional ones that
    run when their function or branch does (inside functions, under an `if`; not under `if TYPE_CHECKING:`, not in a
    try that catches ImportError) are put there. A file that does not parse: []."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[Import] = []
    lazy: list[Import] = optional if optional is not None else []

    def walk(body: Iterable[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Import):
                found.extend(Import(a.name, (), 0, st.lineno) for a in st.names)
            elif isinstance(st, ast.ImportFrom):
                found.append(Import(st.module or "", tuple(a.name for a in st.names if a.name != "*"), st.level,
                                    st.lineno))
            elif isinstance(st, ast.If):
                if _is_main_test(st.test):
                    walk(st.body if as_main else st.orelse)
                elif optional is not None:
                    _optional_imports([st], lazy)
            elif optional is not None and isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                _optional_imports(st.body, lazy)
            elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
                if not _guarding(st.handlers):
                    walk(st.body)
                    walk(st.orelse)
                else:  # a handler that raises again makes its try's imports required all the same
                    for h in st.handlers:
                        walk(h.body)
                walk(st.finalbody)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                if not any(_suppresses_import_error(i) for i in st.items):
                    walk(st.body)
            elif isinstance(st, ast.ClassDef):
                walk(st.body)

    walk(tree.body)
    return found


def required_imports(source: str | bytes, *, as_main: bool = True,
                     relative: bool = False) -> list[tuple[str, list[str]]]:
    """[(module, names imported from it)] of file_imports: the absolute ones, or (relative=True) the relative ones
    written with their dots (`from .model import Net` -> (".model", ["Net"]))."""
    out = []
    for imp in file_imports(source, as_main=as_main):
        if relative and imp.level:
            out.append(("." * imp.level + imp.module, list(imp.names)))
        elif not relative and not imp.level and imp.module:
            out.append((imp.module, list(imp.names)))
    return out


def check_name(dotted: str, namespaces: Iterable[str] = ()) -> str:
    """The name the host is asked about: the top-level name, or the longest dotted name of `namespaces` it starts
    with (`google.protobuf.message` -> `google.protobuf`)."""
    best = ""
    for ns in namespaces:
        if (dotted == ns or dotted.startswith(ns + ".")) and len(ns) > len(best):
            best = ns
    return best or dotted.split(".", 1)[0]


# -- the project's own modules ---------------------------------------------------------------------------------
def rel(project: Path, p: Path) -> str:
    return p.relative_to(project).as_posix()


def _namespace(folder: Path) -> bool:
    """A folder without __init__.py that Python may import as a namespace package: .py files in it or one level
    below (a folder of logs or data named like a library is none)."""
    return folder.name.isidentifier() and folder.name not in SKIP_DIRS and folder.is_dir() and \
        (any(folder.glob("*.py")) or any(folder.glob("*/*.py")))


def find_module(project: Path, roots: list[str], dotted: str) -> Optional[tuple[str, list[Path], bool]]:
    """Where the project has `dotted`: (root, the files that run when it is imported, whether the whole name was
    found), from the first root (a folder relative to the project) that has it whole, else the first that has its
    top; None when its top-level name is not the project's. A regular package's `__init__.py` runs; a namespace
    package (_namespace) runs no file of its own."""
    parts = dotted.split(".")
    partial = None
    for root in roots:
        here = project / root if root else project
        files: list[Path] = []
        matched = 0
        for part in parts:
            if (here / part / "__init__.py").is_file():
                files.append(here / part / "__init__.py")
                here = here / part
            elif (here / f"{part}.py").is_file():
                files.append(here / f"{part}.py")
                matched += 1
                break
            elif _namespace(here / part):
                here = here / part
            else:
                break
            matched += 1
        if matched == len(parts):
            return root, files, True
        if matched and partial is None:
            partial = (root, files, False)
    return partial


def module_files(project: Path, roots: list[str], dotted: str) -> tuple[str, list[Path]]:
    """find_module's root and files ("", [] when the project does not have it)."""
    found = find_module(project, roots, dotted)
    return (found[0], found[1]) if found else ("", [])


def read_bytes(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


def search_roots(project: Path, path0: str, extra: Iterable[str] = ()) -> list[str]:
    roots = [path0, *extra, "", "src"]
    return [r for i, r in enumerate(roots) if r not in roots[:i] and (project / r).is_dir()]


def absolute(imp: Import, package: str) -> Optional[str]:
    """The absolute name of an import written in a file of `package` (None: a relative import beyond the top)."""
    if not imp.level:
        return imp.module
    base = package.split(".") if package else []
    if imp.level - 1 > len(base) or (imp.level > 1 and imp.level - 1 == len(base) and not base):
        return None
    base = base[:len(base) - (imp.level - 1)]
    if not base and not imp.module:
        return None
    return ".".join([*base, imp.module] if imp.module else base)


def top_level_names(source: bytes) -> Optional[set[str]]:
    """The names a module defines at its top level (assignments, defs, classes, imports), or None when it may define
    any (a star import, a module `__getattr__`, `globals()` written, a file that does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()
    if b"globals()" in source or b"__getattr__" in source or b"sys.modules" in source:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add((a.asname or a.name).split(".")[0])
    return names


@dataclass
class Closure:
    """What the job's python runs: the third-party modules it needs (with the chain that reached each), the
    project's files it reads, and the certain ImportErrors found here (problem, fix); the third-party modules its
    files import only when a function or a branch runs (`lazy`: never required, said when only an extra has them)."""
    needs: list[Need] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    depth: int = 0
    lazy: list[Need] = field(default_factory=list)
    main: Optional[str] = None  # the file its python runs as __main__


def _missing_name(init: Path, name: str) -> bool:
    """`from pkg import name` where pkg is the project's regular package (`init` its __init__.py): neither a
    submodule nor a name its __init__ defines (nor a file or folder a build could make a module of)."""
    if init.name != "__init__.py":
        return False
    if name.startswith("__") and name.endswith("__"):
        return False  # a module's own attributes (__name__, __version__ set at build time)
    if any(p.name.split(".", 1)[0] == name for p in init.parent.iterdir()):
        return False
    defined = top_level_names(read_bytes(init) or b"")
    return defined is not None and name not in defined


@dataclass(frozen=True)
class Start:
    """A file a python run executes first: the script (as __main__, no package), or a module's package __init__s
    and the module itself (the last as __main__)."""
    file: Path
    who: str  # how what it needs is attributed: "train.py (run by run.sh)"
    main: bool
    package: Optional[str]  # the dotted package it belongs to; None for a script run as a file
    root: str = ""


def closure(project: Path, starts: list[Start], *, path0: str, namespaces: list[str],
            extra_roots: Iterable[str] = (), loose: bool = False) -> Closure:
    """The closure of one python run: its first files (`starts`) and every project file they reach, at any depth,
    each read once. Roots: sys.path[0] (path0), `extra_roots` (PYTHONPATH), the project folder and src/."""
    roots = search_roots(project, path0, extra_roots)
    out = Closure()
    todo: list[tuple[Start, int]] = [(s, 0) for s in starts]
    seen: set[Path] = set()
    needed: set[str] = set()
    while todo and len(seen) < FILE_LIMIT:
        st, depth = todo.pop(0)
        f = st.file
        if f in seen:
            continue
        seen.add(f)
        out.files.append(rel(project, f))
        if st.main and out.main is None:
            out.main = rel(project, f)
        out.depth = max(out.depth, depth)
        text = read_bytes(f) or b""
        f_loose = loose or bool(PATH_CHANGE.search(text))
        name = rel(project, f)
        via = _via(st.who)
        link = name + (f" <- {via.split(' by ', 1)[1]}" if via else "")
        optional: list[Import] = []
        for imp in file_imports(text, as_main=st.main, optional=optional):
            if imp.level and st.package is None:
                continue  # run as a file, a relative import fails whatever it names (script_problems says so)
            dotted = absolute(imp, st.package or "")
            if not dotted:
                continue
            top = check_name(dotted, namespaces)
            if top in NEVER:
                continue
            found = find_module(project, roots, dotted)
            if found is None and imp.level:
                continue  # relative, and not here: nothing a host could be asked
            files = list(found[1]) if found else []
            root = found[0] if found else ""
            for n in imp.names if found and found[2] else ():  # `from pkg import sub`: pkg/sub.py runs too
                sub = find_module(project, roots, f"{dotted}.{n}")
                if sub and sub[2]:
                    files += [x for x in sub[1] if x not in files]
                elif files and _missing_name(files[-1], n):
                    out.problems.append((
                        f"{name} (line {imp.line}{', ' + _via(st.who) if _via(st.who) else ''}) imports {n} from "
                        f"{dotted} ({rel(project, files[-1])}), which has no module or name {n}: the job would stop "
                        f"at ImportError: cannot import name '{n}' from '{dotted}'",
                        f"fix: add {n} to {rel(project, files[-1])} (or {dotted.replace('.', '/')}/{n}.py), or correct "
                        f"the import in {name}; is that file excluded from sync (sync.exclude, an ignore file)?"))
            for x in files:
                if x != f and x not in seen:
                    pkg = ".".join(x.relative_to(project / root if root else project).with_suffix("").parts[:-1])
                    todo.append((Start(x, f"{rel(project, x)} (imported by {link})", False, pkg, root), depth + 1))
            if found is None and top not in needed:
                needed.add(top)
                out.needs.append(Need(top, top, st.who, "imports", path0, None, "", f_loose, dotted, imp.line))
            elif found is not None and f"local:{top}" not in needed:
                needed.add(f"local:{top}")
                out.needs.append(Need(top, top, st.who, "imports", path0,
                                      rel(project, files[0]) if files else rel(project, project / root / top), root,
                                      f_loose, dotted, imp.line))
        for imp in optional:
            top = check_name(imp.module, namespaces) if not imp.level and imp.module else ""
            if top and top not in NEVER and top not in needed and f"lazy:{top}" not in needed and \
                    find_module(project, roots, imp.module) is None:
                needed.add(f"lazy:{top}")
                out.lazy.append(Need(top, top, st.who, "imports", path0, None, "", f_loose, imp.module, imp.line))
    return out


def _via(who: str) -> str:
    """`x.py (imported by a.py <- b.py)` -> `imported by a.py <- b.py`; "" for a name alone."""
    m = re.search(r"\(((?:imported|run) by .*)\)$", who)
    return m.group(1) if m else ""


def project_module_names(project: Path, limit: int = WALK_LIMIT) -> Optional[set[str]]:
    """Every name a changed sys.path might import from the project: its folders (namespace packages included) and
    its .py files and extension modules (virtual environments, hidden and generated folders left out). None for a
    project of more than `limit` files."""
    import os

    names: set[str] = set()
    count = 0
    for dirpath, dirnames, filenames in os.walk(project):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
                       and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))]
        names.update(dirnames)
        names.update(f.split(".", 1)[0] for f in filenames if f.endswith((".py", ".so", ".pyd")))
        count += len(filenames)
        if count > limit:
            return None
    return names
