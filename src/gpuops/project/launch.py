"""What a job's launch line runs (pure: it reads the project's files, nothing else).

A `.py` script runs with the job's python. A `.sh` script is read as bash would run it, and every script it reaches is
read in turn (`bash x.sh`, `sh x.sh`, `./x.sh`, `source x.sh`, `. x.sh`, `exec x.sh`): each simple command that runs
- `python`/`python3`/`python3.X` with `X.py` or `-m module`;
- a launcher: `torchrun [opts] X.py | -m module` (= `python -m torch.distributed.run`), `accelerate launch [opts]
  X.py | -m module`, `deepspeed [opts] X.py | --module module`, each also as `python -m` its module;
- `uv run ...` (the command it runs, in setup's environment);
- another command: a console script, which playbooks/modules.yaml `console_scripts` (or the name of a distribution
  setup installs) maps to the distribution that provides it;
after the prefixes `exec`, `nohup`, `time`, `command`, `env` and `VAR=value` (`PYTHONPATH=.` adds the project folder
to what python searches). A `$VAR`/`${VAR}` set earlier in the script (an assignment, `export`, or a here-document
read with `read -r -d '' VAR <<EOF`) is expanded; another (`$1`, `$HOME`) is left, and a word that still holds one is
not read: nothing is inferred from it. A script that switches environment (`conda activate`, `source venv/bin/
activate`, `module load`) is not read further.

What no host can run is said too: a shell script with Windows line endings, the entry or any script it reaches
(bash reads `set -e\\r`: error checking silently off), a `.py` script with relative imports run as a file."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Iterator, Optional

from .closure import read_bytes, required_imports

PYTHON = re.compile(r"python(3(\.\d+)?)?\Z")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.S)
SHELL = re.compile(rb"#!\s*\S*(/|env\s+)(ba|da|z)?sh\b")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# Launchers that run a Python script with the job's python: the command (its words), the package it runs from (the
# module the job's python must find), its `python -m` modules, and its options that take no value. Sources:
# pytorch.org/docs/stable/elastic/run.html (torchrun = python -m torch.distributed.run),
# huggingface.co/docs/accelerate/package_reference/cli (accelerate launch; -m/--module), deepspeed.ai/getting-started
# and deepspeed/launcher/runner.py's parser ("deepspeed <client_entry.py> <client args>", --module).
SCRIPT_LAUNCHERS = (
    (("torchrun",), "torch", TORCHRUN_MODULES),
    (("accelerate", "launch"), "accelerate", ("accelerate.commands.launch",)),
    (("deepspeed",), "deepspeed", ("deepspeed.launcher.runner",)),
)
# torchrun options that take no value (every other option takes one, as `--opt value` or `--opt=value`)
TORCHRUN_FLAGS = {"--standalone", "--module", "-m", "--no-python", "--no_python", "--run-path", "--run_path"}
MODULE_FLAGS = {"-m", "--module"}
NO_PYTHON = {"--no_python", "--no-python"}
# uv run: options whose value follows; options that make uv run another environment than the one setup built
UV_VALUE = {"--extra", "--group", "--only-group", "--no-group", "--package", "--env-file", "--index", "--default-index",
            "--index-url", "--extra-index-url", "--find-links", "-f", "--cache-dir", "--config-file", "--color",
            "--exclude-newer", "--resolution", "--prerelease", "--index-strategy", "--keyring-provider",
            "--link-mode", "--refresh-package", "--reinstall-package", "--upgrade-package", "-P"}
UV_OTHER_ENV = {"--with", "--with-requirements", "--with-editable", "--python", "-p", "--isolated", "--script",
                "--directory", "--project", "--no-project", "--gui-script"}
SHELL_WORDS = {"then", "do", "else", "elif", "{", "}", "!", "if", "while", "until"}
PREFIXES = {"exec", "nohup", "time", "command"}
SHELL_KEYWORDS = {"fi", "done", "esac", "then", "do", "else", "elif", "in", "true", "false", "return", "exit", "break",
                  "continue", "shift", "wait", "trap", "local", "unset", "set", "function"}
RUNS_SCRIPT = {"bash", "sh", "dash", "zsh", "source", ".", "exec"}
ENV_SWITCH = re.compile(r"(^|[\s;&|])(source|\.)\s+\S*activate\b|(^|[\s;&|])(conda|mamba|micromamba|pyenv)\s+"
                        r"(activate|shell|run)\b|(^|[\s;&|])module\s+load\b", re.M)
VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
READ_HEREDOC = re.compile(r"^\s*read\s+(?:-[a-zA-Z]+\s+(?:''|\"\"|\S+\s+)?)*([A-Za-z_][A-Za-z0-9_]*)\s*<<-?\s*(['\"]?)"
                          r"([A-Za-z_][A-Za-z0-9_]*)\2\s*$")
SCRIPT_DEPTH = 8  # scripts within scripts followed at most


@dataclass(frozen=True)
class Run:
    """A python run (or a command) that the launch line makes."""
    kind: str  # "script" | "module" | "command"
    target: str  # X.py, the dotted module, or the command's name
    via: tuple[str, ...] = ()  # the shell scripts that run it, innermost first ("inner.sh", "run.sh")
    cwd: Optional[str] = None  # the folder it runs in, relative to the project, when the script `cd`s literally
    launcher: Optional[str] = None  # the launcher's words ("torchrun", "accelerate launch", "deepspeed")
    package: Optional[str] = None  # the module the launcher runs from (torch, accelerate, deepspeed)
    pythonpath: tuple[str, ...] = ()  # folders (relative to the project) a PYTHONPATH= prefix or export adds
    loose: bool = False  # PYTHONPATH set to something unknown here: any project folder may be importable
    line: str = ""  # the command as the script has it (variables expanded), for what the plan says
    args: tuple[str, ...] = ()  # the words after the target (a launcher's config file is read from them)
    options: tuple[str, ...] = ()  # the launcher's own words before the target (accelerate's --config_file x.yaml)

    @property
    def source(self) -> str:
        """Who runs it, as the plan names it: `run.sh`, `inner.sh (run by run.sh)`."""
        if not self.via:
            return ""
        return self.via[0] + (f" (run by {' <- '.join(self.via[1:])})" if len(self.via) > 1 else "")


@dataclass
class Launch:
    """Everything the launch line reaches: the python runs and commands, the shell scripts read, what no host can
    run (problem, fix), and the lines that could not be read (said, never judged)."""
    runs: list[Run] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


# -- shell text -----------------------------------------------------------------------------------------------------
ARGS = "\0@"  # the env key holding a script's own arguments (shell words), when they are known
POSITIONAL = re.compile(r'"\$\{?[@*]\}?"|\$\{?[@*]\}?|"?\$\{?([1-9])\}?"?')


def _expand(text: str, env: dict[str, str]) -> str:
    """$NAME and ${NAME} replaced by what the script set earlier (others left as they are); "$@", $*, $1... by the
    script's own arguments when they are known (the run's, after --; a child script's, from the line that runs it)."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return env[name] if name in env else m.group(0)

    if ARGS in env:
        args = shlex.split(env[ARGS])

        def positional(m: re.Match) -> str:
            if m.group(1):
                n = int(m.group(1))
                return shlex.quote(args[n - 1]) if n <= len(args) else "''"
            return env[ARGS]

        text = POSITIONAL.sub(positional, text)
    return VAR.sub(sub, text)


