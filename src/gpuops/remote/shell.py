"""Shell text shared by the remote scripts of every capability (the job's launch bundle, setup's start bundle)."""
from __future__ import annotations

import secrets


def heredoc(path_expr: str, content: str, *, append: bool = False) -> str:
    """A shell here-document writing `content` to `path_expr` (quoted delimiter: nothing in it is expanded), with
    a delimiter the content does not contain."""
    tag = "GPUOPS_EOF_" + secrets.token_hex(8)
    while tag in content:
        tag = "GPUOPS_EOF_" + secrets.token_hex(8)
    if not content.endswith("\n"):
        content += "\n"
    return f"cat {'>>' if append else '>'} {path_expr} <<'{tag}'\n{content}{tag}\n"
