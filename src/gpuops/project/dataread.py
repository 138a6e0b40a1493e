"""The data a job reads that the project does not have (pure: it reads the project's files, nothing else; issue 38).

Each python run of the launch line is read for the files it opens: `np.memmap`/`np.fromfile`/`np.load`, pandas'
`read_*`, `datasets`' `load_dataset(..., data_files=...)`, `load_from_disk` and `Dataset.from_*`, `torch.load`,
`open()` and `Path.read_*` of a data file (`.bin`, `.npy`, `.parquet`, `.jsonl`, `.arrow`, `.pt`, ...). A path counts
when it is known here: string literals, `os.path.join`, `os.path.dirname(__file__)`, `Path(...) / ...`, f-strings,
names assigned once (at the module's top, or in the function that reads) and a nanoGPT-style configurator
(`exec(open('configurator.py').read())` at the top: the run's `config/x.py` arguments and `--name=value` words
assign too). A branch whose test is known (`if init_from == 'resume':` with `init_from = 'scratch'`) is read only
when taken. A path relative to the folder the run starts in that
- the project does not have,
- nothing before it in the launch line makes (an earlier run that writes files, a command such as `wget` or a
  console script: the plan cannot tell what they write, so it stays quiet after them),
- its own run does not write or check first (`os.path.exists`, `try: ... except FileNotFoundError`),
- no `--prep-out` of the run names,
is said as a warning, never a refusal (a path may be made at run time in ways no file shows), naming the file, where
it is read, and the fix: `gpuops run --prep CMD --prep-out PATH --fs NAME` (with the project's own prepare script
where one sits beside the data) or `--data`. A read inside a `--data` folder of the project is said too: that folder
is left out of the project's upload and the instance has it at `$GPUOPS_DATA`, not at its path."""
from __future__ import annotations

import ast
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .needs import JobNeeds

DATA_EXT = (".bin", ".npy", ".npz", ".pt", ".pth", ".parquet", ".jsonl", ".json", ".arrow", ".csv", ".tsv", ".pkl",
            ".pickle", ".h5", ".hdf5", ".txt", ".tfrecord", ".idx", ".zst", ".gz", ".tar", ".feather", ".msgpack")
# readers whose first argument (or path= / the keyword named) is a file: any path, or only a data file
READERS_ANY = {"memmap", "fromfile", "loadtxt", "genfromtxt", "read_csv", "read_parquet", "read_json", "read_feather",
               "read_pickle", "read_orc", "read_hdf", "load_from_disk", "from_parquet", "from_json", "from_csv",
               "from_text", "ParquetFile", "read_table"}
READERS_DATA = {"open", "load", "File", "read_text", "read_bytes"}
WRITERS = {"tofile", "save", "savez", "savez_compressed", "savetxt", "to_parquet", "to_csv", "to_json", "to_pickle",
           "to_feather", "save_to_disk", "write_table", "write_text", "write_bytes", "urlretrieve", "hf_hub_download",
           "snapshot_download", "download", "makedirs", "mkdir", "copy", "copyfile", "move", "rename", "extractall",
           "unpack_archive", "dump"}
CHECKS = {"exists", "isfile", "isdir", "is_file", "is_dir", "lexists", "getsize"}
FILE_ERRORS = {"FileNotFoundError", "OSError", "IOError", "EnvironmentError", "Exception", "BaseException"}
QUIET_COMMANDS = {"echo", "printf", "nvidia-smi", "sleep", "export", "set", "cd", "true", "false", "date", "env",
                  "which", "ls", "cat", "pwd", "hostname", "nproc", "free", "df", "du"}
PREP_NAMES = ("prepare", "preprocess", "prep", "download", "tokenize", "make", "build", "fetch", "fineweb", "cached")
HERE = "/@project/"  # a path built from __file__: relative to the project, not to the folder the run starts in
UNK = object()  # a value not known here


@dataclass
class Read:
    path: str  # as built, HERE-prefixed when it came from __file__
    file: str  # the project's file that reads it
    line: int
    guarded: bool = False  # in a try that catches a missing file