def _commands(text: str, env: dict[str, str]) -> Iterator[tuple[list[str], str]]:
    """(words, line) of each simple command of a shell script, in order (continuations joined, here-document bodies
    skipped, split at ; && || | & ( ), redirections dropped), variables set earlier expanded. Assignments update
    `env` as the script runs (a here-document read into a variable with `read` is its body, lines joined)."""
    lines = text.replace("\r\n", "\n").replace("\\\n", " ").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        m = HEREDOC.search(line)
        if m:
            end = m.group(2)
            body = []
            while i < len(lines) and lines[i].strip() != end:
                body.append(lines[i])
                i += 1
            i += 1
            r = READ_HEREDOC.match(line)
            if r:
                env[r.group(1)] = " ".join(b.strip() for b in body if b.strip())
                continue
        line = _expand(line, env)
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
                    yield words, " ".join(line.split())
                words = []
                continue
            words.append(t)
        if words:
            yield words, " ".join(line.split())


def _set_vars(words: list[str], env: dict[str, str]) -> bool:
    """An assignment command (`A=1 B=x`, `export A=1`, `declare A=1`): `env` updated; True when it was one."""
    body = words[1:] if words[0] in ("export", "declare", "local", "readonly") else words
    if not body or not all(ASSIGN.match(w) for w in body):
        return False
    for w in body:
        name, value = ASSIGN.match(w).groups()
        env[name] = value
    return True


