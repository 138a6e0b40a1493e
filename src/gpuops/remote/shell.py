"""Shell text shared by the remote scripts of every capability (the job's launch bundle, setup's start bundle), and
how a remote path or a profile's command is written for a remote shell (pure; below profiles, so every capability and
the profile model itself quote the same way)."""
from __future__ import annotations

import secrets
import shlex


def heredoc(path_expr: str, content: str, *, append: bool = False) -> str:
    """A shell here-document writing `content` to `path_expr` (quoted delimiter: nothing in it is expanded), with
    a delimiter the content does not contain."""
    tag = "GPUOPS_EOF_" + secrets.token_hex(8)
    while tag in content:
        tag = "GPUOPS_EOF_" + secrets.token_hex(8)
    if not content.endswith("\n"):
        content += "\n"
    return f"cat {'>>' if append else '>'} {path_expr} <<'{tag}'\n{content}{tag}\n"


def shell_path(path: str) -> str:
    """Quote a remote path for a POSIX shell, keeping a leading ~ meaning the remote home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def shell_command(command: str) -> str:
    """A command from a profile (e.g. `python: ~/venv/bin/python -X dev`) for a remote shell: every word quoted,
    the first keeping a leading ~ as the remote home."""
    words = shlex.split(command) or ["python3"]
    return " ".join([shell_path(words[0])] + [shlex.quote(w) for w in words[1:]])


def remote_dir_spelling_problem(path: str) -> str | None:
    """Why a remote folder spelling cannot be used, or None. rsync hands a leading ~name and the wildcards * ? [ to the
    remote shell unquoted, which expands them (`~ubuntu`, `~+`, `/hom?/ubunt*` are the home), while every other gpuops
    step quotes them. Refused where a profile writes remote_dir (rsync_remote_path escapes them anyway). Pure."""
    p = path.strip()
    if p.startswith("~") and not (p == "~" or p.startswith("~/")):
        return (f"{path!r}: only ~ and ~/... mean the remote home here (the remote shell would expand "
                f"{p.split('/', 1)[0]} otherwise): write ~/folder or the absolute path")
    bad = sorted({c for c in p if c in "*?["})
    if bad:
        return (f"{path!r} holds {' '.join(bad)}, which the remote shell would expand as a wildcard: "
                "write the folder's plain path")
    return None
