"""What a job imports, read from the LOCAL project: the modules the job's python must find before the script's first
line can run, and, when one is missing, the fix (the launch gate's judgement). Pure: it reads the project's files and
nothing else (no network, no subprocess); the remote half is the probe's `find_modules` fact (remote/probe.py), which
asks the job's python `importlib.util.find_spec` for each name, inside the preflight's one execution.

What counts as needed, so that a refusal is never a false alarm:
- a `.py` script: its module-level imports (`import a.b` -> `a`, `from x.y import z` -> `x`), also in class bodies,
  `with` blocks and (for the script itself) `if __name__ == "__main__":`; not relative imports, not imports inside
  functions, under `if TYPE_CHECKING:` or any other `if`, or in a `try` that catches ImportError,
  ModuleNotFoundError, Exception or everything, or under `contextlib.suppress(ImportError)`;
- one level deep: the same for the project's own modules the script imports (found as Python would from the script's
  folder: `foo.py` or `foo/__init__.py`, and the project root and `src/` layouts);
- a `.sh` script: each simple command that runs `python`/`python3`/`python3.X` (after `exec`, `nohup`, `time`,
  `env`, `uv run` and `VAR=value` prefixes) with `X.py` (X.py's imports as above) or `-m module` (its top-level name;
  the project's own module: its imports one level), and the launchers of SCRIPT_LAUNCHERS: `torchrun ... X.py` /
  `python -m torch.distributed.run ... X.py` (torch, and X.py's imports), `accelerate launch ... X.py` (accelerate),
  `deepspeed ... X.py` (deepspeed), each also as `python -m` its module. An option's value may hold a shell
  variable (`--nproc_per_node $N`); a script word with one, a line that sets PYTHONPATH, a python given by
  path, and a script that switches environment (`activate`, `conda`) are not read: nothing is inferred from them.
- a file that changes sys.path (or a shell script that sets PYTHONPATH) may import the project's modules from any of
  its folders: its imports whose name is a folder or a .py file anywhere in the project are not required.

Dotted names that are their own distribution's root (`google.protobuf`: `google` is a namespace many distributions
share) come from playbooks/modules.yaml, with the module -> distribution names that differ (`cv2` -> opencv-python).
"""
from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Optional

GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
PATH_CHANGE = re.compile(rb"\bsys\.path\b|\baddsitedir\b")  # a file that may import from a folder of its choosing
SKIP_DIRS = {"__pycache__", "node_modules", "runs", "site-packages", "dist-packages"}
WALK_LIMIT = 20000  # files: a project bigger than this is not searched (its loose needs are not required)
NEVER = {"__future__", "__main__"}
PYTHON = re.compile(r"python(3(\.\d+)?)?\Z")
ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# Launchers that run a Python script with the job's python: the command (its words), the package it runs from (the
# module the job's python must find), its `python -m` modules. torchrun's options are read exactly (TORCHRUN_FLAGS);
# the others' script is their first word that ends in .py (their options' values are numbers, names and files that
# are not .py). Sources: pytorch.org/docs/stable/elastic/run.html (torchrun = python -m torch.distributed.run),
# huggingface.co/docs/accelerate/package_reference/cli (accelerate launch), deepspeed.ai/getting-started
# ("deepspeed <client_entry.py> <client args>"; the runner is deepspeed.launcher.runner).
SCRIPT_LAUNCHERS = (
    (("torchrun",), "torch", TORCHRUN_MODULES),
    (("accelerate", "launch"), "accelerate", ("accelerate.commands.launch",)),
    (("deepspeed",), "deepspeed", ("deepspeed.launcher.runner",)),
)
# torchrun options that take no value (every other option takes one, as `--opt value` or `--opt=value`)
TORCHRUN_FLAGS = {"--standalone", "--module", "-m", "--no-python", "--no_python", "--run-path", "--run_path"}
# uv run: options whose value follows; options that make uv run another environment than the one setup built
UV_VALUE = {"--extra", "--group", "--only-group", "--no-group", "--package", "--env-file", "--index", "--default-index",
            "--index-url", "--extra-index-url", "--find-links", "-f", "--cache-dir", "--config-file", "--color",
            "--exclude-newer", "--resolution", "--prerelease", "--index-strategy", "--keyring-provider",
            "--link-mode", "--refresh-package", "--reinstall-package", "--upgrade-package", "-P"}