@dataclass
class Scan:
    """One file's data reads and writes, as far as the values are known."""
    reads: list[Read] = field(default_factory=list)
    writes: list[object] = field(default_factory=list)  # paths (or UNK): anything written
    checks: list[str] = field(default_factory=list)  # paths the file tests for existence


# -- values ------------------------------------------------------------------------------------------------------
def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _join(*parts: str) -> str:
    out = ""
    for p in parts:
        out = p if p.startswith(("/", "~")) else (posixpath.join(out, p) if out else p)
    return out


def _dirname(p: str) -> str:
    if p.startswith(HERE):
        return HERE + posixpath.dirname(p[len(HERE):])
    return posixpath.dirname(p)


def value(node: Optional[ast.expr], env: dict) -> object:
    """What an expression is, when it is known here (a str, number, bool, None, tuple), else UNK."""
    if node is None:
        return UNK
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id, UNK)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            got = value(v.value, env) if isinstance(v, ast.FormattedValue) else value(v, env)
            if got is UNK or (isinstance(v, ast.FormattedValue) and v.format_spec is not None):
                return UNK
            parts.append(str(got))
        return "".join(parts)
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [value(e, env) for e in node.elts]
        return UNK if any(i is UNK for i in items) else tuple(items)
    if isinstance(node, ast.BinOp):
        a, b = value(node.left, env), value(node.right, env)
        if a is UNK or b is UNK:
            return UNK
        if isinstance(node.op, ast.Div) and isinstance(a, str) and isinstance(b, str):
            return _join(a, b)  # Path / "x" (paths are kept as text)
        if isinstance(node.op, ast.Add) and isinstance(a, str) and isinstance(b, str):
            return a + b
        if isinstance(node.op, ast.Mod) and isinstance(a, str):
            try:
                return a % b
            except (TypeError, ValueError):
                return UNK
        return UNK
    if isinstance(node, ast.Attribute):
        base = value(node.value, env)
        if node.attr == "parent" and isinstance(base, str):
            return _dirname(base)
        return UNK
    if isinstance(node, ast.Call):
        return _call_value(node, env)
    return UNK


def _call_value(node: ast.Call, env: dict) -> object:
    name = _call_name(node.func)
    args = [value(a, env) for a in node.args]
    if name in ("resolve", "absolute", "expanduser") and isinstance(node.func, ast.Attribute) and not args:
        return value(node.func.value, env)  # Path(...).resolve(): the same file
    if any(a is UNK for a in args) or node.keywords:
        return UNK
    if name == "join" and args and all(isinstance(a, str) for a in args):
        owner = node.func.value if isinstance(node.func, ast.Attribute) else None
        if isinstance(owner, ast.Attribute) and owner.attr == "path":  # os.path.join (not "sep".join)
            return _join(*args)
        return UNK
    if name in ("Path", "PurePath", "PosixPath", "PurePosixPath"):
        return _join(*args) if args and all(isinstance(a, str) for a in args) else ("." if not args else UNK)
    if len(args) == 1 and isinstance(args[0], str):
        if name == "dirname":
            return _dirname(args[0])
        if name in ("abspath", "realpath", "normpath", "expanduser", "str", "fspath"):
            return args[0]
    return UNK