# -- one command ----------------------------------------------------------------------------------------------------
def _python(args: list[str]) -> Optional[Run]:
    """`python [options] X.py ...` or `python [options] -m module ...` (the words after the interpreter)."""
    i = 0
    while i < len(args):
        a = args[i]
        if "$" in a or "`" in a:
            return None
        if a == "-" or not a.startswith("-"):
            return Run("script", a, args=tuple(args[i + 1:])) if a.endswith(".py") else None
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
                    return _torchrun(after)
                for words, package, modules in SCRIPT_LAUNCHERS[1:]:
                    if mod in modules:
                        return _launcher(after, " ".join(words), package)
                return Run("module", mod, args=tuple(after))
            if ch in "WX":
                i += 0 if rest else 1
                break
        i += 1
    return None


def _torchrun(args: list[str]) -> Optional[Run]:
    module = False
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):  # an option (its value may hold a shell variable: only the script's word matters)
            if a in NO_PYTHON:
                return None
            module = module or a in MODULE_FLAGS
            i += 1 if (a in TORCHRUN_FLAGS or "=" in a) else 2
            continue
        if "$" in a or "`" in a:
            return None
        how = dict(launcher="torchrun", package="torch", args=tuple(args[i + 1:]), options=tuple(args[:i]))
        if module:
            return Run("module", a, **how)
        return Run("script", a, **how) if a.endswith(".py") else None
    return None


def _launcher(args: list[str], launcher: str, package: str) -> Optional[Run]:
    """`accelerate launch [options] X.py | -m module ...`, `deepspeed [options] X.py | --module module ...`: the
    script is the first word that ends in .py; a module, the word right after -m/--module (a launcher told to run no
    python is not read)."""
    for i, a in enumerate(args):
        if a in NO_PYTHON:
            return None
        if a in MODULE_FLAGS:
            mod = args[i + 1] if i + 1 < len(args) else ""
            if not mod or mod.startswith("-") or "$" in mod or "`" in mod:
                return None
            return Run("module", mod, launcher=launcher, package=package, args=tuple(args[i + 2:]),
                       options=tuple(args[:i]))
        if a.endswith(".py") and not a.startswith("-"):
            if "$" in a or "`" in a:
                return None
            return Run("script", a, launcher=launcher, package=package, args=tuple(args[i + 1:]),
                       options=tuple(args[:i]))
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


def _pythonpath(value: str, cwd: Optional[str]) -> tuple[tuple[str, ...], bool]:
    """The project folders a PYTHONPATH value adds (relative paths against the folder the command runs in), and
    whether it holds something unknown here ($VAR, an absolute path)."""
    folders, loose = [], False
    for part in value.split(":"):
        part = part.strip()
        if part in ("$PWD", "${PWD}", "$(pwd)", "`pwd`"):
            part = "."
        if not part:
            continue
        if "$" in part or "`" in part or part.startswith(("/", "~")):
            loose = True
            continue
        d = normal_dir((PurePosixPath(cwd or ".") / part).as_posix())
        if d == "\0":
            loose = True
        else:
            folders.append(d)
    return tuple(folders), loose