UV_OTHER_ENV = {"--with", "--with-requirements", "--with-editable", "--python", "-p", "--isolated", "--script",
                "--directory", "--project", "--no-project", "--gui-script"}
SHELL_WORDS = {"then", "do", "else", "elif", "{", "}", "!", "if", "while", "until"}
PREFIXES = {"exec", "nohup", "time", "command"}
ENV_SWITCH = re.compile(r"(^|[\s;&|])(source|\.)\s+\S*activate\b|(^|[\s;&|])(conda|mamba|micromamba|pyenv)\s+"
                        r"(activate|shell|run)\b|(^|[\s;&|])module\s+load\b", re.M)


@dataclass(frozen=True)
class Need:
    """One module the job's python must find."""
    module: str  # the name the host's python is asked about (top-level, or a dotted name of modules.yaml)
    shown: str  # how the problem names it (`pkg.mod` for `python -m pkg.mod`)
    source: str  # who needs it: "train.py", "mylib.py (imported by train.py)", "job.sh"
    how: str  # "imports", "runs python -m", "runs torchrun, which imports"
    path0: str  # sys.path[0] of that python, relative to the project folder ("" = the project folder)
    local: Optional[str] = None  # the project's own file that provides it (then: a module of the project)
    local_root: str = ""  # the folder (relative to the project) where that file's top-level module was found
    loose: bool = False  # its file changes sys.path (or its shell script PYTHONPATH): needed only if no folder or
    #                      .py file of the project has its name, which the changed path might reach


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


def _guarding(handlers: list) -> bool:
    """A try whose handlers catch an ImportError (by name, a parent class, or a bare except)."""
    return any(h.type is None or _names(h.type) & GUARDS for h in handlers)


def _suppresses_import_error(item: ast.withitem) -> bool:
    call = item.context_expr
    return isinstance(call, ast.Call) and "suppress" in _names(call.func) and \
        any(_names(a) & GUARDS for a in call.args)


def required_imports(source: str | bytes, *, as_main: bool = True,
                     relative: bool = False) -> list[tuple[str, list[str]]]:
    """The absolute imports that run when the file runs (as `__main__` or imported): [(module, names imported from
    it)], in order. Conditional ones (see the module's docstring) are left out. A file that does not parse: [].
    relative: the relative ones instead (`from .model import Net` -> (".model", ["Net"]))."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[str, list[str]]] = []

    def walk(body: Iterable[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Import):
                if not relative:
                    found.extend((a.name, []) for a in st.names)
            elif isinstance(st, ast.ImportFrom):
                if relative and st.level:
                    found.append(("." * st.level + (st.module or ""), [a.name for a in st.names if a.name != "*"]))
                elif not relative and not st.level and st.module:
                    found.append((st.module, [a.name for a in st.names if a.name != "*"]))
            elif isinstance(st, ast.If):
                if _is_main_test(st.test):
                    walk(st.body if as_main else st.orelse)
            elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
                if not _guarding(st.handlers):
                    walk(st.body)
                    walk(st.orelse)
                walk(st.finalbody)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                if not any(_suppresses_import_error(i) for i in st.items):
                    walk(st.body)
            elif isinstance(st, ast.ClassDef):
                walk(st.body)

    walk(tree.body)
    return found


def check_name(dotted: str, namespaces: Iterable[str] = ()) -> str:
    """The name the host is asked about: the top-level name, or the longest dotted name of `namespaces` it starts
    with (`google.protobuf.message` -> `google.protobuf`)."""
    best = ""
    for ns in namespaces:
        if (dotted == ns or dotted.startswith(ns + ".")) and len(ns) > len(best):
            best = ns
    return best or dotted.split(".", 1)[0]


# -- the project's own modules ---------------------------------------------------------------------------------
def _rel(project: Path, p: Path) -> str:
    return p.relative_to(project).as_posix()


def module_files(project: Path, roots: list[str], dotted: str) -> tuple[str, list[Path]]:
    """The project's files that run when `dotted` is imported, found from the first root (a folder relative to the
    project) that has its top-level name as `name.py` or `name/__init__.py`, and that root; ("", []) when it is not
    the project's."""
    parts = dotted.split(".")
    for root in roots:
        base = project / root if root else project
        files: list[Path] = []
        here = base
        for i, part in enumerate(parts):
            pkg, mod = here / part / "__init__.py", here / f"{part}.py"
            if pkg.is_file():
                files.append(pkg)
                here = here / part
            elif mod.is_file():
                files.append(mod)
                break
            else:
                break
        if files:
            return root, files
    return "", []


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _search_roots(project: Path, path0: str) -> list[str]:
    roots = [path0, "", "src"]
    return [r for i, r in enumerate(roots) if r not in roots[:i] and (project / r).is_dir()]


