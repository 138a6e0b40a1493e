"""Why a setup step failed, read from its output (pure; issue 34): patterns are matched on WHOLE lines (pip's retry
warning names `Name or service not known` past character 260), and only what is printed is shortened, around what
matched. Known causes are rows of knowledge (knowledge.yaml setup_causes: the lines that must all be there, the line
that names the package, the cause and the fix), so the summary names the package and its cause rather than "See above
for output"."""
from __future__ import annotations

import re
from typing import Optional

SHOWN = 300  # characters of a line the summary prints
KEPT = 4000  # characters of a line kept for matching (a line longer than that is cut there)


def shorten(line: str, at: int = 0, width: int = SHOWN) -> str:
    """`line` as printed: whole when short, else a window of `width` characters around position `at` (what matched),
    with `...` where it was cut."""
    line = line.strip()
    if len(line) <= width:
        return line
    start = max(0, min(at - width // 3, len(line) - width))
    piece = line[start:start + width]
    return ("..." if start else "") + piece + ("..." if start + width < len(line) else "")


def telling_line(lines: list[str], patterns) -> Optional[str]:
    """The most telling line of a failed step's output: the last line that the first matching pattern of
    `patterns` (knowledge.yaml setup_error_lines, regular expressions, most telling first) matches, on the whole
    line; None when none does. Printed shortened around the match."""
    for pat in patterns or []:
        try:
            rx = re.compile(str(pat))
        except re.error:
            continue
        hits = [(ln, m) for ln in lines for m in [rx.search(ln)] if m]
        if hits:
            line, m = hits[-1]
            stripped = len(line) - len(line.lstrip())
            return shorten(line, m.start() - stripped)
    return None


def known_cause(lines: list[str], causes) -> Optional[tuple[str, str]]:
    """(cause, fix) of the first row of `causes` (knowledge.yaml setup_causes) whose `lines` patterns all match a line
    of the output, its {package} the last match of its `package` pattern (a build names it: "Collecting
    flash-attn==2.8.3", "Building wheel for flash-attn", uv's "Failed to build `flash-attn==2.8.3`")."""
    for row in causes or []:
        if not isinstance(row, dict):
            continue
        try:
            needs = [re.compile(str(p)) for p in row.get("lines") or []]
            named = re.compile(str(row["package"])) if row.get("package") else None
        except re.error:
            continue
        if not needs or not all(any(rx.search(ln) for ln in lines) for rx in needs):
            continue
        package = "a package"
        if named is not None:
            found = [m for ln in lines for m in [named.search(ln)] if m]
            if found:
                package = next((g for g in found[-1].groups() if g), found[-1].group(0))
        fill = lambda text: str(text or "").replace("{package}", package)  # noqa: E731
        return fill(row.get("cause")), fill(row.get("fix"))
    return None


def kept(line: str) -> str:
    """A line of output as the summary keeps it: whitespace folded, at most KEPT characters."""
    return re.sub(r"\s+", " ", line)[:KEPT]
