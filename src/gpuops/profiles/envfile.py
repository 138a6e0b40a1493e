""".env as python-dotenv reads it, and the environment a profile's ${VAR} is read from. No pydantic here: memo.py
checks a kept profile's variables with it."""
from __future__ import annotations

import os
import re
from pathlib import Path


def _dotenv_bindings(path: Path) -> tuple[dict[str, str], list[str]]:
    """The project's .env as python-dotenv reads it (the parser `load_dotenv` uses, so `.env` means here what it means
    to the job's own code): `export`, quotes, comments after a value, multi-line quoted values (a PEM key, a JSON
    credential), `${VAR}` expanded. Returns (values, problems): a line it cannot read, or a name that is not a
    variable name, is left out and named by its line number, never its text (it may hold a secret)."""
    if not path.is_file():  # before python-dotenv's import: most projects have no .env
        return {}, []
    import io

    from dotenv.main import resolve_variables
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return {}, [f"{path}: cannot be read ({exc.strerror or exc}); its variables are left out"]
    pairs, problems = [], []
    for b in parse_stream(io.StringIO(text)):
        if b.error:
            problems.append(f"{path}: line {b.original.line} cannot be read as NAME=VALUE (an unclosed quote, or no "
                            "`=`); it is left out")
        elif b.key is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", b.key):
            problems.append(f"{path}: line {b.original.line}: {b.key[:40]!r} is not a variable name (letters, digits "
                            "and _, not starting with a digit); it is left out")
        elif b.key is not None and b.value is not None:  # `NAME` alone declares nothing
            pairs.append((b.key, b.value))
    values = resolve_variables(pairs, override=True)  # what python-dotenv's dotenv_values does
    return {k: v for k, v in values.items() if v is not None}, problems


def read_dotenv(path: Path) -> dict[str, str]:
    """The variables of a .env file as python-dotenv reads them (see _dotenv_bindings). Never logs values."""
    return _dotenv_bindings(path)[0]


def dotenv_problems(path: Path) -> list[str]:
    """One warning per line of a .env file that read_dotenv leaves out, naming the line (never its text)."""
    return _dotenv_bindings(path)[1]


def environment(project_dir: Path | None = None) -> dict[str, str]:
    """The process environment over the project's .env (the real environment wins)."""
    merged = read_dotenv((project_dir or Path.cwd()) / ".env")
    merged.update(os.environ)
    return merged