def _file_needs(project: Path, file: Path, source: str, path0: str, namespaces: list[str], *,
                as_main: bool) -> tuple[list[Need], list[Path]]:
    """A Python file's needs (as run with sys.path[0] = path0), and the project's files its imports run."""
    roots = _search_roots(project, path0)
    needs: list[Need] = []
    files_run: list[Path] = []
    text = _read(file) or b""
    loose = bool(PATH_CHANGE.search(text))
    for dotted, names in required_imports(text, as_main=as_main):
        top = check_name(dotted, namespaces)
        if top in NEVER:
            continue
        root, files = module_files(project, roots, dotted)
        for name in names:  # `from pkg import sub`: pkg/sub.py runs too
            files += [f for f in module_files(project, roots, f"{dotted}.{name}")[1] if f not in files]
        needs.append(Need(top, top, source, "imports", path0, _rel(project, files[0]) if files else None, root,
                          loose))
        files_run += [f for f in files if f != file and f not in files_run]
    return needs, files_run


def _python_needs(project: Path, file: Path, source: str, namespaces: list[str]) -> list[Need]:
    """A script's needs (run as `python file`) and, one level deep, those of the project's modules it imports."""
    path0 = _rel(project, file.parent)
    path0 = "" if path0 == "." else path0
    needs, files = _file_needs(project, file, source, path0, namespaces, as_main=True)
    who = source.split(" ", 1)[0]
    for f in files:
        rel = _rel(project, f)
        needs += _file_needs(project, f, f"{rel} (imported by {who})", path0, namespaces, as_main=False)[0]
    return needs


# -- shell scripts ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Invocation:
    """A python run found in a shell script."""
    kind: str  # "script" | "module"
    target: str  # X.py, or the dotted module
    torchrun: bool = False
    cwd: Optional[str] = None  # the folder it runs in, relative to the project, when the script `cd`s literally
    launcher: Optional[str] = None  # the launcher's words ("torchrun", "accelerate launch", "deepspeed")
    package: Optional[str] = None  # the module the launcher runs from (torch, accelerate, deepspeed)


def _simple_commands(text: str) -> Iterator[list[str]]:
    """The words of each simple command of a shell script (continuations joined, here-document bodies skipped,
    split at ; && || | & ( ), redirections dropped). A line that does not tokenize is skipped."""
    lines = text.replace("\\\n", " ").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        m = re.search(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1", line)
        if m:
            end = m.group(2)
            while i < len(lines) and lines[i].strip() != end:
                i += 1
            i += 1
        try:
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            toks = list(lex)
        except ValueError:
            continue
        words: list[str] = []
        skip = False
        for t in toks:
            if skip:
                skip = False
                continue
            if t and set(t) <= set(";&|()<>"):
                if "<" in t or ">" in t:
                    if words and words[-1].isdigit():
                        words.pop()
                    skip = True
                    continue
                if words:
                    yield words
                words = []
                continue
            words.append(t)
        if words:
            yield words


def _python_invocation(args: list[str]) -> Optional[Invocation]:
    """`python [options] X.py ...` or `python [options] -m module ...` (the python words after the interpreter)."""
    i = 0
    while i < len(args):
        a = args[i]
        if "$" in a or "`" in a:
            return None
        if a == "-" or not a.startswith("-"):
            return Invocation("script", a) if a.endswith(".py") else None
        if a.startswith("--"):
            i += 2 if a == "--check-hash-based-pycs" else 1
            continue
        letters = a[1:]
        for j, ch in enumerate(letters):
            rest = letters[j + 1:]
            if ch == "c":
                return None
            if ch == "m":
                mod = rest or (args[i + 1] if i + 1 < len(args) else "")
                if not mod or "$" in mod:
                    return None
                after = args[i + 1:] if rest else args[i + 2:]
                if mod in TORCHRUN_MODULES:
                    return _torchrun_invocation(after)
                for words, package, modules in SCRIPT_LAUNCHERS[1:]:
                    if mod in modules:
                        return _launcher_invocation(after, " ".join(words), package)
                return Invocation("module", mod)
            if ch in "WX":
                i += 0 if rest else 1
                break
        i += 1
    return None


def _torchrun_invocation(args: list[str]) -> Optional[Invocation]:
    module = False
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):  # an option (its value may hold a shell variable: only the script's word matters)
            if a in ("--no-python", "--no_python"):
                return None
            module = module or a in ("-m", "--module")
            i += 1 if (a in TORCHRUN_FLAGS or "=" in a) else 2
            continue
        if "$" in a or "`" in a:
            return None
        how = dict(launcher="torchrun", package="torch")
        if module:
            return Invocation("module", a, torchrun=True, **how)
        return Invocation("script", a, torchrun=True, **how) if a.endswith(".py") else None
    return None