def truth(test: ast.expr, env: dict) -> Optional[bool]:
    """A branch's test, when it is known here (names assigned constants compared with constants), else None."""
    if isinstance(test, ast.BoolOp):
        got = [truth(v, env) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in got else (True if all(g is True for g in got) else None)
        return True if True in got else (False if all(g is False for g in got) else None)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        t = truth(test.operand, env)
        return None if t is None else not t
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        a, b = value(test.left, env), value(test.comparators[0], env)
        if a is UNK or b is UNK:
            return None
        op = test.ops[0]
        try:
            if isinstance(op, ast.Eq):
                return a == b
            if isinstance(op, ast.NotEq):
                return a != b
            if isinstance(op, ast.In):
                return a in b
            if isinstance(op, ast.NotIn):
                return a not in b
        except TypeError:
            return None
        return None
    v = value(test, env) if isinstance(test, (ast.Name, ast.Constant)) else UNK
    return None if v is UNK else bool(v)


# -- one file ------------------------------------------------------------------------------------------------------
def _mode(node: ast.Call, pos: int, env: dict, default: str) -> object:
    kw = next((k.value for k in node.keywords if k.arg == "mode"), None)
    if kw is None and len(node.args) > pos:
        kw = node.args[pos]
    return default if kw is None else value(kw, env)


def _path_arg(node: ast.Call, env: dict, name: str) -> list:
    """The path(s) a reader or writer is given (values, UNK when not known)."""
    if name == "load_dataset":
        out = []
        for k in node.keywords:
            if k.arg in ("data_files", "data_dir"):
                v = value(k.value, env)
                if isinstance(k.value, ast.Dict):
                    vals = [value(x, env) for x in k.value.values]
                    out += [x for v2 in vals for x in (v2 if isinstance(v2, tuple) else (v2,))]
                else:
                    out += list(v) if isinstance(v, tuple) else [v]
        return out
    if name in ("read_text", "read_bytes", "write_text", "write_bytes") and isinstance(node.func, ast.Attribute):
        return [value(node.func.value, env)]
    if name in ("tofile", "to_parquet", "to_csv", "to_json", "to_pickle", "to_feather", "save_to_disk"):
        return [value(node.args[0], env) if node.args else UNK]
    if name in ("save", "write_table", "urlretrieve", "dump") and len(node.args) > 1:
        first, second = value(node.args[0], env), value(node.args[1], env)  # np.save(path, a); torch.save(a, path)
        return [second if name in ("write_table", "urlretrieve") or not isinstance(first, str) else first]
    if name == "open" and isinstance(node.func, ast.Attribute):  # Path(p).open(): the receiver
        return [value(node.func.value, env)]
    key = next((k.value for k in node.keywords if k.arg in ("file", "filename", "path", "path_or_buf", "source")),
               None)
    return [value(key if key is not None else (node.args[0] if node.args else None), env)]


class _Walker:
    """Reads one file's statements in order, with what its names hold."""

    def __init__(self, scan: Scan, rel: str, overrides: list):
        self.scan, self.rel, self.overrides = scan, rel, overrides
        self.deferred: list[tuple[ast.AST, dict]] = []

    def calls(self, node: ast.AST, env: dict, guarded: bool) -> None:
        for sub in _expressions(node):
            if isinstance(sub, ast.Call):
                self.call(sub, env, guarded)

    def call(self, node: ast.Call, env: dict, guarded: bool) -> None:
        name = _call_name(node.func)
        if name == "exec" and self.overrides is not None:
            for k, v in self.overrides:
                env[k] = v
            return
        if name in CHECKS:
            target = value(node.func.value, env) if isinstance(node.func, ast.Attribute) and not node.args else \
                (value(node.args[0], env) if node.args else UNK)
            if isinstance(target, str):
                self.scan.checks.append(target)
            return
        if name in WRITERS or (name in ("open", "File") and _writes(_mode(node, 1, env, "r"))) or \
                (name == "memmap" and _writes(_mode(node, 2, env, "r+"), memmap=True)):
            self.scan.writes += _path_arg(node, env, name)
            return
        if name in READERS_ANY or name in READERS_DATA or name == "load_dataset":
            for p in _path_arg(node, env, name):
                if isinstance(p, str) and p and (name in READERS_ANY or name == "load_dataset" or
                                                 p.lower().endswith(DATA_EXT)):
                    self.scan.reads.append(Read(p, self.rel, node.lineno, guarded))

    def body(self, stmts: list, env: dict, guarded: bool = False) -> None:
        for st in stmts:
            self.stmt(st, env, guarded)

    def stmt(self, st: ast.stmt, env: dict, guarded: bool) -> None:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.deferred.append((st, env))
            return
        if isinstance(st, ast.ClassDef):
            self.body(st.body, dict(env), guarded)
            return
        if isinstance(st, ast.If):
            self.calls(st.test, env, guarded)
            t = truth(st.test, env)
            if t is not None:
                self.body(st.body if t else st.orelse, env, guarded)
                return
            a, b = dict(env), dict(env)
            self.body(st.body, a, guarded)
            self.body(st.orelse, b, guarded)
            for k in set(a) | set(b):
                va, vb = a.get(k, UNK), b.get(k, UNK)
                env[k] = va if va is not UNK and vb is not UNK and va == vb else UNK
            return
        if isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            catches = any(h.type is None or _handler_names(h.type) & FILE_ERRORS for h in st.handlers)
            self.body(st.body, env, guarded or catches)
            for h in st.handlers:
                self.body(h.body, env, guarded)
            self.body(st.orelse, env, guarded)
            self.body(st.finalbody, env, guarded)
            return
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            self.calls(st.iter if not isinstance(st, ast.While) else st.test, env, guarded)
            for n in _targets(getattr(st, "target", None)):
                env[n] = UNK
            assigned = _assigned(st.body)
            for n in assigned:
                env[n] = UNK  # a loop changes what its names hold: none known inside or after
            self.body(st.body, env, guarded)
            self.body(st.orelse, env, guarded)
            for n in assigned:
                env[n] = UNK
            return
        if isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                self.calls(item.context_expr, env, guarded)
                for n in _targets(item.optional_vars):
                    env[n] = UNK
            self.body(st.body, env, guarded)
            return
        self.calls(st, env, guarded)
        if isinstance(st, ast.Assign):
            v = value(st.value, env)
            for t in st.targets:
                for n in _targets(t):
                    env[n] = v if isinstance(t, ast.Name) else UNK
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            env[st.target.id] = value(st.value, env) if st.value is not None else env.get(st.target.id, UNK)
        elif isinstance(st, ast.AugAssign):
            for n in _targets(st.target):
                env[n] = UNK
        elif isinstance(st, (ast.Global, ast.Nonlocal)):
            pass
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            for a in st.names:
                env[(a.asname or a.name).split(".")[0]] = UNK

    def functions(self, module_env: dict) -> None:
        """Functions run after the module's top has run: the names it left, the function's own assignments."""
        done = 0
        while done < len(self.deferred) and done < 2000:
            fn, _ = self.deferred[done]
            done += 1
            env = dict(module_env)
            a = fn.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    env[arg.arg] = UNK
            for n in _assigned(fn.body):
                env[n] = UNK  # set in the function: known only from its assignment on
            saved = self.overrides
            self.overrides = None
            self.body(fn.body, env)
            self.overrides = saved


def _writes(mode: object, memmap: bool = False) -> bool:
    if mode is UNK or not isinstance(mode, str):
        return mode is UNK and not memmap
    return any(c in mode for c in "wax") or (memmap and mode == "w+") or ("+" in mode and not memmap)


def _handler_names(node: ast.expr) -> set:
    if isinstance(node, ast.Tuple):
        return set().union(*(_handler_names(e) for e in node.elts)) if node.elts else set()
    return {_call_name(node)} if isinstance(node, (ast.Name, ast.Attribute)) else set()


def _targets(node: Optional[ast.expr]) -> list:
    if node is None:
        return []
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for e in node.elts for n in _targets(e)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def _assigned(body: list) -> set:
    out = set()
    for node in ast.walk(ast.Module(body=list(body), type_ignores=[])):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                out.update(_targets(t))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            out.update(_targets(node.target))
    return out


def _expressions(node: ast.AST):
    """Every node of a statement's own expressions (not into nested functions, lambdas or classes)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.stmt)):
                continue
            todo.append(child)


def scan_file(source: bytes | str, rel: str, *, main: bool, overrides: Optional[list] = None) -> Scan:
    """The data one file reads and writes, as far as its values are known here. `rel`: its path in the project
    (`__file__`); `overrides`: what a configurator's exec assigns ((name, value), in order) in the file run as
    __main__."""
    scan = Scan()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return scan
    env: dict = {"__file__": HERE + rel, "__name__": "__main__" if main else rel[:-3].replace("/", ".")}
    w = _Walker(scan, rel, overrides if main else None)
    w.body(tree.body, env)
    w.functions(env)
    return scan


def overrides_of(project: Path, cwd: str, args: tuple) -> list:
    """What a configurator (nanoGPT's `exec(open('configurator.py').read())`) assigns from the run's arguments: each
    `config/x.py` of the project's top-level constant assignments, each `--name=value` word; in order."""
    out = []
    for a in args:
        if "$" in a or "`" in a:
            continue
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            try:
                out.append((k, ast.literal_eval(v)))
            except (ValueError, SyntaxError):
                out.append((k, v))
        elif a.endswith(".py"):
            f = project / cwd / a if cwd else project / a
            try:
                tree = ast.parse(f.read_bytes())
            except (OSError, SyntaxError, ValueError):
                continue
            for st in tree.body:
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    out.append((st.targets[0].id, value(st.value, {})))
    return out


# -- the launch line -----------------------------------------------------------------------------------------------
def _where(p: str, cwd: str) -> Optional[str]:
    """A read path as a path relative to the project (None: absolute, under ~, or out of the project)."""
    if p.startswith(HERE):
        p = p[len(HERE):]
    elif p.startswith(("/", "~", "$")) or ":" in p.split("/", 1)[0]:
        return None  # absolute, the home's, a variable's, or a scheme's (s3://, hf://, nltk:...)
    else:
        p = posixpath.join(cwd, p) if cwd else p
    p = posixpath.normpath(p)
    return None if p.startswith("..") or p == "." else p


def _inside(path: str, outs) -> bool:
    return any(path == o.rstrip("/") or path.startswith(o.rstrip("/") + "/") or o.rstrip("/").startswith(path + "/")
               for o in outs)


def _writes_files(project: Path, rf, scans: dict) -> bool:
    """Does this run (or command) make files the plan cannot name (a python run writing, a command)?"""
    if rf.run.kind == "command":
        return rf.run.target not in QUIET_COMMANDS
    return any(scans[f].writes for f in rf.files if f in scans)


def missing_data(project: Path, jn: "JobNeeds", *, prep_outs=(), data_dir: Optional[str] = None,
                 prep_label: str = "--prep") -> list[tuple[str, list[Read], str]]:
    """[(folder, the reads of files the project lacks there, sequence)]: what the launch line reads and nothing
    makes. The --prep command's runs are a sequence of their own (another instance): what they write reaches the
    job only through --prep-out."""
    scans: dict[str, Scan] = {}
    found: dict[tuple[str, str], list[Read]] = {}
    for seq in ("prep", "job"):
        runs = [rf for rf in jn.order if (rf.run.via[-1:] == (prep_label,)) == (seq == "prep")]
        made = False
        for rf in runs:
            if made:
                break  # an earlier command writes files the plan cannot name: quiet from here on
            cwd = rf.run.cwd or ""
            reads: list[Read] = []
            written, checked = [], []
            for f in rf.files:
                if f not in scans or f == rf.main:
                    text = (project / f).read_bytes() if (project / f).is_file() else b""
                    scans[f] = scan_file(text, f, main=f == rf.main, overrides=overrides_of(
                        project, cwd, rf.run.args) if f == rf.main and b"exec(" in text else None)
                s = scans[f]
                reads += s.reads
                written += [w for w in s.writes if isinstance(w, str)]
                checked += s.checks
            made_here = {x for x in (_where(w, cwd) for w in written) if x}
            checked_here = {x for x in (_where(c, cwd) for c in checked) if x}
            for r in reads:
                p = _where(r.path, cwd)
                if p is None or r.guarded or _inside(p, made_here) or _inside(p, checked_here):
                    continue
                if seq == "job" and _inside(p, prep_outs):
                    continue
                in_data = data_dir is not None and _inside(p, [data_dir])
                if _has(project, p) and not in_data:
                    continue
                found.setdefault((posixpath.dirname(p), "data" if in_data else seq), []).append(
                    Read(p, r.file, r.line))
            made = _writes_files(project, rf, scans)
    return [(folder, reads, seq) for (folder, seq), reads in found.items()]


def _has(project: Path, p: str) -> bool:
    """Does the project have the path (a pattern: any file it matches)?"""
    if any(c in p for c in "*?["):
        try:
            return next(iter(project.glob(p)), None) is not None
        except (ValueError, OSError):
            return True  # a pattern not read here: never said missing
    return (project / p).exists()


def _prep_script(project: Path, folder: str) -> Optional[str]:
    """The project's own preparation script for a folder: a .py beside the data (else in a folder above it, up to
    the project's) named prepare, preprocess, download, tokenize, ..."""
    parts = folder.split("/") if folder else []
    for i in range(len(parts), -1, -1):
        d = project.joinpath(*parts[:i]) if i else project
        files = sorted(d.glob("*.py")) if d.is_dir() else []
        for name in PREP_NAMES:  # prepare.py before prep_home.py
            f = next((f for f in files if f.stem.lower().startswith(name)), None)
            if f is not None:
                return f.relative_to(project).as_posix()
    return None


def _where_read(reads: list[Read]) -> str:
    """`train.py (lines 120, 122)`, or `a.py (line 3) and b.py (line 9)`."""
    by: dict[str, list[int]] = {}
    for r in reads:
        by.setdefault(r.file, [])
        if r.line not in by[r.file]:
            by[r.file].append(r.line)
    return " and ".join(f"{f} (line{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))})" for f, ls in by.items())


def warnings(project: Path, jn: "JobNeeds", *, prep: Optional[str] = None, prep_outs=(),
             data_dir: Optional[str] = None, data_given: bool = False) -> list[str]:
    """What the plan says of the data the launch line reads and the project lacks (warnings: never a refusal)."""
    out = []
    for folder, reads, seq in missing_data(project, jn, prep_outs=prep_outs, data_dir=data_dir):
        paths = list(dict.fromkeys(r.path for r in reads))
        who = _where_read(reads)
        verb = "reads" if len({r.file for r in reads}) == 1 else "read"
        said = " and ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        if seq == "data":
            out.append(f"{who} {verb} {said}, inside the --data folder {data_dir}: the instance has "
                       f"that folder at $GPUOPS_DATA, not at {data_dir} (a --data folder is left out of the project's "
                       f"upload), so the job stops there (FileNotFoundError); fix: read it from "
                       f"os.environ['GPUOPS_DATA'], or leave {data_dir} to the project's sync (no --data)")
            continue
        if seq == "prep":
            out.append(f"the preparation (--prep {prep}): {who} {verb} {said}, which the project does not have "
                       "and nothing before it makes: unless the preparation makes it itself, it stops there "
                       "(FileNotFoundError); fix: add it to the project, or make the --prep command make it first")
            continue
        script = _prep_script(project, folder)
        cmd = shlex.quote(f"python {script}") if script else "CMD"
        outs = " ".join(f"--prep-out {shlex.quote(p)}" for p in paths[:3])
        data = (" (--data puts its data at $GPUOPS_DATA, not at this path: read it from there)" if data_given else
                ", or bring it from here, a URL or the Hub with --data SOURCE (the job reads it at $GPUOPS_DATA)")
        out.append(f"{who} {verb} {said}, which the project does not have, nothing before it in the "
                   "launch line makes and no --prep-out names: unless the job makes it at run time, it stops there "
                   f"(FileNotFoundError); fix: prepare it first on a cheap instance, gpuops run --prep {cmd} {outs} "
                   f"--fs NAME (docs/run.md#a-preparation-first---prep-cmd){data}")
    return out