def invocation(words: list[str], cwd: Optional[str] = None) -> Optional[Run]:
    """The python run (or command) of one simple command, or None."""
    i = 0
    pythonpath: tuple[str, ...] = ()
    loose = False
    while i < len(words):
        w = words[i]
        if w in SHELL_WORDS or w in PREFIXES:
            i += 1
        elif ASSIGN.match(w):
            name, value = ASSIGN.match(w).groups()
            if name == "PYTHONPATH":
                pythonpath, loose = _pythonpath(value, cwd)
            elif name in ("PYTHONHOME", "PYTHONSAFEPATH"):
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
    run: Optional[Run] = None
    if PYTHON.match(cmd):
        run = _python(args)
    elif cmd == "torchrun":
        run = _torchrun(args)
    else:
        for launcher, package, _ in SCRIPT_LAUNCHERS[1:]:
            if tuple(words[i:i + len(launcher)]) == launcher:
                run = _launcher(words[i + len(launcher):], " ".join(launcher), package)
                break
        else:
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", cmd) and cmd not in SHELL_KEYWORDS:
                run = Run("command", cmd, args=tuple(args))
    return replace(run, pythonpath=pythonpath, loose=loose) if run else None


def normal_dir(path: str) -> str:
    """A relative folder without . and .. ("\\0" when it leaves the project)."""
    parts: list[str] = []
    for p in PurePosixPath(path).parts:
        if p == "..":
            if not parts:
                return "\0"
            parts.pop()
        elif p != ".":
            parts.append(p)
    return "/".join(parts)


# -- scripts within scripts --------------------------------------------------------------------------------------------
def is_shell(script: str, text: bytes) -> bool:
    """Run as a shell script: a .sh/.bash name, or a #! line naming a shell."""
    return script.endswith((".sh", ".bash")) or bool(SHELL.match(text[:80]))


def _script_file(project: Path, word: str, dirs: list[str]) -> Optional[str]:
    """The project's shell script a word names (relative to the folder a command runs in, the script's, or the
    project's), as a path relative to the project; None when it is none of the project's."""
    if "$" in word or "`" in word or word.startswith(("/", "~", "-")):
        return None
    for d in dirs:
        f = normal_dir((PurePosixPath(d or ".") / word).as_posix())
        if f != "\0" and f and (project / f).is_file():
            text = read_bytes(project / f) or b""
            return f if is_shell(f, text) else None
    return None


def crlf_problem(script: str, text: bytes, via: tuple[str, ...] = ()) -> Optional[tuple[str, str]]:
    """A shell script saved with Windows line endings: (problem, fix)."""
    if b"\r\n" not in text:
        return None
    n = text.count(b"\r\n")
    q = shlex.quote(script)
    who = f"{script} (run by {' <- '.join(via)})" if via else script
    return (f"{who} has Windows line endings (CRLF, {n} line(s)): bash would read `set -e` as `set -e\\r` "
            "(error checking off) and pass a \"\\r\" as each line's last argument",
            f"fix: convert it to Unix line endings: sed -i 's/\\r$//' {q} (or dos2unix {q}); "
            "git config core.autocrlf input keeps it so")


def _read_shell(project: Path, script: str, via: tuple[str, ...], out: Launch, env: dict[str, str],
                depth: int) -> None:
    text_b = read_bytes(project / script)
    if text_b is None or script in out.scripts or depth > SCRIPT_DEPTH:
        return
    out.scripts.append(script)
    problem = crlf_problem(script, text_b, via[1:])
    if problem:
        out.problems.append(problem)
    text = text_b.decode("utf-8", "replace")
    if ENV_SWITCH.search(text):
        out.unread.append(f"{script} switches environment (conda/venv activate, module load): its commands are "
                          "not judged here")
        return
    sh_dir = PurePosixPath(script).parent.as_posix()
    _read_text(project, script, text, "" if sh_dir == "." else sh_dir, via, out, env, depth)