def _launcher_invocation(args: list[str], launcher: str, package: str) -> Optional[Invocation]:
    """`accelerate launch [options] X.py ...`, `deepspeed [options] X.py ...`: X.py is the first word that ends in
    .py; a launcher told to run a module or no python (-m, --module, --no_python) is not read."""
    for a in args:
        if a in ("-m", "--module", "--no_python", "--no-python", "--no_local_rank"):
            return None
        if a.endswith(".py") and not a.startswith("-"):
            if "$" in a or "`" in a:
                return None
            return Invocation("script", a, launcher=launcher, package=package)
    return None


def _uv_run(args: list[str]) -> Optional[list[str]]:
    """The command `uv run [options]` runs (None: it would run in another environment than setup's)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        opt = args[i].split("=", 1)[0]
        if opt in UV_OTHER_ENV:
            return None
        i += 2 if (opt in UV_VALUE and "=" not in args[i]) else 1
    rest = args[i:]
    if rest and rest[0].endswith(".py"):  # `uv run train.py` runs it with python
        return ["python", *rest]
    return rest


def invocation(words: list[str]) -> Optional[Invocation]:
    """The python run of one simple command, or None."""
    i = 0
    while i < len(words):
        w = words[i]
        if w in SHELL_WORDS or w in PREFIXES:
            i += 1
        elif ASSIGN.match(w):
            if w.startswith(("PYTHONPATH=", "PYTHONHOME=", "PYTHONSAFEPATH=")):
                return None
            i += 1
        elif w == "env":
            i += 1
            if i < len(words) and words[i].startswith("-"):
                return None
        elif w == "uv" and words[i + 1:i + 2] == ["run"]:
            rest = _uv_run(words[i + 2:])
            if rest is None:
                return None
            words, i = rest, 0
        else:
            break
    if i >= len(words) or "$" in words[i] or "`" in words[i]:
        return None
    cmd, args = words[i], words[i + 1:]
    if PYTHON.match(cmd):
        return _python_invocation(args)
    if cmd == "torchrun":
        return _torchrun_invocation(args)
    for launcher, package, _ in SCRIPT_LAUNCHERS[1:]:
        if tuple(words[i:i + len(launcher)]) == launcher:
            return _launcher_invocation(words[i + len(launcher):], " ".join(launcher), package)
    return None


def shell_invocations(text: str) -> list[Invocation]:
    """The python runs a shell script makes, in order; [] for a script that switches environment."""
    if ENV_SWITCH.search(text):
        return []
    out: list[Invocation] = []
    cwd: Optional[str] = None
    for words in _simple_commands(text):
        if words[0] == "cd":
            target = words[1] if len(words) > 1 else ""
            if not target or "$" in target or "`" in target or target.startswith(("/", "~", "-")):
                cwd = None  # unknown: resolved against the project and the script's folder
            else:
                cwd = (PurePosixPath(cwd or ".") / target).as_posix()
            continue
        inv = invocation(words)
        if inv:
            out.append(replace(inv, cwd=cwd))
    return out


def _normal_dir(path: str) -> str:
    parts: list[str] = []
    for p in PurePosixPath(path).parts:
        if p == "..":
            if not parts:
                return "\0"  # outside the project
            parts.pop()
        elif p != ".":
            parts.append(p)
    return "/".join(parts)


def _shell_needs(project: Path, script: str, text: str, namespaces: list[str]) -> list[Need]:
    needs = _shell_runs(project, script, text, namespaces)
    if "PYTHONPATH" in text:  # set somewhere in the script: what it adds is unknown here
        needs = [replace(n, loose=True) for n in needs]
    return needs


def _shell_runs(project: Path, script: str, text: str, namespaces: list[str]) -> list[Need]:
    sh_dir = PurePosixPath(script).parent.as_posix()
    sh_dir = "" if sh_dir == "." else sh_dir
    needs: list[Need] = []
    for inv in shell_invocations(text):
        dirs = [d for d in dict.fromkeys([_normal_dir(inv.cwd) if inv.cwd is not None else None, "", sh_dir])
                if d is not None and d != "\0"]
        if inv.launcher:
            needs.append(Need(inv.package, inv.package, script, f"runs {inv.launcher}, which imports", dirs[0]))
        if inv.kind == "script":
            for d in dirs:
                f = project / d / inv.target if d else project / inv.target
                if f.is_file():
                    if f.resolve().is_relative_to(project.resolve()):
                        rel = f.resolve().relative_to(project.resolve()).as_posix()
                        needs += _python_needs(project, project / rel, f"{rel} (run by {script})", namespaces)
                    break
            continue
        if inv.target.split(".")[0] in NEVER:
            continue
        # sys.path[0] is the folder it runs in: the one that has the module when the script's cd is not literal
        path0 = dirs[0] if inv.cwd is not None else \
            next((d for d in dirs if module_files(project, [d], inv.target)[1]), dirs[0])
        root, files = module_files(project, _search_roots(project, path0), inv.target)
        needs.append(Need(check_name(inv.target, namespaces), inv.target, script, "runs python -m", path0,
                          _rel(project, files[0]) if files else None, root))
        if files:  # the project's own module: what runs, one level (its package's __init__ and itself as __main__)
            last = files[-1]
            if last.name == "__init__.py" and (last.parent / "__main__.py").is_file():
                files.append(last.parent / "__main__.py")
            for f in files:
                needs += _file_needs(project, f, f"{_rel(project, f)} (run by {script})", path0, namespaces,
                                     as_main=f == files[-1])[0]
    return needs


# -- what no host can run ----------------------------------------------------------------------------------------
def script_problems(project: Path, script: str) -> list[tuple[str, str]]:
    """(problem, fix) for a --script that fails on any host, read from the local file before anything is synced,
    launched or billed: a shell script with Windows line endings (bash reads `set -e\\r`: error checking silently
    off, and its last argument arrives as "\\r"; gpuops refuses it rather than converting a file the user keeps), a
    .py script with relative imports at module level (they fail when it runs as a file: run it as a module)."""
    text = _read(project / script)
    if text is None:
        return []
    out = []
    shell = script.endswith((".sh", ".bash")) or re.match(rb"#!\s*\S*(/|env\s+)(ba|da|z)?sh\b", text[:80])
    if shell and b"\r\n" in text:
        n = text.count(b"\r\n")
        q = shlex.quote(script)
        out.append((f"{script} has Windows line endings (CRLF, {n} line(s)): bash would read `set -e` as `set -e\\r` "
                    "(error checking off) and pass a \"\\r\" as each line's last argument",
                    f"fix: convert it to Unix line endings: sed -i 's/\\r$//' {q} (or dos2unix {q}); "
                    "git config core.autocrlf input keeps it so"))
    if script.endswith(".py"):
        rel = required_imports(text, relative=True)
        if rel:
            parts = PurePosixPath(script[:-3]).parts
            parts = parts[1:] if parts[:1] == ("src",) and len(parts) > 2 else parts
            module = ".".join(parts)
            out.append((f"{script} uses relative imports ({', '.join(f'from {m} import ...' for m, _ in rel[:2])}), "
                        "which fail when it runs as a file (\"attempted relative import with no known parent "
                        "package\")",
                        f"fix: run it as a module, -m {module}: a run.sh holding `python -m {module} \"$@\"` given as "
                        "--script" if len(parts) > 1 else "fix: a file at the project's top is no package's module: "
                        "import absolutely (from model import Net for from .model import Net)"))
    return out


# -- what a job needs ---------------------------------------------------------------------------------------------
def job_needs(project: Path, script: str, namespaces: Iterable[str] = ()) -> list[Need]:
    """The modules the job started with --script (relative to the project) must import, each once (first reason
    kept). [] for a script that is neither .py nor .sh/bash, or that cannot be read locally."""
    namespaces = list(namespaces)
    path = project / script
    text = _read(path)
    if text is None:
        return []
    shell = re.match(rb"#!\s*\S*(/|env\s+)(ba|da|z)?sh\b", text[:80])
    if script.endswith(".py"):  # run by the profile's python whatever its #! line says (runs.job_argv)
        needs = _python_needs(project, path, script, namespaces)
    elif shell or (script.endswith(".sh") and not text.startswith(b"#!")):  # as job_argv runs it: bash, or its #!
        needs = _shell_needs(project, script, text.decode("utf-8", "replace"), namespaces)
    else:
        return []
    if any(n.loose for n in needs):
        names = project_module_names(project)
        needs = [n for n in needs if not n.loose or (names is not None and n.module.split(".")[0] not in names)]
    seen: set[tuple[str, str]] = set()
    out = []
    for n in needs:
        if (n.module, n.path0) not in seen:
            seen.add((n.module, n.path0))
            out.append(n)
    return out


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


def probe_groups(needs: Iterable[Need]) -> dict[str, list[str]]:
    """The probe's `find_modules` groups: sys.path[0] (relative to the project) -> module names."""
    groups: dict[str, list[str]] = {}
    for n in needs:
        names = groups.setdefault(n.path0, [])
        if n.module not in names:
            names.append(n.module)
    return groups


# -- the project's declared dependencies ------------------------------------------------------------------------
def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


_REQ_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _requirement_name(text: str) -> Optional[str]:
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
    raw = _read(project / rel)
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
            for k, v in requirements_names(project, _normal_dir(target), seen).items():
                out.setdefault(k, v)
            continue
        if line.startswith("-e ") or line.startswith("--editable"):
            name = _requirement_name(line.split(None, 1)[1] if " " in line else "")
        elif line.startswith("-"):
            continue
        else:
            name = _requirement_name(line)
        if name:
            out.setdefault(normalize(name), rel)
    return out


def _toml(path: Path) -> Optional[dict]:
    raw = _read(path)
    if raw is None:
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10: the quoted strings of the dependency arrays are enough here
        text = raw.decode("utf-8", "replace")
        if path.name == "uv.lock":
            return {"package": [{"name": n} for n in re.findall(r'(?m)^name\s*=\s*"([^"]+)"', text)]}
        deps = re.findall(r'"([A-Za-z0-9][^"]*)"', " ".join(re.findall(r"(?s)=\s*\[(.*?)\]", text)))
        return {"project": {"dependencies": deps}} if re.search(r"(?m)^\[project\]", text) else {}
    try:
        return tomllib.loads(raw.decode("utf-8", "replace"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def declared(project: Path) -> dict[str, str]:
    """The distributions the project's dependency files name (normalized name -> the file that names it):
    requirements*.txt (with -r includes), pyproject.toml's dependencies, optional-dependencies and dependency
    groups, and uv.lock's packages."""
    out: dict[str, str] = {}
    for f in sorted(project.glob("requirements*.txt")):
        for k, v in requirements_names(project, f.name).items():
            out.setdefault(k, v)
    py = _toml(project / "pyproject.toml") or {}
    proj = py.get("project") if isinstance(py.get("project"), dict) else {}
    lists = [proj.get("dependencies") or []]
    lists += list((proj.get("optional-dependencies") or {}).values())
    lists += list((py.get("dependency-groups") or {}).values()) if isinstance(py.get("dependency-groups"), dict) else []
    for items in lists:
        for item in items if isinstance(items, list) else []:
            name = _requirement_name(item) if isinstance(item, str) else None
            if name:
                out.setdefault(normalize(name), "pyproject.toml")
    if proj.get("name"):
        out.setdefault(normalize(str(proj["name"])), "pyproject.toml")
    lock = _toml(project / "uv.lock") or {}
    for pkg in lock.get("package") or []:
        if isinstance(pkg, dict) and pkg.get("name"):
            out.setdefault(normalize(str(pkg["name"])), "uv.lock")
    return out


def extras_only(project: Path) -> dict[str, list[str]]:
    """Distributions pyproject.toml names only under [project.optional-dependencies] (normalized name -> the extras
    that name it): setup installs them only for the extras the profile's setup.extras names."""
    py = _toml(project / "pyproject.toml") or {}
    proj = py.get("project") if isinstance(py.get("project"), dict) else {}
    main = {normalize(n) for n in (_requirement_name(i) for i in proj.get("dependencies") or [] if isinstance(i, str))
            if n}
    main |= set(requirements_names(project, "requirements.txt"))
    out: dict[str, list[str]] = {}
    opt = proj.get("optional-dependencies") if isinstance(proj.get("optional-dependencies"), dict) else {}
    for extra, items in opt.items():
        for item in items if isinstance(items, list) else []:
            name = _requirement_name(item) if isinstance(item, str) else None
            if name and normalize(name) not in main:
                out.setdefault(normalize(name), []).append(str(extra))
    return out


def has_project_table(project: Path) -> bool:
    py = _toml(project / "pyproject.toml") or {}
    return isinstance(py.get("project"), dict)


# -- the judgement --------------------------------------------------------------------------------------------------
def _row(module: str, table: list[dict]) -> dict:
    return next((r for r in table or [] if str(r.get("module")) == module), {})


def distributions(module: str, table: list[dict]) -> list[str]:
    """The distributions that provide an import name (modules.yaml), the first the one to add; else the name."""
    row = _row(module, table)
    return [str(row["distribution"]), *[str(a) for a in row.get("also") or []]] if row else [module]


def namespaces(table: list[dict]) -> list[str]:
    return [str(r["module"]) for r in table or [] if "." in str(r.get("module", ""))]


def missing(needs: list[Need], found: Optional[dict]) -> list[Need]:
    """The needs the host's python cannot find: `found` is the probe's answer {path0: {module: true | false |
    "error text"}}; only a plain false counts (an error, or a name not asked, is no refusal)."""
    if not isinstance(found, dict):
        return []
    return [n for n in needs if isinstance(found.get(n.path0), dict) and found[n.path0].get(n.module) is False]


def problems(gone: list[Need], *, python: str, declared_names: dict[str, str], table: list[dict],
             project_table: bool, extras: Optional[dict[str, list[str]]] = None,
             wanted_extras=()) -> list[tuple[str, list[str]]]:
    """One (problem, fix lines) per file that needs missing modules, worded like the gate's other problems:
    `train.py imports wandb, which ~/.venvs/gpuops/bin/python cannot import`. extras: extras_only(project);
    wanted_extras: the profile's setup.extras (a list, or "all")."""
    groups: dict[tuple[str, str], list[Need]] = {}
    for n in gone:
        groups.setdefault((n.source, n.how), []).append(n)
    out = []
    for (source, how), ns in groups.items():
        names = [n.shown for n in ns]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        out.append((f"{source} {how} {listed}, which {python} cannot import",
                    [_fix(n, declared_names, table, project_table, extras or {}, wanted_extras) for n in ns]))
    return out


def _fix(n: Need, declared_names: dict[str, str], table: list[dict], project_table: bool,
         extras: dict[str, list[str]], wanted_extras) -> str:
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
    row = _row(n.module, table)
    if row.get("setup") == "expect.packages":  # built against torch: setup's own step installs it (modules.yaml)
        return head + (f"{dists[0]} is built for the exact torch, CUDA and Python: name it in the profile's "
                       f"expect.packages ({dists[0]}: \"*\" or a version), and gpuops setup installs a prebuilt "
                       "wheel that matches them, else builds it (MAX_JOBS, --no-build-isolation); a requirements "
                       "line builds it against whatever torch the installer picks, or fails")
    hit = next((normalize(d) for d in dists if normalize(d) in declared_names), None)
    wanted = [] if wanted_extras == "all" else list(wanted_extras or [])
    if hit and hit in extras and wanted_extras != "all" and not set(extras[hit]) & set(wanted):
        names = extras[hit]
        return head + (f"the project lists {hit} only in pyproject.toml's extra {' or '.join(names)}, which setup "
                       f"does not install: add it to the profile's setup.extras (setup: {{extras: [{names[0]}]}}), "
                       "then gpuops setup")
    if hit:
        return head + f"gpuops setup (the project lists {hit} in {declared_names[hit]}; setup installs it)"
    return head + f"add {dists[0]} to the project's requirements, then gpuops setup"