def _read_text(project: Path, script: str, text: str, sh_dir: str, via: tuple[str, ...], out: Launch,
               env: dict[str, str], depth: int) -> None:
    """The commands of a shell text (a script's, or a command line given as `--prep CMD`), in order."""
    cwd: Optional[str] = None
    env_pythonpath: tuple[tuple[str, ...], bool] = ((), False)
    for words, line in _commands(text, env):
        if words[0] == "cd":
            target = words[1] if len(words) > 1 else ""
            if not target or "$" in target or "`" in target or target.startswith(("/", "~", "-")):
                cwd = None  # unknown: resolved against the project and the script's folder
            else:
                cwd = normal_dir((PurePosixPath(cwd or ".") / target).as_posix())
            continue
        if _set_vars(words, env):
            if "PYTHONPATH" in env and words[0] == "export" or any(w.startswith("PYTHONPATH=") for w in words):
                env_pythonpath = _pythonpath(env.get("PYTHONPATH", ""), cwd)
            continue
        dirs = [d for d in dict.fromkeys([cwd, sh_dir, ""]) if d is not None and d != "\0"]
        first = next((w for w in words if not ASSIGN.match(w) and w not in PREFIXES), "")
        rest = words[words.index(first) + 1:] if first else []
        child = None
        if first in RUNS_SCRIPT and rest:
            child = _script_file(project, next((w for w in rest if not w.startswith("-")), ""), dirs)
        elif first and ("/" in first or first.endswith((".sh", ".bash"))):
            child = _script_file(project, first, dirs)
        if child:
            if first in ("source", "."):
                _read_shell(project, child, (child, *via), out, env, depth + 1)
            else:  # its own arguments: the words after it on the line
                at = next(i for i, w in enumerate(rest) if not w.startswith("-")) if first in RUNS_SCRIPT else -1
                after = rest[at + 1:]
                _read_shell(project, child, (child, *via), out, {**env, ARGS: shlex.join(after)}, depth + 1)
            continue
        if first in ("source", ".", "export", "set", "echo", "printf", "cd", "mkdir", "exit", "return"):
            continue
        run = invocation(words, cwd)
        if run is None:
            if any(PYTHON.match(w) or w in ("torchrun", "accelerate", "deepspeed") for w in words[:4]) and \
                    ("$" in line or "`" in line):
                out.unread.append(f"{script}: `{line[:120]}` names what it runs through a variable gpuops cannot "
                                  "read here")
            continue
        if not run.pythonpath and not run.loose and (env_pythonpath[0] or env_pythonpath[1]):
            run = replace(run, pythonpath=env_pythonpath[0], loose=env_pythonpath[1])
        out.runs.append(replace(run, via=via, cwd=cwd, line=line))


def read_launch(project: Path, script: str, args: tuple[str, ...] = ()) -> Launch:
    """What the job started with --script (relative to the project) runs: a .py script itself (with the run's
    `args`), or what a shell script and every script it reaches run. A script that cannot be read here: an empty
    Launch."""
    out = Launch()
    text = read_bytes(project / script)
    if text is None:
        return out
    if script.endswith(".py"):  # run by the profile's python whatever its #! line says (runs.job_argv)
        out.runs.append(Run("script", script, line=f"python {script}", args=tuple(args)))
        out.problems += script_problems(project, script)
    elif is_shell(script, text) or not text.startswith(b"#!"):
        _read_shell(project, script, (script,), out, {ARGS: shlex.join(args)} if args else {}, 0)
    return out


def read_command(project: Path, command: str, label: str) -> Launch:
    """What a command line run by `sh -c` in the project folder runs (`gpuops run --prep CMD`), read as a one-line
    shell script named `label` (how the plan says who runs what: `prepare.py (run by --prep)`): the scripts it
    reaches, at any depth, as for --script."""
    out = Launch()
    _read_text(project, label, command, "", (label,), out, {}, 0)
    return out


def script_problems(project: Path, script: str) -> list[tuple[str, str]]:
    """(problem, fix) for a --script that fails on any host, read from the local file before anything is synced,
    launched or billed: a shell script with Windows line endings (bash reads `set -e\\r`: error checking silently
    off, and its last argument arrives as "\\r"; gpuops refuses it rather than converting a file the user keeps), a
    .py script with relative imports at module level (they fail when it runs as a file: run it as a module)."""
    text = read_bytes(project / script)
    if text is None:
        return []
    out = []
    if is_shell(script, text):
        problem = crlf_problem(script, text)
        if problem:
            out.append(problem)
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
